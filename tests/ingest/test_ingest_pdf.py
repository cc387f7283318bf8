"""PDF ingestion on PDFs the tests generate: labels, blank and scanned pages, encryption,
damage, per-page time limit, progress."""

from __future__ import annotations

import logging

import pytest

from locks_chat.errors import DocumentError, EncryptedError, NoTextError, PageRangeError
from locks_chat.ingest.pdf import FONTS_LOST
from locks_chat.ingest import PageKind, load_document
from locks_chat.ingest.load import sniff_format
from tests.support.ingest_samples import (
    encrypted, heavy_content, raw_text_pdf, run_here_or_in_a_thread, show_text, text_pdf, with_page_labels, write,
)

FRONT = ["Title page of the book", "Preface: why this book", "Contents: one chapter"]
BODY = [f"Chapter text on body page {n}. The fact of page {n} is {n * 7}." for n in range(1, 6)]


@pytest.fixture
def book_pdf(tmp_path):
    """Three roman-numbered front pages (i-iii), then body pages printed 1-5."""
    data = with_page_labels(text_pdf(FRONT + BODY), [(0, 2, "/r", 1), (3, 7, "/D", 1)])
    return write(tmp_path, "book.pdf", data)


def test_pages_keep_printed_label_and_physical_number(book_pdf):
    doc = load_document(book_pdf)
    assert doc.format == "pdf" and doc.page_kind is PageKind.PDF
    assert [p.label for p in doc.pages] == ["i", "ii", "iii", "1", "2", "3", "4", "5"]
    assert [p.number for p in doc.pages] == list(range(1, 9))
    assert doc.page_count == 8
    body_2 = doc.pages[4]
    assert "The fact of page 2 is 14." in body_2.text
    assert body_2.citation == "p. 2"
    assert doc.text[body_2.start : body_2.end] == body_2.text
    assert doc.page_at(doc.text.index("is 14.")) is body_2
    assert doc.warnings == ()


@pytest.mark.parametrize(
    "spec, labels",
    [
        ("ii-iii", ["ii", "iii"]),
        ("2-4", ["2", "3", "4"]),
        ("#2-4", ["ii", "iii", "1"]),
        ("iii-1", ["iii", "1"]),
        ("i,5", ["i", "5"]),
    ],
    ids=["roman", "printed-arabic", "forced-physical", "across-sections", "list"],
)
def test_page_range_by_label_or_physical_number(book_pdf, spec, labels):
    doc = load_document(book_pdf, pages=spec)
    assert [p.label for p in doc.pages] == labels
    assert doc.page_count == 8
    assert doc.text.startswith(doc.pages[0].text)


@pytest.mark.parametrize("spec", ["6-9", "4-2", "iv-x", "#0-2", "abc"])
def test_bad_page_range_names_the_valid_range(book_pdf, spec):
    with pytest.raises(PageRangeError) as info:
        load_document(book_pdf, pages=spec)
    assert "physical 1-8 (printed i-iii, 1-5)" in str(info.value)
    assert "\n" not in str(info.value) and info.value.exit_code == 2


def test_single_number_that_is_no_printed_label_is_refused(tmp_path, book_pdf):
    # 8 physical pages printed i-iii, 1-5: "7" is the 7th page of the file but no page is printed "7"
    with pytest.raises(PageRangeError) as info:
        load_document(book_pdf, pages="7")
    assert "no page is printed '7' (pass '#7' to mean physical page 7)" in str(info.value)
    assert [p.label for p in load_document(book_pdf, pages="#7").pages] == ["4"]
    plain = load_document(write(tmp_path, "plain.pdf", text_pdf(FRONT + BODY)), pages="7")
    assert [(p.number, p.label) for p in plain.pages] == [(7, "7")]


def test_blank_and_image_only_pages(tmp_path):
    data = text_pdf(["First page text.", None, "Third page text.", "scan"], image_pages=[3])
    doc = load_document(write(tmp_path, "mixed.pdf", data))
    assert [bool(p.text) for p in doc.pages] == [True, False, True, False]
    assert doc.pages[1].start == doc.pages[1].end
    assert doc.warnings == ("page 4: no text layer, OCR needed",)
    assert doc.text == "First page text.\n\nThird page text."


