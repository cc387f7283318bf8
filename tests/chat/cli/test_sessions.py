"""The sessions store (SQLite), transcripts, and the settings file."""

import os
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from locks_chat.cli import app
from locks_chat.sessions import STDIN_PATH, SessionStore, SessionStoreError, file_hash
from locks_chat.paths import config_dir, data_dir, settings_path
from locks_chat.settings import Settings, load_settings, save_settings
from locks_chat.transcript import export_transcript, render_transcript


@pytest.fixture
def book(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("Some text.", encoding="utf-8")
    return path


def test_one_session_per_document_path_and_content(book):
    store = SessionStore()
    first = store.open_session(str(book), file_hash(book), "book", "1-3")
    assert store.open_session(str(book), file_hash(book), "book", None).id == first.id
    assert store.open_session(str(book), file_hash(book), "book", None, new=True).id != first.id
    book.write_text("Edited text.", encoding="utf-8")
    edited = store.open_session(str(book), file_hash(book), "book", None)
    assert edited.id not in (first.id,) and len(store.list_sessions()) == 3
    assert store.get(first.id).pages == "1-3"


def test_latest_finds_a_document_by_path_and_content_or_by_content_alone(book, tmp_path):
    store = SessionStore()
    digest = file_hash(book)
    assert store.latest(digest) is None
    piped = store.open_session(STDIN_PATH, digest, "piped", None)
    assert piped.doc_path == STDIN_PATH, "standard input is no path to resolve"
    assert store.latest(digest, str(book)) is None and store.latest(digest, STDIN_PATH).id == piped.id
    by_file = store.open_session(str(book), digest, "book", None)
    store.begin_turn(piped.id, "Q?")  # the piped session is now the latest written
    assert store.latest(digest).id == piped.id and store.latest(digest, str(book)).id == by_file.id
    assert store.latest("0" * 64) is None


def test_turns_are_written_as_they_happen_and_survive_reopening(book, user_home):
    store = SessionStore()
    session = store.open_session(str(book), file_hash(book), "book", None)
    done = store.begin_turn(session.id, "Q1?")
    store.save_turn(done, "A1 (p. 1).", "done", [{"page": "1", "physical": 1}], {"generated_tokens": 4})
    cut = store.begin_turn(session.id, "Q2?")
    store.save_turn(cut, "A2 so f")
    cancelled = store.begin_turn(session.id, "Q3?")
    store.save_turn(cancelled, "A3", "cancelled")
    turns = SessionStore(user_home / "data" / "sessions.sqlite").turns(session.id)
    assert [(t.question, t.answer, t.status) for t in turns] == [
        ("Q1?", "A1 (p. 1).", "done"), ("Q2?", "A2 so f", "interrupted"), ("Q3?", "A3", "cancelled")
    ]
    assert turns[0].citations == [{"page": "1", "physical": 1}] and turns[0].stats == {"generated_tokens": 4}
    assert store.list_sessions()[0].turns == 3


def test_delete_removes_the_turns_too(book):
    store = SessionStore()
    session = store.open_session(str(book), file_hash(book), "book", None)
    store.begin_turn(session.id, "Q?")
    assert store.delete(session.id) and not store.delete(session.id)
    with sqlite3.connect(store.path) as db:
        assert db.execute("SELECT COUNT(*) FROM turns").fetchone() == (0,)


def test_session_ids_are_never_reused(book):
    store = SessionStore()
    first = store.open_session(str(book), "h1", "a", None, new=True)
    second = store.open_session(str(book), "h1", "a", None, new=True)
    assert store.delete(second.id)
    third = store.open_session(str(book), "h1", "a", None, new=True)
    assert third.id > second.id > first.id
    assert store.current(first) == store.get(first.id) and store.current(second) is None


def test_a_session_deleted_meanwhile_is_not_current_where_an_older_database_reuses_its_id(book, tmp_path):
    """A database made before ids were never reused (no AUTOINCREMENT) gives a deleted session's id to the next
    session: ``current`` tells them apart by their creation time, and an ``ask`` that continued the deleted
    session saves its turn in a new session of its own document, not in the other document's."""
    from locks_chat.cli.followup import DocumentInput
    from locks_chat.conversation import Conversation, DocumentKey
    from locks_chat.ingest import load_document
    from locks_chat.sessions import SCHEMA

    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA.replace(" AUTOINCREMENT", ""))
    store = SessionStore(path)
    other = tmp_path / "other.txt"
    other.write_text("Other text.", encoding="utf-8")
    data = book.read_bytes()
    doc = DocumentInput(data, str(book), book)
    mine = store.open_session(str(book), doc.digest, "book", None, new=True)
    conversation = Conversation(store, DocumentKey(doc.doc_path, doc.digest, book.stem), mine, None, continued=True)
    assert store.delete(mine.id)
    theirs = store.open_session(str(other), file_hash(other), "other", None, new=True)
    assert theirs.id == mine.id, "the older schema reuses the id (what this test is about)"
    assert store.current(mine) is None and store.current(theirs) == store.get(theirs.id)
    conversation.save(None, "q about book", load_document(book), "a", "done", [], {})
    assert conversation.session.id != theirs.id and conversation.session.doc_hash == doc.digest
    assert [t.question for t in store.turns(theirs.id)] == []
    assert [t.question for t in store.turns(conversation.session.id)] == ["q about book"]


