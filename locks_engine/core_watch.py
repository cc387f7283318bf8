"""A dead engine core as an error, not a wait for ever.

vLLM's synchronous multiprocess client (``SyncMPClient``, ``vllm/v1/engine/core_client.py``) reads the engine
core's outputs on a thread that feeds ``outputs_queue``, and ``LLMEngine.step()`` blocks on that queue. When the
engine core process dies (the OOM killer, a SIGKILL, the SIGHUP a closed terminal sends its process group), vLLM's
monitor marks the client dead and stops that thread, but puts nothing in the queue: a ``step()`` already waiting
there waits for ever, and so does the app (an ``ask`` that never returns, a chat app that cannot quit). The
asynchronous client puts ``EngineDeadError`` in its queue in that case (``process_outputs_socket``); this does the
same for the synchronous one.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


class EngineCoreExit(threading.Event):
    """Set once an engine core process has exited; :attr:`reason` says how."""

    reason: str = "the engine core process exited"


def exit_reason(exitcode: int | None) -> str:
    """How an engine core process ended, from its ``multiprocessing`` exit code (negative: the signal that killed
    it), in words: ``the engine core process was killed (SIGKILL: out of memory?)``."""
    if exitcode is None or exitcode >= 0:
        return f"the engine core process exited{'' if exitcode is None else f' with code {exitcode}'}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    hint = ": out of memory?" if -exitcode == signal.SIGKILL else ""
    return f"the engine core process was killed ({name}{hint})"


def _exitcode(process: Any) -> int | None:
    """``process``'s exit code; its sentinel is ready as the process exits, a moment before it can be reaped."""
    try:
        process.join(1.0)
        return process.exitcode
    except (AssertionError, ValueError):  # not our child, or closed by vLLM's own shutdown meanwhile
        return None


def watch_engine_core(llm: Any) -> EngineCoreExit | None:
    """Start a daemon thread that waits for ``llm``'s engine core processes; when one of them exits, it sets the
    returned event and puts vLLM's ``EngineDeadError`` in the client's output queue, so that a waiting or later
    ``llm.step()`` raises it (``vllm.v1.engine.core_client.SyncMPClient.get_output``). The exit that
    ``LocksEngine.close`` causes sets it too, on an engine nobody steps any more.

    Args:
        llm: a started ``vllm.v1.engine.llm_engine.LLMEngine`` (or its step/``engine_core`` surface).
    Returns:
        EngineCoreExit | None: set once an engine core process has exited, with how (the error's message too);
        ``None`` when there is nothing to watch (an in-process engine core, a client without the queue or the
        processes).
    """
    core = getattr(llm, "engine_core", None)
    outputs = getattr(core, "outputs_queue", None)
    manager = getattr(getattr(core, "resources", None), "engine_manager", None)
    processes = list(getattr(manager, "processes", None) or [])
    sentinels = [sentinel for sentinel in (getattr(proc, "sentinel", None) for proc in processes)
                 if sentinel is not None]
    if outputs is None or not sentinels:
        return None
    from multiprocessing.connection import wait

    dead = EngineCoreExit()

    def watch() -> None:
        try:
            wait(sentinels)
        except (OSError, ValueError):  # a sentinel closed under the wait: the process object was closed
            pass
        dead.reason = exit_reason(next((code for code in map(_exitcode, processes) if code), None))
        dead.set()
        outputs.put_nowait(engine_dead(dead.reason))

    threading.Thread(target=watch, daemon=True, name="LocksEngineCoreWatch").start()
    return dead


def engine_dead(reason: str) -> Exception:
    """vLLM's ``EngineDeadError`` saying ``reason`` instead of its "see stack trace (above)", which a killed process
    never wrote."""
    from vllm.v1.engine.exceptions import EngineDeadError

    error = EngineDeadError()
    error.args = (reason,)
    return error


def ensure_engine_core_alive(dead: EngineCoreExit | None) -> None:
    """Raise vLLM's ``EngineDeadError`` at once when ``dead`` (from :func:`watch_engine_core`) is set: the one
    error the watch put in the queue was taken by the step that failed first, and a later step would wait for ever.

    Raises:
        EngineDeadError: the engine core has exited.
    """
    if dead is not None and dead.is_set():
        raise engine_dead(dead.reason)
