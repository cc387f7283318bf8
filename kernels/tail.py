"""The tail estimate in Triton (issue 47; ops twin ``locks_engine.ops.tail``): every complete page a KV head does
not select enters the softmax as ``exp(s_j) vbar_j``, one more flash-decoding split merged with the exact one.

``vbar_j`` is read from the value-mean store by physical page id (``locks_kernels.value_means``). Two kernels,
fixed grids from static shapes (``S``, ``HQ``, ``Pmax``, ``K``), no host synchronization (CUDA-graph capturable):

- the **tail split**: program ``(split, h, s)`` walks ``PPS`` logical pages in tiles of ``TP`` for the ``G``
  query heads of KV head ``h``, a page in the tail when complete and not in ``selected[s, h]`` (each tile
  compared with the selection in chunks of ``KC`` slots: no scratch, no ordering assumed), with an online
  log-sum-exp in base 2 over the scores and ``softmax(s) vbar`` as a matrix product;
- the **merge** of the tail's splits, and of the exact split's ``(out, lse)`` when given, by log-sum-exp
  (FlashDecoding's reduction; Dao et al., 2023).

With ``share`` (the statistics' share of the estimated mass the tail carried, ``ops.tail.tail_mass_share``) the
split also sums the selected complete pages' estimated mass, and the merge writes each query head's share.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks_kernels.attention import _split_plan, sparse_paged_attention
from locks_kernels.value_means import _check_store


@triton.jit
def _tail_split_kernel(
    scores_ptr, sel_ptr, seq_lens_ptr, block_table_ptr, means_ptr, mscale_ptr, o_part_ptr, lse_part_ptr,
    rest_part_ptr, stride_ss, stride_sh, stride_ls, stride_lh, stride_bt, H, K, PMAX, NSPLIT,
    B: tl.constexpr, D: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, PPB: tl.constexpr, PPS: tl.constexpr,
    TP: tl.constexpr, KC: tl.constexpr, INT8: tl.constexpr, SHARE: tl.constexpr,
):
    i_p, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + i_s)
    limit = tl.minimum(seq_len // B, PMAX)  # complete pages that have a score
    o_g = tl.arange(0, GP)
    o_j = tl.arange(0, TP)
    o_k = tl.arange(0, KC)
    o_d = tl.arange(0, D)
    m_g = o_g < G
    hq = i_h * G + o_g
    b_m = tl.full([GP], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([GP], dtype=tl.float32)
    b_acc = tl.zeros([GP, D], dtype=tl.float32)
    b_rm = tl.full([GP], float("-inf"), dtype=tl.float32)  # SHARE: the selected complete pages' estimated mass
    b_rl = tl.zeros([GP], dtype=tl.float32)
    p_sel = sel_ptr + i_s * stride_ls + i_h * stride_lh
    p_scores = scores_ptr + i_s * stride_ss + hq[:, None] * stride_sh
    for start in range(0, PPS, TP):
        page = i_p * PPS + start + o_j  # [TP] logical pages
        hits = tl.zeros([TP], dtype=tl.int32)
        for k0 in range(0, K, KC):
            b_sel = tl.load(p_sel + k0 + o_k, mask=k0 + o_k < K, other=-1).to(tl.int32)  # [KC]
            hits += tl.sum((page[:, None] == b_sel[None, :]).to(tl.int32), axis=1)
        complete = page < limit
        tail = complete & (hits == 0)
        if SHARE:  # every complete page's score, then split into the tail and the rest
            b_c = tl.load(p_scores + page[None, :], mask=m_g[:, None] & complete[None, :], other=float("-inf"))
            b_c = b_c.to(tl.float32) * 1.4426950408889634  # [GP, TP], base 2
            b_s = tl.where(tail[None, :], b_c, float("-inf"))
            b_r = tl.where(tail[None, :], float("-inf"), b_c)
            r_new = tl.maximum(b_rm, tl.max(b_r, axis=1))
            r_safe = tl.where(r_new == float("-inf"), 0.0, r_new)
            b_rl = b_rl * tl.exp2(b_rm - r_safe) + tl.sum(tl.exp2(b_r - r_safe[:, None]), axis=1)
            b_rm = r_new
        else:
            b_s = tl.load(p_scores + page[None, :], mask=m_g[:, None] & tail[None, :], other=float("-inf"))
            b_s = b_s.to(tl.float32) * 1.4426950408889634  # [GP, TP], base 2
        m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(b_m - m_safe)
        b_p = tl.exp2(b_s - m_safe[:, None])
        b_l = b_l * alpha + tl.sum(b_p, axis=1)
        block = tl.load(block_table_ptr + i_s * stride_bt + page // PPB, mask=tail, other=0).to(tl.int64)
        ph = (block * PPB + page % PPB) * H + i_h  # [TP] row of the store
        b_v = tl.load(means_ptr + ph[:, None] * D + o_d[None, :], mask=tail[:, None], other=0).to(tl.float32)
        if INT8:
            b_v = b_v * tl.load(mscale_ptr + ph, mask=tail, other=0.0).to(tl.float32)[:, None]
        b_acc = b_acc * alpha[:, None] + tl.dot(b_p, b_v, input_precision="ieee")  # [GP, D]
        b_m = m_new
    p_part = (i_s * H * G + hq) * NSPLIT + i_p
    tl.store(o_part_ptr + p_part[:, None] * D + o_d[None, :], b_acc / tl.where(b_l > 0.0, b_l, 1.0)[:, None],
             mask=m_g[:, None])
    tl.store(lse_part_ptr + p_part, tl.where(b_l > 0.0, b_m + tl.log2(b_l), float("-inf")), mask=m_g)
    if SHARE:
        tl.store(rest_part_ptr + p_part, tl.where(b_rl > 0.0, b_rm + tl.log2(b_rl), float("-inf")), mask=m_g)


@triton.jit
def _tail_merge_kernel(
    o_part_ptr, lse_part_ptr, rest_part_ptr, x_out_ptr, x_lse_ptr, out_ptr, lse_ptr, share_ptr, stride_xs, stride_xh,
    stride_os, stride_oh, HQ, NSPLIT, D: tl.constexpr, NC: tl.constexpr, EXACT: tl.constexpr, SHARE: tl.constexpr,
):
    # the tail has up to Pmax / PPS splits (hundreds at 1M tokens): two passes over chunks of NC of them
    i_hq, i_s = tl.program_id(0), tl.program_id(1).to(tl.int64)
    o_n = tl.arange(0, NC)
    o_d = tl.arange(0, D)
    p_lse = lse_part_ptr + (i_s * HQ + i_hq) * NSPLIT  # base 2
    p_o = o_part_ptr + (i_s * HQ + i_hq) * NSPLIT * D
    p_rest = rest_part_ptr + (i_s * HQ + i_hq) * NSPLIT  # SHARE: the selected complete pages' estimate, base 2
    b_top = tl.full([NC], float("-inf"), dtype=tl.float32)
    b_rtop = tl.full([NC], float("-inf"), dtype=tl.float32)
    for n0 in range(0, NSPLIT, NC):
        b_top = tl.maximum(b_top, tl.load(p_lse + n0 + o_n, mask=n0 + o_n < NSPLIT, other=float("-inf")))
        if SHARE:
            b_rtop = tl.maximum(b_rtop, tl.load(p_rest + n0 + o_n, mask=n0 + o_n < NSPLIT, other=float("-inf")))
    top = tl.max(b_top, axis=0)
    t_top = tl.where(top == float("-inf"), 0.0, top)  # the tail's own, for the share
    r_top = tl.max(b_rtop, axis=0)
    r_top = tl.where(r_top == float("-inf"), 0.0, r_top)
    if EXACT:
        x_lse = tl.load(x_lse_ptr + i_s * HQ + i_hq) * 1.4426950408889634  # natural log -> base 2
        top = tl.maximum(top, x_lse)
    top = tl.where(top == float("-inf"), 0.0, top)
    b_w = tl.zeros([NC], dtype=tl.float32)
    b_tw = tl.zeros([NC], dtype=tl.float32)
    b_rw = tl.zeros([NC], dtype=tl.float32)
    b_out = tl.zeros([D], dtype=tl.float32)
    for n0 in range(0, NSPLIT, NC):
        m_n = n0 + o_n < NSPLIT
        b_lse = tl.load(p_lse + n0 + o_n, mask=m_n, other=float("-inf"))
        w = tl.exp2(b_lse - top)
        b_o = tl.load(p_o + (n0 + o_n)[:, None] * D + o_d[None, :], mask=m_n[:, None], other=0.0)  # [NC, D]
        b_w += w
        b_out += tl.sum(b_o * w[:, None], axis=0)
        if SHARE:
            b_tw += tl.exp2(b_lse - t_top)
            b_rw += tl.exp2(tl.load(p_rest + n0 + o_n, mask=m_n, other=float("-inf")) - r_top)
    total = tl.sum(b_w, axis=0)
    if SHARE:
        # share = tail / (tail + selected complete pages), both estimated: ops.tail.tail_mass_share per query head
        t_sum = tl.sum(b_tw, axis=0)
        r_sum = tl.sum(b_rw, axis=0)
        lse_t = tl.where(t_sum > 0.0, t_top + tl.log2(t_sum), float("-inf"))
        lse_r = tl.where(r_sum > 0.0, r_top + tl.log2(r_sum), float("-inf"))
        both = tl.maximum(lse_t, lse_r)
        both = tl.where(both == float("-inf"), 0.0, both)
        a = tl.exp2(lse_t - both)
        c = tl.exp2(lse_r - both)
        tl.store(share_ptr + i_s * HQ + i_hq, tl.where(a + c > 0.0, a / (a + c), 0.0))
    if EXACT:
        w_x = tl.exp2(x_lse - top)
        b_x = tl.load(x_out_ptr + i_s * stride_xs + i_hq * stride_xh + o_d).to(tl.float32)
        total += w_x
        b_out += w_x * b_x
    b_out = b_out / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + i_s * stride_os + i_hq * stride_oh + o_d, b_out.to(out_ptr.dtype.element_ty))
    tl.store(lse_ptr + i_s * HQ + i_hq, tl.where(total > 0.0, (top + tl.log2(total)) * 0.6931471805599453,
                                               float("-inf")))


#: the backend asks ``tail_paged_attention`` for the tail's share (``share=``) instead of computing it in torch
#: (``ops.tail.tail_mass_share``: ~40 launches, ~100 us a layer at Llama-3.1-8B shapes 128K, one H100,
#: ``samples/results/2026-12-07_gpu_0f96b88_default/``). Off until the ``SHARE`` kernels are compiled and tested
#: on a GPU (tested in the interpreter against the ops twin)
SHARE_IN_KERNEL = False


def _tail_parts(scores: Tensor, selected: Tensor, seq_lens: Tensor, block_table: Tensor,
                value_means: tuple[Tensor, Tensor | None], page_size: int, block_size: int, tile_pages: int,
                pages_per_split: int | None, num_warps: int, share: bool = False
                ) -> tuple[Tensor, Tensor, Tensor | None]:
    """Launch the tail split kernel: ``(o_part [S, HQ, NSPLIT, D] fp32, lse_part [S, HQ, NSPLIT] base 2,
    rest_part)``; with ``share``, ``rest_part`` `[S, HQ, NSPLIT]` base 2 is the log of the selected complete pages'
    estimated mass (for the tail's share, ``_merge``), else None."""
    seqs, num_q_heads, pmax = scores.shape
    means, scale = value_means
    heads, dim = means.shape[1], means.shape[2]
    if block_size % page_size:
        raise ValueError(f"page_size={page_size} must divide the KV cache block size {block_size}")
    ppb = block_size // page_size
    int8 = _check_store(value_means, heads, dim)
    assert num_q_heads % heads == 0, f"HQ={num_q_heads} is not a multiple of H={heads}"
    assert dim >= 16 and dim & (dim - 1) == 0, "D must be a power of two >= 16"
    assert scores.dtype == torch.float32 and scores.stride(-1) == 1, "scores: fp32, contiguous along pages"
    assert selected.shape[:2] == (seqs, heads) and selected.stride(-1) == 1, "selected: [S, H, K]"
    assert selected.dtype in (torch.int32, torch.int64), "selected: int32 or int64 logical pages"
    assert pmax <= block_table.shape[1] * ppb, "scores cover more pages than the block table"
    assert tile_pages >= 16 and tile_pages & (tile_pages - 1) == 0, "tile_pages: a power of two >= 16"
    groups = num_q_heads // heads
    slots = selected.shape[-1]
    pps = pages_per_split or _split_plan(seqs, heads, pmax, tile_pages)
    assert pps % tile_pages == 0, "pages_per_split must be a multiple of tile_pages"
    nsplit = triton.cdiv(pmax, pps)
    o_part = torch.empty(seqs, num_q_heads, nsplit, dim, dtype=torch.float32, device=scores.device)
    lse_part = torch.empty(seqs, num_q_heads, nsplit, dtype=torch.float32, device=scores.device)
    rest_part = torch.empty_like(lse_part) if share else None
    _tail_split_kernel[(nsplit, heads, seqs)](
        scores,
        selected,
        seq_lens,
        block_table,
        means,
        means if scale is None else scale,
        o_part,
        lse_part,
        lse_part if rest_part is None else rest_part,
        scores.stride(0),
        scores.stride(1),
        selected.stride(0),
        selected.stride(1),
        block_table.stride(0),
        heads,
        slots,
        pmax,
        nsplit,
        B=page_size,
        D=dim,
        G=groups,
        GP=max(16, triton.next_power_of_2(groups)),
        PPB=ppb,
        PPS=pps,
        TP=tile_pages,
        KC=min(64, max(16, triton.next_power_of_2(slots))),
        INT8=int8,
        SHARE=share,
        num_warps=num_warps,
    )
    return o_part, lse_part, rest_part


def _merge(o_part: Tensor, lse_part: Tensor, exact: tuple[Tensor, Tensor] | None, out: Tensor,
           lse: Tensor, rest_part: Tensor | None = None, share: Tensor | None = None) -> None:
    seqs, num_q_heads, nsplit, dim = o_part.shape
    assert out.shape == (seqs, num_q_heads, dim) and out.stride(-1) == 1, "out: [S, HQ, D], D contiguous"
    assert lse.shape == (seqs, num_q_heads) and lse.dtype == torch.float32 and lse.is_contiguous(), "lse: [S, HQ]"
    x_out, x_lse = exact if exact is not None else (out, lse)
    assert x_out.shape == out.shape and x_out.stride(-1) == 1 and x_lse.is_contiguous()
    assert (share is None) == (rest_part is None), "share needs the split's rest_part"
    assert share is None or (share.shape == lse.shape and share.dtype == torch.float32 and share.is_contiguous()), \
        "share: fp32 [S, HQ], contiguous"
    _tail_merge_kernel[(num_q_heads, seqs)](
        o_part,
        lse_part,
        lse_part if rest_part is None else rest_part,
        x_out,
        x_lse,
        out,
        lse,
        lse if share is None else share,
        x_out.stride(0),
        x_out.stride(1),
        out.stride(0),
        out.stride(1),
        num_q_heads,
        nsplit,
        D=dim,
        NC=min(32, max(2, triton.next_power_of_2(nsplit))),
        EXACT=exact is not None,
        SHARE=share is not None,
        num_warps=4,
    )


def tail_split(
    scores: Tensor,
    selected: Tensor,
    seq_lens: Tensor,
    block_table: Tensor,
    value_means: tuple[Tensor, Tensor | None],
    page_size: int,
    block_size: int,
    out: Tensor | None = None,
    lse: Tensor | None = None,
    tile_pages: int = 32,
    pages_per_split: int | None = None,
    num_warps: int = 4,
) -> tuple[Tensor, Tensor]:
    """The tail estimate as one attention split: ``out = sum_j softmax(s)_j vbar_j``, ``lse = logsumexp_j s_j``
    over the tail pages ``j`` of each query head (issue 47; Double-P's per-page mean values, arXiv 2602.05191).

    Equals ``ops.tail.tail_split(scores masked to ops.tail.tail_pages(...), means)`` with the means read from the
    store (``ops.tail.stored_row_value_means``). A page is in KV head ``h``'s tail when it is complete
    (``j < seq_len // B``), ``j < Pmax`` and not in ``selected[s, h]``; query head ``hq`` reads KV head
    ``hq // G``.

    Args:
        scores (Tensor): fp32 `[S, HQ, Pmax]` estimated log mass of each logical page (natural log;
            ``score_pages``), ``-inf`` without a score; contiguous along pages.
        selected (Tensor): `[S, H, K]` int32 or int64 logical pages read exactly, ``-1`` unused; any order.
        seq_lens (Tensor): `[S]` int32 tokens. block_table (Tensor): `[S, max_blocks]` int32 physical block ids.
        value_means (tuple): ``(means, scale)`` store by physical page id (``allocate_value_means``).
        page_size (int): B. block_size (int): tokens a KV cache block (a multiple of B).
        out (Tensor | None): fp32 `[S, HQ, D]`; lse (Tensor | None): fp32 `[S, HQ]`; written in place.
        tile_pages, pages_per_split, num_warps (int): pages per inner tile (a power of two >= 16), pages per
            program (default: about 1024 programs) and warps (tuning only).
    Returns:
        tuple: ``out`` `[S, HQ, D]` fp32 and ``lse`` `[S, HQ]` fp32 (natural log); an empty tail gives zeros
        and ``-inf``, never NaN.
    Raises:
        ValueError: when ``B`` does not divide the block size.
        AssertionError: on shapes, strides or dtypes the kernels do not take.
    """
    seqs, num_q_heads, _ = scores.shape
    dim = value_means[0].shape[-1]
    out = torch.empty(seqs, num_q_heads, dim, dtype=torch.float32, device=scores.device) if out is None else out
    lse = torch.empty(seqs, num_q_heads, dtype=torch.float32, device=scores.device) if lse is None else lse
    o_part, lse_part, _ = _tail_parts(scores, selected, seq_lens, block_table, value_means, page_size, block_size,
                                      tile_pages, pages_per_split, num_warps)
    _merge(o_part, lse_part, None, out, lse)
    return out, lse


def tail_paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    selected: Tensor,
    scores: Tensor,
    value_means: tuple[Tensor, Tensor | None],
    page_size: int,
    scale: float | None = None,
    out: Tensor | None = None,
    lse: Tensor | None = None,
    share: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Decode attention over the selected pages, exact, plus the tail estimate of every other complete page.

    As ``locks_engine.ops.tail.tail_paged_attention``, except that ``value_means`` is the store by physical page
    id (``allocate_value_means``) instead of fp32 means by logical page: ``sparse_paged_attention`` over
    ``selected`` (its output kept in fp32), the tail split (``tail_split``), merged by log-sum-exp in one launch
    (FlashDecoding's reduction). Four launches, fixed grids, no host synchronization.

    Args:
        q (Tensor): `[S, HQ, D]`; k_cache, v_cache (Tensor): `[num_blocks, block_size, H, D]`, ``D`` contiguous.
        block_table (Tensor): `[S, max_blocks]` int32; seq_lens (Tensor): `[S]` int32 tokens.
        selected (Tensor): int64 `[S, H, K]` logical pages, ``-1`` unused (``select_pages``).
        scores (Tensor): fp32 `[S, HQ, Pmax]` estimated log mass of each logical page (``score_pages``, with
            the scale of the attention), ``-inf`` without a score; ``Pmax`` at most the block table's pages.
        value_means (tuple): ``(means, scale)`` by physical page id (``build_cache_value_means``,
            ``build_completed_value_means``).
        page_size (int): B. scale (float | None): softmax scale, default ``D ** -0.5``.
        out (Tensor | None): `[S, HQ, D]` in ``q.dtype``; lse (Tensor | None): fp32 `[S, HQ]`; written in place.
        share (Tensor | None): fp32 `[S, HQ]`, contiguous: when given, written in place with each query head's
            share of the estimated mass that the tail carries, ``sum_{j in tail} exp(s_j) / sum_{j complete}
            exp(s_j)`` (``ops.tail.tail_mass_share`` before its mean over the group; 0 where no complete page has
            a score), from the split's own passes: no extra launch.
    Returns:
        tuple: ``out`` `[S, HQ, D]` in ``q.dtype`` and ``lse`` `[S, HQ]` fp32 (natural log) of the exact and
        estimated mass; a row with nothing read and an empty tail gives zeros and ``-inf``.
    Raises:
        ValueError: when ``B`` does not divide the block size.
        AssertionError: on shapes, strides or dtypes the kernels do not take.
    """
    seqs, num_q_heads, dim = q.shape
    exact = (torch.empty(seqs, num_q_heads, dim, dtype=torch.float32, device=q.device),
             torch.empty(seqs, num_q_heads, dtype=torch.float32, device=q.device))
    sparse_paged_attention(q, k_cache, v_cache, block_table, seq_lens, selected, page_size, scale, out=exact[0],
                           lse=exact[1])
    o_part, lse_part, rest_part = _tail_parts(scores, selected, seq_lens, block_table, value_means, page_size,
                                              k_cache.shape[1], 32, None, 4, share=share is not None)
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty(seqs, num_q_heads, dtype=torch.float32, device=q.device) if lse is None else lse
    _merge(o_part, lse_part, exact, out, lse, rest_part, share)
    return out, lse
