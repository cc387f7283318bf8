"""``locks-chat ask`` through Typer's CliRunner with a scripted engine: output, JSON, exit codes."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import locks_chat.cli.exits
import locks_chat.engine_client
from locks_chat.cli import app
from locks_chat.engine_client import ModelTokenizer
from locks_chat.errors import EngineError
from locks_chat.signals import Terminated
from tests.support.fakes import FakeEngine, WordTokenizer

runner = CliRunner()
REAL_OPEN_TOKENIZER = locks_chat.engine_client.open_tokenizer  # the autouse fixture below replaces it


@pytest.fixture
def book(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("The keeper's password is BLUE.\n\n" + "Filler text about the sea. " * 50, encoding="utf-8")
    return path


class Tokenizer:
    """``open_tokenizer`` without a model: no early count while ``max_context`` is 0 (the engine's count decides)."""

    def __init__(self) -> None:
        self.max_context = 0
        self.calls: list = []

    def __call__(self, model, max_model_len, convert=True):
        self.calls.append((model, max_model_len))
        return ModelTokenizer(WordTokenizer(), self.max_context) if self.max_context else None


@pytest.fixture(autouse=True)
def tokenizer(monkeypatch):
    counter = Tokenizer()
    monkeypatch.setattr(locks_chat.engine_client, "open_tokenizer", counter)
    return counter


def engine_started(*args, **kwargs):
    pytest.fail("the engine was started")


@pytest.fixture
def engine(monkeypatch):
    fake = FakeEngine(answer="The password is BLUE (p. 1).", bins_per_step=[list(range(0, 40))])
    calls = []

    def open_engine(model, locks, max_model_len=None, kv_cache_gib=None):
        calls.append((model, locks, max_model_len))
        fake.kv_cache_gib = kv_cache_gib
        return fake

    monkeypatch.setattr(locks_chat.engine_client, "open_engine", open_engine)
    fake.calls = calls
    return fake


def test_answer_streams_to_stdout_and_stats_to_stderr(book, engine):
    result = runner.invoke(app, ["ask", str(book), "What is the password?"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("The password is BLUE (p. 1).")
    assert "TPOT" in result.stderr and "most-read document pages: p. 1 100%" in result.stderr
    assert engine.closed


def test_json_output_for_scripts(book, engine):
    result = runner.invoke(app, ["ask", str(book), "What is the password?", "--json", "--budget", "512", "--rank", "4"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["answer"] == "The password is BLUE (p. 1)."
    assert data["citations"] == [{"page": "1", "physical": 1, "verified": True, "found_on": None, "score": 1.0}]
    assert data["proposed_page"] is None and data["citation_check"] == "p. 1 verified" and data["warnings"] == []
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
        (["ask", "{book}", "   "], 2, "question is empty"),
        (["ask", "{book}", "q", "--pages", "50-60"], 2, "50-60"),
        # the bytes of a non-UTF-8 terminal, as Python's argv holds them
        (["ask", "{book}", "Who\udcff?"], 2, "the question is not UTF-8 text"),
    ],
    ids=["missing_file", "empty_question", "page_range_out_of_bounds", "question_not_utf8"],
)
def test_bad_input_gives_one_line_and_exit_2(book, engine, args, code, message):
    result = runner.invoke(app, [a.replace("{book}", str(book)) for a in args])
    assert result.exit_code == code
    assert message in result.stderr
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1


def test_kv_cache_size_reaches_the_engine(book, engine):
    assert runner.invoke(app, ["ask", str(book), "q"]).exit_code == 0
    assert engine.kv_cache_gib is None  # the engine's default: vLLM's share of the GPU, 1 GiB on the CPU
    assert runner.invoke(app, ["ask", str(book), "q", "--kv-cache-gib", "24.5"]).exit_code == 0
    assert engine.kv_cache_gib == 24.5


def test_document_that_does_not_fit_exits_2(book, engine):
    engine.max_context = 300
    result = runner.invoke(app, ["ask", str(book), "q"])
    assert result.exit_code == 2
    # its one 570-token page cannot fit beside the prompt and the answer, whatever --pages says
    assert "do not fit the 300-token context: not one page fits; use a larger --context" in result.stderr


def test_document_that_cannot_fit_is_refused_before_the_engine_starts(book, engine, tokenizer, monkeypatch):
    engine.max_context = 300
    after_start = runner.invoke(app, ["ask", str(book), "q", "--context", "300"])
    assert after_start.exit_code == 2 and len(engine.calls) == 1
    tokenizer.max_context = 300
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", engine_started)
    before_start = runner.invoke(app, ["ask", str(book), "q", "--context", "300"])
    assert before_start.exit_code == 2
    assert before_start.stderr == after_start.stderr, "the early refusal says what the engine's would"
    assert "do not fit the 300-token context" in before_start.stderr
    assert len(before_start.stderr.strip().splitlines()) == 1 and "Traceback" not in before_start.output
    assert tokenizer.calls[-1] == (None, 300)


def test_document_that_fits_exactly_starts_the_engine(book, engine, tokenizer):
    from locks_chat.ask import fitting_prompt
    from locks_chat.ingest import load_document

    prompt = fitting_prompt(engine, load_document(book), ["q"], max_tokens=16)
    tokenizer.max_context = engine.max_context = len(prompt.token_ids) + 16
    result = runner.invoke(app, ["ask", str(book), "q", "--max-tokens", "16"])
    assert result.exit_code == 0, result.output
    assert len(engine.calls) == 1 and engine.prompts == [prompt.token_ids]


def test_unknown_model_is_an_engine_error_before_the_engine_starts(book, monkeypatch):
    def open_tokenizer(model, max_model_len, convert=True):
        raise EngineError(f"no such model directory: {model}")

    monkeypatch.setattr(locks_chat.engine_client, "open_tokenizer", open_tokenizer)
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", engine_started)
    result = runner.invoke(app, ["ask", str(book), "q", "--model", "./nowhere"])
    assert result.exit_code == 3 and "no such model directory: ./nowhere" in result.stderr


def test_engine_failure_exits_3(book, monkeypatch):
    def broken(*args, **kwargs):
        raise EngineError("the engine did not start: out of memory")

    monkeypatch.setattr(locks_chat.engine_client, "open_engine", broken)
    result = runner.invoke(app, ["ask", str(book), "q"])
    assert result.exit_code == 3 and "out of memory" in result.stderr


def test_ctrl_c_aborts_the_request_and_exits_130(book, engine):
    engine.fail = KeyboardInterrupt()
    result = runner.invoke(app, ["ask", str(book), "q"])
    assert result.exit_code == 130
    assert engine.aborted == 1 and engine.closed
    # the partial answer ("The ") is ended before the one-line error
    assert result.stdout == "The \n" and "interrupted: the request was aborted" in result.stderr


def test_sigterm_aborts_the_request_and_exits_143(book, engine):
    engine.fail = Terminated("SIGTERM")
    result = runner.invoke(app, ["ask", str(book), "q"])
    assert result.exit_code == 143
    assert engine.aborted == 1 and engine.closed
    assert result.stdout == "The \n" and result.stderr.strip() == "terminated: the request was aborted"


def test_an_engine_failure_after_a_sigterm_is_reported_as_the_sigterm(book, engine, monkeypatch):
    # ``timeout`` signals the whole process group: vLLM's engine core may fail the request before the app's
    # own handler runs
    engine.fail = EngineError("the engine failed: EngineCore encountered an issue")
    monkeypatch.setattr(locks_chat.cli.exits, "sigterm_received", lambda: True)
    result = runner.invoke(app, ["ask", str(book), "q"])
    assert result.exit_code == 143 and result.stderr.strip() == "terminated: the engine was shut down"


def test_help_has_an_example():
    result = runner.invoke(app, ["ask", "--help"])
    assert result.exit_code == 0 and "Example: locks-chat ask" in result.stdout


def test_a_model_path_that_does_not_exist_is_bad_input(book, monkeypatch, tmp_path):
    monkeypatch.setattr(locks_chat.engine_client, "open_tokenizer", REAL_OPEN_TOKENIZER)
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", engine_started)
    result = runner.invoke(app, ["ask", str(book), "q", "--model", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "no such model directory" in result.stderr


def test_a_context_past_the_models_own_is_refused_before_the_engine_starts(book, monkeypatch, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 4096}')
    monkeypatch.setattr(locks_chat.engine_client, "open_tokenizer", REAL_OPEN_TOKENIZER)
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", engine_started)
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    result = runner.invoke(app, ["ask", str(book), "q", "--model", str(model), "--context", "99999999"])
    assert result.exit_code == 2
    assert "--context 99,999,999 is more than this model's 4,096-token context: pass at most 4096" in result.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["ask", "{book}", "q", "--budget", "0"], "Invalid value for '--budget'"),
        (["ask", "{book}", "q", "--budget", "16"], "greater than or equal to 48"),
        (["ask", "{book}", "q", "--budget", "99999999999999999999999"], "less than or equal to 16777216"),
        (["ask", "{book}", "q", "--pages", " "], "leave --pages out to read every page"),
        (["ask", "{book}", "q", "--model", ""], "leave --model out for the built-in one"),
        (["ask", "{book}", "q", "--max-tokens", "x"], "Invalid value for '--max-tokens'"),
        (["ask", "{book}"], "Missing argument 'QUESTION'"),
        (["ask", "{book}", "q", "--bogus"], "No such option: --bogus"),
        (["sessions", "show", "x"], "Invalid value for 'session': Input should be a valid integer"),
        (["sessions", "delete", "1", "x"], "Invalid value for 'sessions': Input should be a valid integer"),
        (["ask", "{book}", "q", "--kv-cache-gib", "0"], "Invalid value for '--kv-cache-gib'"),
        (["ask", "{book}", "q", "--kv-cache-gib", "inf"], "inf is not a size"),
        (["ask", "{book}", "q", "--kv-cache-gib", "nan"], "nan is not a size"),
        (["ask", "{book}", "q", "--kv-cache-gib", "0.05"], "0.05 is below the smallest KV cache, 0.1 GiB"),
        (["ask", "", "q"], "'DOC': empty: give a document's path"),
        (["", "--pages", "1-3"], "'DOC': empty: give a document's path"),
    ],
    ids=["range", "budget_below_forced_pages", "budget_past_any_context", "blank_pages", "blank_model", "not_a_number", "missing_argument",
         "unknown_option", "sessions_show_id", "sessions_delete_id", "kv_cache_of_nothing", "kv_cache_infinite", "kv_cache_nan", "kv_cache_tiny",
         "blank_document",
         "blank_document_chat"],
)
def test_usage_errors_are_one_line_and_exit_2(book, engine, args, message, monkeypatch, capsys):
    """Typer's own usage errors (found before any command runs) go through ``main``: one line naming the help."""
    from locks_chat.cli import main

    monkeypatch.setattr("sys.argv", ["locks-chat", *[a.replace("{book}", str(book)) for a in args]])
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.startswith("error: ") and message in err and "--help" in err, err
    assert "session_id" not in err, "no internal parameter name"
    assert len(err.strip().splitlines()) == 1 and not engine.calls


@pytest.mark.parametrize("args", [[], ["sessions"], ["--help"]], ids=["no_args", "group_without_command", "help"])
def test_help_without_a_command_exits_0(args, monkeypatch, capsys):
    from locks_chat.cli import main

    monkeypatch.setattr("sys.argv", ["locks-chat", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 0
    assert capsys.readouterr().out.count("Usage: locks-chat") == 1, "the help, once"


def test_a_closed_stdout_is_bad_input_before_anything_starts(book, monkeypatch):
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", engine_started)
    monkeypatch.setattr("locks_chat.cli.ask.stdout_open", lambda: False)
    result = runner.invoke(app, ["ask", str(book), "q"])
    assert result.exit_code == 2 and "stdout is closed" in result.stderr


def test_a_reader_that_closes_the_pipe_stops_the_answer_quietly(book, engine, monkeypatch):
    writes, dropped = [], []

    def closed_pipe(text):
        writes.append(text)
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("locks_chat.cli.ask.write_out", closed_pipe)
    monkeypatch.setattr(locks_chat.cli.exits, "_drop_stdout", lambda: dropped.append(True))
    result = runner.invoke(app, ["ask", str(book), "q"])
    assert result.exit_code == locks_chat.cli.exits.BROKEN_PIPE_EXIT_CODE and result.stderr == "" and dropped
    assert writes == ["The "]
    assert engine.aborted == 1 and engine.closed, "the request was not aborted before the engine closed"


def test_an_unwritable_model_cache_is_bad_input_in_one_line(book, monkeypatch):
    from locks_engine import models

    def unwritable(model, convert=True, cache_dir=None):
        raise models.CacheDirError(Path("/ro/models"), "Read-only file system")

    monkeypatch.setattr(locks_chat.engine_client, "open_tokenizer", REAL_OPEN_TOKENIZER)
    monkeypatch.setattr(models, "local_model_dir", unwritable)
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", engine_started)
    result = runner.invoke(app, ["ask", str(book), "q"])
    assert result.exit_code == 2 and "cannot write the model cache /ro/models" in result.stderr
    assert "set LOCKS_CHAT_HOME to a writable directory" in result.stderr, "the app names its own directory"


@pytest.mark.parametrize(
    "max_tokens, question, expected",
    [(1000, "q", "pass a smaller --max-tokens (at most"), (10, "why " * 800, "ask a shorter question")],
    ids=["answer-room", "long-question"],
)
def test_a_prompt_that_leaves_no_room_for_a_page_names_what_to_cut(book, engine, max_tokens, question, expected):
    engine.max_context = 1200
    result = runner.invoke(app, ["ask", str(book), question, "--max-tokens", str(max_tokens)])
    assert result.exit_code == 2 and expected in result.stderr, result.stderr
    assert "--pages" not in result.stderr


def test_a_one_token_answer_has_no_decode_step_figures(book, engine, monkeypatch):
    """The one token comes from the prefill: no TPOT, no pages-read figures (JSON null), "1 token"."""
    from tests.support.fakes import Event

    def prefill_only(prompt_ids, max_tokens, cancel=None, sampling=None):
        yield Event("BLUE", 1, True, "length", 0.5, [])  # no decode step recorded

    monkeypatch.setattr(engine, "stream", prefill_only)
    result = runner.invoke(app, ["ask", str(book), "What is the password?", "--max-tokens", "1"])
    assert result.exit_code == 0, result.output
    assert "1 token · prompt" in result.stderr and "TPOT -" in result.stderr and "no decode step ·" in result.stderr
    assert "MB per token" not in result.stderr
    data = json.loads(runner.invoke(app, ["ask", str(book), "q", "--max-tokens", "1", "--json"]).stdout)["stats"]
    assert data["decode_steps"] == 0 and data["kv_pages_read_fraction"] is None


def test_ctrl_c_while_the_command_line_loads_is_one_line(monkeypatch, capsys):
    """The console script's entry: a KeyboardInterrupt raised while ``locks_chat.cli`` imports (Typer, Rich)."""
    import builtins
    import sys

    from locks_chat import entry

    real_import = builtins.__import__

    def interrupted(name, *args, **kwargs):
        if name == "locks_chat.cli":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "locks_chat.cli")
    monkeypatch.setattr(builtins, "__import__", interrupted)
    with pytest.raises(SystemExit) as exited:
        entry.main()
    assert exited.value.code == 130 and capsys.readouterr().err == "interrupted\n"


def test_help_gives_back_the_sigpipe_handler(monkeypatch, capsys):
    """``--help`` takes SIGPIPE's default action only while it prints (``main`` also runs inside processes that
    go on: a test process killed later by a closed pipe)."""
    import signal

    from locks_chat.cli import main

    before = signal.getsignal(signal.SIGPIPE)
    monkeypatch.setattr("sys.argv", ["locks-chat", "ask", "--help"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 0 and "--kv-cache-gib" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGPIPE) == before
