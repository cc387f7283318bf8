"""An engine core process that dies while a request streams (the OOM killer, a SIGKILL, the SIGHUP of a closed
terminal) ends the stream with vLLM's ``EngineDeadError`` (``locks_engine.core_watch``), where vLLM's synchronous
client left ``step()`` waiting on its output queue for ever: ``ask`` hung, and the chat app could not quit.
Without vLLM's engine: a real child process as the engine core, the client's queue and step as vLLM has them."""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from types import SimpleNamespace

import pytest

from locks_engine.core_watch import exit_reason, watch_engine_core
from tests.engine.test_engine_signals import scripted_engine

pytest.importorskip("vllm", reason="the watch raises vLLM's EngineDeadError")


class QueueClient:
    """``SyncMPClient``'s surface: ``get_output`` blocks on ``outputs_queue`` and raises what is an exception
    (``vllm/v1/engine/core_client.py``); the engine core is ``process``."""

    def __init__(self, process) -> None:
        self.outputs_queue = queue.Queue()
        self.resources = SimpleNamespace(engine_manager=SimpleNamespace(processes=[process]))

    def get_output(self):
        outputs = self.outputs_queue.get()
        if isinstance(outputs, Exception):
            # vLLM's monitor has marked the client dead by then: ``_format_exception`` raises a new
            # ``EngineDeadError`` with its own words
            raise type(outputs)(suppress_context=True)
        return outputs


class QueueLLM:
    """``LLMEngine``'s step/abort surface over :class:`QueueClient`: the first step answers one token, the next
    ones wait for the engine core's outputs, which never come."""

    def __init__(self, process) -> None:
        self.engine_core = QueueClient(process)
        self.steps, self.aborted = 0, []

    def add_request(self, rid, prompt, params):
        self.rid = rid

    def step(self):
        self.steps += 1
        if self.steps == 1:
            completion = SimpleNamespace(text="x", token_ids=[1], finish_reason=None)
            return [SimpleNamespace(request_id=self.rid, outputs=[completion], finished=False)]
        self.engine_core.get_output()
        return []

    def abort_request(self, rids):
        self.aborted.extend(rids)

    def has_unfinished_requests(self):
        return True  # a step after an abort would wait for ever too


@pytest.fixture
def engine_core():
    process = multiprocessing.get_context("fork").Process(target=time.sleep, args=(120,), daemon=True)
    process.start()
    yield process
    process.kill()
    process.join(10)


def stream_in_thread(engine, outcome: list) -> threading.Thread:
    def run():
        try:
            for _ in engine.stream([1, 2, 3], max_tokens=50):
                pass
            outcome.append("finished")
        except BaseException as err:  # noqa: BLE001 - the test reads what ended the stream
            outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_an_engine_core_that_dies_mid_answer_ends_the_stream_with_engine_dead(engine_core):
    llm = QueueLLM(engine_core)
    engine = scripted_engine(llm)
    engine._core_dead = watch_engine_core(llm)
    outcome: list = []
    thread = stream_in_thread(engine, outcome)
    deadline = time.monotonic() + 60  # the first step comes after vLLM's first import
    while llm.steps < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    assert thread.is_alive() and llm.steps == 2, "the stream waits on the engine core's outputs"
    engine_core.kill()
    thread.join(20)
    assert not thread.is_alive(), "the stream still waits for a dead engine core"
    [err] = outcome
    assert type(err).__name__ == "EngineDeadError"
    assert str(err) == "the engine core process was killed (SIGKILL: out of memory?)"
    assert llm.aborted == [], "no abort is sent to a dead engine core, nor stepped for"
    # a second request fails at once, not on a queue nobody feeds any more
    thread = stream_in_thread(engine, outcome)
    thread.join(20)
    assert not thread.is_alive() and type(outcome[-1]).__name__ == "EngineDeadError" and llm.steps == 2


@pytest.mark.parametrize("exitcode, words", [(-9, "was killed (SIGKILL: out of memory?)"), (-1, "was killed (SIGHUP)"),
                                             (1, "exited with code 1"), (None, "exited")],
                         ids=["sigkill", "sighup", "code", "unknown"])
def test_the_exit_is_said_in_words(exitcode, words):
    assert exit_reason(exitcode) == f"the engine core process {words}"


def test_nothing_is_watched_without_engine_core_processes():
    llm = SimpleNamespace(engine_core=SimpleNamespace(outputs_queue=queue.Queue(), resources=SimpleNamespace(
        engine_manager=None)))
    assert watch_engine_core(llm) is None
    assert watch_engine_core(SimpleNamespace()) is None  # an in-process engine core: no queue, no process
