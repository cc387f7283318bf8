"""Quitting while the engine starts or the tokenizer loads: ``App.run()`` (what the CLI calls; ``run_test`` does
not join the worker threads) returns at once, the conversation saved so far stays saved, and an engine start left
to its own thread closes its engine when it is up. A stop (a signal, Esc) whose engine core fails meanwhile is still
a stop: the turn is saved ``cancelled``."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from locks_chat.sessions import SessionStore, file_hash
from locks_chat.signals import TERMINATED_EXIT_CODE
from locks_chat.tui.app import build_app
from locks_chat.tui.book_chat import ChatOptions
from locks_chat.tui.widgets.page_heatmap import PageHeatMap
from locks_chat.tui.widgets.prompt_input import PromptInput
from tests.support.fakes import FakeEngine
from tests.support.tui_support import Factory, GatedEngine, until, write_book

SIZE = (120, 40)


class BlockedRestart:
    """An engine factory whose first engine starts at once and whose second start blocks until ``release``."""

    def __init__(self) -> None:
        self.engines = [FakeEngine(answer="The password is BLUE."), FakeEngine()]
        self.starting = threading.Event()
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []

    def __call__(self, model, locks, max_model_len):
        self.threads.append(threading.current_thread())
        if len(self.threads) > 1:
            self.starting.set()
            self.release.wait(30)
        return self.engines[len(self.threads) - 1]


def test_quitting_while_the_engine_starts_does_not_wait_for_it(tmp_path, capfd):
    factory = BlockedRestart()
    app = build_app(write_book(tmp_path), ChatOptions(), factory)
    pressed: list[float] = []

    async def answer_then_restart_then_quit(pilot) -> None:
        screen = app.screen
        await until(pilot, lambda: app.chat.engine is not None and app.chat.document is not None, what="ready")
        screen.query_one(PromptInput).value = "What is the password?"
        await pilot.press("enter")
        await until(pilot, lambda: not screen.answering and app.chat.turns, what="the answer")
        screen.query_one(PromptInput).value = "/budget 1024"
        await pilot.press("enter")
        await until(pilot, factory.starting.is_set, what="the restart")
        pressed.append(time.monotonic())
        await pilot.press("ctrl+q")

    try:
        app.run(headless=True, size=SIZE, auto_pilot=answer_then_restart_then_quit)
        returned = time.monotonic()
        assert pressed and returned - pressed[0] < 5, "quitting waited for the engine start"
        assert not factory.release.is_set() and factory.threads[-1].daemon
        store = SessionStore()
        [saved] = store.turns(store.list_sessions()[0].id)
        assert (saved.status, saved.answer) == ("done", "The password is BLUE.")
    finally:
        factory.release.set()
    factory.threads[-1].join(5)
    assert factory.engines[0].closed and factory.engines[1].closed, "the engine that came up late was closed"
    assert "Traceback" not in capfd.readouterr().err


def test_quitting_while_the_tokenizer_loads_does_not_wait_for_it(tmp_path, capfd):
    book = write_book(tmp_path)
    store = SessionStore()
    session = store.open_session(str(book), file_hash(book), "book", None, False)
    turn = store.begin_turn(session.id, "Earlier?")
    store.save_turn(turn, "An earlier answer.", "done", [], {})
    loading, release = threading.Event(), threading.Event()

    def slow_tokenizer(model, max_model_len):
        loading.set()
        release.wait(30)

    app = build_app(book, ChatOptions(), Factory(), tokenizer_factory=slow_tokenizer)
    pressed: list[float] = []

    async def quit_while_loading(pilot) -> None:
        await until(pilot, loading.is_set, what="the tokenizer load")
        pressed.append(time.monotonic())
        await pilot.press("ctrl+q")

    try:
        app.run(headless=True, size=SIZE, auto_pilot=quit_while_loading)
        assert pressed and time.monotonic() - pressed[0] < 5, "quitting waited for the tokenizer"
        [saved] = store.turns(session.id)
        assert (saved.status, saved.answer) == ("done", "An earlier answer.")
    finally:
        release.set()
    assert "Traceback" not in capfd.readouterr().err


async def ask_until_two_tokens(pilot, app, engine: GatedEngine) -> None:
    """Ask the password question once the app is ready, let two tokens through, wait until the heat map shows them."""
    await until(pilot, lambda: app.chat.engine is not None and app.chat.document is not None, what="ready")
    app.screen.query_one(PromptInput).value = "What is the password?"
    await pilot.press("enter")
    engine.release(2)
    await until(pilot, lambda: app.screen.query_one(PageHeatMap).token == 2, what="token 2")


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, TERMINATED_EXIT_CODE), (signal.SIGHUP, 128 + signal.SIGHUP)],
                         ids=["sigterm", "sighup"])
def test_a_signal_quits_like_ctrl_q_and_saves_the_answer_in_flight(tmp_path, capfd, signum, code):
    """SIGTERM, or SIGHUP (the terminal closed), mid-answer: the app quits with 143 or 129, the answer saved as
    cancelled, the engine closed (SIGHUP was: the CLI's raising handler ran inside the event loop and the app,
    engine and all, stayed)."""
    engine = GatedEngine(answer="The password is BLUE and the boats are twelve.")
    app = build_app(write_book(tmp_path), ChatOptions(), Factory(engine))
    seen: list[int] = []
    # a signal the app did not take would reach this handler (not kill the test run) and fail the test
    before = signal.signal(signum, lambda got, frame: seen.append(got))

    async def signal_mid_answer(pilot) -> None:
        await ask_until_two_tokens(pilot, app, engine)
        os.kill(os.getpid(), signum)
        await pilot.pause(5)  # the app exits before this ends
        if app.return_code is None:
            app.exit()  # it did not: end the run, and the asserts below fail

    try:
        app.run(headless=True, size=SIZE, auto_pilot=signal_mid_answer)
        assert app.return_code == code and not seen
        os.kill(os.getpid(), signum)  # the handler from before the app is back
        assert seen == [signum]
    finally:
        signal.signal(signum, before)
    store = SessionStore()
    [saved] = store.turns(store.list_sessions()[0].id)
    assert saved.status == "cancelled" and saved.answer.startswith("The password")
    assert engine.closed and engine.aborted == 1
    assert "Traceback" not in capfd.readouterr().err


class EngineDeadError(Exception):
    """vLLM's exception of that name (``vllm/v1/engine/exceptions.py``), which the app tells by name."""


