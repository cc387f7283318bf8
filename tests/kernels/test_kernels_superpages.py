"""The two-level selection's Triton kernels (``locks_kernels.superpages``, ``score_pages(tiles=)``,
``select_pages(tiles=)``) against their ops twins (``locks_engine.ops.superpages``)."""

import pytest
import torch

import locks_kernels as lk
from locks_engine import LocksConfig
from locks_engine.ops import build_cache_summaries
from locks_engine.ops.score import score_candidate_pages
from locks_engine.ops.select import group_mass_shares, select_candidate_pages
from locks_engine.ops.superpages import (
    allocate_superpages, candidate_pages, completed_superpages, select_two_level, superpage_config,
    superpage_scores, write_superpage_centroids,
)
from locks_engine.ops import select_pages
from tests.support.helpers import assert_close, make_scenario
from tests.support.kernels_support import DEVICE, ON_GPU, on_device, poisoned, requires_kernels, summaries_on_device

pytestmark = requires_kernels

CFG = LocksConfig(budget=16 * 8, sink_pages=1, recent_pages=1)


def _setup(lengths, groups, dim=64, seed=0, block_size=32):
    sc = make_scenario(lengths, num_kv_heads=2, groups=groups, head_dim=dim, seed=seed, key_offset=1.5,
                       block_size=block_size)
    store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, CFG)
    sp = allocate_superpages(store.num_pages, 2, dim, "cpu")
    write_superpage_centroids(sp, store, completed_superpages(sc.seq_lens, sc.seq_lens, sc.block_table, 16,
                                                              sc.block_size))
    return sc, store, sp


def test_superpage_slots_match_the_ops_config():
    for budget, sink, recent, c in [(128, 1, 1, 4), (128, 0, 0, 1), (24, 3, 17, 16), (20, 16, 1, 32)]:
        cfg = LocksConfig(budget=16 * budget, sink_pages=sink, recent_pages=recent)
        assert lk.superpage_slots(budget, sink, recent, c) == superpage_config(cfg, c).budget_pages


@pytest.mark.parametrize("groups", [1, 7])
def test_build_completed_superpages_writes_only_where_a_superpage_completed(groups):
    # rows 0 and 2 just completed superpage 1 and 0; row 1 is mid-superpage
    sc, store, expected = _setup([16 * 32, 16 * 20 + 5, 16 * 16], groups)
    dev = on_device(sc)
    sp = torch.full_like(expected, 7.0).to(DEVICE)
    keep = sp.clone()
    lk.build_completed_superpages(summaries_on_device(store)[0], sp, dev.block_table, dev.seq_lens, 16,
                                  sc.block_size)
    ids = completed_superpages(sc.seq_lens, torch.ones(3, dtype=torch.int32), sc.block_table, 16, sc.block_size)
    assert ids.shape[0] == 2
    written = torch.zeros(sp.shape[0], dtype=torch.bool)
    written[ids[:, -1]] = True
    assert torch.allclose(sp.cpu()[written].float(), expected[written].float(), atol=1e-3)
    assert torch.equal(sp.cpu()[~written], keep.cpu()[~written])


@pytest.mark.parametrize("groups", [1, 4, 7])
def test_superpage_scores_match_ops(groups):
    sc, store, sp = _setup([16 * 70 + 3, 16 * 16, 5], groups, seed=1)
    ref = superpage_scores(sc.q, sp, sc.block_table, sc.seq_lens, 16, sc.block_size)
    dev = on_device(sc)
    out = poisoned(ref.shape, torch.float32)
    lk.superpage_scores(dev.q, sp.to(DEVICE), dev.block_table, dev.seq_lens, 16, sc.block_size, out=out)
    out = out.cpu()
    assert torch.equal(torch.isinf(out), torch.isinf(ref)) and not out.isnan().any()
    assert_close("superpage scores", ref[torch.isfinite(ref)], out[torch.isfinite(out)], 2e-3)


