"""vLLM's processes as the engine starts them (``locks_engine.processes``): the environment a policy sets (the
user's own values win), the children's quiet start, and in an app's engine children SIGINT ignored, the end with
the parent and the exit without garbage collection. Without vLLM: real child processes and signals."""

from __future__ import annotations

import multiprocessing
import multiprocessing.process
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from locks_engine import processes
from locks_engine.processes import (
    APP_CHILDREN_ENV,
    APP_ENVIRONMENT,
    ProcessPolicy,
    apply_policy,
    children_start_quiet,
    engine_environment,
    long_context_allowed,
)

#: every variable a policy or the engine may set, restored after each test
TOUCHED = [name for name, _ in APP_ENVIRONMENT] + [
    APP_CHILDREN_ENV, "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_RPC_BASE_PATH",
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN"]


@pytest.fixture
def clean_env(monkeypatch):
    """None of :data:`TOUCHED` set; whatever the test sets is undone after it."""
    for name in TOUCHED:
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    return monkeypatch


def test_the_app_policy_sets_the_childrens_environment(clean_env):
    apply_policy(ProcessPolicy(app_children=True))
    assert {name: os.environ[name] for name, _ in APP_ENVIRONMENT} == {
        "VLLM_LOGGING_STREAM": "ext://sys.stderr", "VLLM_LOGGING_LEVEL": "ERROR", "TORCH_CPP_LOG_LEVEL": "ERROR",
        "PYTHONWARNINGS": "ignore", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    assert os.environ[APP_CHILDREN_ENV] == "1"
    apply_policy(ProcessPolicy(app_children=True))  # idempotent
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_the_users_own_settings_win_over_the_app_policy(clean_env):
    clean_env.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    clean_env.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    clean_env.setenv(APP_CHILDREN_ENV, "0")
    apply_policy(ProcessPolicy(app_children=True))
    assert os.environ["VLLM_LOGGING_LEVEL"] == "DEBUG" and os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert os.environ["VLLM_LOGGING_STREAM"] == "ext://sys.stderr"
    assert os.environ[APP_CHILDREN_ENV] == "1", "the app's children are the app's, whatever was inherited"


def test_the_default_policy_keeps_vllms_behaviour(clean_env):
    apply_policy(ProcessPolicy())
    assert not any(name in os.environ for name in TOUCHED)


def test_a_children_log_needs_app_children():
    with pytest.raises(ValueError, match="children_log='x.log' needs app_children=True"):
        ProcessPolicy(children_log="x.log")


@pytest.mark.parametrize(
    "gib, user, expected", [(None, None, "1"), (None, "4", "4"), (2.4, "4", "2"), (0.3, None, "1"), (3.0, None, "3")],
    ids=["default", "user_set", "given_wins", "at_least_1", "whole"])
def test_the_engine_sets_the_cpu_kv_cache_in_whole_gib(gib, user, expected, clean_env, tmp_path):
    clean_env.setattr(processes, "on_cuda", lambda: True)
    clean_env.setenv("VLLM_RPC_BASE_PATH", str(tmp_path))  # the user's: no private folder
    if user is not None:
        clean_env.setenv("VLLM_CPU_KVCACHE_SPACE", user)
    engine_environment(gib)
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == expected
    assert os.environ["VLLM_RPC_BASE_PATH"] == str(tmp_path)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ, "CUDA: no CPU binding"


@pytest.mark.parametrize("user", [None, "0"], ids=["default", "user_set"])
def test_a_small_cpu_engine_binds_every_cpu_unless_the_user_chose(user, clean_env):
    clean_env.setattr(processes, "on_cuda", lambda: False)
    clean_env.setattr(processes, "cpu_threads_bind", lambda cpus: "0,1")
    if user is not None:
        clean_env.setenv("VLLM_CPU_OMP_THREADS_BIND", user)
    engine_environment(None)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == (user or "0,1")
    rpc = os.environ["VLLM_RPC_BASE_PATH"]
    assert os.path.isdir(rpc) and os.path.basename(rpc).startswith("lk-"), "vLLM's sockets in a private folder"


def test_the_private_socket_folder_is_one_a_process(clean_env):
    """A second call (the variable gone meanwhile, as a test's environment is restored) gives the same folder, still
    there: vLLM keeps the first engine's path for the process's later engines."""
    processes.private_rpc_dir()
    first = os.environ["VLLM_RPC_BASE_PATH"]
    clean_env.delenv("VLLM_RPC_BASE_PATH")
    processes.private_rpc_dir()
    assert os.environ["VLLM_RPC_BASE_PATH"] == first and os.path.isdir(first)


@pytest.mark.parametrize("value, allowed", [(None, False), ("", False), ("1", True)], ids=["unset", "empty", "set"])
def test_a_long_context_is_allowed_by_the_environment(value, allowed, clean_env):
    if value is not None:
        clean_env.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", value)
    assert long_context_allowed() is allowed


@pytest.mark.parametrize("policy, quiet", [(ProcessPolicy(), False), (ProcessPolicy(app_children=True), True)],
                         ids=["default", "app"])
def test_the_engine_applies_its_policy_when_it_starts(policy, quiet, clean_env):
    """``LocksEngine`` sets the policy's environment and starts vLLM's processes quiet for an app's engine."""
    from locks_engine.engine import EngineOptions, LocksEngine

    original, seen = multiprocessing.process.BaseProcess.start, []

    def start(self, options, stats_dir):
        seen.append((os.environ.get(APP_CHILDREN_ENV), multiprocessing.process.BaseProcess.start is not original))

    clean_env.setattr(LocksEngine, "_start", start)
    LocksEngine(EngineOptions(processes=policy))
    assert seen == [("1" if quiet else None, quiet)]
    assert multiprocessing.process.BaseProcess.start is original


def _report_sigint_disposition(queue) -> None:
    print("a child's engine log line", file=sys.stderr, flush=True)
    queue.put(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)


def test_children_start_quiet_and_the_app_keeps_its_handler_and_its_stderr(tmp_path, capfd):
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    before = signal.getsignal(signal.SIGINT)
    log = tmp_path / "engine.log"
    log.write_text("earlier\n")
    with children_start_quiet(log):
        child = context.Process(target=_report_sigint_disposition, args=(queue,))
        child.start()
        assert signal.getsignal(signal.SIGINT) is before
        print("the app's own line", file=sys.stderr, flush=True)
    child.join(60)
    assert queue.get(timeout=5) is True, "the child does not ignore SIGINT"
    assert log.read_text() == "earlier\na child's engine log line\n", "the child's stderr is not appended to the log"
    assert capfd.readouterr().err == "the app's own line\n"
    # outside the block children get Python's usual handler again, and the app's stderr
    other = context.Process(target=_report_sigint_disposition, args=(queue,))
    other.start()
    other.join(60)
    assert queue.get(timeout=5) is False
    assert "a child's engine log line" in capfd.readouterr().err


def _sigint_after_leave(app_env: str | None) -> bool:
    """In a child process: whether SIGINT is ignored after ``leave_sigint_to_the_app``."""
    if app_env is None:
        os.environ.pop(processes.APP_CHILDREN_ENV, None)
    else:
        os.environ[processes.APP_CHILDREN_ENV] = app_env
    signal.signal(signal.SIGINT, signal.default_int_handler)
    processes.leave_sigint_to_the_app()
    return signal.getsignal(signal.SIGINT) is signal.SIG_IGN


@pytest.mark.parametrize("app_env,ignored", [("1", True), (None, False), ("0", False)], ids=["app", "unset", "off"])
def test_engine_children_of_the_app_leave_sigint_to_it(app_env, ignored, monkeypatch):
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_sigint_after_leave, (app_env,)) is ignored
    # never in the app's own process
    monkeypatch.setenv(processes.APP_CHILDREN_ENV, "1")
    before = signal.getsignal(signal.SIGINT)
    processes.leave_sigint_to_the_app()
    assert signal.getsignal(signal.SIGINT) is before


def _gc_after_exit_hooks(app_env: str | None, report: str) -> None:
    """In a child process: at its exit, after the policy's exit hook (atexit runs hooks last in, first out),
    write whether the garbage collector is on and objects are frozen to ``report``."""
    import atexit
    import gc

    if app_env is None:
        os.environ.pop(processes.APP_CHILDREN_ENV, None)
    else:
        os.environ[processes.APP_CHILDREN_ENV] = app_env
    atexit.register(lambda: Path(report).write_text(f"{gc.isenabled()} {gc.get_freeze_count() > 0}"))
    processes.leave_sigint_to_the_app()


@pytest.mark.parametrize("app_env,skipped", [("1", True), (None, False)], ids=["app", "unset"])
def test_engine_children_of_the_app_skip_the_garbage_collection_at_exit(app_env, skipped, tmp_path):
    report = tmp_path / "gc.txt"
    child = multiprocessing.get_context("spawn").Process(target=_gc_after_exit_hooks, args=(app_env, str(report)))
    child.start()
    child.join(60)
    assert child.exitcode == 0 and report.read_text() == f"{not skipped} {skipped}"


ORPHAN_SCRIPT = """
import multiprocessing, os, signal, sys, time
from locks_engine import processes

def engine_child():
    # let go of the pipes the test reads, so that it sees the parent's end alone
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.environ[processes.APP_CHILDREN_ENV] = sys.argv[1]
    processes.leave_sigint_to_the_app()
    time.sleep(120)

child = multiprocessing.get_context("fork").Process(target=engine_child)
child.start()
print(child.pid, flush=True)
time.sleep(1)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, ended but not reaped by its new parent, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize("app_env,ends", [("1", True), ("0", False)], ids=["app", "off"])
def test_engine_children_of_the_app_end_when_the_app_is_killed(app_env, ends):
    done = subprocess.run([sys.executable, "-c", ORPHAN_SCRIPT, app_env], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    pid = int(done.stdout.split()[0])
    try:
        deadline = time.monotonic() + 20
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _running(pid) is not ends
    finally:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)
