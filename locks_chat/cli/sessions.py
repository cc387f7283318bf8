"""``locks-chat sessions list|show|delete``: the saved conversations, outside the app."""

from __future__ import annotations

import json
import sys
import time

from rich.console import Console
from rich.table import Table
from rich.text import Text

from locks_chat.errors import LocksChatError, escape_breaks
from locks_chat.sessions import SessionInfo, SessionStore
from locks_chat.transcript import render_transcript


def _get(store: SessionStore | None, session_id: int) -> SessionInfo:
    session = store.get(session_id) if store is not None else None
    if session is None:
        raise LocksChatError(f"no session {session_id}: see locks-chat sessions list")
    return session


def list_sessions(json_out: bool, console: Console) -> None:
    """Print every session, newest first (a table, or JSON for scripts)."""
    store = SessionStore.existing(read_only=True)
    sessions = store.list_sessions() if store is not None else []
    if json_out:
        print(json.dumps([s.__dict__ for s in sessions], indent=2))
        return
    if not sessions:
        console.print("no sessions yet: open a book with locks-chat book.pdf")
        return
    table = Table("id", "title", "pages", "turns", "updated", "document", box=None, header_style="bold")
    for s in sessions:
        updated = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.updated))
        # as text, not markup: a file named "[red]notes.txt" is shown as named
        table.add_row(str(s.id), Text(escape_breaks(s.title)), Text(escape_breaks(s.pages or "all")), str(s.turns),
                      updated, Text(escape_breaks(s.doc_path)))
    console.print(table)


def write_stdout(text: str, chunk: int = 1 << 14) -> None:
    """Write ``text`` to stdout in pieces of ``chunk`` characters, each flushed.

    Raises:
        BrokenPipeError: stdout's reader went away. CPython's buffered writer let that pass unraised when it met
            it part way through one large write (a 1.5 MB transcript into ``| head -c 10`` exited 0).
    """
    for start in range(0, len(text), chunk):
        sys.stdout.write(text[start:start + chunk])
        sys.stdout.flush()


def show_session(session_id: int) -> None:
    """Print a session's transcript as Markdown."""
    store = SessionStore.existing(read_only=True)
    write_stdout(render_transcript(_get(store, session_id), store.turns(session_id)))


def delete_sessions(session_ids: list[int], console: Console) -> None:
    """Delete sessions and their turns.

    Raises:
        LocksChatError: an id that names no session (nothing is deleted then).
    """
    store = SessionStore.existing()
    session_ids = list(dict.fromkeys(session_ids))  # an id given twice is deleted (and said) once
    for session_id in session_ids:
        _get(store, session_id)
    for session_id in session_ids:
        store.delete(session_id)
        console.print(f"deleted session {session_id}")
