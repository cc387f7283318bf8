"""Stage 2 in Triton: estimated log attention mass of every page from its summary (paper Section 3.2, Eq. 2).

One program scores ``TP`` logical pages of one sequence for one KV head and all ``G`` query heads of its group, so
each summary is read once per group, with every load of the tile issued up front. All products run on the matrix
units: ``q . mu`` in fp16 (a bf16 query and an fp16 or int8 centroid are exact there); ``V q`` in int8, the basis
as unsigned nibbles (``V = nib - 8``, the offset folded in as ``-8 sum(q)``) against the query as a 16-bit
fixed-point pair per head (error at most ``max|q| / 65024`` per entry); the ``B x r`` coefficient contraction as a
batched fp16 product with ``V q`` split into an fp16 hi + lo pair; then a base-2 logsumexp over the ``B`` tokens,
its log2 one ``lg2.approx`` instruction (``log2_fast``; ``tl.log2`` costs ~25); int8 to fp16 conversions four at a time
in integer and fp16x2 arithmetic (``int8_to_fp16``) instead of the quarter-rate I2F. The kernel is bound by
instruction issue, not bytes (see ``NOTES.md``): the int8 path exists because unpacking int4 to fp16 cost more
instructions than anything else. ``chanlog`` summaries (one scale per channel) dequantize the basis in registers as
an fp16 hi + lo pair with the scales applied, one product for the tile (``_chanlog_basis_fp16``); folding the
scales into the query instead makes its fixed-point pair per page, one batched int8 product per page
(``_chanlog_basis_query``, ``chanlog_path="int8"``), which compiles to ~1.4x the instructions (SASS for sm_90,
``NOTES.md``). ``colwise8`` summaries (int8 basis, one scale per direction) need neither: the basis goes into the
int8 products as stored, against the same fixed-point query.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks_engine.ops.summaries import PageSummaries
from locks_kernels.ptx import int8_to_fp16, log2_fast
from locks_kernels.score_persistent import score_colwise8_persistent
from locks_kernels.score_tuning import (  # noqa: F401 (COEF_PATHS and the tuning names are part of this API)
    CHANLOG_PATHS, COEF_PATHS, GRID_PATH, PERSISTENT_PATHS, TUNING_ENV, default_tuning, resolve_tuning, score_tuning,
)
from locks_kernels.summaries import FORMAT_CODES


@triton.jit
def _chanlog_basis_query(b_lo, b_hi, b_qe, b_qo, s_e, s_o, TP: tl.constexpr, RP: tl.constexpr):
    """``V q = U_int (s * q)`` for per-channel scales ``s``: the scale folded into the query, which is then a
    16-bit fixed-point pair per page and head as in the other formats (error at most ``max|s q| / 65024`` per
    entry), against the nibbles in one batched int8 product per page. Returns fp32 `[TP, RP, GP]`."""
    DH: tl.constexpr = b_lo.shape[1]
    b_lo = tl.reshape(b_lo, [TP, RP, DH])
    b_hi = tl.reshape(b_hi, [TP, RP, DH])
    b_qe = b_qe[None, :, :] * s_e[:, :, None]  # [TP, D/2, GP]
    b_qo = b_qo[None, :, :] * s_o[:, :, None]
    s_q = tl.maximum(tl.max(tl.abs(b_qe), axis=1), tl.max(tl.abs(b_qo), axis=1)) / 32512.0  # [TP, GP]
    s_q = tl.where(s_q > 0.0, s_q, 1.0)
    qe_int = tl.floor(b_qe / s_q[:, None, :] + 0.5)
    qo_int = tl.floor(b_qo / s_q[:, None, :] + 0.5)
    qe_hi = tl.floor((qe_int + 128.0) / 256.0)
    qo_hi = tl.floor((qo_int + 128.0) / 256.0)
    qe_lo = (qe_int - 256.0 * qe_hi).to(tl.int8)
    qo_lo = (qo_int - 256.0 * qo_hi).to(tl.int8)
    q_sum = tl.sum(qe_int + qo_int, axis=1).to(tl.int32)  # [TP, GP]
    w_hi = tl.dot(b_lo, qe_hi.to(tl.int8)) + tl.dot(b_hi, qo_hi.to(tl.int8))  # [TP, RP, GP]
    w_lo = tl.dot(b_lo, qe_lo) + tl.dot(b_hi, qo_lo)
    w_int = 256 * w_hi + w_lo - 8 * q_sum[:, None, :]  # exact
    return w_int.to(tl.float32) * s_q[:, None, :]


@triton.jit
def _chanlog_basis_fp16(b_lo, b_hi, b_qe, b_qo, s_e, s_o, TP: tl.constexpr, RP: tl.constexpr, GP: tl.constexpr):
    """``V q`` for per-channel scales with the scales on the basis side: ``V = (nib - 8) * s`` dequantized in
    registers as an fp16 hi + lo pair (error ~2^-22 relative per entry), then one fp16 product per half for the
    whole tile, ``[TP * RP, D/2] x [D/2, GP]`` twice, against the query in fp16 (a bf16 query is exact there).
    Fewer instructions than folding the scales into a per-page fixed-point query: no per-page requantization,
    no batched products below the matrix unit's tile. Returns fp32 `[TP, RP, GP]`."""
    DH: tl.constexpr = b_lo.shape[1]
    v_e = tl.reshape((b_lo.to(tl.float32) - 8.0), [TP, RP, DH]) * s_e[:, None, :]
    v_o = tl.reshape((b_hi.to(tl.float32) - 8.0), [TP, RP, DH]) * s_o[:, None, :]
    v_e = tl.reshape(v_e, [TP * RP, DH])
    v_o = tl.reshape(v_o, [TP * RP, DH])
    he, ho = v_e.to(tl.float16), v_o.to(tl.float16)
    le, lo = (v_e - he.to(tl.float32)).to(tl.float16), (v_o - ho.to(tl.float32)).to(tl.float16)
    qe, qo = b_qe.to(tl.float16), b_qo.to(tl.float16)
    w = tl.dot(he, qe) + tl.dot(le, qe) + tl.dot(ho, qo) + tl.dot(lo, qo)  # [TP * RP, GP] fp32
    return tl.reshape(w, [TP, RP, GP])


