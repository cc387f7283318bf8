"""Triton tail estimate against its ops twins (``locks_engine.ops.tail``): the value-mean store (int8 and bf16, every
complete page of a prompt and the page a decode step completes, vLLM's packed K|V cache), the tail split (GQA
groups, partial last pages, rows whose every page is read, ``-inf`` scores, several splits and tiles, int32 and int64
selections), the whole ``tail_paged_attention``, and its CUDA-graph replay."""

import pytest
import torch

import locks_kernels as lk
from locks_engine import LocksConfig
from locks_engine.ops import select_pages
from locks_engine.ops.paging import physical_page_ids
from locks_engine.ops.tail import (
    encode_value_means, page_value_means, stored_row_value_means, tail_paged_attention, tail_pages, tail_split,
)
from tests.support.helpers import assert_close, make_scenario
from tests.support.kernels_support import (
    DEVICE, ON_GPU, on_device, poisoned, requires_bf16_dot, requires_cuda_graphs, requires_kernels,
)

pytestmark = requires_kernels

FORMATS = ("int8", "bf16")
# a full row (every page read: empty tail), no complete page, a partial last page, page-aligned, one token
LENGTHS = [40, 7, 300, 256, 1]


def _store(sc, fmt, poison=True):
    pages = sc.k_cache.shape[0] * sc.block_size // sc.page_size
    means, scale = lk.allocate_value_means(pages, sc.k_cache.shape[2], sc.k_cache.shape[3], fmt, DEVICE)
    if poison:
        means.copy_(poisoned(means.shape, means.dtype))
        if scale is not None:
            scale.copy_(poisoned(scale.shape, scale.dtype))
    return means, scale


def _reference_store(sc, fmt):
    """``encode_value_means`` of every physical page's mean value, `[num_pages, H, D]`."""
    v = sc.v_cache.cpu()
    blocks, block_size, heads, dim = v.shape
    means = page_value_means(v.transpose(1, 2), sc.page_size)  # [blocks, H, block_size / B, D]
    return encode_value_means(means.transpose(1, 2).reshape(-1, heads, dim), fmt)


