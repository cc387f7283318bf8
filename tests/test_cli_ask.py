"""``locks-chat ask`` through Typer's CliRunner with a scripted engine: output, JSON, exit codes."""

import json

import pytest
from typer.testing import CliRunner

import locks_chat.engine
from locks_chat.cli import app
from locks_chat.errors import EngineError
from tests.fakes import FakeEngine

runner = CliRunner()


@pytest.fixture
def book(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("The keeper's password is BLUE.\n\n" + "Filler text about the sea. " * 50, encoding="utf-8")
    return path


@pytest.fixture
def engine(monkeypatch):
    fake = FakeEngine(answer="The password is BLUE (p. 1).", bins_per_step=[list(range(0, 40))])
    calls = []

    def open_engine(model, locks, max_model_len=None):
        calls.append((model, locks, max_model_len))
        return fake

    monkeypatch.setattr(locks_chat.engine, "open_engine", open_engine)
    fake.calls = calls
    return fake


def test_answer_streams_to_stdout_and_stats_to_stderr(book, engine):
    result = runner.invoke(app, ["ask", str(book), "What is the password?"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("The password is BLUE (p. 1).")
    assert "TPOT" in result.stderr and "document pages read: 1" in result.stderr
    assert engine.closed


def test_json_output_for_scripts(book, engine):
    result = runner.invoke(app, ["ask", str(book), "What is the password?", "--json", "--budget", "512", "--rank", "4"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["answer"] == "The password is BLUE (p. 1)."
    assert data["citations"] == [{"page": "1", "physical": 1}]
    stats = data["stats"]
    assert stats["prompt_tokens"] > 0 and stats["generated_tokens"] == 6
    assert {"ttft_ms", "tpot_ms", "kv_pages_read_per_step", "kv_pages_total_per_step", "kv_bytes_read",
            "kv_bytes_dense", "document_pages_read"} <= set(stats)
    locks = engine.calls[0][1]
    assert (locks.budget, locks.rank, locks.dense) == (512, 4, False)
    assert "text page" in data["document"]["page_kind"] or "block" in data["document"]["page_kind"]


@pytest.mark.parametrize(
    "args,code,message",
    [
        (["ask", "missing.pdf", "q"], 2, "missing.pdf"),
        (["ask", "{book}", "q", "--budget", "16"], 2, "budget=16"),
        (["ask", "{book}", "   "], 2, "question is empty"),
        (["ask", "{book}", "q", "--pages", "50-60"], 2, "50-60"),
    ],
    ids=["missing_file", "budget_below_forced_pages", "empty_question", "page_range_out_of_bounds"],
)
def test_bad_input_gives_one_line_and_exit_2(book, engine, args, code, message):
    result = runner.invoke(app, [a.replace("{book}", str(book)) for a in args])
    assert result.exit_code == code
    assert message in result.stderr
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1


def test_document_that_does_not_fit_exits_2(book, engine):
    engine.max_context = 300
    result = runner.invoke(app, ["ask", str(book), "q"])
    assert result.exit_code == 2
    assert "do not fit the model's 300-token context" in result.stderr and "--pages" in result.stderr


def test_engine_failure_exits_3(book, monkeypatch):
    def broken(*args, **kwargs):
        raise EngineError("the engine did not start: out of memory")

    monkeypatch.setattr(locks_chat.engine, "open_engine", broken)
    result = runner.invoke(app, ["ask", str(book), "q"])
    assert result.exit_code == 3 and "out of memory" in result.stderr


def test_ctrl_c_aborts_the_request_and_exits_130(book, engine):
    engine.fail = KeyboardInterrupt()
    result = runner.invoke(app, ["ask", str(book), "q"])
    assert result.exit_code == 130
    assert engine.aborted == 1 and engine.closed


def test_help_has_an_example():
    result = runner.invoke(app, ["ask", "--help"])
    assert result.exit_code == 0 and "Example: locks-chat ask" in result.stdout
