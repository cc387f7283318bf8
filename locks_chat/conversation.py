"""One conversation about a document, for ``locks-chat ask`` and the chat app alike: the earlier turns that go
back into the prompt, trimmed while it does not fit, and where each new turn is saved (``locks_chat.sessions``).

A prompt holds the session's latest answered turns (at most :data:`HISTORY_TURNS`) after the document, so the
document stays the prompt's prefix; the oldest are dropped while the prompt does not fit the context. A turn
stopped by the user is saved with its partial answer (``cancelled``). A session deleted meanwhile (``locks-chat
sessions delete`` in another terminal) goes on as a new session of the same document, said in
:attr:`Conversation.notice`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from locks_chat.attention import Attention
from locks_chat.errors import Cancelled, ContextError
from locks_chat.ingest import Document
from locks_chat.sessions import SessionInfo, SessionStore, Turn

HISTORY_TURNS = 4
"""earlier answered turns put back in the prompt (fewer when they do not fit the context)"""
SAVE_EVERY_S = 1.0
"""how often an answer saved as it streams is written to the session store (seconds)"""


@dataclass(frozen=True)
class DocumentKey:
    """What a new session of the document is saved under."""

    doc_path: str
    """the file's path, or ``locks_chat.sessions.STDIN_PATH``"""
    doc_hash: str
    """SHA-256 of the document's bytes, hex"""
    title: str | None
    """``None``: the loaded document's title (a document read from standard input)"""


