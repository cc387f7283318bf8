"""``load_document``: one entry point for every supported format.

The format is decided by content first (``%PDF-`` header, an EPUB's zip ``mimetype``
entry), then by suffix (``.md``/``.markdown`` is Markdown); anything else that decodes as
text is plain text. Known binary formats (images, Office files, other archives) are
refused with a one-line error.

Reading is bounded (``locks_chat.ingest.limits``): the file is read in chunks of ``READ_CHUNK_BYTES``, so a
Ctrl+C or SIGTERM lands between two reads, and an input larger than ``MAX_DOCUMENT_BYTES``
(``/dev/zero``, ``/dev/urandom``, a disk image) is refused instead of filling memory. Pipes
(``/dev/stdin``, a FIFO) are read like files.
"""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO, NoReturn

from locks_chat.errors import DocumentError
from locks_chat.ingest import limits
from locks_chat.ingest.document import Document
from locks_chat.ingest.limits import format_bytes
from locks_chat.ingest.progress import ProgressCallback

_SUPPORTED = "pass a PDF, EPUB, text or Markdown file"
MARKDOWN_SUFFIXES = {".md", ".markdown", ".mdown", ".mkd"}
#: suffixes of plain text: a ``%PDF-`` inside such a file is quoted text unless the file starts with it
TEXT_SUFFIXES = {".txt", ".text"}
_BINARY_MAGIC = {
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"GIF8": "a GIF image",
    b"II*\x00": "a TIFF image",
    b"MM\x00*": "a TIFF image",
    b"\xd0\xcf\x11\xe0": "an old Office document",
    b"\x1f\x8b": "a gzip archive",
    b"7z\xbc\xaf": "a 7-Zip archive",
    b"Rar!": "a RAR archive",
    b"AT&TFORM": "a DjVu document",
}


def load_document(
    path: str | os.PathLike,
    password: str | None = None,
    pages: str | None = None,
    progress: ProgressCallback | None = None,
    page_time_limit: float | None = 10.0,
) -> Document:
    """Load a PDF, EPUB, Markdown or plain text file as pages of normalized text.

    Args:
        path (str | os.PathLike): the file.
        password (str | None): PDF user or owner password; given for a file that is not an encrypted
            PDF, it is ignored with a warning in :attr:`Document.warnings`.
        pages (str | None): ``--pages`` selector such as ``"40-80"`` or ``"iv-x"``
            (:mod:`locks_chat.ingest.pagerange`); ``None`` for the whole document.
        progress (ProgressCallback | None): called with (pages done, pages total) while a
            PDF is read; see :func:`locks_chat.ingest.progress.rich_progress`.
        page_time_limit (float | None): seconds one PDF page or EPUB chapter may take before it is
            skipped with a warning; ``None`` for no limit.

    Raises:
        DocumentError: missing, unreadable or unsupported file, or larger than ``limits.MAX_DOCUMENT_BYTES``.
        EncryptedError: password needed or wrong, or DRM.
        NoTextError: nothing to read (scanned PDF, empty file or selection).
        PageRangeError: ``pages`` is malformed, empty or out of range.
    """
    source = str(path)
    return _load_bytes(_read_bytes(Path(path), source), source, password, pages, progress, page_time_limit)


def load_document_bytes(
    data: bytes,
    source: str,
    password: str | None = None,
    pages: str | None = None,
    progress: ProgressCallback | None = None,
    page_time_limit: float | None = 10.0,
    markdown: bool = False,
) -> Document:
    """:func:`load_document` for bytes already read (standard input): the format from the content, as for a file.

    Args:
        data (bytes): the document's bytes (at most ``limits.MAX_DOCUMENT_BYTES``: :func:`read_bounded`).
        source (str): what messages call the document, e.g. ``"<stdin>"``; its suffix counts as a file's does.
        markdown (bool): read text that is no PDF or EPUB as Markdown (its title from a ``# `` heading).
        password, pages, progress, page_time_limit: as :func:`load_document`.
    Raises:
        as :func:`load_document`.
    """
    return _load_bytes(data, source, password, pages, progress, page_time_limit, markdown)


def _load_bytes(
    data: bytes, source: str, password: str | None, pages: str | None, progress: ProgressCallback | None,
    page_time_limit: float | None, markdown: bool = False,
) -> Document:
    """``load_document`` once the file's bytes are read."""
    kind = sniff_format(data, source)
    if kind == "text" and markdown:
        kind = "markdown"
    if kind == "pdf":
        from locks_chat.ingest.pdf import read_pdf

        return read_pdf(
            data, source, password=password, pages=pages, progress=progress, page_time_limit=page_time_limit
        )
    if kind == "epub":
        from locks_chat.ingest.epub import read_epub

        document = read_epub(data, source, pages=pages, page_time_limit=page_time_limit)
    else:
        from locks_chat.ingest.text import read_text

        document = read_text(data, source, markdown=kind == "markdown", pages=pages)
    if password is not None:
        document = replace(document, warnings=(*document.warnings, limits.unused_password_warning(source)))
    return document