@pytest.mark.parametrize("groups", [1, 4, 7])
def test_listed_scores_and_selection_match_ops(groups):
    sc, store, sp = _setup([16 * 70 + 3, 16 * 33, 16 * 2 + 1], groups, seed=2)
    chosen = torch.tensor([[[0, 2, 4], [1, 3, 4]], [[0, 1, 2], [0, 2, -1]], [[0, -1, -1], [0, -1, -1]]])
    pages = candidate_pages(chosen, sc.seq_lens, 16)
    ref = score_candidate_pages(sc.q, store, sc.block_table, sc.seq_lens, pages, 16, sc.block_size)
    dev = on_device(sc)
    out = poisoned(ref.shape, torch.float32)
    lk.score_pages(dev.q, summaries_on_device(store), dev.block_table, dev.seq_lens, 16, sc.block_size, out=out,
                   tiles=chosen.to(DEVICE))
    out = out.cpu()
    assert torch.equal(torch.isinf(out), torch.isinf(ref)) and not out.isnan().any(), "-inf exactly where ops has it"
    assert_close("listed scores", ref[torch.isfinite(ref)], out[torch.isfinite(out)], 5e-2)
    for cfg in (CFG, LocksConfig(budget=16 * 7, sink_pages=2, recent_pages=3)):
        expected = select_candidate_pages(ref, pages, sc.seq_lens, 2, cfg)
        got = lk.select_pages(ref.to(DEVICE), dev.seq_lens, 2, cfg.budget_pages, 16, cfg.sink_pages,
                              cfg.recent_pages, tiles=chosen.to(DEVICE)).cpu()
        assert torch.equal(got, expected)


@pytest.mark.parametrize("candidates", [1, 4])
@pytest.mark.parametrize("groups", [1, 7])
def test_select_two_level_matches_ops(groups, candidates):
    lengths = [16 * 300 + 9, 16 * 48, 16 * 5] if ON_GPU else [16 * 150 + 9, 16 * 48]
    sc, store, sp = _setup(lengths, groups, seed=3)
    cfg = CFG
    ref, pages = select_two_level(sc.q, store, sp, sc.block_table, sc.seq_lens, 2, cfg, candidates, sc.block_size)
    dev = on_device(sc)
    got, chosen = lk.select_two_level(dev.q, summaries_on_device(store), sp.to(DEVICE), dev.block_table,
                                      dev.seq_lens, 16, sc.block_size, cfg.budget_pages, cfg.sink_pages,
                                      cfg.recent_pages, candidates)
    got, chosen = got.cpu(), chosen.cpu()
    assert got.shape == ref.shape
    # the superpages chosen may differ on near-ties (fp16 query there); compare the mass each selection keeps
    # under the ops estimate over every page, and that forced pages are read
    flat = score_candidate_pages(sc.q, store, sc.block_table, sc.seq_lens,
                                 torch.arange(sc.block_table.shape[1] * 2).expand(len(lengths), 2, -1), 16,
                                 sc.block_size)
    shares = group_mass_shares(flat, 2)

    def kept(sel):
        return torch.gather(shares, 2, sel.clamp_min(0)).masked_fill(sel < 0, 0).sum(-1)
    assert torch.allclose(kept(got), kept(ref), atol=2e-3)
    assert torch.equal((got >= 0).sum(-1), (ref >= 0).sum(-1))
    assert (got == 0).any(-1).all()
    assert torch.equal(chosen, select_pages(superpage_scores(sc.q, sp, sc.block_table, sc.seq_lens, 16,
                                                             sc.block_size),
                                            sc.seq_lens, 2, superpage_config(cfg, candidates)))


@pytest.mark.parametrize("capacity", [3, 32], ids=lambda c: f"cap{c}")
@pytest.mark.parametrize("live_c", [1, 2, 3])
@pytest.mark.parametrize("groups", [1, 7])
def test_select_two_level_with_c_as_data_is_the_static_c(groups, live_c, capacity):
    # the kernels sized for a capacity c (at 32 more superpage slots than superpages: ranked all the same), the
    # layer's c read from a device tensor: the static c's selection, chosen padded with -1
    lengths = [16 * 16 * 12 + 9, 16 * 48, 16 * 5] if ON_GPU else [16 * 16 * 7 + 9, 16 * 40]
    sc, store, sp = _setup(lengths, groups, seed=4)
    cfg = LocksConfig(budget=16 * 6, sink_pages=1, recent_pages=1)
    dev = on_device(sc)
    args = (dev.q, summaries_on_device(store), sp.to(DEVICE), dev.block_table, dev.seq_lens, 16, sc.block_size,
            cfg.budget_pages, cfg.sink_pages, cfg.recent_pages)
    static, static_chosen = lk.select_two_level(*args, live_c)
    live = torch.tensor([lk.superpage_slots(cfg.budget_pages, cfg.sink_pages, cfg.recent_pages, live_c)],
                        dtype=torch.int32, device=DEVICE)
    got, chosen = lk.select_two_level(*args, capacity, live=live)
    assert torch.equal(got.cpu(), static.cpu())
    m = static_chosen.shape[-1]
    assert torch.equal(chosen[..., :m].cpu(), static_chosen.cpu())
    assert (chosen[..., m:] == -1).all()
    ref, _ = select_two_level(sc.q, store, sp, sc.block_table, sc.seq_lens, 2, cfg, live_c, sc.block_size)
    assert torch.equal((got.cpu() >= 0).sum(-1), (ref >= 0).sum(-1))


