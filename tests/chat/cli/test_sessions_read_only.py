"""``sessions list`` and ``show`` only read: they work on a read-only data folder and leave no ``-wal``/``-shm``
file beside the database; while another connection has it open they read its latest turns through its WAL."""

import json
import os
import sqlite3

import pytest
from typer.testing import CliRunner

from locks_chat.cli import app
from locks_chat.sessions import SessionStore

runner = CliRunner()


@pytest.fixture
def saved(user_home):
    store = SessionStore()
    session = store.open_session("book.txt", "0" * 64, "Book", None)
    turn = store.begin_turn(session.id, "Who is the keeper?")
    store.save_turn(turn, "Ann Marsh (p. 3).", "done")
    return store.path, session.id


def beside(path):
    return sorted(p.name for p in path.parent.iterdir())


def read_both(session_id):
    listed = runner.invoke(app, ["sessions", "list", "--json"])
    shown = runner.invoke(app, ["sessions", "show", str(session_id)])
    assert listed.exit_code == 0, listed.output
    assert shown.exit_code == 0, shown.output
    return json.loads(listed.stdout), shown.stdout


def test_reading_leaves_nothing_beside_the_database(saved):
    path, session_id = saved
    before = (beside(path), path.read_bytes())
    listed, shown = read_both(session_id)
    assert [s["id"] for s in listed] == [session_id] and "Ann Marsh (p. 3)." in shown
    assert (beside(path), path.read_bytes()) == before == (["sessions.sqlite"], before[1])


# root writes into read-only folders and files: checked as root on read-only bind mounts (``unshare -m``), where
# both commands failed ("unable to open database file") and a read-only file was left with -wal and -shm files
@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_data_folder_is_read(saved):
    path, session_id = saved
    path.parent.chmod(0o555)
    try:
        listed, shown = read_both(session_id)
    finally:
        path.parent.chmod(0o755)
    assert [s["id"] for s in listed] == [session_id] and "Ann Marsh (p. 3)." in shown
    assert beside(path) == ["sessions.sqlite"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only files")
def test_a_read_only_database_file_is_read_and_left_alone(saved):
    path, session_id = saved
    path.chmod(0o444)
    try:
        listed, shown = read_both(session_id)
    finally:
        path.chmod(0o644)
    assert [s["id"] for s in listed] == [session_id] and "Ann Marsh (p. 3)." in shown
    assert beside(path) == ["sessions.sqlite"], "no -wal or -shm left beside it"


def test_a_turn_another_connection_has_not_checkpointed_is_read(saved):
    path, session_id = saved
    other = sqlite3.connect(path)  # the chat app, open: its writes sit in the WAL until it closes
    try:
        other.execute("PRAGMA journal_mode=WAL")
        other.execute("UPDATE turns SET answer = 'Ann Marsh, since 1987 (p. 3).'")
        other.commit()
        assert (path.parent / "sessions.sqlite-wal").exists()
        _, shown = read_both(session_id)
        assert "since 1987" in shown
    finally:
        other.close()
    assert beside(path) == ["sessions.sqlite"]
