"""Sparse paged attention: equals dense when the budget covers every page, reads only what it selects."""

import pytest
import torch

from locks_engine import LocksConfig
from locks_engine.ops import (
    build_cache_summaries,
    dense_paged_attention,
    score_pages,
    select_pages,
    sparse_paged_attention,
)
from locks_engine.ops.paging import gather_selected_tokens, page_rows
from tests.support.helpers import assert_close, make_scenario

LENGTHS = {
    "one_token": [1],
    "one_page": [16],
    "partial_last_page": [17],
    "odd_lengths": [100, 333, 1, 47],
    "block_boundary": [64, 65],
}


@pytest.mark.parametrize("lengths", LENGTHS.values(), ids=LENGTHS.keys())
@pytest.mark.parametrize("groups", [1, 4, 7], ids=lambda g: f"gqa{g}")
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("budget_slack", [0, 3], ids=["budget_at_pages", "budget_past_pages"])
def test_full_budget_equals_dense(lengths, groups, head_dim, budget_slack):
    sc = make_scenario(lengths, num_kv_heads=2, groups=groups, head_dim=head_dim, seed=len(lengths) + groups)
    pages = -(-max(lengths) // sc.page_size)
    cfg = LocksConfig(budget=max(pages + budget_slack, 3) * sc.page_size, summary_format="paper")
    store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, cfg)
    scores = score_pages(sc.q, store, sc.block_table, sc.seq_lens, sc.page_size, sc.block_size)
    selected = select_pages(scores, sc.seq_lens, 2, cfg)
    out, lse = sparse_paged_attention(
        sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, selected, sc.page_size
    )
    ref, ref_lse = dense_paged_attention(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, sc.page_size)
    assert_close("out", ref, out, 1e-5)
    assert_close("lse", ref_lse, lse, 1e-6)


def test_dense_matches_sdpa_on_contiguous_keys():
    sc = make_scenario([100, 7], num_kv_heads=2, groups=4, head_dim=64, seed=3)
    out, _ = dense_paged_attention(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, sc.page_size)
    for s, n in enumerate(sc.seq_lens.tolist()):
        blocks = sc.block_table[s].long()
        k = sc.k_cache[blocks].flatten(0, 1)[:n].transpose(0, 1)  # [H, n, D]
        v = sc.v_cache[blocks].flatten(0, 1)[:n].transpose(0, 1)
        q = sc.q[s].unsqueeze(1)  # [HQ, 1, D]
        ref = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(4, 0), v.repeat_interleave(4, 0)
        )
        assert_close(f"seq{s}", ref.squeeze(1), out[s], 1e-5)


def test_unselected_pages_are_never_read():
    sc = make_scenario([300, 150], num_kv_heads=2, groups=4, head_dim=64, seed=5)
    cfg = LocksConfig(budget=5 * sc.page_size)
    store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, cfg)
    scores = score_pages(sc.q, store, sc.block_table, sc.seq_lens, sc.page_size, sc.block_size)
    selected = select_pages(scores, sc.seq_lens, 2, cfg)
    out, lse = sparse_paged_attention(
        sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, selected, sc.page_size
    )
    poisoned_k, poisoned_v = sc.k_cache.clone(), sc.v_cache.clone()
    keep = torch.zeros(sc.k_cache.shape[:3], dtype=torch.bool)  # [blocks, tokens, H]
    ppb = sc.block_size // sc.page_size
    for s in range(2):
        for h in range(2):
            for page in selected[s, h][selected[s, h] >= 0].tolist():
                block = sc.block_table[s, page // ppb]
                start = (page % ppb) * sc.page_size
                keep[block, start : start + sc.page_size, h] = True
    poisoned_k[~keep] = float("nan")
    poisoned_v[~keep] = float("nan")
    out2, lse2 = sparse_paged_attention(
        sc.q, poisoned_k, poisoned_v, sc.block_table, sc.seq_lens, selected, sc.page_size
    )
    assert torch.isfinite(out2).all() and torch.isfinite(lse2).all()
    assert_close("out", out, out2, 0.0)
    assert_close("lse", lse, lse2, 0.0)


def test_empty_sequence_gives_zeros_not_nan():
    sc = make_scenario([0, 20], num_kv_heads=1, groups=2, head_dim=64, seed=2)
    cfg = LocksConfig(budget=48)
    store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, cfg)
    scores = score_pages(sc.q, store, sc.block_table, sc.seq_lens, sc.page_size, sc.block_size)
    assert not torch.isnan(scores).any()
    selected = select_pages(scores, sc.seq_lens, 1, cfg)
    assert (selected[0] == -1).all()
    for fn in (sparse_paged_attention,):
        out, lse = fn(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, selected, sc.page_size)
        assert torch.isfinite(out).all() and not torch.isnan(lse).any()
        assert (out[0] == 0).all() and torch.isneginf(lse[0]).all()
    out, lse = dense_paged_attention(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, sc.page_size)
    assert torch.isfinite(out).all() and torch.isneginf(lse[0]).all() and torch.isfinite(lse[1]).all()


