"""Ctrl+C while the engine starts (``runner.sigint_held``, ``runner.children_start_ignoring_sigint``), without
vLLM: a real SIGINT to this process, a real child process."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

from locks_engine.vllm_backend.runner import children_start_ignoring_sigint, sigint_held


def _report_sigint_disposition(queue) -> None:
    queue.put(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)


def test_a_ctrl_c_during_the_start_is_held_and_the_handler_restored():
    before = signal.getsignal(signal.SIGINT)
    with sigint_held() as interrupted:
        assert not interrupted.is_set()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs at the next bytecode; nothing is raised
        assert interrupted.is_set()
    assert signal.getsignal(signal.SIGINT) is before


def test_a_background_job_that_ignores_sigint_keeps_ignoring_it():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with sigint_held() as interrupted:
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert not interrupted.is_set()
    finally:
        signal.signal(signal.SIGINT, before)


def test_children_start_ignoring_sigint_and_the_app_keeps_its_handler():
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    before = signal.getsignal(signal.SIGINT)
    with children_start_ignoring_sigint():
        child = context.Process(target=_report_sigint_disposition, args=(queue,))
        child.start()
        assert signal.getsignal(signal.SIGINT) is before
    child.join(60)
    assert queue.get(timeout=5) is True, "the child does not ignore SIGINT"
    # outside the block children get Python's usual handler again
    other = context.Process(target=_report_sigint_disposition, args=(queue,))
    other.start()
    other.join(60)
    assert queue.get(timeout=5) is False
