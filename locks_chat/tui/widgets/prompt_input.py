"""The prompt: an ``Input`` that recalls earlier prompts with Up and Down, like a shell."""

from __future__ import annotations

from textual.binding import Binding
from textual.widgets import Input


class PromptInput(Input):
    """One-line prompt with history; Up goes back through earlier prompts, Down forward to the draft."""

    BINDINGS = [
        Binding("up", "history(-1)", "Earlier prompt", show=False),
        Binding("down", "history(1)", "Later prompt", show=False),
    ]

    def __init__(self, history: list[str] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.history: list[str] = list(history or [])
        self._index = len(self.history)
        self._draft = ""

    def set_history(self, history: list[str]) -> None:
        """Replace the history (a resumed session's questions), keeping the draft."""
        self.history = list(history)
        self._index = len(self.history)

    def remember(self, text: str) -> None:
        """Add a submitted prompt to the history (not twice in a row) and go back to an empty draft."""
        if text and (not self.history or self.history[-1] != text):
            self.history.append(text)
        self._index, self._draft = len(self.history), ""

    def action_history(self, direction: int) -> None:
        """Show the previous (``-1``) or next (``1``) prompt; past the newest comes the unsent draft."""
        if self._index == len(self.history):
            self._draft = self.value
        index = min(len(self.history), max(0, self._index + direction))
        if index == self._index:
            return
        self._index = index
        self.value = self.history[index] if index < len(self.history) else self._draft
        self.cursor_position = len(self.value)
