"""The ``ask`` command's body: load, check the fit, start the engine, stream, report (kept apart from the Typer
wiring)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from locks_chat.cli.followup import FollowUp
from locks_chat.errors import Cancelled, LocksChatError, is_text
from locks_chat.signals import hold_further_interrupts, release_held_interrupts
from locks_engine.config import LocksConfig

if TYPE_CHECKING:
    from locks_chat.ask import AskResult
    from locks_chat.cli.followup import DocumentInput
    from locks_chat.conversation import Conversation
    from locks_chat.ingest import Document


@dataclass(frozen=True)
class AskOptions:
    """What ``locks-chat ask`` was given."""

    doc: Path
    """the document; ``-``: standard input"""
    question: str
    locks: LocksConfig
    """``--budget``, ``--rank``, ``--dense``, ``--tail``, built and validated once by the command line"""
    pages: str | None = None
    """``--pages``; ``None``: the continued session's range, else every page"""
    password: str | None = None
    model: str | None = None
    """``--model``; ``None``: the built-in model"""
    max_tokens: int = 256
    context: int | None = None
    """``--context`` in tokens; ``None``: the model's"""
    kv_cache_gib: float | None = None
    json_out: bool = False
    """``--json``: one JSON object instead of the streamed answer and its footer"""
    follow: FollowUp = field(default_factory=FollowUp)
    """``--continue`` or ``--session N``"""
    sampling: dict[str, Any] = field(default_factory=dict)
    """``--temperature``, ``--top-p``, ``--top-k``, ``--repetition-penalty``, ``--seed`` given (the rest: the
    model's, ``locks_chat.sampling.answer_sampling``)"""


def sampling_given(**values: Any) -> dict[str, Any]:
    """The sampling options that were given (not ``None``)."""
    return {key: value for key, value in values.items() if value is not None}


def stdout_open() -> bool:
    """Whether the answer can be written to stdout (``locks_chat.cli.exits.stdout_writable``: ``>&-`` closes it,
    ``1<file`` opens it for reading only; vLLM's processes would inherit it so too)."""
    from locks_chat.cli.exits import stdout_writable

    return stdout_writable()


def write_out(text: str) -> None:
    """Write streamed answer text to stdout at once (raises BrokenPipeError when its reader went away)."""
    sys.stdout.write(text)
    sys.stdout.flush()


def run_ask(options: AskOptions, console: Console) -> None:
    """Run ``locks-chat ask``; raises :class:`LocksChatError` subclasses for everything a user can fix.

    ``doc`` ``-`` reads standard input; ``follow`` continues a saved session (``locks_chat.cli.followup``), and
    the question and answer are saved as a turn of it (or of a new session).
    """
    from locks_chat.cli.followup import open_conversation, read_input
    from locks_chat.sessions import SessionStore

    question = options.question
    if not question.strip():
        raise LocksChatError("the question is empty: ask something, e.g. \"Who is the narrator?\"")
    if not is_text(question):
        raise LocksChatError("the question is not UTF-8 text (the terminal sent other bytes); set a UTF-8 locale "
                             "(LANG=C.UTF-8) and ask again")
    if not stdout_open():
        raise LocksChatError("stdout is closed or open for reading only: the answer has nowhere to go; redirect it "
                             "(> answer.txt) instead")
    source = read_input(options.doc)
    store = SessionStore()
    # a first ask that fails leaves no empty sessions database behind
    with store.removed_unless_used():
        _answer(options, console, source, open_conversation(source, options.follow, options.pages, store))


