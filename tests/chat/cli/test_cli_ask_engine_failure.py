"""``locks-chat ask`` when vLLM's engine core fails during the answer (``EngineDeadError``: a worker's exception,
memory exhausted): one line with the root cause from the engine log, exit code 3, no traceback, nothing saved."""

import json

import pytest
from typer.testing import CliRunner

import locks_chat.engine_client
from locks_chat.cli import app
from locks_chat.engine_client import engine_log_path
from locks_chat.sessions import SessionStore
from tests.support.fakes import FakeEngine

runner = CliRunner()
CAUSE = "ValueError: Overflow when unpacking long long"
VLLM_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


class EngineDeadError(Exception):
    """vLLM's exception of that name (``vllm/v1/engine/exceptions.py``), which the app tells by name."""


class DyingEngine(FakeEngine):
    """Streams one word, then its engine core fails: the worker's traceback goes to the engine log (``log_line``,
    ``None``: nothing written) and the request raises ``EngineDeadError``."""

    def __init__(self, log_line: str | None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.log_line = log_line

    def stream(self, *args, **kwargs):
        for event in super().stream(*args, **kwargs):
            yield event
            if self.log_line is not None:
                with open(engine_log_path(), "a", encoding="utf-8") as log:
                    log.write(f"(Worker pid=7) ERROR 12-06 19:44:55 [multiproc_executor.py:1063] {self.log_line}\n")
            raise EngineDeadError(VLLM_MESSAGE)


@pytest.fixture
def book(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("The keeper's password is BLUE.\n\n" + "Filler text about the sea. " * 50, encoding="utf-8")
    return path


def use(monkeypatch, engine: FakeEngine) -> FakeEngine:
    monkeypatch.setattr(locks_chat.engine_client, "open_tokenizer", lambda *args, **kwargs: None)
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", lambda *args, **kwargs: engine)
    log = engine_log_path()
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("RuntimeError: an earlier run's failure\n", encoding="utf-8")  # not this answer's cause
    return engine


def test_an_engine_that_dies_while_answering_is_one_line_and_exit_3(book, monkeypatch):
    engine = use(monkeypatch, DyingEngine(CAUSE, answer="The password is BLUE."))
    result = runner.invoke(app, ["ask", str(book), "q"])
    assert result.exit_code == 3, result.output
    assert result.stderr.splitlines() == [
        f"error: the engine failed while answering: {CAUSE} (engine log: {engine_log_path()})"]
    assert result.stdout == "The " and engine.closed
    assert SessionStore().list_sessions() == [], "no session left half-written"


def test_without_a_cause_in_the_log_vllms_own_words_are_said(book, monkeypatch):
    use(monkeypatch, DyingEngine(None, answer="The password is BLUE."))
    result = runner.invoke(app, ["ask", str(book), "q", "--json"])
    assert result.exit_code == 3, result.output
    message = f"the engine failed while answering: {VLLM_MESSAGE} (engine log: {engine_log_path()})"
    assert json.loads(result.stdout) == {"error": {"message": message, "kind": "engine", "exit_code": 3}}
    assert result.stderr.splitlines() == [f"error: {message}"]
