"""One LOCKS decode step of one layer, composed from the Triton stages once: ``select_step`` (summarize the page
this step completed, score, select) then ``sparse_paged_attention``. The vLLM backend's CUDA path runs the two
halves with its decode hooks between them (``locks_engine.vllm_backend.cuda``); ``decode_step`` runs both, as
``samples/bench_kernels.py`` times them. Every stage launches fixed grids: the step captures into one CUDA graph at a
fixed budget."""

from __future__ import annotations

from torch import Tensor

from locks_kernels.attention import sparse_paged_attention
from locks_kernels.score import score_pages
from locks_kernels.select import every_page, select_pages
from locks_kernels.summaries import build_completed_page_summaries
from locks_kernels.superpages import select_two_level


def select_step(
    q: Tensor,
    k_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    summaries: tuple[Tensor, ...] | None,
    page_size: int,
    budget_pages: int,
    sink_pages: int,
    recent_pages: int,
    scale: float | None = None,
    build: bool = True,
    superpages: Tensor | None = None,
    candidates: int = 0,
    every: bool = False,
    live: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Summarize the page (and superpage) this step's token completed (when ``build``), then pick the pages each KV
    head reads: every page unscored (``every``), the two-level scan (``superpages`` and ``candidates > 0``,
    ``superpages.py``), or every page scored (paper Sections 3.1-3.3).

    Args:
        q (Tensor): decode queries `[S, HQ, D]`.
        k_cache (Tensor): `[num_blocks, block_size, H, D]` holding this step's keys.
        block_table (Tensor): `[S, max_blocks]` int32 physical block ids.
        seq_lens (Tensor): `[S]` int32 tokens, this step's included.
        summaries (tuple | None): colwise8 tuple by physical page id, updated in place (``build_page_summaries``);
            None only with ``every`` (no summaries kept: nothing to build or score).
        page_size (int): B, tokens a page.
        budget_pages (int): K, pages read per sequence and KV head; at least ``Pmax`` reads every page.
        sink_pages, recent_pages (int): pages always read at the start and before the last page.
        scale (float | None): softmax scale, default ``D ** -0.5``.
        build (bool): summarize the page this step completed first (and its superpage, when it completed one).
        superpages (Tensor | None): fp16 `[P, H, D]` superpage centroids, updated in place.
        candidates (int): ``c`` of the two-level scan; 0 scores every page.
        every (bool): read every page unscored (``every_page``); the caller decides, e.g. by
            ``locks_engine.ops.select.reads_every_page``. Completed pages are summarized all the same.
        live (Tensor | None): int32 `[1]`, the two-level scan's superpages chosen, read on the device, with
            ``candidates`` the capacity (``select_two_level``'s ``live``: a calibrated ``c``).
    Returns:
        tuple: ``selected`` int64 `[S, H, K']` logical pages ascending, ``-1`` in unused slots (``K' = Pmax`` with
        ``every``, else ``min(K, Pmax)``), and for the two-level scan ``chosen`` int64 `[S, H, M]`, the superpages
        whose pages were scored (``select_two_level``), else None.
    Raises:
        ValueError: when ``B`` does not divide the block size.
        AssertionError: on shapes, strides or dtypes the kernels do not take.
    """
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if build and summaries is not None:
        build_completed_page_summaries(k_cache, block_table, seq_lens, summaries, page_size, superpages)
    if every:
        return every_page(seq_lens, num_kv_heads, block_table.shape[1] * (block_size // page_size), page_size), None
    if superpages is not None and candidates > 0:
        return select_two_level(q, summaries, superpages, block_table, seq_lens, page_size, block_size,
                                budget_pages, sink_pages, recent_pages, candidates, scale, live=live)
    scores = score_pages(q, summaries, block_table, seq_lens, page_size, block_size, scale)
    return select_pages(scores, seq_lens, num_kv_heads, budget_pages, page_size, sink_pages, recent_pages), None


def decode_step(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    summaries: tuple[Tensor, ...] | None,
    page_size: int,
    budget_pages: int,
    sink_pages: int,
    recent_pages: int,
    scale: float | None = None,
    build: bool = True,
    superpages: Tensor | None = None,
    candidates: int = 0,
    every: bool = False,
    out: Tensor | None = None,
    live: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``select_step`` then exact attention over the selected pages (paper Sections 3.1-3.4).

    Args:
        v_cache (Tensor): `[num_blocks, block_size, H, D]` holding this step's values.
        out (Tensor | None): `[S, HQ, D]` written in place (fixed address for CUDA graphs).
        The others: as ``select_step``.
    Returns:
        tuple: ``out`` `[S, HQ, D]` in ``q.dtype`` and ``lse`` `[S, HQ]` fp32, as ``sparse_paged_attention``.
    Raises:
        ValueError: when ``B`` does not divide the block size.
        AssertionError: on shapes, strides or dtypes the kernels do not take.
    """
    selected, _ = select_step(q, k_cache, block_table, seq_lens, summaries, page_size, budget_pages, sink_pages,
                              recent_pages, scale, build, superpages, candidates, every, live)
    return sparse_paged_attention(q, k_cache, v_cache, block_table, seq_lens, selected, page_size, scale, out=out)
