"""Stage 1 in Triton: ``colwise8`` page summaries (centroid, page-local rank-r basis, coefficients), written in
place (paper Section 3.1).

Same math and storage as ``colwise8`` in ``locks_engine/ops/summaries.py`` (the contract), in fp32 instead of
fp64: fp16 centroid, centered keys ``K_c``, Gram ``K_c K_c^T`` `[B, B]`, its eigenvectors by parallel Jacobi
(``locks_kernels.eigh``), basis rows ``u_k^T K_c / |u_k^T K_c|`` for the ``r`` largest eigenvalues (rows with
an eigenvalue under ``1e-6`` of the largest are zero: fp32 cannot tell them from rounding), an int8 basis with one
fp16 scale per direction, least-squares coefficients against the stored basis through its pseudo-inverse
(Newton-Schulz) and int8 coefficients with one fp16 scale per direction. One program summarizes one page of one
KV head.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks_kernels.eigh import jacobi_eigh, sort_eigh_desc
from locks_kernels.superpages import SUPERPAGE_PAGES, _average_superpage

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
    k_ptr, centroid_ptr, basis_ptr, coeffs_ptr, basis_scale_ptr, coeffs_scale_ptr, stride_kt, ph,
    B: tl.constexpr, D: tl.constexpr, R: tl.constexpr, MAX_SWEEPS: tl.constexpr, GATHER: tl.constexpr,
):
    idx = tl.arange(0, B)
    o_d = tl.arange(0, D)
    b_k = tl.load(k_ptr + idx[:, None] * stride_kt + o_d[None, :]).to(tl.float32)  # [B, D]
    b_mu = tl.sum(b_k, axis=0) / B
    tl.store(centroid_ptr + ph * D + o_d, b_mu.to(tl.float16))
    b_mu = b_mu.to(tl.float16).to(tl.float32)
    b_kc = b_k - b_mu[None, :]  # [B, D]
    gram = tl.dot(b_kc, tl.trans(b_kc), input_precision="ieee")  # [B, B]
    # off-diagonal energy 1e-10 of the total: eigenvectors to ~1e-5, far finer than the int8 basis
    lam, U = jacobi_eigh(gram, B, MAX_SWEEPS, 1e-10, GATHER)
    lam, U = sort_eigh_desc(lam, U, B)
    b_w = tl.dot(tl.trans(U), b_kc, input_precision="ieee")  # [B, D]: row k = u_k^T K_c, norm sqrt(lam_k)
    norm = tl.sqrt(tl.sum(b_w * b_w, axis=1))
    keep = (idx < R) & (lam > 1e-6 * tl.max(lam, axis=0)) & (norm > 0.0)
    b_v = tl.where(keep[:, None], b_w / tl.where(keep, norm, 1.0)[:, None], 0.0)  # [B, D], rows >= r zero
    row_r = idx[:, None] < R
    p_coeffs = coeffs_ptr + ph * B * R + idx[:, None] * R + idx[None, :]  # [B tokens, B directions]
    m_coeffs = idx[None, :] < R
    q_v, s_v = _quantize(b_v, tl.max(tl.abs(b_v), axis=1)[:, None], 127)
    tl.store(basis_scale_ptr + ph * R + idx[:, None], s_v.to(tl.float16), mask=row_r)
    b_vq = q_v * s_v
    tl.store(basis_ptr + ph * R * D + idx[:, None] * D + o_d[None, :], q_v.to(tl.int8), mask=row_r)
    # least squares against the stored basis: c = K_c Vq^T (Vq Vq^T)^+, the pseudo-inverse by Newton-Schulz
    # (X <- 2X - X G X from X = G / |G|_inf^2, Ben-Israel & Cohen 1966): G is near identity on the kept
    # rows (rounded orthonormal rows) and zero elsewhere, so the error (1 - lam x)^(2^k) vanishes in 8 steps
    gram = tl.dot(b_vq, tl.trans(b_vq), input_precision="ieee")  # [B, B]
    g_inf = tl.max(tl.sum(tl.abs(gram), axis=1), axis=0)
    pinv = gram / tl.maximum(g_inf * g_inf, 1e-30)
    for _ in tl.static_range(8):
        pinv = 2.0 * pinv - tl.dot(tl.dot(pinv, gram, input_precision="ieee"), pinv, input_precision="ieee")
    b_c = tl.dot(tl.dot(b_kc, tl.trans(b_vq), input_precision="ieee"), pinv, input_precision="ieee")
    q_c, s_c = _quantize(b_c, tl.max(tl.abs(b_c), axis=0)[None, :], 127)
    tl.store(coeffs_scale_ptr + ph * R + idx[None, :], s_c.to(tl.float16), mask=idx[None, :] < R)
    tl.store(p_coeffs, q_c.to(tl.int8), mask=m_coeffs)


@triton.jit
def _build_summaries_kernel(
    k_ptr, block_table_ptr, seq_lens_ptr, centroid_ptr, basis_ptr, coeffs_ptr, basis_scale_ptr, coeffs_scale_ptr,
    superpages_ptr, stride_kb, stride_kt, stride_kh, stride_bt, H,
    B: tl.constexpr, D: tl.constexpr, R: tl.constexpr, PPB: tl.constexpr, MODE: tl.constexpr,
    MAX_SWEEPS: tl.constexpr, GATHER: tl.constexpr, SUPER: tl.constexpr, SP: tl.constexpr,
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
            centroid_ptr, basis_ptr, coeffs_ptr, basis_scale_ptr, coeffs_scale_ptr,
            stride_kt, page * H + i_h, B, D, R, MAX_SWEEPS, GATHER,
        )
        if SUPER:
            # decode: the page completed a superpage too; its centroid (just stored) is read back with the
            # other 15: one launch for both (``superpages.build_completed_superpages`` is the same, alone)
            if seq_len % (SP * B) == 0:
                tl.debug_barrier()
                _average_superpage(centroid_ptr, superpages_ptr, block_table_ptr, i_s, i_h, seq_len, stride_bt, H,
                                   B, D, SP, PPB)


def _pages_per_block(k_cache: Tensor, page_size: int) -> int:
    """``block_size // B`` of a cache `[num_blocks, block_size, H, D]`; ValueError when ``B`` does not divide it."""
    if k_cache.shape[1] % page_size:
        raise ValueError(f"page_size={page_size} must divide the KV cache block size {k_cache.shape[1]}")
    return k_cache.shape[1] // page_size


