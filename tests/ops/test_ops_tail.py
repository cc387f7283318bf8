"""locks_engine.ops.tail: per-page mean values, the tail split and its log-sum-exp merge with the exact split."""

from __future__ import annotations

import math

import pytest
import torch

from locks_engine.ops.tail import (
    merge_splits, page_value_means, store_value_means, tail_split, value_mean_bytes)


def attend(q, keys, values, scale):
    """Brute-force softmax attention: out `[D]`, lse."""
    logits = scale * keys @ q
    return torch.softmax(logits, 0) @ values, torch.logsumexp(logits, 0)


def test_merge_of_two_exact_splits_is_attention_over_their_union():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(8, generator=gen)
    keys, values = torch.randn(40, 8, generator=gen), torch.randn(40, 8, generator=gen)
    out_a, lse_a = attend(q, keys[:13], values[:13], 0.5)
    out_b, lse_b = attend(q, keys[13:], values[13:], 0.5)
    out, lse = merge_splits(out_a, lse_a, out_b, lse_b)
    ref, ref_lse = attend(q, keys, values, 0.5)
    assert torch.allclose(out, ref, atol=1e-6) and torch.allclose(lse, ref_lse, atol=1e-6)


def test_merge_with_an_empty_tail_returns_the_exact_split_unchanged():
    out_a, lse_a = torch.randn(3, 5), torch.randn(3)
    out_t, lse_t = tail_split(torch.full((3, 7), float("-inf")), torch.randn(7, 5))
    assert torch.equal(lse_t, torch.full((3,), float("-inf"))) and torch.equal(out_t, torch.zeros(3, 5))
    out, lse = merge_splits(out_a, lse_a, out_t, lse_t)
    assert torch.equal(out, out_a) and torch.equal(lse, lse_a)
    # two empty splits: zeros, -inf, no NaN
    out, lse = merge_splits(out_t, lse_t, out_t, lse_t)
    assert torch.equal(out, torch.zeros(3, 5)) and torch.isneginf(lse).all()


def test_tail_estimate_is_exact_when_every_page_holds_one_key_repeated():
    gen = torch.Generator().manual_seed(1)
    pages, b, d, scale = 6, 4, 8, 8 ** -0.5
    page_keys = torch.randn(pages, d, generator=gen)
    keys = page_keys.repeat_interleave(b, 0)  # [P*B, D], equal within a page
    values = torch.randn(pages * b, d, generator=gen)
    q = torch.randn(d, generator=gen)
    exact = [0, 5]
    rows = torch.cat([torch.arange(p * b, (p + 1) * b) for p in exact])
    out_x, lse_x = attend(q, keys[rows], values[rows], scale)
    s = scale * page_keys @ q + math.log(b)  # each page's log mass, exact here
    s[exact] = float("-inf")
    out_t, lse_t = tail_split(s, page_value_means(values, b))
    out, lse = merge_splits(out_x, lse_x, out_t, lse_t)
    ref, ref_lse = attend(q, keys, values, scale)
    assert torch.allclose(out, ref, atol=1e-5) and torch.allclose(lse, ref_lse, atol=1e-5)
    # dropping the tail instead is far off
    assert (out_x - ref).norm() > 0.1 * ref.norm()


def test_tail_split_batches_over_leading_dims_and_per_row_means():
    gen = torch.Generator().manual_seed(2)
    s, means = torch.randn(2, 3, 5, generator=gen), torch.randn(2, 3, 5, 4, generator=gen)
    out, lse = tail_split(s, means)
    ref = torch.einsum("hgp,hgpd->hgd", torch.softmax(s, -1), means)
    assert torch.allclose(out, ref, atol=1e-6) and torch.allclose(lse, s.logsumexp(-1))


def test_value_means_storage_and_bytes():
    values = torch.randn(2, 32, 64)
    means = page_value_means(values, 16)
    assert means.shape == (2, 2, 64) and torch.allclose(means[1, 1], values[1, 16:].mean(0))
    with pytest.raises(ValueError, match="multiple of page_size"):
        page_value_means(values[:, :30], 16)
    int8 = store_value_means(means, "int8")
    step = means.abs().amax(-1, keepdim=True) / 127
    assert ((int8 - means).abs() <= step / 2 + 1e-3 * step).all() and not torch.equal(int8, means)
    assert torch.equal(store_value_means(means, "bf16"), means.bfloat16().float())
    with pytest.raises(ValueError, match="allowed bf16, int8"):
        store_value_means(means, "fp8")
    assert value_mean_bytes(64, "bf16") == 128 and value_mean_bytes(64, "int8") == 66
    with pytest.raises(ValueError):
        value_mean_bytes(64, "int4")


