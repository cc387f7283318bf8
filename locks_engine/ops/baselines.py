"""Baseline page selectors behind the same interface as ``score_pages``: each returns estimated log masses
`[S, HQ, Pmax]` (``-inf`` for incomplete pages) that ``select_pages`` turns into a selection.

- exact-LSE oracle: the true log mass of each page; reads every key (the upper reference).
- Quest (Tang et al., ICML 2024, Section 3): per-page channel min/max, score ``sum_d max(q_d min_d, q_d max_d)``,
  an upper bound on the page's largest logit.
- shared basis: one rank-r basis per KV head for all pages, per-page centroid and coefficients.
- window: the sink page and the most recent pages (StreamingLLM-style).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from locks_engine.config import LocksConfig
from locks_engine.ops.paging import gather_pages, page_token_mask, physical_page_ids
from locks_engine.ops.quant import dequantize, quantize_symmetric
from locks_engine.ops.score import expand_kv_heads, mask_incomplete
from locks_engine.ops.summaries import PageSummaries, QuestSummaries, summary_bytes


def oracle_scores(
    q: Tensor, k_cache: Tensor, block_table: Tensor, seq_lens: Tensor, page_size: int, scale: float | None = None
) -> Tensor:
    """Exact log attention mass of every complete page, ``logsumexp_i(scale * q.k_i)`` over its real keys.

    Args:
        q (Tensor): `[S, HQ, D]`; k_cache (Tensor): `[num_blocks, block_size, H, D]`;
        block_table (Tensor): `[S, max_blocks]`; seq_lens (Tensor): `[S]` tokens; page_size (int): B.
    Returns:
        Tensor: fp32 `[S, HQ, Pmax]`, ``-inf`` for incomplete pages.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    keys = gather_pages(k_cache, block_table, page_size)  # [S, Pmax, B, H, D]
    seqs, num_q_heads, dim = q.shape
    qg = q.float().view(seqs, keys.shape[3], num_q_heads // keys.shape[3], dim)  # [S, H, G, D]
    logits = scale * torch.einsum("shgd,spbhd->shgpb", qg, keys.float()).flatten(1, 2)  # [S, HQ, Pmax, B]
    valid = page_token_mask(seq_lens, keys.shape[1], page_size).unsqueeze(1)  # [S, 1, Pmax, B]
    scores = torch.logsumexp(logits.masked_fill(~valid, float("-inf")), dim=-1)
    return mask_incomplete(scores, seq_lens, page_size)


#: keys (tokens x KV heads x D elements) ``oracle_scores_by_row`` gathers at once, in fp32: 256 MiB (16 rows of
#: 32K tokens at 2 KV heads of D 64), outside the engine's memory profile
ORACLE_GATHER_ELEMENTS = 1 << 26


def oracle_scores_by_row(
    q: Tensor, k_cache: Tensor, block_table: Tensor, seq_lens: Tensor, page_size: int, scale: float | None = None,
    max_elements: int = ORACLE_GATHER_ELEMENTS,
) -> Tensor:
    """``oracle_scores`` over the block-table columns the sequences reach, in groups of consecutive rows whose keys
    (rows x the group's longest row's blocks) fit ``max_elements``: not ``S`` times the table's width (the backend's
    ``oracle`` selection, where the table spans ``max_model_len``), and a few launches a layer instead of a handful a
    row (a row longer than the cap is a group of its own). Reads ``seq_lens`` on the host: not for CUDA graphs.

    Args:
        q (Tensor): `[S, HQ, D]`; k_cache (Tensor): `[num_blocks, block_size, H, D]`;
        block_table (Tensor): `[S, max_blocks]`; seq_lens (Tensor): `[S]` tokens; page_size (int): B.
        scale (float | None): softmax scale, default ``D ** -0.5``. max_elements (int): key elements a group
            gathers (default :data:`ORACLE_GATHER_ELEMENTS`).
    Returns:
        Tensor: fp32 `[S, HQ, Pmax]`, ``Pmax = max_blocks * block_size // B``, ``-inf`` for incomplete pages.
    """
    block_size, heads, dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    pmax = block_table.shape[1] * (block_size // page_size)
    scores = torch.full((q.shape[0], q.shape[1], pmax), float("-inf"), device=q.device)
    widths = [min(-(-tokens // block_size), block_table.shape[1]) if tokens // page_size else 0
              for tokens in seq_lens.tolist()]
    per_block = block_size * heads * dim
    start = 0
    while start < len(widths):
        end, width = start + 1, widths[start]
        while end < len(widths) and (end + 1 - start) * max(width, widths[end]) * per_block <= max_elements:
            width = max(width, widths[end])
            end += 1
        if width:
            rows = slice(start, end)
            part = oracle_scores(q[rows], k_cache, block_table[rows, :width], seq_lens[rows], page_size, scale)
            scores[rows, :, : part.shape[-1]] = part
        start = end
    return scores


def quest_scores(
    q: Tensor, store: QuestSummaries, block_table: Tensor, seq_lens: Tensor, page_size: int, block_size: int,
    scale: float | None = None,
) -> Tensor:
    """Quest's upper bound as a log mass (Tang et al., ICML 2024, Section 3, Eq. 1 per chunk): for each of a
    page's ``n`` chunks of ``B / n`` keys, ``log(B / n) + scale * sum_d max(q_d min_d, q_d max_d)``, and over the
    chunks their logsumexp (``n = 1``: ``log B`` plus the page's bound, Quest's own score).

    Args:
        q (Tensor): `[S, HQ, D]`. store (QuestSummaries): bounds by physical page id, `[num_blocks * ppb, H, n, D]`.
        block_table (Tensor): `[S, max_blocks]`; seq_lens (Tensor): `[S]` tokens.
        page_size (int): B; block_size (int): tokens per KV cache block (a multiple of B).
        scale (float | None): softmax scale, default ``D ** -0.5``.
    Returns:
        Tensor: fp32 `[S, HQ, Pmax]`, ``-inf`` for incomplete pages.
    """
    seqs, num_q_heads, dim = q.shape
    scale = dim**-0.5 if scale is None else scale
    ids = physical_page_ids(block_table, block_size // page_size).reshape(-1).long()  # [S * Pmax]
    heads, chunks = store.key_min.shape[1], store.chunks
    qg = q.float().view(seqs, heads, num_q_heads // heads, dim)  # [S, H, G, D]
    positive = qg.clamp_min(0)

    def gathered(bounds: Tensor) -> Tensor:  # [S, H, Pmax * n, D]
        return bounds.index_select(0, ids).float().view(seqs, -1, heads, chunks, dim).transpose(1, 2).flatten(2, 3)

    # sum_d max(q_d min_d, q_d max_d): the maximum where q_d > 0, the minimum where q_d < 0
    bound = (torch.matmul(positive, gathered(store.key_max).transpose(-1, -2))
             + torch.matmul(qg - positive, gathered(store.key_min).transpose(-1, -2)))  # [S, H, G, Pmax * n]
    chunk = math.log(page_size / chunks) + scale * bound.view(seqs, num_q_heads, -1, chunks)
    return mask_incomplete(torch.logsumexp(chunk, dim=-1), seq_lens, page_size)


@dataclass
class SharedBasisSummaries(PageSummaries):
    """Per-page fp16 centroid `[P, H, D]` and int8 coefficients `[P, H, B, r]` (one fp16 scale per
    direction, ``coeffs_scale`` `[P, H, 1, r]`) in one basis per KV head shared by all pages (``basis``
    is empty here; it is passed to :func:`shared_basis_scores`)."""


def fit_shared_basis(keys: Tensor, rank: int) -> Tensor:
    """One orthonormal basis per KV head: top-``rank`` eigenvectors of the within-page key covariance.

    Args:
        keys (Tensor): `[P, B, H, D]` complete pages.
    Returns:
        Tensor: fp32 `[H, r, D]`.
    """
    k = keys.double()
    centered = k - k.mean(dim=1, keepdim=True)
    cov = torch.einsum("pbhd,pbhe->hde", centered, centered)  # [H, D, D]
    _, vecs = torch.linalg.eigh(cov)
    return vecs.flip(-1)[..., :rank].transpose(-1, -2).float()


def build_shared_basis_summaries(keys: Tensor, basis: Tensor) -> SharedBasisSummaries:
    """Centroids and coefficients of pages `[P, B, H, D]` in a shared basis `[H, r, D]`."""
    k = keys.permute(0, 2, 1, 3).float()  # [P, H, B, D]
    centroid = k.mean(dim=2).to(torch.float16)
    coeffs = torch.einsum("phbd,hrd->phbr", k - centroid.float().unsqueeze(2), basis)
    coeffs_q, coeffs_scale = quantize_symmetric(coeffs, (-2,), 8)
    empty = keys.new_zeros((keys.shape[0], 0))
    return SharedBasisSummaries("shared", centroid, empty, coeffs_q, coeffs_scale=coeffs_scale)


def shared_basis_scores(
    q: Tensor, store: SharedBasisSummaries, basis: Tensor, block_table: Tensor, seq_lens: Tensor,
    page_size: int, block_size: int, scale: float | None = None,
) -> Tensor:
    """Eq. 2 of the paper with the shared basis `[H, r, D]` in place of each page's own.

    Returns:
        Tensor: fp32 `[S, HQ, Pmax]`, ``-inf`` for incomplete pages.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    ids = physical_page_ids(block_table, block_size // page_size)
    centroid = expand_kv_heads(store.centroid[ids].float(), q.shape[1], 2)  # [S, Pmax, HQ, D]
    coeffs = expand_kv_heads(dequantize(store.coeffs[ids], store.coeffs_scale[ids]), q.shape[1], 2)
    q_v = torch.einsum("shd,hrd->shr", q.float(), expand_kv_heads(basis.float(), q.shape[1], 0))
    logits = torch.einsum("shd,sphd->sph", q.float(), centroid).unsqueeze(-1)
    logits = scale * (logits + torch.einsum("shr,sphbr->sphb", q_v, coeffs))  # [S, Pmax, HQ, B]
    return mask_incomplete(torch.logsumexp(logits, dim=-1).transpose(1, 2), seq_lens, page_size)


def shared_rank_at_equal_bytes(cfg: LocksConfig, head_dim: int, num_pages: int) -> int:
    """Largest shared-basis rank whose bytes per page and KV head, the fp16 shared basis amortized over
    ``num_pages`` pages included, do not exceed LOCKS's per-page summary bytes in ``cfg``'s format.

    Both sides are measured from allocated tensors.
    """
    target, _ = summary_bytes(cfg.page_size, cfg.rank, head_dim, cfg.summary_format)
    best = 1
    for rank in range(1, head_dim + 1):
        keys = torch.zeros(1, cfg.page_size, 1, head_dim)
        page = build_shared_basis_summaries(keys, torch.zeros(1, rank, head_dim)).nbytes
        basis = rank * head_dim * 2 / num_pages
        if page + basis > target:
            break
        best = rank
    return best


def window_scores(seq_lens: Tensor, num_q_heads: int, pmax: int, page_size: int) -> Tensor:
    """Recency as a log mass, ``log(1 + j)`` for page ``j``: with the forced sink page, ``select_pages``
    then reads the sink and the most recent pages (a sliding window). fp32 `[S, HQ, Pmax]`."""
    pages = torch.arange(pmax, device=seq_lens.device, dtype=torch.float32)
    scores = torch.log1p(pages).expand(seq_lens.shape[0], num_q_heads, pmax)
    return mask_incomplete(scores, seq_lens, page_size)
