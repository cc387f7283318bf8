"""Follow-ups from the command line: ``locks-chat ask --continue`` / ``--session N``, and ``-`` for a document
read from standard input.

Every ``ask`` saves its question and answer as a turn of a saved session (``locks_chat.sessions``), the store the
chat app resumes: a new session, or the one continued. A follow-up puts the session's latest answered turns into
the prompt the way the chat app does (``locks_chat.conversation``).

A session is found by its document's content: ``--continue`` takes the latest session of the file (its path and
SHA-256, the chat app's key) or, for ``-``, the latest session of any document with the same SHA-256 (piping the
same text again finds it); ``--session N`` must be about a document with the same SHA-256.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from locks_chat.conversation import Conversation, DocumentKey
from locks_chat.errors import DocumentError, LocksChatError
from locks_chat.ingest import Document
from locks_chat.sessions import STDIN_PATH, SessionInfo, SessionStore, Turn, stored_path

STDIN_SOURCE = "<stdin>"
"""what messages call a document read from standard input"""


class FollowUpError(LocksChatError):
    """A ``--continue`` or ``--session`` that finds no conversation about this document (exit code 2)."""

    kind = "follow_up"


@dataclass(frozen=True)
class FollowUp:
    """What the command line asked to follow up on."""

    continue_last: bool = False
    """``--continue``: the latest conversation about this document"""
    session_id: int | None = None
    """``--session N``: that saved session"""

    def __post_init__(self) -> None:
        if self.continue_last and self.session_id is not None:
            raise FollowUpError("--continue and --session both given: pass one of them")


@dataclass(frozen=True)
class DocumentInput:
    """A document's bytes, read once, with what identifies it in the session store."""

    data: bytes
    source: str
    """the path as given, or :data:`STDIN_SOURCE`"""
    path: Path | None
    """``None``: read from standard input"""
    digest: str = ""
    """SHA-256 of :attr:`data`, hex (the sessions' ``doc_hash``); computed when not given"""

    def __post_init__(self) -> None:
        if not self.digest:
            object.__setattr__(self, "digest", hashlib.sha256(self.data).hexdigest())

    @property
    def doc_path(self) -> str:
        """The sessions' ``doc_path``: the file's path, or :data:`locks_chat.sessions.STDIN_PATH`."""
        return STDIN_PATH if self.path is None else str(self.path)

    def load(self, password: str | None, pages: str | None, progress: Any = None) -> Document:
        """The document (``load_document``'s errors); standard input's text is Markdown when it starts with a
        ``# `` heading."""
        from locks_chat.ingest import load_document_bytes

        first = next((line for line in self.data[:4096].splitlines() if line.strip()), b"")
        markdown = self.path is None and first.startswith(b"# ")
        return load_document_bytes(self.data, self.source, password, pages, progress, markdown=markdown)


def read_input(doc: Path) -> DocumentInput:
    """Read the document ``doc`` names, ``-`` for standard input (PDF and EPUB told by their content).

    Raises:
        DocumentError: the file cannot be read (as ``load_document`` says), standard input is a terminal (nothing
            piped in), closed or cannot be read, or it is larger than ``MAX_DOCUMENT_BYTES``. (Standard input that
            is a directory stops Python itself before the app runs: ``Fatal Python error: init_sys_streams``.)
    """
    from locks_chat.ingest.load import read_bounded, read_document_bytes
    from locks_chat.paths import path_problem

    if str(doc) != "-":
        if (problem := path_problem(doc)) is not None:
            raise DocumentError(f"{doc}: cannot read ({problem}); check the path")
        if doc.is_fifo():  # opening it waits for a writer: say so rather than hang silently
            print(f"{' '.join(str(doc).split())}: a named pipe; waiting for data to be written to it (Ctrl+C to "
                  "stop)", file=sys.stderr, flush=True)
        return DocumentInput(read_document_bytes(doc), str(doc), doc)
    stdin = sys.stdin
    if stdin is None or stdin.isatty():
        # ``<&-`` closes it: Python then sets ``sys.stdin`` to None
        state = "closed" if stdin is None else "a terminal"
        raise DocumentError(f'-: standard input is {state}: pipe the document in, e.g. cat notes.md | '
                            'locks-chat ask - "What is it about?"')
    try:
        data = read_bounded(getattr(stdin, "buffer", stdin), STDIN_SOURCE)
    except OSError as err:
        raise DocumentError(f"{STDIN_SOURCE}: cannot read ({err.strerror or err}); pipe a file in") from None
    return DocumentInput(data, STDIN_SOURCE, None)


