"""``locks-chat ask`` when a Ctrl+C or SIGTERM arrives after the answer ended, while the engine shuts down: the
answer is complete and saved as done, so the command reports it (its JSON object, or the answer and its footer)
and exits 0; the signal no longer turns it into ``interrupted`` (exit 130) beside a turn saved ``done``."""

import json
import signal

import pytest
from typer.testing import CliRunner

import locks_chat.engine_client
from locks_chat.cli import app
from locks_chat.sessions import SessionStore
from locks_chat.signals import STOPPING_SIGNALS, raise_on_sigterm
from tests.support.fakes import FakeEngine

runner = CliRunner()


class SignalledAtClose(FakeEngine):
    """Answers, then gets ``signum`` while it shuts down (the user's Ctrl+C, ``timeout``'s SIGTERM)."""

    def __init__(self, signum: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.signum = signum

    def close(self) -> None:
        signal.raise_signal(self.signum)
        super().close()


@pytest.fixture
def book(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("The keeper's password is BLUE.\n\n" + "Filler text about the sea. " * 50, encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def main_handlers():
    """SIGTERM and SIGHUP handled as the console script's ``main`` has them handled (a SIGTERM left to its default
    would end the test run), then given back."""
    before = {signum: signal.getsignal(signum) for signum in STOPPING_SIGNALS}
    raise_on_sigterm()
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def use(monkeypatch, engine: FakeEngine) -> FakeEngine:
    monkeypatch.setattr(locks_chat.engine_client, "open_tokenizer", lambda *args, **kwargs: None)
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", lambda *args, **kwargs: engine)
    return engine


def saved_turn():
    store = SessionStore()
    [turn] = store.turns(store.list_sessions()[0].id)
    return turn


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_a_signal_during_the_shutdown_leaves_the_json_answer(book, monkeypatch, signum):
    engine = use(monkeypatch, SignalledAtClose(signum, answer="The password is BLUE (p. 1)."))
    result = runner.invoke(app, ["ask", str(book), "What is the password?", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["answer"] == "The password is BLUE (p. 1)." and "error" not in data
    turn = saved_turn()
    assert (turn.status, turn.answer) == ("done", data["answer"])
    assert engine.closed


def test_a_ctrl_c_during_the_shutdown_leaves_the_answer_and_its_footer(book, monkeypatch):
    engine = use(monkeypatch, SignalledAtClose(signal.SIGINT, answer="The password is BLUE (p. 1)."))
    result = runner.invoke(app, ["ask", str(book), "What is the password?"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "The password is BLUE (p. 1).\n"
    assert "TPOT" in result.stderr and "interrupted" not in result.stderr
    assert saved_turn().status == "done" and engine.closed


def test_ctrl_c_works_again_after_the_command(book, monkeypatch):
    """The signals dropped during the shutdown get their handlers back: a Ctrl+C after it interrupts again."""
    use(monkeypatch, SignalledAtClose(signal.SIGINT))
    assert runner.invoke(app, ["ask", str(book), "q", "--json"]).exit_code == 0
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
