"""``locks-chat ask --continue`` / ``--session N`` / ``-`` through Typer's CliRunner with a scripted engine: saved
sessions shared with the chat app, earlier turns in the prompt, prefix-cache hits in the footer and the JSON."""

import hashlib
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import locks_chat.engine_client
from locks_chat.attention import attention_text
from locks_chat.cli import app
from locks_chat.engine_client import ModelTokenizer
from locks_chat.errors import DocumentError
from locks_chat.cli.followup import read_input
from locks_chat.ingest import load_document, load_document_bytes
from locks_chat.prompt import build_prompt
from locks_chat.sessions import STDIN_PATH, SessionStore, file_hash
from tests.support.fakes import FakeEngine, WordTokenizer

runner = CliRunner()
ANSWER = "The password is BLUE (p. 1)."
NOTES = "# Harbour notes\n\nThe ferry leaves at nine. The keeper's dog is called Biscuit.\n"


@pytest.fixture
def book(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("The keeper's password is BLUE.\n\n" + "Filler text about the sea. " * 50, encoding="utf-8")
    return path


@pytest.fixture
def other(tmp_path):
    path = tmp_path / "other.txt"
    path.write_text("A different book about mountains and goats.", encoding="utf-8")
    return path


class Tokenizer:
    """``open_tokenizer`` without a model; ``max_context`` 0: no early count (the engine's count decides)."""

    def __init__(self) -> None:
        self.max_context = 0

    def __call__(self, model, max_model_len, convert=True):
        return ModelTokenizer(WordTokenizer(), self.max_context) if self.max_context else None


@pytest.fixture(autouse=True)
def tokenizer(monkeypatch):
    counter = Tokenizer()
    monkeypatch.setattr(locks_chat.engine_client, "open_tokenizer", counter)
    return counter


@pytest.fixture
def engine(monkeypatch):
    """One scripted engine for every ask of a test, with a prefix cache of 16-token blocks."""
    fake = FakeEngine(answer=ANSWER, bins_per_step=[list(range(0, 40))], prefix_block=16)
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", lambda model, locks, max_model_len=None, kv_cache_gib=None: fake)
    return fake


def engine_started(*args, **kwargs):
    pytest.fail("the engine was started")


def ask(*args, input=None):
    return runner.invoke(app, ["ask", *map(str, args)], input=input)


def test_ask_saves_a_session_the_chat_app_resumes(book, engine):
    result = ask(book, "What is the password?")
    assert result.exit_code == 0, result.output
    [session] = SessionStore().list_sessions()
    [turn] = SessionStore().turns(session.id)
    assert (turn.question, turn.answer, turn.status) == ("What is the password?", ANSWER, "done")
    assert [(c["page"], c["physical"], c["verified"]) for c in turn.citations] == [("1", 1, True)]
    assert turn.stats["attention"] == {"dense": False, "budget": 2048, "rank": 8}
    assert attention_text(turn.stats) == "LOCKS budget 2048, rank 8"
    # the chat app's lookup (path and content) resumes this session
    resumed = SessionStore().open_session(str(book), file_hash(book), "book", None)
    assert resumed.id == session.id and session.title == "book"
    assert f"session {session.id}, turn 1" in result.stderr and "earlier turn" not in result.stderr


def test_continue_appends_a_turn_and_puts_the_earlier_one_in_the_prompt(book, engine):
    assert ask(book, "What is the password?").exit_code == 0
    result = ask(book, "Who keeps it?", "--continue")
    assert result.exit_code == 0, result.output
    [session] = SessionStore().list_sessions()
    turns = SessionStore().turns(session.id)
    assert [t.question for t in turns] == ["What is the password?", "Who keeps it?"]
    expected = build_prompt(WordTokenizer(), load_document(book), ["What is the password?", "Who keeps it?"], [ANSWER])
    assert engine.prompts[-1] == expected.token_ids
    assert f"session {session.id}, turn 2 (1 earlier turn in the prompt)" in result.stderr


def test_a_follow_up_shows_its_prefix_cache_hit_in_the_footer_and_the_json(book, engine):
    first = ask(book, "What is the password?", "--json")
    assert json.loads(first.stdout)["stats"]["cached_prompt_tokens"] == 0
    result = ask(book, "Who keeps it?", "-c", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    first_prompt, prompt = engine.prompts
    # the follow-up's prompt begins with the whole first prompt (document, question, answer follow in that order):
    # a prefix cache serves all its whole blocks
    assert prompt[: len(first_prompt)] == first_prompt
    assert data["stats"]["cached_prompt_tokens"] == len(first_prompt) // 16 * 16 > 0
    assert data["session"] == {"id": 1, "turn": 2, "continued": True, "earlier_turns": 1}
    footer = ask(book, "And the dog?", "-c")
    assert footer.exit_code == 0
    assert engine.prompts[-1][: len(prompt)] == prompt
    assert f"tokens ({len(prompt) // 16 * 16:,} from the prefix cache)" in footer.stderr


def test_an_engine_that_does_not_report_the_cache_gets_no_cache_note(book, monkeypatch):
    fake = FakeEngine(answer=ANSWER)
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", lambda model, locks, max_model_len=None, kv_cache_gib=None: fake)
    result = ask(book, "What is the password?", "--json")
    assert json.loads(result.stdout)["stats"]["cached_prompt_tokens"] is None
    assert "prefix cache" not in ask(book, "What is the password?").stderr


def test_session_n_continues_that_session_not_the_latest(book, engine):
    ask(book, "First question?")
    ask(book, "Second conversation?")  # a new session: ask without --continue starts one
    result = ask(book, "Back to the first?", "--session", 1, "--json")
    assert result.exit_code == 0, result.output
    store = SessionStore()
    assert [t.question for t in store.turns(1)] == ["First question?", "Back to the first?"]
    assert [t.question for t in store.turns(2)] == ["Second conversation?"]
    expected = build_prompt(WordTokenizer(), load_document(book), ["First question?", "Back to the first?"], [ANSWER])
    assert engine.prompts[-1] == expected.token_ids


def test_continue_takes_the_latest_session_of_the_document(book, other, engine):
    ask(book, "First question?")
    ask(other, "About goats?")
    ask(book, "Second conversation?")
    assert ask(book, "Go on?", "-c").exit_code == 0
    assert [t.question for t in SessionStore().turns(3)] == ["Second conversation?", "Go on?"]


@pytest.mark.parametrize(
    "setup, args, message",
    [
        pytest.param([], ["-c"], "no earlier conversation about {book}: ask without --continue", id="no-previous"),
        pytest.param([], ["--session", "7"], "no session 7: see locks-chat sessions list", id="no-session"),
        pytest.param([["other"]], ["--session", "1"], "session 1 is about another document (other, ",
                     id="other-document"),
        pytest.param([["book"]], ["-c", "--session", "1"], "--continue and --session both given: pass one of them",
                     id="both"),
    ],
)
def test_follow_up_errors_are_one_line_exit_2_and_start_nothing(book, other, engine, monkeypatch, setup, args,
                                                                message):
    for [which] in setup:
        assert ask(book if which == "book" else other, "Earlier?").exit_code == 0
    before = [(s.id, s.turns) for s in SessionStore().list_sessions()]
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", engine_started)
    result = ask(book, "Follow-up?", *args)
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: " + message.format(book=book))
    assert [(s.id, s.turns) for s in SessionStore().list_sessions()] == before


@pytest.mark.parametrize(
    "args, message",
    [(["-c"], "no earlier conversation about {book} as it is now: the file changed since session 1; ask without "
              "--continue"),
     (["--session", "1"], "session 1 is about {book} as it was before it changed (its content differs now): "
                          "leave out --session")],
    ids=["continue", "session"],
)
def test_a_follow_up_about_a_file_edited_since_says_it_changed(book, engine, monkeypatch, args, message):
    assert ask(book, "Earlier?").exit_code == 0
    book.write_text(book.read_text(encoding="utf-8") + "\nOne more line.\n", encoding="utf-8")
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", engine_started)
    result = ask(book, "Follow-up?", *args)
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: " + message.format(book=book))


def test_continue_keeps_the_sessions_page_range_unless_pages_is_given(tmp_path, engine):
    book = tmp_path / "paged.txt"
    book.write_text("\f".join(f"Page {n} says the number {n * 11}." for n in range(1, 6)), encoding="utf-8")
    assert ask(book, "What does page 2 say?", "--pages", "2-3").exit_code == 0
    assert ask(book, "And page 3?", "-c").exit_code == 0
    expected = build_prompt(WordTokenizer(), load_document(book, pages="2-3"),
                            ["What does page 2 say?", "And page 3?"], [ANSWER])
    assert engine.prompts[-1] == expected.token_ids
    assert ask(book, "And page 5?", "-c", "--pages", "4-5").exit_code == 0
    assert SessionStore().get(1).pages == "4-5"


def test_earlier_turns_that_do_not_fit_are_dropped_oldest_first(book, engine, tokenizer):
    for question in ("One?", "Two?"):
        assert ask(book, question, "-c" if question == "Two?" else "--json").exit_code == 0
    document = load_document(book)
    alone = len(build_prompt(WordTokenizer(), document, ["Three?"]).token_ids)
    with_one = len(build_prompt(WordTokenizer(), document, ["Two?", "Three?"], [ANSWER]).token_ids)
    tokenizer.max_context = engine.max_context = with_one + 256  # room for the latest turn only
    assert alone < with_one
    result = ask(book, "Three?", "-c", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["session"]["earlier_turns"] == 1
    expected = build_prompt(WordTokenizer(), document, ["Two?", "Three?"], [ANSWER])
    assert engine.prompts[-1] == expected.token_ids


def test_ctrl_c_saves_the_partial_answer_as_cancelled_and_a_follow_up_leaves_it_out(book, engine):
    engine.fail = KeyboardInterrupt()
    assert ask(book, "Interrupted?").exit_code == 130
    [turn] = SessionStore().turns(1)
    assert (turn.status, turn.answer) == ("cancelled", "The ")
    engine.fail = None
    assert ask(book, "Again?", "-c").exit_code == 0
    assert engine.prompts[-1] == build_prompt(WordTokenizer(), load_document(book), ["Again?"]).token_ids


@pytest.mark.parametrize("second", ["SIGINT", "SIGTERM"])
def test_a_second_signal_during_the_stop_loses_nothing(book, engine, monkeypatch, second):
    """``timeout`` signals twice (the process, then its group), a user may press Ctrl+C twice: the second signal,
    here in the middle of saving the partial answer, is dropped; the turn is saved and the answer ends its line."""
    import os
    import signal

    engine.fail = KeyboardInterrupt()
    begin = SessionStore.begin_turn

    def begin_with_a_signal(self, *args, **kwargs):
        os.kill(os.getpid(), getattr(signal, second))  # its handler runs at once, inside the save
        return begin(self, *args, **kwargs)

    monkeypatch.setattr(SessionStore, "begin_turn", begin_with_a_signal)
    before = signal.getsignal(signal.SIGINT)
    result = ask(book, "Interrupted twice?")
    assert result.exit_code == 130, result.output
    assert result.stdout.endswith("The \n") and "interrupted" in result.stderr
    [session] = SessionStore().list_sessions()
    [turn] = SessionStore().turns(session.id)
    assert (turn.status, turn.answer) == ("cancelled", "The ")
    assert signal.getsignal(signal.SIGINT) is before  # the handlers are given back after the stop


def test_stdin_document_and_continue_by_content(engine):
    result = ask("-", "When does the ferry leave?", input=NOTES)
    assert result.exit_code == 0, result.output
    [session] = SessionStore().list_sessions()
    assert (session.doc_path, session.title) == (STDIN_PATH, "Harbour notes")
    follow = ask("-", "And the dog?", "-c", input=NOTES)
    assert follow.exit_code == 0, follow.output
    assert [t.question for t in SessionStore().turns(session.id)] == ["When does the ferry leave?", "And the dog?"]
    document = load_document_bytes(NOTES.encode(), "<stdin>", markdown=True)
    expected = build_prompt(WordTokenizer(), document, ["When does the ferry leave?", "And the dog?"], [ANSWER])
    assert engine.prompts[-1] == expected.token_ids
    changed = ask("-", "And the dog?", "-c", input=NOTES + "One more line.\n")
    assert changed.exit_code == 2 and "no earlier conversation about <stdin>" in changed.stderr


def test_a_file_piped_in_continues_the_files_session_by_content(book, engine):
    assert ask(book, "What is the password?").exit_code == 0
    result = ask("-", "Who keeps it?", "-c", input=book.read_text(encoding="utf-8"))
    assert result.exit_code == 0, result.output
    assert len(SessionStore().turns(1)) == 2


def test_a_pdf_on_stdin_is_told_by_its_content(engine):
    fpdf = pytest.importorskip("fpdf", reason="fpdf2 is a test requirement")
    pdf = fpdf.FPDF()
    pdf.set_font("helvetica", size=11)
    for text in ("The first page is about tides.", "The second page says the password is BLUE."):
        pdf.add_page()
        pdf.multi_cell(0, 6, text)
    data = bytes(pdf.output())
    result = runner.invoke(app, ["ask", "-", "What is the password?", "--json"], input=data)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["document"]["pages"] == 2
    assert SessionStore().get(1).doc_hash == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    "stdin, message",
    [
        pytest.param("", "<stdin>: the file has no text", id="empty"),
        pytest.param(b"\x89PNG\r\n\x1a\n" + bytes(64), "<stdin>: a PNG image, not a supported format", id="png"),
    ],
)
def test_bad_stdin_is_one_line_exit_2(monkeypatch, stdin, message):
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", engine_started)
    result = runner.invoke(app, ["ask", "-", "q"], input=stdin)
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert message in line
    assert SessionStore().list_sessions() == []


def test_a_terminal_on_stdin_is_refused(monkeypatch):
    class Terminal:
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    with pytest.raises(DocumentError, match="standard input is a terminal: pipe the document in"):
        read_input(Path("-"))


def test_a_closed_stdin_is_refused(monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)  # what ``<&-`` gives
    with pytest.raises(DocumentError, match="standard input is closed: pipe the document in"):
        read_input(Path("-"))


def test_help_names_the_follow_up_options():
    result = runner.invoke(app, ["ask", "--help"])
    assert result.exit_code == 0
    assert "--continue" in result.stdout and "--session" in result.stdout and "standard input" in result.stdout


def test_a_named_pipe_as_the_document_says_it_waits_for_a_writer(tmp_path, capsys):
    import os
    import threading

    from locks_chat.cli.followup import read_input

    fifo = tmp_path / "notes.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(b"# Notes\n\nThe keeper was Ann Marsh.\n")

    writer = threading.Timer(0.2, write)
    writer.start()
    document = read_input(fifo)
    writer.join()
    assert document.data.startswith(b"# Notes") and document.path == fifo
    assert f"{fifo}: a named pipe; waiting for data to be written to it" in capsys.readouterr().err


def test_the_json_turn_is_the_turns_number_in_its_session(book, engine, tmp_path):
    """``session.turn`` counts the session's turns as the footer and ``sessions show`` do, not the database's rows:
    the second document's first turn is turn 1, its follow-up turn 2."""
    assert ask(book, "What is the password?").exit_code == 0
    assert ask(book, "Who keeps it?", "-c").exit_code == 0
    other = tmp_path / "other.txt"
    other.write_text(book.read_text() + "\nA second document.\n")
    first = ask(other, "What is the password?", "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["session"] == {"id": 2, "turn": 1, "continued": False, "earlier_turns": 0}
    follow = ask(other, "Who keeps it?", "-c", "--json")
    assert json.loads(follow.stdout)["session"] == {"id": 2, "turn": 2, "continued": True, "earlier_turns": 1}
    footer = ask(other, "And the dog?", "-c")
    assert "session 2, turn 3 (2 earlier turns in the prompt)" in footer.stderr
