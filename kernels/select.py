"""Stage 3 in Triton: group-shared top-K page selection under the budget (paper Section 3.3).

One to four launches, all of fixed shape (CUDA-graph safe), for scores `[S, HQ, Pmax]` cut into chunks of ``C`` pages
(one when a single chunk holds every page: pass 2 then takes the heads' lse from the scores and writes the output):

1. ``_chunk_lse_kernel``: per query head and chunk, the max and the sum of ``exp(score - max)``.
2. ``_chunk_topk_kernel``: per KV head and chunk, the page priority of ``ops.select_pages`` (mean over the
   group's query heads of ``exp(score - lse)``, 2.0 for forced pages, none for pages past the sequence) as a
   32-bit key (``float bits + 1``, 0 = not a page), the K-th largest key by an 8-ary search
   (:data:`SEARCH_ARITY`), and the pages at or above it compacted in page order with a prefix sum (ties broken
   towards lower pages). The group's query heads are loaded as one block (up to :data:`BLOCK_SCORES` scores, then
   blocks of heads in turn).
3. ``_merge_topk_kernel``: the same over the chunks' candidates; candidates arrive in page order, so the
   output is ascending without a sort. Where the chunks' candidates are many (long contexts),
   ``_group_topk_kernel`` first keeps the top ``K`` of
   each group of :data:`MERGE_GROUP` chunks (one more launch, each group's candidates still in page order):
   the top ``K`` of a union is the top ``K`` of its parts' top ``K``, ties included, so the output is the same.

The plan (:func:`_plan`): chunks of :data:`CHUNK` pages, and a group pass when the merge would otherwise search
more than :data:`MAX_MERGE_KEYS` candidates.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks_kernels.select_listed import select_listed


@triton.jit
def _chunk_lse_kernel(scores_ptr, seq_lens_ptr, part_ptr, stride_ss, stride_sh, HQ, PMAX, NCHUNK,
                      B: tl.constexpr, C: tl.constexpr):
    i_c, i_hq, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    p_part = part_ptr + ((i_s * HQ + i_hq) * NCHUNK + i_c) * 2
    # a chunk past the sequence's last complete page holds only -inf: (max, sum) = (-inf, 0) without reading it
    if i_c * C < tl.load(seq_lens_ptr + i_s) // B:
        o_p = i_c * C + tl.arange(0, C)
        b_s = tl.load(scores_ptr + i_s * stride_ss + i_hq * stride_sh + o_p, mask=o_p < PMAX, other=float("-inf"))
        b_max = tl.max(b_s, axis=0)
        b_sum = tl.sum(tl.exp(b_s - tl.where(b_max == float("-inf"), 0.0, b_max)), axis=0)
        tl.store(p_part, b_max)
        tl.store(p_part + 1, b_sum)
    else:
        tl.store(p_part, float("-inf"))
        tl.store(p_part + 1, 0.0)


@triton.jit
def _kth_largest(keys, K, NT: tl.constexpr, ROUNDS: tl.constexpr):
    """Largest ``t >= 1`` with at least ``K`` keys ``>= t`` (1 when fewer than ``K`` keys are ``>= 1``).

    ``NT``-ary search: each round counts the keys at ``NT`` thresholds at once (one block reduction) and keeps
    one ``NT``-th of the range, so ``ROUNDS`` (:data:`SEARCH_ROUNDS`) cover the 2^30 + 1 possible keys.
    Invariant: ``count(keys >= lo) >= K`` (or ``lo == 1``) and ``count(keys >= hi + 1) < K``.

    The search stops early at a threshold with exactly ``K`` keys at or above it: that threshold selects the same
    keys as the K-th largest key does (:func:`_take_top`), and it is met once the step falls under the gap between
    the K-th and the (K+1)-th largest keys, typically in about half the rounds (each round ends in a block
    reduction: the search's latency is the selection's)."""
    o_t = tl.arange(0, NT)
    lo = tl.zeros([], dtype=tl.int32) + 1
    hi = tl.zeros([], dtype=tl.int32) + 0x40000001  # bits of 2.0 (forced) + 1
    rounds = tl.zeros([], dtype=tl.int32)
    exact = (tl.sum((keys >= lo).to(tl.int32), axis=0) == K).to(tl.int32)
    while (rounds < ROUNDS) & (exact == 0):
        step = (hi - lo) // NT + 1
        t = lo + o_t * step  # [NT]
        counts = tl.sum((keys[:, None] >= t[None, :]).to(tl.int32), axis=0)  # [NT], non-increasing
        good = counts >= K
        j = tl.maximum(tl.sum(good.to(tl.int32), axis=0) - 1, 0)  # last good threshold (t_0 = lo is good)
        # a threshold with exactly K keys at or above it is the last good one (counts do not increase)
        exact = tl.max((counts == K).to(tl.int32), axis=0)
        hi = tl.where(j < NT - 1, tl.minimum(hi, lo + (j + 1) * step - 1), hi)
        lo = lo + j * step
        rounds += 1
    return lo


@triton.jit
def _take_top(keys, K, NT: tl.constexpr, ROUNDS: tl.constexpr):
    """Mask of the ``K`` largest keys ``>= 1`` (ties towards lower positions) and each one's output slot."""
    t = _kth_largest(keys, K, NT, ROUNDS)
    above = keys > t
    tied = keys == t
    take = above | (tied & (tl.cumsum(tied.to(tl.int32), axis=0) <= K - tl.sum(above.to(tl.int32), axis=0)))
    return take, tl.cumsum(take.to(tl.int32), axis=0) - 1, tl.sum(take.to(tl.int32), axis=0)