class _LockedWal:
    """A connection whose first ``fails`` switches to WAL say "database is locked" at once, as SQLite does while
    another process switches a new database."""

    def __init__(self, db, state):
        self.db, self.state = db, state

    def execute(self, sql, *args):
        if sql == "PRAGMA journal_mode=WAL" and self.state["fails"] > 0:
            self.state["fails"] -= 1
            err = sqlite3.OperationalError("database is locked")
            err.sqlite_errorname = "SQLITE_BUSY"
            raise err
        return self.db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.db, name)

    def __enter__(self):
        return self.db.__enter__()

    def __exit__(self, *exc):
        return self.db.__exit__(*exc)


@pytest.mark.parametrize("fails, wait_s, opens", [(3, 10.0, True), (10**6, 0.3, False)], ids=["retried", "held"])
def test_two_first_runs_switching_a_new_database_to_wal_wait_for_each_other(monkeypatch, tmp_path, fails, wait_s,
                                                                            opens):
    from locks_chat import sessions

    real, state = sqlite3.connect, {"fails": fails}
    monkeypatch.setattr(sessions.sqlite3, "connect", lambda *a, **k: _LockedWal(real(*a, **k), state))
    monkeypatch.setattr(sessions, "LOCK_WAIT_S", wait_s)
    if opens:
        store = SessionStore(tmp_path / "new.sqlite")
        assert state["fails"] == 0 and store.list_sessions() == []
    else:
        with pytest.raises(SessionStoreError, match="locked"):
            SessionStore(tmp_path / "new.sqlite")


def test_ids_past_sqlite_integers_are_no_sessions(book):
    store = SessionStore()
    store.open_session(str(book), file_hash(book), "book", None)
    huge = 10**20
    assert store.get(huge) is None and store.turns(huge) == [] and not store.delete(huge)
    assert len(store.list_sessions()) == 1


def test_a_file_name_that_is_not_utf8_is_stored_and_found_again(tmp_path):
    book = Path(os.fsdecode(bytes(tmp_path) + b"/bad\xffname\n.txt"))
    book.write_text("Some text.", encoding="utf-8")
    store = SessionStore()
    session = store.open_session(str(book), file_hash(book), book.stem, None)
    assert session.doc_path.endswith("bad\\xffname\n.txt") and session.title == "bad\\xffname\\n"
    assert store.open_session(str(book), file_hash(book), book.stem, None).id == session.id
    assert store.latest(file_hash(book), str(book)).id == session.id
    turn = store.begin_turn(session.id, "Q\udcff?")
    store.save_turn(turn, "A.", "done")
    assert [t.question for t in store.turns(session.id)] == ["Q\\xff?"]