def _launch(k: Tensor, block_table: Tensor | None, seq_lens: Tensor | None, summaries: tuple[Tensor, ...],
            page_size: int, mode: int, grid: tuple[int, int, int], ppb: int, superpages: Tensor | None = None
            ) -> None:
    centroid, basis, coeffs, basis_scale, coeffs_scale = summaries
    heads, dim = k.shape[2], k.shape[3]
    rank = coeffs.shape[-1]
    assert page_size >= 16 and page_size & (page_size - 1) == 0, "kernels need B a power of two >= 16"
    assert dim >= 32 and dim & (dim - 1) == 0, f"kernels need D a power of two >= 32, got {dim}"
    assert k.stride(3) == 1, "keys must be contiguous along D"
    assert all(t.is_contiguous() for t in summaries), "summary tensors must be contiguous"
    assert basis.dtype == torch.int8 and coeffs.dtype == torch.int8, "colwise8 summaries: int8 basis and coeffs"
    assert centroid.shape[1:] == (heads, dim) and coeffs.shape[2:] == (page_size, rank)
    if superpages is not None:
        assert mode == MODE_LAST, "superpages are built with the page a decode step completes"
        assert superpages.shape == centroid.shape and superpages.dtype == torch.float16 and superpages.is_contiguous()
    _build_summaries_kernel[grid](
        k,
        centroid if block_table is None else block_table,
        centroid if seq_lens is None else seq_lens,
        centroid,
        basis,
        coeffs,
        basis_scale,
        coeffs_scale,
        centroid if superpages is None else superpages,
        k.stride(0),
        k.stride(1),
        k.stride(2),
        0 if block_table is None else block_table.stride(0),
        heads,
        B=page_size,
        D=dim,
        R=rank,
        PPB=ppb,
        SP=SUPERPAGE_PAGES,
        MODE=mode,
        MAX_SWEEPS=8,
        # Jacobi rotations elementwise with gathered partners (``locks_kernels.eigh``): fewer instructions than
        # applying them as matrix products
        GATHER=True,
        SUPER=superpages is not None,
        num_warps=2,
    )


def _allocate(num_pages: int, heads: int, dim: int, page_size: int, rank: int,
              device: torch.device) -> tuple[Tensor, ...]:
    """A zero-filled colwise8 tuple of ``num_pages`` pages (as ``locks_engine.ops.allocate_page_summaries``)."""
    shapes = (((heads, dim), torch.float16), ((heads, rank, dim), torch.int8), ((heads, page_size, rank), torch.int8),
              ((heads, rank, 1), torch.float16), ((heads, 1, rank), torch.float16))
    return tuple(torch.zeros((num_pages, *shape), dtype=dtype, device=device) for shape, dtype in shapes)


