"""Plain text and Markdown: encodings, form-feed and fixed-size pages, offsets."""

from __future__ import annotations

import pytest

from locks_chat.errors import DocumentError, NoTextError, PageRangeError
from locks_chat.ingest import PageKind, load_document
from locks_chat.ingest.text import TEXT_PAGE_CHARS, split_text_pages
from tests.support.ingest_samples import write

ACCENTED = "Café crème, naïve façade: déjà vu.\n"


@pytest.mark.parametrize(
    "encoding, data, warned",
    [
        ("utf-8", ACCENTED.encode("utf-8"), False),
        ("utf-8-bom", b"\xef\xbb\xbf" + ACCENTED.encode("utf-8"), False),
        ("latin-1", (ACCENTED * 40).encode("latin-1"), True),
        ("cp1252", ("\u201cQuoted\u201d \u2014 " + ACCENTED).encode("cp1252") * 40, True),
        ("utf-16-bom", ACCENTED.encode("utf-16"), True),
        ("utf-16-be-bom", b"\xfe\xff" + ACCENTED.encode("utf-16-be"), True),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_encodings_decode_with_a_warning_never_a_crash(tmp_path, encoding, data, warned):
    doc = load_document(write(tmp_path, "book.txt", data))
    assert "Café crème, naïve façade: déjà vu." in doc.text
    assert not doc.text.startswith("\ufeff")
    assert bool(doc.warnings) == warned
    if warned:
        assert doc.warnings[0].startswith("not UTF-8; decoded as")


def test_a_utf8_file_with_a_stray_byte_stays_utf8_with_a_warning(tmp_path):
    data = (ACCENTED * 3).encode("utf-8") + b"caf\xe9 au lait\n" + ACCENTED.encode("utf-8")
    doc = load_document(write(tmp_path, "book.txt", data))
    assert doc.text.count("Café crème, naïve façade: déjà vu.") == 4 and "caf\ufffd au lait" in doc.text
    assert doc.warnings == ("1 byte not UTF-8 (the first on line 4), shown as \ufffd; the rest read as UTF-8",)


def test_binary_bytes_are_refused(tmp_path):
    path = write(tmp_path, "data.txt", bytes(range(1, 32)) * 200)
    with pytest.raises(DocumentError, match="not text|not a text file") as info:
        load_document(path)
    assert "\n" not in str(info.value)


def test_empty_file_is_refused(tmp_path):
    with pytest.raises(NoTextError, match="no text"):
        load_document(write(tmp_path, "empty.txt", b" \n\n \n"))


def test_form_feeds_make_the_pages(tmp_path):
    data = b"Page one text.\fPage two text.\f\fPage four text.\f"
    doc = load_document(write(tmp_path, "paged.txt", data))
    assert doc.page_kind is PageKind.FORM_FEED
    assert [(p.label, p.text) for p in doc.pages] == [
        ("1", "Page one text."),
        ("2", "Page two text."),
        ("3", ""),
        ("4", "Page four text."),
    ]
    assert doc.page_count == 4
    assert doc.page_at(doc.text.index("four")).label == "4"


def paragraphs(count: int) -> str:
    return "\n\n".join(f"Paragraph {i}:" + " word" * (17 + i % 13) for i in range(count))


def test_text_pages_break_at_paragraphs_within_the_size():
    text = paragraphs(400)
    pages = split_text_pages(text)
    assert all(TEXT_PAGE_CHARS // 2 <= len(p) <= TEXT_PAGE_CHARS for p in pages[:-1])
    assert all(p.startswith("Paragraph ") and p.endswith("word") for p in pages)
    assert "\n\n".join(pages) == text


@pytest.mark.parametrize("shape", ["one-long-line", "lines-no-blank", "no-spaces"])
def test_text_pages_without_paragraphs_still_bounded(shape):
    text = {
        "one-long-line": "word " * 5000,
        "lines-no-blank": "a line of verse\n" * 900,
        "no-spaces": "x" * 10_001,
    }[shape].strip()
    pages = split_text_pages(text)
    assert all(0 < len(p) <= TEXT_PAGE_CHARS for p in pages)
    assert "".join(pages).replace(" ", "").replace("\n", "") == text.replace(" ", "").replace("\n", "")


def test_text_pages_are_stable_and_offsets_map_back(tmp_path):
    path = write(tmp_path, "essay.md", ("# An Essay\n\n" + paragraphs(200)).encode())
    first, second = load_document(path), load_document(path)
    assert first == second
    assert first.format == "markdown" and first.title == "An Essay"
    assert first.page_kind is PageKind.TEXT_BLOCK
    assert "3,000 characters" in first.page_kind.description
    for page in first.pages:
        assert first.text[page.start : page.end] == page.text
        assert first.page_at(page.start) is page
        assert first.page_at(page.end - 1) is page
    assert first.pages_between(first.pages[1].start, first.pages[3].start + 1) == first.pages[1:4]


def test_page_range_on_text_pages(tmp_path):
    path = write(tmp_path, "essay.txt", paragraphs(200).encode())
    whole = load_document(path)
    part = load_document(path, pages="2-3")
    assert [p.number for p in part.pages] == [2, 3]
    assert part.pages[0].text == whole.pages[1].text
    assert part.page_count == whole.page_count
    with pytest.raises(PageRangeError, match=f"physical 1-{whole.page_count}"):
        load_document(path, pages=f"2-{whole.page_count + 1}")


def test_a_path_with_a_line_break_gives_one_line(tmp_path):
    """A file name may hold a line break: the error names it escaped, on one line; a loaded title has none."""
    with pytest.raises(DocumentError) as err:
        load_document(str(tmp_path / "no\nsuch.txt"))
    assert "\n" not in err.value.message and "no\\nsuch.txt: no such file" in err.value.message
    path = tmp_path / "a\nbell\x07.txt"
    path.write_text("Some text.\n")
    assert load_document(str(path)).title == "a bell"


def test_error_messages_escape_control_characters():
    assert DocumentError("a\r\nb\tc\x1bd").message == "a\\r\\nb\\tc\\x1bd"
