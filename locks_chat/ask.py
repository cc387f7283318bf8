"""One question about one document: context accounting, streaming, citations and statistics."""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from locks_chat.citations import CitationCheck, check_citations
from locks_chat.engine_client import ChatEngine, engine_failure, engine_log_offset
from locks_chat.errors import Cancelled, ContextError, TerminatedError
from locks_chat.ingest import Document
from locks_chat.loop_guard import FINISH_REASON, STOPPED_TEXT, AnswerGuard
from locks_chat.prompt import Prompt, build_prompt
from locks_chat.reading import ReadingLog, StepReading
from locks_chat.signals import Terminated, hold_further_interrupts
from locks_engine.sampling import GREEDY, Sampling


@dataclass
class AskResult:
    answer: str
    citations: list[dict[str, object]]
    """the cited pages, checked against the text (:attr:`CitationCheck.citations`)"""
    prompt_tokens: int
    generated_tokens: int
    ttft_ms: float | None
    tpot_ms: float | None
    finish_reason: str | None
    reading: ReadingLog = field(default_factory=ReadingLog)
    check: CitationCheck = field(default_factory=CitationCheck)
    """the citation check: the proposed page of an answer that cites none, and the check as one line"""
    cached_tokens: int | None = None
    """prompt tokens served from the engine's prefix cache (not prefilled again); ``None``: not reported"""
    dtype: str | None = None
    """the dtype the model ran in (the engine's choice on the CPU: float32 where the CPU has no native bf16)"""
    sampling: Sampling = GREEDY
    """how the answer's tokens were drawn"""
    stopped: str | None = None
    """why the app stopped the answer before the engine ended it (``the answer repeated itself``: the loop guard,
    :mod:`locks_chat.loop_guard`; :attr:`answer` then ends after the loop's first occurrence), else ``None``"""

    def to_json(self, document: Document) -> dict[str, Any]:
        return {
            "answer": self.answer,
            "citations": self.citations,
            "proposed_page": self.check.proposed,
            "citation_check": self.check.text,
            "supported": self.check.supported,
            "stopped": self.stopped,
            "warnings": list(document.warnings),
            "document": {"source": document.source, "title": document.title, "pages": len(document.pages),
                         "page_kind": document.page_kind.description},
            "stats": {
                "prompt_tokens": self.prompt_tokens,
                "cached_prompt_tokens": self.cached_tokens,
                "generated_tokens": self.generated_tokens,
                "ttft_ms": self.ttft_ms,
                "tpot_ms": self.tpot_ms,
                "finish_reason": self.finish_reason,
                "dtype": self.dtype,
                "sampling": self.sampling.to_json(),
                **self.reading.summary(),
            },
        }


def _range(pages) -> str:
    """A ``--pages`` value for ``pages``: ``12`` for one page, else a range of printed labels; physical numbers
    (``#3-9``, ``#3``) when a label has a hyphen."""
    first, last = pages[0], pages[-1]
    physical = "-" in first.label or "-" in last.label
    if len(pages) == 1:
        return f"#{first.number}" if physical else first.label
    return f"#{first.number}-{last.number}" if physical else f"{first.label}-{last.label}"


def _fitting_pages(pages) -> str:
    """``--pages with about 40 pages (e.g. --pages 1-40)``, ``... about 1 page (e.g. --pages 1)``."""
    count = f"{len(pages)} page{'' if len(pages) == 1 else 's'}"
    return f"--pages with about {count} (e.g. --pages {_range(pages)})"


