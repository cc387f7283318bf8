"""The per-layer ``c`` from the prompt's own queries (``locks_engine.ops.calibration``): the two-level selection
rebuilt from the flat scores is ``select_two_level``'s; recall is 1 once the candidates cover every superpage and
falls for a page the superpage centroids cannot see; the rule takes the smallest ``c`` that every KV head
accepts."""

import pytest
import torch

from locks_engine import LocksConfig
from locks_engine.ops import build_cache_summaries, score_pages
from locks_engine.ops.calibration import (
    candidate_recall, pick_candidates, pick_from_scores, prompt_queries, recall_from_scores, two_level_from_scores,
    with_margin,
)
from locks_engine.ops.superpages import (
    allocate_superpages, completed_superpages, select_two_level, superpage_scores, write_superpage_centroids,
)
from tests.support.helpers import make_scenario


def _paged(sc, cfg=LocksConfig()):
    store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, cfg)
    sp = allocate_superpages(store.num_pages, sc.k_cache.shape[2], sc.k_cache.shape[3], "cpu")
    write_superpage_centroids(sp, store, completed_superpages(sc.seq_lens, sc.seq_lens, sc.block_table,
                                                              sc.page_size, sc.block_size))
    return store, sp


@pytest.mark.parametrize("c", [1, 2, 5], ids=lambda c: f"c{c}")
def test_two_level_from_flat_scores_is_select_two_level(c):
    sc = make_scenario([16 * 16 * 9 + 5, 16 * 40, 16 * 16 * 3], num_kv_heads=2, groups=3, head_dim=32, seed=5)
    store, sp = _paged(sc)
    cfg = LocksConfig(budget=16 * 6, sink_pages=1, recent_pages=2)
    scores = score_pages(sc.q, store, sc.block_table, sc.seq_lens, 16, sc.block_size)
    coarse = superpage_scores(sc.q, sp, sc.block_table, sc.seq_lens, 16, sc.block_size)
    expected, _ = select_two_level(sc.q, store, sp, sc.block_table, sc.seq_lens, 2, cfg, c, sc.block_size)
    assert torch.equal(two_level_from_scores(scores, coarse, sc.seq_lens, 2, cfg, c), expected)