def test_bf16_inputs_keep_dtype():
    sc = make_scenario([70], num_kv_heads=2, groups=4, head_dim=64, seed=9, dtype=torch.bfloat16)
    cfg = LocksConfig(budget=160)
    store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, cfg)
    scores = score_pages(sc.q, store, sc.block_table, sc.seq_lens, sc.page_size, sc.block_size)
    selected = select_pages(scores, sc.seq_lens, 2, cfg)
    out, _ = sparse_paged_attention(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, selected, 16)
    ref, _ = dense_paged_attention(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, 16)
    assert out.dtype == torch.bfloat16
    assert_close("bf16", ref.float(), out.float(), 1e-2)


@pytest.mark.parametrize("block_size", [16, 64], ids=lambda b: f"block{b}")
def test_page_rows_gather_equals_token_gather_on_the_vllm_cpu_layout(block_size):
    """vLLM's CPU cache (per block and KV head: K transposed `[D, block_size]`, then V `[block_size, D]`) is
    gathered a page at a time; a contiguous `[num_blocks, block_size, H, D]` copy of it token by token: same
    tokens, and the same attention as a full-budget selection's dense reference."""
    sc = make_scenario([16 * 9 + 5, 40], num_kv_heads=3, groups=2, head_dim=32, block_size=block_size, seed=11)
    nb, heads = sc.k_cache.shape[0], 3
    cache = torch.cat((sc.k_cache.permute(0, 2, 3, 1).reshape(nb, heads, -1),
                       sc.v_cache.transpose(1, 2).reshape(nb, heads, -1)), dim=-1).view(nb, heads, block_size, 64)
    halves = cache.view(nb, heads, 2, -1)
    k_view = halves[:, :, 0].view(nb, heads, 32, block_size).permute(0, 3, 1, 2)
    v_view = halves[:, :, 1].view(nb, heads, block_size, 32).transpose(1, 2)
    assert torch.equal(k_view, sc.k_cache) and torch.equal(v_view, sc.v_cache)
    assert page_rows(v_view, 16) is not None
    assert page_rows(k_view, 16) is None and page_rows(sc.k_cache, 16) is None
    packed = torch.cat((sc.k_cache, sc.v_cache), dim=-1).transpose(1, 2).contiguous()  # HND, K | V
    assert page_rows(packed[..., :32].transpose(1, 2), 16) is not None
    gen = torch.Generator().manual_seed(1)
    selected = torch.randint(-1, 10, (2, 3, 6), generator=gen).sort(dim=-1).values
    hnd_k, hnd_v = packed[..., :32].transpose(1, 2), packed[..., 32:].transpose(1, 2)
    for cache, view in ((sc.k_cache, k_view), (sc.v_cache, v_view), (sc.k_cache, hnd_k), (sc.v_cache, hnd_v)):
        token_path = gather_selected_tokens(cache, sc.block_table, selected, 16)
        assert torch.equal(gather_selected_tokens(view, sc.block_table, selected, 16), token_path)
    cfg = LocksConfig(budget=16 * 64)
    pmax = sc.block_table.shape[1] * block_size // 16
    all_pages = select_pages(torch.zeros(2, 6, pmax), sc.seq_lens, 3, cfg)
    out, _ = sparse_paged_attention(sc.q, k_view, v_view, sc.block_table, sc.seq_lens, all_pages, 16)
    ref, _ = dense_paged_attention(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, 16)
    assert_close("page-row attention", ref, out, 1e-5)