@pytest.mark.parametrize("sub", [16, 64], ids=lambda s: f"sub{s}")
@pytest.mark.parametrize("groups", [1, 7])
@pytest.mark.parametrize("budget_live", [None, 5], ids=["k", "live5"])
def test_listed_selection_in_one_program_is_the_chunked_one(monkeypatch, groups, sub, budget_live):
    """Listed slots past one chunk (a capacity sized for c = 64) take ``select_listed``: one program walking the
    live slots in sub-chunks. It selects exactly what the chunked passes select (ties included, towards lower
    slots) and what ops selects, with listed rows of different lengths and slots past the last page."""
    from locks_kernels import select, select_listed

    sc, store, sp = _setup([16 * 70 + 3, 16 * 33, 16 * 2 + 1], groups, seed=5)
    chosen = torch.tensor([[[0, 1, 2, 3, 4], [1, 2, 3, 4, -1]], [[0, 1, 2, -1, -1], [0, 2, -1, -1, -1]],
                           [[0, -1, -1, -1, -1], [0, -1, -1, -1, -1]]])
    pages = candidate_pages(chosen, sc.seq_lens, 16)
    ref = score_candidate_pages(sc.q, store, sc.block_table, sc.seq_lens, pages, 16, sc.block_size)
    ref[0, :, 20:30] = 0.25  # ties across sub-chunk borders
    cfg = LocksConfig(budget=16 * 9, sink_pages=2, recent_pages=3)
    live = None if budget_live is None else torch.tensor([budget_live], dtype=torch.int32, device=DEVICE)
    monkeypatch.setattr(select, "CHUNK", 16)

    def run():
        out = poisoned((3, 2, cfg.budget_pages), torch.int64)
        lk.select_pages(ref.to(DEVICE), on_device(sc).seq_lens, 2, cfg.budget_pages, 16, cfg.sink_pages,
                        cfg.recent_pages, out=out, tiles=chosen.to(DEVICE), budget_live=live)
        return out.cpu()

    calls = []
    monkeypatch.setattr(select, "LISTED_ONE_PROGRAM", True)
    monkeypatch.setattr(select_listed, "SUB", sub)
    monkeypatch.setattr(select, "select_listed", lambda *a: calls.append(1) or select_listed.select_listed(*a))
    looped = run()
    assert calls, "the listed slots span chunks: one program walks them"
    monkeypatch.setattr(select, "LISTED_ONE_PROGRAM", False)
    chunked = run()
    assert len(calls) == 1, "the chunk passes and the merge"
    assert torch.equal(looped, chunked)
    if budget_live is None:
        assert torch.equal(looped, select_candidate_pages(ref, pages, sc.seq_lens, 2, cfg))


@pytest.mark.parametrize("small", [8, 32, 64], ids=lambda m: f"small{m}")
@pytest.mark.parametrize("groups", [1, 7])
@pytest.mark.parametrize("budget_live", [None, 3], ids=["k", "live3"])
def test_the_merge_over_the_live_candidates_is_the_capacity_wide_merge(monkeypatch, groups, small, budget_live):
    """``select.MERGE_SMALL``: with live listed tiles (``live_tiles``) or a live budget, the merge gathers the live
    chunks' candidates compacted and searches them at that width. It selects exactly what the merge over every
    chunk's slots selects (ties across chunks included), whether the live candidates fit the small width (8
    does not hold 3 chunks x 5 pages; 32 and 64 do) or not, and what ops selects."""
    from locks_kernels import select

    sc, store, sp = _setup([16 * 70 + 3, 16 * 33, 16 * 2 + 1], groups, seed=7)
    # at most 3 tiles listed in any row (live_tiles = 3), 5 slots: tiles 3 and 4 are past the live ones
    chosen = torch.tensor([[[0, 2, 4, -1, -1], [1, 3, 4, -1, -1]], [[0, 1, 2, -1, -1], [0, 2, -1, -1, -1]],
                           [[0, -1, -1, -1, -1], [0, -1, -1, -1, -1]]])
    pages = candidate_pages(chosen, sc.seq_lens, 16)
    ref = score_candidate_pages(sc.q, store, sc.block_table, sc.seq_lens, pages, 16, sc.block_size)
    ref[0, :, 10:40] = 0.25  # ties across chunk borders
    cfg = LocksConfig(budget=16 * 5, sink_pages=1, recent_pages=1)
    live_tiles = torch.tensor([3], dtype=torch.int32, device=DEVICE)
    k_live = None if budget_live is None else torch.tensor([budget_live], dtype=torch.int32, device=DEVICE)
    monkeypatch.setattr(select, "CHUNK", 16)
    monkeypatch.setattr(select, "LISTED_ONE_PROGRAM", False)

    def run(merge_small, live):
        monkeypatch.setattr(select, "MERGE_SMALL", merge_small)
        out = poisoned((3, 2, cfg.budget_pages), torch.int64)
        lk.select_pages(ref.to(DEVICE), on_device(sc).seq_lens, 2, cfg.budget_pages, 16, cfg.sink_pages,
                        cfg.recent_pages, out=out, tiles=chosen.to(DEVICE), budget_live=k_live, live_tiles=live)
        return out.cpu()

    wide = run(0, None)
    assert torch.equal(run(small, live_tiles), wide)
    assert torch.equal(run(small, None), wide)
    if budget_live is None:
        assert torch.equal(wide, select_candidate_pages(ref, pages, sc.seq_lens, 2, cfg))
    else:
        assert ((wide >= 0).sum(-1) <= budget_live).all()


