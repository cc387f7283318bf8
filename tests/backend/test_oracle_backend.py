"""The exact-LSE oracle through the LOCKS backend (``LocksConfig(selection="oracle")``), without an engine: every
complete page ranked by its exact log attention mass from its keys, then LOCKS' selection and sparse attention.
On the CPU path and, with a GPU, the CUDA path (eager: the builder declares no CUDA graphs for it). The invariants:
a budget covering a row's pages gives that row dense attention; at a small budget the oracle's pages carry the
most mass any selection of the budget can (so at least LOCKS'); it reads every key but only the selected pages'
values; its statistics count every complete page's K; the setting travels through ``additional_config``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")

from vllm.config import VllmConfig  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402

from locks_engine.config import LocksConfig  # noqa: E402
from locks_engine.ops import summary_bytes  # noqa: E402
from locks_engine.stats import StatsRing  # noqa: E402
from locks_engine.vllm_backend import compat  # noqa: E402
from locks_engine.vllm_backend.builder import LocksMetadataBuilder  # noqa: E402
from locks_engine.vllm_backend.config_keys import check_settings, locks_config  # noqa: E402
from tests.backend.test_vllm_backend_scenarios import (  # noqa: E402,F401
    BLOCK_SIZE, D, H, HQ, SCENARIOS, Batch, Run, assert_close, device_of, make_builder, platform,
)

PAGE = 16


class SelectionRecorder:
    """A decode hook that keeps a host copy of each decode's selection `[S, H, K]`."""

    cuda_graphs = True
    needs_cache_views = False

    def __init__(self) -> None:
        self.selected: list[torch.Tensor] = []

    def on_decode(self, *, selected, **unused):
        self.selected.append(selected.cpu().clone())


def oracle(budget: int) -> LocksConfig:
    return LocksConfig(budget=budget, selection="oracle")


def recorded_run(batch: Batch, cfg: LocksConfig, platform: str, dtype=torch.float32, stats_path=None,
                 seed: int = 0) -> tuple[Run, torch.Tensor, torch.Tensor]:
    """The scenario's two steps; returns the run, the second step's output and its decodes' selection."""
    run = Run(batch, cfg, dtype, seed=seed, stats_path=stats_path, device=device_of(platform))
    recorder = SelectionRecorder()
    run.impl.hooks.append(recorder)
    run.prefill_context()
    out = run.scenario_step()
    return run, out, recorder.selected[-1]


