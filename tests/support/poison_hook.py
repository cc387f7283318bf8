"""Sparsity proof for tests, as a LOCKS decode hook: poison every KV page that no head selected, attend, then
restore.

Configured with ``additional_config={"locks_hooks": ["tests.support.poison_hook:PoisonUnselected"]}`` (vLLM's worker
processes must import ``tests``: put the repository root on ``PYTHONPATH``). If the decode path read a page it
did not select, its output would turn NaN; with the hook, the generated tokens must equal those of the same
engine without it. Costs a copy of the poisoned pages each layer and step, on the host: tests only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


class PoisonUnselected:
    """Decode hook (``locks_engine.vllm_backend.hooks``) that NaN-fills the unselected pages around attention."""

    cuda_graphs = False
    needs_cache_views = True

    def on_decode(self, *, k_cache: Tensor | None, v_cache: Tensor | None, block_table: Tensor, seq_lens: Tensor,
                  selected: Tensor, page_size: int, **unused) -> Callable[[], None]:
        """Poison the unselected pages (``poison_unselected``); returns their restore."""
        assert k_cache is not None and v_cache is not None, "the poison hook needs views of the cache"
        return poison_unselected(k_cache, v_cache, block_table, seq_lens, selected, page_size)


def poison_unselected(
    k_cache: Tensor, v_cache: Tensor, block_table: Tensor, seq_lens: Tensor, selected: Tensor, page_size: int
) -> Callable[[], None]:
    """Fill with NaN, in the cache itself, the K and V of every (physical page, KV head) that belongs to a
    sequence of the batch but is selected by no row (rows may share physical pages through prefix caching).

    Args:
        k_cache, v_cache (Tensor): `[num_blocks, block_size, H, D]` views of the cache.
        block_table (Tensor): `[S, W]`; seq_lens (Tensor): `[S]` tokens; selected (Tensor): `[S, H, K]` pages.
        page_size (int): B.
    Returns:
        Callable[[], None]: puts the original values back.
    """
    num_blocks, block_size, heads, _ = k_cache.shape
    ppb = block_size // page_size
    pmax = block_table.shape[1] * ppb
    pages = torch.arange(pmax, device=k_cache.device)
    ids = block_table.long().repeat_interleave(ppb, dim=1) * ppb + pages % ppb  # [S, Pmax] physical ids
    num_pages = (seq_lens.long() + page_size - 1) // page_size
    exists = (pages < num_pages.unsqueeze(1)).unsqueeze(1).expand(-1, heads, -1)  # [S, H, Pmax]
    owned = torch.zeros(num_blocks * ppb, heads, dtype=torch.bool, device=k_cache.device)
    chosen = torch.zeros_like(owned)
    head_index = torch.arange(heads, device=k_cache.device).view(1, -1, 1)
    owned[ids.unsqueeze(1).expand(-1, heads, -1)[exists], head_index.expand_as(exists)[exists]] = True
    valid = selected >= 0
    sel_ids = torch.gather(ids, 1, selected.clamp_min(0).flatten(1)).view_as(selected)
    chosen[sel_ids[valid], head_index.expand_as(selected)[valid]] = True
    page_id, head = (owned & ~chosen).nonzero(as_tuple=True)
    blocks = (page_id // ppb).unsqueeze(1)
    tokens = ((page_id % ppb) * page_size).unsqueeze(1) + torch.arange(page_size, device=k_cache.device)
    head = head.unsqueeze(1)
    saved_k, saved_v = k_cache[blocks, tokens, head].clone(), v_cache[blocks, tokens, head].clone()
    k_cache[blocks, tokens, head] = float("nan")
    v_cache[blocks, tokens, head] = float("nan")

    def restore() -> None:
        k_cache[blocks, tokens, head] = saved_k
        v_cache[blocks, tokens, head] = saved_v

    return restore
