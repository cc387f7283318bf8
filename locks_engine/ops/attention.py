"""Stage 4: exact softmax attention over the selected pages of a paged KV cache, and the dense reference."""

from __future__ import annotations

import torch
from torch import Tensor

from locks_engine.ops.paging import gather_pages, gather_selected_tokens, page_token_mask


def _attend(q: Tensor, keys: Tensor, values: Tensor, valid: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """Grouped softmax attention in fp32.

    Args:
        q (Tensor): `[S, HQ, D]`; keys, values (Tensor): `[S, H, T, D]`; valid (Tensor): bool `[S, H, T]`.
    Returns:
        tuple: ``out`` `[S, HQ, D]` fp32 and ``lse`` `[S, HQ]` fp32 (natural log of the sum of
        ``exp(scale * q.k)`` over valid keys); rows without a valid key give ``out = 0``, ``lse = -inf``.
    """
    seqs, num_q_heads, dim = q.shape
    heads = keys.shape[1]
    qg = q.float().view(seqs, heads, num_q_heads // heads, dim)  # [S, H, G, D]
    logits = scale * torch.einsum("shgd,shtd->shgt", qg, keys.float())
    logits = logits.masked_fill(~valid.unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # [S, H, G]
    finite = torch.isfinite(lse)
    probs = torch.exp(logits - torch.where(finite, lse, torch.zeros_like(lse)).unsqueeze(-1))
    out = torch.einsum("shgt,shtd->shgd", probs, values.float())
    return out.reshape(seqs, num_q_heads, -1), lse.reshape(seqs, num_q_heads)


def sparse_paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    selected: Tensor,
    page_size: int,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Decode attention over the selected pages only, exact softmax over what is read (paper Section 3.4).

    Reads the K and V of the selected pages and nothing else; a KV page is read once per GQA group.

    Args:
        q (Tensor): decode queries `[S, HQ, D]` (the token at position ``seq_len - 1``).
        k_cache, v_cache (Tensor): `[num_blocks, block_size, H, D]`, any strides.
        block_table (Tensor): `[S, max_blocks]`; seq_lens (Tensor): `[S]` tokens, including the query's own.
        selected (Tensor): logical page indices `[S, H, K]`, ``-1`` for unused slots (``select_pages``).
        page_size (int): B. scale (float | None): softmax scale, default ``D ** -0.5``.
    Returns:
        tuple: ``out`` `[S, HQ, D]` in ``q.dtype`` and ``lse`` `[S, HQ]` fp32 over the keys read;
        a row that reads no key gives zeros and ``-inf`` (never NaN).
    Raises:
        ValueError: when ``B`` does not divide the block size.
    """
    keys = gather_selected_tokens(k_cache, block_table, selected, page_size)  # [S, H, K*B, D]
    values = gather_selected_tokens(v_cache, block_table, selected, page_size)
    return attend_selected_pages(q, keys, values, selected, seq_lens, page_size, scale)


def attend_selected_pages(
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    selected: Tensor,
    seq_lens: Tensor,
    page_size: int,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """The attention step of :func:`sparse_paged_attention` on K and V already gathered (for caches that no
    strided view describes, such as vLLM's CPU ``amx`` layout: ``vllm_backend.compat.read_cpu_pages``).

    Args:
        q (Tensor): `[S, HQ, D]`; keys, values (Tensor): `[S, H, K*B, D]`, the tokens of ``selected`` in order.
        selected (Tensor): `[S, H, K]` logical pages, ``-1`` unused; seq_lens (Tensor): `[S]` tokens.
    Returns:
        tuple: as :func:`sparse_paged_attention`.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    positions = selected.unsqueeze(-1) * page_size + torch.arange(page_size, device=q.device)  # [S, H, K, B]
    valid = (selected.unsqueeze(-1) >= 0) & (positions < seq_lens.view(-1, 1, 1, 1))
    out, lse = _attend(q, keys, values, valid.flatten(2), scale)
    return out.to(q.dtype), lse


def dense_paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    page_size: int = 16,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Reference decode attention over every token of each sequence (reads the whole KV cache of it).

    Args and returns as :func:`sparse_paged_attention`, without ``selected``; ``page_size`` only sets how
    blocks are walked and does not change the result.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    seqs = q.shape[0]
    keys = gather_pages(k_cache, block_table, page_size)  # [S, Pmax, B, H, D]
    values = gather_pages(v_cache, block_table, page_size)
    valid = page_token_mask(seq_lens, keys.shape[1], page_size).flatten(1)  # [S, Pmax*B]
    heads, dim = keys.shape[3], keys.shape[4]
    keys = keys.reshape(seqs, -1, heads, dim).transpose(1, 2)  # [S, H, T, D]
    values = values.reshape(seqs, -1, heads, dim).transpose(1, 2)
    out, lse = _attend(q, keys, values, valid.unsqueeze(1).expand(-1, heads, -1), scale)
    return out.to(q.dtype), lse
