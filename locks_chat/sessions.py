"""Conversations kept in SQLite, one session per book: resume, list, delete.

A session is keyed by the document's resolved path and the SHA-256 of its bytes, so an edited file starts a new
conversation and a moved one does not find the old one; a document read from standard input is found by its
hash alone. The chat app and ``locks-chat ask`` (``--continue``, ``--session``) share the sessions. A turn is
written when it starts (status ``answering``), its partial answer is saved as it streams, and its end state is
written when it ends (``done``, ``cancelled``, ``failed``); a turn still marked ``answering`` when the app starts
again was cut off by a crash and reads as ``interrupted`` (``locks-chat ask`` writes its turn once, when the
answer ends or is stopped). Every write is its own committed transaction (WAL journal), so nothing finished is
lost.
Each call opens its own connection: the store is safe to use from worker threads. A database that cannot be read
or written (not SQLite, corrupt, in a directory that cannot be written) raises :class:`SessionStoreError`; the file
is never removed or rewritten then. A database a failed first ``ask`` created and left without a session is
removed (:meth:`SessionStore.removed_unless_used`). The records, and how paths and text are stored:
:mod:`locks_chat.session_records`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from locks_chat.errors import HOME_ENV, escape_breaks, exception_reason
from locks_chat.paths import data_dir
from locks_chat.session_errors import LOCKED, SessionStoreError, error_kind, store_error
# the records are re-exported: the app, the CLI and the tests import them from this module
from locks_chat.session_records import (  # noqa: F401
    STDIN_PATH, SessionInfo, Turn, file_hash, is_sqlite_int, storable, stored_path)

LOCK_WAIT_S = 10.0
"""seconds a connection waits for another process's lock on the sessions database before saying so"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    doc_path TEXT NOT NULL,
    doc_hash TEXT NOT NULL,
    title TEXT NOT NULL,
    pages TEXT,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_doc ON sessions (doc_path, doc_hash);
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY,
    session_id INTEGER NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    question TEXT NOT NULL,
    answer TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL,
    citations TEXT NOT NULL DEFAULT '[]',
    stats TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
