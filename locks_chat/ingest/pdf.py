"""PDF pages through pypdf: text, printed label and physical number of each page.

A cited page of a PDF is a physical page of the file, shown by its printed label
(``/PageLabels``: "iv" for roman front matter) and kept with its 1-based physical number.
pypdf reads in non-strict mode, so broken cross-reference tables are rebuilt; a file it
cannot open (a truncated download has lost its trailer) is retried once with a new trailer
so the objects that remain are read. pypdf's log messages are collected into warnings that name
their page and cause (:mod:`.pdf_problems`) instead of being printed. Each page is extracted under a time limit
(:mod:`.timelimit`); a page that fails or runs past it is skipped with a warning, and so is a page whose object an
earlier page already is (a damaged or crafted page tree that repeats one page object thousands of times). Pages with images but no text are named in a
warning ("page 2: no text layer, OCR needed"); a selection with no text at all is refused. The pages' text is
extracted in :mod:`.pdf_extract`, their labels and names in messages come from :mod:`.pdf_labels`.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from locks_chat.errors import DocumentError, EncryptedError, NoTextError, exception_reason, is_text
from locks_chat.ingest.document import Document, PageKind, RawPage, build_document
from locks_chat.ingest.limits import unused_password_warning
from locks_chat.ingest.normalize import one_line
from locks_chat.ingest.pagerange import describe_pages, parse_page_range
from locks_chat.ingest.pdf_extract import extract_pages
from locks_chat.ingest.pdf_labels import page_labels, pages_name
from locks_chat.ingest.pdf_problems import PdfProblems, pypdf_log, text_without_fonts
from locks_chat.ingest.progress import ProgressCallback
from locks_chat.ingest.timelimit import TimeLimitExceeded, call_with_time_limit


#: seconds opening a PDF may take before it is refused (:func:`read_pdf`'s ``open_time_limit``)
OPEN_TIME_LIMIT_S = 30.0
#: seconds the search for pages of a truncated PDF whose fonts were lost may take, all pages together (it decodes
#: their content streams: a hostile file's can be large); the pages found by then are named
FONT_CHECK_LIMIT_S = 2.0
#: what a truncated PDF's page whose content survives but whose fonts do not is told to have lost
FONTS_LOST = "its text survives but the fonts needed to read it were in the lost part"


def read_pdf(
    data: bytes,
    source: str,
    *,
    password: str | None = None,
    pages: str | None = None,
    progress: ProgressCallback | None = None,
    page_time_limit: float | None = 10.0,
    open_time_limit: float | None = OPEN_TIME_LIMIT_S,
) -> Document:
    """Extract the text of a PDF's pages.

    Args:
        data (bytes): the PDF file's content.
        source (str): the file name, for messages.
        password (str | None): user or owner password; ``None`` tries the empty password. Given for a PDF
            that is not encrypted, it is ignored with a warning in :attr:`Document.warnings`.
        pages (str | None): a ``--pages`` selector (:mod:`.pagerange`); ``None`` for all.
        progress (ProgressCallback | None): called with (pages done, pages selected).
        page_time_limit (float | None): seconds one page may take; ``None`` for no limit.
        open_time_limit (float | None): seconds opening the file may take (pypdf parses the trailer, the
            cross-reference table and the page tree then; objects nested 200,000 deep took ~3 s per 2 MB);
            ``None`` for no limit.

    Raises:
        EncryptedError: a password is needed, or the one given is wrong.
        DocumentError: not a readable PDF.
        NoTextError: no selected page has a text layer.
        PageRangeError: ``pages`` is malformed or out of range.
    """
    problems = PdfProblems()
    fonts_lost: list[int] = []
    with pypdf_log(problems):
        reader, data, salvaged = _open_limited(data, source, password, open_time_limit)
        labels = page_labels(reader, source)
        selected = parse_page_range(pages, labels)
        raw_pages, warnings = extract_pages(
            reader, lambda: _open(data, source, password), selected, labels, progress, page_time_limit, problems
        )
        title = _title(reader)
        if password is not None and not reader.is_encrypted:
            warnings.append(unused_password_warning(source))
        if salvaged:
            fonts_lost = _fonts_lost(reader, raw_pages)
    if salvaged:
        lost = [page.number - 1 for page in raw_pages if not page.text and page.number - 1 not in fonts_lost]
        lost_text = f"; {pages_name(lost, labels)}: no text, possibly lost" if lost else ""
        if fonts_lost:
            lost_text += f"; {pages_name(fonts_lost, labels)}: {FONTS_LOST}"
        warnings.insert(0, f"truncated or damaged PDF: read the objects that remained{lost_text}")
    else:
        warnings[:0] = problems.warnings(lambda indices: pages_name(indices, labels))
    if not any(page.text for page in raw_pages):
        raise NoTextError(_no_text_message(source, pages, labels, warnings, salvaged, fonts_lost))
    return build_document(source, "pdf", PageKind.PDF, title or one_line(Path(source).stem), raw_pages, len(labels),
                          warnings)


def check_pdf(data: bytes, source: str, *, password: str | None = None, pages: str | None = None) -> None:
    """Open the PDF and resolve ``pages`` against its page labels, without extracting any text.

    Raises:
        EncryptedError, DocumentError, NoTextError (no pages), PageRangeError: as :func:`read_pdf`.
    """
    with pypdf_log(PdfProblems()):
        reader, _, _ = _open_limited(data, source, password, OPEN_TIME_LIMIT_S)
        parse_page_range(pages, page_labels(reader, source))


def _open_limited(data: bytes, source: str, password: str | None, seconds: float | None):
    """:func:`_open_or_salvage` under a wall-clock limit.

    Raises:
        DocumentError: opening took over ``seconds``; and what :func:`_open_or_salvage` raises.
    """
    try:
        return call_with_time_limit(partial(_open_or_salvage, data, source, password), seconds)
    except TimeLimitExceeded:
        raise DocumentError(f"{source}: opening the PDF took over {seconds:g} s (a damaged or hostile file); "
                            "repair it (e.g. qpdf) or pass another file") from None


def _open_or_salvage(data: bytes, source: str, password: str | None):
    """Open the PDF; if that fails, retry on a copy whose lost trailer is replaced.

    Returns:
        the reader, the bytes it reads, and whether they are a salvaged copy.
    """
    try:
        return _open(data, source, password), data, False
    except EncryptedError:
        raise
    except DocumentError as exc:
        truncated = b"%%EOF" not in data[-1024:]
        salvaged = _with_new_trailer(data)
        try:
            if salvaged is None:
                raise exc
            return _open(salvaged, source, password), salvaged, True
        except DocumentError:
            if truncated:
                message = (
                    f"{source}: truncated PDF (its end is missing), unreadable without it; download or copy it again"
                )
                raise DocumentError(message) from exc
            raise exc from None


def _with_new_trailer(data: bytes) -> bytes | None:
    """The PDF cut after its last complete object, with an empty trailer and a startxref of 0.

    pypdf then rebuilds the cross-reference table by scanning for objects and finds the
    catalog by its ``/Type /Catalog``: what a truncated download still holds can be read.
    """
    end = data.rfind(b"endobj")
    numbers = [int(n) for n in re.findall(rb"(\d+)\s+\d+\s+obj\b", data[: end + 6])]
    if end < 0 or not numbers:
        return None
    return data[: end + 6] + b"\ntrailer\n<< /Size %d >>\nstartxref\n0\n%%%%EOF\n" % (max(numbers) + 1)


def _password(password: str | None) -> str | bytes:
    """What ``PdfReader.decrypt`` takes: the text (pypdf encodes it as the PDF's revision wants), or the bytes typed
    when they were not UTF-8 (Python holds them as lone surrogates, which pypdf cannot encode); ``""`` for none."""
    if password is None:
        return ""
    return password if is_text(password) else os.fsencode(password)


def _open(data: bytes, source: str, password: str | None):
    from pypdf import PasswordType, PdfReader
    from pypdf.errors import DependencyError

    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            result = reader.decrypt(_password(password))
            if result == PasswordType.NOT_DECRYPTED:
                if password is None:
                    raise EncryptedError(f"{source}: encrypted: pass --password")
                raise EncryptedError(f"{source}: wrong password for this encrypted PDF; check --password")
        len(reader.pages)
    except (DocumentError, TimeLimitExceeded):
        raise
    except DependencyError as exc:
        raise DocumentError(f"{source}: {exc}; reinstall locks-chat with its dependencies") from exc
    except Exception as exc:
        reason = exception_reason(exc)
        raise DocumentError(
            f"{source}: not a readable PDF ({reason}); repair it (e.g. qpdf) or pass another file"
        ) from exc
    return reader


def _fonts_lost(reader, raw_pages: Sequence[RawPage]) -> list[int]:
    """0-based indices of the pages without text whose content shows text but whose fonts are gone
    (:func:`.pdf_problems.text_without_fonts`), searched for at most :data:`FONT_CHECK_LIMIT_S`."""
    found: list[int] = []

    def search() -> None:
        for page in raw_pages:
            if not page.text and text_without_fonts(reader, page.number - 1):
                found.append(page.number - 1)

    try:
        call_with_time_limit(search, FONT_CHECK_LIMIT_S)
    except TimeLimitExceeded:
        pass
    return list(found)


def _title(reader) -> str | None:
    try:
        title = reader.metadata.title if reader.metadata else None
    except Exception:
        return None
    return one_line(str(title)) if title else None


def _no_text_message(
    source: str, pages: str | None, labels: Sequence[str], warnings: Sequence[str], salvaged: bool,
    fonts_lost: Sequence[int] = (),
) -> str:
    where = f"pages {pages!r} of {source}" if pages else source
    if fonts_lost:
        return (f"{where}: truncated PDF: {pages_name(fonts_lost, labels)}: {FONTS_LOST}; download or copy it "
                "again")
    if salvaged:
        return f"{where}: truncated or damaged PDF with no text left in what remains; download or copy it again"
    if any(w.endswith("OCR needed") for w in warnings):
        return f"{where}: no text layer (scanned images); OCR the file first (e.g. ocrmypdf) and load the result"
    if pages:
        return f"{where}: no text on these pages; choose other --pages ({describe_pages(labels)})"
    return f"{where}: no extractable text on any page; pass a PDF with a text layer"
