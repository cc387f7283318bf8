"""Small documents the ingestion tests build themselves: PDFs (fpdf2 + pypdf), EPUBs (ebooklib)."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from fpdf import FPDF
from pypdf import PdfReader, PdfWriter
from pypdf.generic import (
    ArrayObject,
    DecodedStreamObject,
    DictionaryObject,
    NameObject,
    NumberObject,
)

LIGATURE_CODES = {"\x01": "fi", "\x02": "fl", "\x03": "ff", "\x04": "ffi", "\x05": "ffl"}
"""byte codes the ligature font maps to the Adobe glyph names of the ligatures, as TeX fonts do"""


def text_pdf(pages: Sequence[str | None], *, image_pages: Sequence[int] = ()) -> bytes:
    """A PDF with one page per entry: its text (Helvetica), or ``None`` for a blank page.

    Args:
        pages: text of each page; ``None`` leaves the page blank.
        image_pages: 0-based pages that get a raster image (a "scan") instead of their text.
    """
    from PIL import Image

    pdf = FPDF()
    pdf.set_font("Helvetica", size=11)
    for index, text in enumerate(pages):
        pdf.add_page()
        if index in image_pages:
            scan = Image.new("L", (120, 160), color=255)
            scan.paste(0, (20, 20, 100, 30))
            pdf.image(scan, x=20, y=20, w=120)
        elif text is not None:
            pdf.multi_cell(0, 6, text)
    return bytes(pdf.output())


def with_page_labels(data: bytes, ranges: Sequence[tuple[int, int, str, int]]) -> bytes:
    """Copy of a PDF with ``/PageLabels``: each (first, last, style, start) like pypdf's
    ``set_page_label`` (style ``"/r"`` lower roman, ``"/D"`` decimal)."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(data)))
    for first, last, style, start in ranges:
        writer.set_page_label(first, last, style=style, start=start)
    return _written(writer)


def encrypted(data: bytes, user_password: str, owner_password: str | None = None) -> bytes:
    """Copy of a PDF encrypted with AES-256."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(data)))
    writer.encrypt(user_password=user_password, owner_password=owner_password, algorithm="AES-256")
    return _written(writer)


def raw_text_pdf(contents: Sequence[bytes]) -> bytes:
    """A PDF whose pages have the given raw content streams, with font ``/F1``: Times-Roman
    whose codes 1-5 are the ligatures ``fi fl ff ffi ffl`` (see :data:`LIGATURE_CODES`)."""
    writer = PdfWriter()
    differences = [NumberObject(1)] + [NameObject(f"/{name}") for name in LIGATURE_CODES.values()]
    encoding = DictionaryObject(
        {
            NameObject("/Type"): NameObject("/Encoding"),
            NameObject("/BaseEncoding"): NameObject("/WinAnsiEncoding"),
            NameObject("/Differences"): ArrayObject(differences),
        }
    )
    font = DictionaryObject(
        {
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/Times-Roman"),
            NameObject("/Encoding"): encoding,
        }
    )
    font_ref = writer._add_object(font)
    for content in contents:
        page = writer.add_blank_page(612, 792)
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font_ref})}
        )
        stream = DecodedStreamObject()
        stream.set_data(content)
        page.replace_contents(stream)
    return _written(writer)


def show_text(text: str) -> bytes:
    """A content stream showing ``text`` (latin-1 plus the ligature codes) in ``/F1``."""
    escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
    lines = escaped.split("\n")
    ops = b" ".join(b"(" + line.encode("latin-1") + b") Tj 0 -14 Td" for line in lines)
    return b"BT /F1 12 Tf 72 720 Td " + ops + b" ET"


def heavy_content(operations: int) -> bytes:
    """A content stream of ``operations`` tiny text-showing operations: slow to extract."""
    return b"BT /F1 12 Tf 72 700 Td " + b"(ab) Tj 1 0 Td " * operations + b"ET"


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def epub_book(
    chapters: Sequence[tuple[str, str]], *, title: str = "A Small Book", cover: bool = True, nav_in_spine: bool = False
) -> bytes:
    """An EPUB written by ebooklib: an image-only cover page, then (title, body HTML) chapters; with
    ``nav_in_spine`` the navigation document (the table of contents) comes first in the spine, as ebooklib's
    own example writes it."""
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("locks-chat-test")
    book.set_title(title)
    book.set_language("en")
    spine = []
    if cover:
        page = epub.EpubHtml(title="Cover", file_name="cover_page.xhtml", lang="en")
        page.content = '<html><body><img src="cover.png" alt=""/></body></html>'
        book.add_item(page)
        spine.append(page)
    for index, (heading, body) in enumerate(chapters, start=1):
        page = epub.EpubHtml(title=heading, file_name=f"chapter_{index}.xhtml", lang="en")
        page.content = f"<html><body><h1>{heading}</h1>{body}</body></html>"
        book.add_item(page)
        spine.append(page)
    book.toc = tuple(spine)
    book.add_item(epub.EpubNcx())
    nav = epub.EpubNav()
    book.add_item(nav)
    book.spine = [nav, *spine] if nav_in_spine else spine
    out = io.BytesIO()
    epub.write_epub(out, book)
    return out.getvalue()


def _written(writer: PdfWriter) -> bytes:
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def run_here_or_in_a_thread(run: Callable[[], None], in_thread: bool, join_s: float = 30) -> None:
    """Call ``run`` in this (main) thread, where the time limits use SIGALRM, or in a worker thread (the chat
    app's ingestion), where they abandon the call; waits up to ``join_s`` seconds for the worker."""
    if not in_thread:
        run()
        return
    worker = threading.Thread(target=run)
    worker.start()
    worker.join(join_s)
