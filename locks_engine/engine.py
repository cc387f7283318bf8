"""Streaming generation on unmodified vLLM with the LOCKS backend: the engine the CLI, the TUI and the
benchmarks drive.

One :class:`LocksEngine` owns one ``vllm.LLMEngine`` (V1) and drives it step by step, so that text streams as it
is generated, a request can be aborted between steps (also during a chunked prefill), and every step's LOCKS
statistics (``locks_engine.stats``) are read as they are written by the worker process.

How vLLM's processes treat the caller (their environment, SIGINT, stderr, parent watch and exit) is
``EngineOptions.processes`` (``locks_engine.processes``); the caller's own signal handlers stay the caller's (an
app that holds Ctrl+C and SIGTERM during the start wraps the construction: ``locks_chat.engine_client``).
Importing this module imports no vLLM: constructing an engine does.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from locks_engine.config import LocksConfig
from locks_engine.core_watch import ensure_engine_core_alive, watch_engine_core
from locks_engine.models import resolve_model, stay_offline
from locks_engine.platform_args import on_cuda, platform_engine_args
from locks_engine.processes import ProcessPolicy, apply_policy, children_start_quiet, engine_environment
from locks_engine.sampling import GREEDY, Sampling, model_sampling
from locks_engine.stats import dense_step_record, require_locks

SHUTDOWN_TIMEOUT_S = 30.0
"""seconds vLLM's engine core may take to exit after the SIGTERM of :meth:`LocksEngine.close` before it is killed"""


class EngineStartError(RuntimeError):
    """vLLM could not start with the LOCKS backend (message is one line)."""


class GenerationCancelled(Exception):
    """The request was aborted in the engine because the caller cancelled it."""


@dataclass(frozen=True)
class EngineOptions:
    model: str | None = None
    """``None``/"builtin": the built-in model; a local HF directory; or a hub id."""
    model_cache_dir: str | None = None
    """Directory the built-in model is converted into once (``locks_engine.models.resolve_model``); ``None``:
    ``locks_engine.models.default_cache_dir()``."""
    locks: LocksConfig = field(default_factory=LocksConfig)
    max_model_len: int | None = None
    """Context length in tokens (default: the model's)."""
    kv_cache_gib: float | None = None
    """KV cache size in GiB. ``None``: on CUDA vLLM's share of the GPU (``gpu_memory_utilization``, the page
    summaries' bytes reserved); on the CPU the environment's (``processes.engine_environment``), else 1 GiB."""
    gpu_memory_utilization: float = 0.9
    """CUDA: the share of the GPU's memory vLLM may use (weights, activations, KV cache and summaries)."""
    max_num_seqs: int = 8
    """Most sequences decoded at once (CUDA graphs are captured for batches of 1, 2, 4 and 8)."""
    enforce_eager: bool | None = None
    """``None``: eager on the CPU, CUDA graphs on CUDA."""
    load_format: str = "auto"
    """vLLM's weight loading; ``"dummy"``: random weights at the model's shapes (benchmarks)."""
    stats: bool = True
    """Write the per-step statistics ring (the app's panels; on CUDA counted inside the graphs). False: none, and
    no check that every layer runs LOCKS (benchmarks of the statistics' cost)."""
    skip_tokenizer_init: bool = False
    """Start without a tokenizer (benchmarks with prompt token ids and a config-only model directory)."""
    dtype: str = "auto"
    """vLLM's ``dtype``; ``"auto"``: the model's on CUDA, :func:`cpu_dtype` on the CPU."""
    seed: int = 0
    tensor_parallel_size: int = 1
    """GPUs the model is split over (vLLM's tensor parallelism; each rank holds its KV heads' pages)."""
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    """CUDA: the decode batch sizes captured as CUDA graphs; ``None``: 1, 2, 4 and 8 up to ``max_num_seqs``."""
    engine_args: dict[str, Any] = field(default_factory=dict)
    """Further ``vllm.EngineArgs`` fields, passed as they are (benchmarks: ``scheduler_cls``,
    ``disable_cascade_attn``); they override the platform's."""
    processes: ProcessPolicy = field(default_factory=ProcessPolicy)
    """How vLLM's processes treat the caller; the default keeps vLLM's behaviour, an interactive app passes
    ``ProcessPolicy(app_children=True, children_log=...)``."""


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
    ``page_size`` and the engine's ``tail``, ``LocksConfig.tail``) written since the previous event."""
    cached_tokens: int | None = None
    """Prompt tokens vLLM served from its prefix cache instead of prefilling (``RequestOutput.num_cached_tokens``,
    whole KV blocks); ``None`` until the prefill has ended."""


