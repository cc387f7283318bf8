"""What the sessions database holds, as Python values (a session, a turn), and how a document's path, text and
ids are stored (``locks_chat.sessions``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from locks_chat.errors import is_text

STDIN_PATH = "-"
"""``doc_path`` of a session whose document came from standard input (``locks-chat ask -``): it is found by the
document's hash alone"""


@dataclass(frozen=True)
class SessionInfo:
    id: int
    doc_path: str
    doc_hash: str
    title: str
    pages: str | None
    """the ``--pages`` selection last used, ``None`` for the whole document"""
    updated: float
    """seconds since the epoch of the last write"""
    turns: int = 0
    created: float = 0.0
    """seconds since the epoch of the session's creation: with the id, what tells it from a later session that
    reuses a deleted one's id (databases made before ids were made never to be reused)"""


@dataclass(frozen=True)
class Turn:
    id: int
    question: str
    answer: str
    status: str
    """``done``, ``cancelled``, ``failed``, or ``interrupted`` (cut off by a crash)"""
    citations: list[dict[str, Any]]
    stats: dict[str, Any]


def file_hash(path: str | Path) -> str:
    """SHA-256 of a file's bytes, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def stored_path(doc_path: str) -> str:
    """A session's ``doc_path`` as stored: the file's resolved path (:func:`storable`), or :data:`STDIN_PATH`."""
    return doc_path if doc_path == STDIN_PATH else storable(str(Path(doc_path).resolve()))


def storable(text: str) -> str:
    """``text`` as valid UTF-8 for SQLite: a file name's bytes that are not UTF-8 (Python holds them as lone
    surrogates, ``\\udcff``) become ``\\xff`` escapes, the same for the same name, so a session is found again."""
    if is_text(text):
        return text
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "backslashreplace")
    return raw.decode("utf-8", "backslashreplace")


def is_sqlite_int(value: int) -> bool:
    """Whether ``value`` fits SQLite's 64-bit INTEGER (larger ids cannot exist; binding them raises)."""
    return -(2**63) <= value < 2**63