def test_all_scanned_document_is_refused(tmp_path):
    path = write(tmp_path, "scan.pdf", text_pdf(["a", "b", "c"], image_pages=[0, 1, 2]))
    with pytest.raises(NoTextError, match="no text layer.*OCR") as info:
        load_document(path)
    assert info.value.exit_code == 2


def test_selection_of_blank_pages_is_refused(tmp_path):
    path = write(tmp_path, "blank.pdf", text_pdf(["Some text.", None, None]))
    with pytest.raises(NoTextError, match="choose other --pages"):
        load_document(path, pages="2-3")


def test_ligatures_are_expanded(tmp_path):
    content = show_text("\x01nd the \x02ow of \x03ort, e\x04cient wa\x05es")
    doc = load_document(write(tmp_path, "lig.pdf", raw_text_pdf([content])))
    assert doc.text == "find the flow of ffort, efficient waffles"


def test_line_end_hyphenation_is_joined(tmp_path):
    content = show_text("a long and dan-\ngerous road\nends here")
    doc = load_document(write(tmp_path, "hyph.pdf", raw_text_pdf([content])))
    assert "dangerous road" in doc.text.replace("\n", " ")
    assert "dan-" not in doc.text


def test_user_password_required(tmp_path, book_pdf):
    path = write(tmp_path, "locked.pdf", encrypted(book_pdf.read_bytes(), "s3cret"))
    with pytest.raises(EncryptedError) as info:
        load_document(path)
    assert str(info.value) == f"{path}: encrypted: pass --password"
    with pytest.raises(EncryptedError, match="wrong password"):
        load_document(path, password="guess")
    doc = load_document(path, password="s3cret")
    assert [p.label for p in doc.pages][:4] == ["i", "ii", "iii", "1"]
    assert "The fact of page 1 is 7." in doc.text
    assert doc.warnings == ()


def test_a_password_typed_in_another_encoding_is_tried_as_its_bytes(tmp_path, book_pdf):
    path = write(tmp_path, "locked.pdf", encrypted(book_pdf.read_bytes(), "s3cret"))
    # "s3cr\xffet" from a Latin-1 terminal: Python's argv holds the byte 0xff as the lone surrogate \udcff
    with pytest.raises(EncryptedError, match="wrong password for this encrypted PDF; check --password"):
        load_document(path, password="s3cr\udcffet")


def test_empty_user_password_opens_without_password(tmp_path, book_pdf):
    path = write(tmp_path, "owner.pdf", encrypted(book_pdf.read_bytes(), "", owner_password="owner"))
    assert "The fact of page 5 is 35." in load_document(path).text
    assert "The fact of page 5 is 35." in load_document(path, password="owner").text