def build_page_summaries(keys: Tensor, rank: int, out: tuple[Tensor, ...] | None = None) -> tuple[Tensor, ...]:
    """Summarize complete pages of keys as ``colwise8`` (paper Section 3.1; ``locks_engine.ops.summaries``).

    Args:
        keys (Tensor): post-RoPE keys `[P, B, H, D]`, any float dtype, contiguous along ``D``; ``B`` and ``D``
            powers of two, ``B >= 16``, ``D >= 32``.
        rank (int): r, basis directions a page (1 to ``B``).
        out (tuple | None): colwise8 tuple of at least ``P`` pages written in place (pages ``0..P-1``).
    Returns:
        tuple: ``out`` or a new colwise8 tuple of ``P`` pages, ``(centroid [P, H, D] fp16, basis [P, H, r, D]
        int8, coeffs [P, H, B, r] int8, basis_scale [P, H, r, 1] fp16, coeffs_scale [P, H, 1, r] fp16)``,
        computed in fp32 (the ops twin uses fp64).
    Raises:
        ValueError: when ``keys`` is not 4-dimensional.
        AssertionError: on sizes or layouts the kernel does not take.
    """
    if keys.dim() != 4:
        raise ValueError(f"keys must have shape [P, B, H, D], got {list(keys.shape)}")
    num_pages, page_size, heads, dim = keys.shape
    if out is None:
        out = _allocate(num_pages, heads, dim, page_size, rank, keys.device)
    assert out[0].shape[0] >= num_pages, "out holds fewer pages than keys"
    if num_pages:
        _launch(keys, None, None, out, page_size, MODE_KEYS, (num_pages, 1, heads), 1)
    return out


def build_cache_summaries(k_cache: Tensor, block_table: Tensor, seq_lens: Tensor, summaries: tuple[Tensor, ...],
                          page_size: int) -> None:
    """Summarize every complete page of every sequence of a paged cache into ``summaries``, by physical page id
    (prefill; one program per logical page slot and KV head, slots past a sequence's complete pages exit).

    Args:
        k_cache (Tensor): `[num_blocks, block_size, H, D]`, any strides with ``D`` contiguous.
        block_table (Tensor): `[S, max_blocks]` int32 physical block ids.
        seq_lens (Tensor): `[S]` int32 tokens.
        summaries (tuple): colwise8 tuple of ``num_blocks * block_size // B`` pages, written in place.
        page_size (int): B, tokens a page.
    Raises:
        ValueError: when ``B`` does not divide the block size.
        AssertionError: on sizes or layouts the kernel does not take.
    """
    ppb = _pages_per_block(k_cache, page_size)
    grid = (block_table.shape[1] * ppb, block_table.shape[0], k_cache.shape[2])
    _launch(k_cache, block_table, seq_lens, summaries, page_size, MODE_ALL, grid, ppb)


def build_completed_page_summaries(k_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
                                   summaries: tuple[Tensor, ...], page_size: int,
                                   superpages: Tensor | None = None) -> None:
    """Decode step: summarize the page that this step's token completed, for each sequence where it did
    (``seq_len % B == 0``); other sequences launch a program that exits at once. Fixed grid `[S, 1, H]`:
    capturable in a CUDA graph. With ``superpages``, a page that completed a superpage (``seq_len % 16 B == 0``)
    also writes its superpage's centroid, as ``superpages.build_completed_superpages`` would after it (one launch
    instead of two).

    Args:
        k_cache (Tensor): `[num_blocks, block_size, H, D]` holding this step's keys.
        block_table (Tensor): `[S, max_blocks]` int32 physical block ids.
        seq_lens (Tensor): `[S]` int32 tokens, this step's token included.
        summaries (tuple): colwise8 tuple by physical page id, written in place.
        page_size (int): B, tokens a page.
        superpages (Tensor | None): fp16 `[P, H, D]` superpage centroids (the two-level selection), updated in
            place.
    Raises:
        ValueError: when ``B`` does not divide the block size.
        AssertionError: on sizes or layouts the kernel does not take.
    """
    ppb = _pages_per_block(k_cache, page_size)
    grid = (block_table.shape[0], 1, k_cache.shape[2])
    _launch(k_cache, block_table, seq_lens, summaries, page_size, MODE_LAST, grid, ppb, superpages)
