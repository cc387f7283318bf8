"""Stage 3 in Triton: group-shared top-K page selection under the budget (paper Section 3.3).

Two to four launches, all of fixed shape (CUDA-graph safe), for scores `[S, HQ, Pmax]` cut into chunks of ``C`` pages:

1. ``_chunk_lse_kernel``: per query head and chunk, the max and the sum of ``exp(score - max)`` (skipped when
   the persistent score kernel wrote such partials per program: ``select_pages(lse_partials=...)``).
2. ``_chunk_topk_kernel``: per KV head and chunk, the page priority of ``ops.select_pages`` (mean over the
   group's query heads of ``exp(score - lse)``, 2.0 for forced pages, none for pages past the sequence) as a
   32-bit key (``float bits + 1``, 0 = not a page), the K-th largest key by an 8-ary search
   (:data:`SEARCH_ARITY`), and the pages at or above it compacted in page order with a prefix sum (ties broken towards lower pages). The group's
   query heads are loaded as one block (up to :data:`BLOCK_SCORES` scores, then blocks of heads in turn).
3. ``_merge_topk_kernel``: the same over the chunks' candidates; candidates arrive in page order, so the
   output is ascending without a sort. Where the chunks' candidates are many (long contexts),
   ``_group_topk_kernel`` first keeps the top ``K`` of
   each group of :data:`MERGE_GROUP` chunks (one more launch, each group's candidates still in page order):
   the top ``K`` of a union is the top ``K`` of its parts' top ``K``, ties included, so the output is the same.

The plan (:func:`plan`): chunks of :data:`CHUNK` pages, and a group pass when the merge would otherwise search
more than :data:`MAX_MERGE_KEYS` candidates (timed in ``samples/bench_select.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks_engine.config import LocksConfig


@triton.jit
def _chunk_lse_kernel(scores_ptr, part_ptr, stride_ss, stride_sh, HQ, PMAX, NCHUNK, C: tl.constexpr):
    i_c, i_hq, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    o_p = i_c * C + tl.arange(0, C)
    b_s = tl.load(scores_ptr + i_s * stride_ss + i_hq * stride_sh + o_p, mask=o_p < PMAX, other=float("-inf"))
    b_max = tl.max(b_s, axis=0)
    b_sum = tl.sum(tl.exp(b_s - tl.where(b_max == float("-inf"), 0.0, b_max)), axis=0)
    p_part = part_ptr + ((i_s * HQ + i_hq) * NCHUNK + i_c) * 2
    tl.store(p_part, b_max)
    tl.store(p_part + 1, b_sum)


@triton.jit
def _kth_largest(keys, K, NT: tl.constexpr, ROUNDS: tl.constexpr):
    """Largest ``t >= 1`` with at least ``K`` keys ``>= t`` (1 when fewer than ``K`` keys are ``>= 1``).

    ``NT``-ary search: each round counts the keys at ``NT`` thresholds at once (one block reduction) and keeps
    one ``NT``-th of the range, so ``ROUNDS`` (:func:`search_rounds`) cover the 2^30 + 1 possible keys.
    Invariant: ``count(keys >= lo) >= K`` (or ``lo == 1``) and ``count(keys >= hi + 1) < K``."""
    o_t = tl.arange(0, NT)
    lo = tl.zeros([], dtype=tl.int32) + 1
    hi = tl.zeros([], dtype=tl.int32) + 0x40000001  # bits of 2.0 (forced) + 1
    for _ in range(ROUNDS):
        step = (hi - lo) // NT + 1
        t = lo + o_t * step  # [NT]
        good = tl.sum((keys[:, None] >= t[None, :]).to(tl.int32), axis=0) >= K
        j = tl.maximum(tl.sum(good.to(tl.int32), axis=0) - 1, 0)  # last good threshold (t_0 = lo is good)
        hi = tl.where(j < NT - 1, tl.minimum(hi, lo + (j + 1) * step - 1), hi)
        lo = lo + j * step
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
def _chunk_topk_kernel(
    scores_ptr, seq_lens_ptr, part_ptr, cand_key_ptr, cand_page_ptr,
    stride_ss, stride_sh, HQ, PMAX, NCHUNK, NPART, K,
    B: tl.constexpr, G: tl.constexpr, GB: tl.constexpr, C: tl.constexpr, NPP: tl.constexpr, KP: tl.constexpr,
    SINK: tl.constexpr, RECENT: tl.constexpr, NT: tl.constexpr, ROUNDS: tl.constexpr,
):
    i_c, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    o_p = i_c * C + tl.arange(0, C)
    o_n = tl.arange(0, NPP)
    o_g = tl.arange(0, GB)
    num_pages = (tl.load(seq_lens_ptr + i_s) + B - 1) // B
    b_pri = tl.zeros([C], dtype=tl.float32)
    # GB query heads a block: their loads are issued at once (GB = GP: one round trip for the whole group)
    for g0 in range(0, G, GB):
        m_g = g0 + o_g < G
        hq = i_h * G + g0 + o_g
        m_n = m_g[:, None] & (o_n < NPART)[None, :]
        p_part = part_ptr + ((i_s * HQ + hq[:, None]) * NPART + o_n[None, :]) * 2  # [GB, NPP]
        b_m = tl.load(p_part, mask=m_n, other=float("-inf"))
        b_l = tl.load(p_part + 1, mask=m_n, other=0.0)
        m_p = m_g[:, None] & (o_p < PMAX)[None, :]
        b_s = tl.load(scores_ptr + i_s * stride_ss + hq[:, None] * stride_sh + o_p[None, :], mask=m_p,
                      other=float("-inf"))  # [GB, C]
        top = tl.max(b_m, axis=1)
        top = tl.where(top == float("-inf"), 0.0, top)
        total = tl.sum(b_l * tl.exp(b_m - top[:, None]), axis=1)
        lse = top + tl.log(tl.where(total > 0.0, total, 1.0))  # [GB]
        b_pri += tl.sum(tl.where((total > 0.0)[:, None], tl.exp(b_s - lse[:, None]), 0.0), axis=0)
    b_pri = b_pri / G
    forced = (o_p < SINK) | (o_p >= num_pages - 1 - RECENT)
    b_pri = tl.where(forced, 2.0, b_pri)
    keys = tl.where(o_p < num_pages, b_pri.to(tl.int32, bitcast=True) + 1, 0)
    take, slot, n_taken = _take_top(keys, K, NT, ROUNDS)
    base = ((i_s * tl.num_programs(1) + i_h) * NCHUNK + i_c) * KP
    tl.store(cand_key_ptr + base + slot, keys, mask=take)
    tl.store(cand_page_ptr + base + slot, o_p, mask=take)
    o_k = tl.arange(0, KP)
    tl.store(cand_key_ptr + base + o_k, tl.zeros([KP], dtype=tl.int32), mask=o_k >= n_taken)


@triton.jit
def _merge_topk_kernel(cand_key_ptr, cand_page_ptr, out_ptr, stride_os, stride_oh, NCHUNK, K,
                       KP: tl.constexpr, NP: tl.constexpr, NT: tl.constexpr, ROUNDS: tl.constexpr):
    i_h, i_s = tl.program_id(0), tl.program_id(1).to(tl.int64)
    o_n = tl.arange(0, NP)
    base = (i_s * tl.num_programs(0) + i_h) * NCHUNK * KP
    keys = tl.load(cand_key_ptr + base + o_n, mask=o_n < NCHUNK * KP, other=0)
    pages = tl.load(cand_page_ptr + base + o_n, mask=o_n < NCHUNK * KP, other=0)
    take, slot, n_taken = _take_top(keys, K, NT, ROUNDS)
    p_out = out_ptr + i_s * stride_os + i_h * stride_oh
    tl.store(p_out + slot, pages.to(tl.int64), mask=take)
    o_k = tl.arange(0, KP)
    tl.store(p_out + o_k, tl.full([KP], -1, tl.int64), mask=(o_k >= n_taken) & (o_k < K))


@triton.jit
def _group_topk_kernel(key_in_ptr, page_in_ptr, key_out_ptr, page_out_ptr, NCHUNK, NGROUP, K,
                       GROUP: tl.constexpr, KP: tl.constexpr, NT: tl.constexpr, ROUNDS: tl.constexpr):
    """Top ``K`` candidates of chunks ``[g * GROUP, (g + 1) * GROUP)``, stored as one chunk's candidates."""
    i_g, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    o_n = tl.arange(0, GROUP * KP)
    head = i_s * tl.num_programs(1) + i_h
    first = i_g * GROUP * KP
    valid = first + o_n < NCHUNK * KP
    keys = tl.load(key_in_ptr + head * NCHUNK * KP + first + o_n, mask=valid, other=0)
    pages = tl.load(page_in_ptr + head * NCHUNK * KP + first + o_n, mask=valid, other=0)
    take, slot, n_taken = _take_top(keys, K, NT, ROUNDS)
    base = (head * NGROUP + i_g) * KP
    tl.store(key_out_ptr + base + slot, keys, mask=take)
    tl.store(page_out_ptr + base + slot, pages, mask=take)
    o_k = tl.arange(0, KP)
    tl.store(key_out_ptr + base + o_k, tl.zeros([KP], dtype=tl.int32), mask=o_k >= n_taken)


