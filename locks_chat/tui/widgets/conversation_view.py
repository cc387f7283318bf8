"""The scrolling conversation: turns and notes (help, statistics, command results)."""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widgets import Markdown

from locks_chat.sessions import Turn
from locks_chat.transcript import stopped_text, turn_stats_text
from locks_chat.tui.widgets.turn_view import TurnView


class ConversationView(VerticalScroll):
    """Turns in order, kept scrolled to the end while an answer streams."""

    DEFAULT_CSS = """
    ConversationView { height: 1fr; padding: 0 1; }
    ConversationView > .note { margin: 0 0 1 0; padding: 0 1; border-left: thick $secondary; background: $boost; }
    """

    async def add_turn(self, question: str, answer: str = "") -> TurnView:
        """Append a turn (empty answer: one about to stream) and scroll to it."""
        turn = TurnView(question, answer)
        await self.mount(turn)
        self.scroll_end(animate=False)
        return turn

    async def show_turns(self, turns: list[Turn]) -> None:
        """Append saved turns (a resumed session), each with its footer."""
        for turn in turns:
            view = await self.add_turn(turn.question, turn.answer)
            await view.finish(turn.status, turn.citations, turn_stats_text(turn.stats),
                              turn.stats.get("citation_check", ""), stopped_text(turn.stats),
                              supported=turn.stats.get("supported"))

    async def add_note(self, markdown: str) -> None:
        """Append a note in Markdown (not part of the conversation the model sees)."""
        await self.mount(Markdown(markdown, classes="note"))
        self.scroll_end(animate=False)

    def follow(self) -> None:
        """Keep the end in view (called as an answer grows)."""
        self.scroll_end(animate=False)