def test_a_turn_whose_json_was_damaged_is_one_line(book):
    store = SessionStore()
    session = store.open_session(str(book), file_hash(book), "book", None)
    store.save_turn(store.begin_turn(session.id, "Q?"), "A.", "done")
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE turns SET citations = 'not json'")
    with pytest.raises(SessionStoreError, match="not a readable sessions database .*move it aside"):
        store.turns(session.id)
    line = one_error_line(runner.invoke(app, ["sessions", "show", str(session.id)]))
    assert "not a readable sessions database" in line


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("args", [["sessions", "show", "1"], ["sessions", "list", "--json"]], ids=["show", "list"])
def test_a_transcript_to_a_full_disk_is_one_line(book, user_home, args):
    import subprocess
    import sys

    store = SessionStore()
    session = store.open_session(str(book), file_hash(book), "book", None)
    store.save_turn(store.begin_turn(session.id, "Q?"), "A. " * 5000, "done")
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "locks_chat.cli", *args], stdout=full,
                                stderr=subprocess.PIPE, text=True, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines() == [
        "error: cannot write the output (No space left on device); free space or write elsewhere, then run again"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("args", [["--help"], ["--version"], ["ask", "--help"]], ids=["help", "version", "ask-help"])
def test_help_and_version_to_a_full_disk_are_one_line(user_home, args):
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "locks_chat.cli", *args], stdout=full,
                                stderr=subprocess.PIPE, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr.splitlines() == [
        "error: cannot write the output (No space left on device); free space or write elsewhere, then run again"]


@pytest.mark.parametrize("args", [["sessions", "show", "1"], ["--help"], ["ask", "--help"]],
                         ids=["show", "help", "ask-help"])
