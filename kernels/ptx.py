"""Inline PTX helpers of the score kernels (``locks_kernels.score``, ``locks_kernels.score_persistent``): each has
a plain-Triton fallback, taken when ``FAST`` is off and always under the interpreter, which runs no assembly."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def log2_fast(x, FAST: tl.constexpr):
    """``log2`` of fp32 ``x``: ``lg2.approx.f32`` (one MUFU.LG2, absolute error ~2^-22) when ``FAST``, else
    ``tl.log2``, which Triton 3.6 lowers to a ~25-instruction polynomial with a branch (the interpreter, which runs
    no inline assembly, takes this one)."""
    if FAST:
        return tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        return tl.log2(x)


@triton.jit
def int8_to_fp16(x, FAST: tl.constexpr):
    """int8 -> fp16 (exact) of any tensor. ``FAST``: four at a time as ``(0x6400 | (x + 128)) - 1152`` read as fp16
    (one xor, two byte permutes and two fp16x2 subtractions for four entries, no quarter-rate I2F); else ``.to``."""
    if FAST:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t, m; xor.b32 t, $2, 0x80808080; mov.b32 m, 0x64806480; "
            "prmt.b32 $0, t, 0x64646464, 0x4140; prmt.b32 $1, t, 0x64646464, 0x4342; "
            "sub.f16x2 $0, $0, m; sub.f16x2 $1, $1, m; }",
            "=r,=r,r", [x], dtype=tl.float16, is_pure=True, pack=4)
    else:
        return x.to(tl.float16)
