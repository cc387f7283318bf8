"""Stage 3: group-shared page selection under a token budget (paper Section 3.3)."""

from __future__ import annotations

import torch
from torch import Tensor

from locks_engine.config import LocksConfig


def group_mass_shares(scores: Tensor, num_kv_heads: int) -> Tensor:
    """Per KV head, the mean over its query heads of each page's share of the estimated attention mass.

    Args:
        scores (Tensor): estimated log mass of shape `[S, HQ, Pmax]`, ``-inf`` for pages without a score.
        num_kv_heads (int): H; ``HQ`` must be a multiple of it.
    Returns:
        Tensor: fp32 `[S, H, Pmax]`; each row sums to 1 over scored pages, or is all zeros when no page
        is scored (never NaN).
    """
    seqs, num_q_heads, pmax = scores.shape
    assert num_q_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    scores = scores.float()
    top = scores.amax(dim=-1, keepdim=True)
    finite_top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = torch.exp(scores - finite_top)  # exp(-inf) = 0
    total = weights.sum(dim=-1, keepdim=True)
    shares = torch.where(total > 0, weights / total.clamp_min(torch.finfo(torch.float32).tiny), weights)
    return shares.view(seqs, num_kv_heads, num_q_heads // num_kv_heads, pmax).mean(dim=2)


def forced_page_mask(seq_lens: Tensor, pmax: int, cfg: LocksConfig) -> Tensor:
    """bool `[S, Pmax]`: pages always read: the first ``sink_pages``, the last page (it holds the current
    token, complete or not) and the ``recent_pages`` pages before it."""
    pages = torch.arange(pmax, device=seq_lens.device).unsqueeze(0)
    seq_lens = seq_lens.long().unsqueeze(1)
    num_pages = (seq_lens + cfg.page_size - 1) // cfg.page_size
    sink = pages < cfg.sink_pages
    recent = pages >= num_pages - 1 - cfg.recent_pages
    return (sink | recent) & (pages < num_pages)


def select_pages(scores: Tensor, seq_lens: Tensor, num_kv_heads: int, cfg: LocksConfig) -> Tensor:
    """Pick the pages each KV head reads this step (paper Section 3.3).

    Mass shares are averaged over the query heads of a KV group (GQA), the forced pages (sink, last,
    recent) are taken first and the rest of the ``K = cfg.budget_pages`` slots go to the pages with
    the largest group share. A sequence with at most ``K`` pages reads all of them (dense). With
    ``cfg.dense`` every page is read: the output then has ``Pmax`` slots.

    Args:
        scores (Tensor): estimated log mass `[S, HQ, Pmax]` (``score_pages`` or a baseline selector).
        seq_lens (Tensor): `[S]` tokens.
        num_kv_heads (int): H.
        cfg (LocksConfig): budget, page size, sink and recent pages.
    Returns:
        Tensor: int64 `[S, H, K]` logical page indices in ascending order, ``-1`` in unused slots; no page
        twice; ``K = min(cfg.budget_pages, Pmax)`` (``Pmax`` when ``cfg.dense``), so a budget past the
        context costs what dense attention does.
    """
    seqs, _, pmax = scores.shape
    pages = torch.arange(pmax, device=scores.device)
    num_pages = (seq_lens.long() + cfg.page_size - 1) // cfg.page_size  # [S]
    exists = (pages.unsqueeze(0) < num_pages.unsqueeze(1)).unsqueeze(1)  # [S, 1, Pmax]
    covers = cfg.dense or cfg.budget_pages >= pmax  # every page fits the budget: no ranking
    slots = pmax if covers else cfg.budget_pages
    if covers:
        chosen = exists.expand(seqs, num_kv_heads, pmax)
    else:
        priority = group_mass_shares(scores, num_kv_heads)  # [S, H, Pmax], in [0, 1]
        priority = priority.masked_fill(forced_page_mask(seq_lens, pmax, cfg).unsqueeze(1), 2.0)
        priority = priority.masked_fill(~exists, -1.0)
        top = priority.topk(slots, dim=-1).indices
        chosen = torch.zeros(seqs, num_kv_heads, pmax, dtype=torch.bool, device=scores.device)
        chosen.scatter_(-1, top, True)
        chosen &= exists
    index = torch.where(chosen, pages, pmax)  # unchosen sort last
    selected = index.sort(dim=-1).values[..., :slots]
    if selected.shape[-1] < slots:
        pad = torch.full((seqs, num_kv_heads, slots - selected.shape[-1]), pmax, device=scores.device)
        selected = torch.cat((selected, pad), dim=-1)
    return torch.where(selected >= pmax, -1, selected)
