"""Stage 3: group-shared page selection under a token budget (paper Section 3.3)."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from locks_engine.config import LocksConfig
from locks_engine.ops.summaries import summary_bytes


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


def reads_every_page(cfg: LocksConfig, num_pages: int, summary_fraction: float) -> bool:
    """Whether a decode step reads every page, unscored: the one place this is decided, for both devices.

    True for ``cfg.dense``, or when scoring would cost at least the bytes of reading every page: the summaries
    of ``n`` pages plus ``K`` selected pages against the K+V of all ``n``, ``n * s + K * p >= n * p``
    (``s / p = summary_fraction``), i.e. ``K >= n * (1 - summary_fraction)``. A budget of at least ``n`` pages
    is always such a case. Exact attention then reads no more bytes than LOCKS would.

    Args:
        cfg (LocksConfig): the budget ``K = cfg.budget_pages`` and the dense switch.
        num_pages (int): ``n``: on the CPU path the pages of the longest sequence of the step (its partial last
            page included); on CUDA ``Pmax``, the pages the block table spans (static, so CUDA graphs stay valid).
        summary_fraction (float): bytes of a page's summary over the bytes of its K+V (one KV head), in
            ``[0, 1)``; 0 asks only whether the budget covers every page.
    Returns:
        bool: read every page (``every_page``) instead of scoring and selecting.
    """
    return cfg.dense or cfg.budget_pages >= num_pages * (1.0 - summary_fraction)


@functools.cache
def summary_fraction(cfg: LocksConfig, head_dim: int, kv_dtype: torch.dtype) -> float:
    """Bytes of a page's summary over the bytes of its K+V, one KV head (``summary_bytes``; 0.176 for
    ``colwise8`` at r = 8, B = 16, D = 128, bf16): the ``summary_fraction`` of ``reads_every_page``."""
    summary, kv = summary_bytes(cfg.page_size, cfg.rank, head_dim, cfg.summary_format, kv_dtype)
    return summary / kv


def every_page(seq_lens: Tensor, num_kv_heads: int, pmax: int, page_size: int) -> Tensor:
    """The selection that reads every page of every sequence (plain torch, no host sync: CUDA-graph safe).

    Args:
        seq_lens (Tensor): `[S]` tokens.
        num_kv_heads (int): H.
        pmax (int): pages the block table spans (slots of the output).
        page_size (int): B.
    Returns:
        Tensor: int64 `[S, H, Pmax]` logical pages in ascending order, ``-1`` past each sequence's last page.
    """
    pages = torch.arange(pmax, device=seq_lens.device)
    num_pages = (seq_lens.long() + page_size - 1) // page_size  # [S]
    selected = torch.where(pages < num_pages.unsqueeze(1), pages, -1)  # [S, Pmax]
    return selected.unsqueeze(1).expand(-1, num_kv_heads, -1).contiguous()


def select_pages(scores: Tensor, seq_lens: Tensor, num_kv_heads: int, cfg: LocksConfig) -> Tensor:
    """Pick the pages each KV head reads this step (paper Section 3.3).

    Mass shares are averaged over the query heads of a KV group (GQA), the forced pages (sink, last,
    recent) are taken first and the rest of the ``K = cfg.budget_pages`` slots go to the pages with
    the largest group share. A sequence with at most ``K`` pages reads all of them (dense). With
    ``cfg.dense``, or a budget of at least ``Pmax`` pages (``reads_every_page`` with free summaries), every page
    is read, unranked (``every_page``): the output then has ``Pmax`` slots.

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
    if reads_every_page(cfg, pmax, 0.0):
        return every_page(seq_lens, num_kv_heads, pmax, cfg.page_size)
    slots = cfg.budget_pages
    pages = torch.arange(pmax, device=scores.device)
    num_pages = (seq_lens.long() + cfg.page_size - 1) // cfg.page_size  # [S]
    exists = (pages.unsqueeze(0) < num_pages.unsqueeze(1)).unsqueeze(1)  # [S, 1, Pmax]
    priority = group_mass_shares(scores, num_kv_heads)  # [S, H, Pmax], in [0, 1]
    priority = priority.masked_fill(forced_page_mask(seq_lens, pmax, cfg).unsqueeze(1), 2.0)
    priority = priority.masked_fill(~exists, -1.0)
    top = priority.topk(slots, dim=-1).indices
    chosen = torch.zeros(seqs, num_kv_heads, pmax, dtype=torch.bool, device=scores.device)
    chosen.scatter_(-1, top, True)
    chosen &= exists
    index = torch.where(chosen, pages, pmax)  # unchosen sort last
    selected = index.sort(dim=-1).values[..., :slots]
    return torch.where(selected >= pmax, -1, selected)


def select_candidate_pages(
    scores: Tensor, pages: Tensor, seq_lens: Tensor, num_kv_heads: int, cfg: LocksConfig
) -> Tensor:
    """``select_pages`` over a list of candidate pages per KV head (the ``two-level`` selection's second stage):
    the same priority (group-mean mass share, here over the candidates' scores; 2.0 for the forced pages),
    the top ``K`` candidates kept, ties towards the lower slot.

    Args:
        scores (Tensor): `[S, HQ, C]` estimated log mass of slot ``i`` (``score_candidate_pages``).
        pages (Tensor): int64 `[S, H, C]` logical page of each slot, ascending along ``C`` and no page twice,
            ``-1`` in unused slots; the forced pages must be among them (``ops.superpages.candidate_pages``).
        seq_lens (Tensor): `[S]` tokens. num_kv_heads (int): H. cfg (LocksConfig): budget, sink and recent pages.
    Returns:
        Tensor: int64 `[S, H, min(K, C)]` logical pages ascending, ``-1`` in unused slots.
    """
    seqs, _, slots_in = scores.shape
    slots = min(cfg.budget_pages, slots_in)
    num_pages = ((seq_lens.long() + cfg.page_size - 1) // cfg.page_size).view(-1, 1, 1)  # [S, 1, 1]
    exists = (pages >= 0) & (pages < num_pages)
    forced = exists & ((pages < cfg.sink_pages) | (pages >= num_pages - 1 - cfg.recent_pages))
    priority = group_mass_shares(scores, num_kv_heads).masked_fill(forced, 2.0).masked_fill(~exists, -1.0)
    # topk over (priority, lower slot first): a stable descending sort keeps ties in slot order
    top = priority.sort(dim=-1, descending=True, stable=True).indices[..., :slots]
    taken = torch.gather(priority, -1, top) >= 0
    chosen = torch.where(taken, torch.gather(pages, -1, top), pages.new_full((), torch.iinfo(torch.int64).max))
    chosen = chosen.sort(dim=-1).values
    return torch.where(chosen == torch.iinfo(torch.int64).max, -1, chosen)
