"""The Quest baseline through the LOCKS backend (``LocksConfig.summary_format`` ``quest``, ``quest2``, ``quest4``):
the bounds the builder stores, the upper bound they give, and a decode that reads the budget's pages and nothing
else, on the CPU path; on CUDA a clear refusal."""

from __future__ import annotations

import pytest
import torch

from locks_engine.config import LocksConfig, quest_chunks
from locks_engine.ops import build_page_summaries, build_quest_summaries, oracle_scores, quest_scores, summary_bytes
from tests.support.helpers import make_scenario


@pytest.mark.parametrize("fmt, chunks, nbytes", [("quest", 1, 256), ("quest2", 2, 512), ("quest4", 4, 1024)])
def test_quest_formats_store_min_and_max_per_chunk(fmt: str, chunks: int, nbytes: int) -> None:
    assert quest_chunks(fmt) == chunks
    assert summary_bytes(16, 8, 64, fmt) == (nbytes, 4096)  # 4 n D bytes against bf16 K+V
    keys = torch.randn(3, 16, 2, 64)
    store = build_page_summaries(keys, LocksConfig(summary_format=fmt))
    assert store.key_min.shape == (3, 2, chunks, 64) and store.key_min.dtype == torch.float16
    size = 16 // chunks
    for c in range(chunks):
        part = keys[:, c * size:(c + 1) * size]  # [P, B/n, H, D]
        assert torch.equal(store.key_min[:, :, c], part.amin(1).half())
        assert torch.equal(store.key_max[:, :, c], part.amax(1).half())


def test_quest_rejects_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="selection 'flat' only"):
        LocksConfig(summary_format="quest", selection="two-level")
    with pytest.raises(ValueError, match="multiple of it"):
        LocksConfig(summary_format="quest4", page_size=6, rank=2, budget=60)
    assert quest_chunks("colwise8") == 0
    with pytest.raises(ValueError, match="not a Quest format"):
        build_quest_summaries(torch.zeros(1, 16, 1, 8), "colwise8")


def test_finer_chunks_give_a_tighter_bound_that_still_bounds_the_exact_mass() -> None:
    sc = make_scenario([200, 77], num_kv_heads=2, groups=4, head_dim=64, seed=7, key_offset=3.0)
    pages = sc.k_cache.reshape(-1, sc.page_size, *sc.k_cache.shape[2:])
    args = (sc.block_table, sc.seq_lens, sc.page_size, sc.block_size)
    exact = oracle_scores(sc.q, sc.k_cache, *args[:3])
    complete = torch.isfinite(exact)
    bounds = [quest_scores(sc.q, build_quest_summaries(pages, fmt), *args) for fmt in ("quest", "quest2", "quest4")]
    for bound in bounds:
        assert torch.equal(torch.isfinite(bound), complete)
        assert (bound[complete] >= exact[complete] - 1e-2).all()  # fp16 bounds move it by a hair
    assert (bounds[1][complete] <= bounds[0][complete] + 1e-5).all()
    assert (bounds[2][complete] <= bounds[1][complete] + 1e-5).all()
    assert (bounds[2][complete] < bounds[0][complete] - 1e-3).float().mean() > 0.5  # strictly tighter mostly


def test_quest_score_is_the_chunk_bounds_logsumexp() -> None:
    """One page, one head, by hand: chunks of 4 keys, ``log 4 + scale * sum_d max(q_d lo_d, q_d hi_d)``."""
    torch.manual_seed(0)
    keys = torch.randn(1, 16, 1, 8)
    q = torch.randn(1, 1, 8)
    store = build_quest_summaries(keys, "quest4")
    got = quest_scores(q, store, torch.tensor([[0]]), torch.tensor([16]), 16, 16, scale=0.5)
    lo, hi = store.key_min[0, 0].float(), store.key_max[0, 0].float()  # [4, 8]
    chunk = torch.log(torch.tensor(4.0)) + 0.5 * torch.maximum(q[0] * lo, q[0] * hi).sum(-1)
    assert torch.allclose(got[0, 0, 0], torch.logsumexp(chunk, 0), atol=1e-5)


vllm = pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")

from locks_engine.stats import StatsRing  # noqa: E402
from tests.backend.test_vllm_backend_scenarios import (  # noqa: E402,F401
    BLOCK_SIZE, H, SCENARIOS, Run, assert_unread_pages_change_nothing, compat, device_of, platform,
)


@pytest.mark.parametrize("fmt", ["quest", "quest4"])
def test_quest_through_the_backend_reads_the_budget_and_only_those_pages(tmp_path, platform: str, fmt: str) -> None:
    batch = SCENARIOS["medium_decode"]
    cfg = LocksConfig(budget=96, summary_format=fmt)
    if platform == "cuda":
        with pytest.raises(ValueError, match="allowed on CUDA"):
            Run(batch, cfg, torch.float32, stats_path=tmp_path / "stats.bin", device="cuda").prefill_context()
        return
    run = Run(batch, cfg, torch.float32, stats_path=tmp_path / "stats.bin", device=device_of(platform))
    run.prefill_context()
    # the store holds each complete page's bounds, as the ops build them from the cache
    k_cache = compat.split_kv_cache(run.kv_cache, 64, compat.kv_layout_name())[0]
    store = run.impl._store
    for row, n in enumerate(batch.seq_lens):
        for page in range(n // 16):
            block = int(run.block_table[row, page * 16 // BLOCK_SIZE])
            offset = page * 16 % BLOCK_SIZE
            keys = k_cache[block, offset:offset + 16].unsqueeze(0)  # [1, 16, H, D]
            want = build_quest_summaries(keys, fmt)
            pid = block * (BLOCK_SIZE // 16) + offset // 16
            assert torch.equal(store.key_min[pid], want.key_min[0])
            assert torch.equal(store.key_max[pid], want.key_max[0])
    first = run.scenario_step()
    ring = StatsRing(tmp_path / "stats.bin")
    record, per_bin = ring.latest()[0], int(ring.header["pages_per_bin"])
    assert list(record["row_pages_read"][:4]) == [H * 6, H * 6, H * 6, H * 2]
    assert record["bytes_read"] < record["bytes_dense"]
    assert_unread_pages_change_nothing(run, record, per_bin, first)