class LocksEngine:
    """vLLM ``LLMEngine`` with LOCKS on every attention layer.

    Args:
        options (EngineOptions): model, LOCKS configuration (validated when it was built), engine sizes and how
            vLLM's processes treat the caller (``processes``, applied here before vLLM is imported).
        stats_dir (str | Path | None): directory for the LOCKS statistics file; ``None``: a temporary one.
    Raises:
        ModelError: ``options.model`` cannot be found or converted (``locks_engine.models``).
        EngineStartError: vLLM failed to start, or some attention layer does not run LOCKS (one line; the engine
            is closed). A KeyboardInterrupt during the start closes the engine and propagates.
    """

    def __init__(self, options: EngineOptions, stats_dir: str | Path | None = None) -> None:
        policy = options.processes
        # before vLLM is imported: vLLM 0.26 reads its logging settings then
        apply_policy(policy)
        with children_start_quiet(policy.children_log) if policy.app_children else contextlib.nullcontext():
            self._start(options, stats_dir)

    def _start(self, options: EngineOptions, stats_dir: str | Path | None) -> None:
        """The start proper, inside what ``options.processes`` wraps it in (``__init__``'s arguments)."""
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        self.options = options
        self._tmp = tempfile.TemporaryDirectory(prefix="locks-stats-") if stats_dir is None else None
        self.stats_path = Path(stats_dir or self._tmp.name) / f"stats-{os.getpid()}.bin"
        engine_environment(options.kv_cache_gib)
        self.on_cuda = on_cuda()
        self.dense_baseline = self.on_cuda and options.locks.dense
        """vLLM's own FLASH_ATTN runs (no LOCKS layer, no statistics)."""
        extra: dict[str, Any] = {"locks": options.locks.to_dict()}
        if options.stats and not self.dense_baseline:
            extra["locks_stats_path"] = str(self.stats_path)
        if options.load_format == "dummy":  # a config-only directory (benchmarks): local, like any model here
            model = options.model
            stay_offline()
        else:
            model = resolve_model(options.model, options.model_cache_dir)
        args = EngineArgs(
            model=str(model),
            max_model_len=options.max_model_len,
            seed=options.seed,
            load_format=options.load_format,
            skip_tokenizer_init=options.skip_tokenizer_init,
            # the app shows its own progress; the loader's bar would print over it
            use_tqdm_on_load=False,
            additional_config=extra,
            tensor_parallel_size=options.tensor_parallel_size,
            **{**platform_engine_args(options, self.on_cuda), **options.engine_args},
        )
        try:
            self.llm = LLMEngine.from_engine_args(args)
            self._core_dead = watch_engine_core(self.llm)
            self.ring = require_locks(self.stats_path, timeout_s=30.0) if "locks_stats_path" in extra else None
            self._flush_device_stats()  # the warm-up steps' records: not taken for the first request's
        except KeyboardInterrupt:
            self.close()  # an engine that came up as Ctrl+C arrived is shut down, not left to exit handlers
            raise
        except Exception as err:  # vLLM raises many kinds; callers show one line
            self.close()
            reason = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
            raise EngineStartError(f"the engine did not start: {reason or type(err).__name__}") from err
        self.tokenizer = None if options.skip_tokenizer_init else self.llm.get_tokenizer()
        self.max_context = int(self.llm.vllm_config.model_config.max_model_len)
        self.dtype = str(self.llm.vllm_config.model_config.dtype).removeprefix("torch.")
        """The dtype the model runs in (``"bfloat16"``, ``"float32"``, ...)."""
        self.model_sampling = model_sampling(model)
        """The model's own sampling defaults (its ``generation_config.json``; greedy when it gives none), which
        :meth:`stream` uses only when passed them."""
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._seen = self.ring.written() if self.ring is not None else 0

    def _flush_device_stats(self) -> None:
        """On CUDA, have the workers append the steps the device finished to the statistics ring (it lags the
        device by a step or two otherwise: ``vllm_backend.device_stats``)."""
        if self.on_cuda and self.ring is not None:
            self.llm.collective_rpc("locks_flush_stats")

    def _dense_record(self, seq_len: int) -> dict[str, Any]:
        """What a decode step of vLLM's FLASH_ATTN reads (every page), as a statistics record."""
        model = self.llm.vllm_config.model_config
        parallel = self.llm.vllm_config.parallel_config
        page = self.options.locks.page_size
        page_bytes = 2 * page * model.get_head_size() * model.dtype.itemsize
        return dense_step_record(seq_len, model.get_num_layers(parallel), model.get_total_num_kv_heads(), page,
                                 page_bytes, -(-self.max_context // page))

    def _new_stats(self) -> list[dict[str, Any]]:
        if self.ring is None:
            return []
        written = self.ring.written()
        new = self.ring.latest(min(written - self._seen, self.ring.capacity)) if written > self._seen else []
        self._seen = written
        for record in new:
            record["pages_per_bin"] = int(self.ring.header["pages_per_bin"])
            record["page_size"] = int(self.ring.header["page_size"])
            record["tail"] = self.options.locks.tail  # what ``row_tail_mass`` measured (``none``: nothing)
        return new

    def stream(
        self, prompt_ids: list[int], max_tokens: int, cancel: threading.Event | None = None,
        sampling: Sampling = GREEDY, ignore_eos: bool = False,
    ) -> Iterator[StreamEvent]:
        """Generate from ``prompt_ids``, one event per engine step.

        Args:
            prompt_ids (list[int]): prompt token ids (at most ``max_context - max_tokens``).
            max_tokens (int): most tokens to generate.
            cancel (threading.Event | None): checked between steps; when set, the request is aborted in the
                engine and :class:`GenerationCancelled` is raised.
            sampling (Sampling): how tokens are drawn (``locks_engine.sampling``); default greedy, the
                model's own defaults being :attr:`model_sampling`. ignore_eos (bool): generate ``max_tokens``
                whatever comes (benchmarks).
        Raises:
            GenerationCancelled: ``cancel`` was set. KeyboardInterrupt (and what subclasses it: the app's SIGTERM)
                aborts the request and propagates.
        """
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=max_tokens, ignore_eos=ignore_eos, output_kind=RequestOutputKind.DELTA, **sampling.to_params()
        )
        with self._lock:
            rid = f"locks-{next(self._ids)}"
            self._new_stats()
            start = time.perf_counter()
            self.llm.add_request(rid, {"prompt_token_ids": list(prompt_ids)}, params)
            generated, finished, interrupted, cached = 0, False, False, None
            try:
                while not finished:
                    if cancel is not None and cancel.is_set():
                        raise GenerationCancelled("cancelled")
                    outputs = [out for out in self._step() if out.request_id == rid]
                    if any(out.finished for out in outputs):
                        self._flush_device_stats()  # the last token's step
                    stats = self._new_stats()
                    before = generated
                    text, reason = "", None
                    for out in outputs:
                        completion = out.outputs[0]
                        text += completion.text or ""
                        generated += len(completion.token_ids)
                        finished = finished or out.finished
                        reason = completion.finish_reason or reason
                        hit = getattr(out, "num_cached_tokens", None)
                        cached = hit if hit is not None else cached
                    if not outputs and not self.llm.has_unfinished_requests():
                        finished = True
                    if self.dense_baseline and before and generated > before:  # a decode step of FLASH_ATTN
                        stats = [self._dense_record(len(prompt_ids) + before)]
                    yield StreamEvent(text, generated, finished, reason, time.perf_counter() - start, stats, cached)
            except KeyboardInterrupt:
                interrupted = True
                raise
            finally:
                if not finished:
                    try:
                        self._abort([rid])
                    except Exception:
                        # a SIGTERM sent to the process group reached the engine core too, which is shutting
                        # down: the abort is best effort and the interrupt goes on
                        if not interrupted:
                            raise

    def generate(self, prompts: list[list[int]], max_tokens: int, ignore_eos: bool = False,
                 ) -> tuple[list[list[int]], list[dict[str, Any]]]:
        """Greedy generation for a batch of prompts decoded together (benchmarks: TPOT of a batch, throughput).

        Args:
            prompts (list[list[int]]): prompt token ids, one list per sequence (each at most
                ``max_context - max_tokens``).
            max_tokens (int): most tokens to generate per sequence. ignore_eos (bool): generate exactly
                ``max_tokens`` per sequence.
        Returns:
            The generated token ids per prompt (in the order given) and the statistics records of every step
            (as :attr:`StreamEvent.stats`; empty without statistics).
        Raises:
            KeyboardInterrupt: the requests are aborted in the engine and it propagates.
        """
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        with self._lock:
            self._new_stats()
            rids = [f"locks-{next(self._ids)}" for _ in prompts]
            tokens: dict[str, list[int]] = {}
            records: list[dict[str, Any]] = []
            try:
                for rid, prompt in zip(rids, prompts):
                    self.llm.add_request(rid, {"prompt_token_ids": list(prompt)}, params)
                while len(tokens) < len(rids) and self.llm.has_unfinished_requests():
                    for out in self._step():
                        if out.finished and out.request_id in rids:
                            tokens[out.request_id] = list(out.outputs[0].token_ids)
                    if len(tokens) == len(rids):
                        self._flush_device_stats()  # the last token's step
                    records += self._new_stats()
            finally:
                left = [rid for rid in rids if rid not in tokens]
                if left:
                    self._abort(left)
            return [tokens.get(rid, []) for rid in rids], records

    def _step(self) -> list[Any]:
        """``self.llm.step()``; vLLM's ``EngineDeadError`` at once when the engine core has exited
        (``locks_engine.core_watch``), where a step would wait for ever."""
        dead = getattr(self, "_core_dead", None)
        ensure_engine_core_alive(dead)
        try:
            return self.llm.step()
        except Exception:
            ensure_engine_core_alive(dead)  # vLLM's client words it "see stack trace (above)": say how it ended
            raise

    def _abort(self, rids: list[str]) -> None:
        """Abort requests ``rids`` in the engine and step until nothing is left unfinished; nothing when the
        engine core has exited (``locks_engine.core_watch``: no step would ever answer)."""
        dead = getattr(self, "_core_dead", None)
        if dead is not None and dead.is_set():
            return
        self.llm.abort_request(rids)
        while self.llm.has_unfinished_requests():
            self.llm.step()

    def close(self) -> None:
        """Shut the engine down and remove the statistics file.

        vLLM's engine core gets :data:`SHUTDOWN_TIMEOUT_S` to exit after its SIGTERM, not vLLM's own 5 s (``vllm/
        v1/utils.py: shutdown``): on a busy machine it ran past them and was killed, which leaves its
        ``vllm_dist_*`` FileStore file (``vllm/utils/network_utils.py: get_file_store_init_method``) in the
        temporary folder. It exits as soon as it is done; the wait is only as long as that.
        """
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            core = getattr(llm, "engine_core", None)
            core_shutdown = getattr(core, "shutdown", None)
            if core_shutdown is not None and "timeout" in inspect.signature(core_shutdown).parameters:
                core_shutdown(timeout=SHUTDOWN_TIMEOUT_S)
            shutdown = getattr(llm, "shutdown", None) or core_shutdown
            if shutdown is not None:
                shutdown()  # after the engine core's own: detaches the engine's finalizer, the rest is done
        if self._tmp is not None:
            self._tmp.cleanup()
