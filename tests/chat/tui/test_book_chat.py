"""The work behind the chat screen, without the UI: history that does not fit, no engine, closing mid-answer."""

import threading

import pytest

from locks_chat.engine_client import ModelTokenizer
from locks_chat.errors import Cancelled, ContextError, EngineError
from locks_chat.sessions import SessionStore
from locks_chat.settings import Settings
from locks_chat.tui.book_chat import BookChat, ChatOptions
from tests.support.fakes import FakeEngine, WordTokenizer
from tests.support.tui_support import Factory, GatedEngine, write_book


def opened(tmp_path, engine, **settings) -> BookChat:
    chat = BookChat(write_book(tmp_path), ChatOptions(settings=Settings(**settings)), Factory(engine))
    chat.open_session()
    chat.load(None)
    chat.start_engine()
    return chat


def ask(chat: BookChat, question: str, cancel: threading.Event | None = None):
    ignore = lambda *_: None  # noqa: E731
    return chat.answer(question, cancel or threading.Event(), ignore, ignore, ignore)


def test_earlier_turns_that_do_not_fit_are_left_out_oldest_first(tmp_path):
    engine = FakeEngine(answer=" ".join(f"w{i}" for i in range(150)))  # not one word 150 times: a loop
    chat = opened(tmp_path, engine, max_tokens=160)
    ask(chat, "First?")
    alone = len(engine.prompts[-1])
    engine.max_context = alone + 700  # room for one earlier turn (~300 tokens) and the answer, not two
    ask(chat, "Second?")
    with_one = len(engine.prompts[-1])
    assert with_one > alone + 150, "the first turn went back in as history"
    ask(chat, "Third?")
    assert len(engine.prompts[-1]) < with_one + 160, "the oldest turn was dropped to fit"
    assert [t.status for t in chat.turns] == ["done"] * 3


def test_no_engine_is_an_engine_error_and_no_turn(tmp_path):
    chat = opened(tmp_path, FakeEngine())
    chat.close()
    with pytest.raises(EngineError, match="not running"):
        ask(chat, "Anyone?")
    assert SessionStore().turns(chat.session.id) == []


def test_close_lets_a_cancelled_answer_be_saved_before_the_engine_goes(tmp_path):
    engine = GatedEngine(answer="one two three")
    chat = opened(tmp_path, engine)
    cancel = threading.Event()
    errors = []

    def run():
        try:
            ask(chat, "Count?", cancel)
        except Cancelled as err:
            errors.append(err)

    worker = threading.Thread(target=run)
    worker.start()
    engine.release(1)
    assert engine.in_prefill.wait(5)
    cancel.set()
    chat.close()
    worker.join(5)
    assert errors and engine.closed
    assert SessionStore().turns(chat.session.id)[0].status == "cancelled"


def test_timings_of_the_slow_phases_are_kept_for_the_next_etas(tmp_path):
    from locks_chat.tui.timings import load_timings, timings_path

    assert load_timings().engine_start_s is None
    chat = opened(tmp_path, FakeEngine())
    ask(chat, "Hello?")
    timings = load_timings()
    assert timings.engine_start_s is not None
    timings_path().write_text('{"engine_start_s": 42.0, "prefill_tokens_per_s": null, "other": 1}')
    assert load_timings().engine_start_s == 42.0
    timings_path().write_text("{not json")
    assert load_timings().engine_start_s is None


def test_a_document_that_cannot_fit_is_refused_before_the_engine_starts(tmp_path):
    calls = []

    def counted(model, max_model_len):
        calls.append((model, max_model_len))
        return ModelTokenizer(WordTokenizer(), 300)

    factory = Factory()
    settings = Settings(context=300, max_tokens=64)
    chat = BookChat(write_book(tmp_path), ChatOptions(settings=settings), factory, tokenizer_factory=counted)
    chat.open_session()
    chat.load(None)
    with pytest.raises(ContextError, match="do not fit the 300-token context; pass --pages"):
        chat.check_fits()
    chat.load("1")
    chat.check_fits("What is the password?")
    assert calls == [(None, 300)] and factory.calls == []


def test_a_scripted_engine_is_not_checked_with_the_real_models_tokenizer(tmp_path):
    chat = BookChat(write_book(tmp_path), ChatOptions(), Factory(FakeEngine(max_context=10)))
    chat.open_session()
    chat.load(None)
    chat.check_fits()
    assert chat.tokenizer_factory is None


def test_the_status_names_the_dtype_the_engine_chose(tmp_path):
    """The CPU engine runs float32 where the CPU has no native bf16: the status line and each answer's
    statistics say which dtype ran; an engine that does not say leaves both out."""
    (tmp_path / "quiet").mkdir()
    (tmp_path / "f32").mkdir()
    quiet = opened(tmp_path / "quiet", FakeEngine())
    assert quiet.model_name() == "Qwen2.5-Coder-0.5B-Instruct (built-in)"
    engine = FakeEngine()
    engine.dtype = "float32"
    chat = opened(tmp_path / "f32", engine)
    assert chat.model_name() == "Qwen2.5-Coder-0.5B-Instruct (built-in), float32"
    assert ask(chat, "What is the password?").to_json(chat.document)["stats"]["dtype"] == "float32"


def test_a_session_deleted_from_another_terminal_goes_on_as_a_new_one(tmp_path):
    """``locks-chat sessions delete N`` while the chat app has N open: the next answer is saved in a new session
    of the same book, said once; ``/export`` writes what the window holds; closing deletes no other session."""
    chat = opened(tmp_path, FakeEngine())
    ask(chat, "First?")
    store, gone = SessionStore(), chat.session
    assert store.delete(gone.id)
    transcript = chat.export().read_text(encoding="utf-8")
    assert "First?" in transcript, "the deleted session's turns as the window holds them"
    ask(chat, "Second?")
    assert chat.session.id != gone.id and chat.session.doc_hash == gone.doc_hash
    assert [t.question for t in store.turns(chat.session.id)] == ["Second?"]
    notice = chat.take_notice()
    assert notice and f"Session {gone.id} was deleted" in notice and f"session {chat.session.id}" in notice
    assert chat.take_notice() is None, "said once"
    ask(chat, "Third?")
    assert [t.question for t in store.turns(chat.session.id)] == ["Second?", "Third?"]
    assert "Third?" in chat.export().read_text(encoding="utf-8")


def test_closing_a_window_whose_session_was_deleted_leaves_the_others(tmp_path):
    chat = BookChat(write_book(tmp_path), ChatOptions(), Factory(FakeEngine()))
    chat.open_session()
    store = SessionStore()
    assert store.delete(chat.session.id)
    other = store.open_session(str(tmp_path / "other.txt"), "h" * 64, "other", None, new=True)
    chat.load(None)
    chat.close()
    assert store.get(other.id) == other
