"""The top-K over listed pages in one launch, whatever the capacity (``select.select_pages`` with ``tiles``; the ops
twin is ``locks_engine.ops.select.select_candidate_pages``; why: ``NOTES.md``, two-level selection).

The two-level selection lists ``M`` superpages a KV head and scores their ``16 M`` pages. With ``c`` calibrated as
data the grids are sized for the capacity (``c = 64``: up to 8,240 slots at budget 2,048), while a layer's live
slots may be a tenth of that. The chunked search (``select.py``) would take three launches there (chunk lse, chunk
top-K, merge) for every layer. Here one program per (KV head, sequence) walks only the live slots (the listed
superpages, ``-1`` past them), in sub-chunks of :data:`SUB` slots, four times:

1. per query head, the running max and sum of ``exp(score - max)`` (the heads' lse, online-softmax style);
2. each slot's key (``select.py``'s priority: group-mean share, 2.0 for forced pages, as ``float bits + 1``, 0 = no
   page), stored in a scratch row;
3. the K-th largest key by the ``NT``-ary search of ``select._kth_largest``, each round counting over the row;
4. the slots at or above it compacted in slot order (= page order: the superpages are listed ascending), ties to
   lower slots, ``-1`` after.

Cost grows with the live slots, not the capacity; the scratch row stays in L1/L2 between the passes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

#: slots a sub-chunk (one block of keys in registers)
SUB = 1024
#: warps of the program
SUB_WARPS = 8


@triton.jit
def _count_at_least(keys_ptr, n_slots, t, SUB: tl.constexpr, NT: tl.constexpr):
    """`[NT]` counts of the row's keys at or above each threshold ``t``."""
    o_c = tl.arange(0, SUB)
    counts = tl.zeros([NT], dtype=tl.int32)
    for c0 in range(0, n_slots, SUB):
        keys = tl.load(keys_ptr + c0 + o_c, mask=c0 + o_c < n_slots, other=0)
        counts += tl.sum((keys[:, None] >= t[None, :]).to(tl.int32), axis=0)
    return counts


@triton.jit
def _count_above(keys_ptr, n_slots, t, SUB: tl.constexpr):
    """Count of the row's keys above ``t``."""
    o_c = tl.arange(0, SUB)
    count = tl.zeros([], dtype=tl.int32)
    for c0 in range(0, n_slots, SUB):
        keys = tl.load(keys_ptr + c0 + o_c, mask=c0 + o_c < n_slots, other=0)
        count += tl.sum((keys > t).to(tl.int32), axis=0)
    return count


