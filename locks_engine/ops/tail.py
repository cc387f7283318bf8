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


def encode_value_means(means: Tensor, fmt: str) -> tuple[Tensor, Tensor | None]:
    """``means`` `[..., D]` as a store holds them: ``(int8 [..., D], fp16 scale [...])``
    (``quant.quantize_symmetric`` over ``D``) or ``(bf16 [..., D], None)``; ``decode_value_means`` reads them
    back to what ``store_value_means`` gives.

    Raises:
        ValueError: on an unknown format.
    """
    if fmt == "bf16":
        return means.to(torch.bfloat16), None
    if fmt == "int8":
        q, scale = quantize_symmetric(means, (-1,), 8)
        return q, scale.squeeze(-1)
    raise ValueError(f"value-mean format {fmt!r}: allowed {', '.join(VALUE_MEAN_FORMATS)}")


def decode_value_means(means: Tensor, scale: Tensor | None) -> Tensor:
    """fp32 `[..., D]` of a stored ``(means, scale)`` pair (``encode_value_means``): int8 ``means`` times their
    fp16 ``scale`` `[...]`, or bf16 ``means`` (``scale`` None)."""
    return means.float() if scale is None else dequantize(means, scale.unsqueeze(-1))


def stored_row_value_means(means: Tensor, scale: Tensor | None, block_table: Tensor, ppb: int) -> Tensor:
    """Mean value vector of every logical page of each row, read from a store by physical page id.

    Args:
        means (Tensor): `[num_pages, H, D]` int8 or bf16; scale (Tensor | None): fp16 `[num_pages, H]` (int8),
            None (bf16); ``encode_value_means`` of each physical page (``physical_page_ids``).
        block_table (Tensor): `[S, max_blocks]`. ppb (int): pages per block, ``block_size / B``.
    Returns:
        Tensor: fp32 `[S, Pmax, H, D]`, ``Pmax = max_blocks * ppb``: the ``value_means`` argument of
        ``tail_paged_attention``.
    """
    from locks_engine.ops.paging import physical_page_ids

    pages = physical_page_ids(block_table, ppb).to(means.device)  # [S, Pmax]
    return decode_value_means(means[pages], None if scale is None else scale[pages])


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


