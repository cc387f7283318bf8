"""Baseline selectors: Quest's bound holds, the window reads the newest pages, the shared basis is sized fairly."""

import pytest
import torch

from locks_engine import LocksConfig
from locks_engine.ops import (
    build_page_summaries,
    build_quest_summaries,
    build_shared_basis_summaries,
    fit_shared_basis,
    oracle_scores,
    oracle_scores_by_row,
    quest_scores,
    score_pages,
    select_pages,
    shared_basis_scores,
    shared_rank_at_equal_bytes,
    summary_bytes,
    window_scores,
    write_page_summaries,
)
from tests.support.helpers import assert_close, make_scenario


def _all_pages(sc):
    """Keys `[num_pages, B, H, D]` of every physical page, and their ids."""
    pages = sc.k_cache.reshape(-1, sc.page_size, *sc.k_cache.shape[2:])
    return pages, torch.arange(pages.shape[0])


def test_quest_score_bounds_the_exact_page_lse():
    sc = make_scenario([200, 77], num_kv_heads=2, groups=4, head_dim=64, seed=4, key_offset=5.0)
    pages, _ = _all_pages(sc)
    store = build_quest_summaries(pages)
    bound = quest_scores(sc.q, store, sc.block_table, sc.seq_lens, sc.page_size, sc.block_size)
    exact = oracle_scores(sc.q, sc.k_cache, sc.block_table, sc.seq_lens, sc.page_size)
    complete = torch.isfinite(exact)
    assert torch.equal(torch.isfinite(bound), complete)
    # fp16 min/max rounding can move the bound by a hair
    assert (bound[complete] >= exact[complete] - 1e-2).all()


@pytest.mark.parametrize("seq_lens, groups", [
    ([1], 1), ([16], 4), ([200, 77], 4), ([0, 33, 511], 7), ([15, 16, 17], 1),
], ids=["one_token", "one_page", "two_rows", "empty_row_gqa7", "around_a_page"])
@pytest.mark.parametrize("cap", [None, 1], ids=["one_group", "a_row_a_group"])
def test_oracle_by_row_is_the_oracle(seq_lens: list[int], groups: int, cap: int | None):
    """Groups of rows over the columns they reach (all rows at once, or one row a group when the cap holds less
    than a row): the same scores in the full table's width."""
    sc = make_scenario(seq_lens, num_kv_heads=2, groups=groups, head_dim=32, seed=len(seq_lens), key_offset=2.0)
    # two unused columns past the longest row, as vLLM's table spans max_model_len
    table = torch.cat([sc.block_table, torch.zeros(len(seq_lens), 2, dtype=torch.int32)], dim=1)
    exact = oracle_scores(sc.q, sc.k_cache, table, sc.seq_lens, sc.page_size)
    kwargs = {} if cap is None else {"max_elements": cap}
    rows = oracle_scores_by_row(sc.q, sc.k_cache, table, sc.seq_lens, sc.page_size, **kwargs)
    assert rows.shape == exact.shape == (len(seq_lens), 2 * groups, table.shape[1] * 2)
    complete = torch.isfinite(exact)
    assert torch.equal(torch.isfinite(rows), complete) and complete.any() == any(n >= 16 for n in seq_lens)
    if complete.any():
        assert_close("oracle by row", exact[complete], rows[complete], 1e-6)


def test_oracle_groups_follow_the_cap(monkeypatch):
    """Rows of 16, 200, 40 and 511 tokens (blocks of 32 tokens, 2 KV heads, D 32: 2,048 elements a block): a cap
    of 14 blocks' keys gathers rows 0-1 together (2 x 7 blocks), then rows 2 and 3 each alone (row 3 with row 2
    would be 2 x 16); the scores are the oracle's either way."""
    from locks_engine.ops import baselines

    sc = make_scenario([16, 200, 40, 511], num_kv_heads=2, groups=2, head_dim=32, seed=3, key_offset=2.0)
    widths = []
    real = baselines.oracle_scores

    def counted(q, k_cache, block_table, *args):
        widths.append((q.shape[0], block_table.shape[1]))
        return real(q, k_cache, block_table, *args)

    monkeypatch.setattr(baselines, "oracle_scores", counted)
    per_block = sc.k_cache.shape[1] * 2 * 32
    assert sc.k_cache.shape[1] == 32
    rows = oracle_scores_by_row(sc.q, sc.k_cache, sc.block_table, sc.seq_lens, sc.page_size,
                                max_elements=14 * per_block)
    assert widths == [(2, 7), (1, 2), (1, 16)]
    exact = real(sc.q, sc.k_cache, sc.block_table, sc.seq_lens, sc.page_size)
    complete = torch.isfinite(exact)
    assert torch.equal(torch.isfinite(rows), complete)
    assert_close("oracle in groups", exact[complete], rows[complete], 1e-6)