"""
STATUSES = ("answering", "done", "cancelled", "failed")


class SessionStore:
    """The sessions database (``sessions.sqlite`` in the user data directory unless ``path`` is given).

    ``read_only`` (``sessions list`` and ``show``): the database is opened read-only and nothing is created beside
    it, so a read-only data folder is read and no ``-wal``/``-shm`` file is left. While no other connection has it
    open (no ``-wal`` file: SQLite removes it when the last connection closes) it is opened ``immutable``, which
    takes no lock and needs no shared-memory file; while one has, it is opened ``mode=ro``, reading that
    connection's WAL through its files (SQLite's URI parameters, https://sqlite.org/uri.html).
    """

    def __init__(self, path: str | Path | None = None, read_only: bool = False) -> None:
        self.path = Path(path) if path is not None else data_dir() / "sessions.sqlite"
        self.read_only = read_only
        self.created: list[Path] = []
        """what opening the store created: the database file, then the folders made for it, innermost first
        (:meth:`removed_unless_used`)"""
        if read_only:
            return
        created = [path for path in (self.path, *self.path.parents) if not os.path.exists(path)]
        with self._db() as db:
            db.executescript(SCHEMA)
        self.created = [path for path in created if os.path.exists(path)]

    def _make_parent(self) -> None:
        """Create the data directory when it is missing.

        Raises:
            SessionStoreError: it cannot be created (a file in the way, a parent that cannot be written).
        """
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            in_the_way = isinstance(err, (FileExistsError, NotADirectoryError))  # a file where a folder must be
            fix = "move that file aside" if in_the_way else "make its parent writable"
            raise SessionStoreError(
                f"{self.path.parent}: cannot create the data directory ({err.strerror or exception_reason(err)}); "
                f"{fix} or set {HOME_ENV} to a writable directory"
            ) from None

    @contextlib.contextmanager
    def removed_unless_used(self) -> Iterator[None]:
        """Remove what opening the store created (:attr:`created`) when the block fails before a session is saved:
        a first ``ask`` that fails (a document that cannot be read, an option refused once the store is open)
        leaves no empty database behind. A database that existed before is never removed, nor one that holds a
        session or that another process has open (its ``-wal`` file exists while it does); the folders go only
        when empty. Raises what the block raised."""
        try:
            yield
        except BaseException:
            self._remove_if_unused()
            raise

    def _remove_if_unused(self) -> None:
        """:meth:`removed_unless_used`'s removal; a database that cannot be read or removed is kept, silently
        (the block's own error is the one to say)."""
        if not self.created or self.created[0] != self.path:
            return
        try:
            with self._db() as db:
                if db.execute("SELECT EXISTS (SELECT 1 FROM sessions)").fetchone()[0]:
                    return
            if self.path.with_name(self.path.name + "-wal").exists():
                return
            self.path.unlink()
            self.path.with_name(self.path.name + "-shm").unlink(missing_ok=True)
            for folder in self.created[1:]:
                folder.rmdir()
        except (OSError, sqlite3.Error, SessionStoreError):
            pass

    @classmethod
    def existing(cls, path: str | Path | None = None, read_only: bool = False) -> SessionStore | None:
        """The store if its database file exists, else None (for commands that only read or delete: they
        must not create the file); ``read_only``: for commands that only read (see the class)."""
        target = Path(path) if path is not None else data_dir() / "sessions.sqlite"
        try:
            exists = target.is_file()
        except OSError as err:  # a data directory that cannot be searched
            raise SessionStoreError(
                f"{target}: cannot read the sessions database ({err.strerror or exception_reason(err)}); "
                f"make {target.parent} readable or set {HOME_ENV} to another directory"
            ) from None
        return cls(target, read_only) if exists else None

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """A connection in a transaction, committed on leaving; an SQLite failure the user can fix (in opening or
        in the statements run) becomes a :class:`SessionStoreError`."""
        try:
            db = self._connect()
            try:
                with db:
                    yield db
            finally:
                db.close()
        except sqlite3.Error as err:
            error = store_error(self.path, err)
            if error is None:
                raise
            raise error from None

    def _connect(self) -> sqlite3.Connection:
        """A connection in WAL mode with foreign keys on. Switching a new database to WAL needs it alone, and
        SQLite says "locked" at once, without waiting, while another process does the same (two first ``ask``
        runs): that is retried for up to :data:`LOCK_WAIT_S`, as SQLite's own timeout does for the statements."""
        if self.read_only:
            return self._connect_read_only()
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            # a new database, or one removed since this store opened it (another process's first ask failed:
            # :meth:`removed_unless_used`): its folder and its tables are made first
            gone = not os.path.exists(self.path)
            if gone:
                self._make_parent()
            db = sqlite3.connect(self.path, timeout=LOCK_WAIT_S)
            try:
                if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA foreign_keys=ON")
                if gone:
                    db.executescript(SCHEMA)
                return db
            except sqlite3.OperationalError as err:
                db.close()
                if error_kind(err) not in LOCKED or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _connect_read_only(self) -> sqlite3.Connection:
        """A read-only connection that creates no file (see the class)."""
        from urllib.parse import quote

        in_use = self.path.with_name(self.path.name + "-wal").exists()
        mode = "mode=ro" if in_use else "mode=ro&immutable=1"
        return sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?{mode}", uri=True, timeout=LOCK_WAIT_S)

    def open_session(
        self, doc_path: str, doc_hash: str, title: str, pages: str | None, new: bool = False
    ) -> SessionInfo:
        """The latest session of this document (path and content), or a new one when there is none or ``new``.

        Args:
            doc_path (str): the document's path (stored resolved), or :data:`STDIN_PATH`.
            doc_hash (str): SHA-256 of the document's bytes, hex (:func:`file_hash`).
        """
        doc_path = stored_path(doc_path)
        title = escape_breaks(storable(title))
        if not new:
            latest = self.latest(doc_hash, doc_path)
            if latest is not None:
                return latest
        now = time.time()
        with self._db() as db:
            cur = db.execute(
                "INSERT INTO sessions (doc_path, doc_hash, title, pages, created, updated) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (doc_path, doc_hash, title, None if pages is None else storable(pages), now, now),
            )
            session_id = cur.lastrowid
        return self.get(session_id)

    def latest(self, doc_hash: str, doc_path: str | None = None) -> SessionInfo | None:
        """The most recently updated session of the document with this content, at ``doc_path`` (resolved, or
        :data:`STDIN_PATH`) unless it is ``None`` (then wherever it was read from); ``None`` when there is none."""
        where, args = "WHERE s.doc_hash = ?", (doc_hash,)
        if doc_path is not None:
            doc_path = stored_path(doc_path)
            where, args = where + " AND s.doc_path = ?", (doc_hash, doc_path)
        rows = self._sessions(where, args)
        return rows[0] if rows else None

    def latest_at(self, doc_path: str) -> SessionInfo | None:
        """The most recently updated session of the file at ``doc_path`` (resolved), whatever its content was."""
        rows = self._sessions("WHERE s.doc_path = ?", (stored_path(doc_path),))
        return rows[0] if rows else None

    def get(self, session_id: int) -> SessionInfo | None:
        if not is_sqlite_int(session_id):
            return None
        rows = self._sessions("WHERE s.id = ?", (session_id,))
        return rows[0] if rows else None

    def current(self, session: SessionInfo) -> SessionInfo | None:
        """``session`` as stored now, or None when it was deleted meanwhile (``locks-chat sessions delete`` from
        another terminal), also when a newer session has taken its id since."""
        now = self.get(session.id)
        return now if now is not None and now.created == session.created else None

    def list_sessions(self) -> list[SessionInfo]:
        """Every session, most recently updated first."""
        return self._sessions("", ())

    def _sessions(self, where: str, args: tuple) -> list[SessionInfo]:
        with self._db() as db:
            rows = db.execute(
                "SELECT s.id, s.doc_path, s.doc_hash, s.title, s.pages, s.updated, COUNT(t.id), s.created "
                "FROM sessions s "
                f"LEFT JOIN turns t ON t.session_id = s.id {where} GROUP BY s.id ORDER BY s.updated DESC, s.id DESC",
                args,
            ).fetchall()
        return [SessionInfo(*row) for row in rows]

    def set_pages(self, session_id: int, pages: str | None) -> None:
        with self._db() as db:
            db.execute("UPDATE sessions SET pages = ?, updated = ? WHERE id = ?",
                       (None if pages is None else storable(pages), time.time(), session_id))

    def delete(self, session_id: int) -> bool:
        """Delete a session and its turns; False when there was no such session."""
        if not is_sqlite_int(session_id):
            return False
        with self._db() as db:
            return db.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount > 0

    def delete_if_empty(self, session_id: int) -> bool:
        """Delete a session with nothing to resume: no turns and no page range chosen (a book opened and closed
        without a question, or one that could not be read); True if deleted."""
        if not is_sqlite_int(session_id):
            return False
        with self._db() as db:
            return db.execute(
                "DELETE FROM sessions WHERE id = ? AND pages IS NULL "
                "AND NOT EXISTS (SELECT 1 FROM turns WHERE session_id = ?)",
                (session_id, session_id),
            ).rowcount > 0

    def turns(self, session_id: int) -> list[Turn]:
        """The session's turns in order; a turn left ``answering`` reads as ``interrupted``."""
        if not is_sqlite_int(session_id):
            return []
        with self._db() as db:
            rows = db.execute(
                "SELECT id, question, answer, status, citations, stats FROM turns WHERE session_id = ? ORDER BY id",
                (session_id,),
            ).fetchall()
        try:
            return [
                Turn(i, q, a, "interrupted" if s == "answering" else s, json.loads(c), json.loads(st))
                for i, q, a, s, c, st in rows
            ]
        except (TypeError, ValueError) as err:
            raise SessionStoreError(
                f"{self.path}: not a readable sessions database (a turn of session {session_id} holds no JSON: "
                f"{exception_reason(err, 60)}); move it aside to start afresh"
            ) from None

    def begin_turn(self, session_id: int, question: str) -> int:
        """Record a question before it is answered; returns the turn id."""
        now = time.time()
        with self._db() as db:
            cur = db.execute(
                "INSERT INTO turns (session_id, question, status, created, updated) VALUES (?, ?, 'answering', ?, ?)",
                (session_id, storable(question), now, now),
            )
            db.execute("UPDATE sessions SET updated = ? WHERE id = ?", (now, session_id))
            return cur.lastrowid

    def save_turn(
        self, turn_id: int, answer: str, status: str = "answering",
        citations: list[dict[str, Any]] | None = None, stats: dict[str, Any] | None = None,
    ) -> None:
        """Save a turn's answer so far (``answering``) or its end state."""
        assert status in STATUSES, status
        with self._db() as db:
            db.execute(
                "UPDATE turns SET answer = ?, status = ?, citations = ?, stats = ?, updated = ? WHERE id = ?",
                (storable(answer), status, json.dumps(citations or []), json.dumps(stats or {}, default=str),
                 time.time(), turn_id),
            )
