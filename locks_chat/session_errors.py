"""The sessions database's failures a user can fix, each one line (:class:`SessionStoreError`), for
``locks_chat.sessions``."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from locks_chat.errors import HOME_ENV, LocksChatError, exception_reason


class SessionStoreError(LocksChatError):
    """A sessions database that cannot be read (not a database, corrupt, another program's) or cannot be
    created or written (a read-only or missing data directory, a full disk, a lock held too long)."""

    kind = "sessions"


_UNREADABLE = ("NOTADB", "CORRUPT")
_UNWRITABLE = ("CANTOPEN", "READONLY", "IOERR", "PERM", "FULL", "AUTH", "NOLFS")
LOCKED = ("BUSY", "LOCKED")
_OTHER_SCHEMA = re.compile(r"no such (table|column)|has no column", re.IGNORECASE)
"""how SQLite words a database whose tables are not this store's"""


def error_kind(err: sqlite3.Error) -> str:
    """SQLite's primary result code of ``err`` without its prefix: ``BUSY`` for ``SQLITE_BUSY_SNAPSHOT``."""
    return (getattr(err, "sqlite_errorname", None) or "").removeprefix("SQLITE_").split("_")[0]


def store_error(path: Path, err: sqlite3.Error) -> SessionStoreError | None:
    """The one-line error for an SQLite failure the user can fix, None for one that is a bug."""
    kind = error_kind(err)
    reason = exception_reason(err)
    if kind in _UNREADABLE or (kind == "ERROR" and _OTHER_SCHEMA.search(str(err))):
        return SessionStoreError(
            f"{path}: not a readable sessions database ({reason}); move it aside to start afresh"
        )
    if kind in LOCKED:
        return SessionStoreError(f"{path}: the sessions database is locked ({reason}); close other locks-chat "
                                 "windows and try again")
    if kind in _UNWRITABLE:
        return SessionStoreError(f"{path}: cannot open or write the sessions database ({reason}); make "
                                 f"{path.parent} writable or set {HOME_ENV} to a writable directory")
    return None