def _one_prompt(seq_len: int, queries: int, seed: int):
    """One sequence's paged cache and its last ``queries`` queries as rows (block table repeated)."""
    sc = make_scenario([seq_len], num_kv_heads=2, groups=2, head_dim=32, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(queries, 4, 32, generator=gen)
    lens = torch.arange(seq_len - queries + 1, seq_len + 1, dtype=torch.int32)
    return sc, q, sc.block_table.expand(queries, -1), lens


def test_recall_is_one_once_every_superpage_is_a_candidate():
    sc, q, table, lens = _one_prompt(16 * 16 * 6 + 9, 5, seed=7)
    store, sp = _paged(sc)
    cfg = LocksConfig(budget=16 * 8)
    recall = candidate_recall(q, store, sp, table, lens, 2, cfg, sc.block_size, choices=(1, 12))
    assert recall.shape == (2, 5, 2)
    assert ((recall >= 0) & (recall <= 1)).all()
    # 12 * 8 / 16 = 6 superpages + the forced ones: every complete superpage is a candidate
    assert torch.equal(recall[1], torch.ones(5, 2))


def test_recall_falls_for_a_page_the_superpage_centroids_miss():
    # page 40 (superpage 2) of KV head 0 holds +v and -v: its centroid, hence its superpage's, ignores v, but its
    # page summary sees the direction, so the flat scan reads it for a query along v; c = 1 reads superpage 1 instead
    seq_len = 16 * 16 * 6
    sc, q, table, lens = _one_prompt(seq_len, 3, seed=11)
    sc.k_cache.mul_(0.1)
    v = torch.zeros(32)
    v[3] = 30.0
    q[:, :2] = v / 10
    ppb = sc.block_size // 16
    block, offset = int(sc.block_table[0, 40 // ppb]), (40 % ppb) * 16
    sc.k_cache[block, offset: offset + 8, 0] = v
    sc.k_cache[block, offset + 8: offset + 16, 0] = -v
    for page in range(16, 32):  # superpage 1 leans towards v a little: the centroids rank it first
        block, offset = int(sc.block_table[0, page // ppb]), (page % ppb) * 16
        sc.k_cache[block, offset: offset + 16, 0] += v / 30
    store, sp = _paged(sc)
    cfg = LocksConfig(budget=16 * 4)
    recall = candidate_recall(q, store, sp, table, lens, 2, cfg, sc.block_size, choices=(1, 24))
    assert (recall[0, :, 0] < 0.5).all()
    assert torch.equal(recall[1], torch.ones(3, 2))
    assert pick_candidates(recall, (1, 24), 0.9) == 24


def test_pick_takes_the_smallest_c_every_head_accepts():
    recall = torch.tensor([[[0.99, 0.80]], [[0.995, 0.97]], [[1.0, 0.99]]]).expand(3, 4, 2)  # [C, T, H]
    assert pick_candidates(recall, (4, 8, 16), 0.95) == 8
    assert pick_candidates(recall, (4, 8, 16), 0.99) == 16
    assert pick_candidates(recall, (4, 8, 16), 0.999) == 16  # none reaches: the largest
    mixed = recall.clone()
    mixed[0, :2, 1] = 1.0  # the mean over queries of head 1 at c = 4: 0.9
    assert pick_candidates(mixed, (4, 8, 16), 0.95) == 8
    with pytest.raises(ValueError, match="one row per choice"):
        pick_candidates(recall, (4, 8), 0.9)
    with pytest.raises(ValueError, match="ascending"):
        pick_candidates(recall, (16, 8, 4), 0.9)


def test_prompt_queries_are_the_row_last_tokens():
    rows, lens = prompt_queries(query_len=100, seq_len=300, count=16)
    assert rows == slice(84, 100) and lens.tolist() == list(range(285, 301))
    rows, lens = prompt_queries(query_len=3, seq_len=3, count=16)
    assert rows == slice(0, 3) and lens.tolist() == [1, 2, 3]


def test_auto_is_a_candidates_setting_whose_layers_take_the_capacity():
    cfg = LocksConfig.from_dict({"selection": "two-level", "candidates": "auto"})
    assert cfg.calibrated and hash(cfg) and cfg.layer_candidates(7) == 64 and cfg.layer_candidates(None) == 64
    assert LocksConfig(selection="flat").candidates == "auto" and not LocksConfig(selection="flat").calibrated
    assert not LocksConfig(selection="two-level", candidates=(4,)).calibrated
    with pytest.raises(ValueError, match='allowed "auto" or a non-empty list'):
        LocksConfig(selection="two-level", candidates="fast")


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_the_engine_pick_stops_at_the_first_c_that_passes_and_agrees_with_every_c_measured(seed):
    """``pick_from_scores`` (ascending, stopping early) picks what measuring every ``c`` then ``pick_candidates``
    picks, at thresholds that end at different ``c`` (one of them none: the largest)."""
    sc, q, table, lens = _one_prompt(16 * 16 * 12 + 9, 6, seed=seed)
    store, sp = _paged(sc)
    cfg = LocksConfig(budget=16 * 5)
    choices = (1, 2, 4, 8)
    scores = score_pages(q, store, table, lens, 16, sc.block_size)
    coarse = superpage_scores(q, sp, table, lens, 16, sc.block_size)
    recall = recall_from_scores(scores, coarse, lens, 2, cfg, choices)
    picked = set()
    for threshold in (0.0, 0.9, 0.99, 0.999, 1.0 + 1e-6):
        expected = pick_candidates(recall, choices, threshold)
        assert pick_from_scores(scores, coarse, lens, 2, cfg, threshold, choices) == expected
        picked.add(expected)
    assert len(picked) >= 2


def test_the_default_selection_is_the_calibrated_two_level_where_it_applies():
    """No selection given: the two-level selection calibrated per layer, except where it cannot apply (Quest's
    formats have no centroids; the tail estimate needs every page's log mass), which take the flat scan; a
    selection given by hand is kept and validated as before."""
    assert LocksConfig().selection == "two-level" and LocksConfig().calibrated
    assert LocksConfig.from_dict({}).selection == "two-level"
    assert LocksConfig(summary_format="quest").selection == "flat"
    assert LocksConfig(tail="int8").selection == "flat"
    assert LocksConfig(selection="flat").selection == "flat" and not LocksConfig(selection="flat").calibrated
    with pytest.raises(ValueError, match="tail"):
        LocksConfig(selection="two-level", tail="int8")


def test_a_c_must_keep_the_mass_for_every_query_not_on_average():
    """One query of 16 below the threshold at c = 4 (the mean above it) sends the layer to the next c."""
    recall = torch.ones(3, 16, 2)
    recall[0, 5, 1] = 0.9  # c = 4: mean over the queries 0.994 in that head, one query at 0.9
    assert float(recall[0].mean(dim=0).amin()) >= 0.99
    assert pick_candidates(recall, (4, 8, 16), 0.99) == 8
    recall[1, :, 0] = 0.98
    assert pick_candidates(recall, (4, 8, 16), 0.99) == 16


def test_the_engine_takes_c_one_step_above_the_rule_at_most_the_capacity():
    assert with_margin(4) == 8 and with_margin(32) == 64 and with_margin(64) == 64
    assert with_margin(4, margin=0) == 4 and with_margin(8, (4, 8, 16), 2) == 16
    with pytest.raises(ValueError, match="c=5"):
        with_margin(5)
    with pytest.raises(ValueError, match="margin=-1"):
        with_margin(8, margin=-1)
