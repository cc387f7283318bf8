"""The selection-cost study's rules (``locks_studies.selection_cost``) on small generated decode steps: the cheaper
scans reduce to the flat scan at their limits, and the byte counts match hand-computed cases."""

import pytest
import torch

from locks_studies import selection_cost as sc
from locks_studies.selection_report import projected_bytes
from locks_engine import LocksConfig
from locks_studies.fidelity import DecodeSteps

PAGE = 16


def decode_run(pages: int = 40, steps: int = 12, groups: int = 7, dim: int = 64, seed: int = 3) -> DecodeSteps:
    """Consecutive decode steps ending at the last token of ``pages`` pages (a page completes during the run)."""
    gen = torch.Generator().manual_seed(seed)
    n = pages * PAGE
    keys = torch.randn(n, dim, generator=gen) * torch.linspace(0.2, 3.0, dim) + 2.0 * torch.randn(dim, generator=gen)
    queries = torch.randn(steps, groups, dim, generator=gen) * 1.5
    return DecodeSteps(keys, queries, torch.arange(n - steps, n))


@pytest.fixture(scope="module")
def run():
    return decode_run()


@pytest.mark.parametrize("kind", sc.COARSE_KINDS)
@pytest.mark.parametrize("superpage", [4, 7], ids=["sp4", "sp7-odd"])
def test_two_levels_with_every_superpage_a_candidate_is_the_flat_scan(run, kind, superpage):
    cfg = LocksConfig(budget=6 * PAGE)
    scores = run.scores("locks", LocksConfig(rank=4, budget=cfg.budget))
    coarse = sc.coarse_scores(run, kind, superpage)
    mask, scored, count = sc.two_level_mask(run, scores, coarse, superpage, run.pages // superpage, cfg)
    assert torch.equal(mask, run.selected_mask(scores, cfg))
    assert torch.equal(scored, sc.complete_pages(run.seq_lens, PAGE))
    assert torch.equal(count, sc.complete_pages(run.seq_lens, PAGE) // superpage)


def test_two_levels_read_summaries_only_inside_the_chosen_superpages(run):
    superpage, cfg = 4, LocksConfig(budget=6 * PAGE)
    scores = run.scores("locks", LocksConfig(rank=4, budget=cfg.budget))
    coarse = sc.coarse_scores(run, "minmax", superpage)
    mask, scored, _ = sc.two_level_mask(run, scores, coarse, superpage, 2, cfg)
    done = sc.complete_pages(run.seq_lens, PAGE)
    tail = done - done // superpage * superpage
    assert torch.equal(scored, 2 * superpage + tail)
    best = coarse.softmax(-1).mean(1).argmax(-1)  # [T] the superpage of largest group share
    for t in range(len(mask)):
        assert mask[t, best[t] * superpage:(best[t] + 1) * superpage].any() or scores[t].isinf().all()
    assert (mask.sum(1) <= cfg.budget_pages).all()


def test_coarse_scores_rank_the_superpage_that_holds_the_query_direction():
    steps = decode_run(pages=32)
    keys = steps.keys.clone()
    keys[8 * PAGE:12 * PAGE] += 6.0 * steps.queries[-1].mean(0)  # superpage 2 (of 4 pages) aligned with q
    steps = DecodeSteps(keys, steps.queries, steps.positions)
    for kind in sc.COARSE_KINDS:
        assert sc.coarse_scores(steps, kind, 4)[-1].mean(0).argmax().item() == 2, kind


def test_reuse_every_step_is_the_per_step_selection(run):
    cfg = LocksConfig(budget=6 * PAGE)
    masks = run.selected_mask(run.scores("locks", LocksConfig(rank=4, budget=cfg.budget)), cfg)
    at = torch.arange(3, len(masks))
    assert torch.equal(sc.reuse_masks(masks, run.seq_lens, at, 1, cfg)[0], masks[at])


def test_reuse_adds_the_forced_and_the_newly_completed_pages():
    steps = decode_run(pages=10)
    n = steps.keys.shape[0]
    # seq_lens n-19 .. n-8: page 8 completes at the 4th step, the last step is 8 tokens into page 9
    run = DecodeSteps(steps.keys, steps.queries, torch.arange(n - 20, n - 8))
    cfg = LocksConfig(budget=6 * PAGE, recent_pages=0)
    masks = torch.zeros(len(run.positions), run.pages, dtype=torch.bool)
    out = sc.reuse_masks(masks, run.seq_lens, torch.tensor([len(masks) - 1]), 12, cfg)[:, 0]  # [k, P]
    assert out[:, 0].all() and out[:, 9].all()  # sink and last page at every lag
    assert out[:, 8].tolist() == [False] * 9 + [True] * 3  # page 8 is new to a selection made before it completed
    assert not out[:, 1:8].any()


def test_reuse_refuses_steps_that_are_not_consecutive():
    steps = decode_run()
    gappy = DecodeSteps(steps.keys, steps.queries, steps.positions - torch.arange(len(steps.positions)) % 2)
    cfg = LocksConfig(budget=6 * PAGE)
    with pytest.raises(ValueError, match="consecutive"):
        sc.reuse_masks(torch.zeros(12, gappy.pages, dtype=torch.bool), gappy.seq_lens, torch.tensor([11]), 4, cfg)


def test_choose_anchors_follows_blocks_of_similar_layers():
    overlap = torch.full((8, 8), 0.1)
    overlap[:4, :4] = overlap[4:, 4:] = 0.9
    assert sc.choose_anchors(overlap, 2) == [0, 4]
    assert sc.choose_anchors(overlap, 8) == list(range(8))
    assert sc.follower_of([0, 4], 8) == [0, 0, 0, 0, 4, 4, 4, 4]
    with pytest.raises(ValueError, match="count=0"):
        sc.choose_anchors(overlap, 0)


def test_selection_overlap_counts_the_later_selection_beyond_forced_pages():
    forced = torch.tensor([[True, False, False, False, False]])
    first = torch.tensor([[True, True, False, True, False]])
    second = torch.tensor([[True, True, True, False, False]])
    assert sc.selection_overlap(first, second, forced).tolist() == [0.5]
    assert sc.selection_overlap(first, forced, forced).tolist() == [1.0]


def test_bytes_per_step_on_a_hand_computed_case():
    # a/k * (n_s s + n_c c) + n_read p = 0.5/4 * (100*800 + 10*464) + 20*4096
    assert sc.step_bytes(100, 10, 20, 800, 464, 4096, interval=4, scoring_share=0.5) == 92_500
    assert sc.score_traffic(100, 10, groups=7, interval=4, scoring_share=0.5) == 0.125 * 12 * 7 * 110
    with pytest.raises(ValueError, match="interval=0"):
        sc.step_bytes(1, 0, 1, 800, 0, 4096, interval=0)


@pytest.mark.parametrize(
    "summary,rank,dim,expected",
    [("colwise8", 8, 64, 800), ("colwise8", 8, 128, 1440), ("superpage-basis", 8, 64, 128 + 128 + 16 + 64)],
    ids=["colwise8-d64", "colwise8-d128", "superpage-basis-d64"],
)
def test_summary_bytes_per_page(summary, rank, dim, expected):
    assert sc.page_bytes(summary, rank, dim) == expected


@pytest.mark.parametrize(
    "kind,expected", [("centroid", 128), ("minmax", 256), ("pagecent", 128 + 4 * 64 + 8 + 16 * 4 + 8)],
    ids=["centroid", "minmax", "pagecent-r4"],
)
def test_coarse_bytes_per_superpage(kind, expected):
    assert sc.coarse_bytes(kind, 64, 16) == expected


def test_superpage_basis_keeps_local_scores_outside_whole_superpages(run):
    local = run.scores("locks", LocksConfig(rank=8, budget=96))
    shared = sc.superpage_basis_scores(run, 4, 16, local)
    whole = (sc.complete_pages(run.seq_lens, PAGE) // 16 * 16).min().item()
    assert torch.equal(shared[..., whole:], local[..., whole:])
    assert torch.isfinite(shared[..., :whole]).all()
    assert not torch.equal(shared[..., :whole], local[..., :whole])


def test_projected_bytes_at_1m_on_a_hand_computed_case():
    flat = {"coarse": None, "summary": "colwise8", "rank": 8, "superpage": 16, "candidate_pages": 8, "interval": 1,
            "anchors": None}
    pages, k = 65536, 128  # 1M tokens, budget 2048
    assert projected_bytes(flat, 1 << 20) == pytest.approx(100 * (pages * 1440 + k * 8192) / (pages * 8192))
    two_level = {**flat, "coarse": "centroid", "candidate_pages": 4, "interval": 2}
    # 4 K = 512 candidate pages (32 superpages) + half a superpage of tail; 4,096 superpage centroids of 256 B
    expected = (0.5 * (520 * 1440 + 4096 * 256) + k * 8192) / (pages * 8192)
    assert projected_bytes(two_level, 1 << 20) == pytest.approx(100 * expected)


def test_layer_adaptive_takes_the_cheapest_choice_within_the_flat_scans_mass_per_layer():
    from locks_studies.selection_policy import layer_adaptive
    from locks_studies.selection_study import Candidate

    flat, cheap = Candidate("flat r8 fused (e)", "fused"), Candidate("2L centroid c4", "two-level", coarse="centroid")
    calib = [{"candidate": flat.name, "budget_frac": 0.02, "bytes_pct_d64": 21.5,
              "mass_layer_means": {0: 0.99, 1: 0.97}},
             {"candidate": cheap.name, "budget_frac": 0.02, "bytes_pct_d64": 4.1,
              "mass_layer_means": {0: 0.987, 1: 0.90}}]
    recs = [{"cand": c, "frac": 0.02, "layer": layer} for c in (flat, cheap) for layer in (0, 1)]
    policy = (("within 0.005", -0.005, (flat.name, cheap.name)),)
    picked = {r["layer"]: r["source"].name for r in layer_adaptive(recs, calib, policy)}
    assert picked == {0: cheap.name, 1: flat.name}


def test_the_shipped_two_level_selection_is_the_studied_one_with_its_forced_superpages(run):
    """``ops.superpages.select_two_level`` (what the backend runs) against the study's ``two_level_mask`` at the
    same ``M``: the shipped one reads the study's pages plus what its forced superpages (the first, the one before
    the last) add, so it keeps at least as much mass; with every superpage a candidate both are the flat scan."""
    steps = decode_run(pages=160, steps=6, seed=5)
    at = torch.arange(len(steps.seq_lens))
    cfg = LocksConfig(budget=PAGE * 8)
    cache = sc.paged_summaries(steps)
    scores = steps.scores("locks", LocksConfig(budget=48))
    coarse = sc.coarse_scores(steps, "centroid", 16)
    for c in (1, 2):
        shipped, scanned = sc.shipped_two_level_mask(steps, at, cfg, c, cache)
        studied = sc.two_level_mask(steps, scores, coarse, 16, -(-c * 8 // 16), cfg)[0]
        assert (shipped.sum(-1) == studied.sum(-1)).all()
        kept, kept_studied = steps.mass_kept(shipped), steps.mass_kept(studied)
        assert (kept.mean(-1) >= kept_studied.mean(-1) - 0.02).all()
        assert all(0 < s < 160 for s in scanned)
    wide, scanned = sc.shipped_two_level_mask(steps, at, cfg, 32, cache)
    flat = steps.selected_mask(scores, cfg)
    assert torch.allclose(steps.mass_kept(wide), steps.mass_kept(flat), atol=1e-4)
    assert scanned == (steps.seq_lens // PAGE).tolist()