#: pages per first-pass program (measured best or within 5% of it for one sequence at 128K-1M, 2 and 8 KV heads,
#: and for 6 sequences at 128K: ``samples/bench_select.py``, ``kernels/NOTES.md``)
CHUNK = 2048
#: largest candidate count one merge program searches before a group pass is added (8,320 candidates took 211 us
#: where the group pass and a 1,152-candidate merge took 43 us)
MAX_MERGE_KEYS = 2048
#: chunks merged by one program of the group pass
MERGE_GROUP = 8
#: the chunk pass loads a group's query heads as one block of up to this many scores (``[GB, C]``, 8 warps): one
#: memory round trip for the group instead of one a head. ``samples/bench_select.py``, 2026-12-03, one H200, whole
#: selection: GLM 1M (G = 16) 34.8 us, Llama 1M (G = 4) 39.0 us against 122.4 one head at a time (8 warps) and
#: 80.7 (4 warps); 16 warps lost everywhere (45.2 at Llama 1M)
BLOCK_SCORES = 16 * 2048
#: warps of a chunk-pass program
CHUNK_WARPS = 8


#: thresholds counted per round of the K-th-largest search (a power of two): more thresholds, fewer rounds (11 at 8,
#: 8 at 16), each with a wider block reduction
SEARCH_ARITY = 8


