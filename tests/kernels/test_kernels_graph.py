"""A whole LOCKS decode step (completed-page summary, score, select, attend) in one CUDA graph: replays equal
eager runs, also after the inputs change in place; the step equals the ops pipeline, and dense attention when
the budget covers every page or the ``every`` switch is on; its two halves as the vLLM backend's CUDA path calls
them (``select_step``, then ``sparse_paged_attention``) give what ``decode_step`` gives."""

import pytest
import torch

import locks_kernels as lk
from locks_engine import LocksConfig
from locks_engine.ops import dense_paged_attention, score_pages, select_pages, sparse_paged_attention
from locks_engine.ops.select import every_page, group_mass_shares
from tests.support.helpers import assert_close, make_scenario
from tests.support.kernels_support import allocate_summaries, as_store, on_device, requires_cuda_graphs

pytestmark = requires_cuda_graphs


def _scenario(groups=4, seed=0):
    # a page completes this step in sequences 0 and 2 (48 and 16 * 70 tokens); 1 and 3 end mid-page
    sc = make_scenario([48, 16 * 40 + 5, 16 * 70, 3001], num_kv_heads=2, groups=groups, head_dim=128,
                       block_size=64, seed=seed, dtype=torch.bfloat16, key_offset=10.0)
    return on_device(sc)


def _capture(step):
    step()  # compiles every kernel before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs


def _summaries(sc, seq_lens):
    pages = sc.k_cache.shape[0] * sc.block_size // sc.page_size
    summaries = allocate_summaries(pages, sc.k_cache.shape[2], sc.k_cache.shape[3])
    lk.build_cache_summaries(sc.k_cache, sc.block_table, seq_lens, summaries, sc.page_size)
    return summaries


def _step(sc, summaries, cfg, build=True, every=False):
    return lk.decode_step(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, summaries, cfg.page_size,
                          cfg.budget_pages, cfg.sink_pages, cfg.recent_pages, build=build, every=every)


def _select(sc, summaries, cfg, build=True, every=False, superpages=None, candidates=0):
    return lk.select_step(sc.q, sc.k_cache, sc.block_table, sc.seq_lens, summaries, cfg.page_size, cfg.budget_pages,
                          cfg.sink_pages, cfg.recent_pages, build=build, superpages=superpages,
                          candidates=candidates, every=every)


def test_decode_step_replays_equal_eager():
    sc = _scenario()
    cfg = LocksConfig(budget=256)
    lengths = sc.seq_lens.clone()
    summaries = _summaries(sc, sc.seq_lens - 1)  # the step's token completes a page in sequences 0 and 2

    def step():
        return _step(sc, summaries, cfg)

    graph, (out, lse) = _capture(step)
    for trial in range(3):
        sc.q.copy_(torch.randn_like(sc.q))  # new inputs, same addresses
        sc.seq_lens.copy_(lengths + trial)
        graph.replay()
        eager_out, eager_lse = step()
        assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse), f"trial {trial}: replay != eager"


def test_decode_step_matches_ops_pipeline():
    sc = _scenario(groups=7, seed=1)
    cfg = LocksConfig(budget=256)
    summaries = _summaries(sc, sc.seq_lens)
    out, lse = _step(sc, summaries, cfg, build=False)
    q, bt, lens = sc.q.float().cpu(), sc.block_table.cpu(), sc.seq_lens.cpu()
    scores = score_pages(q, as_store(summaries), bt, lens, 16, sc.block_size)
    selected = select_pages(scores, lens, 2, cfg)
    kernel_scores = lk.score_pages(sc.q, summaries, sc.block_table, sc.seq_lens, 16, sc.block_size)
    kernel_selected = lk.select_pages(kernel_scores, sc.seq_lens, 2, cfg.budget_pages, 16, cfg.sink_pages,
                                      cfg.recent_pages)
    shares = group_mass_shares(scores, 2)
    kernel_selected = kernel_selected.cpu()
    assert torch.equal(kernel_selected >= 0, selected >= 0)

    def mass(sel):
        return torch.stack([shares[s, h][sel[s, h][sel[s, h] >= 0]].sum() for s in range(4) for h in range(2)])

    kept, best = mass(kernel_selected), mass(selected)
    assert torch.allclose(kept, best, rtol=1e-5), "the pages ops picks, up to ties"
    ref_out, ref_lse = sparse_paged_attention(q, sc.k_cache.float().cpu(), sc.v_cache.float().cpu(), bt, lens,
                                              kernel_selected, 16)
    assert_close("step out", ref_out, out.float().cpu(), 1e-2)
    assert_close("step lse", ref_lse, lse.cpu(), 1e-5)


