"""The chat screen: the conversation and the prompt on the left, the live LOCKS panels on the right.

Loading, engine starts and answers run in thread workers (``@work(thread=True, exclusive=True)``); they talk to
the screen only through the messages below, and an answer's stream (text, step readings, ticks) through a
:class:`~locks_chat.tui.mailbox.Mailbox` the screen drains 20 times a second. The engine start and the
tokenizer load run on daemon threads their workers only wait for (``locks_chat.tui.background``): quitting does
not wait for them. A book that cannot fit
the context is said so when it is loaded (counted with the model's tokenizer, without the engine). While an
answer streams the prompt is locked; Esc or Ctrl+C sets the answer's cancel event, which the engine checks
between steps (prefill chunks included) and aborts the request. Any failure is a notification, and the prompt
comes back.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from textual import events, on, work
from textual.app import ComposeResult
from textual.markup import escape
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Input

from locks_chat.errors import (
    Cancelled,
    ContextError,
    DocumentError,
    LocksChatError,
    PageRangeError,
    exception_reason,
)
from locks_chat.ingest import Document
from locks_chat.reading import StepReading
from locks_chat.settings import Settings
from locks_chat.transcript import stopped_text, turn_stats_text
from locks_chat.tui.background import Abandoned, abandonable
from locks_chat.tui.book_chat import BookChat
from locks_chat.tui.commands import is_command, parse_command
from locks_chat.tui.mailbox import DRAIN_PERIOD_S, Mailbox
from locks_chat.tui.meter import EngineTick
from locks_chat.tui.screens.chat_commands import ChatCommands
from locks_chat.tui.screens.help import HelpScreen
from locks_chat.tui.widgets.conversation_view import ConversationView
from locks_chat.tui.widgets.page_heatmap import PageHeatMap
from locks_chat.tui.widgets.prompt_input import PromptInput
from locks_chat.tui.widgets.reading_panels import ReadingPanels
from locks_chat.tui.widgets.turn_view import TurnView
from locks_engine.config import LocksConfig



#: The panels' width when the terminal has room, and the narrowest they are drawn at (characters).
PANELS_WIDTH, PANELS_MIN_WIDTH = 52, 30
#: Columns the conversation gets first (up to 120 columns the panels shrink), and the fewest it is left with.
CHAT_WIDTH, CHAT_MIN_WIDTH = 68, 40
#: The prompt's placeholder, and what it says while an answer streams (what is typed then is kept; Enter queues it).
PROMPT_PLACEHOLDER = "Ask about the book, or /help"
ANSWERING_PLACEHOLDER = "Answering (Esc stops it); type your next question: Enter queues it until this one ends"


class ChatScreen(Screen):
    """Chat with one book."""

    BINDINGS = [
        Binding("escape", "stop", "Stop answer", priority=True),
        Binding("ctrl+c", "stop", "Stop answer", show=False, priority=True),
        Binding("alt+left", "token(-1)", "Earlier token"),
        Binding("alt+right", "token(1)", "Later token"),
        Binding("f1", "help", "Help"),
    ]
    DEFAULT_CSS = """
    #chat-column { width: 1fr; }
    #prompt { margin: 0 1; }
    """

    @dataclass
    class Resumed(Message):
        turns: list

    @dataclass
    class LoadProgress(Message):
        done: int
        total: int

    @dataclass
    class Loaded(Message):
        document: Document
        fit_error: str = ""
        """why the document cannot fit the context, with the ``/pages`` to pick; empty: it fits or is unknown"""

    @dataclass
    class EngineReady(Message):
        locks: LocksConfig
        """the LOCKS configuration the engine runs with"""
        seconds: float

    @dataclass
    class Failed(Message):
        phase: str
        """``load`` or ``engine``"""
        message: str
        fatal: bool = False
        """the whole document cannot be read (no text layer, say): no ``/pages`` can help, so the app quits"""

    class Drain(Message):
        """The answer's mailbox has text, step readings or ticks waiting."""

    @dataclass
    class Answered(Message):
        question: str
        status: str
        """``done``, ``cancelled`` or ``failed``"""
        error: str = ""

    def __init__(self, chat: BookChat) -> None:
        super().__init__()
        self.chat = chat
        self.doc_loading = threading.Event()
        self.engine_starting = threading.Event()
        self.cancel: threading.Event | None = None
        self.turn: TurnView | None = None
        self.turns_before = 0
        self.mailbox = Mailbox()
        self.queued: str | None = None
        """a question or command entered while an answer streamed, sent when it ends (one at a time)"""
        """what the answer's worker left for the screen (text, step readings, ticks)"""
        self._drain_posted = False
        self.failures: dict[str, str] = {}
        """the last error of each phase that failed ("load", "engine"), shown in the Status panel until it succeeds"""

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            with Vertical(id="chat-column"):
                yield ConversationView(id="conversation")
                yield PromptInput(id="prompt", placeholder=PROMPT_PLACEHOLDER)
            yield ReadingPanels(id="panels")
        yield Footer()

    def on_mount(self) -> None:
        self._panels_hidden_said = False
        self.fit_panels(self.app.size.width)
        self.set_interval(DRAIN_PERIOD_S, self._request_drain)
        self.app.sub_title = self.chat.path.name
        self.panels.set_locks(self.chat.locks)
        self.query_one(PromptInput).focus()
        self.load(self.chat.options.pages, first=True)
        self.start_engine(self.chat.settings, None)

    def on_resize(self, event: events.Resize) -> None:
        self.fit_panels(event.size.width)

    def fit_panels(self, width: int) -> None:
        """Narrow terminals: the panels take what the conversation leaves over :data:`CHAT_WIDTH` columns, between
        :data:`PANELS_MIN_WIDTH` and :data:`PANELS_WIDTH`, and hide (with one notice) when the conversation would
        be left fewer than :data:`CHAT_MIN_WIDTH`."""
        panels = self.panels
        room = min(PANELS_WIDTH, max(PANELS_MIN_WIDTH, width - CHAT_WIDTH))
        shown = width - room >= CHAT_MIN_WIDTH
        if shown:
            panels.styles.width = room
        elif panels.display and not self._panels_hidden_said:
            self._panels_hidden_said = True
            self.notify(f"The LOCKS panels are hidden below {CHAT_MIN_WIDTH + PANELS_MIN_WIDTH} columns: widen the "
                        "terminal to see them", timeout=15)
        panels.display = shown

    def on_unmount(self) -> None:
        """Leaving the app mid-answer stops the answer; the worker saves it as cancelled."""
        if self.cancel is not None:
            self.cancel.set()

    @property
    def panels(self) -> ReadingPanels:
        return self.query_one(ReadingPanels)

    @property
    def answering(self) -> bool:
        return self.cancel is not None

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
            message = self.Failed("load", _message(err), fatal=fatal)
        self.doc_loading.clear()
        self.post_message(message)

    def _fit_error(self) -> str:
        """Why the loaded document cannot fit, or ``""``: the load stands whatever this early count meets (the
        answer's own count reports any other failure)."""
        try:
            self.chat.check_fits()
        except ContextError as err:
            return _message(err)
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
            message = self.Failed("engine", _message(err))
        self.engine_starting.clear()
        self.post_message(message)

    @work(thread=True, exclusive=True, group="answer")
    def _answer(self, question: str, cancel: threading.Event, mailbox: Mailbox) -> None:
        try:
            self._wait_while(self.doc_loading, cancel)
            if self.chat.document is None:
                raise LocksChatError("no document is loaded: pick pages with /pages A-B")
            if self.engine_starting.is_set():
                abandonable(self.chat.check_fits, question)
            self._wait_while(self.engine_starting, cancel)
            # one message per token would flood the screen's queue (it repaints only when that runs empty)
            self.chat.answer(question, cancel, mailbox.put, mailbox.put, mailbox.put)
            self.post_message(self.Answered(question, "done"))
        except (Cancelled, Abandoned):
            self.post_message(self.Answered(question, "cancelled"))
        except Exception as err:  # noqa: BLE001
            self.post_message(self.Answered(question, "failed", _message(err)))

    @staticmethod
    def _wait_while(busy: threading.Event, cancel: threading.Event) -> None:
        while busy.is_set():
            if cancel.wait(0.1):
                raise Cancelled("cancelled before the engine was ready")

    @on(Input.Submitted, "#prompt")
    async def submitted(self, event: Input.Submitted) -> None:
        """Enter: send the question or run the command; while an answer streams, queue it (one at a time: a
        second stays in the prompt, and says so)."""
        text = event.value.strip()
        prompt = self.query_one(PromptInput)
        if not text:
            return
        if self.answering:
            if self.queued is not None:
                self.notify(f"One question is already queued ({self.queued}); this one stays in the prompt",
                            severity="warning")
                return
            self.queued, prompt.value = text, ""
            prompt.remember(text)
            self.notify("Queued: sent when this answer ends (Esc stops the answer)")
            return
        prompt.remember(text)
        prompt.value = ""
        await self._send(text)

    async def _send(self, text: str) -> None:
        """Run ``text`` as a command, or ask it."""
        if is_command(text):
            try:
                await ChatCommands(self).run(parse_command(text))
            except LocksChatError as err:
                self.notify(err.message, severity="error")
            return
        await self.ask(text)

    async def ask(self, question: str) -> None:
        """Send a question to the engine; until the answer ends, what is typed stays in the prompt and Enter
        queues it (:meth:`submitted`)."""
        self.cancel = threading.Event()
        self.mailbox = Mailbox()
        self.turns_before = len(self.chat.turns)
        prompt = self.query_one(PromptInput)
        prompt.placeholder = ANSWERING_PLACEHOLDER
        self.turn = await self.query_one(ConversationView).add_turn(question)
        self.panels.new_answer()
        if self.doc_loading.is_set() or self.engine_starting.is_set():
            self.panels.progress.begin("answer", "Waiting for the engine; Esc cancels")
        self._answer(question, self.cancel, self.mailbox)

    def action_stop(self) -> None:
        """Esc / Ctrl+C: stop the answer in flight (the engine aborts the request); otherwise Ctrl+C copies."""
        if self.cancel is not None:
            self.cancel.set()
            self.panels.progress.begin("answer", "Stopping the answer")
        elif self.query_one(PromptInput).selected_text:
            self.query_one(PromptInput).action_copy()

    def action_token(self, direction: int) -> None:
        """Alt+Left / Alt+Right: the pages read at the previous / next token of the answer (the newest: live)."""
        self.query_one(PageHeatMap).step(direction)

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen())

    async def on_chat_screen_resumed(self, message: Resumed) -> None:
        await self.query_one(ConversationView).show_turns(message.turns)
        self.query_one(PromptInput).set_history([t.question for t in message.turns])
        if message.turns:
            self.notify(f"Resumed this book's conversation ({len(message.turns)} turns)")

    def on_chat_screen_load_progress(self, message: LoadProgress) -> None:
        self.panels.progress.advance("load", message.done, message.total)

    def on_chat_screen_loaded(self, message: Loaded) -> None:
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

    def on_chat_screen_engine_ready(self, message: EngineReady) -> None:
        self.panels.progress.end("engine")
        self.failures.pop("engine", None)
        self.notify(f"Engine ready in {message.seconds:.0f} s: {self.chat.mode()}")
        self.panels.set_locks(message.locks, getattr(self.chat.engine, "max_context", None))
        self._ready_or_waiting()

    def on_chat_screen_failed(self, message: Failed) -> None:
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

    def _request_drain(self) -> None:
        if self.mailbox.pending() and not self._drain_posted:
            self._drain_posted = True
            self.post_message(self.Drain())

    async def on_chat_screen_drain(self, message: Drain) -> None:
        self._drain_posted = False
        await self._drain()

    async def _drain(self) -> None:
        """Show what the answer's worker left: readings and ticks in order, the text in one write."""
        text = []
        for item in self.mailbox.take():
            if isinstance(item, str):
                text.append(item)
            elif isinstance(item, StepReading):
                self.panels.show_step(item)
            elif isinstance(item, EngineTick):
                self.panels.show_tick(item, self.chat.settings.max_tokens, self.chat.timings.prefill_tokens_per_s)
        if text and self.turn is not None:
            await self.turn.write("".join(text))
            self.query_one(ConversationView).follow()

    async def on_chat_screen_answered(self, message: Answered) -> None:
        await self._drain()
        saved = self.chat.turns[-1] if len(self.chat.turns) > self.turns_before else None
        citations, stats = (saved.citations, saved.stats) if saved is not None else ([], {})
        stopped = stopped_text(stats)
        if self.turn is not None:
            await self.turn.finish(message.status, citations, turn_stats_text(stats) or escape(message.error),
                                   stats.get("citation_check", ""), stopped,
                                   saved.answer if saved is not None and stopped else None,
                                   stats.get("supported"))
        self.cancel, self.turn = None, None
        self.panels.progress.end("answer")
        prompt = self.query_one(PromptInput)
        prompt.placeholder = PROMPT_PLACEHOLDER
        prompt.focus()
        if message.status == "failed":
            self.notify(message.error, severity="error", timeout=15)
            if not prompt.value:
                prompt.value = message.question
                prompt.cursor_position = len(prompt.value)
        elif message.status == "cancelled":
            self.notify("Answer stopped; the partial answer is kept, marked as cancelled")
        elif stopped:
            self.notify("Answer stopped: it repeated itself; kept up to the first repeat", severity="warning")
        notice = self.chat.take_notice()
        if notice:
            self.notify(notice, severity="warning", timeout=15)
        self._ready_or_waiting()
        await self._send_queued(message.status == "done" and not stopped)

    async def _send_queued(self, go_on: bool) -> None:
        """Send the queued question after an answer that ended well; after one stopped or failed, give it back
        in the prompt (or, when the prompt holds text, in its history) and say so."""
        queued, self.queued = self.queued, None
        if queued is None:
            return
        if go_on:
            await self._send(queued)
            return
        prompt = self.query_one(PromptInput)
        if not prompt.value:
            prompt.value, prompt.cursor_position = queued, len(queued)
            self.notify("The queued question was not sent: it is back in the prompt")
        else:
            self.notify("The queued question was not sent: it is in the prompt's history (Up)")


def _message(err: BaseException) -> str:
    """One line for a notification: a user-fixable error's own message (``--pages`` advice said as the
    ``/pages`` command), else the exception squeezed."""
    if isinstance(err, (ContextError, PageRangeError)):
        return err.message.replace("--pages", "/pages")
    return err.message if isinstance(err, LocksChatError) else f"{type(err).__name__}: {exception_reason(err)}"
