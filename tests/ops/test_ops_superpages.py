"""The two-level selection's ops twin (``locks_engine.ops.superpages``): superpage centroids built step by step
equal the one-shot build and the keys' mean; the selection equals the flat selection over the candidates' scores
(the offline study's definition) and, once every superpage is a candidate, the flat selection itself."""

import pytest
import torch

from locks_engine import LocksConfig
from locks_engine.ops import build_cache_summaries, score_pages, select_pages
from locks_engine.ops.score import score_candidate_pages
from locks_engine.ops.select import group_mass_shares, select_candidate_pages
from locks_engine.ops.superpages import (
    SUPERPAGE_PAGES, allocate_superpages, candidate_pages, completed_superpages, select_two_level, superpage_config,
    scanned_summaries, superpage_scores, two_level_scanned, write_superpage_centroids,
)
from tests.support.helpers import make_scenario

CFG = LocksConfig(budget=16 * 8, selection="two-level", candidates=(1,))


def _superpages(sc, store, query_lens=None):
    sp = allocate_superpages(store.num_pages, sc.k_cache.shape[2], sc.k_cache.shape[3], "cpu")
    query_lens = sc.seq_lens if query_lens is None else query_lens
    ids = completed_superpages(sc.seq_lens, query_lens, sc.block_table, sc.page_size, sc.block_size)
    write_superpage_centroids(sp, store, ids)
    return sp, ids


