"""Stage 4 in Triton: exact decode attention over the selected pages of a paged KV cache (paper Section 3.4).

Split over pages (flash-decoding): program ``(split, h, s)`` reads ``PPS`` selected pages of KV head ``h`` in
tiles of ``TP`` pages, for all ``G`` query heads of the group at once (each KV page is read once per group),
with an online softmax in base 2; a second kernel merges the splits by their log-sum-exp, exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _sparse_attn_split_kernel(
    q_ptr, k_ptr, v_ptr, block_table_ptr, seq_lens_ptr, sel_ptr, o_part_ptr, lse_part_ptr,
    stride_qs, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_bt, stride_ls, stride_lh, scale, K, NSPLIT,
    B: tl.constexpr, D: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, PPB: tl.constexpr,
    PPS: tl.constexpr, TP: tl.constexpr, F32: tl.constexpr,
):
    i_p, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + i_s)
    o_g = tl.arange(0, GP)
    o_d = tl.arange(0, D)
    o_t = tl.arange(0, TP * B)
    b_q = tl.load(q_ptr + i_s * stride_qs + (i_h * G + o_g[:, None]) * stride_qh + o_d[None, :],
                  mask=o_g[:, None] < G, other=0.0)  # [GP, D]
    b_q = b_q.to(tl.float32) if F32 else b_q.to(k_ptr.dtype.element_ty)
    qk_scale = scale * 1.4426950408889634
    b_m = tl.full([GP], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([GP], dtype=tl.float32)
    b_acc = tl.zeros([GP, D], dtype=tl.float32)
    p_sel = sel_ptr + i_s * stride_ls + i_h * stride_lh
    for start in range(0, PPS, TP):
        slot = i_p * PPS + start + o_t // B  # [TP*B]: the selection slot of each token row
        page = tl.load(p_sel + slot, mask=slot < K, other=-1)
        pos = page * B + o_t % B
        valid = (page >= 0) & (pos < seq_len)
        block = tl.load(block_table_ptr + i_s * stride_bt + page // PPB, mask=page >= 0, other=0).to(tl.int64)
        row = (page % PPB) * B + o_t % B
        b_k = tl.load(k_ptr + block[:, None] * stride_kb + row[:, None] * stride_kt + i_h * stride_kh + o_d[None, :],
                      mask=valid[:, None], other=0.0)  # [TP*B, D]
        if F32:
            b_s = tl.dot(b_q, tl.trans(b_k.to(tl.float32)), input_precision="ieee")
        else:
            b_s = tl.dot(b_q, tl.trans(b_k))
        b_s = tl.where(valid[None, :], b_s * qk_scale, float("-inf"))  # [GP, TP*B]
        m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(b_m - m_safe)
        b_p = tl.exp2(b_s - m_safe[:, None])
        b_l = b_l * alpha + tl.sum(b_p, axis=1)
        b_v = tl.load(v_ptr + block[:, None] * stride_vb + row[:, None] * stride_vt + i_h * stride_vh + o_d[None, :],
                      mask=valid[:, None], other=0.0)
        if F32:
            b_acc = b_acc * alpha[:, None] + tl.dot(b_p, b_v.to(tl.float32), input_precision="ieee")
        else:
            b_acc = b_acc * alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v)
        b_m = m_new
    hq = i_h * G + o_g
    m_g = o_g < G
    p_part = (i_s * tl.num_programs(1) * G + hq) * NSPLIT + i_p
    tl.store(o_part_ptr + p_part[:, None] * D + o_d[None, :], b_acc / tl.where(b_l > 0.0, b_l, 1.0)[:, None],
             mask=m_g[:, None])
    tl.store(lse_part_ptr + p_part, tl.where(b_l > 0.0, b_m + tl.log2(b_l), float("-inf")), mask=m_g)


@triton.jit
def _merge_splits_kernel(o_part_ptr, lse_part_ptr, out_ptr, lse_ptr, stride_os, stride_oh, HQ, NSPLIT,
                         D: tl.constexpr, NP: tl.constexpr):
    i_hq, i_s = tl.program_id(0), tl.program_id(1).to(tl.int64)
    o_n = tl.arange(0, NP)
    o_d = tl.arange(0, D)
    row = (i_s * HQ + i_hq) * NSPLIT + o_n
    b_lse = tl.load(lse_part_ptr + row, mask=o_n < NSPLIT, other=float("-inf"))  # [NP], base 2
    top = tl.max(b_lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp2(b_lse - top)
    total = tl.sum(w, axis=0)
    b_o = tl.load(o_part_ptr + row[:, None] * D + o_d[None, :], mask=(o_n < NSPLIT)[:, None], other=0.0)
    b_out = tl.sum(b_o * w[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + i_s * stride_os + i_hq * stride_oh + o_d, b_out.to(out_ptr.dtype.element_ty))
    tl.store(lse_ptr + i_s * HQ + i_hq, tl.where(total > 0.0, (top + tl.log2(total)) * 0.6931471805599453,
                                               float("-inf")))


def _split_plan(seqs: int, heads: int, slots: int, tile: int, target: int = 1024) -> int:
    """Pages per split: a multiple of ``tile``, a power of two, about ``target`` programs in all."""
    per_split = triton.next_power_of_2(max(1, seqs * heads * slots // target))
    return max(tile, min(per_split, triton.next_power_of_2(slots)))


def _attn_fwd(q, k_cache, v_cache, block_table, seq_lens, selected, page_size, scale, out, lse, tile_pages,
              pages_per_split, num_warps):
    seqs, num_q_heads, dim = q.shape
    heads = k_cache.shape[2]
    slots = selected.shape[-1]
    if k_cache.shape[1] % page_size:
        raise ValueError(f"page_size={page_size} must divide the KV cache block size {k_cache.shape[1]}")
    ppb = k_cache.shape[1] // page_size
    assert num_q_heads % heads == 0, f"HQ={num_q_heads} is not a multiple of H={heads}"
    assert k_cache.shape == v_cache.shape and k_cache.dtype == v_cache.dtype, "k_cache and v_cache differ"
    assert dim >= 16 and dim & (dim - 1) == 0 and k_cache.shape[3] == dim, "D must be a power of two >= 16"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "D must be contiguous"
    assert selected.shape[:2] == (seqs, heads) and selected.dtype == torch.int64 and selected.stride(-1) == 1
    groups = num_q_heads // heads
    pps = pages_per_split or _split_plan(seqs, heads, slots, tile_pages)
    assert pps % tile_pages == 0, "pages_per_split must be a multiple of tile_pages"
    nsplit = triton.cdiv(slots, pps)
    dev = q.device
    o_part = torch.empty(seqs, num_q_heads, nsplit, dim, dtype=torch.float32, device=dev)
    lse_part = torch.empty(seqs, num_q_heads, nsplit, dtype=torch.float32, device=dev)
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty(seqs, num_q_heads, dtype=torch.float32, device=dev) if lse is None else lse
    assert out.shape == q.shape and out.stride(-1) == 1 and lse.shape == (seqs, num_q_heads) and lse.is_contiguous()
    _sparse_attn_split_kernel[(nsplit, heads, seqs)](
        q,
        k_cache,
        v_cache,
        block_table,
        seq_lens,
        selected,
        o_part,
        lse_part,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_table.stride(0),
        selected.stride(0),
        selected.stride(1),
        scale,
        slots,
        nsplit,
        B=page_size,
        D=dim,
        G=groups,
        GP=max(16, triton.next_power_of_2(groups)),
        PPB=ppb,
        PPS=pps,
        TP=tile_pages,
        F32=q.dtype == torch.float32 or k_cache.dtype == torch.float32,
        num_warps=num_warps,
    )
    _merge_splits_kernel[(num_q_heads, seqs)](
        o_part,
        lse_part,
        out,
        lse,
        out.stride(0),
        out.stride(1),
        num_q_heads,
        nsplit,
        D=dim,
        NP=max(2, triton.next_power_of_2(nsplit)),
        num_warps=4,
    )
    return out, lse


def sparse_paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    selected: Tensor,
    page_size: int,
    scale: float | None = None,
    out: Tensor | None = None,
    lse: Tensor | None = None,
    tile_pages: int = 4,
    pages_per_split: int | None = None,
    num_warps: int = 4,
) -> tuple[Tensor, Tensor]:
    """Decode attention over the selected pages only, exact softmax over what is read (paper Section 3.4).

    Same contract as ``locks_engine.ops.sparse_paged_attention``: reads the K and V of the selected pages and
    nothing else, each KV page once per GQA group.

    Args:
        q (Tensor): decode queries `[S, HQ, D]` (the token at position ``seq_len - 1``), contiguous along ``D``.
        k_cache, v_cache (Tensor): `[num_blocks, block_size, H, D]`, any strides with ``D`` contiguous (vLLM's
            packed `[num_blocks, block_size, H, 2D]` cache split in two views works as is).
        block_table (Tensor): `[S, max_blocks]` int32; seq_lens (Tensor): `[S]` int32 tokens.
        selected (Tensor): int64 logical page indices `[S, H, K]`, ``-1`` for unused slots (``select_pages``).
        page_size (int): B. scale (float | None): softmax scale, default ``D ** -0.5``.
        out (Tensor | None): `[S, HQ, D]` in ``q.dtype``; lse (Tensor | None): fp32 `[S, HQ]`; written in place.
        tile_pages, pages_per_split, num_warps (int): pages per inner tile, pages per program (default: about
            1024 programs) and warps (tuning only).
    Returns:
        tuple: ``out`` `[S, HQ, D]` in ``q.dtype`` and ``lse`` `[S, HQ]` fp32 (natural log) over the keys read;
        a row that reads no key gives zeros and ``-inf``. bf16/fp16 inputs multiply in their dtype with fp32
        accumulation (probabilities rounded to the cache dtype for ``P V``); fp32 inputs in fp32.
    Raises:
        ValueError: when ``B`` does not divide the block size.
        AssertionError: on shapes, strides or dtypes the kernels do not take.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _attn_fwd(q, k_cache, v_cache, block_table, seq_lens, selected, page_size, scale, out, lse, tile_pages,
                     pages_per_split, num_warps)
