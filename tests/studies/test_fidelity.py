"""``locks_studies.fidelity`` evaluates the ops' formulas once per sequence: it must give the ops' own numbers."""

import pytest
import torch

from locks_engine import LocksConfig
from locks_studies.fidelity import DecodeSteps
from locks_engine.ops import (
    attention_mass_kept,
    build_cache_summaries,
    build_quest_summaries,
    build_shared_basis_summaries,
    dense_paged_attention,
    fit_shared_basis,
    oracle_scores,
    quest_scores,
    score_pages,
    select_pages,
    shared_basis_scores,
    sparse_paged_attention,
)
from tests.support.helpers import assert_close

PAGE = 16


def ops_scores(steps: DecodeSteps, selector: str, cfg: LocksConfig) -> torch.Tensor:
    """The same selector through the ops' paged path: one block table row per step."""
    k_cache = steps.k_pages
    block_table = torch.arange(steps.pages).expand(len(steps.positions), -1)
    args = (block_table, steps.seq_lens, PAGE)
    if selector == "oracle":
        return oracle_scores(steps.q, k_cache, *args)
    if selector == "locks":
        return score_pages(steps.q, build_cache_summaries(k_cache, block_table, steps.seq_lens, cfg), *args, PAGE)
    if selector == "quest":
        fmt = cfg.summary_format if cfg.summary_format.startswith("quest") else "quest"
        return quest_scores(steps.q, build_quest_summaries(k_cache, fmt), *args, PAGE)
    rank = cfg.rank if selector == "shared" else steps.shared_rank_at_equal_bytes(cfg)
    basis = fit_shared_basis(k_cache[: int(steps.seq_lens.min()) // PAGE], rank)
    store = build_shared_basis_summaries(k_cache, basis)
    return shared_basis_scores(steps.q, store, basis, *args, PAGE)


@pytest.fixture(scope="module")
def steps():
    gen = torch.Generator().manual_seed(7)
    n, dim, groups = 40 * PAGE, 64, 7
    keys = torch.randn(n, dim, generator=gen) * torch.linspace(0.2, 3.0, dim) + 2.0 * torch.randn(dim, generator=gen)
    queries = torch.randn(5, groups, dim, generator=gen) * 1.5
    positions = torch.tensor([17 * PAGE - 1, 23 * PAGE + 5, 31 * PAGE, 39 * PAGE + 7, n - 1])
    return DecodeSteps(keys, queries, positions, values=torch.randn(n, dim, generator=gen))


@pytest.mark.parametrize(
    "selector,fmt,rank",
    [("oracle", "float", 8), ("locks", "float", 8), ("locks", "paper", 4), ("locks", "colwise", 2),
     ("quest", "colwise", 8), ("quest", "quest4", 8), ("shared", "colwise", 4), ("shared-bytes", "colwise", 8)],
    ids=["oracle", "locks-float-r8", "locks-paper-r4", "locks-colwise-r2", "quest", "quest4", "shared-r4",
         "shared-bytes-r8"],
)
def test_scores_match_the_ops_path(steps, selector, fmt, rank):
    cfg = LocksConfig(rank=rank, summary_format=fmt, budget=6 * PAGE)
    ref, out = ops_scores(steps, selector, cfg), steps.scores(selector, cfg)
    assert ref.shape == out.shape
    assert torch.equal(torch.isinf(ref), torch.isinf(out))
    finite = torch.isfinite(ref)
    assert_close(selector, ref[finite], out[finite], 1e-5)


@pytest.mark.parametrize("budget_pages", [3, 6, 17, 40], ids=lambda b: f"budget{b}")
def test_measures_match_the_ops_path(steps, budget_pages):
    cfg = LocksConfig(rank=4, budget=budget_pages * PAGE)
    scores = steps.scores("locks", cfg)
    block_table = torch.arange(steps.pages).expand(len(steps.positions), -1)
    v_cache = steps.values.view(steps.pages, PAGE, 1, -1)
    selected = select_pages(scores, steps.seq_lens, 1, cfg)
    args = (steps.q, steps.k_pages, v_cache, block_table, steps.seq_lens, selected, PAGE)
    result = steps.evaluate(scores, cfg)
    assert_close("kept", attention_mass_kept(*args), result["kept"], 1e-5)
    sparse, _ = sparse_paged_attention(*args)
    dense, _ = dense_paged_attention(steps.q, steps.k_pages, v_cache, block_table, steps.seq_lens, PAGE)
    out_err = (sparse - dense).norm(dim=-1) / dense.norm(dim=-1)
    torch.testing.assert_close(result["out_err"], out_err, atol=1e-5, rtol=1e-3)
    assert (result["pages"] == (selected >= 0).sum(-1)[:, 0]).all()


def test_the_oracle_against_itself_is_one_with_full_recall(steps):
    cfg = LocksConfig(budget=5 * PAGE)
    result = steps.evaluate(steps.scores("oracle", cfg), cfg)
    assert torch.equal(result["ratio"], torch.ones_like(result["ratio"]))
    assert torch.equal(result["recall"], torch.ones_like(result["recall"]))


def test_budget_past_the_pages_is_dense(steps):
    cfg = LocksConfig(budget=steps.pages * PAGE)
    result = steps.evaluate(steps.scores("window", cfg), cfg)
    assert_close("kept", torch.ones_like(result["kept"]), result["kept"], 1e-6)
    assert result["out_err"].max() < 1e-5


def test_a_rotation_leaves_full_rank_unquantized_scores_exact(steps):
    """Full rank, no rounding: the reconstruction is exact, with or without an orthonormal rotation."""
    cfg = LocksConfig(rank=PAGE, summary_format="float", budget=5 * PAGE)
    rotation = torch.linalg.qr(torch.randn(64, 64, generator=torch.Generator().manual_seed(1), dtype=torch.float64))[0]
    exact = steps.scores("oracle", cfg)
    finite = torch.isfinite(exact)
    assert_close("rotated", exact[finite], steps.scores("locks", cfg, rotation)[finite], 1e-5)


def test_values_are_optional_and_bad_inputs_fail():
    keys = torch.randn(4 * PAGE, 8)
    steps = DecodeSteps(keys, torch.randn(2, 3, 8), torch.tensor([20, 63]))
    cfg = LocksConfig(budget=3 * PAGE)
    assert "out_err" not in steps.evaluate(steps.scores("quest", cfg), cfg)
    with pytest.raises(ValueError, match="multiple of page_size"):
        DecodeSteps(keys[:-1], torch.randn(2, 3, 8), torch.tensor([20, 62]))
    with pytest.raises(ValueError, match="unknown selector"):
        steps.scores("magic", cfg)


@pytest.mark.parametrize("selector", ["locks", "quest", "shared", "window"])
@pytest.mark.parametrize("budget_pages", [3, 5, 9])
def test_group_ratio_is_at_most_one(steps, selector, budget_pages):
    """The exact-LSE oracle picks the pages with the largest group-mean share: no selector keeps more of the
    group's mean mass (per query head it can, the oracle being group-shared). On real keys it can pass 1 by
    ~1e-3: shares are normalized over complete pages, without the last page's few tokens."""
    cfg = LocksConfig(rank=2, summary_format="paper", budget=budget_pages * PAGE)
    result = steps.evaluate(steps.scores(selector, cfg), cfg)
    assert result["group_ratio"].max() <= 1 + 1e-5
    kept, oracle = result["kept"].mean(1), result["oracle_kept"].mean(1)
    torch.testing.assert_close(result["group_ratio"], kept / oracle)
