"""The chat screen's answers: the answer worker, the stream drained from its mailbox into the turn and the panels,
the end of an answer and the question queued meanwhile (mixed into :class:`~locks_chat.tui.screens.chat.ChatScreen`)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from textual import work
from textual.markup import escape

from locks_chat.errors import Cancelled, LocksChatError
from locks_chat.reading import StepReading
from locks_chat.transcript import stopped_text, turn_stats_text
from locks_chat.tui.background import Abandoned, abandonable
from locks_chat.tui.mailbox import Mailbox
from locks_chat.tui.meter import EngineTick
from locks_chat.tui.screens.chat_loading import error_notice
from locks_chat.tui.widgets.conversation_view import ConversationView
from locks_chat.tui.widgets.prompt_input import PromptInput

if TYPE_CHECKING:
    from locks_chat.tui.screens.chat import ChatScreen

#: The prompt's placeholder, and what it says while an answer streams (what is typed then is kept; Enter queues it).
PROMPT_PLACEHOLDER = "Ask about the book, or /help"
ANSWERING_PLACEHOLDER = "Answering (Esc stops it); type your next question: Enter queues it until this one ends"


class ChatAnswering:
    """Asking a question in a thread worker, showing its answer as it streams, and what follows its end."""

    async def ask(self, question: str) -> None:
        """Send a question to the engine; until the answer ends, what is typed stays in the prompt and Enter
        queues it (:meth:`ChatScreen.submitted`)."""
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
            self.post_message(self.Answered(question, "failed", error_notice(err)))

    @staticmethod
    def _wait_while(busy: threading.Event, cancel: threading.Event) -> None:
        while busy.is_set():
            if cancel.wait(0.1):
                raise Cancelled("cancelled before the engine was ready")

    def _request_drain(self) -> None:
        if self.mailbox.pending() and not self._drain_posted:
            self._drain_posted = True
            self.post_message(self.Drain())

    async def on_chat_screen_drain(self, message: ChatScreen.Drain) -> None:
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

    async def on_chat_screen_answered(self, message: ChatScreen.Answered) -> None:
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
