"""``ask`` saves the turn however the answer is cut short: stdout's reader gone (``| head``) and SIGHUP (the
terminal closed) keep the partial answer as a ``cancelled`` turn, as Ctrl+C and SIGTERM do."""

import os
import signal

import pytest

import locks_chat.cli.ask
from locks_chat.sessions import SessionStore
from locks_chat.signals import Terminated, raise_on_sigterm
from tests.chat.cli.test_cli_followup import ask, book, engine, tokenizer  # noqa: F401 - fixtures


def the_turn():
    [session] = SessionStore().list_sessions()
    [turn] = SessionStore().turns(session.id)
    return turn


def test_a_closed_pipe_saves_the_partial_answer(book, engine, monkeypatch):  # noqa: F811
    written = []

    def write_out(text):
        if written:
            raise BrokenPipeError(32, "Broken pipe")
        written.append(text)

    monkeypatch.setattr(locks_chat.cli.ask, "write_out", write_out)
    result = ask(book, "What is the password?")
    assert result.exit_code == 141, result.output
    assert engine.aborted == 1 and engine.closed
    turn = the_turn()
    assert turn.status == "cancelled" and turn.answer == "The password "  # what the engine had streamed
    assert written == ["The "]


def test_sighup_saves_the_partial_answer_and_exits_129(book, engine):  # noqa: F811
    engine.fail = Terminated("SIGHUP")
    result = ask(book, "What is the password?")
    assert result.exit_code == 129, result.output
    assert result.stderr.strip() == "hung up: the request was aborted"
    assert engine.aborted == 1 and engine.closed
    assert (the_turn().status, the_turn().answer) == ("cancelled", "The ")


@pytest.fixture
def handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_sighup_raises_terminated_in_the_main_thread(handlers):
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as from a terminal: a run under nohup inherits it ignored
    raise_on_sigterm()
    with pytest.raises(Terminated) as stopped:
        os.kill(os.getpid(), signal.SIGHUP)
    assert stopped.value.signum == signal.SIGHUP and stopped.value.exit_code == 129
    assert stopped.value.word == "hung up"
    assert Terminated("SIGTERM").exit_code == 143 and Terminated("SIGTERM").word == "terminated"


def test_a_sighup_ignored_by_nohup_stays_ignored(handlers):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    raise_on_sigterm()
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