def cache_value_means(v_cache: Tensor, page_size: int, fmt: str) -> Tensor:
    """Mean value vector of every physical page of a paged V cache, stored in ``fmt`` and read back.

    Args:
        v_cache (Tensor): `[num_blocks, block_size, H, D]`, any strides. page_size (int): B, dividing the block size.
        fmt (str): ``VALUE_MEAN_FORMATS``.
    Returns:
        Tensor: fp32 `[num_blocks * block_size / B, H, D]`, indexed by physical page id (``physical_page_ids``).
        Pages not fully written hold the mean of whatever their slots hold: the tail only reads complete pages.
    Raises:
        ValueError: when ``B`` does not divide the block size, or on an unknown format.
    """
    blocks, block_size, heads, dim = v_cache.shape
    if block_size % page_size:
        raise ValueError(f"page_size={page_size} does not divide the block size {block_size}")
    means = v_cache.float().reshape(blocks * block_size // page_size, page_size, heads, dim).mean(1)
    return store_value_means(means, fmt)


def row_value_means(v_cache: Tensor, block_table: Tensor, page_size: int, fmt: str) -> Tensor:
    """Mean value vector of every logical page of each row, stored in ``fmt`` and read back (computed from the V
    cache: the reference; a backend keeps them in a store written when a page completes, as summaries are).

    Args:
        v_cache (Tensor): `[num_blocks, block_size, H, D]`; block_table (Tensor): `[S, max_blocks]`.
    Returns:
        Tensor: fp32 `[S, Pmax, H, D]`, ``Pmax = max_blocks * block_size / B``.
    Raises:
        ValueError: when ``B`` does not divide the block size, or on an unknown format.
    """
    from locks_engine.ops.paging import gather_pages

    if v_cache.shape[1] % page_size:
        raise ValueError(f"page_size={page_size} does not divide the block size {v_cache.shape[1]}")
    return store_value_means(gather_pages(v_cache, block_table, page_size).float().mean(2), fmt)


def tail_paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    selected: Tensor,
    scores: Tensor,
    value_means: Tensor,
    page_size: int,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Decode attention over the selected pages, exact, plus the tail estimate of every other complete page.

    ``sparse_paged_attention`` over ``selected``, merged (``merge_splits``) with the split ``tail_split`` makes
    of the complete pages a KV head does not select: log mass ``scores`` (the estimate the selection ranked by,
    per query head) and mean value ``value_means``. The last, incomplete page is never in the tail (the selection
    always reads it).

    Args:
        q (Tensor): `[S, HQ, D]`; k_cache, v_cache (Tensor): `[num_blocks, block_size, H, D]`.
        block_table (Tensor): `[S, max_blocks]`; seq_lens (Tensor): `[S]` tokens.
        selected (Tensor): `[S, H, K]` logical pages, ``-1`` unused (``select_pages``).
        scores (Tensor): `[S, HQ, Pmax]` estimated log mass of each logical page (``score_pages``, with the scale
            of the attention), ``-inf`` for pages without a score; ``Pmax`` at most the block table's pages.
        value_means (Tensor): `[S, Pmax', H, D]` fp32 mean value of each logical page, ``Pmax' >= Pmax``
            (``row_value_means``; from a store by physical page id: ``store[physical_page_ids(...)]``).
        page_size (int): B. scale (float | None): softmax scale, default ``D ** -0.5``.
    Returns:
        tuple: ``out`` `[S, HQ, D]` in ``q.dtype`` and ``lse`` `[S, HQ]` fp32 of the exact and estimated mass.
    """
    from locks_engine.ops.attention import sparse_paged_attention

    num_q_heads = q.shape[1]
    heads = selected.shape[1]
    pmax = scores.shape[-1]
    out_x, lse_x = sparse_paged_attention(q, k_cache, v_cache, block_table, seq_lens, selected, page_size, scale)
    tail = tail_pages(selected, seq_lens, pmax, page_size)  # [S, H, Pmax]
    tail = tail.repeat_interleave(num_q_heads // heads, dim=1)  # [S, HQ, Pmax]
    means = value_means[:, :pmax].transpose(1, 2).repeat_interleave(num_q_heads // heads, dim=1)  # [S, HQ, Pmax, D]
    out_t, lse_t = tail_split(scores.float().masked_fill(~tail, float("-inf")), means)
    out, lse = merge_splits(out_x, lse_x, out_t, lse_t)
    return out.to(q.dtype), lse


def tail_pages(selected: Tensor, seq_lens: Tensor, pmax: int, page_size: int) -> Tensor:
    """The pages each KV head leaves to the tail estimate: complete and not selected.

    Args:
        selected (Tensor): `[S, H, K]` logical pages read, ``-1`` unused. seq_lens (Tensor): `[S]` tokens.
        pmax (int): logical pages of the scores. page_size (int): B.
    Returns:
        Tensor: bool `[S, H, Pmax]`.
    """
    seqs, heads = selected.shape[:2]
    pages = torch.arange(pmax, device=selected.device)
    complete = pages < (seq_lens.long() // page_size).unsqueeze(1)  # [S, Pmax]
    read = torch.zeros(seqs, heads, pmax + 1, dtype=torch.bool, device=selected.device)
    read.scatter_(-1, torch.where(selected < 0, pmax, selected.clamp(max=pmax)), True)
    return complete.unsqueeze(1) & ~read[..., :pmax]


def tail_mass_share(scores: Tensor, selected: Tensor, seq_lens: Tensor, page_size: int) -> Tensor:
    """Share of the estimated attention mass that the tail carries, per KV head: for each query head
    ``sum_{j in tail} exp(s_j) / sum_{j complete} exp(s_j)`` (``tail_pages``; the scores the selection ranked by),
    averaged over the query heads of the KV head's group. No host sync (CUDA-graph safe).

    Args:
        scores (Tensor): `[S, HQ, Pmax]` estimated log mass of each logical page, ``-inf`` without a score.
        selected (Tensor): `[S, H, K]` logical pages read, ``-1`` unused. seq_lens (Tensor): `[S]` tokens.
        page_size (int): B.
    Returns:
        Tensor: fp32 `[S, H]` in [0, 1]; 0 where the tail is empty or no complete page has a score.
    """
    heads, pmax = selected.shape[1], scores.shape[-1]
    group = scores.shape[1] // heads
    tail = tail_pages(selected, seq_lens, pmax, page_size).repeat_interleave(group, dim=1)  # [S, HQ, Pmax]
    complete = torch.arange(pmax, device=scores.device) < (seq_lens.long() // page_size).unsqueeze(1)
    scores = scores.float().masked_fill(~complete.unsqueeze(1), float("-inf"))
    lse_all = torch.logsumexp(scores, dim=-1)  # [S, HQ]
    lse_tail = torch.logsumexp(scores.masked_fill(~tail, float("-inf")), dim=-1)
    share = torch.where(torch.isfinite(lse_all), torch.exp(lse_tail - lse_all), torch.zeros_like(lse_all))
    return share.view(share.shape[0], heads, group).mean(-1)
