"""The text of a PDF's selected pages, each under a time limit, a repeated page object read once
(``locks_chat.ingest.pdf``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from locks_chat.errors import exception_reason
from locks_chat.ingest.document import RawPage
from locks_chat.ingest.normalize import normalize_text
from locks_chat.ingest.pdf_labels import page_name, pages_name
from locks_chat.ingest.pdf_problems import PdfProblems
from locks_chat.ingest.progress import ProgressCallback
from locks_chat.ingest.timelimit import TimeLimitExceeded, call_with_time_limit


def extract_pages(
    reader,
    reopen: Callable[[], object],
    selected: Sequence[int],
    labels: Sequence[str],
    progress: ProgressCallback | None,
    page_time_limit: float | None,
    problems: PdfProblems,
) -> tuple[list[RawPage], list[str]]:
    """The ``selected`` pages (0-based indices) read in order, and the warnings about those skipped, repeated or
    without a text layer; ``reopen`` gives a fresh reader after a page runs past ``page_time_limit`` (seconds)."""
    raw_pages: list[RawPage] = []
    no_layer: list[int] = []
    skipped: list[str] = []
    repeated: list[int] = []
    objects: set[tuple[int, int]] = set()
    if progress is not None:
        progress(0, len(selected))
    for done, index in enumerate(selected, start=1):
        key = _page_object(reader, index)
        if key is not None and key in objects:
            repeated.append(index)
            text, has_images = "", False
        else:
            objects.add(key)
            with problems.reading(index):
                reader, text, has_images = _read_page_limited(reader, reopen, index, labels, page_time_limit, skipped)
        if not text and has_images:
            no_layer.append(index)
        raw_pages.append(RawPage(index + 1, labels[index], text))
        if progress is not None:
            progress(done, len(selected))
    warnings = skipped
    if repeated:
        warnings.append(f"{pages_name(repeated, labels)}: the page object of an earlier page again (a damaged page "
                        "tree), skipped")
    if no_layer:
        warnings.append(f"{pages_name(no_layer, labels)}: no text layer, OCR needed")
    return raw_pages, warnings


def _read_page_limited(reader, reopen, index: int, labels: Sequence[str], page_time_limit: float | None,
                       skipped: list[str]):
    """:func:`_read_page` under the time limit: (the reader to go on with, text, has images); a page that fails or
    runs past the limit is empty, with a line in ``skipped``."""
    name = page_name(index, labels)
    try:
        return reader, *call_with_time_limit(partial(_read_page, reader, index), page_time_limit)
    except TimeLimitExceeded:
        skipped.append(f"{name}: text extraction took over {page_time_limit:g} s, skipped")
        # an abandoned extraction may still be running on the old reader
        return reopen(), "", False
    except Exception as exc:
        skipped.append(f"{name}: text extraction failed ({exception_reason(exc)}), skipped")
        return reader, "", False


def _page_object(reader, index: int) -> tuple[int, int] | None:
    """(object number, generation) of a page; ``None`` for a page written inline in its tree. A page tree that
    lists one page object many times (``/Kids [4 0 R 4 0 R]`` at each of 16 levels: 65,536 pages from 2 KB) has it
    read once, so reading time follows the file's size."""
    try:
        ref = reader.pages[index].indirect_reference
    except Exception:
        return None
    return None if ref is None else (ref.idnum, ref.generation)


def _read_page(reader, index: int) -> tuple[str, bool]:
    """Normalized text of a page, and whether it has images (asked only when it has no text)."""
    page = reader.pages[index]
    text = normalize_text(page.extract_text() or "", collapse_spaces=True)
    if text:
        return text, False
    try:
        return "", len(page.images) > 0
    except Exception:
        return "", True

