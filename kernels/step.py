"""One LOCKS decode step of one layer, composed from the four Triton stages (what the vLLM backend runs and what
the benchmark times). Every stage launches fixed grids: the step captures into one CUDA graph at a fixed budget."""

from __future__ import annotations

from torch import Tensor

from locks_engine.config import LocksConfig
from locks_engine.ops.summaries import PageSummaries
from locks_kernels.attention import sparse_paged_attention
from locks_kernels.score import score_pages
from locks_kernels.score_tuning import use_lse_partials
from locks_kernels.select import select_pages
from locks_kernels.summaries import build_completed_page_summaries


def decode_step(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    store: PageSummaries,
    cfg: LocksConfig,
    scale: float | None = None,
    build: bool = True,
) -> tuple[Tensor, Tensor]:
    """Summarize the page this step's token completed (when ``build``), score every page, select, attend.

    Args:
        q (Tensor): `[S, HQ, D]`; k_cache, v_cache (Tensor): `[num_blocks, block_size, H, D]` holding this
            step's keys and values; block_table (Tensor): `[S, max_blocks]` int32; seq_lens (Tensor): `[S]`
            int32 tokens, this step's included.
        store (PageSummaries): summaries by physical page id, updated in place.
        cfg (LocksConfig): page size, rank, budget, sink/recent pages, format, dense switch.
        scale (float | None): softmax scale, default ``D ** -0.5``.
    Returns:
        tuple: ``out`` `[S, HQ, D]` in ``q.dtype`` and ``lse`` `[S, HQ]` fp32, as ``sparse_paged_attention``.
    """
    if build:
        build_completed_page_summaries(k_cache, block_table, seq_lens, store, cfg)
    partials = None
    if use_lse_partials():
        scores, partials = score_pages(q, store, block_table, seq_lens, cfg.page_size, k_cache.shape[1], scale,
                                       lse_partials=True)
    else:
        scores = score_pages(q, store, block_table, seq_lens, cfg.page_size, k_cache.shape[1], scale)
    selected = select_pages(scores, seq_lens, k_cache.shape[2], cfg, lse_partials=partials)
    return sparse_paged_attention(q, k_cache, v_cache, block_table, seq_lens, selected, cfg.page_size, scale)
