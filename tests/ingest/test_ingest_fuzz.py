"""Fuzzed ingestion through ``load_document``: every input either loads as a consistent document or raises the
app's one-line error, within the per-page time limit and a memory cap (``locks_tools.fuzz_check``).

The ``ci`` Hypothesis profile, the default (``tests/conftest.py``), keeps this module under two minutes and draws
the same inputs on every run; ``--hypothesis-profile=fuzz`` draws 20 times more, at random. Inputs that once broke
the property are kept as explicit examples, and the fixes they led to have plain tests below.
"""

from __future__ import annotations

import faulthandler
import time
import zipfile

import pytest
from hypothesis import example, given

from locks_tools import fuzz_check, fuzz_docs, fuzz_mutate, fuzz_pdf
from locks_tools.fuzz_docs import zip_bytes
from locks_tools.fuzz_pdf import assemble, simple_objects
from locks_chat.errors import DocumentError, PageRangeError
from locks_chat.ingest import epub, load_document
from tests.support.ingest_samples import write

KINDS = fuzz_check.input_kinds()
HANG_S = 120
"""seconds after which one input counts as a hang: the process exits with every thread's traceback"""


def label_pdf(label: bytes, title: bytes = b"(A title)") -> bytes:
    """A one-page PDF whose page label prefix and title are the given PDF strings."""
    objects = simple_objects()
    objects[0] = b"<< /Type /Catalog /Pages 2 0 R /PageLabels << /Nums [0 << /P %s >>] >> >>" % label
    return assemble([*objects, b"<< /Title %s >>" % title], trailer=b"/Info 6 0 R ")


def small_epub(chapters: list[tuple[str, bytes]], title: str = "Fuzz", opf_path: str = "OEBPS/content.opf") -> bytes:
    """An EPUB of (href, XHTML) chapters, stored under the package's folder, all in the spine."""
    items = "".join(f'<item id="c{i}" href="{href}" media-type="application/xhtml+xml"/>'
                    for i, (href, _) in enumerate(chapters))
    spine = "".join(f'<itemref idref="c{i}"/>' for i in range(len(chapters)))
    folder = opf_path.rpartition("/")[0]
    members = [("mimetype", b"application/epub+zip"),
               ("META-INF/container.xml", (fuzz_docs._CONTAINER % f'"{opf_path}"').encode()),
               (opf_path, (fuzz_docs._OPF % (title, items, spine)).encode())]
    members += [(f"{folder}/{href}" if folder else href, body) for href, body in chapters]
    return zip_bytes(members)


def chapter(text: str) -> bytes:
    return f"<html><body><p>{text}</p></body></html>".encode()


LABEL_WITH_LINE_BREAK = label_pdf(b"(A\nB\x07)", b"(Evil\x07 title\r\nsecond line)")
"""a page label and a title with a line break and a BEL: the label once split the ``--pages`` error in two
(an AssertionError, a traceback at the CLI)"""
REPEATED_PAGE_TREE = assemble([
    b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
    b"<< /Type /Page /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
    fuzz_pdf.stream(fuzz_pdf.show(b"the one page")), fuzz_pdf.FONT,
    *(b"<< /Type /Pages /Kids [%d 0 R %d 0 R] /Count 2 >>" % ((n + 1, n + 1) if n < 20 else (3, 3))
      for n in range(6, 21)),
]).replace(b"/Kids [3 0 R]", b"/Kids [6 0 R]")
"""2 KB whose page tree lists one page object 32,768 times (15 levels of ``/Kids [n 0 R n 0 R]``): the fuzzer's
version took 100 s, each copy of the page read again in turn"""
EPUB_TITLE_WITH_ESCAPE = small_epub([("ch.xhtml", chapter("Text."))], title="Clear&#27;[2J screen")
"""an EPUB title holding an ESC sequence that clears the terminal"""
EPUB_BOMB = small_epub([("ch.xhtml", chapter("all work and no play " * 400_000))])
"""40 KB holding 8 MB of XHTML: half a second and 12 MB of memory per MB; with the 1 GiB cap it could hold 1 GiB"""


def assert_handled(tmp_path, case: tuple[bytes, str], pages: str | None) -> None:
    data, name = case
    path = write(tmp_path, name, data)
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    try:
        outcome = fuzz_check.load_outcome(path, pages)
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert outcome.problems == [], (outcome.status, outcome.message)


@given(KINDS["pdf-mutated"], fuzz_check.PAGES)
def test_mutated_pdfs(tmp_path, case, pages):
    assert_handled(tmp_path, case, pages)


@given(KINDS["pdf-hostile"], fuzz_check.PAGES)
@example((LABEL_WITH_LINE_BREAK, "doc.pdf"), "9")
@example((LABEL_WITH_LINE_BREAK, "doc.pdf"), None)
@example((REPEATED_PAGE_TREE, "doc.pdf"), None)
def test_hostile_pdfs(tmp_path, case, pages):
    assert_handled(tmp_path, case, pages)


@given(KINDS["pdf-header-random"] | KINDS["other-header-random"], fuzz_check.PAGES)
def test_random_bytes_after_a_valid_header(tmp_path, case, pages):
    assert_handled(tmp_path, case, pages)


@given(KINDS["epub-hostile"], fuzz_check.PAGES)
@example((EPUB_TITLE_WITH_ESCAPE, "book.epub"), None)
@example((EPUB_BOMB, "book.epub"), None)
def test_hostile_epubs(tmp_path, case, pages):
    assert_handled(tmp_path, case, pages)


@given(KINDS["epub-mutated"], fuzz_check.PAGES)
def test_mutated_epubs(tmp_path, case, pages):
    assert_handled(tmp_path, case, pages)


