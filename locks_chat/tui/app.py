"""The app and the factory that builds it, used alike by the CLI and the tests."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

from textual.app import App

from locks_chat.sessions import SessionStore
from locks_chat.signals import note_sigterm
from locks_chat.tui.book_chat import BookChat, ChatOptions, EngineFactory, TokenizerFactory
from locks_chat.tui.screens.chat import ChatScreen


#: seconds the warnings given at the start (the settings file's) stay on screen
WARNING_SECONDS = 30


class LocksChatApp(App):
    """Chat with a book; the engine is closed when the app exits (Ctrl+Q, ``/quit`` or SIGTERM)."""

    TITLE = "locks-chat"

    def __init__(self, chat: BookChat, warnings: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.chat = chat
        self.warnings = warnings
        self._previous_sigterm = None
        self.fatal_error: str | None = None
        """set when the document cannot be read at all: the app quits, and the command prints this line"""

    def on_mount(self) -> None:
        self._watch_sigterm()
        self.push_screen(ChatScreen(self.chat))
        for warning in self.warnings:  # shown while the engine starts: long enough to be read
            self.notify(warning, title="settings", severity="warning", timeout=WARNING_SECONDS)

    def on_unmount(self) -> None:
        self.chat.close()
        self._unwatch_sigterm()

    def _watch_sigterm(self) -> None:
        """SIGTERM quits as Ctrl+Q does (the answer in flight stopped and saved, the engine shut down, the
        terminal restored), with exit code 143; SIGHUP (the terminal closed) likewise, with 129, unless it is
        ignored (``nohup``). Handled on the event loop, not by raising in its thread: a SIGHUP raised there left
        the app running, engine and all, after its terminal was gone.

        The signal's Python handler (asyncio's is a no-op: the loop learns of the signal from its wakeup fd) records
        the stop at once (:func:`~locks_chat.signals.note_sigterm`): the engine core, in the same process group, gets
        the signal too and may die before the loop runs :meth:`_terminate`; the answer's worker, seeing the engine
        fail, finds the stop recorded and saves the turn as cancelled (``BookChat.answer``)."""
        self._previous_sigterm = {}
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGHUP):
            previous = signal.getsignal(signum)
            if signum == signal.SIGHUP and previous == signal.SIG_IGN:
                continue
            try:
                loop.add_signal_handler(signum, self._terminate, signum)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no Unix signals
                break
            self._previous_sigterm[signum] = previous
            signal.signal(signum, note_sigterm)
            signal.siginterrupt(signum, False)  # as asyncio's own handler left it

    def _unwatch_sigterm(self) -> None:
        for signum, previous in (self._previous_sigterm or {}).items():
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().remove_signal_handler(signum)
                signal.signal(signum, previous)

    def _terminate(self, signum: int = signal.SIGTERM) -> None:
        note_sigterm()
        self.exit(return_code=128 + signum)


def build_app(
    document_path: str | Path,
    options: ChatOptions | None = None,
    engine_factory: EngineFactory | None = None,
    store: SessionStore | None = None,
    warnings: tuple[str, ...] = (),
    tokenizer_factory: TokenizerFactory | None = None,
) -> LocksChatApp:
    """Build the app for one document.

    Args:
        document_path (str | Path): the book (PDF, EPUB, Markdown or text); read in a worker once the app runs.
        options (ChatOptions | None): settings after command-line overrides, ``--pages``, ``--password``.
        engine_factory (EngineFactory | None): ``(model, locks_config, max_model_len) -> ChatEngine``; default
            :func:`locks_chat.engine_client.open_engine` (vLLM with LOCKS). Tests pass a scripted engine.
        store (SessionStore | None): the sessions database; default the one in the user data directory.
        warnings (tuple[str, ...]): shown as notifications when the app starts (e.g. settings file problems).
        tokenizer_factory (TokenizerFactory | None): ``(model, max_model_len) -> ModelTokenizer | None``, to tell
            that a book does not fit before the engine is up; default :func:`locks_chat.engine_client.open_tokenizer`
            with the default engine, none with a scripted one.
    """
    chat = BookChat(document_path, options or ChatOptions(), engine_factory, store, tokenizer_factory)
    return LocksChatApp(chat, warnings)
