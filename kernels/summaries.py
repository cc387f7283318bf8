"""Stage 1 in Triton: page summaries (centroid, page-local rank-r basis, coefficients), written in place.

Same math and storage formats as ``locks_engine/ops/summaries.py`` (the contract), in fp32 instead of fp64:
centroid, centered keys ``K_c``, Gram ``K_c K_c^T`` `[B, B]`, its eigenvectors by parallel Jacobi
(``locks_kernels.eigh``), basis rows ``u_k^T K_c / |u_k^T K_c|`` for the ``r`` largest eigenvalues (rows with
an eigenvalue under ``1e-6`` of the largest are zero: fp32 cannot tell them from rounding), then for the
quantized formats an int4 basis (``chanlog``: one log2-coded scale per channel,
``2 ** (ceil(4 log2(amax / 7)) / 4)`` computed in fp32) or an int8 one (``colwise8``: one scale per direction),
least-squares coefficients against the stored basis through its pseudo-inverse (Newton-Schulz) and int8
coefficients. One program summarizes one page of one KV head.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from locks_engine.config import LocksConfig
from locks_engine.ops.paging import pages_per_block
from locks_engine.ops.summaries import PageSummaries, allocate_page_summaries
from locks_kernels.eigh import jacobi_eigh, sort_eigh_desc

FORMAT_CODES = {"float": 0, "paper": 1, "colwise": 2, "chanlog": 3, "colwise8": 4}
MODE_KEYS, MODE_ALL, MODE_LAST = 0, 1, 2


@triton.jit
def _round_half_even(x):
    r = tl.floor(x + 0.5)
    odd = (r - 2.0 * tl.floor(0.5 * r)) != 0.0
    return tl.where(((r - x) == 0.5) & odd, r - 1.0, r)


@triton.jit
def _quantize(x, amax, QMAX: tl.constexpr):
    """Symmetric quantization as ``ops.quant.quantize_symmetric``: ``(q as fp32, fp16 scale as fp32)``."""
    scale = tl.minimum(amax / QMAX, 65504.0).to(tl.float16).to(tl.float32)
    q = _round_half_even(x / tl.maximum(scale, 1.1754943508222875e-38))
    return tl.minimum(tl.maximum(q, -QMAX), QMAX), scale


@triton.jit
def _summarize_page(
    k_ptr, centroid_ptr, basis_ptr, coeffs_ptr, centroid_scale_ptr, basis_scale_ptr, coeffs_scale_ptr,
    stride_kt, ph,
    B: tl.constexpr, D: tl.constexpr, R: tl.constexpr, FMT: tl.constexpr, MAX_SWEEPS: tl.constexpr,
    GATHER: tl.constexpr,
):
    idx = tl.arange(0, B)
    o_d = tl.arange(0, D)
    b_k = tl.load(k_ptr + idx[:, None] * stride_kt + o_d[None, :]).to(tl.float32)  # [B, D]
    b_mu = tl.sum(b_k, axis=0) / B
    if FMT == 0:
        tl.store(centroid_ptr + ph * D + o_d, b_mu)
    elif FMT == 1:
        q_mu, s_mu = _quantize(b_mu, tl.max(tl.abs(b_mu), axis=0), 127)
        tl.store(centroid_ptr + ph * D + o_d, q_mu.to(tl.int8))
        tl.store(centroid_scale_ptr + ph, s_mu.to(tl.float16))
        b_mu = q_mu * s_mu
    else:
        tl.store(centroid_ptr + ph * D + o_d, b_mu.to(tl.float16))
        b_mu = b_mu.to(tl.float16).to(tl.float32)
    b_kc = b_k - b_mu[None, :]  # [B, D]
    gram = tl.dot(b_kc, tl.trans(b_kc), input_precision="ieee")  # [B, B]
    # off-diagonal energy 1e-10 of the total: eigenvectors to ~1e-5, far finer than the int4 basis
    lam, U = jacobi_eigh(gram, B, MAX_SWEEPS, 1e-10, GATHER)
    lam, U = sort_eigh_desc(lam, U, B)
    b_w = tl.dot(tl.trans(U), b_kc, input_precision="ieee")  # [B, D]: row k = u_k^T K_c, norm sqrt(lam_k)
    norm = tl.sqrt(tl.sum(b_w * b_w, axis=1))
    keep = (idx < R) & (lam > 1e-6 * tl.max(lam, axis=0)) & (norm > 0.0)
    b_v = tl.where(keep[:, None], b_w / tl.where(keep, norm, 1.0)[:, None], 0.0)  # [B, D], rows >= r zero
    row_r = idx[:, None] < R
    p_coeffs = coeffs_ptr + ph * B * R + idx[:, None] * R + idx[None, :]  # [B tokens, B directions]
    m_coeffs = idx[None, :] < R
    if FMT == 0:
        tl.store(basis_ptr + ph * R * D + idx[:, None] * D + o_d[None, :], b_v, mask=row_r)
        tl.store(p_coeffs, tl.dot(b_kc, tl.trans(b_v), input_precision="ieee"), mask=m_coeffs)
    else:
        if FMT == 1:
            q_v, s_v = _quantize(b_v, tl.max(tl.max(tl.abs(b_v), axis=1), axis=0), 7)
            tl.store(basis_scale_ptr + ph, s_v.to(tl.float16))
            b_vq = q_v * s_v
        elif FMT == 3:
            # one scale per channel as a log2 code, 2 ** (code / 4), rounded up: no entry clips
            amax = tl.max(tl.abs(b_v), axis=0)  # [D]; rows >= r are zero
            code = tl.ceil(4.0 * tl.log2(tl.maximum(amax / 7.0, 9.094947017729282e-13)))
            code = tl.minimum(tl.maximum(code, -127.0), 127.0)
            s_v = tl.exp2(code * 0.25)
            q_v = tl.minimum(tl.maximum(_round_half_even(b_v / s_v[None, :]), -7.0), 7.0)
            tl.store(basis_scale_ptr + ph * D + o_d, code.to(tl.int8))
            b_vq = q_v * s_v[None, :]
        else:
            q_v, s_v = _quantize(b_v, tl.max(tl.abs(b_v), axis=1)[:, None], 127 if FMT == 4 else 7)
            tl.store(basis_scale_ptr + ph * R + idx[:, None], s_v.to(tl.float16), mask=row_r)
            b_vq = q_v * s_v
        if FMT == 4:
            tl.store(basis_ptr + ph * R * D + idx[:, None] * D + o_d[None, :], q_v.to(tl.int8), mask=row_r)
        else:
            lo, hi = tl.split(tl.reshape((q_v + 8.0).to(tl.int32), (B, D // 2, 2)))
            o_dh = tl.arange(0, D // 2)
            tl.store(basis_ptr + ph * R * (D // 2) + idx[:, None] * (D // 2) + o_dh[None, :],
                     (lo | (hi << 4)).to(tl.uint8), mask=row_r)
        # least squares against the stored basis: c = K_c Vq^T (Vq Vq^T)^+, the pseudo-inverse by Newton-Schulz
        # (X <- 2X - X G X from X = G / |G|_inf^2, Ben-Israel & Cohen 1966): G is near identity on the kept
        # rows (rounded orthonormal rows) and zero elsewhere, so the error (1 - lam x)^(2^k) vanishes in 8 steps
        gram = tl.dot(b_vq, tl.trans(b_vq), input_precision="ieee")  # [B, B]
        g_inf = tl.max(tl.sum(tl.abs(gram), axis=1), axis=0)
        pinv = gram / tl.maximum(g_inf * g_inf, 1e-30)
        for _ in tl.static_range(8):
            pinv = 2.0 * pinv - tl.dot(tl.dot(pinv, gram, input_precision="ieee"), pinv, input_precision="ieee")
        b_c = tl.dot(tl.dot(b_kc, tl.trans(b_vq), input_precision="ieee"), pinv, input_precision="ieee")
        if FMT == 1:
            q_c, s_c = _quantize(b_c, tl.max(tl.max(tl.abs(b_c), axis=1), axis=0), 127)
            tl.store(coeffs_scale_ptr + ph, s_c.to(tl.float16))
        else:
            q_c, s_c = _quantize(b_c, tl.max(tl.abs(b_c), axis=0)[None, :], 127)
            tl.store(coeffs_scale_ptr + ph * R + idx[None, :], s_c.to(tl.float16), mask=idx[None, :] < R)
        tl.store(p_coeffs, q_c.to(tl.int8), mask=m_coeffs)


@triton.jit
def _build_summaries_kernel(
    k_ptr, block_table_ptr, seq_lens_ptr,
    centroid_ptr, basis_ptr, coeffs_ptr, centroid_scale_ptr, basis_scale_ptr, coeffs_scale_ptr,
    stride_kb, stride_kt, stride_kh, stride_bt, H,
    B: tl.constexpr, D: tl.constexpr, R: tl.constexpr, PPB: tl.constexpr, FMT: tl.constexpr,
    MODE: tl.constexpr, MAX_SWEEPS: tl.constexpr, GATHER: tl.constexpr,
):
    # grids: (P, 1, H) pages of a keys tensor; (Pmax, S, H) every page slot; (S, 1, H) one page per sequence
    i_0, i_1, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if MODE == 0:
        block, offset, page, active = i_0.to(tl.int64), 0, i_0.to(tl.int64), True
    else:
        i_s = (i_1 if MODE == 1 else i_0).to(tl.int64)
        seq_len = tl.load(seq_lens_ptr + i_s)
        if MODE == 1:
            j, active = i_0, i_0 < seq_len // B
        else:
            # the page completed by this step's token (decode): only when the token filled it
            j, active = seq_len // B - 1, (seq_len % B == 0) & (seq_len >= B)
        block = tl.load(block_table_ptr + i_s * stride_bt + j // PPB, mask=active, other=0).to(tl.int64)
        offset = (j % PPB) * B
        page = block * PPB + j % PPB
    if active:
        _summarize_page(
            k_ptr + block * stride_kb + offset * stride_kt + i_h * stride_kh,
            centroid_ptr, basis_ptr, coeffs_ptr, centroid_scale_ptr, basis_scale_ptr, coeffs_scale_ptr,
            stride_kt, page * H + i_h, B, D, R, FMT, MAX_SWEEPS, GATHER,
        )


def _launch(k: Tensor, block_table: Tensor | None, seq_lens: Tensor | None, store: PageSummaries,
            cfg: LocksConfig, mode: int, grid: tuple[int, int, int], ppb: int, num_warps: int,
            gather: bool = True) -> None:
    heads, dim = k.shape[2], k.shape[3]
    assert cfg.page_size >= 16 and cfg.page_size & (cfg.page_size - 1) == 0, "kernels need B a power of two >= 16"
    assert dim >= 32 and dim & (dim - 1) == 0, f"kernels need D a power of two >= 32, got {dim}"
    assert k.stride(3) == 1, "keys must be contiguous along D"
    assert store.summary_format == cfg.summary_format, "store format differs from cfg.summary_format"
    assert all(t.is_contiguous() for t in store.tensors().values()), "summary store tensors must be contiguous"
    assert store.centroid.shape[1:] == (heads, dim) and store.coeffs.shape[2:] == (cfg.page_size, cfg.rank)
    dummy = store.centroid
    _build_summaries_kernel[grid](
        k,
        dummy if block_table is None else block_table,
        dummy if seq_lens is None else seq_lens,
        store.centroid,
        store.basis,
        store.coeffs,
        dummy if store.centroid_scale is None else store.centroid_scale,
        dummy if store.basis_scale is None else store.basis_scale,
        dummy if store.coeffs_scale is None else store.coeffs_scale,
        k.stride(0),
        k.stride(1),
        k.stride(2),
        0 if block_table is None else block_table.stride(0),
        heads,
        B=cfg.page_size,
        D=dim,
        R=cfg.rank,
        PPB=ppb,
        FMT=FORMAT_CODES[cfg.summary_format],
        MODE=mode,
        MAX_SWEEPS=8,
        GATHER=gather,
        num_warps=num_warps,
    )


def build_page_summaries(keys: Tensor, cfg: LocksConfig, out: PageSummaries | None = None,
                         num_warps: int = 2, gather: bool = True) -> PageSummaries:
    """Summarize complete pages of keys (paper Section 3.1; formats of ``locks_engine.ops.summaries``).

    Args:
        keys (Tensor): post-RoPE keys of shape `[P, B, H, D]`, any float dtype, contiguous along ``D``;
            ``B`` and ``D`` powers of two, ``B >= 16``, ``D >= 32``.
        cfg (LocksConfig): page size ``B``, rank ``r`` and ``summary_format``.
        out (PageSummaries | None): store of at least ``P`` pages written in place (pages ``0..P-1``).
        num_warps (int): warps per program (tuning only).
        gather (bool): Jacobi rotations elementwise with gathered partners, else as matrix products
            (``locks_kernels.eigh.jacobi_eigh``; tuning only).
    Returns:
        PageSummaries: ``out`` or a new store of ``P`` pages, computed in fp32 (the ops twin uses fp64).
    Raises:
        ValueError: when ``keys.shape[1] != cfg.page_size`` or an int4 format meets an odd head dim.
        AssertionError: on sizes or layouts the kernel does not take.
    """
    if keys.dim() != 4 or keys.shape[1] != cfg.page_size:
        raise ValueError(f"keys must have shape [P, {cfg.page_size}, H, D], got {list(keys.shape)}")
    if out is None:
        out = allocate_page_summaries(keys.shape[0], keys.shape[2], keys.shape[3], cfg, keys.device)
    assert out.num_pages >= keys.shape[0], "out holds fewer pages than keys"
    if keys.shape[0]:
        _launch(keys, None, None, out, cfg, MODE_KEYS, (keys.shape[0], 1, keys.shape[2]), 1, num_warps, gather)
    return out


def build_cache_summaries(k_cache: Tensor, block_table: Tensor, seq_lens: Tensor, cfg: LocksConfig,
                          store: PageSummaries | None = None, num_warps: int = 2) -> PageSummaries:
    """Summarize every complete page of every sequence of a paged cache into a store by physical page id
    (prefill; one program per logical page slot and KV head, slots past a sequence's complete pages exit).

    Args:
        k_cache (Tensor): `[num_blocks, block_size, H, D]`, any strides with ``D`` contiguous.
        block_table (Tensor): `[S, max_blocks]` int32; seq_lens (Tensor): `[S]` int32 tokens.
        store (PageSummaries | None): written in place when given, else allocated for every physical page.
        num_warps (int): warps per program (tuning only).
    Returns:
        PageSummaries: the store.
    Raises:
        ValueError: when ``B`` does not divide the block size.
    """
    ppb = pages_per_block(k_cache, cfg.page_size)
    if store is None:
        store = allocate_page_summaries(k_cache.shape[0] * ppb, k_cache.shape[2], k_cache.shape[3], cfg,
                                        k_cache.device)
    grid = (block_table.shape[1] * ppb, block_table.shape[0], k_cache.shape[2])
    _launch(k_cache, block_table, seq_lens, store, cfg, MODE_ALL, grid, ppb, num_warps)
    return store


def build_completed_page_summaries(k_cache: Tensor, block_table: Tensor, seq_lens: Tensor, store: PageSummaries,
                                   cfg: LocksConfig, num_warps: int = 2) -> PageSummaries:
    """Decode step: summarize the page that this step's token completed, for each sequence where it did
    (``seq_len % B == 0``); other sequences launch a program that exits at once. Fixed grid `[S, 1, H]`:
    capturable in a CUDA graph.

    Args:
        k_cache (Tensor): `[num_blocks, block_size, H, D]` holding this step's keys.
        block_table (Tensor): `[S, max_blocks]` int32; seq_lens (Tensor): `[S]` int32, this step's token included.
        store (PageSummaries): summaries by physical page id, written in place.
        cfg (LocksConfig): page size, rank, format.
        num_warps (int): warps per program (tuning only).
    Returns:
        PageSummaries: ``store``.
    Raises:
        ValueError: when ``B`` does not divide the block size.
    """
    ppb = pages_per_block(k_cache, cfg.page_size)
    grid = (block_table.shape[0], 1, k_cache.shape[2])
    _launch(k_cache, block_table, seq_lens, store, cfg, MODE_LAST, grid, ppb, num_warps)
    return store
