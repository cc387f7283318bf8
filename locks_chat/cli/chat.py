"""The ``chat`` command's body (``locks-chat book.pdf``): settings, the app, the engine's log (kept apart from
the Typer wiring)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from locks_chat.errors import DocumentError, LocksChatError, TerminatedError
from locks_chat.signals import TERMINATED_EXIT_CODE

#: Exit code after a SIGHUP (128 + signal number, as shells report it).
HUNG_UP_EXIT_CODE = 128 + signal.SIGHUP


def terminal_attached() -> bool:
    """Whether stdin and stdout are a terminal (the app draws on one and reads keys from it)."""
    return sys.stdin is not None and sys.stdout is not None and sys.stdin.isatty() and sys.stdout.isatty()


def run_chat(
    doc: Path, pages: str | None, password: str | None, model: str | None, budget: int | None, rank: int | None,
    dense: bool | None, max_tokens: int | None, context: int | None, new: bool, kv_cache_gib: float | None = None,
    sampling: dict | None = None, tail: str | None = None,
) -> None:
    """Open the TUI on ``doc``; options given override the settings file for this run (``sampling``: the
    sampling options given, ``locks_chat.sampling.SAMPLING_KEYS``; ``tail``: ``--tail``).

    Raises:
        LocksChatError: no terminal, a document or ``--pages`` selection that cannot be read
            (``check_document``), a setting LOCKS refuses, a ``--model`` that cannot be found, a ``--context``
            past the model's (``open_tokenizer``) or an unwritable data directory (before the screen opens).
    """
    from locks_chat.engine_client import open_tokenizer, writable_engine_log
    from locks_chat.ingest.load import check_document
    from locks_chat.paths import path_problem
    from locks_chat.settings import load_settings
    from locks_chat.tui.app import build_app
    from locks_chat.tui.book_chat import ChatOptions
    from locks_chat.tui.terminal import engine_output_to

    if (problem := path_problem(doc)) is not None:
        raise DocumentError(f"{doc}: cannot read ({problem}); check the path")
    if doc.is_dir():
        raise DocumentError(f"{doc}: is a directory; pass a file")
    if str(doc) == "-":
        raise DocumentError("-: the chat app does not read standard input; save it to a file, or ask about it with "
                            "locks-chat ask - \"question\"")
    if doc.exists() and not doc.is_file():
        raise DocumentError(f"{doc}: not a regular file (a device or a pipe), which the chat app cannot read again; "
                            "save it to a file, or use locks-chat ask")
    if not doc.is_file():
        raise DocumentError(f"{doc}: no such file; check the path")
    settings, warnings = load_settings()
    # the settings carry their LocksConfig, built with them: a value LOCKS refuses is said here
    settings = settings.with_overrides(
        model=model, budget=budget, rank=rank, dense=dense, tail=tail, max_tokens=max_tokens, context=context,
        kv_cache_gib=kv_cache_gib, **(sampling or {}),
    )
    check_document(doc, password=password, pages=pages)
    # a model that is not there, or a context past the model's, is refused here in one line, as ask does, not
    # after the screen opened and the engine started (the built-in model not yet converted waits for the app)
    try:
        open_tokenizer(settings.model, settings.context, convert=False)
    except LocksChatError as err:
        raise _from_the_settings_file(err, settings, model, context) from None
    if not terminal_attached():
        raise LocksChatError(
            "the chat app needs a terminal (stdin and stdout); in scripts use: locks-chat ask FILE \"question\""
        )
    options = ChatOptions(settings=settings, pages=pages, password=password, new_session=new)
    with engine_output_to(writable_engine_log()):
        app = build_app(doc, options, warnings=tuple(warnings))
        app.run()
    if app.fatal_error:
        raise DocumentError(app.fatal_error)
    if app.return_code in (TERMINATED_EXIT_CODE, HUNG_UP_EXIT_CODE):  # SIGTERM, or SIGHUP: the terminal closed
        saved = ": the conversation is saved" if app.chat.turns else " (no question asked: nothing to save)"
        what = "hung up" if app.return_code == HUNG_UP_EXIT_CODE else "terminated"
        raise TerminatedError(what + saved, exit_code=app.return_code)
    if app.return_code:
        raise LocksChatError(f"the app stopped with an error (exit code {app.return_code})")


def _from_the_settings_file(err: LocksChatError, settings, model: str | None, context: int | None) -> LocksChatError:
    """``err`` (a refused model or context) saying which of its values came from the settings file rather than the
    command line, and where that file is, so the user fixes the file, not the command; ``err`` when none did."""
    from locks_chat.paths import settings_path

    from_file = [f"{key} = {value!r}" for key, value, given in (("model", settings.model, model),
                                                                ("context", settings.context, context))
                 if value is not None and given is None]
    if not from_file:
        return err
    flags = " or ".join(f"--{key.split(' ')[0]}" for key in from_file)
    return type(err)(f"{err.message} ({', '.join(from_file)} comes from the settings file {settings_path()}; fix "
                     f"or remove it there, or pass {flags})")
