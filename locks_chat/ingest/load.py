"""``load_document``: one entry point for every supported format.

The format is decided by content first (``%PDF-`` header, an EPUB's zip ``mimetype``
entry), then by suffix (``.md``/``.markdown`` is Markdown); anything else that decodes as
text is plain text. Known binary formats (images, Office files, other archives) are
refused with a one-line error.
"""

from __future__ import annotations

import os
from pathlib import Path

from locks_chat.errors import DocumentError
from locks_chat.ingest.document import Document
from locks_chat.ingest.progress import ProgressCallback

_SUPPORTED = "pass a PDF, EPUB, text or Markdown file"
MARKDOWN_SUFFIXES = {".md", ".markdown", ".mdown", ".mkd"}
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
        password (str | None): PDF user or owner password; ignored for other formats.
        pages (str | None): ``--pages`` selector such as ``"40-80"`` or ``"iv-x"``
            (:mod:`locks_chat.ingest.pagerange`); ``None`` for the whole document.
        progress (ProgressCallback | None): called with (pages done, pages total) while a
            PDF is read; see :func:`locks_chat.ingest.progress.rich_progress`.
        page_time_limit (float | None): seconds one PDF page may take before it is
            skipped with a warning; ``None`` for no limit.

    Raises:
        DocumentError: missing, unreadable or unsupported file.
        EncryptedError: password needed or wrong, or DRM.
        NoTextError: nothing to read (scanned PDF, empty file or selection).
        PageRangeError: ``pages`` is malformed, empty or out of range.
    """
    source = str(path)
    data = _read_bytes(Path(path), source)
    kind = sniff_format(data, source)
    if kind == "pdf":
        from locks_chat.ingest.pdf import read_pdf

        return read_pdf(
            data, source, password=password, pages=pages, progress=progress, page_time_limit=page_time_limit
        )
    if kind == "epub":
        from locks_chat.ingest.epub import read_epub

        return read_epub(data, source, pages=pages)
    from locks_chat.ingest.text import read_text

    return read_text(data, source, markdown=kind == "markdown", pages=pages)


def sniff_format(data: bytes, source: str) -> str:
    """``"pdf"``, ``"epub"``, ``"markdown"`` or ``"text"`` from content, then suffix.

    Raises:
        DocumentError: a known binary format, or a ``.pdf``/``.epub`` whose content is not one.
    """
    suffix = Path(source).suffix.lower()
    if b"%PDF-" in data[:1024]:
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


def _read_bytes(path: Path, source: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DocumentError(f"{source}: no such file; check the path") from None
    except IsADirectoryError:
        raise DocumentError(f"{source}: is a directory; pass a file") from None
    except PermissionError:
        raise DocumentError(f"{source}: permission denied; check the file's permissions") from None
    except OSError as exc:
        raise DocumentError(f"{source}: cannot read ({exc.strerror}); check the file") from None