def brute_tail_attention(q, k, v, selected, scores, means, seq_len, page_size, scale):
    """One sequence, loops: exact over the selected pages' tokens plus exp(s_j) vbar_j over the other complete
    pages, one query head at a time. k, v `[N, H, D]`; means `[P, H, D]` by logical page."""
    heads, groups = k.shape[1], q.shape[0] // k.shape[1]
    out = torch.zeros(q.shape)
    for hq in range(q.shape[0]):
        h = hq // groups
        pages = [int(p) for p in selected[h] if p >= 0]
        num, den = torch.zeros(q.shape[1]), 0.0
        for p in pages:
            for t in range(p * page_size, min((p + 1) * page_size, seq_len)):
                w = math.exp(scale * float(q[hq] @ k[t, h]))
                num, den = num + w * v[t, h], den + w
        for p in range(seq_len // page_size):
            if p not in pages:
                w = math.exp(float(scores[hq, p]))
                num, den = num + w * means[p, h], den + w
        out[hq] = num / den
    return out


def test_tail_paged_attention_matches_a_brute_force_loop():
    from locks_engine.ops import physical_page_ids
    from locks_engine.ops.tail import cache_value_means, row_value_means, tail_paged_attention

    gen = torch.Generator().manual_seed(3)
    page, block, heads, hq, dim, scale = 4, 8, 2, 4, 8, 8 ** -0.5
    k_cache = torch.randn(6, block, heads, dim, generator=gen)
    v_cache = torch.randn(6, block, heads, dim, generator=gen)
    block_table = torch.tensor([[4, 1, 3], [0, 5, 2]])
    seq_lens = torch.tensor([23, 14])
    pmax = 6
    q = torch.randn(2, hq, dim, generator=gen)
    scores = torch.randn(2, hq, pmax, generator=gen)
    selected = torch.tensor([[[0, 5, -1], [2, 4, 5]], [[1, 3, -1], [0, 3, -1]]])
    ids = physical_page_ids(block_table, block // page)
    means = cache_value_means(v_cache, page, "bf16")[ids]  # [S, Pmax, H, D] from a store by physical page id
    assert torch.equal(means, row_value_means(v_cache, block_table, page, "bf16"))
    out, lse = tail_paged_attention(q, k_cache, v_cache, block_table, seq_lens, selected, scores, means, page, scale)
    for s in range(2):
        k = k_cache[block_table[s]].reshape(-1, heads, dim)
        v = v_cache[block_table[s]].reshape(-1, heads, dim)
        ref = brute_tail_attention(q[s], k, v, selected[s], scores[s], means[s], int(seq_lens[s]), page, scale)
        assert torch.allclose(out[s], ref, atol=1e-5), s
    assert torch.isfinite(lse).all()
    # a selection of every page: the tail is empty, exact attention over the whole row
    from locks_engine.ops import dense_paged_attention
    every = torch.arange(pmax).expand(2, heads, pmax)
    out_all, _ = tail_paged_attention(q, k_cache, v_cache, block_table, seq_lens, every, scores, means, page, scale)
    dense, _ = dense_paged_attention(q, k_cache, v_cache, block_table, seq_lens, page, scale)
    assert torch.allclose(out_all, dense, atol=1e-6)


def test_cache_value_means_by_physical_page():
    from locks_engine.ops.tail import cache_value_means

    v = torch.randn(3, 8, 2, 4)
    means = cache_value_means(v, 4, "int8")
    assert means.shape == (6, 2, 4)
    assert torch.allclose(means[3], v[1, 4:].mean(0), atol=v.abs().max().item() / 127)
    with pytest.raises(ValueError, match="does not divide"):
        cache_value_means(v, 3, "bf16")


@pytest.mark.parametrize("fmt", ["int8", "bf16"])
def test_a_store_by_physical_page_reads_back_as_the_row_means(fmt):
    from locks_engine.ops.tail import (
        cache_value_means, decode_value_means, encode_value_means, row_value_means, stored_row_value_means)

    gen = torch.Generator().manual_seed(5)
    v = torch.randn(5, 8, 2, 4, generator=gen)
    means = v.reshape(10, 4, 2, 4).mean(1)  # [physical pages, H, D] at B = 4
    stored, scale = encode_value_means(means, fmt)
    assert stored.dtype == (torch.int8 if fmt == "int8" else torch.bfloat16)
    assert scale is None if fmt == "bf16" else scale.shape == (10, 2) and scale.dtype == torch.float16
    assert torch.equal(decode_value_means(stored, scale), cache_value_means(v, 4, fmt))
    block_table = torch.tensor([[3, 1], [0, 4]], dtype=torch.int32)
    rows = stored_row_value_means(stored, scale, block_table, 2)
    assert torch.equal(rows, row_value_means(v, block_table, 4, fmt))
    with pytest.raises(ValueError, match="allowed"):
        encode_value_means(means, "int4")
