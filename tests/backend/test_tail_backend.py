"""The tail estimate through the LOCKS backend (``LocksConfig(tail="int8"|"bf16")``), without an engine, on the CPU
paths and, with a GPU, the CUDA path (Triton, the value-mean store by physical page id; inside a CUDA graph too):
the complete pages a decode step does not read enter the softmax as their score times their mean value
(``ops.tail``). The invariants: the setting is validated and travels through ``additional_config``; with the
oracle's exact page masses the output is the brute-force sum over the selected tokens and the other pages' means;
with LOCKS' estimates it is nearer dense attention than dropping the tail; a budget covering the context is dense;
on CUDA a decode step replayed from a CUDA graph gives the eager step's output and writes the completed pages'
mean values."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")

from locks_engine.config import LocksConfig  # noqa: E402
from locks_engine.vllm_backend.config_keys import check_settings, locks_config  # noqa: E402
from vllm.config import VllmConfig  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402

from locks_engine.vllm_backend import compat  # noqa: E402
from locks_engine.vllm_backend.builder import LocksMetadataBuilder  # noqa: E402
from tests.backend.test_oracle_backend import PAGE, SelectionRecorder  # noqa: E402
from tests.backend.test_vllm_backend_scenarios import (  # noqa: E402,F401
    BLOCK_SIZE, D, H, HQ, SCENARIOS, Batch, Run, assert_close, common_metadata, device_of, platform,
)


def decode_run(cfg: LocksConfig, platform: str, seed: int = 0, name: str = "medium_decode"):
    run = Run(SCENARIOS[name], cfg, torch.float32, seed=seed, device=device_of(platform))
    recorder = SelectionRecorder()
    run.impl.hooks.append(recorder)
    run.prefill_context()
    return run, run.scenario_step().cpu(), recorder.selected[-1]


def brute_force(run: Run, selected: torch.Tensor, fmt: str) -> torch.Tensor:
    """`[S, HQ, D]`: per decode row and query head, exact weights on the selected pages' tokens and the exact page
    mass times the page's mean value (stored in ``fmt``) for every other complete page."""
    from locks_engine.ops.tail import store_value_means

    rows = []
    for row, n in enumerate(run.batch.seq_lens):
        q, k, v = run.q[row][n - 1].float().cpu(), run.k[row][:n].float().cpu(), run.v[row][:n].float().cpu()
        out = torch.zeros(HQ, D)
        for hq in range(HQ):
            h = hq // (HQ // H)
            logits = (k[:, h] @ q[hq]) * D**-0.5  # [n]
            pages = [int(p) for p in selected[row, h] if p >= 0]
            read = torch.zeros(n, dtype=torch.bool)
            for p in pages:
                read[p * PAGE:(p + 1) * PAGE] = True
            w = torch.exp(logits - logits.max())
            num, den = (w[read, None] * v[read, h]).sum(0), w[read].sum()
            for p in range(n // PAGE):
                if p not in pages:
                    span = slice(p * PAGE, (p + 1) * PAGE)
                    num = num + w[span].sum() * store_value_means(v[span, h].mean(0), fmt)
                    den = den + w[span].sum()
            out[hq] = num / den
        rows.append(out)
    return torch.stack(rows)


def test_the_setting_is_validated_and_travels_through_additional_config() -> None:
    cfg = LocksConfig(budget=64, tail="int8")
    extra = {"locks": cfg.to_dict()}
    check_settings(extra)
    assert locks_config(extra) == cfg and LocksConfig().tail == "none"
    with pytest.raises(ValueError, match=r"^LocksConfig\.tail='fp8': allowed none, int8, bf16$"):
        LocksConfig(tail="fp8")
    with pytest.raises(ValueError, match="needs page log-mass estimates"):
        LocksConfig(tail="int8", selection="two-level")
    with pytest.raises(ValueError, match="needs page log-mass estimates"):
        LocksConfig(tail="bf16", summary_format="quest")


def test_the_tail_keeps_cuda_graphs_except_with_the_oracle(monkeypatch) -> None:
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=H, head_size=D, dtype=torch.bfloat16)
    monkeypatch.setattr(compat, "on_cpu", lambda: False)

    support = LocksMetadataBuilder.get_cudagraph_support
    flat, tail, oracle = ({"locks": cfg.to_dict()} for cfg in (
        LocksConfig(tail="none"), LocksConfig(tail="int8"), LocksConfig(selection="oracle", tail="int8")))
    assert support(VllmConfig(additional_config=flat), spec) == AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    assert support(VllmConfig(additional_config=tail), spec) == AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    assert support(VllmConfig(additional_config=oracle), spec) == AttentionCGSupport.NEVER


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_a_decode_step_with_the_tail_replays_in_a_cuda_graph(fmt: str, platform: str) -> None:
    """Rows of 320 and 48 tokens complete a page with this step's token: the replay must write its mean value
    (the store's rows are cleared before it) and give the eager step's output."""
    if platform != "cuda":
        pytest.skip("the CUDA path only")
    batch = Batch([320, 511, 129, 48], [1, 1, 1, 1])
    cfg = LocksConfig(budget=4 * PAGE, tail=fmt)
    run = Run(batch, cfg, torch.bfloat16, device="cuda")
    run.prefill_context()
    cam = common_metadata(batch.seq_lens, batch.query_lens, run.block_table, "cuda")
    q, k, v = (torch.cat([x[n - 1:n] for x, n in zip(xs, batch.seq_lens)]).cuda() for xs in (run.q, run.k, run.v))
    run.impl.do_kv_cache_update(None, k, v, run.kv_cache, cam.slot_mapping)
    meta = run.builder.build(0, cam)
    eager = torch.full_like(q, float("nan"))
    run.impl.forward(None, q, k, v, run.kv_cache, meta, eager)
    means, scale = run.impl.path._means
    written = means.clone(), None if scale is None else scale.clone()
    captured = torch.full_like(q, float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run.impl.forward(None, q, k, v, run.kv_cache, meta, captured)
    captured.fill_(float("nan"))
    completed = [int(run.block_table[row, (n // PAGE - 1) // (BLOCK_SIZE // PAGE)]) * (BLOCK_SIZE // PAGE)
                 + (n // PAGE - 1) % (BLOCK_SIZE // PAGE) for row, n in enumerate(batch.seq_lens) if n % PAGE == 0]
    assert len(completed) == 2 and means[completed].abs().sum() > 0
    means[completed] = 0
    if scale is not None:
        scale[completed] = 0
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(means, written[0]) and (scale is None or torch.equal(scale, written[1]))
    assert torch.isfinite(captured).all() and torch.equal(captured, eager)


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_with_exact_page_masses_the_output_is_the_brute_force_tail_sum(fmt: str, platform: str) -> None:
    run, out, selected = decode_run(LocksConfig(budget=4 * PAGE, selection="oracle", tail=fmt), platform)
    assert (selected >= 0).sum(-1).max() == 4  # the longest rows are sparse
    assert_close("oracle+tail", brute_force(run, selected, fmt), out, 1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_estimated_tail_is_nearer_dense_than_dropping_it(seed: int, platform: str) -> None:
    run, dropped, sel_a = decode_run(LocksConfig(budget=4 * PAGE), platform, seed)
    run_t, tailed, sel_b = decode_run(LocksConfig(budget=4 * PAGE, tail="int8"), platform, seed)
    assert torch.equal(sel_a, sel_b)  # the tail changes what is added, not what is read
    dense = run.reference().cpu()
    err = lambda o: ((o - dense).norm(dim=-1) / dense.norm(dim=-1)).mean()  # noqa: E731
    assert err(tailed) < 0.5 * err(dropped)


def test_a_budget_covering_the_context_is_dense_attention(platform: str) -> None:
    batch = SCENARIOS["medium_decode"]
    run, out, _ = decode_run(LocksConfig(budget=max(batch.seq_lens) + 3 * PAGE, tail="int8"), platform)
    assert_close("covering", run.reference().cpu(), out, 1e-5)


def brute_force_tail_share(run: Run, selected: torch.Tensor) -> list[float]:
    """Per decode row: the exact mass of the complete pages no KV head's selection read over every complete page's
    mass, per query head, averaged over each KV head's group and summed over the KV heads (the record's units)."""
    shares = []
    for row, n in enumerate(run.batch.seq_lens):
        q, k = run.q[row][n - 1].float().cpu(), run.k[row][:n].float().cpu()
        complete, total = n // PAGE, 0.0
        for hq in range(HQ):
            h = hq // (HQ // H)
            mass = torch.exp((k[: complete * PAGE, h] @ q[hq]) * D**-0.5).view(complete, PAGE).sum(-1)
            read = {int(p) for p in selected[row, h] if 0 <= p < complete}
            tail = [p for p in range(complete) if p not in read]
            total += float(mass[tail].sum() / mass.sum()) / (HQ // H)
        shares.append(total)
    return shares


@pytest.mark.parametrize("in_kernel", [False, True], ids=["torch-share", "kernel-share"])
def test_the_statistics_carry_the_tails_share_of_the_estimated_mass(tmp_path, platform: str, in_kernel: bool,
                                                                    monkeypatch) -> None:
    """The share, whether the CUDA path computes it with torch (``ops.tail.tail_mass_share``) or takes it from the
    tail kernels' own passes (``locks_kernels.tail.SHARE_IN_KERNEL``)."""
    from locks_engine.stats import StatsRing
    from tests.backend.test_oracle_backend import recorded_run

    if in_kernel:
        if platform != "cuda":
            pytest.skip("the kernels' share: the CUDA path only")
        from locks_kernels import tail as tail_kernels

        monkeypatch.setattr(tail_kernels, "SHARE_IN_KERNEL", True)

    batch, path = SCENARIOS["medium_decode"], tmp_path / "stats.bin"
    cfg = LocksConfig(budget=4 * PAGE, selection="oracle", tail="int8")
    _, _, selected = recorded_run(batch, cfg, platform, stats_path=path)
    record = StatsRing(path).latest()[0]
    got = record["row_tail_mass"][: len(batch.seq_lens)]
    want = brute_force_tail_share(Run(batch, cfg, torch.float32, device=device_of(platform)), selected)
    assert got[0] > 0.1 * H and got[3] == 0  # the longest row leaves much to the tail; 17 tokens read every page
    assert torch.allclose(torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64), atol=1e-4)
    # bytes read: the selected pages' K+V, every complete page's K (the oracle's scores) and int8 mean value
    kv = 2 * PAGE * D * 4  # fp32 K+V of one page of one KV head
    assert record["bytes_read"] == record["pages_read"] * kv + record["summaries_read"] * (kv // 2 + D + 2)
    _, _, _ = recorded_run(batch, LocksConfig(budget=4 * PAGE, selection="oracle"), platform, stats_path=path)
    assert not StatsRing(path).latest()[0]["row_tail_mass"].any()  # no tail, no share
