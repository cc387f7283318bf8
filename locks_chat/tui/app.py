"""The app and the factory that builds it, used alike by the CLI and the tests."""

from __future__ import annotations

from pathlib import Path

from textual.app import App

from locks_chat.sessions import SessionStore
from locks_chat.tui.book_chat import BookChat, ChatOptions, EngineFactory, TokenizerFactory
from locks_chat.tui.screens.chat import ChatScreen


class LocksChatApp(App):
    """Chat with a book; the engine is closed when the app exits."""

    TITLE = "locks-chat"

    def __init__(self, chat: BookChat, warnings: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.chat = chat
        self.warnings = warnings

    def on_mount(self) -> None:
        self.push_screen(ChatScreen(self.chat))
        for warning in self.warnings:
            self.notify(warning, severity="warning")

    def on_unmount(self) -> None:
        self.chat.close()


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
            :func:`locks_chat.engine.open_engine` (vLLM with LOCKS). Tests pass a scripted engine.
        store (SessionStore | None): the sessions database; default the one in the user data directory.
        warnings (tuple[str, ...]): shown as notifications when the app starts (e.g. settings file problems).
        tokenizer_factory (TokenizerFactory | None): ``(model, max_model_len) -> ModelTokenizer | None``, to tell
            that a book does not fit before the engine is up; default :func:`locks_chat.engine.open_tokenizer`
            with the default engine, none with a scripted one.
    """
    chat = BookChat(document_path, options or ChatOptions(), engine_factory, store, tokenizer_factory)
    return LocksChatApp(chat, warnings)
