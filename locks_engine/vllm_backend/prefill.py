"""Dense attention for the prefill rows of a step (LOCKS only changes decode).

On vLLM's CPU platform the rows run on vLLM's own CPU attention kernel (ISA ``amx``, ``vec`` or ``vec16``:
the layout of the cache, ``compat.cpu_isa``); on CUDA, fp16/bf16 rows run on vLLM's FlashAttention
(``flash_attn_varlen_func`` over the paged cache, as vLLM's FLASH_ATTN backend calls it); anything else (fp32,
CPU tensors off vLLM's CPU platform) on a plain-torch path that attends each row over its cached keys with a
causal mask, in query chunks (correct, not fast).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

import torch
from torch import Tensor

from locks_engine.vllm_backend import compat

#: Query tokens per chunk of the plain-torch path (bounds the `[HQ, chunk, seq_len]` logits).
TORCH_CHUNK = 512


@dataclass
class PrefillRows:
    """The prefill rows of a step, rebased so that their first query token is token 0."""

    query_start_loc: Tensor
    """`[R+1]` int32: query token offsets of the rows, from 0."""
    seq_lens: Tensor
    """`[R]` int32: tokens of each row's sequence after this step (context + query)."""
    block_table: Tensor
    """`[R, W]` int32 physical block ids."""
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    schedules: dict = field(default_factory=dict)
    """vLLM CPU kernel schedule by (query head count, ISA), built by the first layer that needs it."""


def attend_prefill(
    rows: PrefillRows, query: Tensor, kv_cache: Tensor, head_size: int, scale: float, out: Tensor,
    cpu_isa: str | None = None,
) -> None:
    """Causal attention of the prefill rows' queries over their cached keys, written into ``out``.

    Args:
        rows (PrefillRows): the rows.
        query (Tensor): `[T, HQ, D]` their query tokens, in row order.
        kv_cache (Tensor): this layer's cache `[num_blocks, H, block_size, 2*D]` (K/V already written).
        head_size (int): D. scale (float): softmax scale.
        out (Tensor): `[T, HQ, D]`, written in place.
        cpu_isa (str | None): vLLM CPU kernel ISA of the cache's layout (``compat.cpu_isa``); None: ``vec`` or
            ``vec16``.
    """
    if compat.on_cpu():
        _attend_cpu_kernel(rows, query, kv_cache, head_size, scale, out, cpu_isa)
    elif query.is_cuda and query.dtype in (torch.float16, torch.bfloat16):
        _attend_flash(rows, query, kv_cache, head_size, scale, out)
    else:
        _attend_torch(rows, query, kv_cache, head_size, scale, out)


@functools.cache
def _flash_attn(head_size: int) -> tuple:
    """vLLM's ``flash_attn_varlen_func`` and the FlashAttention version vLLM picks for this GPU and head size
    (3 on Hopper), as its FLASH_ATTN backend does."""
    try:
        from vllm.v1.attention.backends.fa_utils import (
            flash_attn_varlen_func,
            get_flash_attn_version,
        )
    except ImportError:  # vLLM releases before the v1 move
        from vllm.attention.utils.fa_utils import (
            flash_attn_varlen_func,
            get_flash_attn_version,
        )
    return flash_attn_varlen_func, get_flash_attn_version(head_size=head_size)


def _attend_flash(
    rows: PrefillRows, query: Tensor, kv_cache: Tensor, head_size: int, scale: float, out: Tensor
) -> None:
    flash_attn_varlen_func, fa_version = _flash_attn(head_size)
    k_cache, v_cache = compat.split_kv_cache(kv_cache, head_size, "packed")
    starts = rows.query_start_loc_cpu
    flash_attn_varlen_func(
        q=query[: starts[-1]],
        k=k_cache,
        v=v_cache,
        out=out[: starts[-1]],
        cu_seqlens_q=rows.query_start_loc,
        max_seqlen_q=max(b - a for a, b in itertools.pairwise(starts)),
        seqused_k=rows.seq_lens,
        max_seqlen_k=max(rows.seq_lens_cpu),
        softmax_scale=scale,
        causal=True,
        block_table=rows.block_table,
        fa_version=fa_version,
    )


def _attend_cpu_kernel(
    rows: PrefillRows, query: Tensor, kv_cache: Tensor, head_size: int, scale: float, out: Tensor,
    isa: str | None,
) -> None:
    from vllm import _custom_ops as ops

    num_blocks, num_kv_heads, block_size, _ = kv_cache.shape
    key_cache, value_cache = kv_cache.view(num_blocks, num_kv_heads, 2 * block_size, head_size).chunk(2, dim=2)
    num_heads = query.shape[1]
    isa = isa or compat.cpu_isa(head_size, allow_amx=False)
    schedule = rows.schedules.get((num_heads, isa))
    if schedule is None:
        schedule = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=rows.seq_lens.shape[0],
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_size,
            seq_lens=rows.seq_lens,
            dtype=query.dtype,
            query_start_loc=rows.query_start_loc,
            causal=True,
            sliding_window_size=-1,
            isa=isa,
            enable_kv_split=True,
        )
        rows.schedules[(num_heads, isa)] = schedule
    ops.cpu_attention_with_kv_cache(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        output=out,
        query_start_loc=rows.query_start_loc,
        seq_lens=rows.seq_lens,
        scale=scale,
        causal=True,
        alibi_slopes=None,
        sliding_window=-1,
        block_table=rows.block_table,
        softcap=0.0,
        scheduler_metadata=schedule,
        s_aux=None,
    )


def _attend_torch(
    rows: PrefillRows, query: Tensor, kv_cache: Tensor, head_size: int, scale: float, out: Tensor
) -> None:
    k_cache, v_cache = compat.split_kv_cache(kv_cache, head_size, compat.kv_layout_name())
    block_size = k_cache.shape[1]
    starts, lens = rows.query_start_loc_cpu, rows.seq_lens_cpu
    for row, seq_len in enumerate(lens):
        q_start, q_end = starts[row], starts[row + 1]
        blocks = rows.block_table[row, : -(-seq_len // block_size)].long()
        keys = k_cache[blocks].flatten(0, 1)[:seq_len].transpose(0, 1)  # [H, N, D]
        values = v_cache[blocks].flatten(0, 1)[:seq_len].transpose(0, 1)
        context = seq_len - (q_end - q_start)
        for c0 in range(q_start, q_end, TORCH_CHUNK):
            c1 = min(c0 + TORCH_CHUNK, q_end)
            positions = torch.arange(c0 - q_start, c1 - q_start, device=query.device) + context
            mask = torch.arange(seq_len, device=query.device).unsqueeze(0) <= positions.unsqueeze(1)
            q = query[c0:c1].transpose(0, 1)  # [HQ, C, D]
            o = torch.nn.functional.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
            )
            out[c0:c1] = o.transpose(0, 1).to(out.dtype)
