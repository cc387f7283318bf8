"""KV cache sizing on CUDA with the page summaries reserved.

vLLM sizes the KV cache from ``gpu_memory_utilization``: ``Worker.determine_available_memory``
(``vllm/v1/worker/gpu_worker.py``) profiles a forward pass and hands the rest of the requested share to the KV
cache. LOCKS' page summaries live beside the cache (``impl._summaries``), outside that profile, and take
``f = summary_fraction`` of its bytes (0.176 for ``colwise8`` at r = 8, B = 16, D = 128, bf16). Without a
reserve the summaries would be allocated past the share, or not at all. :func:`reserve_summaries` wraps the
worker's method once per process so that, when the engine runs LOCKS, the KV cache gets ``A / (1 + f)`` of the
``A`` bytes vLLM found and the summaries the rest: KV cache plus summaries take what FLASH_ATTN's KV cache alone
takes at the same ``gpu_memory_utilization``. An explicit ``kv_cache_memory_bytes`` is left as given (the
summaries then come on top of it).
"""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger(__name__)


def locks_summary_fraction(vllm_config) -> float:
    """Bytes kept beside the KV cache over its K+V bytes for an engine of ``vllm_config``: 0 unless its attention
    backend is ``CUSTOM`` (LOCKS, registered by the plugin); the page summaries when it has them
    (``LocksConfig.summarized``: neither ``dense`` nor the ``oracle``), the ``two-level`` selection's superpage
    centroids included (``ops.superpages.superpage_fraction``), plus the tail estimate's mean values
    (``LocksConfig.tail``: ``ops.tail.value_mean_bytes`` a page and KV head over its ``2 B D`` K+V elements; the
    CUDA path's store, ``cuda.CudaPath.update_value_means``).

    Raises:
        ValueError: ``additional_config["locks"]`` is not a valid ``LocksConfig``.
    """
    from locks_engine.ops.select import summary_fraction
    from locks_engine.ops.superpages import superpage_fraction
    from locks_engine.ops.tail import value_mean_bytes
    from locks_engine.vllm_backend.config_keys import locks_config

    backend = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    if getattr(backend, "name", None) != "CUSTOM":
        return 0.0
    cfg = locks_config(vllm_config.additional_config)
    model = vllm_config.model_config
    head_size, dtype = model.get_head_size(), model.dtype
    fraction = 0.0
    if cfg.summarized:
        fraction += summary_fraction(cfg, head_size, dtype)
        if cfg.selection == "two-level":
            fraction += superpage_fraction(cfg.page_size)
    if cfg.tail != "none" and not cfg.dense:
        fraction += value_mean_bytes(head_size, cfg.tail) / (2 * cfg.page_size * head_size * dtype.itemsize)
    return fraction


def kv_share(available_bytes: int, fraction: float) -> int:
    """The KV cache's bytes when ``available_bytes`` hold the cache and its summaries (``fraction`` of it)."""
    return int(available_bytes / (1.0 + fraction))


def reserve_summaries() -> None:
    """Wrap ``Worker.determine_available_memory`` of vLLM's CUDA worker (idempotent). Call in every process
    (the plugin does); a process without the CUDA worker module is left alone."""
    try:
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError:
        return
    if getattr(Worker.determine_available_memory, "_locks_reserve", False):
        return
    determine = Worker.determine_available_memory

    @functools.wraps(determine)
    def determine_with_summaries(self) -> int:
        available = determine(self)
        if self.cache_config.kv_cache_memory_bytes:
            return available
        fraction = locks_summary_fraction(self.vllm_config)
        if not fraction:
            return available
        kv = kv_share(available, fraction)
        logger.info(
            "LOCKS: %.2f GiB for the KV cache and %.2f GiB for its page summaries (%.1f%% of K+V) of %.2f GiB",
            kv / 2**30, (available - kv) / 2**30, 100 * fraction, available / 2**30,
        )
        return kv

    determine_with_summaries._locks_reserve = True
    Worker.determine_available_memory = determine_with_summaries