@pytest.mark.parametrize("small", [0, 512], ids=lambda m: f"small{m}")
def test_two_level_with_c_as_data_is_the_same_with_the_live_merge(monkeypatch, small):
    """The calibrated path (``select_two_level(live=)``) selects the static ``c``'s pages with the live merge on
    or off (chunks short enough that both the superpage and the page selection merge)."""
    from locks_kernels import select

    monkeypatch.setattr(select, "CHUNK", 16)
    monkeypatch.setattr(select, "MERGE_SMALL", small)
    sc, store, sp = _setup([16 * 16 * 7 + 9, 16 * 40], 4, seed=8)
    cfg = LocksConfig(budget=16 * 6, sink_pages=1, recent_pages=1)
    dev = on_device(sc)
    args = (dev.q, summaries_on_device(store), sp.to(DEVICE), dev.block_table, dev.seq_lens, 16, sc.block_size,
            cfg.budget_pages, cfg.sink_pages, cfg.recent_pages)
    static, _ = lk.select_two_level(*args, 2)
    live = torch.tensor([lk.superpage_slots(cfg.budget_pages, cfg.sink_pages, cfg.recent_pages, 2)],
                        dtype=torch.int32, device=DEVICE)
    got, _ = lk.select_two_level(*args, 32, live=live)
    assert torch.equal(got.cpu(), static.cpu())


@pytest.mark.parametrize("groups", [1, 7])
def test_the_page_summary_kernel_builds_the_completed_superpage_too(groups):
    """``build_completed_page_summaries(superpages=)`` (one launch) writes the summaries and superpage centroids
    that the page kernel then ``build_completed_superpages`` write: rows completing a superpage, a page only, or
    nothing this step."""
    sc, store, _ = _setup([16 * 32, 16 * 20, 16 * 20 + 5, 16 * 16], groups, seed=6)
    dev = on_device(sc)
    fresh = lambda: tuple(torch.zeros_like(t) for t in summaries_on_device(store))  # noqa: E731
    sp_shape = (store.num_pages, 2, sc.k_cache.shape[-1])
    two, sp_two = fresh(), torch.full(sp_shape, 7.0, dtype=torch.float16, device=DEVICE)
    one, sp_one = fresh(), sp_two.clone()
    # the earlier pages of each superpage: summarized as a prefill would have
    lk.build_cache_summaries(dev.k_cache, dev.block_table, dev.seq_lens - 1, two, 16)
    lk.build_cache_summaries(dev.k_cache, dev.block_table, dev.seq_lens - 1, one, 16)
    lk.build_completed_page_summaries(dev.k_cache, dev.block_table, dev.seq_lens, two, 16)
    lk.build_completed_superpages(two[0], sp_two, dev.block_table, dev.seq_lens, 16, sc.block_size)
    lk.build_completed_page_summaries(dev.k_cache, dev.block_table, dev.seq_lens, one, 16, superpages=sp_one)
    for a, b in zip(one, two):
        assert torch.equal(a.cpu(), b.cpu())
    assert torch.equal(sp_one.cpu(), sp_two.cpu())
    assert (sp_one.cpu() != 7.0).any(), "rows 0 and 3 completed a superpage"
