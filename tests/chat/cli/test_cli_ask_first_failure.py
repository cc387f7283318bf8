"""A failed ``locks-chat ask`` leaves the sessions database as it found it: a first ask that fails (after the store
was opened) leaves no empty ``sessions.sqlite`` nor the folders made for it; a database that existed before is
never removed or changed, even one that holds no session yet."""

import sqlite3

import pytest
from typer.testing import CliRunner

import locks_chat.engine_client
from locks_chat.cli import app
from locks_chat.errors import EngineError
from locks_chat.sessions import SessionStore, file_hash
from tests.support.fakes import FakeEngine

runner = CliRunner()


@pytest.fixture
def book(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("The keeper's password is BLUE.\n", encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def engine_fails_to_start(monkeypatch):
    """No early token count; an engine start fails as vLLM's does (exit 3), without starting one."""
    monkeypatch.setattr(locks_chat.engine_client, "open_tokenizer", lambda *args, **kwargs: None)

    def open_engine(*args, **kwargs):
        raise EngineError("the engine failed to start: scripted")

    monkeypatch.setattr(locks_chat.engine_client, "open_engine", open_engine)


def picture(book):
    book.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    return []


FAILURES = {
    "unreadable-document": (picture, 2),
    "pages-out-of-range": (lambda book: ["--pages", "99"], 2),
    "continue-without-a-session": (lambda book: ["--continue"], 2),
    "engine-start-fails": (lambda book: [], 3),
}


@pytest.mark.parametrize("failure", FAILURES.values(), ids=FAILURES.keys())
def test_a_failed_first_ask_leaves_no_sessions_database(book, user_home, failure):
    extra, code = failure
    result = runner.invoke(app, ["ask", str(book), "What is the password?", *extra(book)])
    assert result.exit_code == code and "Traceback" not in result.output, result.output
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert not user_home.exists(), sorted(user_home.rglob("*"))


@pytest.mark.parametrize("sessions", [0, 1], ids=["no-session-yet", "one-session"])
@pytest.mark.parametrize("failure", FAILURES.values(), ids=FAILURES.keys())
def test_a_failed_ask_keeps_the_database_that_was_there(book, sessions, failure):
    store = SessionStore()
    if sessions:
        store.open_session("elsewhere.txt", "0" * 64, "elsewhere", None)
    before = store.path.read_bytes()
    extra, code = failure
    result = runner.invoke(app, ["ask", str(book), "What is the password?", *extra(book)])
    assert result.exit_code == code, result.output
    assert store.path.read_bytes() == before
    assert len(SessionStore().list_sessions()) == sessions


def test_a_successful_first_ask_keeps_its_session(book, monkeypatch):
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", lambda *args, **kwargs: FakeEngine(answer="BLUE."))
    result = runner.invoke(app, ["ask", str(book), "What is the password?"])
    assert result.exit_code == 0, result.output
    [session] = SessionStore().list_sessions()
    assert session.doc_hash == file_hash(book) and session.turns == 1


def test_a_database_another_process_has_open_is_kept(tmp_path):
    path = tmp_path / "data" / "sessions.sqlite"
    store = SessionStore(path)
    other = sqlite3.connect(path)  # open in WAL mode: its -wal file exists while it is open
    other.execute("SELECT COUNT(*) FROM sessions").fetchone()
    try:
        with pytest.raises(KeyError), store.removed_unless_used():
            raise KeyError("failed")
        assert path.exists()
    finally:
        other.close()
    with pytest.raises(KeyError), store.removed_unless_used():
        raise KeyError("failed")
    assert not path.exists() and not path.parent.exists() and tmp_path.exists()


def test_a_store_whose_new_database_another_process_removed_makes_it_again(tmp_path):
    path = tmp_path / "data" / "sessions.sqlite"
    failed, kept = SessionStore(path), SessionStore(path)  # two first runs; the first made the file
    with pytest.raises(KeyError), failed.removed_unless_used():
        raise KeyError("failed")
    assert not path.exists() and not kept.created
    session = kept.open_session("book.txt", "0" * 64, "book", None)
    assert [s.id for s in SessionStore(path).list_sessions()] == [session.id]
