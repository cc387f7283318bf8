"""Group-shared page selection: invariants, and top-k checked by the mass it keeps (ties make indices moot)."""

import pytest
import torch

from locks_engine import LocksConfig
from locks_engine.config import MAX_BUDGET
from locks_engine.ops import select_pages
from locks_engine.ops.select import every_page, forced_page_mask, group_mass_shares, reads_every_page

CASES = {
    "long_partial": (1000, 7),
    "long_exact_pages": (1024, 4),
    "one_token": (1, 1),
    "fewer_pages_than_budget": (40, 4),
    "budget_equals_pages": (160, 4),
}


def _random_scores(seqs, heads, pmax, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(seqs, heads, pmax, generator=gen) * 3


@pytest.mark.parametrize("seq_len,groups", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("sink,recent", [(1, 1), (2, 3), (0, 0)], ids=["s1r1", "s2r3", "s0r0"])
def test_selection_invariants(seq_len, groups, sink, recent):
    cfg = LocksConfig(budget=160, sink_pages=sink, recent_pages=recent)
    kv_heads, pmax = 2, 70
    seq_lens = torch.tensor([seq_len, max(1, seq_len // 3)])
    scores = _random_scores(2, kv_heads * groups, pmax, seq_len)
    complete = torch.arange(pmax) < (seq_lens // 16).unsqueeze(1)
    scores = scores.masked_fill(~complete.unsqueeze(1), float("-inf"))
    selected = select_pages(scores, seq_lens, kv_heads, cfg)
    assert selected.shape == (2, kv_heads, cfg.budget_pages) and selected.dtype == torch.int64
    shares = group_mass_shares(scores, kv_heads)
    forced = forced_page_mask(seq_lens, pmax, cfg)
    for s in range(2):
        num_pages = -(-int(seq_lens[s]) // 16)
        for h in range(kv_heads):
            row = selected[s, h]
            pages = row[row >= 0]
            assert (row[len(pages):] == -1).all(), "padding only at the end"
            assert torch.equal(pages, pages.unique()), "sorted, no duplicates"
            assert len(pages) == min(num_pages, cfg.budget_pages), "budget used, never exceeded"
            assert (pages < num_pages).all()
            assert set(forced[s].nonzero().flatten().tolist()) <= set(pages.tolist())
            assert num_pages - 1 in pages.tolist(), "the last (possibly incomplete) page is always read"
            free = ~forced[s] & complete[s]
            chosen = torch.zeros(pmax, dtype=torch.bool)
            chosen[pages] = True
            picked = shares[s, h][chosen & free].sum()
            best = shares[s, h][free].sort(descending=True).values[: int((chosen & free).sum())].sum()
            assert torch.isclose(picked, best), "top-k by group share"


@pytest.mark.parametrize("groups", [1, 4, 7])
def test_group_shares_sum_to_one(groups):
    scores = _random_scores(3, 2 * groups, 33, groups)
    scores[1, :, 20:] = float("-inf")
    scores[2] = float("-inf")  # nothing scored yet (one incomplete page)
    shares = group_mass_shares(scores, 2)
    assert shares.shape == (3, 2, 33)
    assert torch.isfinite(shares).all()
    assert torch.allclose(shares[:2].sum(-1), torch.ones(2, 2))
    assert (shares[1, :, 20:] == 0).all() and (shares[2] == 0).all()


def test_group_shares_average_query_heads():
    scores = torch.full((1, 2, 4), float("-inf"))
    scores[0, 0, 0] = 0.0  # head 0 puts all its mass on page 0
    scores[0, 1, 3] = 0.0  # head 1 on page 3
    shares = group_mass_shares(scores, 1)
    assert torch.allclose(shares[0, 0], torch.tensor([0.5, 0.0, 0.0, 0.5]))


def test_dense_switch_reads_every_page():
    cfg = LocksConfig(budget=48, dense=True)
    seq_lens = torch.tensor([200, 5])
    selected = select_pages(_random_scores(2, 4, 13, 0), seq_lens, 2, cfg)
    assert selected.shape == (2, 2, 13)
    assert torch.equal(selected[0, 0], torch.arange(13))
    assert torch.equal(selected[1, 1], torch.tensor([0] + [-1] * 12))


def test_all_minus_inf_scores_still_select_forced_pages():
    cfg = LocksConfig(budget=48, sink_pages=1, recent_pages=1)
    scores = torch.full((1, 2, 20), float("-inf"))
    selected = select_pages(scores, torch.tensor([20 * 16 - 3]), 1, cfg)
    assert torch.equal(selected[0, 0], torch.tensor([0, 18, 19]))


@pytest.mark.parametrize("budget", [64 * 16, MAX_BUDGET])
def test_budget_past_the_block_table_reads_every_page_in_pmax_slots(budget):
    """A budget at or past the pages the block table spans reads every page, in ``Pmax`` slots (not ``budget``
    slots: the largest budget ``LocksConfig`` takes must cost what dense attention does, and allocate nothing of its
    size)."""
    seq_lens = torch.tensor([37 * 16 + 5, 12 * 16])
    scores = torch.randn(2, 4, 40)
    selected = select_pages(scores, seq_lens, num_kv_heads=2, cfg=LocksConfig(budget=budget))
    assert selected.shape == (2, 2, 40)
    pages = torch.arange(40)
    expected = torch.where(pages < torch.tensor([38, 12]).view(2, 1, 1), pages, -1).expand(2, 2, 40)
    assert torch.equal(selected, expected)


@pytest.mark.parametrize("seq_lens", [[1], [16, 17], [0, 40, 5]], ids=["one_token", "page_edge", "empty_row"])
@pytest.mark.parametrize("heads", [1, 3])
def test_every_page_lists_each_sequences_pages_in_pmax_slots(seq_lens, heads):
    selected = every_page(torch.tensor(seq_lens, dtype=torch.int32), heads, 4, 16)
    assert selected.shape == (len(seq_lens), heads, 4) and selected.dtype == torch.int64
    for row, n in enumerate(seq_lens):
        pages = -(-n // 16)
        assert torch.equal(selected[row], torch.tensor([*range(pages)] + [-1] * (4 - pages)).expand(heads, 4))


def test_reads_every_page_when_summaries_and_budget_cost_the_bytes_of_every_page():
    """``K >= n * (1 - s)``: the summaries of ``n`` pages plus ``K`` pages cost at least ``n`` pages' K+V."""
    cfg = LocksConfig(budget=48 * 16)
    assert reads_every_page(LocksConfig(budget=48, dense=True), 1000, 0.2)
    assert reads_every_page(cfg, 48, 0.0) and not reads_every_page(cfg, 49, 0.0)
    assert reads_every_page(cfg, 60, 0.2) and not reads_every_page(cfg, 61, 0.2)
    for n in range(1, 200):
        assert reads_every_page(cfg, n, 0.25) == (n * 0.25 + min(48, n) >= n)
