"""EPUB through ebooklib, XHTML to text through inscriptis.

An EPUB has no fixed pages: a cited page is one spine item (a chapter or section file) that
has text, in reading order, labelled "1", "2", ... (:attr:`PageKind.CHAPTER`); spine items
without text (a cover image, an empty title page) and the navigation document (the EPUB 3 table of
contents, which some books put in the spine) are left out of the numbering. EPUBs
whose content is encrypted (DRM) are refused; font obfuscation is not DRM and is accepted. An
archive whose files add up to more than :data:`~locks_chat.ingest.limits.MAX_DOCUMENT_BYTES` once
unpacked, or with a file over :data:`RATIO_FLOOR_BYTES` that unpacks to more than :data:`MAX_RATIO`
times its packed size (a zip bomb: a 40 KB file holding 8 MB of XHTML, whose text extraction takes
12 MB of memory and half a second per MB), is refused before anything is decompressed. Each chapter's
text is extracted under the per-page time limit (:mod:`.timelimit`); one that runs past it is skipped
with a warning.
"""

from __future__ import annotations

import io
import re
import warnings as py_warnings
import zipfile
from functools import partial
from pathlib import Path

from locks_chat.errors import DocumentError, EncryptedError, NoTextError, exception_reason
from locks_chat.ingest import limits
from locks_chat.ingest.document import Document, PageKind, RawPage, build_document
from locks_chat.ingest.encoding import decode_text
from locks_chat.ingest.normalize import normalize_text, one_line
from locks_chat.ingest.pagerange import parse_page_range
from locks_chat.ingest.timelimit import TimeLimitExceeded, call_with_time_limit

_FONT_OBFUSCATION = ("http://www.idpf.org/2008/embedding", "http://ns.adobe.com/pdf/enc#RC")
_XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>")
MAX_RATIO = 100
"""largest unpacked / packed size of one archive member (text compresses 3-10x, deflate at most ~1000x)"""
RATIO_FLOOR_BYTES = 1 << 20
"""members that unpack to at most this many bytes (1 MiB) are not checked for :data:`MAX_RATIO`"""


def read_epub(
    data: bytes, source: str, *, pages: str | None = None, page_time_limit: float | None = 10.0
) -> Document:
    """Extract the text of an EPUB's chapters.

    Args:
        data (bytes): the EPUB file's content (a zip archive).
        source (str): the file name, for messages.
        pages (str | None): a ``--pages`` selector over chapters (:mod:`.pagerange`).
        page_time_limit (float | None): seconds one chapter's text extraction may take; ``None`` for no limit.

    Raises:
        EncryptedError: the content is DRM-encrypted.
        DocumentError: not a readable EPUB, larger than ``MAX_DOCUMENT_BYTES`` unpacked, or a zip bomb.
        NoTextError: no chapter has text.
        PageRangeError: ``pages`` is malformed or out of range.
    """
    _refuse_drm(data, source)
    from ebooklib import epub

    try:
        with py_warnings.catch_warnings():
            py_warnings.simplefilter("ignore")
            book = epub.read_epub(io.BytesIO(data), options={"ignore_ncx": True})
    except Exception as exc:
        # the library's own errors say what is wrong; anything else is its code tripping over a damaged file
        reason = exception_reason(exc) if type(exc).__module__.startswith("ebooklib") else _damaged(exc)
        raise DocumentError(f"{source}: not a readable EPUB ({reason}); pass another file") from exc
    warnings: list[str] = []
    spine = (_item_text(book, idref, source, warnings, page_time_limit) for idref, _ in book.spine)
    texts = [text for text in spine if text]
    if not texts:
        raise NoTextError(f"{source}: the EPUB has no text in its chapters; pass another file")
    labels = [str(i + 1) for i in range(len(texts))]
    raw = [RawPage(i + 1, labels[i], texts[i]) for i in parse_page_range(pages, labels)]
    titles = book.get_metadata("DC", "title")
    title = (one_line(str(titles[0][0])) if titles else "") or one_line(Path(source).stem)
    return build_document(source, "epub", PageKind.CHAPTER, title, raw, len(texts), warnings)


def _item_text(book, idref: str, source: str, warnings: list[str], page_time_limit: float | None) -> str:
    from ebooklib import epub

    item = book.get_item_with_id(idref)
    if item is None:
        warnings.append(f"spine item {idref!r} is missing from the EPUB, skipped")
        return ""
    if isinstance(item, epub.EpubNav):
        return ""
    content, name = item.get_content(), one_line(item.get_name())
    try:
        html = content.decode("utf-8")
    except UnicodeDecodeError:
        html, _ = decode_text(content, f"{source}:{name}")
        warnings.append(f"{name}: not UTF-8, decoded by guessing")
    html = _XML_DECLARATION.sub("", html)
    try:
        return call_with_time_limit(partial(_html_text, html), page_time_limit)
    except TimeLimitExceeded:
        warnings.append(f"{name}: text extraction took over {page_time_limit:g} s, skipped")
        return ""
    except Exception as exc:
        warnings.append(f"{name}: unreadable XHTML ({exception_reason(exc)}), skipped")
        return ""


def _html_text(html: str) -> str:
    from inscriptis import get_text

    return normalize_text(get_text(html) if html.strip() else "", collapse_spaces=True)


def _refuse_drm(data: bytes, source: str) -> None:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
            if unpacked > limits.MAX_DOCUMENT_BYTES:
                limit = limits.format_bytes(limits.MAX_DOCUMENT_BYTES)
                raise DocumentError(
                    f"{source}: unpacks to more than {limit}: not an EPUB locks-chat reads (a zip bomb?); "
                    "pass another file"
                )
            for info in archive.infolist():
                if info.file_size > max(RATIO_FLOOR_BYTES, MAX_RATIO * info.compress_size):
                    raise DocumentError(
                        f"{source}: {one_line(info.filename)} unpacks to {info.file_size:,} bytes from "
                        f"{info.compress_size:,} (a zip bomb?): not an EPUB locks-chat reads; pass another file"
                    )
            if "META-INF/encryption.xml" not in archive.namelist():
                return
            manifest = archive.read("META-INF/encryption.xml").decode("utf-8", errors="replace")
    except zipfile.BadZipFile as exc:
        raise DocumentError(f"{source}: not a readable EPUB (damaged zip archive); pass another file") from exc
    algorithms = set(re.findall(r'EncryptionMethod[^>]*Algorithm="([^"]+)"', manifest))
    if algorithms - set(_FONT_OBFUSCATION):
        raise EncryptedError(f"{source}: DRM-protected EPUB, its text cannot be read; pass a DRM-free copy")


def _damaged(exc: BaseException) -> str:
    """A reason for a library failure that is no message of its own (``'NoneType' object has no attribute``)."""
    if isinstance(exc, (KeyError, FileNotFoundError)):
        return f"a file it lists is missing: {exception_reason(exc, 100)}"
    if isinstance(exc, (AttributeError, TypeError, ValueError, IndexError)):
        return "its package or table of contents is damaged"
    return exception_reason(exc)