def _answer(options: AskOptions, console: Console, source: DocumentInput, conversation: Conversation) -> None:
    """:func:`run_ask` once the document is read and its conversation found: load, check the fit, start the
    engine, stream the answer (saved as a turn of ``conversation``), report."""
    from locks_chat.attention import Attention
    from locks_chat.engine_client import open_engine, open_tokenizer
    from locks_chat.ingest import rich_progress
    from locks_chat.sampling import answer_sampling

    question, max_tokens = options.question, options.max_tokens
    with rich_progress(f"Reading {Path(source.source).name}", console=console) as progress:
        document = source.load(options.password, conversation.pages, progress=progress)
    for warning in document.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    # the engine's own check (in ask) stays the authoritative one; this one spares a start that cannot help
    with console.status("Counting the document's tokens..."):
        counted = open_tokenizer(options.model, options.context)
        if counted is not None:
            conversation.fit(counted, document, question, max_tokens)
    with console.status("Starting the engine (vLLM + LOCKS)..."):
        engine = open_engine(options.model, options.locks, options.context, options.kv_cache_gib)
    streamed: list[str] = []

    def stream(text: str) -> None:
        streamed.append(text)
        write_out(text)

    try:
        sampling = answer_sampling(engine, options.sampling)
        result = conversation.answer(engine, document, question, max_tokens, Attention.of(options.locks),
                                     None if options.json_out else stream, sampling=sampling)
        # the answer is complete and saved as done: a Ctrl+C or SIGTERM from now on (while the engine shuts
        # down) must not report it as interrupted, so it is dropped; the answer is written before the shutdown
        hold_further_interrupts()
        _report(options, console, result, document, conversation)
    except Cancelled:
        # the error line goes below the partial answer, not after its last word
        if streamed and not "".join(streamed).endswith("\n"):
            print(flush=True)
        raise
    finally:
        try:
            engine.close()
        finally:
            release_held_interrupts()  # held since the answer ended, or since a Ctrl+C or SIGTERM began the stop


def _report(options: AskOptions, console: Console, result: AskResult, document: Document,
            conversation: Conversation) -> None:
    """Write the answer's end: with ``--json`` its one JSON object on stdout, else the newline after the streamed
    answer, the citation check and the statistics footer on stderr."""
    from locks_chat.citations import UNSUPPORTED_TEXT, report_check
    from locks_chat.cli.followup import cache_note, conversation_json, session_note
    from locks_chat.reading import most_read_text, tail_text
    from locks_chat.sampling import sampling_text

    if options.json_out:
        print(json.dumps({**result.to_json(document), "session": conversation_json(conversation)}, indent=2),
              flush=True)
        return
    print()
    if result.check.supported is False:
        print(UNSUPPORTED_TEXT, flush=True)  # on stdout, with the answer: a reader of the answer alone sees it
    report_check(console, result.check)
    summary = result.reading.summary()
    steps = summary["decode_steps"]
    if steps:
        per_token = summary["kv_bytes_read"] / steps / 1e6, summary["kv_bytes_dense"] / steps / 1e6
        tail = tail_text(summary)
        read = (f"read {summary['kv_pages_read_fraction']:.0%} of KV pages{' exactly' if tail else ''} "
                f"({per_token[0]:.1f} of {per_token[1]:.1f} MB per token){f' · {tail}' if tail else ''}")
    else:
        read = "no decode step"  # the one token came from the prefill
    tpot = f"{result.tpot_ms:.0f} ms" if result.tpot_ms is not None else "-"  # one token has no TPOT
    pages_read = most_read_text(summary)
    tokens = f"{result.generated_tokens} token{'' if result.generated_tokens == 1 else 's'}"
    console.print(
        f"[dim]{tokens} · prompt {result.prompt_tokens:,} tokens{cache_note(result)} · TTFT "
        f"{(result.ttft_ms or 0) / 1000:.1f} s · TPOT {tpot}{f' ({result.dtype})' if result.dtype else ''} · {read} · most-read document pages: {pages_read}"
        f" · {sampling_text(result.sampling.to_json())}{session_note(conversation)}[/]",
        highlight=False, soft_wrap=True,
    )
    if result.stopped:
        console.print(f"[yellow]stopped:[/] {result.stopped}", highlight=False)
    elif result.finish_reason == "length":
        console.print(f"[yellow]note:[/] the answer stopped at --max-tokens {options.max_tokens}", highlight=False)