@triton.jit
def _colwise8_logits_by_direction(basis_ptr, coeffs_ptr, basis_scale_ptr, coeffs_scale_ptr, ph, live, q_hi, q_lo,
                                  s_q, B: tl.constexpr, D: tl.constexpr, R: tl.constexpr, TP: tl.constexpr,
                                  GP: tl.constexpr):
    """``colwise8`` logits without the batched ``B x r`` product: for each direction ``k`` the basis row
    ``[TP, D]`` (int8) times the fixed-point query pair gives ``(V q)_k`` `[TP, GP]` on the int8 matrix units, and
    ``c_{:, k} (V q)_k`` is added to the logits with fp32 FMAs (``r * B * G`` a page). Returns fp32 `[TP, B, GP]`
    without ``q . mu``."""
    o_d = tl.arange(0, D)
    o_b = tl.arange(0, B)
    acc = tl.zeros([TP, B, GP], dtype=tl.float32)
    for k in tl.static_range(R):
        row = ph * R + k  # [TP]
        b_vk = tl.load(basis_ptr + row[:, None] * D + o_d[None, :], mask=live[:, None], other=0)  # [TP, D] int8
        c_k = tl.load(coeffs_ptr + ph[:, None] * (B * R) + o_b[None, :] * R + k, mask=live[:, None], other=0)
        s_k = (tl.load(basis_scale_ptr + row, mask=live, other=0.0).to(tl.float32)
               * tl.load(coeffs_scale_ptr + row, mask=live, other=0.0).to(tl.float32))  # [TP]
        w_int = 256 * tl.dot(b_vk, q_hi) + tl.dot(b_vk, q_lo)  # [TP, GP], exact
        w_k = w_int.to(tl.float32) * s_q[None, :] * s_k[:, None]
        acc += c_k.to(tl.float32)[:, :, None] * w_k[:, None, :]
    return acc


