"""EPUB ingestion on books ebooklib writes in the test."""

from __future__ import annotations

import io
import zipfile

import pytest

from locks_chat.errors import DocumentError, EncryptedError, NoTextError
from locks_chat.ingest import PageKind, limits, load_document
from tests.support.ingest_samples import epub_book, write

CHAPTERS = [
    ("The Beginning", "<p>It was a dark and stormy night.</p><p>The \ufb01re went out.</p>"),
    ("The Middle", "<p>A table follows.</p><table><tr><td>alpha</td><td>beta</td></tr></table>"),
    ("The End", "<p>They lived on <em>happily</em> ever after.</p>"),
]


def test_chapters_are_pages_in_reading_order(tmp_path):
    doc = load_document(write(tmp_path, "small.epub", epub_book(CHAPTERS)))
    assert doc.format == "epub" and doc.page_kind is PageKind.CHAPTER
    assert doc.title == "A Small Book"
    assert [p.label for p in doc.pages] == ["1", "2", "3"]
    first, middle, last = doc.pages
    assert first.text.startswith("The Beginning")
    assert "It was a dark and stormy night." in first.text
    assert "The fire went out." in first.text
    assert "alpha" in middle.text and "beta" in middle.text
    assert "They lived on happily ever after." in last.text
    assert doc.page_at(doc.text.index("happily")) is last


def test_the_table_of_contents_in_the_spine_is_not_a_page(tmp_path):
    doc = load_document(write(tmp_path, "nav.epub", epub_book(CHAPTERS, nav_in_spine=True)))
    assert [p.label for p in doc.pages] == ["1", "2", "3"]
    assert doc.pages[0].text.startswith("The Beginning")


def test_epub_is_sniffed_without_its_suffix(tmp_path):
    doc = load_document(write(tmp_path, "book.bin", epub_book(CHAPTERS)))
    assert doc.format == "epub"


def test_chapter_range(tmp_path):
    doc = load_document(write(tmp_path, "small.epub", epub_book(CHAPTERS)), pages="2-3")
    assert [p.number for p in doc.pages] == [2, 3]
    assert doc.text.startswith("The Middle")


def test_epub_without_text_is_refused(tmp_path):
    with pytest.raises(NoTextError):
        load_document(write(tmp_path, "empty.epub", epub_book([("", "")], cover=True)))


def test_drm_epub_is_refused(tmp_path):
    source = zipfile.ZipFile(io.BytesIO(epub_book(CHAPTERS)))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        for item in source.infolist():
            target.writestr(item, source.read(item.filename))
        target.writestr(
            "META-INF/encryption.xml",
            '<encryption><EncryptedData><EncryptionMethod Algorithm="http://www.w3.org/2001/04/xmlenc#aes128-cbc"/>'
            "</EncryptedData></encryption>",
        )
    with pytest.raises(EncryptedError, match="DRM"):
        load_document(write(tmp_path, "drm.epub", out.getvalue()))


def test_epub_that_is_not_a_zip_is_refused(tmp_path):
    with pytest.raises(DocumentError, match="not an EPUB"):
        load_document(write(tmp_path, "fake.epub", b"<html>not a book</html>"))


def test_epub_that_unpacks_past_the_cap_is_refused(tmp_path, monkeypatch):
    data = epub_book([("Filler", "<p>" + "all work and no play " * 20_000 + "</p>")])  # 420 kB unpacked
    path = write(tmp_path, "bomb.epub", data)
    monkeypatch.setattr(limits, "MAX_DOCUMENT_BYTES", 256 << 10)
    assert len(data) < 256 << 10
    with pytest.raises(DocumentError) as info:
        load_document(path)
    assert str(info.value) == (
        f"{path}: unpacks to more than 256 KiB: not an EPUB locks-chat reads (a zip bomb?); pass another file"
    )


def test_a_damaged_package_is_one_line_without_the_librarys_internals(tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("mimetype", "application/epub+zip")
        archive.writestr(
            "META-INF/container.xml",
            '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
            '<rootfiles><rootfile full-path="content.opf" media-type="application/oebps-package+xml"/></rootfiles>'
            "</container>",
        )
        archive.writestr("content.opf", '<?xml version="1.0"?><foo/>')
    path = write(tmp_path, "damaged.epub", buffer.getvalue())
    with pytest.raises(DocumentError) as caught:
        load_document(path)
    assert "not a readable EPUB (its package or table of contents is damaged)" in caught.value.message
    assert "NoneType" not in caught.value.message


def test_library_reasons_are_cut_at_a_word_and_marked():
    from locks_chat.errors import exception_reason

    missing = KeyError("There is no item named 'META-INF/container.xml' in the archive")
    assert exception_reason(missing, 100) == "There is no item named 'META-INF/container.xml' in the archive"
    assert exception_reason(missing, 40) == "There is no item named..."
    assert exception_reason(ValueError("   ")) == "ValueError"
    assert exception_reason(FileNotFoundError("/a/" + "x" * 200), 30) == "/a/" + "x" * 24 + "..."
