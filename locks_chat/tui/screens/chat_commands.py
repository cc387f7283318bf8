"""Slash commands carried out on the chat screen (parsing and help text: ``locks_chat.tui.commands``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from locks_chat.errors import LocksChatError
from locks_chat.tui.commands import Command
from locks_chat.tui.stats_table import stats_markdown
from locks_chat.tui.widgets.conversation_view import ConversationView

if TYPE_CHECKING:
    from locks_chat.tui.screens.chat import ChatScreen


class ChatCommands:
    """What each command does to one chat screen.

    Raises (from :meth:`run`):
        LocksChatError: the command cannot run now, or a setting LOCKS refuses; the screen notifies it.
    """

    def __init__(self, screen: "ChatScreen") -> None:
        self.screen = screen
        self.chat = screen.chat

    async def run(self, command: Command) -> None:
        """Carry out ``command`` (see :data:`locks_chat.tui.commands.HELP`)."""
        screen = self.screen
        if command.name in ("budget", "rank", "dense"):
            self.restart_with(command)
        elif command.name == "pages":
            if screen.doc_loading.is_set():
                raise LocksChatError("the document is still loading; try again when it is loaded")
            screen.load(command.value)
        elif command.name == "stats":
            await screen.query_one(ConversationView).add_note(stats_markdown(self.chat.turns))
        elif command.name == "export":
            if self.chat.session is None:
                raise LocksChatError("no session yet: wait for the document to load")
            if not self.chat.turns:
                raise LocksChatError("nothing to export yet: ask a question first")
            screen.notify(f"Transcript saved to {self.chat.export()}", title="Exported", timeout=10)
        elif command.name == "help":
            screen.action_help()
        elif command.name == "quit":
            screen.app.exit()

    def restart_with(self, command: Command) -> None:
        """``/budget``, ``/rank``, ``/dense``: restart the engine with the new LOCKS configuration (vLLM reads
        ``additional_config`` only at engine start); the settings file is updated once it is up."""
        if self.screen.engine_starting.is_set():
            raise LocksChatError("the engine is starting; change settings when it is ready")
        current = self.chat.settings
        value = not current.dense if command.name == "dense" and command.value is None else command.value
        settings = current.with_overrides(**{command.name: value})
        what = {
            "budget": f"budget {settings.budget} tokens",
            "rank": f"rank {settings.rank}",
            "dense": "dense attention" if settings.dense else "LOCKS sparse attention",
        }[command.name]
        self.screen.notify(f"{what}: restarting the engine, as vLLM reads these settings only when it starts")
        self.screen.start_engine(settings, f"Restarting the engine with {what}")
