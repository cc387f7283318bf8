"""locks_studies.tail_estimate / tail_study / tail_report: the tail-estimate study's pure functions."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
import torch

from locks_engine.config import LocksConfig
from locks_studies.fidelity import DecodeSteps
from locks_studies.tail_estimate import HeadStudy, fit_bias, mass_sized_pages, mask_first
from locks_studies.tail_report import svg_chart, table
from locks_studies.tail_study import designs, reduce, study_context, tail_bytes

CFG = LocksConfig(page_size=16, budget=64, sink_pages=1, recent_pages=1)  # 4 pages


def study(seed: int, n: int = 512, t: int = 4, repeat: int = 1, needle=(7,)) -> HeadStudy:
    """A HeadStudy on random keys, values and queries; ``repeat`` equal keys in a row (16: one key a page)."""
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(n // repeat, 16, generator=gen).repeat_interleave(repeat, 0)
    values = torch.randn(n, 16, generator=gen)
    queries = 2 * torch.randn(t, 2, 16, generator=gen)
    steps = DecodeSteps(keys, queries, torch.arange(n - t, n), values=values, page_size=16)
    return HeadStudy(steps, values, CFG, list(needle))


def test_tails_with_exact_page_masses_equal_dense_when_every_page_holds_one_key():
    s = study(0, repeat=16)
    mask = s.fixed(4)
    res = s.run(mask, ("none", "true", "centroid"))
    assert res["none"]["err"].mean() > 0.1  # dropping the tail is far off
    # the exact page masses, and the centroid estimate (exact for equal keys), with the page's mean value: exact
    # up to the mean values' bf16 storage (relative step 2^-8)
    assert res["true"]["err"].max() < 5e-3 and res["centroid"]["err"].max() < 5e-3
    assert torch.allclose(res["true"]["est_tail"], res["true"]["true_tail"], atol=1e-5)


def test_superpage_tail_is_exact_when_every_superpage_holds_one_key():
    s = study(1, n=1024, repeat=256)
    res = s.run(s.fixed(4), ("none", "super"))
    assert res["none"]["err"].mean() > 0.1 and res["super"]["err"].max() < 5e-3  # bf16 means, as above


def test_reading_every_page_leaves_an_empty_tail_and_no_error():
    s = study(2)
    every = torch.ones(4, s.steps.pages, dtype=torch.bool)
    res = s.run(every, ("none", "est-int8", "half", "super"))
    for tail in res:
        assert res[tail]["err"].max() < 1e-5 and torch.allclose(res[tail]["kept"], torch.ones(4))
    assert torch.equal(res["est-int8"]["est_tail"], torch.zeros(4, 2))


def test_tail_estimate_lowers_the_error_and_keeps_the_selection_measures():
    s = study(3)
    res = s.run(s.fixed(6), ("none", "est-int8", "half"))
    assert res["est-int8"]["err"].mean() < res["none"]["err"].mean()
    assert torch.equal(res["est-int8"]["kept"], res["none"]["kept"])
    assert torch.equal(res["none"]["pages"], torch.full((4,), 6.0))


def test_needle_share_counts_the_needle_pages_read():
    s = study(4, needle=(5, 6))
    mask = torch.zeros(4, s.steps.pages, dtype=torch.bool)
    mask[:, 5] = True
    mask[2, 6] = True
    assert s.run(mask, ("none",))["none"]["needle"].tolist() == [0.5, 0.5, 1.0, 0.5]


def test_mass_sized_budget_respects_floor_and_cap():
    s = study(5)
    o = s.order
    assert (mass_sized_pages(o, 1.0, 4, 9) == 9).all()  # never past the cap
    assert (mass_sized_pages(o, 1e-6, 7, 9) == 7).all()  # never under the floor
    n = mass_sized_pages(o, 0.5, 4, 32)
    assert ((n >= 4) & (n <= 32)).all()
    # the pages read reach the level of estimated share (or hit the cap)
    reached = o["est_cum"].gather(-1, (n - 1).unsqueeze(-1)).squeeze(-1)
    assert ((reached >= 0.5) | (n == 32)).all()
    with pytest.raises(ValueError, match="above the cap"):
        mass_sized_pages(o, 0.9, 10, 9)
    mask = s.mass(0.5, 4, 32)
    assert torch.equal(mask.sum(-1), n)


def test_fixed_reads_the_forced_pages_first():
    s = study(6)
    mask = s.fixed(3)
    pages = s.steps.pages
    assert mask[:, [0, pages - 2, pages - 1]].all() and (mask.sum(-1) == 3).all()
    assert torch.equal(mask_first(torch.tensor([[2, 0, 1]]), torch.tensor([1])), torch.tensor([[False, False, True]]))


def test_fit_bias_recovers_a_constant_factor():
    est = torch.rand(5, 7) + 0.1
    assert fit_bias(est * 2.0, est) == pytest.approx(0.6931, abs=1e-4)
    assert fit_bias(torch.zeros(3), torch.zeros(3)) == 0.0


def test_tail_bytes_per_format():
    seq_lens = torch.tensor([512])
    mask = torch.zeros(1, 32, dtype=torch.bool)
    mask[0, :4] = True  # the first superpage is touched, the second is whole
    assert tail_bytes("none", mask, seq_lens, 16, 64).item() == 0
    assert tail_bytes("est-int8", mask, seq_lens, 16, 64).item() == 28 * 66
    assert tail_bytes("est-bf16", mask, seq_lens, 16, 64).item() == 28 * 128
    assert tail_bytes("half", mask, seq_lens, 16, 64).item() == 2 * 28 * 66
    assert tail_bytes("super", mask, seq_lens, 16, 64).item() == 4 * 64 + 12 * 128


def test_study_context_reduce_table_and_figure_on_a_synthetic_capture():
    gen = torch.Generator().manual_seed(7)
    layers, heads, groups, n, dim, t = 2, 2, 2, 512, 16, 6
    data = {"k": torch.randn(layers, heads, n, dim, generator=gen).half(),
            "v": torch.randn(layers, heads, n, dim, generator=gen).half(),
            "q": torch.randn(layers, heads * groups, t, dim, generator=gen), "positions": torch.arange(n - t, n)}
    prose = torch.arange(t) < 3
    grid = designs([0.125], [0.9])
    m = study_context(data, n, CFG, grid, 3, 8, [4], prose, log=lambda _: None)
    assert m["fixed-12.5%"]["err"].shape == (layers, heads, t, groups)
    assert m["fixed-12.5%+fit"]["bias"].shape == (layers, heads)
    rows = reduce(m, ~prose, {"prose": prose, "answer": ~prose})
    r = rows["fixed-12.5%"]
    assert r["pages"] == 4.0 and 0 < r["kept"] < 1 and len(r["err_per_layer"]) == layers
    assert rows["fixed-12.5%+est-int8"]["bytes"] > r["bytes"]
    lines = table(rows, ["fixed-12.5%", "mass-p0.9+half"])
    assert len(lines) == 4 and lines[2].startswith("| fixed-12.5% | 4.0 |")
    svg = svg_chart([("a", {"x": [(1.0, 0.1), (2.0, 0.05)]})], {"x": "#000000"}, "t")
    root = ET.fromstring(svg)
    assert len(root.findall("{http://www.w3.org/2000/svg}polyline")) == 1
