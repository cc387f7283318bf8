"""Decode hooks of the LOCKS backend without an engine: called with each decode's selection between selection
and attention, undone after attention; a hook unsafe in CUDA graphs turns the builder's graph support off;
the CUDA path takes the summary format its kernels implement only."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")

from vllm.config import VllmConfig  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402

from locks_engine.config import LocksConfig  # noqa: E402
from locks_engine.vllm_backend import compat, hooks  # noqa: E402
from locks_engine.vllm_backend.builder import LocksMetadataBuilder  # noqa: E402
from tests.support.poison_hook import PoisonUnselected  # noqa: E402
from tests.backend.test_vllm_backend_scenarios import BLOCK_SIZE, D, H, SCENARIOS, Run, make_builder  # noqa: E402


class Recorder:
    """Records each call's arguments; its undo records that it ran."""

    cuda_graphs = True
    needs_cache_views = False

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.undone = 0

    def on_decode(self, **kwargs):
        self.calls.append(kwargs)

        def undo() -> None:
            self.undone += 1

        return undo


class PoisonEverything:
    """NaN in every K and V of the cache until its undo runs (attention in between must see it)."""

    cuda_graphs = False
    needs_cache_views = True

    def on_decode(self, *, k_cache, v_cache, **unused):
        saved_k, saved_v = k_cache.clone(), v_cache.clone()
        k_cache.fill_(float("nan"))
        v_cache.fill_(float("nan"))

        def undo() -> None:
            k_cache.copy_(saved_k)
            v_cache.copy_(saved_v)

        return undo


def sparse_run(**kwargs) -> Run:
    run = Run(SCENARIOS["medium_decode"], LocksConfig(budget=96, summary_format="float"), torch.float32, **kwargs)
    run.prefill_context()
    return run


def test_hook_sees_the_selection_and_its_undo_runs_after_attention() -> None:
    run = sparse_run()
    expected = run.scenario_step()
    recorder = Recorder()
    run.impl.hooks.append(recorder)
    assert torch.equal(run.scenario_step(), expected)
    (call,) = recorder.calls
    assert recorder.undone == 1
    assert call["layer_name"] == "layer.0" and call["last_layer"]
    assert call["page_size"] == 16 and call["num_kv_heads"] == H
    assert call["k_cache"].shape == (run.kv_cache.shape[0], BLOCK_SIZE, H, D)
    assert call["seq_lens"].tolist() == SCENARIOS["medium_decode"].seq_lens
    selected = call["selected"]
    assert selected.shape[:2] == (4, H) and selected.dtype == torch.int64
    assert ((selected >= 0).sum(dim=-1) == torch.tensor([6, 6, 6, 2]).view(4, 1)).all()  # 96-token budget
    assert call["block_table"].shape[0] == 4


def test_undo_comes_after_attention_and_restores_the_cache() -> None:
    plain, run = sparse_run(), sparse_run()
    plain.scenario_step()
    run.impl.hooks.append(PoisonEverything())
    out = run.scenario_step()
    assert torch.isnan(out).all(), "attention ran before the hook poisoned the cache, or after its undo"
    assert torch.equal(run.kv_cache, plain.kv_cache)


def test_poison_hook_changes_nothing_for_a_decode_that_reads_only_its_selection() -> None:
    run = sparse_run()
    expected = run.scenario_step()
    run.impl.hooks.append(PoisonUnselected())
    out = run.scenario_step()
    assert torch.isfinite(out).all() and torch.equal(out, expected)
    assert not torch.isnan(run.kv_cache).any()


def test_configured_hooks_are_made_per_layer_and_steer_graph_support(monkeypatch) -> None:
    from vllm.config import set_current_vllm_config

    from locks_engine.vllm_backend.impl import LocksAttentionImpl

    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=H, head_size=D, dtype=torch.float32)
    safe = VllmConfig(additional_config={hooks.HOOKS_KEY: ["tests.backend.test_vllm_backend_hooks:Recorder"]})
    unsafe = VllmConfig(additional_config={hooks.HOOKS_KEY: ["tests.support.poison_hook:PoisonUnselected"]})
    monkeypatch.setattr(compat, "on_cpu", lambda: False)
    support = LocksMetadataBuilder.get_cudagraph_support
    assert support(VllmConfig(), spec) == AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    assert support(safe, spec) == AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    assert support(unsafe, spec) == AttentionCGSupport.NEVER
    with set_current_vllm_config(unsafe):
        impl = LocksAttentionImpl(6, D, D**-0.5, H)
    assert [type(hook) for hook in impl.hooks] == [PoisonUnselected] and not impl.allow_amx
    with set_current_vllm_config(safe):
        impl = LocksAttentionImpl(6, D, D**-0.5, H)
    assert [type(hook) for hook in impl.hooks] == [Recorder] and impl.allow_amx


def test_a_hook_that_cannot_be_imported_fails_with_its_name() -> None:
    with pytest.raises(ValueError, match="no_such_module:Hook"):
        hooks.hook_classes({hooks.HOOKS_KEY: ["no_such_module:Hook"]})


@pytest.mark.parametrize("summary_format", ["float", "paper", "colwise", "chanlog"])
def test_cuda_takes_colwise8_summaries_only(summary_format) -> None:
    cfg = LocksConfig(budget=96, summary_format=summary_format)
    with pytest.raises(ValueError, match=f"summary_format='{summary_format}': allowed on CUDA colwise8"):
        make_builder(cfg, torch.float32, device="cuda")
    make_builder(cfg, torch.float32, device="cpu")