@triton.jit
def _budget(k_ptr, K, K_DEV: tl.constexpr):
    """The pages to take: ``K`` (the output's slots), or with ``K_DEV`` the first int32 at ``k_ptr``, at most
    ``K`` (read on the device: a CUDA graph replays it with whatever the buffer holds)."""
    k = K
    if K_DEV:
        k = tl.minimum(tl.load(k_ptr), K)
    return k


@triton.jit
def _chunk_topk_kernel(
    scores_ptr, seq_lens_ptr, part_ptr, cand_key_ptr, cand_page_ptr, tiles_ptr, out_ptr, k_ptr,
    stride_ss, stride_sh, stride_ts, stride_th, stride_os, stride_oh, HQ, PMAX, NCHUNK, NPART, K,
    B: tl.constexpr, G: tl.constexpr, GB: tl.constexpr, C: tl.constexpr, NPP: tl.constexpr, KP: tl.constexpr,
    SINK: tl.constexpr, RECENT: tl.constexpr, NT: tl.constexpr, ROUNDS: tl.constexpr, LIST: tl.constexpr,
    TP: tl.constexpr, SINGLE: tl.constexpr, K_DEV: tl.constexpr,
):
    i_c, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    num_pages = (tl.load(seq_lens_ptr + i_s) + B - 1) // B
    o_k = tl.arange(0, KP)
    # slot >= page in both modes (listed tiles ascend), so a chunk starting past the sequence holds no page: it
    # offers no candidate (or, as the only chunk, writes an empty selection) without reading its scores
    if i_c * C < num_pages:
        _chunk_topk(scores_ptr, part_ptr, cand_key_ptr, cand_page_ptr, tiles_ptr, out_ptr, stride_ss, stride_sh,
                    stride_ts, stride_th, stride_os, stride_oh, HQ, PMAX, NCHUNK, NPART, K, _budget(k_ptr, K, K_DEV),
                    i_c, i_h, i_s, num_pages, G, GB, C, NPP, KP, SINK, RECENT, NT, ROUNDS, LIST, TP, SINGLE)
    elif SINGLE:
        tl.store(out_ptr + i_s * stride_os + i_h * stride_oh + o_k, tl.full([KP], -1, tl.int64), mask=o_k < K)
    else:
        base = ((i_s * tl.num_programs(1) + i_h) * NCHUNK + i_c) * KP
        tl.store(cand_key_ptr + base + o_k, tl.zeros([KP], dtype=tl.int32))