def search_rounds(arity: int) -> int:
    """Rounds of an ``arity``-ary search that narrow the 2^30 + 1 possible keys to one (each keeps at most
    ``width // arity``): 11 for 8, 8 for 16."""
    width, rounds = 1 << 30, 0
    while width:
        width, rounds = width // arity, rounds + 1
    return rounds


def plan(pmax: int, kp: int, chunk: int | None = None, group: int | None = None) -> tuple[int, int]:
    """``(chunk, group)`` for scores over ``pmax`` pages and ``kp = next_pow2(K)`` slots: pages per first-pass
    program (:data:`CHUNK`, at most ``next_pow2(pmax)``, at least ``kp``), and chunks per group-pass program
    (:data:`MERGE_GROUP` when the merge would search more than :data:`MAX_MERGE_KEYS` candidates, else 0).
    Given values are kept (``chunk`` raised to ``kp``); tuning only."""
    chunk = max(chunk or min(CHUNK, triton.next_power_of_2(pmax)), kp)
    nchunk = triton.cdiv(pmax, chunk)
    if group is None:
        group = MERGE_GROUP if nchunk * kp > MAX_MERGE_KEYS else 0
    return chunk, (group if group and group < nchunk else 0)


def _warps(n: int) -> int:
    """Warps for a block of ``n`` values: a search over ``n`` keys (the 8 threshold counts take ``8 n / (32
    warps)`` registers a thread), or a chunk's ``[GP, C]`` scores (``n / (32 warps)`` a thread)."""
    return min(16, max(4, triton.next_power_of_2(n) // 256))


def _select_fwd(scores, seq_lens, num_kv_heads, cfg, out, chunk, group, heads_a_block, chunk_warps, lse_partials,
                search_arity, merge_warps):
    seqs, num_q_heads, pmax = scores.shape
    assert num_q_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    assert scores.dtype == torch.float32 and scores.stride(-1) == 1, "scores must be fp32, contiguous along pages"
    covers = cfg.dense or cfg.budget_pages >= pmax  # every page fits the budget: no ranking
    slots = pmax if covers else cfg.budget_pages
    if out is None:
        out = torch.empty(seqs, num_kv_heads, slots, dtype=torch.int64, device=scores.device)
    assert out.shape == (seqs, num_kv_heads, slots) and out.dtype == torch.int64 and out.stride(-1) == 1
    if covers:
        pages = torch.arange(pmax, device=scores.device)
        num_pages = (seq_lens.long() + cfg.page_size - 1) // cfg.page_size
        out.copy_(torch.where(pages < num_pages.view(-1, 1, 1), pages, -1).expand_as(out))
        return out
    kp = triton.next_power_of_2(slots)
    arity = search_arity or SEARCH_ARITY
    assert arity >= 2 and arity & (arity - 1) == 0, "search_arity must be a power of two >= 2"
    rounds = search_rounds(arity)
    assert not group or group & (group - 1) == 0, "group must be a power of two"
    chunk, group = plan(pmax, kp, chunk, group)
    nchunk = triton.cdiv(pmax, chunk)
    groups = num_q_heads // num_kv_heads
    if heads_a_block is None:
        heads_a_block = min(triton.next_power_of_2(groups), max(1, BLOCK_SCORES // chunk))
    assert heads_a_block >= 1 and heads_a_block & (heads_a_block - 1) == 0, "heads_a_block must be a power of two"
    dev = scores.device
    cand_key = torch.empty(seqs, num_kv_heads, nchunk, kp, dtype=torch.int32, device=dev)
    cand_page = torch.empty(seqs, num_kv_heads, nchunk, kp, dtype=torch.int32, device=dev)
    part = lse_partials
    if part is None:
        part = torch.empty(seqs, num_q_heads, nchunk, 2, dtype=torch.float32, device=dev)
        _chunk_lse_kernel[(nchunk, num_q_heads, seqs)](
            scores,
            part,
            scores.stride(0),
            scores.stride(1),
            num_q_heads,
            pmax,
            nchunk,
            C=chunk,
            num_warps=4,
        )
    assert part.shape[:2] == (seqs, num_q_heads) and part.shape[3] == 2 and part.is_contiguous(), \
        "lse_partials must be contiguous [S, HQ, N, 2]"
    _chunk_topk_kernel[(nchunk, num_kv_heads, seqs)](
        scores,
        seq_lens,
        part,
        cand_key,
        cand_page,
        scores.stride(0),
        scores.stride(1),
        num_q_heads,
        pmax,
        nchunk,
        part.shape[2],
        slots,
        B=cfg.page_size,
        G=groups,
        GB=heads_a_block,
        C=chunk,
        NPP=triton.next_power_of_2(part.shape[2]),
        KP=kp,
        SINK=cfg.sink_pages,
        RECENT=cfg.recent_pages,
        NT=arity,
        ROUNDS=rounds,
        num_warps=chunk_warps or CHUNK_WARPS,
    )
    if group:
        ngroup = triton.cdiv(nchunk, group)
        group_key = torch.empty(seqs, num_kv_heads, ngroup, kp, dtype=torch.int32, device=dev)
        group_page = torch.empty(seqs, num_kv_heads, ngroup, kp, dtype=torch.int32, device=dev)
        _group_topk_kernel[(ngroup, num_kv_heads, seqs)](
            cand_key, cand_page, group_key, group_page, nchunk, ngroup, slots,
            GROUP=group, KP=kp, NT=arity, ROUNDS=rounds, num_warps=merge_warps or _warps(group * kp),
        )
        cand_key, cand_page, nchunk = group_key, group_page, ngroup
    _merge_topk_kernel[(num_kv_heads, seqs)](
        cand_key,
        cand_page,
        out,
        out.stride(0),
        out.stride(1),
        nchunk,
        slots,
        KP=kp,
        NP=triton.next_power_of_2(nchunk * kp),
        NT=arity,
        ROUNDS=rounds,
        num_warps=merge_warps or _warps(nchunk * kp),
    )
    return out


def select_pages(
    scores: Tensor,
    seq_lens: Tensor,
    num_kv_heads: int,
    cfg: LocksConfig,
    out: Tensor | None = None,
    chunk: int | None = None,
    group: int | None = None,
    heads_a_block: int | None = None,
    chunk_warps: int | None = None,
    lse_partials: Tensor | None = None,
    search_arity: int | None = None,
    merge_warps: int | None = None,
) -> Tensor:
    """Pick the pages each KV head reads this step (paper Section 3.3), as ``locks_engine.ops.select_pages``.

    Mass shares are averaged over the query heads of a KV group (GQA); the forced pages (the first
    ``sink_pages``, the last page and the ``recent_pages`` before it) come first, the rest of the
    ``K = cfg.budget_pages`` slots go to the largest group shares (ties: lower page first). A sequence with
    at most ``K`` pages reads all of them. With ``cfg.dense``, or a budget of at least ``Pmax`` pages, every
    page is read in ``Pmax`` slots (nothing ranked).

    Args:
        scores (Tensor): fp32 estimated log mass `[S, HQ, Pmax]`, contiguous along pages (``score_pages``).
        seq_lens (Tensor): `[S]` int32 tokens.
        num_kv_heads (int): H.
        cfg (LocksConfig): budget, page size, sink and recent pages.
        out (Tensor | None): int64 `[S, H, K]` written in place (fixed address for CUDA graphs).
        chunk (int | None): pages per program in the first pass (a power of two >= K; tuning only).
        group (int | None): chunks per program of the group pass, a power of two (0: none; tuning only);
            None: :func:`plan` decides.
        heads_a_block (int | None): query heads the chunk pass loads as one block, a power of two (None: the
            whole group, up to :data:`BLOCK_SCORES` scores a block; tuning only).
        chunk_warps (int | None): warps of a chunk-pass program (None: :data:`CHUNK_WARPS`; tuning only).
        lse_partials (Tensor | None): fp32 `[S, HQ, N, 2]` contiguous, ``(m, sum exp(score - m))`` of each query
            head's scores over ``N`` disjoint sets of pages that cover them all (``score_pages(lse_partials=True)``
            writes them): the log-sum-exp of each head is combined from them and the first pass over the scores
            (``_chunk_lse_kernel``) is skipped. None: that pass runs.
        search_arity (int | None): thresholds per round of the K-th-largest search, a power of two (None:
            :data:`SEARCH_ARITY`; tuning only, the same pages whatever the arity).
        merge_warps (int | None): warps of a group-pass and merge program (None: by candidate count, 4 to 16;
            1 keeps the search's reductions inside one warp, no barriers; tuning only).
    Returns:
        Tensor: int64 `[S, H, K]` logical page indices in ascending order, ``-1`` in unused slots.
    Raises:
        AssertionError: on shapes, strides or dtypes the kernels do not take.
    """
    return _select_fwd(scores, seq_lens, num_kv_heads, cfg, out, chunk, group, heads_a_block, chunk_warps,
                       lse_partials, search_arity, merge_warps)