def test_truncated_pdf_keeps_the_pages_that_remain(tmp_path, book_pdf):
    data = book_pdf.read_bytes()
    whole = load_document(write(tmp_path, "most.pdf", data[: int(len(data) * 0.9)]))
    assert [p.label for p in whole.pages] == ["i", "ii", "iii", "1", "2", "3", "4", "5"]
    assert "The fact of page 5 is 35." in whole.text
    assert whole.warnings[0].startswith("truncated or damaged PDF")
    half = load_document(write(tmp_path, "half.pdf", data[: len(data) // 2]))
    assert 0 < len(half.pages) < 8
    assert "Preface: why this book" in half.text
    lost = [p.number for p in half.pages if not p.text]
    # each page without text is named, with its cause: its content lost, or its fonts (``test_ingest_pdf_causes``)
    assert half.warnings[0].endswith(("no text, possibly lost", FONTS_LOST)) == bool(lost)


def test_pdf_cut_inside_its_first_object_is_refused_in_one_line(tmp_path, book_pdf):
    path = write(tmp_path, "stub.pdf", book_pdf.read_bytes()[:40])
    with pytest.raises(DocumentError, match="truncated PDF.*download or copy it again") as info:
        load_document(path)
    assert "\n" not in str(info.value) and info.value.exit_code == 2


def test_garbage_after_pdf_header_is_refused(tmp_path):
    path = write(tmp_path, "junk.pdf", b"%PDF-1.7\n" + bytes(range(256)) * 20 + b"\n%%EOF\n")
    with pytest.raises(DocumentError, match="not a readable PDF") as info:
        load_document(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name, junk, kind", [
    ("notes.md", b"Every PDF file starts with the header %PDF-1.7, then objects.\n", "text"),
    ("notes.txt", b"A quoted header:\n%PDF-1.7\n", "text"),
    ("mail.pdf", b"From: scanner\n\n", "pdf"),
    ("download", b"HTTP/1.1 200 OK\n\n", "pdf"),
    ("notes.md", b"", "pdf"),
], ids=["quoted-in-markdown", "quoted-in-text", "junk-before-pdf", "junk-no-suffix", "md-named-pdf"])
def test_a_pdf_header_makes_a_pdf_where_a_reader_would_take_it(tmp_path, book_pdf, name, junk, kind):
    path = write(tmp_path, name, junk + book_pdf.read_bytes())
    assert sniff_format(path.read_bytes(), name) in ((kind,) if kind == "pdf" else ("text", "markdown"))


def test_reader_log_is_collected_not_printed(tmp_path, book_pdf, caplog):
    data = book_pdf.read_bytes()
    broken = data.replace(b"startxref", b"startxref\n999999\n%", 1)
    with caplog.at_level(logging.WARNING):
        doc = load_document(write(tmp_path, "xref.pdf", broken))
    assert not [r for r in caplog.records if r.name.startswith("pypdf")]
    assert any(w.startswith("damaged PDF structure repaired") for w in doc.warnings)
    assert "The fact of page 3 is 21." in doc.text


@pytest.mark.parametrize("in_thread", [False, True], ids=["main-thread-alarm", "worker-thread"])
def test_slow_page_is_skipped_under_time_limit(tmp_path, in_thread):
    pages = [show_text("before the slow page"), heavy_content(60_000), show_text("after the slow page")]
    path = write(tmp_path, "slow.pdf", raw_text_pdf(pages))
    result = {}

    def run():
        result["doc"] = load_document(path, page_time_limit=0.2)

    run_here_or_in_a_thread(run, in_thread, 30)
    doc = result["doc"]
    assert [p.text for p in doc.pages] == ["before the slow page", "", "after the slow page"]
    assert doc.warnings == ("page 2: text extraction took over 0.2 s, skipped",)


def test_progress_reports_every_page(book_pdf):
    calls = []
    load_document(book_pdf, pages="2-4", progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 3), (1, 3), (2, 3), (3, 3)]


def test_pypdf_problems_are_shown_as_plain_text():
    from locks_chat.ingest.pdf_problems import plain_problem as _plain_problem

    raw = "PdfReadError(\"Invalid Elementary Object starting with b'\\\\n' @52: b'tato) Tj\\\\nET\\\\n<< /oops\\\\n'\")"
    assert _plain_problem(raw) == "Invalid Elementary Object starting with..."
    plain = "Ignoring wrong pointing object 6 0 (offset 0)"
    assert _plain_problem(plain) == plain
    assert len(_plain_problem("word " * 40)) <= 80 and _plain_problem("word " * 40).endswith("word...")


@pytest.mark.parametrize("in_thread", [False, True], ids=["main-thread-alarm", "worker-thread"])
def test_opening_is_refused_past_its_time_limit(monkeypatch, book_pdf, in_thread):
    """pypdf parses the whole object graph of some hostile files while opening them: that is under a limit too."""
    import time

    from locks_chat.ingest import pdf

    def slow_open(data, source, password):
        time.sleep(5)

    monkeypatch.setattr(pdf, "_open", slow_open)
    result = {}

    def run():
        start = time.monotonic()
        try:
            pdf.read_pdf(book_pdf.read_bytes(), "slow.pdf", open_time_limit=0.2)
        except DocumentError as err:
            result["error"], result["s"] = err.message, time.monotonic() - start

    run_here_or_in_a_thread(run, in_thread, 30)
    assert result["error"] == ("slow.pdf: opening the PDF took over 0.2 s (a damaged or hostile file); repair it "
                               "(e.g. qpdf) or pass another file")
    assert result["s"] < 2