def test_a_reader_that_goes_away_ends_with_exit_141(book, user_home, args):
    """``| head -c 10``: 128 + SIGPIPE, as a shell reports for ``yes | head``; a transcript far larger than the
    pipe's buffer too (CPython's buffered writer let the broken pipe pass in one large write: exit 0)."""
    import subprocess
    import sys

    store = SessionStore()
    session = store.open_session(str(book), file_hash(book), "book", None)
    store.save_turn(store.begin_turn(session.id, "Q?"), "A long answer. " * 100_000, "done")
    reader = subprocess.Popen(["head", "-c", "10"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    result = subprocess.run([sys.executable, "-m", "locks_chat.cli", *args], stdout=reader.stdin,
                            stderr=subprocess.PIPE, text=True, timeout=60)
    reader.stdin.close()
    reader.wait(timeout=10)
    assert result.returncode in (141, -13) and "Traceback" not in result.stderr, (result.returncode, result.stderr)


GARBAGE = b"\x00\xffthis is no SQLite database\n" * 200
runner = CliRunner()


@pytest.fixture
def corrupt_db(user_home):
    db = user_home / "data" / "sessions.sqlite"
    db.parent.mkdir(parents=True)
    db.write_bytes(GARBAGE)
    return db


@pytest.fixture
def app_not_run(monkeypatch):
    """The chat command up to the app's start: the app is recorded, not run (CliRunner has no terminal)."""
    from locks_chat.tui.app import LocksChatApp

    started = []
    monkeypatch.setattr(LocksChatApp, "run", lambda self, *args, **kwargs: started.append(self))
    monkeypatch.setattr(LocksChatApp, "return_code", None, raising=False)
    monkeypatch.setattr("locks_chat.cli.chat.terminal_attached", lambda: True, raising=False)
    return started


def one_error_line(result) -> str:
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    [line] = result.stderr.splitlines()
    return line


@pytest.mark.parametrize("args", [["list"], ["list", "--json"], ["show", "1"], ["delete", "1"]],
                         ids=["list", "list-json", "show", "delete"])
def test_a_corrupt_database_is_one_line_for_the_sessions_commands(corrupt_db, args):
    line = one_error_line(runner.invoke(app, ["sessions", *args]))
    assert str(corrupt_db) in line and "not a readable sessions database" in line and "move it aside" in line
    assert corrupt_db.read_bytes() == GARBAGE and os.listdir(corrupt_db.parent) == ["sessions.sqlite"]


def test_a_corrupt_database_is_one_line_before_the_chat_app_starts(corrupt_db, book, app_not_run):
    line = one_error_line(runner.invoke(app, ["chat", str(book)]))
    assert str(corrupt_db) in line and "not a readable sessions database" in line and "move it aside" in line
    assert not app_not_run and corrupt_db.read_bytes() == GARBAGE


def test_a_database_that_cannot_be_created_is_one_line_before_the_chat_app_starts(user_home, book, app_not_run):
    db = user_home / "data" / "sessions.sqlite"
    db.mkdir(parents=True)  # a folder where the file must be: SQLite cannot open it (whoever runs the tests)
    line = one_error_line(runner.invoke(app, ["chat", str(book)]))
    assert str(db) in line and "cannot open or write the sessions database" in line and "LOCKS_CHAT_HOME" in line
    assert not app_not_run


def test_a_data_directory_that_cannot_be_searched_is_one_line_for_the_sessions_commands(monkeypatch):
    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr("pathlib.Path.is_file", denied)  # what a data folder without x permission gives (not root)
    line = one_error_line(runner.invoke(app, ["sessions", "list"]))
    assert "sessions.sqlite: cannot read the sessions database (Permission denied)" in line


def test_another_programs_sqlite_file_is_not_a_sessions_database(user_home):
    db = user_home / "data" / "sessions.sqlite"
    db.parent.mkdir(parents=True)
    with sqlite3.connect(db) as other:
        other.execute("CREATE TABLE sessions (cookie TEXT)")
    other.close()
    with pytest.raises(SessionStoreError, match=r"not a readable sessions database .*move it aside"):
        SessionStore()


@pytest.mark.parametrize("under", ["data", "data/deeper"], ids=["file-is-the-folder", "file-above-the-folder"])
def test_a_data_directory_blocked_by_a_file_is_a_user_error(user_home, under):
    user_home.mkdir()
    (user_home / "data").write_text("")
    with pytest.raises(SessionStoreError, match=r"cannot create the data directory .*move that file aside"):
        SessionStore(user_home / under / "sessions.sqlite")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
@pytest.mark.parametrize(
    "read_only, message",
    [("home", "cannot create the data directory (Permission denied); make its parent writable"),
     ("data", "cannot open or write the sessions database")],
    ids=["data-folder-to-create", "data-folder"],
)
def test_a_read_only_data_directory_is_a_user_error(user_home, read_only, message):
    folder = user_home / read_only
    folder.mkdir(parents=True)
    folder.chmod(0o555)
    try:
        with pytest.raises(SessionStoreError, match="LOCKS_CHAT_HOME") as err:
            SessionStore()
    finally:
        folder.chmod(0o755)
    assert message in err.value.message


@pytest.mark.parametrize("setting", [{"attention": {"dense": False, "budget": 512, "rank": 8}},
                                     {"mode": "LOCKS budget 512, rank 8"}], ids=["numbers", "older_text"])
def test_transcript_has_questions_answers_citations_and_states(book, tmp_path, setting):
    """Turns keep the attention setting's numbers; sessions saved before kept its text: both read the same."""
    store = SessionStore()
    session = store.open_session(str(book), file_hash(book), "My Book", "2-3")
    turn = store.begin_turn(session.id, "Who?")
    store.save_turn(turn, "Ann (p. 2) and Bo (p. 9).", "done",
                    [{"page": "2", "physical": 2}, {"page": "9", "physical": None}],
                    {"generated_tokens": 9, "ttft_ms": 1500.0, "tpot_ms": 80.0, "decode_steps": 9,
                     "kv_pages_read_fraction": 0.25, **setting})
    store.save_turn(store.begin_turn(session.id, "Why?"), "Because", "cancelled", None,
                    setting)  # as a cancelled ask saves it: no token count
    text = render_transcript(store.get(session.id), store.turns(session.id))
    assert text.startswith("# My Book (pages 2-3)")
    assert "<sub>LOCKS budget 512, rank 8</sub>" in text and "0 tokens" not in text
    assert "## Q1. Who?" in text and "Cited: p. 2, p. 9 (not in the selected pages)" in text
    assert "TTFT 1.5 s · TPOT 80 ms · read 25% of KV pages · LOCKS budget 512, rank 8" in text
    assert "## Q2. Why?" in text and "*(cancelled: the answer stops here)*" in text
    path = export_transcript(store.get(session.id), store.turns(session.id), tmp_path / "out")
    again = export_transcript(store.get(session.id), store.turns(session.id), tmp_path / "out")
    assert path != again and path.read_text() == text and path.name.startswith("My-Book-")


def test_export_that_cannot_be_written_is_one_error_and_leaves_nothing(book, tmp_path, monkeypatch):
    from locks_chat.errors import LocksChatError

    store = SessionStore()
    session = store.open_session(str(book), file_hash(book), "My Book", None)
    store.save_turn(store.begin_turn(session.id, "Who?"), "Ann", "done")
    blocked = tmp_path / "exports"
    blocked.write_text("a file where the folder goes")
    with pytest.raises(LocksChatError, match=r"cannot write the transcript to .*exports \(File exists\)"):
        export_transcript(store.get(session.id), store.turns(session.id), blocked)
    folder = tmp_path / "full"
    real_open = Path.open

    def full_disk(self, mode="r", *args, **kwargs):
        handle = real_open(self, mode, *args, **kwargs)
        if "x" in mode:
            handle.write = lambda text: (_ for _ in ()).throw(OSError(28, "No space left on device"))
        return handle

    monkeypatch.setattr(Path, "open", full_disk)
    with pytest.raises(LocksChatError, match="No space left on device"):
        export_transcript(store.get(session.id), store.turns(session.id), folder)
    assert list(folder.iterdir()) == []


def test_transcript_and_list_cannot_drive_the_terminal(book, tmp_path):
    store = SessionStore()
    session = store.open_session(str(book), file_hash(book), "[red]Book\x1b]0;owned\x07", None)
    store.save_turn(store.begin_turn(session.id, "Who?\nWhere?"), "Ann\x1b[31m (p. 2).\n\tBo\rX", "done")
    text = render_transcript(store.get(session.id), store.turns(session.id))
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text
    assert text.startswith("# [red]Book\\x1b]0;owned\\x07\n")
    assert "## Q1. Who?\\nWhere?\n" in text and "Ann\\x1b[31m (p. 2).\n\tBo\\x0dX" in text
    listed = runner.invoke(app, ["sessions", "list"]).stdout
    assert "[red]Book" in listed and "\x1b" not in listed


def test_user_directories_follow_locks_chat_home(user_home):
    assert config_dir() == user_home / "config" and data_dir() == user_home / "data"
    assert settings_path() == user_home / "config" / "settings.toml"


def test_a_home_with_an_unknown_user_is_one_line(monkeypatch):
    monkeypatch.setenv("LOCKS_CHAT_HOME", "~no-such-user-here/locks")
    line = one_error_line(runner.invoke(app, ["sessions", "list"]))
    assert line == ("error: LOCKS_CHAT_HOME=~no-such-user-here/locks: no such user's home to expand ~ into; set it "
                    "to a directory path")


def test_settings_round_trip_and_overrides():
    assert load_settings() == (Settings(), [])
    path = save_settings(Settings(budget=512, dense=True, model="some/model"))
    settings, warnings = load_settings()
    assert path == settings_path() and warnings == []
    assert (settings.budget, settings.dense, settings.model, settings.rank) == (512, True, "some/model", 8)
    assert settings.with_overrides(budget=None, rank=4).rank == 4
    assert settings.with_overrides(budget=None).budget == 512


@pytest.mark.parametrize(
    "text, warning",
    [("budget = 'big'\n", "budget = 'big' is not allowed (a whole number above 0)"),
     ("colour = 1\n", "unknown setting 'colour'"), ("budget = [\n", "unreadable"),
     ("dense = 1\n", "dense = 1 is not allowed (true or false)"),
     ("context = 10\n", "context = 10 is not allowed (tokens, at least 256)"),
     ("kv_cache_gib = inf\n", "kv_cache_gib = inf is not allowed (a number of GiB, at least 0.1)"),
     ("model = ' '\n", "model = ' ' is not allowed (a model directory or hub id)")],
    ids=["wrong-type", "unknown", "not-toml", "int-for-bool", "tiny-context", "infinite-kv-cache", "blank-model"],
)
def test_a_bad_settings_file_gives_defaults_and_a_warning(text, warning):
    settings_path().parent.mkdir(parents=True)
    settings_path().write_text(text)
    settings, warnings = load_settings()
    assert settings == Settings() and len(warnings) == 1 and warning in warnings[0]


@pytest.mark.parametrize(
    "text, kept, warning",
    [("rank = 99\nbudget = 512\n", {"budget": 512, "rank": 8}, "rank = 99 refused"),
     ("budget = 16\nrank = 4\n", {"budget": 2048, "rank": 4}, "budget = 16 refused"),
     # the backend's int32 superpage count overflowed at such a budget, in the engine, after its start
     ("budget = 99999999999999999999999\nrank = 4\n", {"budget": 2048, "rank": 4},
      "refused (budget=99999999999999999999999 tokens is more than any context holds: allowed budget <= 16777216")],
    ids=["rank-past-page", "budget-under-forced-pages", "budget-past-any-context"],
)
def test_a_locks_value_the_engine_refuses_falls_back_to_its_default_naming_the_file(text, kept, warning):
    settings_path().parent.mkdir(parents=True)
    settings_path().write_text(text)
    settings, warnings = load_settings()
    assert {k: getattr(settings, k) for k in kept} == kept
    assert len(warnings) == 1 and warnings[0].startswith(str(settings_path())) and warning in warnings[0]
    assert settings.locks.budget == settings.budget and settings.locks.rank == settings.rank  # what is left is valid


def test_settings_locks_refuses_are_user_errors():
    from locks_chat.errors import LocksChatError

    with pytest.raises(LocksChatError, match="rank=20"):
        Settings(rank=20)
    # ``/budget N`` in the chat app: ``with_overrides``
    with pytest.raises(LocksChatError, match="budget=16777217 tokens is more than any context holds"):
        Settings().with_overrides(budget=2**24 + 1)
    assert Settings().with_overrides(budget=2**24).locks.budget == 2**24


@pytest.mark.parametrize(
    "older, numbers",
    [("LOCKS budget 2048, rank 8", {"dense": False, "budget": 2048, "rank": 8}),
     ("dense", {"dense": True, "budget": None, "rank": None})],
    ids=["locks", "dense"],
)
def test_a_turn_saved_with_the_older_attention_text_reads_as_its_numbers(book, older, numbers):
    """Sessions saved before turns kept the numbers stored the text ``mode``: read back as the same setting,
    shown as the same text; a turn that records no setting shows none."""
    from locks_chat.attention import Attention, attention_text

    store = SessionStore()
    session = store.open_session(str(book), file_hash(book), "My Book", None)
    store.save_turn(store.begin_turn(session.id, "Who?"), "Ann", "done", [], {"mode": older})
    [turn] = store.turns(session.id)
    assert Attention.from_stats(turn.stats).to_json() == numbers
    assert attention_text(turn.stats) == older == Attention(**numbers).text()
    assert Attention.from_stats({}) is None and attention_text({}, "-") == "-"