class Conversation:
    """A session's turns, the earlier ones that go into the next prompt, and the saving of new ones.

    Args:
        store (SessionStore): where the turns are saved.
        key (DocumentKey): the document, for a session created when the first turn is saved (or when
            ``session`` was deleted meanwhile).
        session (SessionInfo | None): the session continued; ``None``: a new one, created when a turn is saved.
        pages (str | None): the document's page range (``--pages``); ``None``: every page.
        turns (list[Turn]): the session's turns so far, oldest first.
        continued (bool): the session existed before (``ask --continue``, ``--session``, a resumed chat).
    """

    def __init__(self, store: SessionStore, key: DocumentKey, session: SessionInfo | None = None,
                 pages: str | None = None, turns: list[Turn] | None = None, continued: bool = False) -> None:
        self.store, self.key, self.session, self.pages = store, key, session, pages
        self.turns: list[Turn] = list(turns or [])
        self.continued = continued
        self.history: list[Turn] = self.latest_answered()
        """the earlier turns for the next prompt, oldest first; after an answer, those its prompt held"""
        self.turn_id: int | None = None
        """the last turn saved"""
        self.notice: str | None = None
        """what to tell the user after an answer (the session was deleted meanwhile), see :meth:`take_notice`"""

    def latest_answered(self) -> list[Turn]:
        """The latest answered (``done``) turns, at most :data:`HISTORY_TURNS`, oldest first."""
        return [t for t in self.turns if t.status == "done"][-HISTORY_TURNS:]

    def fit(self, model: Any, document: Document, question: str, max_tokens: int) -> None:
        """Drop the oldest turns of :attr:`history` until the prompt fits ``model`` (a ``ChatEngine`` or a
        ``ModelTokenizer``).

        Raises:
            ContextError: the question does not fit even without earlier turns.
        """
        from locks_chat.ask import fitting_prompt

        self._trimmed(lambda turns: fitting_prompt(
            model, document, [t.question for t in turns] + [question], [t.answer for t in turns], max_tokens,
        ))

    def answer(
        self, engine: Any, document: Document, question: str, max_tokens: int, attention: Attention,
        on_text: Callable[[str], None] | None = None, on_step: Callable[[Any], None] | None = None,
        cancel: threading.Event | None = None, live: bool = False, sampling: Any = None,
        stopping: Callable[[], bool] | None = None,
    ) -> Any:
        """:func:`locks_chat.ask.ask` with :attr:`history`, saving the turn.

        A turn is saved one of two ways. ``live`` (the chat app): written when it starts, saved as it streams,
        ended ``done`` (with the citation check), ``cancelled`` (no statistics) or ``failed``, the history taken
        afresh from :attr:`turns`. Otherwise (``ask``): written once, ``done``, or ``cancelled`` with the
        attention setting (a stop, or stdout's reader gone); other failures save nothing.

        Args:
            attention (Attention): the engine's setting, kept in the turn's statistics.
            sampling (Sampling | None): how tokens are drawn (kept in the statistics too); ``None``: greedy.
            stopping (Callable[[], bool] | None): see :func:`locks_chat.ask.ask` (an engine failure during a stop
                the user asked for is that stop: the turn is saved ``cancelled``).
        Returns:
            AskResult: the answer and its statistics.
        Raises:
            Cancelled: ``cancel`` was set, Ctrl+C, SIGTERM or SIGHUP (re-raised once the partial answer is saved).
            BrokenPipeError: ``on_text`` found its reader gone (re-raised once the partial answer is saved).
            ContextError: the question does not fit even without earlier turns. EngineError: the engine failed.
        """
        from locks_chat.ask import ask
        from locks_engine.sampling import GREEDY

        parts: list[str] = []
        turn_id = self.store.begin_turn(self.live_session(document).id, question) if live else None
        saved = [time.monotonic()]

        def text(delta: str) -> None:
            parts.append(delta)
            if on_text is not None:
                on_text(delta)
            if live and time.monotonic() - saved[0] > SAVE_EVERY_S:
                self.store.save_turn(turn_id, "".join(parts))
                saved[0] = time.monotonic()

        if live:
            self.history = self.latest_answered()
        try:
            result = self._trimmed(lambda turns: ask(
                engine, document, [t.question for t in turns] + [question], [t.answer for t in turns], max_tokens,
                text, on_step, cancel, sampling or GREEDY, stopping,
            ))
        except (Cancelled, BrokenPipeError):
            # a stop, or the reader of the streamed answer gone (``ask ... | head``): the answer so far is kept
            self.save(turn_id, question, document, "".join(parts), "cancelled",
                      stats=None if live else {"attention": attention.to_json()})
            raise
        except BaseException:
            if live:
                self.save(turn_id, question, document, "".join(parts), "failed")
            raise
        stats = {**result.to_json(document)["stats"], "attention": attention.to_json(),
                 "supported": result.check.supported}
        if live:
            stats["citation_check"] = result.check.text
        self.save(turn_id, question, document, result.answer, "done", result.citations, stats)
        return result

    def _trimmed(self, attempt: Callable[[list[Turn]], Any]) -> Any:
        """``attempt(history)``, dropping the oldest turn of :attr:`history` after each ``ContextError``."""
        while True:
            try:
                return attempt(self.history)
            except ContextError:
                if not self.history:
                    raise
                self.history = self.history[1:]

    def save(self, turn_id: int | None, question: str, document: Document, answer: str, status: str,
             citations: list | None = None, stats: dict | None = None) -> None:
        """End turn ``turn_id`` (``None``: write a new one in :meth:`live_session`) and add it to :attr:`turns`;
        ``citations`` ``None``: those found in ``answer``."""
        if citations is None:
            from locks_chat.citations import find_citations

            citations = find_citations(answer, document)
        if turn_id is None:
            turn_id = self.store.begin_turn(self.live_session(document).id, question)
        self.store.save_turn(turn_id, answer, status, citations, stats)
        self.turn_id = turn_id
        self.turns.append(Turn(turn_id, question, answer, status, citations, stats or {}))

    def live_session(self, document: Document) -> SessionInfo:
        """The session, as stored, with this conversation's page range: a new one of :attr:`key` when there is
        none yet, or when it was deleted meanwhile (said in :attr:`notice`; the turns so far stay in the prompt)."""
        current = self.store.current(self.session) if self.session is not None else None
        if current is None:
            key = self.key
            current = self.store.open_session(key.doc_path, key.doc_hash, key.title or document.title, self.pages,
                                              new=True)
            if self.session is not None:
                self.notice = (f"Session {self.session.id} was deleted by another locks-chat; this conversation is "
                               f"saved as session {current.id} from now on")
        elif current.pages != self.pages:
            self.store.set_pages(current.id, self.pages)
        self.session = current
        return current

    def take_notice(self) -> str | None:
        """The notice the last answer left (once), else None."""
        notice, self.notice = self.notice, None
        return notice

    def turn_number(self) -> int | None:
        """The saved turn's number in its session (1-based, cancelled turns counted; before a turn is saved, the
        session's number of turns); ``None`` without a session."""
        if self.session is None:
            return None
        ids = [t.id for t in self.store.turns(self.session.id)]
        return ids.index(self.turn_id) + 1 if self.turn_id in ids else len(ids)
