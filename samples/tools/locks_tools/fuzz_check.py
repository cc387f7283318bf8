"""What fuzzing ``load_document`` checks on every input, and the input kinds it draws from.

The property: an input either loads, giving a consistent :class:`~locks_chat.ingest.Document` (each page's text
at its offsets in the full text, page text normalized, title, labels and warnings on one line without control
characters), or raises a :class:`~locks_chat.errors.LocksChatError` whose message is one line without control
characters; in both cases within the per-page time limit of ``load_document`` (:func:`page_time_limit`) of CPU
time and with a peak memory growth under :data:`MEMORY_CAP_BYTES`. The time is the process's CPU time, not the
wall clock: other jobs on a busy machine stretch the wall clock of the same work, and a check that depends on them
fails one run and passes the next (a hang is the test's wall-clock watchdog's to catch). Any other exception, a multi-line or control-character
message, a broken document, a slower load or a larger growth is a problem (:attr:`Outcome.problems`).
"""

from __future__ import annotations

import inspect
import re
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st

from locks_tools import fuzz_docs, fuzz_mutate, fuzz_pdf

MEMORY_CAP_BYTES = 1 << 30
"""largest peak RSS growth one fuzzed input may cause (bytes): 1 GiB; inputs are at most a few MB packed"""
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_PAGE_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
PAGES = st.none() | st.sampled_from(["1", "2-3", "ii", "i-ii", "#1", "A-3", "99", "-", ",", "x-", "#2-", "1,1"])
"""the ``pages`` selectors fuzzed inputs are loaded with (mostly none)"""


def page_time_limit() -> float:
    """``load_document``'s default per-page time limit (seconds)."""
    from locks_chat.ingest import load_document

    return inspect.signature(load_document).parameters["page_time_limit"].default


def input_kinds() -> dict[str, st.SearchStrategy[tuple[bytes, str]]]:
    """Strategy of each fuzzed input kind, drawing (file content, file name)."""
    as_pdf = lambda data: (data, "doc.pdf")  # noqa: E731
    as_epub = lambda data: (data, "book.epub")  # noqa: E731
    return {
        "pdf-mutated": fuzz_mutate.mutated(fuzz_mutate.pdf_seeds()).map(as_pdf),
        "pdf-hostile": fuzz_pdf.hostile_pdfs().map(as_pdf),
        "pdf-header-random": fuzz_pdf.header_then_random().map(as_pdf),
        "epub-hostile": fuzz_docs.epub_files().map(as_epub),
        "epub-mutated": fuzz_mutate.mutated_members(fuzz_docs.epub_seeds()).map(as_epub),
        "other-header-random": fuzz_docs.header_then_random(),
        "text-markdown": fuzz_docs.text_files(),
    }


@dataclass
class Outcome:
    """How one fuzzed input was handled by ``load_document``."""

    status: str
    """``"loaded"``, ``"error"`` (a one-line ``LocksChatError``) or ``"bug"`` (anything else)"""
    error: str | None
    """the exception's class name; ``None`` when loaded"""
    message: str
    """the exception's message, or the document's format and page count"""
    seconds: float
    """wall-clock time of ``load_document`` (s)"""
    rss_growth: int | None
    """peak resident memory during the load minus the memory before it (bytes); ``None`` where Linux's
    ``/proc/self/clear_refs`` cannot reset the peak"""
    cpu_seconds: float = 0.0
    """CPU time of this process during ``load_document`` (s), what the time limit is checked on"""
    problems: list[str] = field(default_factory=list)
    """the property violations (module docstring); empty when the input was handled as it should be"""


def load_outcome(path: Path, pages: str | None) -> Outcome:
    """Load ``path`` with ``load_document(path, pages=pages)`` and check the property (module docstring)."""
    from locks_chat.errors import LocksChatError
    from locks_chat.ingest import load_document

    before = _reset_peak_rss()
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        document = load_document(path, pages=pages)
    except LocksChatError as exc:
        outcome = Outcome("error", type(exc).__name__, str(exc), time.perf_counter() - start, None)
        outcome.problems += _line_problems("message", str(exc))
    except Exception as exc:  # the bug being looked for
        outcome = Outcome("bug", type(exc).__name__, str(exc), time.perf_counter() - start, None)
        outcome.problems.append(f"{type(exc).__name__}: {str(exc)[:200]} at {_where(exc)}")
    else:
        outcome = Outcome("loaded", None, f"{document.format}, {len(document.pages)} pages",
                          time.perf_counter() - start, None)
        outcome.problems += document_problems(document)
    outcome.cpu_seconds = time.process_time() - cpu_start
    outcome.rss_growth = None if before is None else max(0, _peak_rss() - before)
    if outcome.cpu_seconds > page_time_limit():
        outcome.problems.append(f"took {outcome.cpu_seconds:.1f} s of CPU time ({outcome.seconds:.1f} s wall clock), "
                                f"over the per-page limit of {page_time_limit()} s")
    if outcome.rss_growth is not None and outcome.rss_growth > MEMORY_CAP_BYTES:
        outcome.problems.append(f"peak memory grew {outcome.rss_growth >> 20} MiB, over the cap")
    return outcome


def document_problems(document) -> list[str]:
    """What is wrong with a loaded document (module docstring); empty when nothing is."""
    problems = []
    if not document.text or document.page_count < len(document.pages):
        problems.append(f"empty text or page count {document.page_count} < {len(document.pages)} pages")
    for page in document.pages:
        if document.text[page.start : page.end] != page.text:
            problems.append(f"page {page.number}: text not at its offsets {page.start}-{page.end}")
        if _PAGE_CONTROL.search(page.text):
            problems.append(f"page {page.number}: control character in normalized text")
        problems += _line_problems(f"page {page.number} label", page.label)
    problems += _line_problems("title", document.title)
    for warning in document.warnings:
        problems += _line_problems("warning", warning)
    return problems


def _line_problems(what: str, text: str) -> list[str]:
    if _CONTROL.search(text):
        return [f"{what} is not one line without control characters: {text[:200]!r}"]
    return []


def _where(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of the traceback."""
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{Path(frame.filename).name}:{frame.lineno}"


def _reset_peak_rss() -> int | None:
    """Reset the process's peak RSS to its current RSS (Linux); return that RSS (bytes), else ``None``."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    return _status_kib("VmRSS") * 1024


def _peak_rss() -> int:
    return _status_kib("VmHWM") * 1024


def _status_kib(key: str) -> int:
    match = re.search(rf"^{key}:\s+(\d+)", Path("/proc/self/status").read_text(), re.M)
    return int(match.group(1)) if match else 0
