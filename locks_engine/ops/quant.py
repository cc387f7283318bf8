"""Symmetric integer quantization used by the summary formats (int8, and int4 packed two per byte)."""

from __future__ import annotations

import torch
from torch import Tensor

_FP16_MAX = 65504.0


def _scale(amax: Tensor, qmax: int) -> Tensor:
    """fp16 scale ``amax / qmax``; 0 where ``amax`` is 0 (the tensor dequantizes to exact zeros)."""
    return (amax / qmax).clamp(max=_FP16_MAX).to(torch.float16)


def quantize_symmetric(x: Tensor, dims: tuple[int, ...], bits: int) -> tuple[Tensor, Tensor]:
    """Round ``x`` to ``bits``-bit signed integers with one fp16 scale per slice over ``dims``.

    Args:
        x (Tensor): float tensor of any shape.
        dims (tuple[int, ...]): dimensions that share one scale (reduced by ``amax``).
        bits (int): 8 or 4; values are kept in ``[-(2**(bits-1) - 1), 2**(bits-1) - 1]``.
    Returns:
        tuple: ``(q, scale)``: ``q`` int8 of ``x``'s shape, ``scale`` fp16 with ``dims`` kept as size 1.
        ``q * scale`` reconstructs ``x`` to within ``scale / 2`` per element (round to nearest).
    """
    qmax = 2 ** (bits - 1) - 1
    amax = x.abs().amax(dim=dims, keepdim=True).float()
    scale = _scale(amax, qmax)
    safe = scale.float().clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(x.float() / safe).clamp(-qmax, qmax).to(torch.int8)
    return q, scale


def dequantize(q: Tensor, scale: Tensor) -> Tensor:
    """``q * scale`` in fp32 (``scale`` broadcasts over ``q``)."""
    return q.float() * scale.float()


def pack_int4(q: Tensor) -> Tensor:
    """Pack int4 values (int8 holding ``[-7, 7]``) two per byte along the last dim.

    Args:
        q (Tensor): int8 of shape `[..., 2n]`.
    Returns:
        Tensor: uint8 of shape `[..., n]`; element ``2i`` in the low nibble, ``2i+1`` in the high, each +8.
    """
    assert q.shape[-1] % 2 == 0, "int4 packing needs an even last dim"
    u = (q.to(torch.int16) + 8).to(torch.uint8)
    return u[..., 0::2] | (u[..., 1::2] << 4)


def unpack_int4(packed: Tensor) -> Tensor:
    """Inverse of :func:`pack_int4`: uint8 `[..., n]` -> int8 `[..., 2n]`."""
    low = (packed & 0xF).to(torch.int8) - 8
    high = (packed >> 4).to(torch.int8) - 8
    return torch.stack((low, high), dim=-1).flatten(-2)


#: Steps per octave of a log2 scale code: ``scale = 2 ** (code / LOG2_STEPS)``.
LOG2_STEPS = 4


def log2_scale(code: Tensor) -> Tensor:
    """fp32 scale ``2 ** (code / 4)`` of int8 log2 codes (any shape)."""
    return torch.exp2(code.float() / LOG2_STEPS)


def quantize_log2_scale(x: Tensor, dims: tuple[int, ...], bits: int) -> tuple[Tensor, Tensor]:
    """Round ``x`` to ``bits``-bit signed integers with one scale per slice over ``dims``, stored as a 1-byte
    log2 code: ``scale = 2 ** (code / 4)``, ``code = ceil(4 log2(amax / qmax))``, so the scale is rounded up
    (at most 19% above ``amax / qmax``) and no entry clips.

    Args:
        x (Tensor): float tensor of any shape.
        dims (tuple[int, ...]): dimensions that share one scale (reduced by ``amax``).
        bits (int): 8 or 4; values are kept in ``[-(2**(bits-1) - 1), 2**(bits-1) - 1]``.
    Returns:
        tuple: ``(q, code)``: ``q`` int8 of ``x``'s shape; ``code`` int8 in ``[-127, 127]`` with ``dims`` kept
        as size 1 (an all-zero slice gets -127 and dequantizes to exact zeros). ``q * log2_scale(code)``
        reconstructs ``x`` to within ``scale / 2 <= 0.6 amax / qmax`` per element.
    """
    qmax = 2 ** (bits - 1) - 1
    amax = x.abs().amax(dim=dims, keepdim=True).double()
    code = torch.ceil(LOG2_STEPS * torch.log2((amax / qmax).clamp_min(2.0**-40))).clamp(-127, 127)
    code = code.to(torch.int8)
    q = torch.round(x.double() / log2_scale(code).double()).clamp(-qmax, qmax).to(torch.int8)
    return q, code