def _complete_pages(sc, seq_lens):
    """Physical ids of the complete pages of each sequence, one tensor."""
    ppb = sc.block_size // sc.page_size
    ids = physical_page_ids(sc.block_table.cpu(), ppb)
    return torch.cat([ids[s, : int(n) // sc.page_size] for s, n in enumerate(seq_lens.tolist())])


def _check_rows(fmt, store, ref, rows):
    means, scale = (t.cpu() if t is not None else None for t in store)
    if fmt == "bf16":
        # the interpreter rounds fp32 to bf16 towards zero (compiled Triton: to nearest even): one bf16 step
        step = 0.0 if ON_GPU else 2.0 ** -7
        ref_means = ref[0][rows].float()
        assert ((means[rows].float() - ref_means).abs() <= step * ref_means.abs()).all(), "bf16 means"
        return
    codes = means[rows].int() - ref[0][rows].int()
    # the mean's summation order may differ in the last bit: a code at a rounding boundary moves by one
    assert codes.abs().max() <= 1 and (codes != 0).float().mean() < 0.01, "int8 codes"
    assert torch.allclose(scale[rows].float(), ref[1][rows].float(), rtol=1e-3, atol=0), "fp16 scales"


def _untouched(store, rows):
    keep = torch.ones(store[0].shape[0], dtype=torch.bool)
    keep[rows] = False
    means = store[0].cpu()[keep]
    return bool(torch.isnan(means.float()).all()) if means.dtype == torch.bfloat16 else bool((means == 99).all())


@pytest.mark.parametrize("fmt", FORMATS)
def test_cache_value_means_match_ops(fmt):
    sc = on_device(make_scenario(LENGTHS, num_kv_heads=2, groups=1, head_dim=32, seed=1, key_offset=3.0))
    store = _store(sc, fmt)
    lk.build_cache_value_means(sc.v_cache, sc.block_table, sc.seq_lens, store, sc.page_size)
    rows = _complete_pages(sc, sc.seq_lens.cpu())
    _check_rows(fmt, store, _reference_store(sc, fmt), rows)
    assert _untouched(store, rows), "only complete pages are written"
    packed = torch.cat((sc.k_cache, sc.v_cache), dim=-1)  # [num_blocks, block_size, H, 2D] as vLLM packs it
    from_view = _store(sc, fmt)
    lk.build_cache_value_means(packed[..., 32:], sc.block_table, sc.seq_lens, from_view, sc.page_size)
    assert all(torch.equal(a[rows], b[rows]) for a, b in zip(store, from_view) if a is not None), "packed view"


@pytest.mark.parametrize("fmt", FORMATS)
def test_completed_page_value_means_match_ops(fmt):
    sc = on_device(make_scenario([48, 16 * 5 + 3, 32, 16 * 9], num_kv_heads=2, groups=1, head_dim=32, seed=2,
                                 block_size=64))
    store = _store(sc, fmt)
    lk.build_completed_value_means(sc.v_cache, sc.block_table, sc.seq_lens, store, sc.page_size)
    # each sequence whose length is a multiple of B completed its last page; the one ending mid-page wrote nothing
    ppb = sc.block_size // sc.page_size
    ids = physical_page_ids(sc.block_table.cpu(), ppb)
    rows = torch.tensor([ids[s, n // 16 - 1] for s, n in enumerate(sc.seq_lens.tolist()) if n % 16 == 0])
    _check_rows(fmt, store, _reference_store(sc, fmt), rows)
    assert _untouched(store, rows), "only the completed pages are written"


def _case(groups, seed, lengths=LENGTHS, budget=160, head_dim=32, dtype=torch.float32, holes=True):
    sc = make_scenario(lengths, num_kv_heads=2, groups=groups, head_dim=head_dim, seed=seed, dtype=dtype)
    pmax = sc.block_table.shape[1] * sc.block_size // sc.page_size
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(sc.q.shape[0], sc.q.shape[1], pmax, generator=gen) * 3.0
    selected = select_pages(scores, sc.seq_lens, 2, LocksConfig(budget=budget))
    if holes:  # rows 2 and 3 have over 5 pages
        scores[2, :, 5] = float("-inf")  # a tail page without a score
        scores[2, 0] = float("-inf")  # a query head without any score: its tail is empty
        scores[3, -1, ::2] = float("-inf")
    return sc, scores, selected


def _reference_split(sc, scores, selected, means):
    heads = selected.shape[1]
    group = scores.shape[1] // heads
    tail = tail_pages(selected, sc.seq_lens, scores.shape[-1], sc.page_size).repeat_interleave(group, dim=1)
    means = means[:, : scores.shape[-1]].transpose(1, 2).repeat_interleave(group, dim=1)
    return tail_split(scores.masked_fill(~tail, float("-inf")), means)


def _check(name, ref, out, tolerance):
    (r_out, r_lse), (o_out, o_lse) = ref, tuple(t.cpu() for t in out)
    assert torch.equal(torch.isinf(r_lse), torch.isinf(o_lse)), f"{name}: -inf rows differ"
    assert not torch.isnan(o_out).any() and not torch.isnan(o_lse).any(), f"{name}: NaN"
    assert_close(f"{name} out", r_out.float(), o_out.float(), tolerance)
    finite = torch.isfinite(r_lse)
    assert_close(f"{name} lse", r_lse[finite], o_lse[finite], 1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("groups", [1, 4], ids=lambda g: f"gqa{g}")
@pytest.mark.parametrize("split", [(16, 16), (32, None), (16, 64)], ids=["tp16pps16", "tp32auto", "tp16pps64"])
def test_tail_split_matches_ops(fmt, groups, split):
    sc, scores, selected = _case(groups, seed=groups)
    dev = on_device(sc)
    store = _store(dev, fmt, poison=False)
    lk.build_cache_value_means(dev.v_cache, dev.block_table, dev.seq_lens, store, sc.page_size)
    means = stored_row_value_means(*(t.cpu() if t is not None else None for t in store), sc.block_table, 2)
    ref = _reference_split(sc, scores, selected, means)
    assert torch.isneginf(ref[1][0]).all() and torch.isneginf(ref[1][1]).all(), "rows 0 and 1 have no tail"
    for sel in (selected, selected.int()):
        out = poisoned(sc.q.shape, torch.float32), poisoned(sc.q.shape[:2], torch.float32)
        lk.tail_split(scores.to(DEVICE), sel.to(DEVICE), dev.seq_lens, dev.block_table, store, sc.page_size,
                      sc.block_size, out=out[0], lse=out[1], tile_pages=split[0], pages_per_split=split[1])
        _check(f"{fmt} {sel.dtype}", ref, out, 1e-5)


def test_more_splits_than_one_merge_chunk():
    """41 splits of 16 pages: the merge walks its 32-split chunks twice."""
    sc, scores, selected = _case(4, seed=5, lengths=[16 * 16 * 40 + 5, 100], holes=False)
    dev = on_device(sc)
    store = _store(dev, "int8", poison=False)
    lk.build_cache_value_means(dev.v_cache, dev.block_table, dev.seq_lens, store, sc.page_size)
    means = stored_row_value_means(*(t.cpu() for t in store), sc.block_table, 2)
    out = lk.tail_split(scores.to(DEVICE), selected.to(DEVICE), dev.seq_lens, dev.block_table, store, sc.page_size,
                        sc.block_size, tile_pages=16, pages_per_split=16)
    _check("41 splits", _reference_split(sc, scores, selected, means), out, 1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("groups", [1, 4], ids=lambda g: f"gqa{g}")
def test_tail_paged_attention_matches_ops(fmt, groups):
    sc, scores, selected = _case(groups, seed=10 + groups)
    dev = on_device(sc)
    store = _store(dev, fmt, poison=False)
    lk.build_cache_value_means(dev.v_cache, dev.block_table, dev.seq_lens, store, sc.page_size)
    means = stored_row_value_means(*(t.cpu() if t is not None else None for t in store), sc.block_table, 2)
    ref = tail_paged_attention(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, selected, scores, means,
                               sc.page_size)
    out = poisoned(sc.q.shape, sc.q.dtype), poisoned(sc.q.shape[:2], torch.float32)
    lk.tail_paged_attention(dev.q, dev.k_cache, dev.v_cache, dev.block_table, dev.seq_lens, selected.to(DEVICE),
                            scores.to(DEVICE), store, sc.page_size, out=out[0], lse=out[1])
    _check(fmt, ref, out, 1e-5)


@pytest.mark.parametrize("groups", [1, 4], ids=lambda g: f"gqa{g}")
@pytest.mark.parametrize("lengths", [LENGTHS, [16 * 16 * 40 + 5, 100]], ids=["rows", "41splits"])
def test_tail_share_matches_ops(groups, lengths):
    """``share=``: each query head's tail share of the estimated mass, from the split's passes, is
    ``ops.tail.tail_mass_share`` before its group mean: rows whose every page is read (0), with no complete page
    (0), a head without any score (0), ``-inf`` pages, and 41 splits (two merge chunks); out and lse unchanged."""
    from locks_engine.ops.tail import tail_mass_share

    sc, scores, selected = _case(groups, seed=20 + groups, lengths=lengths, holes=len(lengths) > 3)
    dev = on_device(sc)
    store = _store(dev, "int8", poison=False)
    lk.build_cache_value_means(dev.v_cache, dev.block_table, dev.seq_lens, store, sc.page_size)
    args = (dev.q, dev.k_cache, dev.v_cache, dev.block_table, dev.seq_lens, selected.to(DEVICE), scores.to(DEVICE),
            store, sc.page_size)
    share = poisoned(sc.q.shape[:2], torch.float32)
    out, lse = lk.tail_paged_attention(*args, share=share)
    heads = selected.shape[1]
    got = share.cpu().view(share.shape[0], heads, groups).mean(-1)
    ref = tail_mass_share(scores, selected, sc.seq_lens, sc.page_size)
    assert not torch.isnan(got).any(), "share: NaN"
    assert_close("share", ref, got, 1e-5)
    assert 0.0 < float(ref.max()) < 1.0, "the case has a tail carrying part of the mass"
    plain = lk.tail_paged_attention(*args)
    assert torch.equal(out.cpu(), plain[0].cpu()) and torch.equal(lse.cpu(), plain[1].cpu()), "share= changed out"


def test_nothing_read_and_no_tail_gives_zeros_and_minus_inf():
    sc, scores, _ = _case(2, seed=3, lengths=[40, 7, 33], holes=False)
    selected = torch.full((3, 2, 4), -1, dtype=torch.int64)
    selected[0, :, :3] = torch.arange(3)  # every page of row 0; row 1 has no complete page; row 2 reads none
    dev = on_device(sc)
    store = _store(dev, "int8", poison=False)
    lk.build_cache_value_means(dev.v_cache, dev.block_table, dev.seq_lens, store, sc.page_size)
    out, lse = lk.tail_paged_attention(dev.q, dev.k_cache, dev.v_cache, dev.block_table, dev.seq_lens,
                                       selected.to(DEVICE), scores.to(DEVICE), store, sc.page_size)
    out, lse = out.cpu(), lse.cpu()
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.isneginf(lse[1]).all(), "row 1: empty"
    assert torch.isfinite(lse[0]).all() and torch.isfinite(lse[2]).all(), "row 0 exact, row 2 tail only"
    means = stored_row_value_means(*(t.cpu() for t in store), sc.block_table, 2)
    ref = tail_paged_attention(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, selected, scores, means,
                               sc.page_size)
    _check("empty rows", ref, (out, lse), 1e-5)


@requires_bf16_dot
@pytest.mark.parametrize("groups", [1, 4, 7], ids=lambda g: f"gqa{g}")
def test_tail_paged_attention_bf16_cache(groups):
    lengths = [40, 7, 3000, 16 * 70, 1, 1000]
    sc, scores, selected = _case(groups, seed=20 + groups, lengths=lengths, budget=256, head_dim=128,
                                 dtype=torch.bfloat16)
    dev = on_device(sc)
    store = _store(dev, "int8", poison=False)
    lk.build_cache_value_means(dev.v_cache, dev.block_table, dev.seq_lens, store, sc.page_size)
    means = stored_row_value_means(*(t.cpu() for t in store), sc.block_table, 2)
    ref = tail_paged_attention(sc.q.float(), sc.k_cache.float(), sc.v_cache.float(), sc.block_table, sc.seq_lens,
                               selected, scores, means, sc.page_size)
    out = lk.tail_paged_attention(dev.q, dev.k_cache, dev.v_cache, dev.block_table, dev.seq_lens,
                                  selected.to(DEVICE), scores.to(DEVICE), store, sc.page_size)
    _check("bf16", ref, out, 1e-2)


@requires_cuda_graphs
@pytest.mark.parametrize("fmt", FORMATS)
def test_tail_step_replays_equal_eager(fmt):
    # a page completes this step in sequences 0 and 2; 1 and 3 end mid-page
    sc = make_scenario([48, 16 * 40 + 5, 16 * 70, 3001], num_kv_heads=2, groups=4, head_dim=128, block_size=64,
                       seed=30, dtype=torch.bfloat16)
    scores = torch.randn(4, 8, sc.block_table.shape[1] * 4, device="cuda")
    selected = select_pages(scores.cpu(), sc.seq_lens, 2, LocksConfig(budget=256)).cuda()
    dev = on_device(sc)
    lengths = dev.seq_lens.clone()
    store = _store(dev, fmt, poison=False)
    lk.build_cache_value_means(dev.v_cache, dev.block_table, dev.seq_lens - 1, store, sc.page_size)
    before = [t.clone() for t in store if t is not None]
    full = _store(dev, fmt, poison=False)  # every complete page at this step's lengths
    lk.build_cache_value_means(dev.v_cache, dev.block_table, dev.seq_lens, full, sc.page_size)

    def step():
        lk.build_completed_value_means(dev.v_cache, dev.block_table, dev.seq_lens, store, sc.page_size)
        return lk.tail_paged_attention(dev.q, dev.k_cache, dev.v_cache, dev.block_table, dev.seq_lens, selected,
                                       scores, store, sc.page_size)

    step()  # compiles every kernel before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    for tensor, saved in zip((t for t in store if t is not None), before):
        tensor.copy_(saved)  # the completed pages unwritten again: the replay must write them
    for trial in range(3):
        dev.q.copy_(torch.randn_like(dev.q))  # new inputs, same addresses
        scores.copy_(torch.randn_like(scores))
        dev.seq_lens.copy_(lengths + trial)
        graph.replay()
        if trial == 0:
            assert all(torch.equal(a, b) for a, b in zip(store, full) if a is not None), "replay built the pages"
        eager_out, eager_lse = step()
        assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse), f"trial {trial}: replay != eager"
        means = stored_row_value_means(*(t.cpu() if t is not None else None for t in store), sc.block_table, 4)
        ref = tail_paged_attention(dev.q.float().cpu(), dev.k_cache.float().cpu(), dev.v_cache.float().cpu(),
                                   sc.block_table, dev.seq_lens.cpu(), selected.cpu(), scores.cpu(), means, 16)
        _check(f"trial {trial} against ops", ref, (out, lse), 1e-2)
