"""Stage 2: estimated log attention mass of every page, from summaries only (paper Section 3.2, Eq. 2)."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from locks_engine.ops.paging import complete_page_mask, physical_page_ids, selected_blocks
from locks_engine.ops.quant import log2_scale, unpack_int4
from locks_engine.ops.summaries import PageSummaries


def expand_kv_heads(x: Tensor, num_q_heads: int, dim: int) -> Tensor:
    """Repeat the KV-head dim ``dim`` of ``x`` (size ``H``) to ``HQ`` query heads (head ``h`` reads ``h // G``)."""
    return x.repeat_interleave(num_q_heads // x.shape[dim], dim=dim)


def _gather_head_major(store: PageSummaries, ids: Tensor) -> PageSummaries:
    """The summaries of pages ``ids`` (`[S, Pmax]`, the same pages for every KV head, or `[S, H, C]`, per KV head)
    with every tensor laid out `[S, H, Pmax or C, ...]` (contiguous; ``store`` tensors `[P, H, ...]`): rows of
    (page, KV head) pairs taken in head-major order, one copy each."""
    heads = store.centroid.shape[1]
    if ids.dim() == 2:
        ids = ids.unsqueeze(1)
    seqs, pmax = ids.shape[0], ids.shape[-1]
    rows = (ids.long() * heads + torch.arange(heads, device=ids.device).view(1, -1, 1)).flatten()
    return replace(store, **{
        k: v.flatten(0, 1).index_select(0, rows).view(seqs, heads, pmax, *v.shape[2:])
        for k, v in store.tensors().items()
    })


def _score_gathered(q: Tensor, pages: PageSummaries, scale: float) -> Tensor:
    """Unmasked scores `[S, HQ, C]` (head ``h * G + g``) of summaries gathered head-major (``pages`` tensors
    `[S, H, C, ...]`, ``_gather_head_major``), any summary format."""
    seqs, num_q_heads, dim = q.shape
    heads, pmax, rank = pages.centroid.shape[1], pages.centroid.shape[2], pages.coeffs.shape[-1]
    qg = q.float().view(seqs, heads, num_q_heads // heads, dim)  # [S, H, G, D]
    q_mu = torch.matmul(qg, pages.dequantize_centroid().transpose(-1, -2))  # [S, H, G, C]
    if pages.summary_format in ("colwise", "colwise8"):
        # one scale per direction, applied to the products: the basis is never dequantized; the coefficients'
        # per-direction scale goes on the same products (exact: both scale direction k of the sum over k)
        basis = (pages.basis if pages.summary_format == "colwise8" else unpack_int4(pages.basis)).float()
        direction_scale = pages.basis_scale.float().squeeze(-1) * pages.coeffs_scale.float().squeeze(-2)
        coeffs = pages.coeffs.float()  # [S, H, C, B, r]
    else:
        basis, direction_scale, coeffs = pages.dequantize_basis(), None, pages.dequantize_coeffs()
    q_v = torch.matmul(qg, basis.reshape(seqs, heads, pmax * rank, dim).transpose(-1, -2))  # [S, H, G, C*r]
    q_v = q_v.view(seqs, heads, -1, pmax, rank).transpose(2, 3)  # [S, H, C, G, r]
    if direction_scale is not None:
        q_v = q_v * direction_scale.unsqueeze(-2)  # [S, H, C, 1, r]
    # (V q) . c_i for the B keys of each page, a sum of r rank-one terms: on the CPU faster than a batched
    # product of [G, r] x [r, B] matrices, one per page
    coeffs = coeffs.transpose(-1, -2)  # [S, H, C, r, B]
    logits = q_mu.transpose(2, 3).unsqueeze(-1) + q_v[..., 0:1] * coeffs[..., 0:1, :]  # [S, H, C, G, B]
    for k in range(1, rank):
        logits.addcmul_(q_v[..., k : k + 1], coeffs[..., k : k + 1, :])
    scores = torch.logsumexp(logits.mul_(scale), dim=-1)  # [S, H, C, G]
    return scores.transpose(2, 3).reshape(seqs, num_q_heads, pmax)  # [S, HQ, C], head h*G+g


def _chanlog_scores(q: Tensor, pages: PageSummaries, scale: float) -> Tensor:
    """Unmasked scores `[S, HQ, Pmax]` of ``chanlog`` summaries gathered per page (``pages`` `[S, Pmax, ...]`):
    the per-channel scale folded into the query, ``V q = U_int (s * q)``, as the GPU kernel computes it (and
    G < r, so the scaled queries are a smaller tensor than a dequantized basis)."""
    seqs, num_q_heads, dim = q.shape
    centroid, coeffs = pages.dequantize_centroid(), pages.dequantize_coeffs()  # [S,Pmax,H,D] [S,Pmax,H,B,r]
    heads = centroid.shape[2]
    qg = q.float().view(seqs, heads, num_q_heads // heads, dim)  # [S, H, G, D]
    q_mu = torch.einsum("shgd,sphd->sphg", qg, centroid)  # [S, Pmax, H, G]
    q_s = qg.unsqueeze(1) * log2_scale(pages.basis_scale)  # [S, Pmax, H, G, D]
    q_v = torch.einsum("sphgd,sphrd->sphgr", q_s, unpack_int4(pages.basis).float())  # [S, Pmax, H, G, r]
    logits = scale * (q_mu.unsqueeze(-1) + torch.einsum("sphgr,sphbr->sphgb", q_v, coeffs))  # [S, Pmax, H, G, B]
    return torch.logsumexp(logits, dim=-1).flatten(2).transpose(1, 2)


def mask_incomplete(scores: Tensor, seq_lens: Tensor, page_size: int) -> Tensor:
    """Set the scores `[S, HQ, Pmax]` of pages that are not complete to ``-inf``."""
    complete = complete_page_mask(seq_lens, scores.shape[-1], page_size)  # [S, Pmax]
    return scores.masked_fill(~complete.unsqueeze(1), float("-inf"))


def score_pages(
    q: Tensor,
    store: PageSummaries,
    block_table: Tensor,
    seq_lens: Tensor,
    page_size: int,
    block_size: int,
    scale: float | None = None,
) -> Tensor:
    """Estimated log attention mass of each page, reading only its summary.

    ``s_j(q) = logsumexp_{i in page j} (scale * (q . mu_j + (V_j q) . c_i))`` (paper Eq. 2): the log of the
    page's unnormalized softmax mass if each key were its reconstruction ``mu_j + V_j^T c_i``.

    Args:
        q (Tensor): decode queries of shape `[S, HQ, D]`.
        store (PageSummaries): summaries by physical page id, tensors `[num_blocks * ppb, H, ...]`.
        block_table (Tensor): `[S, max_blocks]` physical block ids.
        seq_lens (Tensor): `[S]` tokens.
        page_size (int): B; block_size (int): tokens per KV cache block (a multiple of B).
        scale (float | None): softmax scale, default ``D ** -0.5``.
    Returns:
        Tensor: fp32 of shape `[S, HQ, Pmax]`, ``Pmax = max_blocks * block_size // B``; ``-inf`` for pages
        that are not complete (no summary yet) or past the sequence.
    """
    seqs, num_q_heads, dim = q.shape
    scale = dim**-0.5 if scale is None else scale
    ids = physical_page_ids(block_table, block_size // page_size)  # [S, Pmax]
    if store.summary_format == "chanlog":
        return mask_incomplete(_chanlog_scores(q, store.index(ids), scale), seq_lens, page_size)
    # gathered per (KV head, page), head-major, so that each product below is one batched matrix product over
    # contiguous rows (on the CPU, permuting copies of the basis cost more than the products)
    scores = _score_gathered(q, _gather_head_major(store, ids), scale)
    return mask_incomplete(scores, seq_lens, page_size)


def score_candidate_pages(
    q: Tensor,
    store: PageSummaries,
    block_table: Tensor,
    seq_lens: Tensor,
    pages: Tensor,
    page_size: int,
    block_size: int,
    scale: float | None = None,
) -> Tensor:
    """``score_pages`` for a list of candidate pages per KV head instead of every page (the second level of the
    ``two-level`` selection, ``ops/superpages.py``): reads the summaries of the listed pages only.

    Args:
        q (Tensor): decode queries `[S, HQ, D]`.
        store (PageSummaries): summaries by physical page id, tensors `[num_blocks * ppb, H, ...]`, any format.
        block_table (Tensor): `[S, max_blocks]` physical block ids. seq_lens (Tensor): `[S]` tokens.
        pages (Tensor): int64 `[S, H, C]` logical pages to score per KV head, ``-1`` in unused slots.
        page_size (int): B; block_size (int): tokens per KV cache block (a multiple of B).
        scale (float | None): softmax scale, default ``D ** -0.5``.
    Returns:
        Tensor: fp32 `[S, HQ, C]`: slot ``i`` of query head ``h`` scores page ``pages[s, h // G, i]``; ``-inf``
        for unused slots and pages that are not complete.
    """
    seqs, num_q_heads, dim = q.shape
    scale = dim**-0.5 if scale is None else scale
    blocks, in_block = selected_blocks(block_table, pages, block_size // page_size)  # [S, H, C]
    scores = _score_gathered(q, _gather_head_major(store, blocks * (block_size // page_size) + in_block), scale)
    complete = (pages >= 0) & (pages < (seq_lens.long() // page_size).view(-1, 1, 1))  # [S, H, C]
    complete = complete.repeat_interleave(num_q_heads // pages.shape[1], dim=1)
    return scores.masked_fill(~complete, float("-inf"))