def test_window_selects_sink_and_newest_pages():
    cfg = LocksConfig(budget=5 * 16, sink_pages=1, recent_pages=1)
    seq_lens = torch.tensor([16 * 30 + 4])
    scores = window_scores(seq_lens, 4, 40, 16)
    selected = select_pages(scores, seq_lens, 2, cfg)
    assert torch.equal(selected[0, 0], torch.tensor([0, 27, 28, 29, 30]))


def test_shared_basis_at_full_rank_matches_oracle():
    sc = make_scenario([160], num_kv_heads=1, groups=4, head_dim=64, seed=8)
    pages, ids = _all_pages(sc)
    basis = fit_shared_basis(pages, rank=64)
    store = build_shared_basis_summaries(pages, basis)
    scores = shared_basis_scores(sc.q, store, basis, sc.block_table, sc.seq_lens, 16, sc.block_size)
    exact = oracle_scores(sc.q, sc.k_cache, sc.block_table, sc.seq_lens, 16)
    assert_close("shared full rank", exact[torch.isfinite(exact)], scores[torch.isfinite(exact)], 5e-3)


def test_shared_rank_at_equal_bytes_spends_the_same_bytes():
    cfg = LocksConfig()
    num_pages = 512
    rank = shared_rank_at_equal_bytes(cfg, 64, num_pages)
    target, _ = summary_bytes(16, 8, 64, cfg.summary_format)
    keys = torch.zeros(1, 16, 1, 64)

    def per_page(r):
        return build_shared_basis_summaries(keys, torch.zeros(1, r, 64)).nbytes + r * 64 * 2 / num_pages

    assert rank > cfg.rank
    assert per_page(rank) <= target < per_page(rank + 1)


def test_page_local_summaries_beat_a_shared_basis_on_page_structured_keys():
    # every page spans its own random 2-D subspace: a shared rank-2 basis cannot hold them, a local one can
    gen = torch.Generator().manual_seed(0)
    sc = make_scenario([16 * 40], num_kv_heads=1, groups=1, head_dim=64, seed=1)
    pages, ids = _all_pages(sc)
    directions = torch.randn(pages.shape[0], 1, 2, 64, generator=gen)
    pages = torch.einsum("pbhr,phrd->pbhd", torch.randn(pages.shape[0], 16, 1, 2, generator=gen) * 4, directions)
    sc.k_cache.copy_(pages.reshape(sc.k_cache.shape))
    cfg = LocksConfig(rank=2, summary_format="float")
    local = build_page_summaries(pages, cfg)
    store = build_page_summaries(torch.zeros_like(pages), cfg)
    write_page_summaries(store, ids, local)
    exact = oracle_scores(sc.q, sc.k_cache, sc.block_table, sc.seq_lens, 16)
    mask = torch.isfinite(exact)
    est_local = score_pages(sc.q, store, sc.block_table, sc.seq_lens, 16, sc.block_size)
    basis = fit_shared_basis(pages, rank=2)
    shared = build_shared_basis_summaries(pages, basis)
    est_shared = shared_basis_scores(sc.q, shared, basis, sc.block_table, sc.seq_lens, 16, sc.block_size)
    err_local = (est_local - exact)[mask].abs().mean()
    err_shared = (est_shared - exact)[mask].abs().mean()
    assert err_local < 1e-3 < err_shared
