"""The CUDA path of the LOCKS backend (vLLM 0.26 on the GPU machine): vLLM's own cache writer and the Triton
stages of ``locks_kernels`` for summaries and decode. ``impl.py`` calls it when the KV cache is a CUDA tensor;
``locks_kernels`` (and triton) load on first use, so CPU machines never import them.

Decode launches fixed grids and never waits for the host, so a full CUDA graph captures it: the page that a
decode token completes is summarized on the device (``build_completed_page_summaries`` checks
``seq_len % B == 0`` there), and the block table is the runner's persistent full-width buffer.
"""

from __future__ import annotations

import torch
from torch import Tensor

from locks_engine.config import LocksConfig
from locks_engine.ops import PageSummaries, write_page_summaries


def write_kv(
    key: Tensor, value: Tensor, kv_cache: Tensor, slot_mapping: Tensor, head_size: int, kv_cache_dtype: str,
    k_scale: Tensor, v_scale: Tensor,
) -> None:
    """Write K/V `[T, H, D]` at ``slot_mapping`` `[T']` (``-1`` = padding) with vLLM's FLASH_ATTN writer.

    Args:
        kv_cache (Tensor): `[num_blocks, H, block_size, 2*D]`, K in ``[..., :D]``, V in ``[..., D:]``.
        k_scale, v_scale (Tensor): the layer's scales (unused for the unquantized caches LOCKS takes).
    """
    from vllm._custom_ops import reshape_and_cache_flash

    key_cache, value_cache = kv_cache.transpose(1, 2).split(head_size, dim=-1)
    reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def summarize_pages(store: PageSummaries, k_cache: Tensor, page_ids: Tensor, page_slots: Tensor,
                    cfg: LocksConfig) -> None:
    """Summarize the pages completed by prefill rows into ``store`` at their physical ids.

    Args:
        k_cache (Tensor): `[num_blocks, block_size, H, D]`.
        page_ids (Tensor): `[Pn]` int64 physical page ids; page_slots (Tensor): `[Pn, B]` int64 cache slots.
    """
    from locks_kernels import build_page_summaries

    block_size = k_cache.shape[1]
    keys = k_cache[page_slots // block_size, page_slots % block_size]  # [Pn, B, H, D]
    write_page_summaries(store, page_ids, build_page_summaries(keys, cfg))


def select(
    q: Tensor, k_cache: Tensor, block_table: Tensor, seq_lens: Tensor, store: PageSummaries | None,
    cfg: LocksConfig, scale: float, num_kv_heads: int,
) -> Tensor:
    """Summarize the page each decode token completed, score every page, select (paper Sections 3.1-3.3).

    Args:
        q (Tensor): `[S, HQ, D]`; k_cache (Tensor): `[num_blocks, block_size, H, D]` holding this step's keys.
        block_table (Tensor): `[S, W]` int32; seq_lens (Tensor): `[S]` int32 tokens, this step's included.
        store (PageSummaries | None): summaries by physical page id, updated in place; None with ``cfg.dense``.
    Returns:
        Tensor: int64 `[S, H, K]` logical pages in ascending order, ``-1`` in unused slots.
    """
    import locks_kernels as lk

    block_size = k_cache.shape[1]
    pmax = block_table.shape[1] * (block_size // cfg.page_size)
    if store is not None:
        lk.build_completed_page_summaries(k_cache, block_table, seq_lens, store, cfg)
    if store is None or cfg.budget_pages >= pmax:
        # every page is read (the dense switch, or a budget past max_model_len): select_pages looks at the
        # scores' shape only
        scores = torch.empty(q.shape[0], q.shape[1], pmax, dtype=torch.float32, device=q.device)
        return lk.select_pages(scores, seq_lens, num_kv_heads, cfg)
    # the persistent score kernel's log-sum-exp partials can spare selection its own pass over the scores
    partials = None
    if lk.use_lse_partials():
        scores, partials = lk.score_pages(q, store, block_table, seq_lens, cfg.page_size, block_size, scale,
                                          lse_partials=True)
    else:
        scores = lk.score_pages(q, store, block_table, seq_lens, cfg.page_size, block_size, scale)
    return lk.select_pages(scores, seq_lens, num_kv_heads, cfg, lse_partials=partials)


def attend(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, seq_lens: Tensor, selected: Tensor,
    cfg: LocksConfig, scale: float, out: Tensor,
) -> None:
    """Exact softmax attention over the selected pages only (paper Section 3.4), written into ``out`` `[S, HQ, D]`."""
    from locks_kernels import sparse_paged_attention

    sparse_paged_attention(q, k_cache, v_cache, block_table, seq_lens, selected, cfg.page_size, scale, out=out)
