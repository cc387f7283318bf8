"""``--json`` on every exit: each failure the command line knows is one JSON object on stdout, ``{"error":
{"message", "kind", "exit_code"}}``, beside the one line on stderr, with the documented exit code
(``locks_chat.cli.exits``)."""

import json

import pytest
from typer.testing import CliRunner

import locks_chat.engine_client
from locks_chat.cli import app
from locks_chat.errors import EngineError
from locks_chat.signals import Terminated
from tests.support.fakes import FakeEngine
from tests.support.ingest_samples import encrypted, text_pdf, write

runner = CliRunner()


@pytest.fixture
def book(tmp_path):
    return write(tmp_path, "book.txt", b"The keeper's password is BLUE.\n\n" + b"Filler about the sea. " * 50)


@pytest.fixture
def engine(monkeypatch):
    fake = FakeEngine(answer="The password is BLUE (p. 1).")
    monkeypatch.setattr(locks_chat.engine_client, "open_tokenizer", lambda *args, **kwargs: None)
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", lambda *args, **kwargs: fake)
    return fake


def error_object(result, code: int, kind: str) -> dict:
    assert result.exit_code == code, result.output
    data = json.loads(result.stdout)  # the whole of stdout is the one object
    assert list(data) == ["error"] and set(data["error"]) == {"message", "kind", "exit_code"}
    assert data["error"]["kind"] == kind and data["error"]["exit_code"] == code
    assert data["error"]["message"] in result.stderr, "the same message as the line on stderr"
    return data["error"]


@pytest.mark.parametrize(
    "make,args,code,kind,message",
    [
        (None, ["ask", "{dir}/missing.pdf", "q"], 2, "document", "missing.pdf"),
        (None, ["ask", "{book}", "  "], 2, "bad_input", "question is empty"),
        (None, ["ask", "{book}", "q", "--pages", "50-60"], 2, "page_range", "50-60"),
        (lambda: encrypted(text_pdf(["secret"]), "pw"), ["ask", "{doc}", "q"], 2, "encrypted", "password"),
        (lambda: text_pdf(["x"], image_pages=[0]), ["ask", "{doc}", "q"], 2, "no_text", "no text"),
        (None, ["ask", "{book}", "q", "--continue"], 2, "follow_up", "--continue"),
    ],
    ids=["missing_file", "empty_question", "page_range", "encrypted", "scanned", "no_session_to_continue"],
)
def test_a_refused_input_is_a_json_error(tmp_path, book, engine, make, args, code, kind, message):
    doc = write(tmp_path, "doc.pdf", make()) if make else None
    args = [a.format(dir=tmp_path, book=book, doc=doc) for a in args]
    error = error_object(runner.invoke(app, [*args, "--json"]), code, kind)
    assert message in error["message"]


def test_a_document_that_does_not_fit_is_a_json_error(book, engine):
    engine.max_context = 300
    error = error_object(runner.invoke(app, ["ask", str(book), "q", "--json"]), 2, "context")
    assert "do not fit the 300-token context" in error["message"]


def test_an_engine_that_does_not_start_is_a_json_error(book, monkeypatch):
    def broken(*args, **kwargs):
        raise EngineError("the engine did not start: out of memory")

    monkeypatch.setattr(locks_chat.engine_client, "open_tokenizer", lambda *args, **kwargs: None)
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", broken)
    error = error_object(runner.invoke(app, ["ask", str(book), "q", "--json"]), 3, "engine")
    assert error["message"] == "the engine did not start: out of memory"


@pytest.mark.parametrize("fail,code,kind", [(KeyboardInterrupt(), 130, "cancelled"),
                                            (Terminated("SIGTERM"), 143, "terminated")], ids=["ctrl_c", "sigterm"])
def test_a_stopped_answer_is_a_json_error(book, engine, fail, code, kind):
    engine.fail = fail
    error_object(runner.invoke(app, ["ask", str(book), "q", "--json"]), code, kind)
    assert engine.aborted == 1 and engine.closed


def test_an_unreadable_sessions_database_is_a_json_error(user_home):
    from locks_chat.paths import data_dir

    data_dir().mkdir(parents=True, exist_ok=True)
    (data_dir() / "sessions.sqlite").write_bytes(b"not a database at all" * 100)
    error_object(runner.invoke(app, ["sessions", "list", "--json"]), 2, "sessions")


def test_without_json_stdout_stays_empty(book, engine):
    result = runner.invoke(app, ["ask", str(book), "  "])
    assert result.exit_code == 2 and result.stdout == ""


@pytest.mark.parametrize("args", [["ask", "{book}", "q", "--json", "--budget", "0"], ["ask", "{book}", "--json"]],
                         ids=["bad_value", "missing_argument"])
def test_a_usage_error_is_a_json_error(book, engine, args, monkeypatch, capsys):
    from locks_chat.cli import main

    monkeypatch.setattr("sys.argv", ["locks-chat", *[a.format(book=book) for a in args]])
    with pytest.raises(SystemExit) as exited:
        main()
    out, err = capsys.readouterr()
    assert exited.value.code == 2
    data = json.loads(out)
    assert data["error"]["kind"] == "usage" and data["error"]["exit_code"] == 2
    assert data["error"]["message"] in err and "--help" in data["error"]["message"]
