"""The work behind the chat screen, without any UI: a book, its engine and its session.

Every method that blocks (loading, engine start, answering) is called from a worker thread; the screen hands
in callbacks that post messages; an engine start the app walks away from (``locks_chat.tui.background``) closes
its engine as soon as it is up, once :meth:`BookChat.close` was called. Answers go through
:func:`locks_chat.ask.ask`; each turn is written to the session store when it starts, saved as it streams and
finished when it ends (``locks_chat.sessions``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from locks_chat.errors import Cancelled, ContextError, EngineError
from locks_chat.ingest import Document, ProgressCallback, load_document
from locks_chat.sessions import SessionInfo, SessionStore, SessionStoreError, Turn, file_hash
from locks_chat.settings import Settings, load_settings, save_settings
from locks_chat.transcript import export_transcript
from locks_chat.tui.meter import EngineTick, MeteredEngine
from locks_chat.tui.timings import load_timings, save_timings
from locks_engine.config import LocksConfig

EngineFactory = Callable[[str | None, Any, int | None], Any]
"""``open_engine(model, locks_config, max_model_len) -> ChatEngine``"""
TokenizerFactory = Callable[[str | None, int | None], Any]
"""``open_tokenizer(model, max_model_len) -> ModelTokenizer | None``"""

HISTORY_TURNS = 4
"""earlier answered turns put back in the prompt (fewer when they do not fit the context)"""
SAVE_EVERY_S = 1.0
"""how often a streaming answer is saved to the session store (seconds)"""


@dataclass(frozen=True)
class ChatOptions:
    """What the command line gives the app: settings after overrides, and the document's options."""

    settings: Settings = field(default_factory=Settings)
    pages: str | None = None
    """``--pages`` selection; ``None``: the pages the resumed session used, else every page"""
    password: str | None = None
    new_session: bool = False
    """start a new conversation instead of resuming the book's latest one"""
    locks: LocksConfig | None = None
    """the LOCKS configuration of ``settings``, built once where the settings were (``Settings.locks_config``);
    ``None``: built from ``settings`` here"""

    def __post_init__(self) -> None:
        if self.locks is None:
            object.__setattr__(self, "locks", self.settings.locks_config())


def default_engine_factory(model: str | None, locks: Any, max_model_len: int | None,
                           kv_cache_gib: float | None = None) -> Any:
    """:func:`locks_chat.engine.open_engine`, looked up when called (so tests can replace it)."""
    from locks_chat import engine

    return engine.open_engine(model, locks, max_model_len, kv_cache_gib)


