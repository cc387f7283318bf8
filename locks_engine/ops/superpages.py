"""The ``two-level`` selection: superpage centroids first, page summaries only inside the chosen superpages
(issue 27's design; ``samples/studies/SELECTION_COST.md``).

A *superpage* is :data:`SUPERPAGE_PAGES` consecutive logical pages of a sequence (superpage ``u`` holds pages
``[16 u, 16 u + 16)``). Its coarse summary is the fp16 mean of its keys, the mean of its pages' centroids, stored
at the physical page id of its last page (so it follows vLLM's block reuse and prefix caching as page summaries do:
a shared block sits at the same position in every sequence that shares it). A decode step:

1. scores every complete superpage, ``scale * q . mu_u`` (``superpage_scores``);
2. picks ``M = ceil(c K / 16)`` of them by the group-mean share of that estimate, and always the superpages that
   hold the forced pages (``select_pages`` at superpage granularity, ``superpage_config``);
3. scores the page summaries of the chosen superpages only, the incomplete last one included
   (``candidate_pages``, ``score.score_candidate_pages``);
4. keeps the top ``K`` of those (``select.select_candidate_pages``).

It reads ``n / 16`` centroids and ``16 M`` page summaries instead of ``n`` page summaries. ``M`` depends only on the
budget and ``c``, so every shape is static under CUDA graphs.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from locks_engine.config import LocksConfig
from locks_engine.ops.paging import physical_page_ids
from locks_engine.ops.score import score_candidate_pages
from locks_engine.ops.select import select_candidate_pages, select_pages
from locks_engine.ops.summaries import PageSummaries, summary_bytes

#: pages a superpage (the tile of the GPU score kernel, ``locks_kernels.score``)
SUPERPAGE_PAGES = 16


def allocate_superpages(num_pages: int, num_kv_heads: int, head_dim: int, device: torch.device | str) -> Tensor:
    """A zeroed store of superpage centroids, fp16 `[num_pages, H, D]`, indexed by the physical page id of each
    superpage's last page (``2 D`` bytes a page and KV head: 3.1% of bf16 K+V, of which 1/16 is used)."""
    return torch.zeros(num_pages, num_kv_heads, head_dim, dtype=torch.float16, device=device)