@pytest.mark.parametrize("every", [False, True], ids=["budget_past_pmax", "every_switch"])
def test_budget_covering_every_page_is_dense_attention(every):
    sc = _scenario(seed=2)
    cfg = LocksConfig(budget=256 if every else 16 * 256)
    summaries = _summaries(sc, sc.seq_lens)
    graph, (out, lse) = _capture(lambda: _step(sc, summaries, cfg, build=False, every=every))
    graph.replay()
    ref_out, ref_lse = dense_paged_attention(sc.q.float().cpu(), sc.k_cache.float().cpu(), sc.v_cache.float().cpu(),
                                             sc.block_table.cpu(), sc.seq_lens.cpu())
    assert_close("dense out", ref_out, out.float().cpu(), 1e-2)
    assert_close("dense lse", ref_lse, lse.cpu(), 1e-5)


def test_two_level_decode_step_replays_equal_eager_and_builds_the_completed_superpage():
    """The two-level scan in one graph: row 2 (16 * 70 tokens) and a row of 512 complete a page; the 512-token row
    completes superpage 1, whose centroid the replay writes; replays equal eager runs as the inputs change."""
    sc = make_scenario([48, 16 * 40 + 5, 16 * 70, 512], num_kv_heads=2, groups=4, head_dim=128, block_size=64,
                       seed=3, dtype=torch.bfloat16, key_offset=10.0)
    sc = on_device(sc)
    cfg = LocksConfig(budget=256)
    lengths = sc.seq_lens.clone()
    summaries = _summaries(sc, sc.seq_lens - 1)
    superpages = torch.zeros_like(summaries[0])

    def step():
        return lk.decode_step(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, summaries, cfg.page_size,
                              cfg.budget_pages, cfg.sink_pages, cfg.recent_pages, superpages=superpages,
                              candidates=2)

    graph, (out, lse) = _capture(step)
    superpages.zero_()
    graph.replay()
    ppb = sc.block_size // 16
    ids = [int(sc.block_table[3, j // ppb]) * ppb + j % ppb for j in range(16, 32)]
    assert torch.allclose(superpages[ids[-1]].float(), summaries[0][ids].float().mean(0), atol=1e-2)
    for trial in range(3):
        sc.q.copy_(torch.randn_like(sc.q))
        sc.seq_lens.copy_(lengths + trial)
        graph.replay()
        eager_out, eager_lse = step()
        assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse), f"trial {trial}: replay != eager"



def test_two_level_with_c_as_data_replays_each_calibrated_c():
    """``candidates="auto"`` on CUDA: one graph captured at the capacity c = 32, the layer's c written into its
    device tensor between replays (as calibration does at the end of a prefill): each replay selects what an eager
    step at that static c selects."""
    sc = make_scenario([48, 16 * 16 * 12 + 5, 16 * 70, 16 * 16 * 20], num_kv_heads=2, groups=4, head_dim=128,
                       block_size=64, seed=5, dtype=torch.bfloat16, key_offset=10.0)
    sc = on_device(sc)
    cfg = LocksConfig(budget=16 * 8)
    summaries = _summaries(sc, sc.seq_lens)
    superpages = torch.zeros_like(summaries[0])
    for n in range(16 * 16, int(sc.seq_lens.max()) + 1, 16 * 16):  # every complete superpage's centroid
        lk.build_completed_superpages(summaries[0], superpages, sc.block_table, sc.seq_lens.clamp_max(n), 16,
                                      sc.block_size)
    live = torch.tensor([0], dtype=torch.int32, device="cuda")

    def step():
        return lk.select_step(sc.q, sc.k_cache, sc.block_table, sc.seq_lens, summaries, cfg.page_size,
                              cfg.budget_pages, cfg.sink_pages, cfg.recent_pages, build=False, superpages=superpages,
                              candidates=32, live=live)

    live.fill_(lk.superpage_slots(cfg.budget_pages, cfg.sink_pages, cfg.recent_pages, 32))
    graph, (selected, chosen) = _capture(step)
    for c in (4, 16, 8, 32):
        live.fill_(lk.superpage_slots(cfg.budget_pages, cfg.sink_pages, cfg.recent_pages, c))
        graph.replay()
        eager, _ = _select(sc, summaries, cfg, build=False, superpages=superpages, candidates=c)
        assert torch.equal(selected[..., : eager.shape[-1]], eager), f"c = {c}: replay != eager static c"


def test_select_step_every_switch_reads_every_page_and_still_builds_the_completed_pages():
    """``select_step(every=True)``, what the engine's CUDA path runs where ``reads_every_page`` says so, replayed
    in a graph: ``ops.select.every_page``'s selection in ``Pmax`` slots, no superpages chosen, and the pages this
    step's token completed (sequences 0 and 2) summarized as the scored step summarizes them."""
    sc = _scenario(seed=4)
    cfg = LocksConfig(budget=256)
    unbuilt = _summaries(sc, sc.seq_lens - 1)
    summaries, scored = tuple(t.clone() for t in unbuilt), tuple(t.clone() for t in unbuilt)
    graph, (selected, chosen) = _capture(lambda: _select(sc, summaries, cfg, every=True))
    for tensor, start in zip(summaries, unbuilt):
        tensor.copy_(start)
    graph.replay()
    _select(sc, scored, cfg)
    pmax = sc.block_table.shape[1] * (sc.block_size // 16)
    assert chosen is None
    assert torch.equal(selected.cpu(), every_page(sc.seq_lens.cpu(), 2, pmax, 16))
    assert all(torch.equal(a, b) for a, b in zip(summaries, scored)), "the replay built the completed pages"
    assert not all(torch.equal(a, b) for a, b in zip(summaries, unbuilt)), "a page was completed this step"


@pytest.mark.parametrize("candidates", [0, 2], ids=["flat", "two_level"])
def test_decode_step_is_select_step_then_attention(candidates):
    """The engine's CUDA path calls the step in two halves with its hooks between them: ``select_step`` then
    ``sparse_paged_attention`` into a preallocated ``out`` give ``decode_step``'s output; the two-level scan
    hands back the superpages it chose (what the statistics count), the flat scan none."""
    sc = on_device(make_scenario([48, 16 * 40 + 5, 16 * 70, 512], num_kv_heads=2, groups=4, head_dim=128,
                                 block_size=64, seed=5, dtype=torch.bfloat16, key_offset=10.0))
    cfg = LocksConfig(budget=256)
    summaries = _summaries(sc, sc.seq_lens)
    superpages = torch.zeros_like(summaries[0])
    lk.build_completed_superpages(summaries[0], superpages, sc.block_table, sc.seq_lens, 16, sc.block_size)
    selected, chosen = _select(sc, summaries, cfg, build=False, superpages=superpages, candidates=candidates)
    assert (chosen is None) == (candidates == 0)
    if chosen is not None:
        assert chosen.shape[:2] == (4, 2) and chosen.dtype == torch.int64
    out = torch.full_like(sc.q, float("nan"))
    lse = lk.sparse_paged_attention(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, selected, 16,
                                    out=out)[1]
    ref_out, ref_lse = lk.decode_step(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, summaries, 16,
                                      cfg.budget_pages, cfg.sink_pages, cfg.recent_pages, build=False,
                                      superpages=superpages, candidates=candidates)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