def default_tokenizer_factory(model: str | None, max_model_len: int | None) -> Any:
    """:func:`locks_chat.engine.open_tokenizer`, leaving a first conversion of the built-in model to the engine
    start that runs meanwhile; ``None`` also when the model cannot be found (the engine start says why)."""
    from locks_chat import engine

    try:
        return engine.open_tokenizer(model, max_model_len, convert=False)
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
        self.locks: LocksConfig = options.locks
        """the LOCKS configuration of ``settings``: the engine's, the panels'"""
        self.pages = options.pages
        self.engine_factory = engine_factory or default_engine_factory
        # a scripted engine brings its own tokenizer: the real model's is only asked for with the real engine
        self.tokenizer_factory = tokenizer_factory or (default_tokenizer_factory if engine_factory is None else None)
        self.store = store or SessionStore()
        self.document: Document | None = None
        self.engine: Any = None
        self.session: SessionInfo | None = None
        self.turns: list[Turn] = []
        self.timings = load_timings()
        """how long the engine start and the prefill took last time, for ETAs"""
        self._engine_lock = threading.Lock()
        self._tokenizer_lock = threading.Lock()
        self._model_tokenizer: Any = None
        self._tokenizer_asked = False
        self._answering = threading.Lock()
        self._closed = False
        self.notice: str | None = None
        """what the screen should tell after an answer (a session deleted meanwhile), see :meth:`take_notice`"""

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
        title = self.path.stem
        self.session = self.store.open_session(str(self.path), digest, title, self.pages, self.options.new_session)
        if self.pages is None:
            self.pages = self.session.pages
        self.turns = self.store.turns(self.session.id)
        return self.turns

    def load(self, pages: str | None, progress: ProgressCallback | None = None) -> Document:
        """Load the document with ``pages`` (``None``: every page) and remember the range in the session.

        Raises:
            DocumentError, EncryptedError, NoTextError, PageRangeError: see ``load_document``.
        """
        document = load_document(self.path, password=self.options.password, pages=pages, progress=progress)
        self.document, self.pages = document, pages
        if self.session is not None and self.store.current(self.session) is not None:
            self.store.set_pages(self.session.id, pages)
        return document

    def start_engine(self, settings: Settings | None = None, locks: LocksConfig | None = None) -> float:
        """(Re)start the engine with ``settings`` and their ``locks`` (default: the current ones, else both
        given, ``locks`` built once by the caller); returns the seconds it took.

        Raises:
            EngineError: the engine did not start.
        """
        if settings is None:
            settings, locks = self.settings, self.locks
        assert locks is not None, "new settings come with their LocksConfig"
        with self._engine_lock:
            old, self.engine = self.engine, None
            if old is not None:
                old.close()
            start = time.monotonic()
            sized = {"kv_cache_gib": settings.kv_cache_gib} if settings.kv_cache_gib else {}
            engine = self.engine_factory(settings.model, locks, settings.context, **sized)
            if self._closed:
                engine.close()
                raise EngineError("the app closed while the engine was starting")
            self.engine, self.settings, self.locks = engine, settings, locks
            self.timings.engine_start_s = time.monotonic() - start
            save_timings(self.timings)
            return self.timings.engine_start_s

    def check_fits(self, question: str = "") -> None:
        """Refuse ``question`` about the loaded document without the engine when, even with no earlier turns,
        it cannot fit the context (an empty question: the document alone). Counted with the model's tokenizer
        (:func:`locks_chat.engine.open_tokenizer`, loaded once); no check without it: the engine checks too.

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
        """The model in use, for the status line: ``SmolLM2-135M-Instruct (built-in)`` or the ``--model`` value,
        with the dtype the engine runs it in once it runs (``, float32``: a CPU without native bf16)."""
        model = self.settings.model
        name = "SmolLM2-135M-Instruct (built-in)" if model in (None, "builtin") else Path(model).name or model
        dtype = getattr(self.engine, "dtype", None)
        return f"{name}, {dtype}" if isinstance(dtype, str) else name

    def mode(self) -> str:
        """The attention setting answers are made with: ``LOCKS budget 2048, rank 8`` or ``dense``."""
        return "dense" if self.locks.dense else f"LOCKS budget {self.locks.budget}, rank {self.locks.rank}"

    def answer(
        self, question: str, cancel: threading.Event, on_text: Callable[[str], None],
        on_step: Callable[[Any], None], on_tick: Callable[[EngineTick], None],
    ) -> Any:
        """Answer ``question`` with the earlier turns as context; the turn is saved whatever happens.

        Raises:
            Cancelled: ``cancel`` was set (the partial answer is saved as ``cancelled``). ContextError: the
            document does not fit. EngineError: no engine, or it failed.
        """
        assert self.session is not None and self.document is not None, "open_session and load first"
        if self.engine is None:
            raise EngineError("the engine is not running: change a setting (e.g. /budget) to start it again")
        turn_id = self.store.begin_turn(self._live_session().id, question)
        parts: list[str] = []
        saved = [time.monotonic()]

        def text(delta: str) -> None:
            parts.append(delta)
            on_text(delta)
            if time.monotonic() - saved[0] > SAVE_EVERY_S:
                self.store.save_turn(turn_id, "".join(parts))
                saved[0] = time.monotonic()

        self._answering.acquire()
        try:
            result = self._ask(MeteredEngine(self.engine, on_tick), question, text, on_step, cancel)
        except Cancelled:
            self._finish(turn_id, question, "".join(parts), "cancelled")
            raise
        except BaseException:
            self._finish(turn_id, question, "".join(parts), "failed")
            raise
        finally:
            self._answering.release()
        stats = {**result.to_json(self.document)["stats"], "mode": self.mode(), "citation_check": result.check.text}
        if result.ttft_ms and result.reading.prefill_tokens:
            self.timings.prefill_tokens_per_s = result.reading.prefill_tokens / (result.ttft_ms / 1000)
            save_timings(self.timings)
        self._finish(turn_id, question, result.answer, "done", result.citations, stats)
        return result

    def _ask(self, engine: MeteredEngine, question: str, on_text, on_step, cancel: threading.Event) -> Any:
        """:func:`locks_chat.ask.ask` with the latest answered turns as history, dropping the oldest ones
        while the prompt does not fit the context."""
        from locks_chat.ask import ask

        history = [t for t in self.turns if t.status == "done"][-HISTORY_TURNS:]
        while True:
            questions = [t.question for t in history] + [question]
            try:
                return ask(engine, self.document, questions, [t.answer for t in history],
                           self.settings.max_tokens, on_text, on_step, cancel)
            except ContextError:
                if not history:
                    raise
                history = history[1:]

    def _finish(self, turn_id: int, question: str, answer: str, status: str,
                citations: list | None = None, stats: dict | None = None) -> None:
        if citations is None:
            from locks_chat.citations import find_citations

            citations = find_citations(answer, self.document)
        self.store.save_turn(turn_id, answer, status, citations, stats)
        self.turns.append(Turn(turn_id, question, answer, status, citations, stats or {}))

    def _live_session(self) -> SessionInfo:
        """The session, as stored; when it was deleted meanwhile (``locks-chat sessions delete`` in another
        terminal), a new one for the same book, said in :attr:`notice` (the turns on screen stay in the prompt)."""
        assert self.session is not None
        current = self.store.current(self.session)
        if current is None:
            gone = self.session
            current = self.store.open_session(gone.doc_path, gone.doc_hash, gone.title, self.pages, new=True)
            self.notice = (f"Session {gone.id} was deleted by another locks-chat; this conversation is saved as "
                           f"session {current.id} from now on")
        self.session = current
        return current

    def take_notice(self) -> str | None:
        """The notice the last answer left for the screen (once), else None."""
        notice, self.notice = self.notice, None
        return notice

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