class HungUpEngine(GatedEngine):
    """A :class:`GatedEngine` whose engine core dies of the app's own signal: after ``words`` words, at the next
    ``release()``, it sends ``signum`` to the process (the terminal's SIGHUP reaches the whole process group) and
    fails at once, before the app's event loop could stop the request."""

    def __init__(self, signum: int, words: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.signum, self.words = signum, words

    def stream(self, prompt_ids, max_tokens, cancel=None, sampling=None):
        for i, event in enumerate(super().stream(prompt_ids, max_tokens, cancel, sampling)):
            yield event
            if i + 1 == self.words:
                self.steps.acquire(timeout=10)
                os.kill(os.getpid(), self.signum)
                raise EngineDeadError("EngineCore encountered an issue. See stack trace (above) for the root cause.")


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, TERMINATED_EXIT_CODE), (signal.SIGHUP, 128 + signal.SIGHUP)],
                         ids=["sigterm", "sighup"])
def test_an_engine_core_dead_of_the_same_signal_leaves_the_answer_cancelled(tmp_path, capfd, signum, code):
    """The signal reaches vLLM's engine core too (one process group), which can die, and fail the request, before
    the app stops it: the turn is still the stop's, saved ``cancelled`` with its partial answer (was: ``failed``)."""
    engine = HungUpEngine(signum, 2, answer="The password is BLUE and the boats are twelve.")
    app = build_app(write_book(tmp_path), ChatOptions(), Factory(engine))
    before = signal.getsignal(signum)

    async def signal_as_the_engine_dies(pilot) -> None:
        await ask_until_two_tokens(pilot, app, engine)
        engine.release()
        await pilot.pause(5)  # the app exits before this ends
        if app.return_code is None:
            app.exit()

    try:
        app.run(headless=True, size=SIZE, auto_pilot=signal_as_the_engine_dies)
    finally:
        signal.signal(signum, before)
    assert app.return_code == code
    store = SessionStore()
    [saved] = store.turns(store.list_sessions()[0].id)
    assert (saved.status, saved.answer) == ("cancelled", "The password ")
    assert engine.closed
    assert "Traceback" not in capfd.readouterr().err


class DyingOnCancel(GatedEngine):
    """A :class:`GatedEngine` whose engine core fails as the answer is stopped: ``EngineDeadError``, not
    ``GenerationCancelled``."""

    def _wait(self, ready, cancel) -> None:
        while not ready():
            if cancel is not None and cancel.is_set():
                raise EngineDeadError("EngineCore encountered an issue. See stack trace (above) for the root cause.")


@pytest.mark.asyncio
async def test_an_engine_failure_after_esc_leaves_the_answer_cancelled(tmp_path):
    engine = DyingOnCancel(answer="one two three four")
    app = build_app(write_book(tmp_path), ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.chat.engine is not None and app.chat.document is not None, what="ready")
        app.screen.query_one(PromptInput).value = "Count?"
        await pilot.press("enter")
        engine.release(2)
        await until(pilot, lambda: app.screen.query_one(PageHeatMap).token == 2, what="token 2")
        await pilot.press("escape")
        await until(pilot, lambda: not app.screen.answering, what="the stop")
    store = SessionStore()
    [saved] = store.turns(store.list_sessions()[0].id)
    assert (saved.status, saved.answer) == ("cancelled", "one two ")


def test_an_ignored_sighup_stays_ignored(tmp_path):
    """``nohup locks-chat book.pdf``: the app leaves SIGHUP ignored, and puts nothing in its place."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    app = build_app(write_book(tmp_path), ChatOptions(), Factory(FakeEngine()))
    during: list[object] = []

    async def look(pilot) -> None:
        during.append(signal.getsignal(signal.SIGHUP))
        app.exit()

    try:
        app.run(headless=True, size=SIZE, auto_pilot=look)
        assert during == [signal.SIG_IGN] and signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)