def test_completed_superpages_lists_each_superpage_once_as_tokens_arrive():
    sc = make_scenario([16 * 40 + 3], num_kv_heads=2, groups=2, head_dim=32, block_size=64)
    seen = []
    for n in range(1, int(sc.seq_lens[0]) + 1, 37):
        added = min(37, int(sc.seq_lens[0]) - n + 1)
        lens = torch.tensor([n + added - 1])
        ids = completed_superpages(lens, torch.tensor([added]), sc.block_table, 16, sc.block_size)
        seen += ids[:, -1].tolist()
    full = completed_superpages(sc.seq_lens, sc.seq_lens, sc.block_table, 16, sc.block_size)
    assert full.shape == (40 // SUPERPAGE_PAGES, SUPERPAGE_PAGES)  # 2 complete superpages of 40 pages
    assert seen == full[:, -1].tolist()
    ppb = sc.block_size // 16
    expected = [int(sc.block_table[0, p // ppb]) * ppb + p % ppb for p in range(32)]
    assert full.flatten().tolist() == expected


def test_superpage_centroid_is_the_mean_of_its_keys():
    sc = make_scenario([16 * 33, 16 * 16], num_kv_heads=2, groups=3, head_dim=32, seed=3)
    cfg = LocksConfig(summary_format="float")
    store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, cfg)
    sp, ids = _superpages(sc, store)
    assert ids.shape[0] == 2 + 1
    keys = sc.k_cache.view(-1, 16, *sc.k_cache.shape[2:])[ids]  # [Ns, 16, B, H, D] pages by physical id
    expected = keys.float().mean(dim=(1, 2)).half()
    assert torch.allclose(sp[ids[:, -1]].float(), expected.float(), atol=2e-3)


def test_superpage_scores_are_centroid_logits_and_inf_where_incomplete():
    sc = make_scenario([16 * 37, 16 * 15], num_kv_heads=2, groups=2, head_dim=32, seed=1)
    store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, LocksConfig())
    sp, ids = _superpages(sc, store)
    scores = superpage_scores(sc.q, sp, sc.block_table, sc.seq_lens, 16, sc.block_size)
    assert scores.shape == (2, 4, -(-sc.block_table.shape[1] * 2 // SUPERPAGE_PAGES))
    assert torch.isfinite(scores[0, :, :2]).all() and torch.isinf(scores[0, :, 2:]).all()
    assert torch.isinf(scores[1]).all()  # 15 pages: no complete superpage
    mu = sp[ids[1, -1]].float()  # superpage 1 of row 0, KV head 1 -> query heads 2, 3
    assert torch.allclose(scores[0, 2:, 1], (sc.q[0, 2:].float() @ mu[1]) * 32**-0.5, atol=1e-5)


def test_candidate_scores_equal_the_flat_scores_of_the_same_pages():
    sc = make_scenario([16 * 50 + 5, 16 * 20], num_kv_heads=2, groups=3, head_dim=32, seed=2)
    for fmt in ("colwise8", "chanlog", "float"):
        store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, LocksConfig(summary_format=fmt))
        flat = score_pages(sc.q, store, sc.block_table, sc.seq_lens, 16, sc.block_size)
        pages = torch.tensor([[[0, 3, 49, 50, -1], [7, 8, 9, 10, 11]], [[1, 19, 20, -1, -1], [0, 2, 4, 6, 8]]])
        got = score_candidate_pages(sc.q, store, sc.block_table, sc.seq_lens, pages, 16, sc.block_size)
        expected = torch.gather(flat, 2, pages.clamp_min(0).repeat_interleave(3, dim=1))
        expected = expected.masked_fill((pages < 0).repeat_interleave(3, dim=1), float("-inf"))
        assert torch.equal(torch.isinf(got), torch.isinf(expected)), fmt
        assert torch.allclose(got[torch.isfinite(got)], expected[torch.isfinite(expected)], atol=1e-4), fmt


def test_candidate_selection_over_every_page_is_the_flat_selection():
    sc = make_scenario([16 * 60 + 7, 16 * 9, 16 * 31], num_kv_heads=2, groups=4, head_dim=32, seed=4)
    store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, LocksConfig())
    scores = score_pages(sc.q, store, sc.block_table, sc.seq_lens, 16, sc.block_size)
    cfg = LocksConfig(budget=16 * 12, sink_pages=2, recent_pages=3)
    pmax = scores.shape[-1]
    num_pages = (sc.seq_lens.long() + 15) // 16
    pages = torch.arange(pmax).expand(3, 2, pmax)
    pages = torch.where(pages < num_pages.view(-1, 1, 1), pages, -1)
    assert torch.equal(select_candidate_pages(scores, pages, sc.seq_lens, 2, cfg),
                       select_pages(scores, sc.seq_lens, 2, cfg))


@pytest.mark.parametrize("candidates", [1, 2, 4])
@pytest.mark.parametrize("lengths", [[16 * 300 + 9], [16 * 128, 16 * 17 + 3, 16 * 64]], ids=["one", "three"])
def test_two_level_is_the_flat_selection_over_the_chosen_superpages(candidates, lengths):
    """What the offline study measured (``selection_cost.two_level_mask``): ``select_pages`` over page scores
    with every page outside the chosen superpages at ``-inf``."""
    sc = make_scenario(lengths, num_kv_heads=2, groups=3, head_dim=32, seed=5, key_offset=2.0)
    cfg = LocksConfig(budget=16 * 8, sink_pages=1, recent_pages=1)
    store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, cfg)
    sp, _ = _superpages(sc, store)
    selected, pages = select_two_level(sc.q, store, sp, sc.block_table, sc.seq_lens, 2, cfg, candidates,
                                       sc.block_size)
    coarse = superpage_scores(sc.q, sp, sc.block_table, sc.seq_lens, 16, sc.block_size)
    chosen = select_pages(coarse, sc.seq_lens, 2, superpage_config(cfg, candidates))
    assert torch.equal(pages, candidate_pages(chosen, sc.seq_lens, 16))
    flat = score_pages(sc.q, store, sc.block_table, sc.seq_lens, 16, sc.block_size)
    pmax = flat.shape[-1]
    in_chosen = torch.zeros(len(lengths), 2, pmax + SUPERPAGE_PAGES, dtype=torch.bool)
    in_chosen.scatter_(2, pages.clamp_min(0) + (pages < 0) * pmax, True)
    masked = flat.masked_fill(~in_chosen[..., :pmax].repeat_interleave(3, dim=1), float("-inf"))
    expected = select_pages(masked, sc.seq_lens, 2, cfg)
    # the same pages, up to near-ties of the two score computations: compare the shares they keep
    shares = group_mass_shares(masked, 2)
    def kept(sel):
        return torch.gather(shares, 2, sel.clamp_min(0)).masked_fill(sel < 0, 0).sum(-1)
    assert torch.allclose(kept(selected), kept(expected), atol=1e-5)
    assert (selected >= 0).sum() == (expected >= 0).sum()
    # the forced pages are read, the candidates are C = 16 * (ceil(c K / 16) + 3) slots
    assert (selected == 0).any(-1).all()
    last = ((sc.seq_lens.long() + 15) // 16 - 1).view(-1, 1, 1)
    assert (selected == last).any(-1).all()
    assert pages.shape[-1] == 16 * (-(-candidates * 8 // 16) + 3)


def test_two_level_with_every_superpage_a_candidate_is_the_flat_selection():
    sc = make_scenario([16 * 64 + 1, 16 * 40], num_kv_heads=2, groups=2, head_dim=32, seed=6, key_offset=1.0)
    cfg = LocksConfig(budget=16 * 16)
    store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, cfg)
    sp, _ = _superpages(sc, store)
    selected, _ = select_two_level(sc.q, store, sp, sc.block_table, sc.seq_lens, 2, cfg, 4, sc.block_size)
    flat = score_pages(sc.q, store, sc.block_table, sc.seq_lens, 16, sc.block_size)
    expected = select_pages(flat, sc.seq_lens, 2, cfg)
    shares = group_mass_shares(flat, 2)
    kept = [torch.gather(shares, 2, s.clamp_min(0)).masked_fill(s < 0, 0).sum(-1) for s in (selected, expected)]
    assert torch.allclose(*kept, atol=1e-5)


def test_config_takes_two_level_settings_and_rejects_bad_ones():
    cfg = LocksConfig.from_dict({"selection": "two-level", "candidates": [4, 0, 8]})
    assert cfg.candidates == (4, 0, 8) and hash(cfg)
    assert [cfg.layer_candidates(i) for i in range(3)] == [4, 0, 8]
    with pytest.raises(ValueError, match="none for layer 3"):
        cfg.layer_candidates(3)
    assert LocksConfig(selection="two-level", candidates=(5,)).layer_candidates(None) == 5
    assert LocksConfig(selection="flat", candidates=(5,)).layer_candidates(2) == 0
    for bad in ({"selection": "tree"}, {"candidates": []}, {"candidates": [-1]}, {"candidates": [1.5]},
                {"candidates": 4}):
        with pytest.raises(ValueError, match="LocksConfig"):
            LocksConfig.from_dict(bad)


@pytest.mark.parametrize("candidates", [1, 3])
def test_scanned_count_from_the_lengths_equals_the_candidates_count(candidates):
    lengths = [16 * 300 + 9, 16 * 256, 16 * 48, 16 * 47 + 15, 16 * 16, 5, 16 * 64 + 1]
    sc = make_scenario(lengths, num_kv_heads=2, groups=2, head_dim=32, seed=7)
    cfg = LocksConfig(budget=16 * 8, sink_pages=1, recent_pages=1)
    store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, cfg)
    sp, _ = _superpages(sc, store)
    _, pages = select_two_level(sc.q, store, sp, sc.block_table, sc.seq_lens, 2, cfg, candidates, sc.block_size)
    slots = superpage_config(cfg, candidates).budget_pages
    for row in range(len(lengths)):
        one = sc.seq_lens[row : row + 1]
        assert two_level_scanned(one, 16, slots, 0.25) == scanned_summaries(pages[row : row + 1], one, 16, 0.25), row


def test_scanned_count_of_calibrated_layers_is_the_sum_of_each_layers_count():
    """Slots as data (one per calibrated layer, int32 on the device): one call counts them all, as the sum of the
    per-layer calls with ints does."""
    seq_lens = torch.tensor([16 * 300 + 9, 16 * 256, 16 * 48, 5, 16 * 64 + 1, 16 * 16 * 9])
    slots = [2, 5, 9, 40, 2]
    want = sum(two_level_scanned(seq_lens, 16, s, 0.25) for s in slots)
    got = two_level_scanned(seq_lens, 16, torch.tensor(slots, dtype=torch.int32), 0.25)
    assert got.shape == () and got.dtype == torch.float32
    torch.testing.assert_close(got, want)
    assert got > two_level_scanned(seq_lens, 16, torch.tensor([2], dtype=torch.int32), 0.25) * 4