def completed_superpages(seq_lens: Tensor, query_lens: Tensor, block_table: Tensor, page_size: int,
                         block_size: int) -> Tensor:
    """Physical page ids `[Ns, 16]` of the pages of every superpage that this step's tokens complete, by row.

    Superpage ``u`` of a row completes now when its last page ``16 u + 15`` does, i.e. when
    ``(seq_len - query_len) // B <= 16 u + 15 < seq_len // B``.

    Args:
        seq_lens (Tensor): `[R]` tokens after the step; query_lens (Tensor): `[R]` tokens the step adds.
        block_table (Tensor): `[R, W]` physical block ids. page_size (int): B. block_size (int): tokens a block.
    Returns:
        Tensor: int64 `[Ns, 16]` on ``block_table``'s device (column 15 is where the centroid is stored).
    """
    sp = SUPERPAGE_PAGES
    first = (seq_lens.long() - query_lens.long()) // page_size // sp  # superpages complete before the step
    last = seq_lens.long() // page_size // sp  # superpages complete after it
    counts = (last - first).clamp_min(0).cpu()
    if int(counts.sum()) == 0:
        return torch.zeros(0, sp, dtype=torch.long, device=block_table.device)
    row = torch.repeat_interleave(torch.arange(len(counts)), counts)
    offsets = torch.arange(int(counts.sum())) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
    superpage = first.cpu()[row] + offsets  # [Ns]
    pages = (superpage * sp).unsqueeze(1) + torch.arange(sp)  # [Ns, 16] logical
    ppb = block_size // page_size
    blocks = block_table.cpu().long()[row.unsqueeze(1), pages // ppb]
    return (blocks * ppb + pages % ppb).to(block_table.device)


def write_superpage_centroids(superpages: Tensor, store: PageSummaries, page_ids: Tensor) -> None:
    """Write the centroid of each listed superpage, the mean of its pages' centroids, at its last page's id.

    Args:
        superpages (Tensor): fp16 `[P, H, D]` store (``allocate_superpages``), updated in place.
        store (PageSummaries): page summaries by physical page id (the listed pages' already written).
        page_ids (Tensor): int64 `[Ns, 16]` (``completed_superpages``).
    """
    if not page_ids.numel():
        return
    centroids = store.index(page_ids).dequantize_centroid()  # [Ns, 16, H, D]
    superpages[page_ids[:, -1]] = centroids.mean(dim=1).to(superpages.dtype)


def superpage_config(cfg: LocksConfig, candidates: int) -> LocksConfig:
    """``cfg`` at superpage granularity, for ``select_pages`` over superpage scores: pages of ``16 B`` tokens,
    the superpages that hold the forced pages forced (``ceil(sink_pages / 16)`` first, the last and
    ``ceil(recent_pages / 16)`` before it), and ``M = ceil(c K / 16)`` more.

    Args:
        cfg (LocksConfig): the page-level settings. candidates (int): ``c >= 1``.
    Returns:
        LocksConfig: budget ``(M + forced) * 16 B`` tokens.
    """
    sp = SUPERPAGE_PAGES
    sink, recent = -(-cfg.sink_pages // sp), -(-cfg.recent_pages // sp)
    chosen = math.ceil(candidates * cfg.budget_pages / sp)
    return LocksConfig(page_size=cfg.page_size * sp, rank=1, budget=(chosen + sink + recent + 1) * cfg.page_size * sp,
                       sink_pages=sink, recent_pages=recent)


def superpage_scores(
    q: Tensor, superpages: Tensor, block_table: Tensor, seq_lens: Tensor, page_size: int, block_size: int,
    scale: float | None = None,
) -> Tensor:
    """Estimated log mass of every superpage from its centroid alone, ``scale * q . mu_u`` (the constant
    ``log(16 B)`` left out: it does not change the ranking).

    Args:
        q (Tensor): decode queries `[S, HQ, D]`. superpages (Tensor): fp16 `[P, H, D]` store.
        block_table (Tensor): `[S, max_blocks]`. seq_lens (Tensor): `[S]` tokens.
        page_size (int): B. block_size (int): tokens a block. scale (float | None): default ``D ** -0.5``.
    Returns:
        Tensor: fp32 `[S, HQ, NSmax]`, ``NSmax = ceil(Pmax / 16)``; ``-inf`` for superpages not complete.
    """
    seqs, num_q_heads, dim = q.shape
    scale = dim**-0.5 if scale is None else scale
    ids = physical_page_ids(block_table, block_size // page_size)  # [S, Pmax]
    pmax, nsmax = ids.shape[1], -(-ids.shape[1] // SUPERPAGE_PAGES)
    last = (torch.arange(nsmax, device=ids.device) * SUPERPAGE_PAGES + SUPERPAGE_PAGES - 1).clamp_max(pmax - 1)
    heads = superpages.shape[1]
    mu = superpages.index_select(0, ids[:, last].flatten()).view(seqs, nsmax, heads, dim).float()
    qg = q.float().view(seqs, heads, num_q_heads // heads, dim)
    scores = scale * torch.einsum("shgd,suhd->shgu", qg, mu).reshape(seqs, num_q_heads, nsmax)
    whole = seq_lens.long() // page_size // SUPERPAGE_PAGES  # [S] complete superpages
    done = torch.arange(nsmax, device=ids.device).unsqueeze(0) < whole.unsqueeze(1)
    return scores.masked_fill(~done.unsqueeze(1), float("-inf"))


def candidate_pages(chosen: Tensor, seq_lens: Tensor, page_size: int) -> Tensor:
    """The pages of the chosen superpages, per KV head: int64 `[S, H, 16 M']` (``chosen`` `[S, H, M']` superpages
    ascending, ``-1`` unused), ascending, ``-1`` for unused slots and pages past the sequence (its incomplete
    last page stays: it is always read)."""
    pages = (chosen.unsqueeze(-1) * SUPERPAGE_PAGES + torch.arange(SUPERPAGE_PAGES, device=chosen.device)).flatten(2)
    num_pages = ((seq_lens.long() + page_size - 1) // page_size).view(-1, 1, 1)
    valid = (chosen >= 0).repeat_interleave(SUPERPAGE_PAGES, dim=-1) & (pages < num_pages)
    return torch.where(valid, pages, -1)


def select_two_level(
    q: Tensor,
    store: PageSummaries,
    superpages: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    num_kv_heads: int,
    cfg: LocksConfig,
    candidates: int,
    block_size: int,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Pick the pages each KV head reads this step with the two-level scan (steps 1-4 of this module's doc).

    Args:
        q (Tensor): `[S, HQ, D]`. store (PageSummaries): page summaries by physical page id.
        superpages (Tensor): fp16 `[P, H, D]` superpage centroids. block_table (Tensor): `[S, max_blocks]`.
        seq_lens (Tensor): `[S]` tokens. num_kv_heads (int): H. cfg (LocksConfig): budget, forced pages.
        candidates (int): ``c >= 1``. block_size (int): tokens a block. scale (float | None): softmax scale.
    Returns:
        tuple[Tensor, Tensor]: ``selected`` int64 `[S, H, K]` logical pages ascending (``-1`` unused), as
        ``select_pages`` returns it, and ``pages`` int64 `[S, H, C]`, the candidate pages whose summaries were
        considered (``-1`` unused).
    """
    coarse = superpage_scores(q, superpages, block_table, seq_lens, cfg.page_size, block_size, scale)
    chosen = select_pages(coarse, seq_lens, num_kv_heads, superpage_config(cfg, candidates))
    pages = candidate_pages(chosen, seq_lens, cfg.page_size)
    scores = score_candidate_pages(q, store, block_table, seq_lens, pages, cfg.page_size, block_size, scale)
    return select_candidate_pages(scores, pages, seq_lens, num_kv_heads, cfg), pages


def superpage_fraction(page_size: int) -> float:
    """Bytes of the superpage store over the bytes of bf16/fp16 K+V (per page and KV head, ``2 D`` over ``4 B D``):
    ``1 / (2 B)``, 3.1% at B = 16 (a row for every page, one in 16 used: ``allocate_superpages``)."""
    return 1.0 / (2 * page_size)


@functools.cache
def coarse_fraction(cfg: LocksConfig, head_dim: int) -> float:
    """Bytes of a superpage centroid (fp16, ``2 D``) over those of a page summary (``summary_bytes``): 0.178 for
    ``colwise8`` at r = 8, B = 16, D = 128."""
    return 2 * head_dim / summary_bytes(cfg.page_size, cfg.rank, head_dim, cfg.summary_format)[0]


def scanned_summaries(pages: Tensor, seq_lens: Tensor, page_size: int, coarse_fraction: float) -> Tensor:
    """Summary reads of a two-level step in page-summary units, summed over rows, per KV head (as the flat scan
    counts ``seq_len // B``): the complete candidate pages scored plus every complete superpage's centroid at
    ``coarse_fraction`` of a page summary (``2 D`` bytes over ``summary_bytes``).

    Args:
        pages (Tensor): `[S, H, C]` candidate pages (``select_two_level``). seq_lens (Tensor): `[S]` tokens.
        page_size (int): B. coarse_fraction (float): a superpage centroid's bytes over a page summary's.
    Returns:
        Tensor: fp32 scalar on ``pages``' device (no host sync).
    """
    complete = (seq_lens.long() // page_size).view(-1, 1, 1)
    scored = ((pages >= 0) & (pages < complete)).sum(dtype=torch.float32) / pages.shape[1]
    whole = (seq_lens.long() // page_size // SUPERPAGE_PAGES).sum(dtype=torch.float32)
    return scored + whole * coarse_fraction


def two_level_scanned(seq_lens: Tensor, page_size: int, slots: int | Tensor, coarse_fraction: float) -> Tensor:
    """``scanned_summaries`` of a two-level layer from the lengths alone (the statistics' count inside CUDA graphs,
    once a step instead of once a layer): superpage selection fills its ``slots`` with complete superpages
    wherever there are enough (all but the incomplete last one, which is forced), so each row scans
    ``16 min(whole, slots')`` pages plus the complete pages of its incomplete superpage, and ``whole`` centroids.

    Args:
        seq_lens (Tensor): `[S]` tokens. page_size (int): B.
        slots (int | Tensor): ``M``, superpages chosen per step (``superpage_config(cfg, c).budget_pages``), or
            int `[N]` on the device, one per layer (calibrated layers read theirs as data): the sum over the N layers,
            in one set of launches whatever N.
        coarse_fraction (float): as in ``scanned_summaries``.
    Returns:
        Tensor: fp32 `[]`, equal to ``scanned_summaries`` of the candidates ``select_two_level`` returns (summed
        over the layers for a tensor ``slots``).
    """
    complete = seq_lens.long() // page_size  # [S]
    whole = complete // SUPERPAGE_PAGES
    tail = complete - whole * SUPERPAGE_PAGES  # complete pages of the incomplete superpage
    # the last superpage (forced) is complete when the sequence ends on a superpage boundary: all slots complete
    last_complete = (seq_lens.long() == whole * SUPERPAGE_PAGES * page_size).long()
    layers = 1
    if isinstance(slots, Tensor):
        layers = slots.numel()
        slots = slots.long().view(-1, 1)  # [N, 1] against the rows [S]
    chosen = torch.minimum(whole, slots - 1 + last_complete)  # [S] or [N, S]
    per_layer = tail.sum(dtype=torch.float32) + whole.sum(dtype=torch.float32) * coarse_fraction
    return (chosen * SUPERPAGE_PAGES).sum(dtype=torch.float32) + per_layer * layers
