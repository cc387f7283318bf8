"""The tail estimate: the pages a step does not read enter the softmax through their estimated mass (issue 47).

A page ``j`` the selection skips contributes ``sum_i exp(s_ji) v_ji`` to the numerator of the attention output and
``sum_i exp(s_ji)`` to its denominator. With ``s_j`` the page's estimated log mass (``score_pages``, paper Eq. 2) and
``vbar_j`` the mean of its B value vectors, the estimate is ``exp(s_j) vbar_j`` and ``exp(s_j)``: exact when the
page's keys are equal (every token then has the same weight). The tail is one more split of flash-decoding,
merged with the exact attention over the selected pages by log-sum-exp (FlashDecoding's reduction; Dao et al.,
2023). Peers: Double-P (arXiv 2602.05191, a per-page mean value for the unselected pages), RetroInfer (VLDB 2026,
a centroid estimate of the rest).

``vbar`` is kept in bf16 (``2 D`` bytes a page and KV head: 1/32 of bf16 K+V at B = 16) or int8 with one fp16 scale
per vector (``D + 2`` bytes: about 1/64).
"""

from __future__ import annotations

import torch
from torch import Tensor

from locks_engine.ops.quant import dequantize, quantize_symmetric

#: how the per-page mean value vectors are stored
VALUE_MEAN_FORMATS = ("bf16", "int8")


def page_value_means(values: Tensor, page_size: int) -> Tensor:
    """Mean value vector of every page.

    Args:
        values (Tensor): `[..., N, D]` values of ``N`` tokens, ``N`` a multiple of ``page_size``.
        page_size (int): B.
    Returns:
        Tensor: fp32 `[..., N / B, D]`.
    Raises:
        ValueError: when ``B`` does not divide ``N``.
    """
    n, dim = values.shape[-2:]
    if n % page_size:
        raise ValueError(f"values: {n} tokens is not a multiple of page_size={page_size}")
    return values.float().reshape(*values.shape[:-2], n // page_size, page_size, dim).mean(-2)


def store_value_means(means: Tensor, fmt: str) -> Tensor:
    """``means`` `[..., D]` as read back from storage in format ``fmt`` (``bf16``, or ``int8`` with an fp16 scale
    per vector: ``quant.quantize_symmetric`` over ``D``), fp32 of the same shape.

    Raises:
        ValueError: on an unknown format.
    """
    if fmt == "bf16":
        return means.to(torch.bfloat16).float()
    if fmt == "int8":
        return dequantize(*quantize_symmetric(means, (-1,), 8))
    raise ValueError(f"value-mean format {fmt!r}: allowed {', '.join(VALUE_MEAN_FORMATS)}")


def value_mean_bytes(head_dim: int, fmt: str) -> int:
    """Bytes of one page's mean value vector, one KV head: ``2 D`` (bf16) or ``D + 2`` (int8 + fp16 scale).

    Raises:
        ValueError: on an unknown format.
    """
    if fmt not in VALUE_MEAN_FORMATS:
        raise ValueError(f"value-mean format {fmt!r}: allowed {', '.join(VALUE_MEAN_FORMATS)}")
    return 2 * head_dim if fmt == "bf16" else head_dim + 2


def tail_split(tail_scores: Tensor, means: Tensor) -> tuple[Tensor, Tensor]:
    """The tail as one attention split: ``out = sum_j softmax(s)_j vbar_j`` and ``lse = logsumexp_j s_j``.

    Args:
        tail_scores (Tensor): `[..., P]` estimated log mass of each tail page (natural log of the sum of
            ``exp(scale * q.k)`` over its keys), ``-inf`` for pages not in the tail.
        means (Tensor): `[..., P, D]` (or `[P, D]`, broadcast) mean value vectors.
    Returns:
        tuple: ``out`` `[..., D]` fp32 and ``lse`` `[...]` fp32; an empty tail gives zeros and ``-inf``.
    """
    lse = torch.logsumexp(tail_scores.float(), dim=-1)
    finite = torch.isfinite(lse)
    weights = torch.exp(tail_scores.float() - torch.where(finite, lse, torch.zeros_like(lse)).unsqueeze(-1))
    out = torch.matmul(weights.unsqueeze(-2), means.float()).squeeze(-2)
    return out, lse


def merge_splits(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """Log-sum-exp merge of two attention splits (FlashDecoding's reduction).

    Args:
        out_a, out_b (Tensor): `[..., D]` each split's normalized output; lse_a, lse_b (Tensor): `[...]` their
            log normalizers (``-inf`` for an empty split).
    Returns:
        tuple: ``out`` `[..., D]` fp32 and ``lse`` `[...]` fp32 of the union; two empty splits give zeros and
        ``-inf`` (never NaN); with one empty split the other is returned unchanged.
    """
    lse = torch.logaddexp(lse_a.float(), lse_b.float())
    finite = torch.isfinite(lse)
    ref = torch.where(finite, lse, torch.zeros_like(lse))
    wa = torch.exp(lse_a.float() - ref).unsqueeze(-1)
    wb = torch.exp(lse_b.float() - ref).unsqueeze(-1)
    return wa * out_a.float() + wb * out_b.float(), lse