@given(KINDS["text-markdown"], fuzz_check.PAGES)
def test_mixed_encodings_and_control_characters(tmp_path, case, pages):
    assert_handled(tmp_path, case, pages)


def test_seeds_load(tmp_path):
    """The mutations start from documents that load (one needs its password), else the mutated families test less
    than they claim."""
    statuses = []
    for seed in (*fuzz_mutate.pdf_seeds(), *fuzz_docs.epub_seeds()):
        path = write(tmp_path, "seed.epub" if seed.startswith(b"PK") else "seed.pdf", seed)
        outcome = fuzz_check.load_outcome(path, None)
        assert outcome.problems == []
        statuses.append(outcome.error or outcome.status)
    assert statuses == ["loaded"] * 5 + ["EncryptedError"] + ["loaded"] * 3


def test_page_label_and_title_are_one_line(tmp_path):
    path = write(tmp_path, "labels.pdf", LABEL_WITH_LINE_BREAK)
    document = load_document(path)
    assert [page.label for page in document.pages] == ["A B"]
    assert document.title == "Evil title second line"
    with pytest.raises(PageRangeError) as info:
        load_document(path, pages="9")
    assert str(info.value) == "--pages '9': no page is printed '9'; valid pages: physical 1-1 (printed A B)"


def test_a_page_object_listed_again_is_read_once(tmp_path):
    document = load_document(write(tmp_path, "repeated.pdf", REPEATED_PAGE_TREE))
    assert len(document.pages) == document.page_count == 32_768
    assert document.text == "the one page"
    assert document.warnings == ("pages 2-32768: the page object of an earlier page again (a damaged page tree), "
                                 "skipped",)


def test_epub_title_loses_its_escape_sequence(tmp_path):
    document = load_document(write(tmp_path, "title.epub", EPUB_TITLE_WITH_ESCAPE))
    assert document.title == "Clear[2J screen"


def test_epub_zip_bomb_is_refused_by_its_ratio(tmp_path):
    path = write(tmp_path, "bomb.epub", EPUB_BOMB)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("OEBPS/ch.xhtml")
    assert info.file_size > epub.MAX_RATIO * info.compress_size
    with pytest.raises(DocumentError) as info:
        load_document(path)
    assert "OEBPS/ch.xhtml unpacks to 8,400,033 bytes from" in str(info.value)
    assert str(info.value).endswith("(a zip bomb?): not an EPUB locks-chat reads; pass another file")


def test_epub_member_that_inflates_past_its_declared_size_is_refused(tmp_path):
    data = small_epub([("ch.xhtml", chapter("x" * 5000))])
    lying = zip_bytes(zipfile_members(data), declared={3: 100})
    with pytest.raises(DocumentError, match="not a readable EPUB .*Bad CRC-32"):
        load_document(write(tmp_path, "lying.epub", lying))


def zipfile_members(data: bytes) -> list[tuple[str, bytes]]:
    import io

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return [(info.filename, archive.read(info)) for info in archive.infolist()]


def test_slow_epub_chapter_is_skipped_under_time_limit(tmp_path):
    slow = chapter(" ".join(f"w{i}" for i in range(300_000)))
    data = small_epub([("a.xhtml", chapter("Before.")), ("b.xhtml", slow), ("c.xhtml", chapter("After."))])
    document = load_document(write(tmp_path, "slow.epub", data), page_time_limit=0.05)
    assert [page.text for page in document.pages] == ["Before.", "After."]
    assert document.warnings == ("b.xhtml: text extraction took over 0.05 s, skipped",)


@pytest.mark.parametrize("href", ["../secret.xhtml", "../../secret.xhtml", "/secret.xhtml", "SECRET_ABS"],
                         ids=["parent", "grandparent", "absolute", "absolute-real-path"])
def test_epub_paths_outside_the_archive_read_nothing_outside(tmp_path, href):
    secret = write(tmp_path, "secret.xhtml", chapter("SECRET ON DISK"))
    href = str(secret) if href == "SECRET_ABS" else href
    data = small_epub([("ch.xhtml", chapter("Inside.")), (href, chapter("inside the archive"))])
    try:
        document = load_document(write(tmp_path, "book.epub", data))
    except DocumentError as exc:
        assert "SECRET" not in str(exc)
    else:
        assert "SECRET ON DISK" not in document.text


def test_the_time_limit_is_checked_on_cpu_time(tmp_path, monkeypatch):
    """A busy machine stretches the wall clock of the same work (the hostile PDFs failed one run and passed the
    next, a Hypothesis FlakyFailure): the limit holds the load's own CPU time; a load that computes past it is
    still a problem."""
    import locks_chat.ingest

    real = locks_chat.ingest.load_document
    monkeypatch.setattr(fuzz_check, "page_time_limit", lambda: 0.2)
    path = write(tmp_path, "doc.txt", b"Some text.")

    def waits(*args, **kwargs):  # another job holds the CPU: the wall clock runs, this process's CPU time does not
        time.sleep(0.4)
        return real(*args, **kwargs)

    def computes(*args, **kwargs):
        end = time.process_time() + 0.4
        while time.process_time() < end:
            pass
        return real(*args, **kwargs)

    monkeypatch.setattr(locks_chat.ingest, "load_document", waits)
    waited = fuzz_check.load_outcome(path, None)
    assert waited.seconds >= 0.4 and waited.problems == []
    monkeypatch.setattr(locks_chat.ingest, "load_document", computes)
    computed = fuzz_check.load_outcome(path, None)
    assert computed.cpu_seconds >= 0.4 and len(computed.problems) == 1
    assert "of CPU time" in computed.problems[0] and "over the per-page limit of 0.2 s" in computed.problems[0]
