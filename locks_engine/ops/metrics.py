"""How much of the true attention a selection keeps."""

from __future__ import annotations

import torch
from torch import Tensor

from locks_engine.ops.attention import dense_paged_attention, sparse_paged_attention


def attention_mass_kept(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    selected: Tensor,
    page_size: int,
    scale: float | None = None,
) -> Tensor:
    """Share of each query head's exact softmax mass that falls on the selected pages.

    ``exp(lse_selected - lse_all)``, with both log-sum-exps over exact ``scale * q.k``.

    Args:
        As :func:`locks_engine.ops.sparse_paged_attention`.
    Returns:
        Tensor: fp32 `[S, HQ]` in ``[0, 1]`` (0 for a row that reads nothing).
    """
    _, lse_sel = sparse_paged_attention(q, k_cache, v_cache, block_table, seq_lens, selected, page_size, scale)
    _, lse_all = dense_paged_attention(q, k_cache, v_cache, block_table, seq_lens, page_size, scale)
    kept = torch.exp(lse_sel - lse_all)
    return torch.nan_to_num(kept, nan=0.0).clamp(0.0, 1.0)