@triton.jit
def _listed_topk_kernel(
    scores_ptr, seq_lens_ptr, tiles_ptr, keys_ptr, out_ptr, k_ptr,
    stride_ss, stride_sh, stride_ts, stride_th, stride_os, stride_oh, NSLOT, M, K,
    B: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, MP: tl.constexpr, SUB: tl.constexpr, TP: tl.constexpr,
    SINK: tl.constexpr, RECENT: tl.constexpr, NT: tl.constexpr, ROUNDS: tl.constexpr, K_DEV: tl.constexpr,
):
    i_h, i_s = tl.program_id(0), tl.program_id(1).to(tl.int64)
    num_pages = (tl.load(seq_lens_ptr + i_s) + B - 1) // B
    k_live = K
    if K_DEV:
        k_live = tl.minimum(tl.load(k_ptr), K)
    p_tiles = tiles_ptr + i_s * stride_ts + i_h * stride_th
    o_m = tl.arange(0, MP)
    # the listed superpages come first, -1 after: the live slots are the first 16 x (listed) ones
    n_slots = tl.sum((tl.load(p_tiles + o_m, mask=o_m < M, other=-1) >= 0).to(tl.int32), axis=0) * TP
    o_c = tl.arange(0, SUB)
    o_g = tl.arange(0, GP)
    m_g = o_g < G
    p_scores = scores_ptr + i_s * stride_ss + (i_h * G + o_g[:, None]) * stride_sh  # [GP, 1]
    # 1. the group's query heads' lse over the live slots, online
    b_m = tl.full([GP], float("-inf"), tl.float32)
    b_l = tl.zeros([GP], dtype=tl.float32)
    for c0 in range(0, n_slots, SUB):
        o_p = c0 + o_c
        b_s = tl.load(p_scores + o_p[None, :], mask=m_g[:, None] & (o_p < n_slots)[None, :], other=float("-inf"))
        m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        b_l = b_l * tl.exp(b_m - m_safe) + tl.sum(tl.exp(b_s - m_safe[:, None]), axis=1)
        b_m = m_new
    lse = tl.where(b_m == float("-inf"), 0.0, b_m) + tl.log(tl.where(b_l > 0.0, b_l, 1.0))  # [GP]
    # 2. each live slot's key into the scratch row
    p_keys = keys_ptr + (i_s * tl.num_programs(0) + i_h) * NSLOT
    for c0 in range(0, n_slots, SUB):
        o_p = c0 + o_c
        m_p = o_p < n_slots
        b_s = tl.load(p_scores + o_p[None, :], mask=m_g[:, None] & m_p[None, :], other=float("-inf"))
        b_pri = tl.sum(tl.where((b_l > 0.0)[:, None], tl.exp(b_s - lse[:, None]), 0.0), axis=0) / G
        tile = tl.load(p_tiles + o_p // TP, mask=m_p, other=-1)
        page = tl.where(tile >= 0, tile * TP + o_p % TP, -1)
        b_pri = tl.where((page < SINK) | (page >= num_pages - 1 - RECENT), 2.0, b_pri)
        keys = tl.where((page >= 0) & (page < num_pages), b_pri.to(tl.int32, bitcast=True) + 1, 0)
        tl.store(p_keys + o_p, keys, mask=m_p)
    tl.debug_barrier()
    # 3. the largest t >= 1 with at least k_live keys >= t (select._kth_largest, counting over the row)
    o_t = tl.arange(0, NT)
    lo = tl.zeros([], dtype=tl.int32) + 1
    hi = tl.zeros([], dtype=tl.int32) + 0x40000001  # bits of 2.0 (forced) + 1
    n_keys = _count_above(p_keys, n_slots, 0, SUB)
    done = (n_keys <= k_live).to(tl.int32)
    rounds = tl.zeros([], dtype=tl.int32)
    while (rounds < ROUNDS) & (done == 0):
        step = (hi - lo) // NT + 1
        t = lo + o_t * step
        counts = _count_at_least(p_keys, n_slots, t, SUB, NT)  # non-increasing
        j = tl.maximum(tl.sum((counts >= k_live).to(tl.int32), axis=0) - 1, 0)
        done = tl.max((counts == k_live).to(tl.int32), axis=0)
        hi = tl.where(j < NT - 1, tl.minimum(hi, lo + (j + 1) * step - 1), hi)
        lo = lo + j * step
        rounds += 1
    # 4. compaction in slot order: every key above lo, then ties at lo towards lower slots up to k_live
    n_above = _count_above(p_keys, n_slots, lo, SUB)
    quota = k_live - n_above
    p_out = out_ptr + i_s * stride_os + i_h * stride_oh
    taken = tl.zeros([], dtype=tl.int32)
    tied_before = tl.zeros([], dtype=tl.int32)
    for c0 in range(0, n_slots, SUB):
        o_p = c0 + o_c
        m_p = o_p < n_slots
        keys = tl.load(p_keys + o_p, mask=m_p, other=0)
        tied = (keys == lo) & m_p
        take = (keys > lo) | (tied & (tied_before + tl.cumsum(tied.to(tl.int32), axis=0) <= quota))
        tile = tl.load(p_tiles + o_p // TP, mask=m_p, other=-1)
        slot = taken + tl.cumsum(take.to(tl.int32), axis=0) - 1
        tl.store(p_out + slot, (tile * TP + o_p % TP).to(tl.int64), mask=take)
        taken += tl.sum(take.to(tl.int32), axis=0)
        tied_before += tl.sum(tied.to(tl.int32), axis=0)
    for k0 in range(0, K, SUB):
        o_k = k0 + o_c
        tl.store(p_out + o_k, tl.full([SUB], -1, tl.int64), mask=(o_k >= taken) & (o_k < K))


def select_listed(scores: Tensor, seq_lens: Tensor, tiles: Tensor, out: Tensor, page_size: int, sink_pages: int,
                  recent_pages: int, budget_live: Tensor | None, search_arity: int, search_rounds: int,
                  tile_pages: int) -> Tensor:
    """Launch :func:`_listed_topk_kernel` (grid `[H, S]`): ``select.select_pages(tiles=...)`` in one launch.

    Args:
        scores (Tensor): fp32 `[S, HQ, NSLOT]` slot scores, contiguous along slots (``score_pages(tiles=)``).
        seq_lens (Tensor): `[S]` int32 tokens. tiles (Tensor): int `[S, H, M]` superpages ascending, ``-1`` last.
        out (Tensor): int64 `[S, H, K]` written in place. page_size (int): B.
        sink_pages, recent_pages (int): forced pages. budget_live (Tensor | None): int32 `[1]`, pages taken (at
            most ``K``). search_arity, search_rounds (int): the K-th-largest search (``select.py``).
        tile_pages (int): pages a listed superpage (16).
    Returns:
        Tensor: ``out``.
    Raises:
        AssertionError: on shapes or strides the kernel does not take.
    """
    seqs, num_q_heads, nslot = scores.shape
    heads, tiles_m = tiles.shape[1], tiles.shape[2]
    assert out.shape[:2] == (seqs, heads) and tiles.stride(-1) == 1 and scores.stride(-1) == 1
    groups = num_q_heads // heads
    keys = torch.empty(seqs, heads, nslot, dtype=torch.int32, device=scores.device)
    _listed_topk_kernel[(heads, seqs)](
        scores,
        seq_lens,
        tiles,
        keys,
        out,
        out if budget_live is None else budget_live,
        scores.stride(0),
        scores.stride(1),
        tiles.stride(0),
        tiles.stride(1),
        out.stride(0),
        out.stride(1),
        nslot,
        tiles_m,
        out.shape[2],
        B=page_size,
        G=groups,
        GP=triton.next_power_of_2(groups),
        MP=triton.next_power_of_2(tiles_m),
        SUB=SUB,
        TP=tile_pages,
        SINK=sink_pages,
        RECENT=recent_pages,
        NT=search_arity,
        ROUNDS=search_rounds,
        K_DEV=budget_live is not None,
        num_warps=SUB_WARPS,
    )
    return out