@triton.jit
def _chunk_topk(
    scores_ptr, part_ptr, cand_key_ptr, cand_page_ptr, tiles_ptr, out_ptr,
    stride_ss, stride_sh, stride_ts, stride_th, stride_os, stride_oh, HQ, PMAX, NCHUNK, NPART, K, K_LIVE, i_c, i_h,
    i_s, num_pages, G: tl.constexpr, GB: tl.constexpr, C: tl.constexpr, NPP: tl.constexpr, KP: tl.constexpr,
    SINK: tl.constexpr, RECENT: tl.constexpr, NT: tl.constexpr, ROUNDS: tl.constexpr, LIST: tl.constexpr,
    TP: tl.constexpr, SINGLE: tl.constexpr,
):
    """One chunk's top ``K_LIVE`` (``_chunk_topk_kernel``'s body for a chunk that holds pages of the sequence);
    ``K`` (at least ``K_LIVE``) output slots."""
    o_p = i_c * C + tl.arange(0, C)
    o_n = tl.arange(0, NPP)
    o_g = tl.arange(0, GB)
    b_pri = tl.zeros([C], dtype=tl.float32)
    # GB query heads a block: their loads are issued at once (GB = GP: one round trip for the whole group)
    for g0 in range(0, G, GB):
        m_g = g0 + o_g < G
        hq = i_h * G + g0 + o_g
        m_p = m_g[:, None] & (o_p < PMAX)[None, :]
        b_s = tl.load(scores_ptr + i_s * stride_ss + hq[:, None] * stride_sh + o_p[None, :], mask=m_p,
                      other=float("-inf"))  # [GB, C]
        if SINGLE:
            # one chunk holds every page: the heads' lse from the scores themselves (no first pass)
            top = tl.max(b_s, axis=1)
            top = tl.where(top == float("-inf"), 0.0, top)
            total = tl.sum(tl.exp(b_s - top[:, None]), axis=1)
        else:
            m_n = m_g[:, None] & (o_n < NPART)[None, :]
            p_part = part_ptr + ((i_s * HQ + hq[:, None]) * NPART + o_n[None, :]) * 2  # [GB, NPP]
            b_m = tl.load(p_part, mask=m_n, other=float("-inf"))
            b_l = tl.load(p_part + 1, mask=m_n, other=0.0)
            top = tl.max(b_m, axis=1)
            top = tl.where(top == float("-inf"), 0.0, top)
            total = tl.sum(b_l * tl.exp(b_m - top[:, None]), axis=1)
        lse = top + tl.log(tl.where(total > 0.0, total, 1.0))  # [GB]
        b_pri += tl.sum(tl.where((total > 0.0)[:, None], tl.exp(b_s - lse[:, None]), 0.0), axis=0)
    b_pri = b_pri / G
    if LIST:
        # slot 16 i + j is page 16 tiles[s, h, i] + j (tiles ascending, -1 last: slots stay in page order)
        tile = tl.load(tiles_ptr + i_s * stride_ts + i_h * stride_th + o_p // TP, mask=o_p < PMAX, other=-1)
        page = tl.where(tile >= 0, tile * TP + o_p % TP, -1)
    else:
        page = o_p
    forced = (page < SINK) | (page >= num_pages - 1 - RECENT)
    b_pri = tl.where(forced, 2.0, b_pri)
    keys = tl.where((page >= 0) & (page < num_pages) & (o_p < PMAX), b_pri.to(tl.int32, bitcast=True) + 1, 0)
    take, slot, n_taken = _take_top(keys, K_LIVE, NT, ROUNDS)
    o_k = tl.arange(0, KP)
    if SINGLE:
        # the chunk's top K is the answer, in page order: straight to the output (no merge)
        p_out = out_ptr + i_s * stride_os + i_h * stride_oh
        tl.store(p_out + slot, page.to(tl.int64), mask=take)
        tl.store(p_out + o_k, tl.full([KP], -1, tl.int64), mask=(o_k >= n_taken) & (o_k < K))
    else:
        base = ((i_s * tl.num_programs(1) + i_h) * NCHUNK + i_c) * KP
        tl.store(cand_key_ptr + base + slot, keys, mask=take)
        tl.store(cand_page_ptr + base + slot, page, mask=take)
        tl.store(cand_key_ptr + base + o_k, tl.zeros([KP], dtype=tl.int32), mask=o_k >= n_taken)


@triton.jit
def _merge_topk_kernel(cand_key_ptr, cand_page_ptr, out_ptr, k_ptr, stride_os, stride_oh, NCHUNK, K,
                       KP: tl.constexpr, NP: tl.constexpr, NT: tl.constexpr, ROUNDS: tl.constexpr,
                       K_DEV: tl.constexpr):
    i_h, i_s = tl.program_id(0), tl.program_id(1).to(tl.int64)
    o_n = tl.arange(0, NP)
    base = (i_s * tl.num_programs(0) + i_h) * NCHUNK * KP
    keys = tl.load(cand_key_ptr + base + o_n, mask=o_n < NCHUNK * KP, other=0)
    pages = tl.load(cand_page_ptr + base + o_n, mask=o_n < NCHUNK * KP, other=0)
    take, slot, n_taken = _take_top(keys, _budget(k_ptr, K, K_DEV), NT, ROUNDS)
    p_out = out_ptr + i_s * stride_os + i_h * stride_oh
    tl.store(p_out + slot, pages.to(tl.int64), mask=take)
    o_k = tl.arange(0, KP)
    tl.store(p_out + o_k, tl.full([KP], -1, tl.int64), mask=(o_k >= n_taken) & (o_k < K))


@triton.jit
def _merge_store(keys, pages, k, out_ptr, i_s, i_h, stride_os, stride_oh, K, KP: tl.constexpr, NT: tl.constexpr,
                 ROUNDS: tl.constexpr):
    """The top ``k`` of ``keys`` (candidates in page order) written as pages ascending, ``-1`` past them."""
    take, slot, n_taken = _take_top(keys, k, NT, ROUNDS)
    p_out = out_ptr + i_s * stride_os + i_h * stride_oh
    tl.store(p_out + slot, pages.to(tl.int64), mask=take)
    o_k = tl.arange(0, KP)
    tl.store(p_out + o_k, tl.full([KP], -1, tl.int64), mask=(o_k >= n_taken) & (o_k < K))


@triton.jit
def _merge_live_kernel(cand_key_ptr, cand_page_ptr, out_ptr, k_ptr, live_ptr, stride_os, stride_oh, NCHUNK, K,
                       SLOTS_PER_PART, KP: tl.constexpr, NP: tl.constexpr, NT: tl.constexpr, ROUNDS: tl.constexpr,
                       K_DEV: tl.constexpr, LIVE: tl.constexpr, TP: tl.constexpr, SMALL: tl.constexpr):
    """``_merge_topk_kernel`` (:data:`MERGE_SMALL`) for a calibrated layer: each of the ``NCHUNK`` parts holds at
    most ``min(k, KP)`` candidates at the start of its ``KP`` slots (the live budget ``k`` read on the device),
    and with ``LIVE`` only the parts that hold listed slots have any (``live_ptr`` tiles of ``TP`` pages,
    ``SLOTS_PER_PART`` slots a part). When those fit ``SMALL`` slots they are gathered compacted, still in page
    order, and searched at that width instead of ``NCHUNK * KP``; else at the capacity's width. One kernel, the
    branch taken on the device, so a CUDA graph holds either."""
    i_h, i_s = tl.program_id(0), tl.program_id(1).to(tl.int64)
    base = (i_s * tl.num_programs(0) + i_h) * NCHUNK * KP
    k = _budget(k_ptr, K, K_DEV)
    per = tl.maximum(tl.minimum(k, KP), 1)
    parts = NCHUNK
    if LIVE:
        parts = tl.minimum((tl.load(live_ptr) * TP + SLOTS_PER_PART - 1) // SLOTS_PER_PART, NCHUNK)
    if parts * per <= SMALL:
        o_m = tl.arange(0, SMALL)
        idx = (o_m // per) * KP + o_m % per
        keys_live = tl.load(cand_key_ptr + base + idx, mask=o_m < parts * per, other=0)
        pages_live = tl.load(cand_page_ptr + base + idx, mask=o_m < parts * per, other=0)
        _merge_store(keys_live, pages_live, k, out_ptr, i_s, i_h, stride_os, stride_oh, K, KP, NT, ROUNDS)
    else:
        o_n = tl.arange(0, NP)
        keys = tl.load(cand_key_ptr + base + o_n, mask=o_n < NCHUNK * KP, other=0)
        pages = tl.load(cand_page_ptr + base + o_n, mask=o_n < NCHUNK * KP, other=0)
        _merge_store(keys, pages, k, out_ptr, i_s, i_h, stride_os, stride_oh, K, KP, NT, ROUNDS)


@triton.jit
def _group_topk_kernel(key_in_ptr, page_in_ptr, key_out_ptr, page_out_ptr, k_ptr, NCHUNK, NGROUP, K,
                       GROUP: tl.constexpr, KP: tl.constexpr, NT: tl.constexpr, ROUNDS: tl.constexpr,
                       K_DEV: tl.constexpr):
    """Top ``K`` candidates of chunks ``[g * GROUP, (g + 1) * GROUP)``, stored as one chunk's candidates."""
    i_g, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    o_n = tl.arange(0, GROUP * KP)
    head = i_s * tl.num_programs(1) + i_h
    first = i_g * GROUP * KP
    valid = first + o_n < NCHUNK * KP
    keys = tl.load(key_in_ptr + head * NCHUNK * KP + first + o_n, mask=valid, other=0)
    pages = tl.load(page_in_ptr + head * NCHUNK * KP + first + o_n, mask=valid, other=0)
    take, slot, n_taken = _take_top(keys, _budget(k_ptr, K, K_DEV), NT, ROUNDS)
    base = (head * NGROUP + i_g) * KP
    tl.store(key_out_ptr + base + slot, keys, mask=take)
    tl.store(page_out_ptr + base + slot, pages, mask=take)
    o_k = tl.arange(0, KP)
    tl.store(key_out_ptr + base + o_k, tl.zeros([KP], dtype=tl.int32), mask=o_k >= n_taken)


#: pages per first-pass program: long enough that few chunks reach the merge, short enough that one sequence's
#: chunks fill the GPU (1,024 against 2,048: the flat decode step 1-2 us faster at Llama-3.1-8B shapes 128K-256K and
#: 34 us at GLM 1M, the two-level step the same, one H100, ``samples/studies/KERNEL_TUNING.md``)
CHUNK = 1024
#: largest candidate count one merge program searches before a group pass is added: one program's search over
#: many more candidates costs more than the extra launch
MAX_MERGE_KEYS = 2048
#: with a live budget or live listed slots (a calibrated layer's ``c`` as data), the merge gathers the live
#: candidates compacted and searches them at this width when they fit (0: always the capacity's width). One H100,
#: a GLM 1M layer's step with ``c = 4`` as data 60.6 us against 68.5; in the engine the merges 12.6 us against 41.1
#: (``NOTES.md``, in the engine at GLM 1M; ``samples/results/2026-12-07_gpu_0f96b88_default/``)
MERGE_SMALL = 512
#: chunks merged by one program of the group pass
MERGE_GROUP = 8
#: the chunk pass loads a group's query heads as one block of up to this many scores (``[GB, C]``): one memory
#: round trip for the group instead of one a head
BLOCK_SCORES = 16 * 2048
#: warps of a chunk-pass program
CHUNK_WARPS = 8
#: listed slots past one chunk: True takes one program walking the live slots (``select_listed.py``: one launch),
#: False the chunk passes and the merge (three launches, parallel). One H100, per layer step with c as data at the
#: capacity 64 (``NOTES.md``, two-level selection): one program 42.0 / 65.2 / 122.9 us at c = 4 / 16 / 64
#: (Llama 128K), the chunks 46.9 / 60.9 / 86.2; the chunks win wherever a layer reaches far
LISTED_ONE_PROGRAM = False
#: pages of a listed tile (a superpage, ``superpages.py``)
TILE_PAGES = 16
#: thresholds counted per round of the K-th-largest search (a power of two)
SEARCH_ARITY = 8
#: rounds of the ``SEARCH_ARITY``-ary search that narrow the 2^30 + 1 possible keys to one (each keeps at most
#: ``width // SEARCH_ARITY``)
SEARCH_ROUNDS = 11


def _plan(pmax: int, kp: int) -> tuple[int, int]:
    """``(chunk, group)`` for scores over ``pmax`` pages and ``kp = next_pow2(K)`` slots: pages per first-pass
    program (:data:`CHUNK`, at most ``next_pow2(pmax)``, at least ``kp``), and chunks per group-pass program
    (:data:`MERGE_GROUP` when the merge would search more than :data:`MAX_MERGE_KEYS` candidates, else 0)."""
    chunk = max(min(CHUNK, triton.next_power_of_2(pmax)), kp)
    nchunk = triton.cdiv(pmax, chunk)
    group = MERGE_GROUP if nchunk * kp > MAX_MERGE_KEYS else 0
    return chunk, (group if group < nchunk else 0)


def _warps(n: int) -> int:
    """Warps for a search over ``n`` keys (the 8 threshold counts take ``8 n / (32 warps)`` registers a thread)."""
    return min(16, max(4, triton.next_power_of_2(n) // 256))


def _select_fwd(scores, seq_lens, num_kv_heads, budget_pages, page_size, sink_pages, recent_pages, out, tiles,
                budget_live=None, live_tiles=None):
    seqs, num_q_heads, pmax = scores.shape
    assert num_q_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    assert scores.dtype == torch.float32 and scores.stride(-1) == 1, "scores must be fp32, contiguous along pages"
    slots = min(budget_pages, pmax)
    if out is None:
        out = torch.empty(seqs, num_kv_heads, slots, dtype=torch.int64, device=scores.device)
    assert out.shape == (seqs, num_kv_heads, slots) and out.dtype == torch.int64 and out.stride(-1) == 1
    if tiles is not None:
        assert tiles.shape == (seqs, num_kv_heads, pmax // TILE_PAGES) and pmax % TILE_PAGES == 0, "tiles: [S, H, M]"
        assert tiles.stride(-1) == 1, "tiles must be contiguous along M"
    elif budget_pages >= pmax and budget_live is None:
        return every_page(seq_lens, num_kv_heads, pmax, page_size, out)
    if budget_live is not None:
        assert budget_live.dtype == torch.int32 and budget_live.numel() == 1, "budget_live: int32 [1]"
    if live_tiles is not None:
        assert tiles is not None, "live_tiles counts listed tiles: pass tiles"
        assert live_tiles.dtype == torch.int32 and live_tiles.numel() == 1, "live_tiles: int32 [1]"
    kp = triton.next_power_of_2(slots)
    chunk, group = _plan(pmax, kp)
    nchunk = triton.cdiv(pmax, chunk)
    if tiles is not None and nchunk > 1 and LISTED_ONE_PROGRAM:
        # listed slots past one chunk (a capacity sized for c = 64): one program walks the live ones, one launch
        return select_listed(scores, seq_lens, tiles, out, page_size, sink_pages, recent_pages, budget_live,
                             SEARCH_ARITY, SEARCH_ROUNDS, TILE_PAGES)
    groups = num_q_heads // num_kv_heads
    dev = scores.device
    cand_key = torch.empty(seqs, num_kv_heads, nchunk, kp, dtype=torch.int32, device=dev)
    cand_page = torch.empty(seqs, num_kv_heads, nchunk, kp, dtype=torch.int32, device=dev)
    part = torch.empty(seqs, num_q_heads, nchunk, 2, dtype=torch.float32, device=dev)
    single = nchunk == 1
    if not single:
        _chunk_lse_kernel[(nchunk, num_q_heads, seqs)](
            scores,
            seq_lens,
            part,
            scores.stride(0),
            scores.stride(1),
            num_q_heads,
            pmax,
            nchunk,
            B=page_size,
            C=chunk,
            num_warps=4,
        )
    _chunk_topk_kernel[(nchunk, num_kv_heads, seqs)](
        scores,
        seq_lens,
        part,
        cand_key,
        cand_page,
        cand_page if tiles is None else tiles,
        out,
        out if budget_live is None else budget_live,
        scores.stride(0),
        scores.stride(1),
        0 if tiles is None else tiles.stride(0),
        0 if tiles is None else tiles.stride(1),
        out.stride(0),
        out.stride(1),
        num_q_heads,
        pmax,
        nchunk,
        nchunk,
        slots,
        B=page_size,
        G=groups,
        GB=min(triton.next_power_of_2(groups), max(1, BLOCK_SCORES // chunk)),
        C=chunk,
        NPP=triton.next_power_of_2(nchunk),
        KP=kp,
        SINK=sink_pages,
        RECENT=recent_pages,
        NT=SEARCH_ARITY,
        ROUNDS=SEARCH_ROUNDS,
        LIST=tiles is not None,
        TP=TILE_PAGES,
        SINGLE=single,
        K_DEV=budget_live is not None,
        num_warps=CHUNK_WARPS,
    )
    if single:
        return out
    if group:
        ngroup = triton.cdiv(nchunk, group)
        group_key = torch.empty(seqs, num_kv_heads, ngroup, kp, dtype=torch.int32, device=dev)
        group_page = torch.empty(seqs, num_kv_heads, ngroup, kp, dtype=torch.int32, device=dev)
        _group_topk_kernel[(ngroup, num_kv_heads, seqs)](
            cand_key,
            cand_page,
            group_key,
            group_page,
            cand_key if budget_live is None else budget_live,
            nchunk,
            ngroup,
            slots,
            GROUP=group,
            KP=kp,
            NT=SEARCH_ARITY,
            ROUNDS=SEARCH_ROUNDS,
            K_DEV=budget_live is not None,
            num_warps=_warps(group * kp),
        )
        cand_key, cand_page, nchunk = group_key, group_page, ngroup
    small = MERGE_SMALL if (budget_live is not None or live_tiles is not None) and MERGE_SMALL < nchunk * kp else 0
    if small:
        _merge_live_kernel[(num_kv_heads, seqs)](
            cand_key,
            cand_page,
            out,
            out if budget_live is None else budget_live,
            out if live_tiles is None else live_tiles,
            out.stride(0),
            out.stride(1),
            nchunk,
            slots,
            chunk * (group or 1),
            KP=kp,
            NP=triton.next_power_of_2(nchunk * kp),
            NT=SEARCH_ARITY,
            ROUNDS=SEARCH_ROUNDS,
            K_DEV=budget_live is not None,
            LIVE=live_tiles is not None,
            TP=TILE_PAGES,
            SMALL=small,
            num_warps=_warps(nchunk * kp),
        )
        return out
    _merge_topk_kernel[(num_kv_heads, seqs)](
        cand_key,
        cand_page,
        out,
        out if budget_live is None else budget_live,
        out.stride(0),
        out.stride(1),
        nchunk,
        slots,
        KP=kp,
        NP=triton.next_power_of_2(nchunk * kp),
        NT=SEARCH_ARITY,
        ROUNDS=SEARCH_ROUNDS,
        K_DEV=budget_live is not None,
        num_warps=_warps(nchunk * kp),
    )
    return out


def select_pages(
    scores: Tensor,
    seq_lens: Tensor,
    num_kv_heads: int,
    budget_pages: int,
    page_size: int,
    sink_pages: int,
    recent_pages: int,
    out: Tensor | None = None,
    tiles: Tensor | None = None,
    budget_live: Tensor | None = None,
    live_tiles: Tensor | None = None,
) -> Tensor:
    """Pick the pages each KV head reads this step (paper Section 3.3), as ``locks_engine.ops.select_pages``.

    Mass shares are averaged over the query heads of a KV group (GQA); the forced pages (the first
    ``sink_pages``, the last page and the ``recent_pages`` before it) come first, the rest of the
    ``K = budget_pages`` slots go to the largest group shares (ties: lower page first). A sequence with at most
    ``K`` pages reads all of them. A budget of at least ``Pmax`` pages reads every page in ``Pmax`` slots
    (nothing ranked).

    Args:
        scores (Tensor): fp32 estimated log mass `[S, HQ, Pmax]`, contiguous along pages (``score_pages``).
        seq_lens (Tensor): `[S]` int32 tokens.
        num_kv_heads (int): H.
        budget_pages (int): K, pages read per sequence and KV head (>= 1).
        page_size (int): B, tokens a page.
        sink_pages (int): first pages always read.
        recent_pages (int): pages before the last one always read (the last page always is).
        out (Tensor | None): int64 `[S, H, min(K, Pmax)]` written in place (fixed address for CUDA graphs).
        tiles (Tensor | None): int `[S, H, Pmax / 16]` superpages ascending (``-1`` last, unused): slot
            ``16 i + j`` of ``scores`` is then page ``16 tiles[s, h, i] + j`` of KV head ``h`` (``score_pages``
            with ``tiles``), as ``locks_engine.ops.select.select_candidate_pages``; forced pages must be listed.
        budget_live (Tensor | None): int32 `[1]` on the device: the pages taken, at most ``K`` (read by the
            kernels, so a CUDA graph takes a new value without capture; the output keeps ``K`` slots, ``-1``
            past what was taken; a budget of at least ``Pmax`` is then ranked too). None takes ``K``.
        live_tiles (Tensor | None): with ``tiles``, int32 `[1]` on the device: only the first ``live_tiles[0]``
            tiles are listed (the rest ``-1``), so the merge searches only the chunks that hold them
            (:data:`MERGE_SMALL`). The selection is the same with or without it.
    Returns:
        Tensor: int64 `[S, H, min(K, Pmax)]` logical page indices in ascending order, ``-1`` in unused slots.
    Raises:
        AssertionError: on shapes, strides or dtypes the kernels do not take.
    """
    return _select_fwd(scores, seq_lens, num_kv_heads, budget_pages, page_size, sink_pages, recent_pages, out,
                       tiles, budget_live, live_tiles)


def every_page(seq_lens: Tensor, num_kv_heads: int, pmax: int, page_size: int, out: Tensor | None = None) -> Tensor:
    """The selection that reads every page of every sequence, unranked, as ``locks_engine.ops.select.every_page``
    (plain torch, no host synchronization: CUDA-graph safe).

    Args:
        seq_lens (Tensor): `[S]` int32 tokens. num_kv_heads (int): H.
        pmax (int): slots, the pages the block table spans. page_size (int): B, tokens a page.
        out (Tensor | None): int64 `[S, H, Pmax]` written in place (fixed address for CUDA graphs).
    Returns:
        Tensor: int64 `[S, H, Pmax]` logical pages ascending, ``-1`` past each sequence's last page.
    """
    if out is None:
        out = torch.empty(seq_lens.shape[0], num_kv_heads, pmax, dtype=torch.int64, device=seq_lens.device)
    pages = torch.arange(pmax, device=out.device)
    num_pages = (seq_lens.long() + page_size - 1) // page_size
    return out.copy_(torch.where(pages < num_pages.view(-1, 1, 1), pages, -1).expand_as(out))
