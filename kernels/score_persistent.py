"""Stage 2 in Triton, ``colwise8`` summaries, as a persistent grid (paper Section 3.2, Eq. 2).

The grid kernel of ``locks_kernels.score`` gives every tile of ``TP`` pages its own program, which loads the tile,
waits for it, and computes: at ~1.7 us of compute a tile and a DRAM latency of the same order, a resident program
spends much of its life waiting on its one load. Here ``NPROG`` programs per (KV head, sequence) walk the tiles
``i_p, i_p + NPROG, ...`` and keep the next tile's loads in flight while they compute the current one (Triton's
software pipeliner: cp.async copies into shared memory, ``STAGES`` tiles deep). The query's fixed-point split is
made once per program instead of once per tile. Tiles past the last complete page get ``-inf`` without loads.
Same arithmetic as the ``dot1t`` and ``halft`` paths of the grid kernel (``V q`` on the int8 or fp16 matrix units,
the ``B x r`` contraction transposed so that the log-sum-exp runs along the product's N), same results to the bit
for the same path. With ``PARTS`` each program also keeps the running max and sum of ``exp`` of its pages' scores
per query head (flash-attention's online softmax, over pages), so that selection needs no pass of its own over
the scores for their log-sum-exp.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from locks_kernels.ptx import int8_to_fp16, log2_fast
from locks_kernels.score_tuning import programs_per_head, register_cap


@triton.jit
def _colwise8_tile_loads(basis_ptr, coeffs_ptr, centroid_ptr, basis_scale_ptr, coeffs_scale_ptr, block, o_j, live,
                         i_h, H, B: tl.constexpr, D: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
                         KP: tl.constexpr, PPB: tl.constexpr, TP: tl.constexpr):
    """Issue the loads of one tile (``block`` `[TP]` int64 physical blocks of logical pages ``o_j``); nothing
    waits on them here. Returns the basis int8 `[TP * RP, D]`, coefficients int8 `[TP, KP, B]` (transposed),
    centroids `[TP, D]` and the two fp16 scale tensors `[TP, RP]`."""
    o_d = tl.arange(0, D)
    o_r = tl.arange(0, RP)
    o_k = tl.arange(0, KP)
    o_b = tl.arange(0, B)
    ph = (block * PPB + o_j % PPB) * H + i_h  # [TP] page-head index into the store
    row = ph[:, None] * R + o_r[None, :]  # [TP, RP]
    m_row = live[:, None] & (o_r < R)[None, :]
    b_c = tl.load(coeffs_ptr + ph[:, None, None] * (B * R) + o_b[None, None, :] * R + o_k[None, :, None],
                  mask=live[:, None, None] & (o_k < R)[None, :, None], other=0)
    b_mu = tl.load(centroid_ptr + ph[:, None] * D + o_d[None, :], mask=live[:, None], other=0)
    b_v8 = tl.reshape(tl.load(basis_ptr + row[:, :, None] * D + o_d[None, None, :], mask=m_row[:, :, None], other=0),
                      [TP * RP, D])
    s_b = tl.load(basis_scale_ptr + row, mask=m_row, other=0.0)
    s_c = tl.load(coeffs_scale_ptr + row, mask=m_row, other=0.0)
    return b_v8, b_c, b_mu, s_b, s_c


@triton.jit
def _colwise8_tile_lse(b_v8, b_c, b_mu, s_b, s_c, live, b_q16, q_hi, q_lo, s_q, scale, TP: tl.constexpr,
                       RP: tl.constexpr, KP: tl.constexpr, GP: tl.constexpr, HALF: tl.constexpr, PTX: tl.constexpr,
                       SHIFT: tl.constexpr):
    """Scores `[TP, GP]` in base 2 (``log2`` of the mass, ``-inf`` where not ``live``) of one loaded tile: ``q . mu`` in fp16, ``V q``
    on the int8 units against the fixed-point query (``HALF``: the basis converted to fp16 against the fp16
    query), rounded to fp16 once, the ``B x r`` contraction as ``[GP, KP] x [KP, B]`` per page, base-2 log-sum-exp
    over the ``B`` tokens.

    ``SHIFT``: the log-sum-exp shifted by the centroid's logit instead of the page's largest, ``lse = q . mu +
    log2 sum_i 2^(c_i . V q)`` (base 2, scaled): the coefficients of a page are centered (``sum_i c_i = 0`` up to
    their int8 rounding), so the largest exponent is >= ~0 and the sum cannot underflow; exponents are clamped at
    120 (a token 83 nats above its page's centroid logit), so 16 terms cannot overflow. No max reduction, no
    per-logit add of ``q . mu``, the scale folded into ``V q``: three operations a logit instead of six."""
    log2e: tl.constexpr = 1.4426950408889634
    s_w = s_b.to(tl.float32) * s_c.to(tl.float32)  # [TP, RP]
    if SHIFT:
        s_w = s_w * (scale * log2e)
    qmu = tl.dot(b_mu.to(tl.float16), b_q16)  # [TP, GP]
    if HALF:
        w_f = tl.dot(int8_to_fp16(b_v8, PTX), b_q16)  # [TP * RP, GP] fp32
        b_w = tl.reshape(w_f, [TP, RP, GP]) * s_w[:, :, None]
    else:
        w_int = 256 * tl.dot(b_v8, q_hi) + tl.dot(b_v8, q_lo)  # [TP * RP, GP], exact
        b_w = tl.reshape(w_int.to(tl.float32) * s_q[None, :], [TP, RP, GP]) * s_w[:, :, None]
    if KP > RP:
        # zero rows up to the 16 that a matrix-unit product needs along the direction axis
        o_f = tl.arange(0, KP // RP)
        b_w = tl.reshape(tl.where((o_f == 0)[None, :, None, None], b_w[:, None, :, :], 0.0), [TP, KP, GP])
    b_logit = tl.dot(tl.permute(b_w.to(tl.float16), (0, 2, 1)), int8_to_fp16(b_c, PTX))  # [TP, GP, B]
    if SHIFT:
        b_sum = tl.sum(tl.exp2(tl.minimum(b_logit, 120.0)), axis=2)
        b_lse = qmu * (scale * log2e) + log2_fast(b_sum, PTX)
    else:
        b_logit = (b_logit + qmu[:, :, None]) * (scale * log2e)  # base 2
        b_max = tl.max(b_logit, axis=2)
        b_lse = b_max + log2_fast(tl.sum(tl.exp2(b_logit - b_max[:, :, None]), axis=2), PTX)
    return tl.where(live[:, None], b_lse, float("-inf"))


@triton.jit
def _score_pages_persistent_kernel(
    q_ptr, centroid_ptr, basis_ptr, coeffs_ptr, basis_scale_ptr, coeffs_scale_ptr, block_table_ptr, seq_lens_ptr,
    out_ptr, part_ptr,
    stride_qs, stride_qh, stride_bt, stride_os, stride_oh,
    scale, H, PMAX, NPROG,
    B: tl.constexpr, D: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, KP: tl.constexpr, G: tl.constexpr,
    GP: tl.constexpr, PPB: tl.constexpr, TP: tl.constexpr, HALF: tl.constexpr, PTX: tl.constexpr,
    STAGES: tl.constexpr, SHIFT: tl.constexpr, PARTS: tl.constexpr,
):
    i_p, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    o_tp = tl.arange(0, TP)
    o_g = tl.arange(0, GP)
    o_d = tl.arange(0, D)
    m_g = o_g < G
    p_out = out_ptr + i_s * stride_os + (i_h * G + o_g[None, :]) * stride_oh  # [1, GP]
    n_complete = tl.load(seq_lens_ptr + i_s) // B
    n_live = tl.cdiv(n_complete, TP)
    n_tiles = tl.cdiv(PMAX, TP)
    # tiles past the last complete page: -inf, nothing to read
    for i_t in range(n_live + i_p, n_tiles, NPROG):
        o_j = i_t * TP + o_tp
        tl.store(p_out + o_j[:, None], tl.full([TP, GP], float("-inf"), tl.float32),
                 mask=(o_j[:, None] < PMAX) & m_g[None, :])
    # the query once per program: fp16 for q . mu (and V q with HALF), a 16-bit fixed-point pair per head,
    # q = s_q (256 q_hi + q_lo), |q - s_q q_int| <= s_q / 2 = max|q| / 65024
    b_q = tl.load(q_ptr + i_s * stride_qs + (i_h * G + o_g[None, :]) * stride_qh + o_d[:, None], mask=m_g[None, :],
                  other=0.0)  # [D, GP]
    b_q16 = b_q.to(tl.float16)
    b_qf = b_q.to(tl.float32)
    s_q = tl.max(tl.abs(b_qf), axis=0) / 32512.0  # [GP]
    s_q = tl.where(s_q > 0.0, s_q, 1.0)
    q_int = tl.floor(b_qf / s_q[None, :] + 0.5).to(tl.int32)
    q_hi = (q_int + 128) >> 8
    q_lo = (q_int - (q_hi << 8)).to(tl.int8)
    q_hi = q_hi.to(tl.int8)
    p_bt = block_table_ptr + i_s * stride_bt
    # PARTS: running max (base 2) and sum of 2^(score - max) per page slot of the tile and query head, combined
    # across the slots once after the loop (elementwise in the loop: no shuffles per tile)
    b_m = tl.full([TP, GP], float("-inf"), tl.float32)
    b_l = tl.zeros([TP, GP], dtype=tl.float32)
    # Triton's software pipeliner issues the loads of the next STAGES - 1 tiles into shared memory (cp.async)
    # while this one is computed; the block-table entries go one stage earlier than the summaries they locate
    for i_t in tl.range(i_p, n_live, NPROG, num_stages=STAGES):
        o_j = i_t * TP + o_tp
        live = o_j < n_complete
        block = tl.load(p_bt + o_j // PPB, mask=live, other=0).to(tl.int64)
        b_v8, b_c, b_mu, s_b, s_c = _colwise8_tile_loads(basis_ptr, coeffs_ptr, centroid_ptr, basis_scale_ptr,
                                                         coeffs_scale_ptr, block, o_j, live, i_h, H, B, D, R, RP, KP,
                                                         PPB, TP)
        b_score = _colwise8_tile_lse(b_v8, b_c, b_mu, s_b, s_c, live, b_q16, q_hi, q_lo, s_q, scale, TP, RP, KP, GP,
                                     HALF, PTX, SHIFT)  # [TP, GP] base 2
        tl.store(p_out + o_j[:, None], b_score * 0.6931471805599453, mask=(o_j[:, None] < PMAX) & m_g[None, :])
        if PARTS:
            m_new = tl.maximum(b_m, b_score)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            b_l = b_l * tl.exp2(b_m - m_ref) + tl.exp2(b_score - m_ref)
            b_m = m_new
    if PARTS:
        m_all = tl.max(b_m, axis=0)  # [GP]
        m_ref = tl.where(m_all == float("-inf"), 0.0, m_all)
        l_all = tl.sum(b_l * tl.exp2(b_m - m_ref[None, :]), axis=0)
        # natural log: exp(s - m) = 2^(s2 - m2) with s = s2 ln 2
        p_part = part_ptr + ((i_s * H + i_h) * G + o_g) * (NPROG * 2) + i_p * 2  # [GP]
        tl.store(p_part, m_all * 0.6931471805599453, mask=m_g)
        tl.store(p_part + 1, l_all, mask=m_g)


def score_colwise8_persistent(q, store, block_table, seq_lens, page_size, block_size, scale, out, tile_pages,
                              num_warps, half, programs_per_sm, stages, ptx, shift=False, max_registers=None,
                              lse_partials=False):
    """The ``colwise8`` scores of ``score_pages`` from the persistent grid; arguments as ``score_pages`` (already
    checked there), ``half`` for the ``halft`` path (else ``dot1t``), ``programs_per_sm`` programs per SM,
    ``stages`` tiles in flight per program (1: no pipelining), ``shift`` the log-sum-exp shifted by the centroid's
    logit (``_colwise8_tile_lse``), ``max_registers`` a cap on the registers a thread (None: the compiler's choice;
    ``score_tuning.register_cap`` gives the cap at which ``programs_per_sm`` programs fit an SM), ``lse_partials``
    each program's log-sum-exp partials over the pages it scored (registers capped at ``register_cap`` unless
    ``max_registers`` says otherwise). Returns ``out`` fp32 `[S, HQ, Pmax]`, and with
    ``lse_partials`` also fp32 `[S, HQ, NPROG, 2]`: per query head and program, the largest score ``m`` of the
    program's pages (natural log, ``-inf`` for none) and ``sum exp(score - m)`` over them (0 for none); the programs'
    pages are disjoint and cover every complete page, so ``logsumexp(scores) = log sum_n l_n exp(m_n - max m)
    + max m`` (what ``select_pages(lse_partials=...)`` reads instead of its own pass over the scores)."""
    seqs, num_q_heads, dim = q.shape
    heads = store.centroid.shape[1]
    rank = store.coeffs.shape[-1]
    ppb = block_size // page_size
    pmax = block_table.shape[1] * ppb
    groups = num_q_heads // heads
    nprog = programs_per_head(seqs, heads, triton.cdiv(pmax, tile_pages), programs_per_sm, q.device)
    if lse_partials and max_registers is None:
        # the running sums take registers (dot1tc, G = 16: 166 uncapped, 3 programs an SM; 128 capped, no spills)
        max_registers = register_cap(programs_per_sm, num_warps)
    parts = torch.empty(seqs, num_q_heads, nprog, 2, dtype=torch.float32, device=q.device) if lse_partials else None
    _score_pages_persistent_kernel[(nprog, heads, seqs)](
        q,
        store.centroid,
        store.basis,
        store.coeffs,
        store.basis_scale,
        store.coeffs_scale,
        block_table,
        seq_lens,
        out,
        out if parts is None else parts,
        q.stride(0),
        q.stride(1),
        block_table.stride(0),
        out.stride(0),
        out.stride(1),
        scale,
        heads,
        pmax,
        nprog,
        B=page_size,
        D=dim,
        R=rank,
        RP=triton.next_power_of_2(rank),
        KP=max(16, triton.next_power_of_2(rank)),
        G=groups,
        GP=max(2, triton.next_power_of_2(groups)),
        PPB=ppb,
        TP=tile_pages,
        HALF=half,
        PTX=ptx,
        STAGES=stages,
        SHIFT=shift,
        PARTS=lse_partials,
        num_warps=num_warps,
        maxnreg=max_registers,
    )
    return (out, parts) if lse_partials else out