def page_masses(run: Run, row: int) -> torch.Tensor:
    """Exact softmax mass `[HQ, P]` of each page of decode row ``row`` for its query, from the keys (fp32)."""
    n = run.batch.seq_lens[row]
    q = run.q[row][n - 1].float()  # [HQ, D]
    k = run.k[row][:n].float().repeat_interleave(HQ // H, dim=1)  # [n, HQ, D]
    probs = torch.softmax(torch.einsum("hd,nhd->hn", q, k) * D**-0.5, dim=-1)  # [HQ, n]
    pages = -(-n // PAGE)
    return torch.nn.functional.pad(probs, (0, pages * PAGE - n)).view(HQ, pages, PAGE).sum(-1)


def group_value(run: Run, row: int, selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each KV head of decode row ``row``: the exact mass its query heads keep on ``selected`` `[H, K]` (group
    mean), and the selection's value under what ``select_pages`` ranks by (the group mean of each query head's
    share among the complete pages) over its complete pages. Both `[H]`."""
    mass = page_masses(run, row)  # [HQ, P]
    complete = run.batch.seq_lens[row] // PAGE
    shares = (mass[:, :complete] / mass[:, :complete].sum(-1, keepdim=True)).view(H, HQ // H, -1).mean(1)
    kept, value = torch.zeros(H), torch.zeros(H)
    for head in range(H):
        pages = selected[head][selected[head] >= 0]
        kept[head] = mass.view(H, HQ // H, -1)[head][:, pages].sum(-1).mean()
        value[head] = shares[head, pages[pages < complete]].sum()
    return kept, value


def best_value(run: Run, row: int, cfg: LocksConfig) -> torch.Tensor:
    """`[H]` the largest value (as ``group_value``) any selection of ``cfg.budget_pages`` pages with the forced
    ones reaches: the forced complete pages' shares plus the largest of the others'."""
    mass = page_masses(run, row)
    n = run.batch.seq_lens[row]
    pages, complete = -(-n // PAGE), n // PAGE
    shares = (mass[:, :complete] / mass[:, :complete].sum(-1, keepdim=True)).view(H, HQ // H, -1).mean(1)
    forced = torch.zeros(complete, dtype=torch.bool)
    forced[: cfg.sink_pages] = True
    forced[max(0, pages - 1 - cfg.recent_pages):] = True
    free = cfg.budget_pages - int(forced.sum()) - (pages > complete)
    others = shares[:, ~forced].sort(dim=-1, descending=True).values[:, :max(free, 0)]
    return shares[:, forced].sum(-1) + others.sum(-1)


def test_the_setting_is_validated_and_travels_through_additional_config() -> None:
    cfg = LocksConfig(budget=512, selection="oracle")
    assert not cfg.summarized and LocksConfig().summarized and not LocksConfig(dense=True).summarized
    assert cfg.layer_candidates(3) == 0
    extra = {"locks": cfg.to_dict()}
    check_settings(extra)
    assert locks_config(extra) == cfg
    assert locks_config({"locks": {"selection": "oracle"}}) == LocksConfig(selection="oracle")
    assert make_builder(cfg, torch.float32).cfg == cfg
    with pytest.raises(ValueError, match=r"^LocksConfig\.selection='exact': allowed flat, two-level, oracle$"):
        LocksConfig(selection="exact")
    with pytest.raises(ValueError, match=r"additional_config\[\"locks\"\]: .*selection='Oracle'.*oracle"):
        check_settings({"locks": {"selection": "Oracle"}})
    with pytest.raises(ValueError, match="'quest' is a selector itself: allowed with selection 'flat' only"):
        LocksConfig(selection="oracle", summary_format="quest")


def test_the_oracle_runs_attention_outside_cuda_graphs(monkeypatch) -> None:
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=H, head_size=D, dtype=torch.bfloat16)
    support = LocksMetadataBuilder.get_cudagraph_support
    monkeypatch.setattr(compat, "on_cpu", lambda: False)
    flat, exact = ({"locks": LocksConfig(selection=s).to_dict()} for s in ("flat", "oracle"))
    assert support(VllmConfig(additional_config=flat), spec) == AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    assert support(VllmConfig(additional_config=exact), spec) == AttentionCGSupport.NEVER


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_budget_covering_context_equals_dense(name: str, dtype: torch.dtype, platform: str) -> None:
    batch = SCENARIOS[name]
    run = Run(batch, oracle(max(batch.seq_lens) + 3 * PAGE), dtype, device=device_of(platform))
    run.prefill_context()
    assert_close(name, run.reference(), run.scenario_step(), 1e-5 if dtype == torch.float32 else 2e-2)
    assert run.impl._store is None  # no summaries kept


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rows_within_the_budget_attend_densely_while_the_longest_is_ranked(dtype: torch.dtype, platform: str) -> None:
    """20 pages: rows of 300, 129 and 17 tokens (19, 9, 2 pages) read all theirs, the 511-token row 20 of 32."""
    batch = SCENARIOS["medium_decode"]
    run, out, selected = recorded_run(batch, oracle(20 * PAGE), platform, dtype)
    counts = (selected >= 0).sum(-1)  # [S, H]
    assert counts.tolist() == [[19] * H, [20] * H, [9] * H, [2] * H]
    ref, tol = run.reference(), 1e-5 if dtype == torch.float32 else 2e-2
    for row in (0, 2, 3):
        assert_close(f"row {row}", ref[row], out[row], tol)


@pytest.mark.parametrize("budget", [64, 96, 208], ids=["4_pages", "6_pages", "13_pages"])
@pytest.mark.parametrize("seed", [0, 5])
def test_the_oracle_keeps_the_most_mass_the_budget_allows(budget: int, seed: int, platform: str) -> None:
    """Per decode row and KV head: the oracle's pages reach the best value any selection of the budget can
    (checked by value, not indices, because of ties) and keep at least LOCKS' exact mass in sum."""
    batch = SCENARIOS["medium_decode"]
    run, _, exact = recorded_run(batch, oracle(budget), platform, seed=seed)
    locks_run, _, estimated = recorded_run(batch, LocksConfig(budget=budget), platform, seed=seed)
    oracle_kept, locks_kept = [], []
    for row in range(len(batch.seq_lens)):
        kept, value = group_value(run, row, exact[row])
        kept_locks, value_locks = group_value(locks_run, row, estimated[row])
        torch.testing.assert_close(value, best_value(run, row, oracle(budget)), rtol=1e-4, atol=1e-6)
        assert (value >= value_locks - 1e-5).all(), (row, value, value_locks)
        oracle_kept.append(kept)
        locks_kept.append(kept_locks)
    assert torch.stack(oracle_kept).sum() >= torch.stack(locks_kept).sum() - 1e-5


def test_it_reads_every_key_but_only_the_selected_pages_values(tmp_path, platform: str) -> None:
    """NaN in the values of every page no KV head selected leaves the answer unchanged; the statistics count the
    selected pages' K+V and every complete page's K."""
    batch = SCENARIOS["medium_decode"]
    path = tmp_path / "stats.bin"
    run, first, selected = recorded_run(batch, oracle(96), platform, stats_path=path)
    record = StatsRing(path).latest()[0]
    kv = summary_bytes(PAGE, 8, D, "colwise8", torch.float32)[1]
    assert list(record["row_pages_read"][:4]) == [H * 6, H * 6, H * 6, H * 2]
    assert record["summaries_read"] == H * sum(n // PAGE for n in batch.seq_lens)
    assert record["bytes_read"] == record["pages_read"] * kv + record["summaries_read"] * kv // 2
    assert record["bytes_read"] < record["bytes_dense"]
    v_cache = compat.split_kv_cache(run.kv_cache, D, compat.kv_layout_name())[1]
    for row, n in enumerate(batch.seq_lens):
        read = set(selected[row][selected[row] >= 0].tolist())
        for page in set(range(-(-n // PAGE))) - read:
            block = run.block_table[row, page * PAGE // BLOCK_SIZE]
            start = page * PAGE % BLOCK_SIZE
            v_cache[block, start:start + PAGE] = float("nan")
    assert torch.isnan(run.kv_cache).any()
    again = run.scenario_step()
    assert torch.equal(first, again)


@pytest.mark.parametrize("platform", ["cpu_kernel"], indirect=True)
def test_keys_copied_from_a_cpu_cache_are_the_keys_its_view_shows(platform: str) -> None:
    """``copied_keys`` (the oracle's reader for the ``amx`` layout, which has no view) on the ``vec`` layout: the
    copy addressed through its table holds what the cache's K view holds through the block table."""
    from locks_engine.ops import gather_pages
    from locks_engine.vllm_backend.cpu import copied_keys

    if not compat.on_cpu():
        pytest.skip("needs vLLM's CPU platform (its cache layout)")
    run = Run(SCENARIOS["mixed_small"], oracle(64), torch.bfloat16, seed=2)
    run.prefill_context()
    table = run.block_table[:, :3]
    keys, copy_table = copied_keys(run.kv_cache, D, "vec", table, PAGE)
    assert keys.shape == (3 * 3, BLOCK_SIZE, H, D)
    view = compat.split_kv_cache(run.kv_cache, D, "cpu_attn")[0]
    assert torch.equal(gather_pages(keys, copy_table, PAGE), gather_pages(view, table, PAGE))
