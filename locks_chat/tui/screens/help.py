"""``/help`` and F1: the commands and keys, over the chat."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from locks_chat.tui.commands import HELP


class HelpScreen(ModalScreen[None]):
    """The help text; Esc, q or F1 close it."""

    BINDINGS = [Binding("escape,q,f1", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90; max-width: 95%; height: auto; max-height: 90%;
                                  border: round $accent; background: $panel; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown(HELP)
