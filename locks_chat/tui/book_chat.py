"""The work behind the chat screen, without any UI: a book, its engine and its session.

Every method that blocks (loading, engine start, answering) is called from a worker thread; the screen hands
in callbacks that post messages; an engine start the app walks away from (``locks_chat.tui.background``) closes
its engine as soon as it is up, once :meth:`BookChat.close` was called. Answers go through the book's
:class:`~locks_chat.conversation.Conversation`; each turn is written to the session store when it starts, saved
as it streams and finished when it ends (``locks_chat.sessions``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from locks_chat.attention import Attention
from locks_chat.conversation import Conversation, DocumentKey
from locks_chat.errors import EngineError
from locks_chat.ingest import Document, ProgressCallback, load_document
from locks_chat.sampling import answer_sampling
from locks_chat.sessions import SessionInfo, SessionStore, SessionStoreError, Turn, file_hash
from locks_chat.settings import Settings, load_settings, save_settings
from locks_chat.signals import sigterm_received
from locks_chat.transcript import export_transcript
from locks_chat.tui.meter import EngineTick, MeteredEngine
from locks_chat.tui.timings import load_timings, save_timings
from locks_engine.builtin_models import find_builtin
from locks_engine.config import LocksConfig

EngineFactory = Callable[[str | None, Any, int | None], Any]
"""``open_engine(model, locks_config, max_model_len) -> ChatEngine``"""
TokenizerFactory = Callable[[str | None, int | None], Any]
"""``open_tokenizer(model, max_model_len) -> ModelTokenizer | None``"""

#: seconds an answer whose engine failed waits for a SIGTERM or SIGHUP to be recorded (the signal that reached the
#: engine core reached the app too; its main thread records it as soon as it runs Python again)
STOP_WAIT_S = 0.5


@dataclass(frozen=True)
class ChatOptions:
    """What the command line gives the app: settings after overrides (with their ``LocksConfig``), and the
    document's options."""

    settings: Settings = field(default_factory=Settings)
    pages: str | None = None
    """``--pages`` selection; ``None``: the pages the resumed session used, else every page"""
    password: str | None = None
    new_session: bool = False
    """start a new conversation instead of resuming the book's latest one"""


def default_engine_factory(model: str | None, locks: Any, max_model_len: int | None,
                           kv_cache_gib: float | None = None) -> Any:
    """:func:`locks_chat.engine_client.open_engine`, looked up when called (so tests can replace it)."""
    from locks_chat import engine_client

    return engine_client.open_engine(model, locks, max_model_len, kv_cache_gib)


def default_tokenizer_factory(model: str | None, max_model_len: int | None) -> Any:
    """:func:`locks_chat.engine_client.open_tokenizer`, leaving a first conversion of the built-in model to the engine
    start that runs meanwhile; ``None`` also when the model cannot be found (the engine start says why)."""
    from locks_chat import engine_client

    try:
        return engine_client.open_tokenizer(model, max_model_len, convert=False)
    except EngineError:
        return None


