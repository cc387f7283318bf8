"""Stage 2 in Triton: estimated log attention mass of every page from its ``colwise8`` summary (paper Section 3.2,
Eq. 2).

A persistent grid: ``NPROG`` programs per (KV head, sequence) walk the tiles of ``TP`` pages ``i_p, i_p + NPROG,
...`` and keep the next tile's loads in flight while they compute the current one (Triton's software pipeliner:
cp.async copies into shared memory, ``STAGES`` tiles deep). Each program scores its pages for all ``G`` query heads
of the group, so each summary is read once per group. Per tile: ``q . mu`` in fp16 (a bf16 query and an fp16
centroid are exact there); ``V q`` on the int8 matrix units against the query as a 16-bit fixed-point pair per head
(error at most ``max|q| / 65024`` per entry), or with ``HALF`` the int8 basis converted to fp16 against the fp16
query; ``V q`` rounded to fp16 once (2^-11 relative, under the int8 rounding of the coefficients); the ``B x r``
contraction as ``[G, r] x [r, B]`` per page, so that the log-sum-exp over the ``B`` tokens runs along the product's
N; the log-sum-exp in base 2, shifted by the centroid's logit. The kernel is bound by instruction issue, not bytes
(``NOTES.md``): its inline PTX (``_log2_fast``, ``_int8_to_fp16``) replaces Triton's polynomial ``log2`` and the
quarter-rate int8 -> fp16 conversion. The launch shape comes from :data:`TUNING`, by GQA group size.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _log2_fast(x, PTX: tl.constexpr):
    """``log2`` of fp32 ``x``: ``lg2.approx.f32`` (one MUFU.LG2, absolute error ~2^-22) with ``PTX``, else
    ``tl.log2`` (a polynomial with a branch; what the interpreter, which runs no assembly, takes)."""
    if PTX:
        return tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        return tl.log2(x)


@triton.jit
def _int8_to_fp16(x, PTX: tl.constexpr):
    """int8 -> fp16 (exact). With ``PTX`` four at a time as ``(0x6400 | (x + 128)) - 1152`` read as fp16 (one xor,
    two byte permutes and two fp16x2 subtractions for four entries, no quarter-rate I2F); else ``.to``."""
    if PTX:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t, m; xor.b32 t, $2, 0x80808080; mov.b32 m, 0x64806480; "
            "prmt.b32 $0, t, 0x64646464, 0x4140; prmt.b32 $1, t, 0x64646464, 0x4342; "
            "sub.f16x2 $0, $0, m; sub.f16x2 $1, $1, m; }",
            "=r,=r,r", [x], dtype=tl.float16, is_pure=True, pack=4)
    else:
        return x.to(tl.float16)


@triton.jit
def _tile_loads(basis_ptr, coeffs_ptr, centroid_ptr, basis_scale_ptr, coeffs_scale_ptr, block, o_j, live, i_h, H,
                B: tl.constexpr, D: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, KP: tl.constexpr,
                PPB: tl.constexpr, TP: tl.constexpr):
    """Issue the loads of one tile (``block`` `[TP]` int64 physical blocks of logical pages ``o_j``); nothing
    waits on them here. Returns the basis int8 `[TP * RP, D]`, coefficients int8 `[TP, KP, B]` (transposed),
    centroids `[TP, D]` and the two fp16 scale tensors `[TP, RP]`."""
    o_d = tl.arange(0, D)
    o_r = tl.arange(0, RP)
    o_k = tl.arange(0, KP)
    o_b = tl.arange(0, B)
    ph = (block * PPB + o_j % PPB) * H + i_h  # [TP] page-head index into the summaries
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
def _tile_lse(b_v8, b_c, b_mu, s_b, s_c, live, b_q16, q_hi, q_lo, s_q, scale, TP: tl.constexpr, RP: tl.constexpr,
              KP: tl.constexpr, GP: tl.constexpr, HALF: tl.constexpr, PTX: tl.constexpr):
    """Scores `[TP, GP]` in base 2 (``log2`` of the mass, ``-inf`` where not ``live``) of one loaded tile.

    The log-sum-exp is shifted by the centroid's logit instead of the page's largest, ``lse = q . mu +
    log2 sum_i 2^(c_i . V q)`` (base 2, scaled): the coefficients of a page are centered (``sum_i c_i = 0`` up to
    their int8 rounding), so the largest exponent is >= ~0 and the sum cannot underflow; exponents are clamped at
    120 (a token 83 nats above its page's centroid logit), so 16 terms cannot overflow. No max reduction, no
    per-logit add of ``q . mu``, the scale folded into ``V q``."""
    log2e: tl.constexpr = 1.4426950408889634
    s_w = s_b.to(tl.float32) * s_c.to(tl.float32)  # [TP, RP]
    s_w = s_w * (scale * log2e)
    qmu = tl.dot(b_mu.to(tl.float16), b_q16)  # [TP, GP]
    if HALF:
        w_f = tl.dot(_int8_to_fp16(b_v8, PTX), b_q16)  # [TP * RP, GP] fp32
        b_w = tl.reshape(w_f, [TP, RP, GP]) * s_w[:, :, None]
    else:
        w_int = 256 * tl.dot(b_v8, q_hi) + tl.dot(b_v8, q_lo)  # [TP * RP, GP], exact
        b_w = tl.reshape(w_int.to(tl.float32) * s_q[None, :], [TP, RP, GP]) * s_w[:, :, None]
    if KP > RP:
        # zero rows up to the 16 that a matrix-unit product needs along the direction axis
        o_f = tl.arange(0, KP // RP)
        b_w = tl.reshape(tl.where((o_f == 0)[None, :, None, None], b_w[:, None, :, :], 0.0), [TP, KP, GP])
    b_logit = tl.dot(tl.permute(b_w.to(tl.float16), (0, 2, 1)), _int8_to_fp16(b_c, PTX))  # [TP, GP, B]
    b_sum = tl.sum(tl.exp2(tl.minimum(b_logit, 120.0)), axis=2)
    b_lse = qmu * (scale * log2e) + _log2_fast(b_sum, PTX)
    return tl.where(live[:, None], b_lse, float("-inf"))


@triton.jit
def _score_pages_kernel(
    q_ptr, centroid_ptr, basis_ptr, coeffs_ptr, basis_scale_ptr, coeffs_scale_ptr, block_table_ptr, seq_lens_ptr,
    out_ptr, tiles_ptr, live_ptr,
    stride_qs, stride_qh, stride_bt, stride_os, stride_oh, stride_ts, stride_th,
    scale, H, PMAX, NPROG,
    B: tl.constexpr, D: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, KP: tl.constexpr, G: tl.constexpr,
    GP: tl.constexpr, PPB: tl.constexpr, TP: tl.constexpr, HALF: tl.constexpr, PTX: tl.constexpr,
    STAGES: tl.constexpr, LIST: tl.constexpr, LIVE: tl.constexpr,
):
    i_p, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    o_tp = tl.arange(0, TP)
    o_g = tl.arange(0, GP)
    o_d = tl.arange(0, D)
    m_g = o_g < G
    p_out = out_ptr + i_s * stride_os + (i_h * G + o_g[None, :]) * stride_oh  # [1, GP]
    n_complete = tl.load(seq_lens_ptr + i_s) // B
    n_tiles = tl.cdiv(PMAX, TP)
    if LIST:
        # slot tile i scores the pages of superpage tiles[s, h, i] (-1: none): every slot tile is walked
        n_live = n_tiles
        if LIVE:
            # only the first live_ptr[0] slot tiles are listed (a per-layer count, read on the device)
            n_live = tl.minimum(tl.load(live_ptr), n_tiles)
    else:
        n_live = tl.cdiv(n_complete, TP)
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
    # Triton's software pipeliner issues the loads of the next STAGES - 1 tiles into shared memory (cp.async)
    # while this one is computed; the block-table entries go one stage earlier than the summaries they locate
    for i_t in tl.range(i_p, n_live, NPROG, num_stages=STAGES):
        o_slot = i_t * TP + o_tp
        if LIST:
            tile = tl.load(tiles_ptr + i_s * stride_ts + i_h * stride_th + i_t)
            o_j = tile * TP + o_tp
            live = (tile >= 0) & (o_j < n_complete)
        else:
            o_j = o_slot
            live = o_j < n_complete
        block = tl.load(p_bt + o_j // PPB, mask=live, other=0).to(tl.int64)
        b_v8, b_c, b_mu, s_b, s_c = _tile_loads(basis_ptr, coeffs_ptr, centroid_ptr, basis_scale_ptr,
                                                coeffs_scale_ptr, block, o_j, live, i_h, H, B, D, R, RP, KP, PPB, TP)
        b_score = _tile_lse(b_v8, b_c, b_mu, s_b, s_c, live, b_q16, q_hi, q_lo, s_q, scale, TP, RP, KP, GP, HALF,
                            PTX)  # [TP, GP] base 2
        tl.store(p_out + o_slot[:, None], b_score * 0.6931471805599453,
                 mask=(o_slot[:, None] < PMAX) & m_g[None, :])


#: launch shape by GQA group size, ``G <= 4`` and ``G > 4``: ``(HALF, tile_pages, num_warps, stages,
#: programs_per_sm)``. Small groups take ``V q`` as one fp16 product (fewer instructions than the fixed-point pair
#: when few query heads share the basis) and fit 5 programs an SM; large groups the int8 pair, 4 programs an SM.
TUNING = {True: (True, 16, 4, 2, 5), False: (False, 16, 4, 2, 4)}


def _programs_per_head(seqs: int, heads: int, tiles: int, programs_per_sm: int, device: torch.device) -> int:
    """``NPROG``, the programs per (KV head, sequence): ``programs_per_sm`` for each SM of the device (4 SMs without
    a GPU, for the interpreter) shared over ``seqs * heads``, rounded down (no more programs than fit at once), at
    least 1 (a program then walks every tile of its (KV head, sequence)) and at most ``tiles``."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, min(tiles, sms * programs_per_sm // (seqs * heads)))


def _score_fwd(q, summaries, block_table, seq_lens, page_size, block_size, scale, out, tiles, live_tiles=None):
    centroid, basis, coeffs, basis_scale, coeffs_scale = summaries
    seqs, num_q_heads, dim = q.shape
    heads, rank = centroid.shape[1], coeffs.shape[-1]
    assert num_q_heads % heads == 0, f"HQ={num_q_heads} is not a multiple of H={heads}"
    assert block_size % page_size == 0, f"page_size={page_size} must divide block_size={block_size}"
    assert coeffs.shape[-2] == page_size and centroid.shape[-1] == dim, "summaries do not match q / B"
    assert basis.dtype == torch.int8 and coeffs.dtype == torch.int8, "colwise8 summaries: int8 basis and coeffs"
    assert dim >= 32 and dim & (dim - 1) == 0, f"kernels need D a power of two >= 32, got {dim}"
    assert q.stride(-1) == 1, "q must be contiguous along D"
    assert all(t.is_contiguous() for t in summaries), "summary tensors must be contiguous"
    ppb = block_size // page_size
    half, tile_pages, num_warps, stages, programs_per_sm = TUNING[num_q_heads // heads <= 4]
    if tiles is None:
        pmax = block_table.shape[1] * ppb
    else:
        assert tiles.shape[:2] == (seqs, heads) and tiles.stride(-1) == 1, "tiles must be [S, H, M], contiguous"
        assert tile_pages == 16, "a listed tile is a superpage of 16 pages"
        pmax = tiles.shape[-1] * tile_pages
    if live_tiles is not None:
        assert tiles is not None, "live_tiles counts listed tiles: pass tiles"
        assert live_tiles.dtype == torch.int32 and live_tiles.numel() == 1, "live_tiles: int32 [1]"
    groups = num_q_heads // heads
    if out is None:
        out = torch.empty(seqs, num_q_heads, pmax, dtype=torch.float32, device=q.device)
    assert out.shape == (seqs, num_q_heads, pmax) and out.dtype == torch.float32 and out.stride(-1) == 1
    nprog = _programs_per_head(seqs, heads, triton.cdiv(pmax, tile_pages), programs_per_sm, q.device)
    _score_pages_kernel[(nprog, heads, seqs)](
        q,
        centroid,
        basis,
        coeffs,
        basis_scale,
        coeffs_scale,
        block_table,
        seq_lens,
        out,
        out if tiles is None else tiles,
        out if live_tiles is None else live_tiles,
        q.stride(0),
        q.stride(1),
        block_table.stride(0),
        out.stride(0),
        out.stride(1),
        0 if tiles is None else tiles.stride(0),
        0 if tiles is None else tiles.stride(1),
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
        # the interpreter runs no inline assembly
        PTX=isinstance(_score_pages_kernel, triton.runtime.JITFunction),
        STAGES=stages,
        LIST=tiles is not None,
        LIVE=live_tiles is not None,
        num_warps=num_warps,
    )
    return out


def score_pages(
    q: Tensor,
    summaries: tuple[Tensor, ...],
    block_table: Tensor,
    seq_lens: Tensor,
    page_size: int,
    block_size: int,
    scale: float | None = None,
    out: Tensor | None = None,
    tiles: Tensor | None = None,
    live_tiles: Tensor | None = None,
) -> Tensor:
    """Estimated log attention mass of each page, reading only its summary (paper Section 3.2, Eq. 2).

    ``s_j(q) = logsumexp_{i in page j} (scale * (q . mu_j + (V_j q) . c_i))``, as ``locks_engine.ops.score_pages``
    on ``colwise8`` summaries.

    Args:
        q (Tensor): decode queries `[S, HQ, D]`, fp32, bf16 or fp16, contiguous along ``D``; ``D`` a power of two
            >= 32. ``q . mu`` is multiplied in fp16 (an fp32 query is rounded to 11 bits), ``V q`` with ``q`` as a
            16-bit fixed-point pair per head (``G > 4``) or in fp16 (``G <= 4``), then rounded to fp16.
        summaries (tuple): the colwise8 tuple by physical page id, contiguous: ``(centroid [P, H, D] fp16,
            basis [P, H, r, D] int8, coeffs [P, H, B, r] int8, basis_scale [P, H, r, 1] fp16,
            coeffs_scale [P, H, 1, r] fp16)``.
        block_table (Tensor): `[S, max_blocks]` int32 physical block ids.
        seq_lens (Tensor): `[S]` int32 tokens.
        page_size (int): B, tokens a page.
        block_size (int): tokens per KV cache block (a multiple of B).
        scale (float | None): softmax scale, default ``D ** -0.5``.
        out (Tensor | None): fp32 `[S, HQ, Pmax]` written in place (fixed address for CUDA graphs).
        tiles (Tensor | None): int `[S, H, M]` superpages (tiles of 16 pages) to score per KV head, ``-1``
            unused (the two-level selection's second level, ``superpages.py``); None scores every page.
        live_tiles (Tensor | None): with ``tiles``, int32 `[1]` on the device: only the first ``live_tiles[0]``
            slot tiles are listed (the rest are written ``-inf`` unread, as unused tiles). None: all ``M``.
    Returns:
        Tensor: fp32 `[S, HQ, Pmax]` (natural log), ``Pmax = max_blocks * block_size // B``; ``-inf`` for pages
        that are not complete or past the sequence. Reads ``S * H * P_complete`` summaries once each. With
        ``tiles``: `[S, HQ, 16 M]`, slot ``16 i + j`` scoring page ``16 tiles[s, h, i] + j`` (``-inf`` for unused
        tiles and pages that are not complete); reads only those pages' summaries.
    Raises:
        AssertionError: on shapes, strides or dtypes the kernel does not take.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _score_fwd(q, summaries, block_table, seq_lens, page_size, block_size, scale, out, tiles, live_tiles)