def check_document(path: str | os.PathLike, password: str | None = None, pages: str | None = None) -> None:
    """What ``load_document`` would refuse, found before the chat app opens (and before an engine starts):
    an unsupported, unreadable or oversized file, an encrypted PDF without the right password, a PDF without
    pages, and a ``pages`` selector the document does not have. A PDF is opened, not extracted (a page without
    a text layer is found when the app reads it); other formats are read whole (under a second for a
    4 MB book).

    Raises:
        DocumentError, EncryptedError, NoTextError, PageRangeError: as ``load_document``.
    """
    source = str(path)
    data = _read_bytes(Path(path), source)
    if sniff_format(data, source) != "pdf":
        _load_bytes(data, source, password, pages, None, None)
        return
    from locks_chat.ingest.pdf import check_pdf

    check_pdf(data, source, password=password, pages=pages)


def sniff_format(data: bytes, source: str) -> str:
    """``"pdf"``, ``"epub"``, ``"markdown"`` or ``"text"`` from content, then suffix.

    Raises:
        DocumentError: a known binary format, or a ``.pdf``/``.epub`` whose content is not one.
    """
    suffix = Path(source).suffix.lower()
    # PDF readers accept a header within the first KiB (junk before it); a text file may quote one
    header = data.find(b"%PDF-", 0, 1024)
    if header == 0 or (header > 0 and (suffix == ".pdf" or (
            suffix not in MARKDOWN_SUFFIXES | TEXT_SUFFIXES and data[header - 1:header] in (b"\n", b"\r")))):
        return "pdf"
    if data.startswith(b"PK\x03\x04"):
        if b"mimetypeapplication/epub+zip" in data[:128] or suffix == ".epub":
            return "epub"
        raise DocumentError(f"{source}: a zip archive (Office document?), not a supported format; {_SUPPORTED}")
    if suffix == ".pdf":
        raise DocumentError(f"{source}: not a PDF (no %PDF- header); check the file, it may be a saved web page")
    if suffix == ".epub":
        raise DocumentError(f"{source}: not an EPUB (not a zip archive); check the file")
    for magic, what in _BINARY_MAGIC.items():
        if data.startswith(magic):
            raise DocumentError(f"{source}: {what}, not a supported format; {_SUPPORTED}")
    return "markdown" if suffix in MARKDOWN_SUFFIXES else "text"


def read_document_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of the file :func:`load_document` would read, with its errors (for a caller that also hashes them).

    Raises:
        DocumentError: missing, a directory, not permitted, unreadable, or larger than ``limits.MAX_DOCUMENT_BYTES``.
    """
    return _read_bytes(Path(path), str(path))


def _read_bytes(path: Path, source: str) -> bytes:
    try:
        with open(path, "rb", buffering=0) as file:
            return read_bounded(file, source)
    except FileNotFoundError:
        raise DocumentError(f"{source}: no such file; check the path") from None
    except IsADirectoryError:
        raise DocumentError(f"{source}: is a directory; pass a file") from None
    except PermissionError:
        raise DocumentError(f"{source}: permission denied; check the file's permissions") from None
    except OSError as exc:
        raise DocumentError(f"{source}: cannot read ({exc.strerror}); check the file") from None


def read_bounded(file: BinaryIO, source: str, limit: int | None = None) -> bytes:
    """All bytes of an open binary file, pipe or device, read in chunks of ``limits.READ_CHUNK_BYTES``.

    Args:
        file (BinaryIO): open for reading bytes, e.g. ``open(path, "rb", buffering=0)``; ``read(n)`` gives
            at most ``n`` bytes, ``b""`` at the end.
        source (str): the file name, for messages.
        limit (int | None): the most bytes accepted (bytes); ``None`` for ``limits.MAX_DOCUMENT_BYTES``.

    Raises:
        DocumentError: more than ``limit`` bytes (an endless device such as ``/dev/zero`` stops at ``limit + 1``).
        OSError: the read itself failed.
    """
    limit = limits.MAX_DOCUMENT_BYTES if limit is None else limit
    try:
        info = os.fstat(file.fileno())
    except (AttributeError, OSError, ValueError):
        info = None
    if info is not None and stat.S_ISREG(info.st_mode) and info.st_size > limit:
        _too_large(source, limit)
    chunks: list[bytes] = []
    total = 0
    while chunk := file.read(min(limits.READ_CHUNK_BYTES, limit + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            _too_large(source, limit)
    return b"".join(chunks)


def _too_large(source: str, limit: int) -> NoReturn:
    raise DocumentError(f"{source}: larger than {format_bytes(limit)}: not a document locks-chat reads; {_SUPPORTED}")
