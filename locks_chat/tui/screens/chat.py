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

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Input

from locks_chat.errors import LocksChatError
from locks_chat.ingest import Document
from locks_chat.tui.book_chat import BookChat
from locks_chat.tui.commands import is_command, parse_command
from locks_chat.tui.mailbox import DRAIN_PERIOD_S, Mailbox
from locks_chat.tui.screens.chat_answering import PROMPT_PLACEHOLDER, ChatAnswering
from locks_chat.tui.screens.chat_commands import ChatCommands
from locks_chat.tui.screens.chat_loading import ChatLoading
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


class ChatScreen(ChatLoading, ChatAnswering, Screen):
    """Chat with one book: loading and the engine start in :class:`ChatLoading`, answers in
    :class:`ChatAnswering`."""

    BINDINGS = [
        Binding("escape", "stop", "Stop answer", priority=True),
        Binding("ctrl+c", "stop(True)", "Stop answer", show=False, priority=True),
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
        """what the answer's worker left for the screen (text, step readings, ticks)"""
        self.queued: str | None = None
        """a question or command entered while an answer streamed, sent when it ends (one at a time)"""
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

    def action_stop(self, ctrl_c: bool = False) -> None:
        """Esc / Ctrl+C: stop the answer in flight (the engine aborts the request); otherwise Ctrl+C copies the
        prompt's selection, or, with none, says that Ctrl+Q quits (Textual's own Ctrl+C hint, which this binding
        shadows)."""
        if self.cancel is not None:
            self.cancel.set()
            self.panels.progress.begin("answer", "Stopping the answer")
        elif self.query_one(PromptInput).selected_text:
            self.query_one(PromptInput).action_copy()
        elif ctrl_c:
            self.app.action_help_quit()

    def action_token(self, direction: int) -> None:
        """Alt+Left / Alt+Right: the pages read at the previous / next token of the answer (the newest: live)."""
        self.query_one(PageHeatMap).step(direction)

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen())
