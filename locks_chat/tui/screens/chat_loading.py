"""The chat screen's loading of the book and starting of the engine: their workers and the handlers of their
messages (mixed into :class:`~locks_chat.tui.screens.chat.ChatScreen`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import work
from textual.markup import escape
from textual.message import Message

from locks_chat.errors import ContextError, DocumentError, LocksChatError, PageRangeError, exception_reason
from locks_chat.settings import Settings
from locks_chat.tui.background import Abandoned, abandonable
from locks_chat.tui.widgets.conversation_view import ConversationView
from locks_chat.tui.widgets.prompt_input import PromptInput

if TYPE_CHECKING:
    from locks_chat.tui.screens.chat import ChatScreen


class ChatLoading:
    """Loading the book and (re)starting the engine in thread workers, and what the screen shows as they go and
    end (the Status panel says ready, or why not)."""

    def load(self, pages: str | None, first: bool = False) -> None:
        self.doc_loading.set()
        self.panels.progress.begin("load", f"Reading {self.chat.path.name}", unit="pages")
        self._load(pages, first)

    @work(thread=True, exclusive=True, group="load")
    def _load(self, pages: str | None, first: bool) -> None:
        try:
            if first:
                self.post_message(self.Resumed(self.chat.open_session()))
                pages = self.chat.pages
            progress = lambda done, total: self.post_message(self.LoadProgress(done, total))  # noqa: E731
            document = self.chat.load(pages, progress)
            message: Message = self.Loaded(document, abandonable(self._fit_error))
        except Abandoned:
            return
        except Exception as err:  # noqa: BLE001 - shown to the user, the app goes on
            # the whole document unreadable when the app opens: nothing to chat about (a selection can be fixed)
            fatal = first and pages is None and isinstance(err, DocumentError)
            message = self.Failed("load", error_notice(err), fatal=fatal)
        self.doc_loading.clear()
        self.post_message(message)

    def _fit_error(self) -> str:
        """Why the loaded document cannot fit, or ``""``: the load stands whatever this early count meets (the
        answer's own count reports any other failure)."""
        try:
            self.chat.check_fits()
        except ContextError as err:
            return error_notice(err)
        except Exception:  # noqa: BLE001
            pass
        return ""

    def start_engine(self, settings: Settings, note: str | None) -> None:
        """(Re)start the engine in a worker with ``settings`` (their ``LocksConfig`` built with them)."""
        self.engine_starting.set()
        expected = self.chat.timings.engine_start_s
        self.panels.progress.begin("engine", note or "Starting the engine (vLLM + LOCKS)", expected_s=expected)
        self._start_engine(settings, note is not None)

    @work(thread=True, exclusive=True, group="engine")
    def _start_engine(self, settings: Settings, persist: bool) -> None:
        try:
            seconds = abandonable(self.chat.start_engine, settings)
            if persist:
                self.chat.persist(budget=settings.budget, rank=settings.rank, dense=settings.dense)
            message: Message = self.EngineReady(settings.locks, seconds)
        except Abandoned:
            return
        except Exception as err:  # noqa: BLE001
            message = self.Failed("engine", error_notice(err))
        self.engine_starting.clear()
        self.post_message(message)

    async def on_chat_screen_resumed(self, message: ChatScreen.Resumed) -> None:
        await self.query_one(ConversationView).show_turns(message.turns)
        self.query_one(PromptInput).set_history([t.question for t in message.turns])
        if message.turns:
            self.notify(f"Resumed this book's conversation ({len(message.turns)} turns)")

    def on_chat_screen_load_progress(self, message: ChatScreen.LoadProgress) -> None:
        self.panels.progress.advance("load", message.done, message.total)

    def on_chat_screen_loaded(self, message: ChatScreen.Loaded) -> None:
        self.panels.progress.end("load")
        self.failures.pop("load", None)
        if message.fit_error:
            self.notify(message.fit_error, severity="error", timeout=15)
        document = message.document
        self.panels.set_document(document)
        pages = f", pages {self.chat.pages}" if self.chat.pages else ""
        count = len(document.pages)
        self.app.sub_title = f"{self.chat.path.name}{pages} ({count} page{'' if count == 1 else 's'})"
        for warning in document.warnings[:3]:
            self.notify(warning, severity="warning")
        self._ready_or_waiting()

    def on_chat_screen_engine_ready(self, message: ChatScreen.EngineReady) -> None:
        self.panels.progress.end("engine")
        self.failures.pop("engine", None)
        self.notify(f"Engine ready in {message.seconds:.0f} s: {self.chat.mode()}")
        self.panels.set_locks(message.locks, getattr(self.chat.engine, "max_context", None))
        self._ready_or_waiting()

    def on_chat_screen_failed(self, message: ChatScreen.Failed) -> None:
        if message.fatal:
            self.app.fatal_error = message.message
            self.app.exit(return_code=DocumentError.exit_code)
            return
        self.panels.progress.end(message.phase)
        self.failures[message.phase] = message.message
        self.notify(message.message, severity="error", timeout=15)
        self._ready_or_waiting()

    def _ready_or_waiting(self) -> None:
        progress = self.panels.progress
        if self.doc_loading.is_set() or self.engine_starting.is_set() or self.answering:
            return
        if self.chat.engine is not None and self.chat.document is not None:
            progress.finish(f"Ready: {self.chat.model_name()}\n{self.chat.mode()}")
        else:
            # the notification goes after 15 s; the reason stays here until the phase succeeds
            reasons = "\n".join(escape(reason) for reason in self.failures.values()) or "see the error above"
            progress.finish(f"Not ready: {reasons}")


def error_notice(err: BaseException) -> str:
    """One line for a notification: a user-fixable error's own message (``--pages`` advice said as the
    ``/pages`` command), else the exception squeezed."""
    if isinstance(err, (ContextError, PageRangeError)):
        return err.message.replace("--pages", "/pages")
    return err.message if isinstance(err, LocksChatError) else f"{type(err).__name__}: {exception_reason(err)}"
