"""The two-level selection in Triton (``locks_engine.ops.superpages`` is the twin; design in ``NOTES.md``,
"Selection cost"): superpage centroids, their scores, and the composed selection over the chosen superpages.

A superpage is :data:`SUPERPAGE_PAGES` logical pages, the score kernel's tile (``score.TUNING``); its fp16 centroid
sits at the physical page id of its last page. Per decode step and layer (all grids fixed, CUDA-graph safe):

1. ``build_completed_superpages``: the sequences whose token completed a superpage (``seq_len % 16 B == 0``)
   average its 16 page centroids (written by ``build_completed_page_summaries`` just before; the decode step
   has that kernel do both, ``build_completed_page_summaries(superpages=)``: one launch);
2. ``superpage_scores``: ``scale * q . mu_u`` for every complete superpage, all ``G`` query heads of a group per
   program, ``-inf`` elsewhere;
3. ``select.select_pages`` over those scores with superpages as pages (forced: the first, the last and the one
   before it), ``superpage_slots`` of them;
4. ``score.score_pages(tiles=...)``: page summaries of the chosen superpages only;
5. ``select.select_pages(tiles=...)``: the top ``K`` pages of those.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

#: pages a superpage: the score kernel's tile of pages
SUPERPAGE_PAGES = 16


def superpage_slots(budget_pages: int, sink_pages: int, recent_pages: int, candidates: int) -> int:
    """Superpages chosen per step and KV head: ``ceil(c K / 16)`` plus those holding the forced pages
    (``ceil(sink / 16)``, the last, ``ceil(recent / 16)`` before it), as ``ops.superpages.superpage_config``."""
    sp = SUPERPAGE_PAGES
    return math.ceil(candidates * budget_pages / sp) + -(-sink_pages // sp) + -(-recent_pages // sp) + 1


@triton.jit
def _average_superpage(centroid_ptr, superpages_ptr, block_table_ptr, i_s, i_h, seq_len, stride_bt, H,
                       B: tl.constexpr, D: tl.constexpr, SP: tl.constexpr, PPB: tl.constexpr):
    """Sequence ``i_s`` has just completed a superpage (``seq_len % 16 B == 0``): the mean of its 16 page
    centroids of KV head ``i_h``, fp16, at its last page's id (also the tail of the page-summary kernel's decode
    mode, ``summaries.py``)."""
    o_j = (seq_len // B - SP) + tl.arange(0, SP)  # the superpage's pages, logical
    block = tl.load(block_table_ptr + i_s * stride_bt + o_j // PPB).to(tl.int64)
    ph = (block * PPB + o_j % PPB) * H + i_h  # [SP]
    o_d = tl.arange(0, D)
    b_mu = tl.load(centroid_ptr + ph[:, None] * D + o_d[None, :]).to(tl.float32)  # [SP, D]
    j = seq_len // B - 1  # the superpage's last page
    last = (tl.load(block_table_ptr + i_s * stride_bt + j // PPB).to(tl.int64) * PPB + j % PPB) * H + i_h
    tl.store(superpages_ptr + last * D + o_d, (tl.sum(b_mu, axis=0) / SP).to(tl.float16))


@triton.jit
def _build_superpages_kernel(centroid_ptr, superpages_ptr, block_table_ptr, seq_lens_ptr, stride_bt, H,
                             B: tl.constexpr, D: tl.constexpr, SP: tl.constexpr, PPB: tl.constexpr):
    i_s, i_h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + i_s)
    if seq_len > 0 and seq_len % (SP * B) == 0:
        _average_superpage(centroid_ptr, superpages_ptr, block_table_ptr, i_s, i_h, seq_len, stride_bt, H, B, D,
                           SP, PPB)


def build_completed_superpages(centroid: Tensor, superpages: Tensor, block_table: Tensor, seq_lens: Tensor,
                               page_size: int, block_size: int) -> None:
    """Average the page centroids of the superpage each decode token completed (``seq_len % 16 B == 0``) into
    ``superpages`` at its last page's id; other sequences' programs exit at once. Fixed grid `[S, H]`.

    Args:
        centroid (Tensor): fp16 `[P, H, D]` page centroids (colwise8), this step's page written.
        superpages (Tensor): fp16 `[P, H, D]` superpage centroids, updated in place.
        block_table (Tensor): `[S, max_blocks]` int32. seq_lens (Tensor): `[S]` int32, this step's token included.
        page_size (int): B. block_size (int): tokens a block (a multiple of B).
    Raises:
        AssertionError: on shapes or dtypes the kernel does not take.
    """
    assert superpages.shape == centroid.shape and superpages.dtype == centroid.dtype == torch.float16
    assert centroid.is_contiguous() and superpages.is_contiguous()
    seqs, heads, dim = block_table.shape[0], centroid.shape[1], centroid.shape[2]
    _build_superpages_kernel[(seqs, heads)](
        centroid, superpages, block_table, seq_lens, block_table.stride(0), heads,
        B=page_size, D=dim, SP=SUPERPAGE_PAGES, PPB=block_size // page_size, num_warps=4,
    )


@triton.jit
def _superpage_scores_kernel(q_ptr, superpages_ptr, block_table_ptr, seq_lens_ptr, out_ptr,
                             stride_qs, stride_qh, stride_bt, stride_os, stride_oh, scale, H, NSMAX, PMAX,
                             B: tl.constexpr, D: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
                             SP: tl.constexpr, PPB: tl.constexpr, TS: tl.constexpr):
    i_u, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    o_u = i_u * TS + tl.arange(0, TS)
    o_g = tl.arange(0, GP)
    o_d = tl.arange(0, D)
    m_g = o_g < G
    whole = tl.load(seq_lens_ptr + i_s) // B // SP
    live = o_u < whole
    last = tl.minimum(o_u * SP + SP - 1, PMAX - 1)  # [TS] logical last page
    block = tl.load(block_table_ptr + i_s * stride_bt + last // PPB, mask=live, other=0).to(tl.int64)
    ph = (block * PPB + last % PPB) * H + i_h
    b_mu = tl.load(superpages_ptr + ph[:, None] * D + o_d[None, :], mask=live[:, None], other=0.0)  # [TS, D]
    b_q = tl.load(q_ptr + i_s * stride_qs + (i_h * G + o_g[None, :]) * stride_qh + o_d[:, None], mask=m_g[None, :],
                  other=0.0).to(tl.float16)  # [D, GP]
    b_s = tl.dot(b_mu, b_q) * scale  # [TS, GP]
    b_s = tl.where(live[:, None], b_s, float("-inf"))
    p_out = out_ptr + i_s * stride_os + (i_h * G + o_g[None, :]) * stride_oh + o_u[:, None]
    tl.store(p_out, b_s, mask=(o_u < NSMAX)[:, None] & m_g[None, :])


#: superpages a program of ``superpage_scores`` scores
SCORE_TILE = 64


def superpage_scores(q: Tensor, superpages: Tensor, block_table: Tensor, seq_lens: Tensor, page_size: int,
                     block_size: int, scale: float | None = None, out: Tensor | None = None) -> Tensor:
    """``scale * q . mu_u`` of every complete superpage (``ops.superpages.superpage_scores``): ``q`` in fp16 (a bf16
    query and an fp16 centroid are exact there), fp32 accumulation.

    Args:
        q (Tensor): `[S, HQ, D]`, contiguous along ``D``. superpages (Tensor): fp16 `[P, H, D]`, contiguous.
        block_table (Tensor): `[S, max_blocks]` int32. seq_lens (Tensor): `[S]` int32 tokens.
        page_size (int): B. block_size (int): tokens a block. scale (float | None): default ``D ** -0.5``.
        out (Tensor | None): fp32 `[S, HQ, NSmax]` written in place.
    Returns:
        Tensor: fp32 `[S, HQ, NSmax]`, ``NSmax = ceil(Pmax / 16)``, ``-inf`` for superpages not complete.
    Raises:
        AssertionError: on shapes, strides or dtypes the kernel does not take.
    """
    seqs, num_q_heads, dim = q.shape
    heads = superpages.shape[1]
    assert num_q_heads % heads == 0 and superpages.dtype == torch.float16 and superpages.is_contiguous()
    assert q.stride(-1) == 1 and dim >= 16 and dim & (dim - 1) == 0
    scale = dim**-0.5 if scale is None else scale
    ppb = block_size // page_size
    pmax = block_table.shape[1] * ppb
    nsmax = triton.cdiv(pmax, SUPERPAGE_PAGES)
    if out is None:
        out = torch.empty(seqs, num_q_heads, nsmax, dtype=torch.float32, device=q.device)
    assert out.shape == (seqs, num_q_heads, nsmax) and out.dtype == torch.float32 and out.stride(-1) == 1
    groups = num_q_heads // heads
    _superpage_scores_kernel[(triton.cdiv(nsmax, SCORE_TILE), heads, seqs)](
        q, superpages, block_table, seq_lens, out,
        q.stride(0), q.stride(1), block_table.stride(0), out.stride(0), out.stride(1), scale, heads, nsmax, pmax,
        B=page_size, D=dim, G=groups, GP=max(16, triton.next_power_of_2(groups)), SP=SUPERPAGE_PAGES, PPB=ppb,
        TS=SCORE_TILE, num_warps=4,
    )
    return out


def select_two_level(
    q: Tensor,
    summaries: tuple[Tensor, ...],
    superpages: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    page_size: int,
    block_size: int,
    budget_pages: int,
    sink_pages: int,
    recent_pages: int,
    candidates: int,
    scale: float | None = None,
    out: Tensor | None = None,
    live: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Steps 2-5 of this module's doc: the pages each KV head reads, as ``ops.superpages.select_two_level``.

    Args:
        q (Tensor): `[S, HQ, D]`. summaries (tuple): the colwise8 tuple (``score.score_pages``).
        superpages (Tensor): fp16 `[P, H, D]`. block_table (Tensor): `[S, max_blocks]` int32.
        seq_lens (Tensor): `[S]` int32. page_size (int): B. block_size (int): tokens a block.
        budget_pages (int): K. sink_pages, recent_pages (int): forced pages. candidates (int): ``c >= 1``, with
            ``live`` the capacity (the largest ``c`` the layer may take).
        scale (float | None): default ``D ** -0.5``. out (Tensor | None): int64 `[S, H, K]` in place.
        live (Tensor | None): int32 `[1]` on the device, the superpages chosen this step (``superpage_slots`` of
            the layer's own ``c``, at most the capacity's): the layer's ``c`` as data, so that a CUDA graph
            captured at the capacity takes a calibrated ``c`` (``locks_engine.ops.calibration``) without a new
            capture. The output is then ``select_two_level`` at that ``c``; ``chosen`` keeps ``M`` slots, ``-1``
            past the live ones. None: ``candidates`` itself.
    Returns:
        tuple[Tensor, Tensor]: ``selected`` int64 `[S, H, min(K, 16 M)]` pages ascending (``-1`` unused) and
        ``chosen`` int64 `[S, H, M]` the superpages whose pages were scored (``M = superpage_slots``, or
        ``NSmax`` when that is fewer: every superpage).
    """
    from locks_kernels.score import score_pages
    from locks_kernels.select import select_pages

    heads = superpages.shape[1]
    coarse = superpage_scores(q, superpages, block_table, seq_lens, page_size, block_size, scale)
    slots = superpage_slots(budget_pages, sink_pages, recent_pages, candidates)
    sp = SUPERPAGE_PAGES
    chosen = select_pages(coarse, seq_lens, heads, slots, page_size * sp, -(-sink_pages // sp),
                          -(-recent_pages // sp), budget_live=live)
    scores = score_pages(q, summaries, block_table, seq_lens, page_size, block_size, scale, tiles=chosen,
                         live_tiles=live)
    selected = select_pages(scores, seq_lens, heads, budget_pages, page_size, sink_pages, recent_pages, out=out,
                            tiles=chosen, live_tiles=live)
    return selected, chosen
