"""Addressing pages in a vLLM-style paged KV cache (layout in ``locks_engine.ops``)."""

from __future__ import annotations

import torch
from torch import Tensor


def pages_per_block(cache: Tensor, page_size: int) -> int:
    """``ppb = block_size // B`` for a cache of shape ``[num_blocks, block_size, H, D]``.

    Raises:
        ValueError: when ``B`` does not divide the block size.
    """
    block_size = cache.shape[1]
    if block_size % page_size:
        raise ValueError(f"page_size={page_size} must divide the KV cache block size {block_size}")
    return block_size // page_size


def physical_page_ids(block_table: Tensor, ppb: int) -> Tensor:
    """Physical page id of every logical page a block table addresses.

    Args:
        block_table (Tensor): physical block ids of shape `[S, max_blocks]`.
        ppb (int): pages per block.
    Returns:
        Tensor: int64 of shape `[S, Pmax]`, ``Pmax = max_blocks * ppb``; page ``j`` maps to
        ``block_table[:, j // ppb] * ppb + j % ppb``.
    """
    blocks = block_table.long().unsqueeze(-1) * ppb  # [S, max_blocks, 1]
    offsets = torch.arange(ppb, device=block_table.device)
    return (blocks + offsets).flatten(1)


def page_token_mask(seq_lens: Tensor, num_pages: int, page_size: int) -> Tensor:
    """Which token slots of each logical page hold a token of the sequence.

    Args:
        seq_lens (Tensor): tokens per sequence, shape `[S]`.
    Returns:
        Tensor: bool of shape `[S, num_pages, B]`.
    """
    positions = torch.arange(num_pages * page_size, device=seq_lens.device).view(num_pages, page_size)
    return positions.unsqueeze(0) < seq_lens.long().view(-1, 1, 1)


def complete_page_mask(seq_lens: Tensor, num_pages: int, page_size: int) -> Tensor:
    """bool `[S, num_pages]`: page ``j`` is complete (``j < seq_len // B``) and so has a summary."""
    pages = torch.arange(num_pages, device=seq_lens.device)
    return pages.unsqueeze(0) < (seq_lens.long() // page_size).unsqueeze(1)


def gather_pages(cache: Tensor, block_table: Tensor, page_size: int) -> Tensor:
    """Token contents of every logical page of every sequence.

    Args:
        cache (Tensor): K or V cache of shape `[num_blocks, block_size, H, D]`.
        block_table (Tensor): shape `[S, max_blocks]`.
        page_size (int): B.
    Returns:
        Tensor: shape `[S, Pmax, B, H, D]` (a copy), slots past a sequence's end hold whatever the cache holds.
    Raises:
        ValueError: when ``B`` does not divide the block size.
    """
    ppb = pages_per_block(cache, page_size)
    blocks = cache[block_table.long()]  # [S, max_blocks, block_size, H, D]
    seqs, max_blocks, _, heads, dim = blocks.shape
    return blocks.reshape(seqs, max_blocks * ppb, page_size, heads, dim)


def page_rows(cache: Tensor, page_size: int) -> Tensor | None:
    """The cache as `[num_blocks * H, ppb, B, D]`, one row per (block, KV head) and one entry per page in the
    block, a view without copying; ``None`` unless the block stride is ``H`` head strides and the head dim is
    contiguous (then pages are gathered token by token, which is faster for a transposed K).

    vLLM's CPU cache (per block and head: K transposed `[D, block_size]`, then V `[block_size, D]`) qualifies
    for V, FLASH_ATTN's HND cache for both; NHD (`[num_blocks, block_size, H, D]`) for neither.
    """
    num_blocks, block_size, heads, dim = cache.shape
    s_block, s_token, s_head, s_dim = cache.stride()
    if s_block != heads * s_head or s_dim != 1:
        return None
    ppb = block_size // page_size
    return cache.as_strided(
        (num_blocks * heads, ppb, page_size, dim), (s_head, page_size * s_token, s_token, s_dim)
    )


def gather_selected_tokens(
    cache: Tensor, block_table: Tensor, selected: Tensor, page_size: int
) -> Tensor:
    """Token contents of the selected pages, per KV head, reading nothing else.

    Args:
        cache (Tensor): K or V cache of shape `[num_blocks, block_size, H, D]`.
        block_table (Tensor): shape `[S, max_blocks]`.
        selected (Tensor): logical page indices of shape `[S, H, K]`, ``-1`` for padding (reads page 0).
        page_size (int): B.
    Returns:
        Tensor: shape `[S, H, K * B, D]`.
    """
    ppb = pages_per_block(cache, page_size)
    blocks, in_block = selected_blocks(block_table, selected, ppb)  # [S, H, K]
    heads = torch.arange(cache.shape[2], device=cache.device).view(1, -1, 1)
    rows = page_rows(cache, page_size)
    if rows is not None:
        # one B x D copy per selected page (on the CPU about twice as fast as indexing token by token)
        return rows[blocks * cache.shape[2] + heads, in_block].flatten(2, 3)  # [S, H, K*B, D]
    tokens = (in_block * page_size).unsqueeze(-1) + torch.arange(page_size, device=cache.device)  # [S, H, K, B]
    return cache[blocks.unsqueeze(-1), tokens, heads.unsqueeze(-1)].flatten(2, 3)  # [S, H, K*B, D]


def selected_blocks(block_table: Tensor, selected: Tensor, ppb: int) -> tuple[Tensor, Tensor]:
    """Where the selected pages are: ``(blocks, pages_in_block)``, int64 `[S, H, K]` physical block ids and
    page indices inside the block (``selected`` `[S, H, K]` logical pages; ``-1`` reads page 0)."""
    pages = selected.clamp_min(0).long()
    blocks = torch.gather(block_table.long(), 1, (pages // ppb).flatten(1)).view_as(pages)
    return blocks, pages % ppb
