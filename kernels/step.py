"""One LOCKS decode step of one layer, composed from the four Triton stages (what the vLLM backend runs and what
the benchmark times). Every stage launches fixed grids: the step captures into one CUDA graph at a fixed budget."""

from __future__ import annotations

from torch import Tensor

from locks_kernels.attention import sparse_paged_attention
from locks_kernels.score import score_pages
from locks_kernels.select import select_pages
from locks_kernels.summaries import build_completed_page_summaries
from locks_kernels.superpages import build_completed_superpages, select_two_level


def decode_step(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    summaries: tuple[Tensor, ...],
    page_size: int,
    budget_pages: int,
    sink_pages: int,
    recent_pages: int,
    scale: float | None = None,
    build: bool = True,
    superpages: Tensor | None = None,
    candidates: int = 0,
) -> tuple[Tensor, Tensor]:
    """Summarize the page this step's token completed (when ``build``), score every page, select, attend
    (paper Sections 3.1-3.4); with ``superpages`` and ``candidates > 0`` the two-level scan (``superpages.py``).

    Args:
        q (Tensor): decode queries `[S, HQ, D]`.
        k_cache, v_cache (Tensor): `[num_blocks, block_size, H, D]` holding this step's keys and values.
        block_table (Tensor): `[S, max_blocks]` int32 physical block ids.
        seq_lens (Tensor): `[S]` int32 tokens, this step's included.
        summaries (tuple): colwise8 tuple by physical page id, updated in place (``build_page_summaries``).
        page_size (int): B, tokens a page.
        budget_pages (int): K, pages read per sequence and KV head; at least ``Pmax`` reads every page.
        sink_pages, recent_pages (int): pages always read at the start and before the last page.
        scale (float | None): softmax scale, default ``D ** -0.5``.
        build (bool): summarize the page this step completed first (and its superpage, when it completed one).
        superpages (Tensor | None): fp16 `[P, H, D]` superpage centroids, updated in place.
        candidates (int): ``c`` of the two-level scan; 0 scores every page.
    Returns:
        tuple: ``out`` `[S, HQ, D]` in ``q.dtype`` and ``lse`` `[S, HQ]` fp32, as ``sparse_paged_attention``.
    Raises:
        ValueError: when ``B`` does not divide the block size.
        AssertionError: on shapes, strides or dtypes the kernels do not take.
    """
    two_level = superpages is not None and candidates > 0
    if build:
        build_completed_page_summaries(k_cache, block_table, seq_lens, summaries, page_size)
        if superpages is not None:
            build_completed_superpages(summaries[0], superpages, block_table, seq_lens, page_size, k_cache.shape[1])
    if two_level:
        selected = select_two_level(q, summaries, superpages, block_table, seq_lens, page_size, k_cache.shape[1],
                                    budget_pages, sink_pages, recent_pages, candidates, scale)[0]
    else:
        scores = score_pages(q, summaries, block_table, seq_lens, page_size, k_cache.shape[1], scale)
        selected = select_pages(scores, seq_lens, k_cache.shape[2], budget_pages, page_size, sink_pages,
                                recent_pages)
    return sparse_paged_attention(q, k_cache, v_cache, block_table, seq_lens, selected, page_size, scale)