@triton.jit
def _score_pages_kernel(
    q_ptr, centroid_ptr, basis_ptr, coeffs_ptr, centroid_scale_ptr, basis_scale_ptr, coeffs_scale_ptr,
    block_table_ptr, seq_lens_ptr, out_ptr,
    stride_qs, stride_qh, stride_bt, stride_os, stride_oh,
    scale, H, PMAX,
    B: tl.constexpr, D: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, KP: tl.constexpr, G: tl.constexpr,
    GP: tl.constexpr, PPB: tl.constexpr, TP: tl.constexpr, FMT: tl.constexpr, CHANLOG_PATH: tl.constexpr,
    COEF_PATH: tl.constexpr, PTX: tl.constexpr,
):
    i_t, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    o_j = i_t * TP + tl.arange(0, TP)  # [TP] logical pages
    o_g = tl.arange(0, GP)
    m_g = o_g < G
    p_out = out_ptr + i_s * stride_os + (i_h * G + o_g[None, :]) * stride_oh + o_j[:, None]  # [TP, GP]
    m_out = (o_j[:, None] < PMAX) & m_g[None, :]
    n_complete = tl.load(seq_lens_ptr + i_s) // B
    if i_t * TP >= n_complete:
        tl.store(p_out, tl.full([TP, GP], float("-inf"), tl.float32), mask=m_out)
    else:
        live = o_j < n_complete
        block = tl.load(block_table_ptr + i_s * stride_bt + o_j // PPB, mask=live, other=0).to(tl.int64)
        ph = (block * PPB + o_j % PPB) * H + i_h  # [TP] page-head index into the store
        o_d = tl.arange(0, D)
        o_r = tl.arange(0, RP)
        o_k = tl.arange(0, KP)
        o_b = tl.arange(0, B)
        # every load of the tile is issued up front: the kernel is bound by memory latency otherwise
        row = ph[:, None] * R + o_r[None, :]  # [TP, RP] basis rows (page, direction)
        m_row = live[:, None] & (o_r < R)[None, :]
        m_c = live[:, None, None] & (o_k < R)[None, None, :]
        if FMT == 4 and COEF_PATH == 2:
            m_c = live[:, None, None] & (o_r < R)[None, None, :]
            b_c = tl.load(coeffs_ptr + ph[:, None, None] * (B * R) + o_b[None, :, None] * R + o_r[None, None, :],
                          mask=m_c, other=0)  # [TP, B, RP]
        elif FMT == 4 and COEF_PATH >= 5:
            # transposed as the contraction takes it: no permute (and its trip through shared memory) later
            b_c = tl.load(coeffs_ptr + ph[:, None, None] * (B * R) + o_b[None, None, :] * R + o_k[None, :, None],
                          mask=live[:, None, None] & (o_k < R)[None, :, None], other=0)  # [TP, KP, B]
        elif not (FMT == 4 and COEF_PATH == 1):
            b_c = tl.load(coeffs_ptr + ph[:, None, None] * (B * R) + o_b[None, :, None] * R + o_k[None, None, :],
                          mask=m_c, other=0)  # [TP, B, KP]
        p_q = q_ptr + i_s * stride_qs + (i_h * G + o_g[None, :]) * stride_qh  # [1, GP]
        if FMT == 0:
            b_mu = tl.load(centroid_ptr + ph[:, None] * D + o_d[None, :], mask=live[:, None], other=0.0)
            b_v = tl.reshape(tl.load(basis_ptr + row[:, :, None] * D + o_d[None, None, :], mask=m_row[:, :, None],
                                     other=0.0), [TP * RP, D])
            b_q = tl.load(p_q + o_d[:, None], mask=m_g[None, :], other=0.0).to(tl.float32)  # [D, GP]
            qmu = tl.dot(b_mu, b_q, input_precision="ieee")  # [TP, GP]
            b_w = tl.reshape(tl.dot(b_v, b_q, input_precision="ieee"), [TP, RP, GP])
        else:
            DH: tl.constexpr = D // 2
            o_dh = tl.arange(0, DH)
            b_mu = tl.load(centroid_ptr + ph[:, None] * D + o_d[None, :], mask=live[:, None], other=0)
            if FMT == 4 and COEF_PATH != 1:
                b_v8 = tl.reshape(tl.load(basis_ptr + row[:, :, None] * D + o_d[None, None, :],
                                          mask=m_row[:, :, None], other=0), [TP * RP, D])  # int8
            else:
                b_p = tl.load(basis_ptr + row[:, :, None] * DH + o_dh[None, None, :], mask=m_row[:, :, None],
                              other=0)
                b_p = tl.reshape(b_p, [TP * RP, DH])  # int4 pairs
            if FMT == 1:
                s_mu = tl.load(centroid_scale_ptr + ph, mask=live, other=0.0).to(tl.float32)
                s_w = (tl.load(basis_scale_ptr + ph, mask=live, other=0.0).to(tl.float32)
                       * tl.load(coeffs_scale_ptr + ph, mask=live, other=0.0).to(tl.float32))[:, None]
            elif FMT == 4 and COEF_PATH == 1:
                pass  # scales per direction, in the loop
            elif FMT == 3:
                s_w = tl.load(coeffs_scale_ptr + row, mask=m_row, other=0.0).to(tl.float32)  # [TP, RP]
                p_code = basis_scale_ptr + ph[:, None] * D + 2 * o_dh[None, :]  # [TP, D/2] even channels
                s_e = tl.exp2(tl.load(p_code, mask=live[:, None], other=0).to(tl.float32) * 0.25)
                s_o = tl.exp2(tl.load(p_code + 1, mask=live[:, None], other=0).to(tl.float32) * 0.25)
            else:
                s_w = (tl.load(basis_scale_ptr + row, mask=m_row, other=0.0).to(tl.float32)
                       * tl.load(coeffs_scale_ptr + row, mask=m_row, other=0.0).to(tl.float32))  # [TP, RP]
            b_q = tl.load(p_q + o_d[:, None], mask=m_g[None, :], other=0.0)  # [D, GP]
            qmu = tl.dot(b_mu.to(tl.float16), b_q.to(tl.float16))
            if FMT == 1:
                qmu *= s_mu[:, None]
            # V q on the int8 matrix units: the query as a 16-bit fixed-point pair per head,
            # q = s_q (256 q_hi + q_lo), |q - s_q q_int| <= s_q / 2 = max|q| / 65024
            if FMT == 4 and (COEF_PATH == 4 or COEF_PATH == 6):
                # int8 basis converted to fp16 (exact) against the query in fp16: one product, no fixed point
                w_f = tl.dot(int8_to_fp16(b_v8, PTX), b_q.to(tl.float16))  # [TP * RP, GP] fp32
                b_w = tl.reshape(w_f, [TP, RP, GP]) * s_w[:, :, None]
            elif FMT == 4:
                # int8 basis: straight into the products, no unpacking, one scale per direction (in s_w)
                b_qf = b_q.to(tl.float32)  # [D, GP]
                s_q = tl.max(tl.abs(b_qf), axis=0) / 32512.0  # [GP]
                s_q = tl.where(s_q > 0.0, s_q, 1.0)  # q_hi <= 127
                # the split in integers: q_hi = round(q_int / 256) by an arithmetic shift, q_lo the rest
                q_int = tl.floor(b_qf / s_q[None, :] + 0.5).to(tl.int32)
                q_hi = (q_int + 128) >> 8
                q_lo = (q_int - (q_hi << 8)).to(tl.int8)
                if COEF_PATH == 1:
                    b_logit = _colwise8_logits_by_direction(basis_ptr, coeffs_ptr, basis_scale_ptr, coeffs_scale_ptr,
                                                            ph, live, q_hi.to(tl.int8), q_lo, s_q, B, D, R, TP, GP)
                else:
                    w_int = 256 * tl.dot(b_v8, q_hi.to(tl.int8)) + tl.dot(b_v8, q_lo)  # [TP * RP, GP], exact
                    b_w = tl.reshape(w_int.to(tl.float32) * s_q[None, :], [TP, RP, GP]) * s_w[:, :, None]
            else:
                # the basis as unsigned nibbles (V = nib - 8)
                b_qe = tl.load(p_q + 2 * o_dh[:, None], mask=m_g[None, :], other=0.0).to(tl.float32)  # [D/2, GP]
                b_qo = tl.load(p_q + 2 * o_dh[:, None] + 1, mask=m_g[None, :], other=0.0).to(tl.float32)
                b_lo = (b_p & 15).to(tl.int8)
                b_hi = (b_p >> 4).to(tl.int8)
                if FMT == 3 and CHANLOG_PATH == 1:
                    b_w = _chanlog_basis_fp16(b_lo, b_hi, b_qe, b_qo, s_e, s_o, TP, RP, GP) * s_w[:, :, None]
                elif FMT == 3:
                    b_w = _chanlog_basis_query(b_lo, b_hi, b_qe, b_qo, s_e, s_o, TP, RP) * s_w[:, :, None]
                else:
                    s_q = tl.maximum(tl.max(tl.abs(b_qe), axis=0), tl.max(tl.abs(b_qo), axis=0)) / 32512.0  # [GP]
                    s_q = tl.where(s_q > 0.0, s_q, 1.0)  # q_hi <= 127
                    qe_int = tl.floor(b_qe / s_q[None, :] + 0.5)
                    qo_int = tl.floor(b_qo / s_q[None, :] + 0.5)
                    qe_hi = tl.floor((qe_int + 128.0) / 256.0)
                    qo_hi = tl.floor((qo_int + 128.0) / 256.0)
                    qe_lo = (qe_int - 256.0 * qe_hi).to(tl.int8)
                    qo_lo = (qo_int - 256.0 * qo_hi).to(tl.int8)
                    q_sum = tl.sum(qe_int + qo_int, axis=0).to(tl.int32)  # [GP]
                    w_hi = tl.dot(b_lo, qe_hi.to(tl.int8)) + tl.dot(b_hi, qo_hi.to(tl.int8))
                    w_lo = tl.dot(b_lo, qe_lo) + tl.dot(b_hi, qo_lo)
                    w_int = 256 * w_hi + w_lo - 8 * q_sum[None, :]  # [TP * RP, GP] = (V_int q_int), exact
                    b_w = tl.reshape(w_int.to(tl.float32) * s_q[None, :], [TP, RP, GP]) * s_w[:, :, None]
        if FMT == 4 and COEF_PATH == 1:
            pass  # logits already summed per direction
        elif FMT == 4 and COEF_PATH == 2:
            # the B x r contraction as one broadcast product summed over r in registers (fp32 FMAs)
            b_logit = tl.sum(b_c.to(tl.float32)[:, :, :, None] * b_w[:, None, :, :], axis=2)  # [TP, B, GP]
        elif KP > RP:
            # zero rows up to the 16 that a matrix-unit product needs along the direction axis
            o_f = tl.arange(0, KP // RP)
            b_w = tl.reshape(tl.where((o_f == 0)[None, :, None, None], b_w[:, None, :, :], 0.0), [TP, KP, GP])
        if FMT == 4 and (COEF_PATH == 1 or COEF_PATH == 2):
            pass
        elif FMT == 0:
            b_logit = tl.dot(b_c, b_w, input_precision="ieee")  # [TP, B, GP]
        else:
            # int8 coefficients are exact in fp16; the (V q) factors go in as an fp16 pair (hi + lo)
            b_c = int8_to_fp16(b_c, PTX) if FMT == 4 else b_c.to(tl.float16)
            w_hi = b_w.to(tl.float16)
            if FMT == 4 and COEF_PATH >= 5:
                # as 3 / 4, transposed: [TP, GP, B] puts the page's tokens along the product's N, where the
                # log-sum-exp reduces within a thread and its quad (fewer shuffles than along M)
                b_logit = tl.dot(tl.permute(w_hi, (0, 2, 1)), b_c)  # [TP, GP, B]
            elif FMT == 4 and (COEF_PATH == 3 or COEF_PATH == 4):
                # (V q) rounded once to fp16 (relative error 2^-11, under colwise8's int8 rounding of the
                # coefficients, 2^-8): half the products and no hi / lo split
                b_logit = tl.dot(b_c, w_hi)
            else:
                b_logit = tl.dot(b_c, w_hi) + tl.dot(b_c, (b_w - w_hi.to(tl.float32)).to(tl.float16))
        if FMT == 4 and COEF_PATH >= 5:
            b_logit = (b_logit + qmu[:, :, None]) * (scale * 1.4426950408889634)  # base 2, [TP, GP, B]
            b_max = tl.max(b_logit, axis=2)
            b_lse = b_max + log2_fast(tl.sum(tl.exp2(b_logit - b_max[:, :, None]), axis=2), PTX)
        else:
            b_logit = (b_logit + qmu[:, None, :]) * (scale * 1.4426950408889634)  # base 2, [TP, B, GP]
            b_max = tl.max(b_logit, axis=1)
            b_lse = b_max + log2_fast(tl.sum(tl.exp2(b_logit - b_max[:, None, :]), axis=1), PTX)
        b_score = tl.where(live[:, None], b_lse * 0.6931471805599453, float("-inf"))
        tl.store(p_out, b_score, mask=m_out)


#: environment switch of the score kernel's inline PTX (``log2_fast``, ``int8_to_fp16``): ``0`` takes Triton's own
#: ``tl.log2`` and ``.to(tl.float16)`` instead (for A/B timing, or should a driver refuse the assembly)
PTX_ENV = "LOCKS_SCORE_PTX"


def use_ptx(requested: bool | None = None) -> bool:
    """Whether the score kernel compiles its inline PTX: ``requested`` when given, else unless ``$LOCKS_SCORE_PTX``
    is ``0``; never under Triton's interpreter, which runs no inline assembly."""
    compiled = isinstance(_score_pages_kernel, triton.runtime.JITFunction)
    wanted = os.environ.get(PTX_ENV, "").strip() != "0" if requested is None else requested
    return compiled and wanted


def _score_fwd(q, store, block_table, seq_lens, page_size, block_size, scale, out, tile_pages, num_warps,
               chanlog_path="fp16", coef_path=None, ptx=None, programs_per_sm=None,
               pipeline_stages=None, max_registers=None, lse_partials=False):
    seqs, num_q_heads, dim = q.shape
    heads = store.centroid.shape[1]
    rank = store.coeffs.shape[-1]
    ppb = block_size // page_size
    pmax = block_table.shape[1] * ppb
    assert num_q_heads % heads == 0, f"HQ={num_q_heads} is not a multiple of H={heads}"
    assert block_size % page_size == 0, f"page_size={page_size} must divide block_size={block_size}"
    assert store.coeffs.shape[-2] == page_size and store.centroid.shape[-1] == dim, "store does not match q / B"
    assert dim >= 32 and dim & (dim - 1) == 0, f"kernels need D a power of two >= 32, got {dim}"
    assert q.stride(-1) == 1, "q must be contiguous along D"
    assert all(t.is_contiguous() for t in store.tensors().values()), "summary store tensors must be contiguous"
    groups = num_q_heads // heads
    if out is None:
        out = torch.empty(seqs, num_q_heads, pmax, dtype=torch.float32, device=q.device)
    assert out.shape == (seqs, num_q_heads, pmax) and out.dtype == torch.float32 and out.stride(-1) == 1
    # the B x G logits of TP pages live in registers: fewer pages per program for large groups
    chanlog = store.summary_format == "chanlog"
    if chanlog and chanlog_path == "int8":
        tile_pages = tile_pages or 8
    coef_path, tile_pages, num_warps, programs_per_sm, pipeline_stages, max_registers = resolve_tuning(
        groups, store.summary_format, seqs, heads, q.device, coef_path, tile_pages, num_warps, programs_per_sm,
        pipeline_stages, max_registers)
    if programs_per_sm:
        if store.summary_format != "colwise8" or coef_path not in PERSISTENT_PATHS:
            raise ValueError(f"programs_per_sm={programs_per_sm}: the persistent score kernel takes colwise8 "
                             f"summaries with coef_path {', '.join(PERSISTENT_PATHS)}, got {store.summary_format} / "
                             f"{coef_path}")
        return score_colwise8_persistent(q, store, block_table, seq_lens, page_size, block_size, scale, out,
                                         tile_pages, num_warps, coef_path.startswith("half"), programs_per_sm,
                                         pipeline_stages, use_ptx(ptx), coef_path.endswith("c"), max_registers,
                                         lse_partials)
    if coef_path in GRID_PATH:
        raise ValueError(f"coef_path={coef_path!r} runs in the persistent score kernel only (programs_per_sm > 0)")
    grid = (triton.cdiv(pmax, tile_pages), heads, seqs)
    _score_pages_kernel[grid](
        q,
        store.centroid,
        store.basis,
        store.coeffs,
        store.centroid if store.centroid_scale is None else store.centroid_scale,
        store.centroid if store.basis_scale is None else store.basis_scale,
        store.centroid if store.coeffs_scale is None else store.coeffs_scale,
        block_table,
        seq_lens,
        out,
        q.stride(0),
        q.stride(1),
        block_table.stride(0),
        out.stride(0),
        out.stride(1),
        scale,
        heads,
        pmax,
        B=page_size,
        D=dim,
        R=rank,
        RP=triton.next_power_of_2(rank),
        KP=max(16, triton.next_power_of_2(rank)),
        G=groups,
        GP=max(2, triton.next_power_of_2(groups)),
        PPB=ppb,
        TP=tile_pages,
        FMT=FORMAT_CODES[store.summary_format],
        CHANLOG_PATH=CHANLOG_PATHS[chanlog_path],
        COEF_PATH=COEF_PATHS[coef_path] if store.summary_format == "colwise8" else 0,
        PTX=use_ptx(ptx),
        num_warps=num_warps,
    )
    return (out, None) if lse_partials else out


def score_pages(
    q: Tensor,
    store: PageSummaries,
    block_table: Tensor,
    seq_lens: Tensor,
    page_size: int,
    block_size: int,
    scale: float | None = None,
    out: Tensor | None = None,
    tile_pages: int | None = None,
    num_warps: int | None = None,
    chanlog_path: str = "fp16",
    coef_path: str | None = None,
    ptx: bool | None = None,
    programs_per_sm: int | None = None,
    pipeline_stages: int | None = None,
    max_registers: int | None = None,
    lse_partials: bool = False,
) -> Tensor | tuple[Tensor, Tensor | None]:
    """Estimated log attention mass of each page, reading only its summary (paper Eq. 2).

    ``s_j(q) = logsumexp_{i in page j} (scale * (q . mu_j + (V_j q) . c_i))``, as ``locks_engine.ops.score_pages``.

    Args:
        q (Tensor): decode queries `[S, HQ, D]`, fp32, bf16 or fp16, contiguous along ``D``; ``D`` a power of
            two >= 32. Quantized formats multiply ``q . mu`` in fp16 (an fp32 query is rounded to 11 bits) and
            ``V q`` with ``q`` as a 16-bit fixed-point pair per head (module docstring); ``float`` in fp32.
        store (PageSummaries): summaries by physical page id (contiguous tensors `[num_blocks * ppb, H, ...]`).
        block_table (Tensor): `[S, max_blocks]` int32 physical block ids; seq_lens (Tensor): `[S]` int32 tokens.
        page_size (int): B; block_size (int): tokens per KV cache block (a multiple of B).
        scale (float | None): softmax scale, default ``D ** -0.5``.
        out (Tensor | None): fp32 `[S, HQ, Pmax]` written in place (fixed address for CUDA graphs).
        tile_pages, num_warps (int | None): pages per program (default ``default_tuning``'s: 16 for
            ``colwise8``, ``chanlog`` and groups over 4, else 32; 8 for ``chanlog_path="int8"``, whose query is
            per page) and warps per program (default 4); tuning only, defaults overridden by
            ``$LOCKS_SCORE_TUNING`` (``score_tuning``; how the fields combine: ``resolve_tuning``).
        chanlog_path (str): how ``chanlog`` computes ``V q``: ``"fp16"`` (basis dequantized in registers as an
            fp16 pair, one product for the tile) or ``"int8"`` (scales folded into a per-page fixed-point
            query); tuning only, equal results within rounding.
        coef_path (str | None): how ``colwise8`` contracts the ``B x r`` coefficients with ``V q`` (a name of
            ``COEF_PATHS``; default ``default_tuning``'s: ``halftc`` for groups up to 4, else ``dot1tc``, in the
            persistent kernel, or ``halft`` / ``dot1t`` in the grid kernel when the batch is too large for it; all
            four round ``V q`` to fp16 once, ~2^-11 relative); tuning only, equal results within rounding.
        ptx (bool | None): inline PTX for the log-sum-exp's log2 and the int8 -> fp16 conversions (``use_ptx``;
            default on unless ``$LOCKS_SCORE_PTX=0``, never under the interpreter); the same scores within ~2^-22.
        programs_per_sm (int | None): 0 for the grid kernel (one program a tile), more for the persistent one
            (``locks_kernels.score_persistent``: that many programs per SM walk the tiles, the next tile's loads in
            flight while the current one is computed; ``colwise8`` with ``dot1t`` or ``halft``, the same scores as
            the grid kernel's, or ``dot1tc`` / ``halftc``, their log-sum-exp shifted by the centroid's logit, the
            same within rounding). Default: ``resolve_tuning``'s (``colwise8`` at small batches: 4 at G > 4, 5
            at G <= 4); tuning only.
        pipeline_stages (int | None): tiles in flight per program of the persistent kernel (default 2; 1 loads
            each tile when it is computed); tuning only.
        max_registers (int | None): cap on the persistent kernel's registers a thread (Triton's ``maxnreg``;
            ``score_tuning.register_cap`` gives the cap at which ``programs_per_sm`` programs fit an SM;
            default None, the compiler's choice, as the defaults were measured); tuning only.
        lse_partials (bool): also return the persistent kernel's log-sum-exp partials (None from the grid kernel).
    Returns:
        Tensor: fp32 `[S, HQ, Pmax]`, ``Pmax = max_blocks * block_size // B``; ``-inf`` for pages that are
        not complete or past the sequence. Reads ``S * H * P_complete`` summaries once each. With
        ``lse_partials``, ``(scores, partials)``: partials fp32 `[S, HQ, NPROG, 2]`, per query head and persistent
        program the max ``m`` of its pages' scores and ``sum exp(score - m)`` over them (``-inf`` and 0 for a
        program with no page), for ``select_pages(lse_partials=...)``; None when the grid kernel ran.
    Raises:
        AssertionError: on shapes, strides or dtypes the kernel does not take.
        ValueError: on an unknown ``coef_path``, a persistent grid asked of another format or path, or a
            ``$LOCKS_SCORE_TUNING`` that does not parse.
    """
    if coef_path is not None and coef_path not in COEF_PATHS:
        raise ValueError(f"coef_path={coef_path!r}: allowed {', '.join(COEF_PATHS)}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _score_fwd(q, store, block_table, seq_lens, page_size, block_size, scale, out, tile_pages, num_warps,
                      chanlog_path, coef_path, ptx, programs_per_sm, pipeline_stages, max_registers, lse_partials)