class BookChat:
    """One book's chat: document, engine, session and the turns so far."""

    def __init__(
        self, path: str | Path, options: ChatOptions, engine_factory: EngineFactory | None = None,
        store: SessionStore | None = None, tokenizer_factory: TokenizerFactory | None = None,
    ) -> None:
        self.path = Path(path)
        self.options = options
        self.settings = options.settings
        """the settings the engine runs with, their ``locks`` the engine's and the panels'"""
        self.engine_factory = engine_factory or default_engine_factory
        # a scripted engine brings its own tokenizer: the real model's is only asked for with the real engine
        self.tokenizer_factory = tokenizer_factory or (default_tokenizer_factory if engine_factory is None else None)
        self.store = store or SessionStore()
        self.document: Document | None = None
        self.engine: Any = None
        self.conversation = Conversation(self.store, DocumentKey(str(self.path), "", self.path.stem), None,
                                         options.pages)
        """the book's session and its turns (a session of its own once :meth:`open_session` ran)"""
        self.timings = load_timings()
        """how long the engine start and the prefill took last time, for ETAs"""
        self._engine_lock = threading.Lock()
        self._tokenizer_lock = threading.Lock()
        self._model_tokenizer: Any = None
        self._tokenizer_asked = False
        self._answering = threading.Lock()
        self._closed = False

    @property
    def locks(self) -> LocksConfig:
        """The LOCKS configuration of :attr:`settings`."""
        return self.settings.locks

    @property
    def session(self) -> SessionInfo | None:
        """The book's session (``None`` before :meth:`open_session`)."""
        return self.conversation.session

    @property
    def turns(self) -> list[Turn]:
        """The session's turns, oldest first."""
        return self.conversation.turns

    @turns.setter
    def turns(self, turns: list[Turn]) -> None:
        self.conversation.turns = turns

    @property
    def pages(self) -> str | None:
        """The document's page range (``--pages``, ``/pages``); ``None``: every page."""
        return self.conversation.pages

    @pages.setter
    def pages(self, pages: str | None) -> None:
        self.conversation.pages = pages

    def open_session(self) -> list[Turn]:
        """Find (or start) the book's session and load its turns; the session's page range applies unless
        ``--pages`` was given.

        Raises:
            DocumentError: the file cannot be read.
        """
        from locks_chat.errors import DocumentError

        try:
            digest = file_hash(self.path)
        except OSError as err:
            raise DocumentError(f"{self.path}: cannot read ({err.strerror}); check the path") from None
        key = DocumentKey(str(self.path), digest, self.path.stem)
        session = self.store.open_session(key.doc_path, key.doc_hash, key.title, self.pages, self.options.new_session)
        pages = session.pages if self.pages is None else self.pages
        self.conversation = Conversation(self.store, key, session, pages, self.store.turns(session.id))
        return self.turns

    def load(self, pages: str | None, progress: ProgressCallback | None = None) -> Document:
        """Load the document with ``pages`` (``None``: every page) and remember the range in the session.

        A session is about one content of the file (its SHA-256, :class:`DocumentKey`): a reload (``/pages``) of
        a file changed on disk since the session opened is refused, so the new text never enters the old
        session; the loaded document stays as it was.

        Raises:
            DocumentError: the file changed on disk since the session opened, or cannot be read.
            DocumentError, EncryptedError, NoTextError, PageRangeError: see ``load_document``.
        """
        self._refuse_a_changed_file()
        document = load_document(self.path, password=self.options.password, pages=pages, progress=progress)
        self.document, self.pages = document, pages
        if self.session is not None and self.store.current(self.session) is not None:
            self.store.set_pages(self.session.id, pages)
        return document

    def _refuse_a_changed_file(self) -> None:
        """Raise :class:`DocumentError` when the file's content is no longer the session's (after
        :meth:`open_session`; before it there is nothing to compare)."""
        from locks_chat.errors import DocumentError

        expected = self.conversation.key.doc_hash
        if not expected or self.document is None:
            return
        try:
            digest = file_hash(self.path)
        except OSError as err:
            raise DocumentError(f"{self.path}: cannot read ({err.strerror}); check the path") from None
        if digest != expected:
            raise DocumentError(
                f"{self.path}: the file changed on disk since this session opened; the session keeps the text it "
                "read (nothing reloaded). Quit and open the book again for a session of the new text")

    def start_engine(self, settings: Settings | None = None) -> float:
        """(Re)start the engine with ``settings`` (default: the current ones) and their ``LocksConfig``; returns
        the seconds it took.

        Raises:
            EngineError: the engine did not start.
        """
        settings = settings or self.settings
        with self._engine_lock:
            old, self.engine = self.engine, None
            if old is not None:
                old.close()
            start = time.monotonic()
            sized = {"kv_cache_gib": settings.kv_cache_gib} if settings.kv_cache_gib else {}
            engine = self.engine_factory(settings.model, settings.locks, settings.context, **sized)
            if self._closed:
                engine.close()
                raise EngineError("the app closed while the engine was starting")
            self.engine, self.settings = engine, settings
            self.timings.engine_start_s = time.monotonic() - start
            save_timings(self.timings)
            return self.timings.engine_start_s

    def check_fits(self, question: str = "") -> None:
        """Refuse ``question`` about the loaded document without the engine when, even with no earlier turns,
        it cannot fit the context (an empty question: the document alone). Counted with the model's tokenizer
        (:func:`locks_chat.engine_client.open_tokenizer`, loaded once); no check without it: the engine checks too.

        Raises:
            ContextError: with the numbers and a ``--pages`` range that fits.
        """
        from locks_chat.ask import fitting_prompt

        model = self._tokenizer()
        if model is not None and self.document is not None:
            fitting_prompt(model, self.document, [question], max_tokens=self.settings.max_tokens)

    def _tokenizer(self) -> Any:
        with self._tokenizer_lock:
            if not self._tokenizer_asked and self.tokenizer_factory is not None:
                self._model_tokenizer = self.tokenizer_factory(self.settings.model, self.settings.context)
            self._tokenizer_asked = True
            return self._model_tokenizer

    def persist(self, **values: Any) -> None:
        """Save ``values`` in the settings file, leaving the file's other settings as they are (command-line
        overrides of this run are not saved)."""
        saved, _ = load_settings()
        save_settings(replace(saved, **values))

    def model_name(self) -> str:
        """The model in use, for the status line: a built-in model's title (``Qwen2.5-Coder-0.5B-Instruct
        (built-in)``) or the ``--model`` value, with the dtype the engine runs it in once it runs (``, float32``: a
        CPU without native bf16)."""
        model = self.settings.model
        builtin = find_builtin(model)
        name = f"{builtin.title} (built-in)" if builtin else Path(model).name or model
        dtype = getattr(self.engine, "dtype", None)
        return f"{name}, {dtype}" if isinstance(dtype, str) else name

    def mode(self) -> str:
        """The attention setting answers are made with: ``LOCKS budget 512, rank 8`` or ``dense``."""
        return Attention.of(self.locks).text()

    def answer(
        self, question: str, cancel: threading.Event, on_text: Callable[[str], None],
        on_step: Callable[[Any], None], on_tick: Callable[[EngineTick], None],
    ) -> Any:
        """Answer ``question`` with the earlier turns as context, sampled as :attr:`settings` say over the model's
        defaults (``locks_chat.sampling``); the turn is saved whatever happens (an answer that repeated itself:
        through the loop's first occurrence, ``locks_chat.ask.ask``).

        An engine failure while a stop is under way (``cancel`` set, or a SIGTERM or SIGHUP recorded, waiting up
        to :data:`STOP_WAIT_S` for the main thread to record it) is that stop: the signal reached vLLM's engine
        core too, which may die before the app stops the request.

        Raises:
            Cancelled: ``cancel`` was set, or the app was told to stop (the partial answer is saved as
            ``cancelled``). ContextError: the document does not fit. EngineError: no engine, or it failed.
        """
        assert self.session is not None and self.document is not None, "open_session and load first"
        if self.engine is None:
            raise EngineError("the engine is not running: change a setting (e.g. /budget) to start it again")
        sampling = answer_sampling(self.engine, self.settings.sampling_overrides())
        self._answering.acquire()
        try:
            result = self.conversation.answer(
                MeteredEngine(self.engine, on_tick), self.document, question, self.settings.max_tokens,
                Attention.of(self.locks), on_text, on_step, cancel, live=True, sampling=sampling,
                stopping=lambda: cancel.is_set() or sigterm_received(STOP_WAIT_S),
            )
        finally:
            self._answering.release()
        if result.ttft_ms and result.reading.prefill_tokens:
            self.timings.prefill_tokens_per_s = result.reading.prefill_tokens / (result.ttft_ms / 1000)
            save_timings(self.timings)
        return result

    def take_notice(self) -> str | None:
        """The notice the last answer left for the screen (a session deleted meanwhile), once; else None."""
        return self.conversation.take_notice()

    def export(self) -> Path:
        """Write the conversation as Markdown into the user data directory; returns the file. A session deleted
        meanwhile is exported as this window holds it."""
        assert self.session is not None
        current = self.store.current(self.session)
        if current is None:
            return export_transcript(self.session, self.turns)
        return export_transcript(current, self.store.turns(current.id))

    def close(self, wait_s: float = 30.0) -> None:
        """Shut the engine down (called when the app exits); an engine still starting closes when it is up. A
        session with nothing to resume (no turns, no page range) is deleted.

        An answer in flight (its cancel event already set) gets ``wait_s`` seconds to stop and be saved first:
        the engine checks cancellation between steps, and a prefill chunk can take several seconds.
        """
        self._closed = True
        if self._answering.acquire(timeout=wait_s):
            self._answering.release()
        engine, self.engine = self.engine, None
        try:
            if self.session is not None and self.store.current(self.session) is not None:
                self.store.delete_if_empty(self.session.id)  # no question asked: nothing to list or resume
        except SessionStoreError:
            pass  # the store said so when it was opened; closing goes on
        finally:
            if engine is not None:
                engine.close()
