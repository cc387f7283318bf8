"""The sessions store (SQLite), transcripts, and the settings file."""

import sqlite3

import pytest

from locks_chat.sessions import SessionStore, file_hash
from locks_chat.settings import Settings, config_dir, data_dir, load_settings, save_settings, settings_path
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


def test_ids_past_sqlite_integers_are_no_sessions(book):
    store = SessionStore()
    store.open_session(str(book), file_hash(book), "book", None)
    huge = 10**20
    assert store.get(huge) is None and store.turns(huge) == [] and not store.delete(huge)
    assert len(store.list_sessions()) == 1


def test_transcript_has_questions_answers_citations_and_states(book, tmp_path):
    store = SessionStore()
    session = store.open_session(str(book), file_hash(book), "My Book", "2-3")
    turn = store.begin_turn(session.id, "Who?")
    store.save_turn(turn, "Ann (p. 2) and Bo (p. 9).", "done",
                    [{"page": "2", "physical": 2}, {"page": "9", "physical": None}],
                    {"generated_tokens": 9, "ttft_ms": 1500.0, "tpot_ms": 80.0, "decode_steps": 9,
                     "kv_pages_read_fraction": 0.25, "mode": "LOCKS budget 512, rank 8"})
    store.save_turn(store.begin_turn(session.id, "Why?"), "Because", "cancelled")
    text = render_transcript(store.get(session.id), store.turns(session.id))
    assert text.startswith("# My Book (pages 2-3)")
    assert "## Q1. Who?" in text and "Cited: p. 2, p. 9 (not in the selected pages)" in text
    assert "TTFT 1.5 s · TPOT 80 ms · read 25% of KV pages · LOCKS budget 512, rank 8" in text
    assert "## Q2. Why?" in text and "*(cancelled: the answer stops here)*" in text
    path = export_transcript(store.get(session.id), store.turns(session.id), tmp_path / "out")
    again = export_transcript(store.get(session.id), store.turns(session.id), tmp_path / "out")
    assert path != again and path.read_text() == text and path.name.startswith("My-Book-")


def test_user_directories_follow_locks_chat_home(user_home):
    assert config_dir() == user_home / "config" and data_dir() == user_home / "data"
    assert settings_path() == user_home / "config" / "settings.toml"


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
    [("budget = 'big'\n", "budget = 'big' has the wrong type"), ("colour = 1\n", "unknown setting 'colour'"),
     ("budget = [\n", "unreadable"), ("dense = 1\n", "dense = 1 has the wrong type")],
    ids=["wrong-type", "unknown", "not-toml", "int-for-bool"],
)
def test_a_bad_settings_file_gives_defaults_and_a_warning(text, warning):
    settings_path().parent.mkdir(parents=True)
    settings_path().write_text(text)
    settings, warnings = load_settings()
    assert settings == Settings() and len(warnings) == 1 and warning in warnings[0]


def test_settings_locks_refuses_are_user_errors():
    from locks_chat.errors import LocksChatError

    with pytest.raises(LocksChatError, match="rank=20"):
        Settings(rank=20).locks_config()
