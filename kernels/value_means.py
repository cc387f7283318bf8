"""The tail estimate's value-mean store in Triton (issue 47; ops twin ``locks_engine.ops.tail``): the mean
value vector ``vbar_j`` of every complete page, by physical page id (``block_id * PPB + j % PPB``, as the summaries),
so that it follows vLLM's block reuse and prefix caching.

int8 `[num_pages, H, D]` with one fp16 scale `[num_pages, H]` per vector (``quant.quantize_symmetric`` over
``D``, round half to even), or bf16 `[num_pages, H, D]`. Written for every complete page of a prompt (grid
`[Pmax, S, H]`) or for the page a decode token completed (grid `[S, 1, H]`, programs exit unless
``seq_len % B == 0``), one program a page and KV head; no host synchronization (CUDA-graph capturable).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks_kernels.summaries import _quantize

MODE_ALL, MODE_LAST = 1, 2
VALUE_MEAN_FORMATS = ("bf16", "int8")


@triton.jit
def _value_means_kernel(
    v_ptr, block_table_ptr, seq_lens_ptr, means_ptr, scale_ptr, stride_vb, stride_vt, stride_vh, stride_bt, H,
    B: tl.constexpr, D: tl.constexpr, PPB: tl.constexpr, MODE: tl.constexpr, INT8: tl.constexpr,
):
    # grids: (Pmax, S, H) every page slot (prefill); (S, 1, H) the page this decode step completed
    i_0, i_1, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_s = (i_1 if MODE == 1 else i_0).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + i_s)
    if MODE == 1:
        j = i_0
        active = i_0 < seq_len // B
    else:
        j = seq_len // B - 1
        active = (seq_len % B == 0) & (seq_len >= B)
    if active:
        block = tl.load(block_table_ptr + i_s * stride_bt + j // PPB).to(tl.int64)
        o_t = tl.arange(0, B)
        o_d = tl.arange(0, D)
        row = (j % PPB) * B + o_t
        b_v = tl.load(v_ptr + block * stride_vb + row[:, None] * stride_vt + i_h * stride_vh + o_d[None, :])
        b_mean = tl.sum(b_v.to(tl.float32), axis=0) / B  # [D]
        ph = (block * PPB + j % PPB) * H + i_h
        if INT8:
            q, s = _quantize(b_mean, tl.max(tl.abs(b_mean), axis=0), 127)
            tl.store(means_ptr + ph * D + o_d, q.to(tl.int8))
            tl.store(scale_ptr + ph, s.to(tl.float16))
        else:
            tl.store(means_ptr + ph * D + o_d, b_mean.to(tl.bfloat16))


def _check_store(value_means: tuple[Tensor, Tensor | None], heads: int, dim: int) -> bool:
    """Asserts on a ``(means, scale)`` store; True when it is int8 (with scales), False when bf16."""
    means, scale = value_means
    assert means.dim() == 3 and means.shape[1:] == (heads, dim) and means.is_contiguous(), "means: [P, H, D]"
    if means.dtype == torch.int8:
        assert scale is not None and scale.shape == means.shape[:2] and scale.dtype == torch.float16, "int8 scale"
        assert scale.is_contiguous(), "scale must be contiguous"
        return True
    assert means.dtype == torch.bfloat16 and scale is None, "value means: int8 with an fp16 scale, or bf16 alone"
    return False


def _build(v_cache: Tensor, block_table: Tensor, seq_lens: Tensor, value_means: tuple[Tensor, Tensor | None],
           page_size: int, mode: int, grid: tuple[int, int, int]) -> None:
    blocks, block_size, heads, dim = v_cache.shape
    if block_size % page_size:
        raise ValueError(f"page_size={page_size} must divide the KV cache block size {block_size}")
    assert page_size & (page_size - 1) == 0 and dim >= 16 and dim & (dim - 1) == 0, "B, D: powers of two, D >= 16"
    assert v_cache.stride(3) == 1, "values must be contiguous along D"
    int8 = _check_store(value_means, heads, dim)
    means, scale = value_means
    assert means.shape[0] >= blocks * block_size // page_size, "the store needs a row for every physical page"
    _value_means_kernel[grid](
        v_cache,
        block_table,
        seq_lens,
        means,
        means if scale is None else scale,
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_table.stride(0),
        heads,
        B=page_size,
        D=dim,
        PPB=block_size // page_size,
        MODE=mode,
        INT8=int8,
        num_warps=1,
    )


def allocate_value_means(num_pages: int, heads: int, dim: int, fmt: str,
                         device: torch.device | str) -> tuple[Tensor, Tensor | None]:
    """A zero-filled value-mean store of ``num_pages`` physical pages.

    Args:
        num_pages (int): ``num_blocks * block_size / B``. heads (int): H. dim (int): D. fmt (str): ``int8`` or
            ``bf16`` (``locks_engine.ops.tail.VALUE_MEAN_FORMATS``). device: where to allocate.
    Returns:
        tuple: ``(means, scale)``: int8 `[num_pages, H, D]` and fp16 `[num_pages, H]` (``D + 2`` bytes a page and
        KV head), or bf16 `[num_pages, H, D]` and None (``2 D`` bytes).
    Raises:
        ValueError: on an unknown format.
    """
    if fmt not in VALUE_MEAN_FORMATS:
        raise ValueError(f"value-mean format {fmt!r}: allowed {', '.join(VALUE_MEAN_FORMATS)}")
    if fmt == "bf16":
        return torch.zeros(num_pages, heads, dim, dtype=torch.bfloat16, device=device), None
    return (torch.zeros(num_pages, heads, dim, dtype=torch.int8, device=device),
            torch.zeros(num_pages, heads, dtype=torch.float16, device=device))


def build_cache_value_means(v_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
                            value_means: tuple[Tensor, Tensor | None], page_size: int) -> None:
    """Prefill: the mean value vector of every complete page of every sequence, into the store by physical page
    id (one program per logical page slot and KV head; slots past a sequence's complete pages exit).

    Same values as ``locks_engine.ops.tail.encode_value_means(page_value_means(...), fmt)`` of each page (the
    mean in fp32; int8 by ``quant.quantize_symmetric`` over ``D``, round half to even).

    Args:
        v_cache (Tensor): `[num_blocks, block_size, H, D]`, any strides with ``D`` contiguous; ``B`` and ``D``
            powers of two.
        block_table (Tensor): `[S, max_blocks]` int32 physical block ids. seq_lens (Tensor): `[S]` int32 tokens.
        value_means (tuple): ``allocate_value_means`` of ``num_blocks * block_size / B`` pages, written in place.
        page_size (int): B, tokens a page.
    Raises:
        ValueError: when ``B`` does not divide the block size.
        AssertionError: on sizes, layouts or dtypes the kernel does not take.
    """
    ppb = v_cache.shape[1] // page_size if v_cache.shape[1] % page_size == 0 else 1
    grid = (block_table.shape[1] * ppb, block_table.shape[0], v_cache.shape[2])
    _build(v_cache, block_table, seq_lens, value_means, page_size, MODE_ALL, grid)


def build_completed_value_means(v_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
                                value_means: tuple[Tensor, Tensor | None], page_size: int) -> None:
    """Decode step: the mean value vector of the page this step's token completed (``seq_len % B == 0``), for
    each sequence where it did; other sequences' programs exit at once. Fixed grid `[S, 1, H]`: capturable in a
    CUDA graph (as ``build_completed_page_summaries``).

    Args:
        v_cache (Tensor): `[num_blocks, block_size, H, D]` holding this step's values.
        block_table (Tensor): `[S, max_blocks]` int32. seq_lens (Tensor): `[S]` int32 tokens, this step's included.
        value_means (tuple): ``allocate_value_means`` store by physical page id, written in place.
        page_size (int): B, tokens a page.
    Raises:
        ValueError: when ``B`` does not divide the block size.
        AssertionError: on sizes, layouts or dtypes the kernel does not take.
    """
    grid = (block_table.shape[0], 1, v_cache.shape[2])
    _build(v_cache, block_table, seq_lens, value_means, page_size, MODE_LAST, grid)