def check_fits(prompt: Prompt, document: Document, max_context: int, max_tokens: int) -> None:
    """Refuse a prompt that does not leave ``max_tokens`` of room in the context; never truncate.

    Raises:
        ContextError: with the numbers and the ways out, counted from each page's tokens: ``--pages`` with the
            first pages that fit, or with shorter pages when the first does not; a smaller ``--max-tokens`` or a
            shorter question when not even the shortest page fits beside them; a larger ``--context`` or
            ``--model``.
    """
    need = len(prompt.token_ids) + max_tokens
    if need <= max_context:
        return
    overhead = len(prompt.token_ids) - prompt.document_tokens
    room = max_context - max_tokens - overhead
    sizes = prompt.page_tokens
    fit = sum(1 for total in itertools.accumulate(sizes) if total <= room)
    shortest = min(range(len(sizes)), key=sizes.__getitem__) if sizes else None
    ways = []
    if fit:
        ways.append(f"pass {_fitting_pages(prompt.pages[:fit])}")
    elif shortest is not None and 0 < sizes[shortest] <= room:
        ways.append(f"pass --pages with shorter pages than the first (p. {prompt.pages[shortest].label} holds "
                    f"{sizes[shortest]:,} tokens; {room:,} fit beside the prompt and the answer)")
    else:
        # not even the shortest page fits beside the prompt and the room for the answer: which to cut
        whole = max_context - overhead - prompt.document_tokens  # room for the answer beside every page
        most = max_context - overhead - (sizes[shortest] if sizes else 0)  # beside the shortest page alone
        if whole >= 16 and max_tokens > whole:
            ways.append(f"pass a smaller --max-tokens (at most {whole:,} leaves room for every page)")
        elif most >= 16 and max_tokens > most:
            ways.append(f"pass a smaller --max-tokens and --pages with fewer pages (at most {most:,} tokens of "
                        f"answer leave room for the shortest page, p. {prompt.pages[shortest].label})")
        if overhead > max_context // 2:
            ways.append("ask a shorter question")
    fixes = "; " + " or ".join(ways) + ", or use" if ways else ": not one page fits; use"
    raise ContextError(
        f"{document.source}: {prompt.document_tokens:,} document tokens + {overhead:,} prompt tokens + {max_tokens:,} "
        f"for the answer do not fit the {max_context:,}-token context{fixes} a larger --context or a "
        "larger-context --model"
    )


#: characters a token stands for, at most, in the prefix test of :func:`refuse_from_a_prefix` (natural text
#: averages 3-5 with the models' tokenizers; the margin keeps the test from ever deciding for a document that fits)
MAX_CHARS_PER_TOKEN = 32


