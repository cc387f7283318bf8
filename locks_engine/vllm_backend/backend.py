"""Static declarations of the LOCKS attention backend (what vLLM asks before it builds anything)."""

from __future__ import annotations

from typing import ClassVar

import torch
from vllm.v1.attention.backend import AttentionBackend, AttentionType, MultipleOf

from locks_engine.vllm_backend import compat

#: Head sizes vLLM's CPU attention kernel (used for dense prefill on CPU) is built for.
CPU_HEAD_SIZES = [32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512]


class LocksAttentionBackend(AttentionBackend):
    """Decoder self-attention: dense prefill, LOCKS sparse decode (``locks_engine.vllm_backend``)."""

    # K/V are written by ``do_kv_cache_update`` before ``forward`` (vLLM calls it per layer).
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16"]

    @staticmethod
    def get_name() -> str:
        # vLLM maps the name back to an enum member (Attention.backend): we are registered as CUSTOM.
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        from locks_engine.vllm_backend.impl import LocksAttentionImpl

        return LocksAttentionImpl

    @staticmethod
    def get_builder_cls():
        from locks_engine.vllm_backend.builder import LocksMetadataBuilder

        return LocksMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        # CPU prefill kernel: multiples of 32; LOCKS pages (16 tokens by default) must divide the block.
        return [MultipleOf(32)] if compat.on_cpu() else [MultipleOf(16)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return CPU_HEAD_SIZES if compat.on_cpu() else []

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    # vLLM 0.32: the layout negotiated for the whole model.
    @classmethod
    def supported_kv_cache_layouts(cls):
        return compat.supported_kv_cache_layouts()

    # vLLM 0.26: shape, stride order and layout of each layer's cache tensor.
    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int, cache_dtype_str: str = "auto"
    ) -> tuple[int, ...]:
        return (num_blocks, num_kv_heads, block_size, 2 * head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False) -> tuple[int, ...]:
        return (0, 1, 2, 3, 4) if include_num_layers_dimension else (0, 1, 2, 3)

    @classmethod
    def get_required_kv_cache_layout(cls):
        return "HND"