def find_session(store: SessionStore, document: DocumentInput, follow: FollowUp) -> SessionInfo | None:
    """The session ``follow`` names, ``None`` for a new conversation.

    Raises:
        FollowUpError: no earlier conversation about this document (or only about the file before it changed); no
            session N; session N is about another document or the file before it changed (another SHA-256).
    """
    if follow.session_id is not None:
        session = store.get(follow.session_id)
        if session is None:
            raise FollowUpError(f"no session {follow.session_id}: see locks-chat sessions list")
        if session.doc_hash != document.digest:
            if document.path is not None and session.doc_path == stored_path(document.doc_path):
                raise FollowUpError(
                    f"session {session.id} is about {' '.join(document.source.split())} as it was before it changed "
                    "(its content differs now): leave out --session to start a new conversation about it"
                )
            where = " ".join(f"{session.title}, {session.doc_path}".split())  # a path may hold a newline
            raise FollowUpError(
                f"session {session.id} is about another document ({where}): pass that document, or leave out "
                "--session"
            )
        return session
    if not follow.continue_last:
        return None
    by_path = None if document.path is None else document.doc_path
    session = store.latest(document.digest, by_path)
    if session is None:
        source = " ".join(document.source.split())
        changed = None if document.path is None else store.latest_at(document.doc_path)
        if changed is not None:
            raise FollowUpError(f"no earlier conversation about {source} as it is now: the file changed since "
                                f"session {changed.id}; ask without --continue to start a new one")
        raise FollowUpError(f"no earlier conversation about {source}: ask without --continue to start one (see "
                            "locks-chat sessions list)")
    return session


def open_conversation(doc: DocumentInput, follow: FollowUp, pages: str | None,
                      store: SessionStore | None = None) -> Conversation:
    """The conversation an ``ask`` about ``doc`` joins (see :func:`find_session`); the sessions database is
    opened (created) now, so that a store that cannot be written is said before the engine starts.

    Raises:
        FollowUpError: see :func:`find_session`. SessionStoreError: the database cannot be opened.
    """
    store = store or SessionStore()
    session = find_session(store, doc, follow)
    turns: list[Turn] = []
    if session is not None:
        turns = store.turns(session.id)
        pages = pages if pages is not None else session.pages
    key = DocumentKey(doc.doc_path, doc.digest, doc.path.stem if doc.path is not None else None)
    return Conversation(store, key, session, pages, turns, continued=session is not None)


def conversation_json(conversation: Conversation) -> dict[str, Any]:
    """``{"id", "turn", "continued", "earlier_turns"}`` for ``ask --json`` (after the turn was saved); ``turn`` is
    the turn's number in its session (1 for a new session), as the footer and ``sessions show`` count."""
    session = conversation.session
    return {"id": session.id if session else None, "turn": conversation.turn_number(),
            "continued": conversation.continued, "earlier_turns": len(conversation.history)}


def session_note(conversation: Conversation) -> str:
    """`` · session 3, turn 2 (1 earlier turn in the prompt)`` for the footer."""
    if conversation.session is None:
        return ""
    note = f" · session {conversation.session.id}, turn {conversation.turn_number()}"
    if conversation.continued:
        earlier = len(conversation.history)
        note += f" ({earlier} earlier turn{'' if earlier == 1 else 's'} in the prompt)"
    return note


def cache_note(result: Any) -> str:
    """`` (1,024 from the prefix cache)`` for the footer after the prompt tokens; empty when not reported."""
    cached = getattr(result, "cached_tokens", None)
    return "" if cached is None else f" ({cached:,} from the prefix cache)"
