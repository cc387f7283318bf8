"""Stage 2: estimated log attention mass of every page, from summaries only (paper Section 3.2, Eq. 2)."""

from __future__ import annotations

import torch
from torch import Tensor

from locks_engine.ops.paging import complete_page_mask, physical_page_ids
from locks_engine.ops.quant import log2_scale, unpack_int4
from locks_engine.ops.summaries import PageSummaries


def expand_kv_heads(x: Tensor, num_q_heads: int, dim: int) -> Tensor:
    """Repeat the KV-head dim ``dim`` of ``x`` (size ``H``) to ``HQ`` query heads (head ``h`` reads ``h // G``)."""
    return x.repeat_interleave(num_q_heads // x.shape[dim], dim=dim)


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
    pages = store.index(ids)
    centroid, coeffs = pages.dequantize_centroid(), pages.dequantize_coeffs()  # [S,Pmax,H,D] [S,Pmax,H,B,r]
    heads = centroid.shape[2]
    qg = q.float().view(seqs, heads, num_q_heads // heads, dim)  # [S, H, G, D]
    q_mu = torch.einsum("shgd,sphd->sphg", qg, centroid)  # [S, Pmax, H, G]
    if pages.summary_format == "chanlog":
        # the per-channel scale folded into the query: V q = U_int (s * q), as the kernel computes it (and
        # G < r, so the scaled queries are a smaller tensor than a dequantized basis)
        q_s = qg.unsqueeze(1) * log2_scale(pages.basis_scale)  # [S, Pmax, H, G, D]
        q_v = torch.einsum("sphgd,sphrd->sphgr", q_s, unpack_int4(pages.basis).float())  # [S, Pmax, H, G, r]
    elif pages.summary_format in ("colwise", "colwise8"):
        # one scale per direction, applied to the products: the basis is never dequantized
        basis = pages.basis if pages.summary_format == "colwise8" else unpack_int4(pages.basis)
        q_v = torch.einsum("shgd,sphrd->sphgr", qg, basis.float())  # [S, Pmax, H, G, r]
        q_v = q_v * pages.basis_scale.float().squeeze(-1).unsqueeze(-2)
    else:
        q_v = torch.einsum("shgd,sphrd->sphgr", qg, pages.dequantize_basis())  # [S, Pmax, H, G, r]
    logits = scale * (q_mu.unsqueeze(-1) + torch.einsum("sphgr,sphbr->sphgb", q_v, coeffs))  # [S, Pmax, H, G, B]
    scores = torch.logsumexp(logits, dim=-1).flatten(2).transpose(1, 2)  # [S, HQ, Pmax]
    return mask_incomplete(scores, seq_lens, page_size)