def refuse_from_a_prefix(tokenizer: Any, document: Document, max_context: int, max_tokens: int) -> None:
    """Refuse a document far too long for the context by tokenizing a prefix of its text, not all of it.

    Counting a whole 300 MB text exactly holds its tokens and their offsets in memory (tens of GB) for minutes;
    when the text has more than ``max_context * MAX_CHARS_PER_TOKEN`` characters, its first that many characters
    are tokenized, and if they alone hold more than ``max_context - max_tokens`` tokens the document cannot fit.
    The message gives the whole document's tokens as an estimate from that prefix (labelled so) and a
    ``--pages`` range of the prefix's pages that fits. Shorter or unusually dense texts return, for the exact
    count of :func:`check_fits`.

    Raises:
        ContextError: the prefix alone does not fit.
    """
    limit = max_context * MAX_CHARS_PER_TOKEN
    pages = [page for page in document.pages if page.text]
    total = sum(len(page.text) for page in pages)
    if total <= limit:
        return
    prefix, chars = [], 0
    for page in pages:
        prefix.append(page)
        chars += len(page.text) + 2
        if chars >= limit:
            break
    text = "\n\n".join(page.text for page in prefix)[:limit]
    tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    room = max_context - max_tokens
    if tokens <= room:
        return
    per_page = tokens / len(text) * sum(len(page.text) for page in prefix) / len(prefix)  # tokens, estimated
    fit = int(room * 0.9 // per_page)
    ways = f"; pass {_fitting_pages(pages[:fit])} or use" if fit else \
        ": not one page fits; use"
    raise ContextError(
        f"{document.source}: about {int(total * tokens / len(text)):,} document tokens (estimated from its first "
        f"{len(text):,} of {total:,} characters, which alone hold {tokens:,}) do not fit the {max_context:,}-token "
        f"context{ways} a larger --context or a larger-context --model"
    )


def fitting_prompt(
    engine: Any, document: Document, questions: list[str], answers: list[str] = (), max_tokens: int = 256
) -> Prompt:
    """The prompt for ``questions`` (and earlier ``answers``), refused when it leaves no ``max_tokens`` of room.

    Args:
        engine: a :class:`ChatEngine`, or a :class:`locks_chat.engine_client.ModelTokenizer` to check before the engine
            starts (same tokenizer, same template: the same count).
    Raises:
        ContextError: see :func:`check_fits` and :func:`refuse_from_a_prefix` (a text far too long, refused
            from a prefix without tokenizing all of it).
    """
    refuse_from_a_prefix(engine.tokenizer, document, engine.max_context, max_tokens)
    prompt = build_prompt(engine.tokenizer, document, questions, list(answers))
    check_fits(prompt, document, engine.max_context, max_tokens)
    return prompt


def whole_words(answer: str, finish_reason: str | None) -> str:
    """``answer`` as the citation check reads it: without its last word when ``max_tokens`` cut the answer
    (finish reason ``length``), where it may stop mid-word (``VICKSB``), a word no page holds, which made a supported
    answer "Not supported by the document"; ``answer`` itself when nothing else is left."""
    if finish_reason != "length":
        return answer
    cut = re.sub(r"[^\W\d_]+$", "", answer)  # letters only: a cut "(p. 12" keeps its page
    return cut if cut.strip() else answer


def ask(
    engine: ChatEngine,
    document: Document,
    questions: list[str],
    answers: list[str] = (),
    max_tokens: int = 256,
    on_text: Callable[[str], None] | None = None,
    on_step: Callable[[StepReading], None] | None = None,
    cancel: threading.Event | None = None,
    sampling: Sampling = GREEDY,
    stopping: Callable[[], bool] | None = None,
) -> AskResult:
    """Answer ``questions[-1]`` about ``document`` (earlier turns: ``questions[:-1]`` with ``answers``).

    The answer's words are watched by a :class:`~locks_chat.loop_guard.AnswerGuard` as they stream: when it
    starts repeating itself, ``cancel`` is set (a new event when ``None``), so the engine aborts the
    request as it does for Esc and Ctrl+C, and the result says so (:attr:`AskResult.stopped`, finish reason
    ``repetition``), its answer kept through the loop's first occurrence (``on_text`` has had the repeats).

    Args:
        sampling (Sampling): how the engine draws tokens (``locks_engine.sampling``); default greedy.
        stopping (Callable[[], bool] | None): asked when the engine fails: whether a stop the user asked for is
            under way (Esc, SIGTERM, SIGHUP); then the failure is that stop's doing (the signal reached vLLM's
            engine core, in the same process group, and may end it before the app stops the request) and
            :class:`Cancelled` is raised instead. ``None``: the failure is raised as it is.
    Raises:
        ContextError: the prompt does not fit. Cancelled: ``cancel`` was set or Ctrl+C (the request is aborted
        in the engine), or the engine failed while ``stopping()``. TerminatedError: SIGTERM
        (``locks_chat.signals``; the request is aborted too).
        EngineError: vLLM's engine core failed during the request (``locks_chat.engine_client.engine_failure``:
        the root cause from the engine log).
    """
    prompt = fitting_prompt(engine, document, questions, answers, max_tokens)
    log_start = engine_log_offset()
    cancel = cancel if cancel is not None else threading.Event()
    parts: list[str] = []
    guard = AnswerGuard()
    log = ReadingLog()
    first_s = last_s = None
    generated, reason, cached = 0, None, None
    events = engine.stream(prompt.token_ids, max_tokens, cancel, sampling=sampling)
    try:
        for event in events:
            for record in event.stats:
                reading = log.add(record, prompt)
                if reading is not None and on_step is not None:
                    on_step(reading)
            if event.num_tokens > generated:
                first_s = event.elapsed_s if first_s is None else first_s
                last_s, generated = event.elapsed_s, event.num_tokens
            if event.text:
                parts.append(event.text)
                if on_text is not None:
                    on_text(event.text)
                if guard.loop is None and guard.feed(event.text) is not None:
                    cancel.set()  # the engine aborts the request before its next step
            reason = event.finish_reason or reason
            hit = getattr(event, "cached_tokens", None)  # engines that do not report it leave None
            cached = cached if hit is None else hit
    except Terminated as err:
        hold_further_interrupts()  # the stop is under way: a second signal must not cut it short
        raise TerminatedError(f"{err.word}: the request was aborted", err.exit_code) from err
    except KeyboardInterrupt as err:
        hold_further_interrupts()
        raise Cancelled("interrupted: the request was aborted") from err
    except Exception as err:
        failure = engine_failure(err, log_start)
        if failure is not None:
            if guard.loop is None and stopping is not None and stopping():
                raise Cancelled("cancelled: the request was aborted") from err
            raise failure from err
        if type(err).__name__ != "GenerationCancelled":
            raise
        if guard.loop is None:
            raise Cancelled("cancelled: the request was aborted") from err
    finally:
        # a failure here, not in the engine (stdout's pipe closed under ``on_text``), leaves the stream
        # suspended: closing it aborts the request now, while the engine is still open
        close = getattr(events, "close", None)
        if close is not None:
            close()
    answer, stopped = "".join(parts), None
    if guard.loop is not None:
        answer, reason, stopped = guard.kept(), FINISH_REASON, STOPPED_TEXT
    tpot = (last_s - first_s) * 1000 / (generated - 1) if generated > 1 else None
    check = check_citations(whole_words(answer, reason), document, questions[-1])
    return AskResult(
        answer, check.citations, len(prompt.token_ids), generated,
        first_s * 1000 if first_s is not None else None, tpot, reason, log, check, cached,
        getattr(engine, "dtype", None), sampling, stopped,
    )
