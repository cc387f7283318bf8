"""locks_studies.mass_budget: fixed top-K against top-p at the same mean pages."""

from __future__ import annotations

import pytest
import torch

from locks_studies.mass_budget import (
    compare, kept, level_for_mean_pages, pages_fixed, pages_top_p, read_order, reads)
from locks_engine.config import LocksConfig
from locks_studies.fidelity import DecodeSteps

CFG = LocksConfig(page_size=16, budget=64, sink_pages=1, recent_pages=1)  # 4 pages


def steps(seed: int, n: int = 512, t: int = 3, spread: float = 1.0) -> DecodeSteps:
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(n, 16, generator=gen)
    queries = spread * torch.randn(t, 2, 16, generator=gen)
    return DecodeSteps(keys, queries, torch.arange(n - t, n), page_size=16)


def oracle_order(s: DecodeSteps) -> dict:
    """read_order with the exact page log masses as the estimate."""
    return read_order(s, s.page_lse, CFG)


def test_read_order_forced_first_then_by_estimate_and_cumulates_true_mass():
    s = steps(0)
    o = read_order(s, s.scores("locks", CFG), CFG)
    pages = s.pages
    assert o["order"].shape == (3, pages) and o["valid"].tolist() == [pages] * 3
    forced = o["forced"][0].item()
    assert forced == 3  # sink, the page before the last, the last
    assert set(o["order"][0, :forced].tolist()) == {0, pages - 2, pages - 1}
    # every page once; the true mass of every page adds up to 1
    assert sorted(o["order"][1].tolist()) == list(range(pages))
    assert torch.allclose(o["true_cum"][:, -1], torch.ones(3), atol=1e-5)
    # after the forced pages, estimated shares fall
    est = o["est_cum"].diff(dim=-1)[:, forced:]
    assert (est[:, :-1] >= est[:, 1:] - 1e-7).all()


def test_fixed_budget_keeps_what_select_pages_keeps():
    """A fixed K in read order is select_pages' choice: the same true mass as DecodeSteps.kept."""
    s = steps(1)
    scores = s.scores("locks", CFG)
    o = read_order(s, scores, CFG)
    n = pages_fixed(o, CFG.budget_pages)
    assert n.tolist() == [CFG.budget_pages] * 3
    assert torch.allclose(kept(o, n), s.kept(scores, CFG).mean(-1), atol=1e-5)


def test_top_p_reads_pages_until_the_estimate_reaches_p_within_bounds():
    s = steps(2)
    o = oracle_order(s)
    n = pages_top_p(o, 0.5, k_max=10_000)
    # the exact estimate: the kept mass is the estimated one, at least p, and one page fewer would be below p
    assert (kept(o, n) >= 0.5 - 1e-5).all()
    assert (o["est_cum"].gather(-1, (n - 2).unsqueeze(-1)).squeeze(-1) < 0.5).all()
    assert (pages_top_p(o, 0.5, k_max=4) <= 4).all()
    assert (pages_top_p(o, 0.0, k_max=4) == o["forced"]).all()  # never fewer than the forced pages
    assert (pages_top_p(o, 1.0, k_max=10_000) <= o["valid"]).all()


def test_level_matches_the_mean_pages_and_refuses_an_unreachable_target():
    orders = [oracle_order(steps(3)), oracle_order(steps(4, spread=3.0))]
    level = level_for_mean_pages(orders, 6.0, k_max=32)
    mean = torch.cat([pages_top_p(o, level, 32).float() for o in orders]).mean().item()
    assert abs(mean - 6.0) <= 1.0
    with pytest.raises(ValueError, match="at most 32.0 pages"):
        level_for_mean_pages(orders, 40.0, k_max=32)


def test_reads_counts_a_page_list_among_the_first_n():
    o = oracle_order(steps(5))
    first = o["order"][0, :4].tolist()
    n = torch.tensor([4, 4, 4])
    assert reads(o, n, first)[0].item() == 1.0
    assert reads(o, torch.tensor([2, 2, 2]), first)[0].item() == 0.5
    assert torch.isnan(reads(o, n, [])).all()


def test_top_p_moves_pages_to_the_spread_layer_and_keeps_more_there():
    """One layer attends sharply, one diffusely: at the same mean pages top-p gives the diffuse one more pages
    and raises the worst layer's mass; the sharp layer keeps most of its mass either way."""
    sharp, diffuse = steps(6, spread=6.0), steps(7, spread=0.3)
    orders = [[oracle_order(sharp)], [oracle_order(diffuse)]]
    c = compare(orders, CFG.budget_pages, 24, {}, {})
    fixed, top_p = c["fixed"], c["top_p"]
    assert fixed["pages_per_layer"] == [4.0, 4.0]
    assert abs(sum(top_p["pages_per_layer"]) / 2 - 4.0) <= 0.5
    assert top_p["pages_per_layer"][1] > top_p["pages_per_layer"][0]
    assert fixed["kept_worst_layer"][0] == 1
    assert top_p["kept_worst_layer"][1] > fixed["kept_worst_layer"][1]


def test_a_floor_keeps_pages_in_every_layer_at_the_same_mean():
    sharp, diffuse = steps(6, spread=6.0), steps(7, spread=0.3)
    orders = [[oracle_order(sharp)], [oracle_order(diffuse)]]
    c = compare(orders, CFG.budget_pages, 24, {}, {}, k_min=3)
    assert min(c["top_p"]["pages_per_layer"]) >= 3
    assert abs(sum(c["top_p"]["pages_per_layer"]) / 2 - 4.0) <= 0.5
    with pytest.raises(ValueError, match="at least 5.0 pages"):
        compare(orders, CFG.budget_pages, 24, {}, {}, k_min=5)
