"""Shared test helpers: seeded paged-cache scenarios and an FLA-style relative-RMSE comparison."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def assert_close(name: str, ref: Tensor, out: Tensor, ratio: float) -> None:
    """Fail when ``out`` has a NaN/inf or its RMSE relative to ``ref``'s RMS exceeds ``ratio``."""
    ref, out = ref.double(), out.double()
    assert torch.isfinite(out).all(), f"{name}: non-finite values in output"
    err = (ref - out).pow(2).mean().sqrt()
    base = ref.pow(2).mean().sqrt().clamp_min(1e-12)
    assert err / base <= ratio, f"{name}: relative RMSE {float(err / base):.3g} > {ratio}"


@dataclass
class PagedScenario:
    q: Tensor  # [S, HQ, D]
    k_cache: Tensor  # [num_blocks, block_size, H, D]
    v_cache: Tensor
    block_table: Tensor  # [S, max_blocks]
    seq_lens: Tensor  # [S]
    page_size: int

    @property
    def block_size(self) -> int:
        return self.k_cache.shape[1]


def make_scenario(
    seq_lens: list[int],
    num_kv_heads: int,
    groups: int,
    head_dim: int,
    page_size: int = 16,
    block_size: int = 32,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    key_offset: float = 0.0,
) -> PagedScenario:
    """Random paged cache vLLM-style: block 0 reserved (never used), blocks randomly permuted across sequences.

    ``key_offset`` adds a constant channel to the keys (real keys have large near-constant channels).
    """
    gen = torch.Generator().manual_seed(seed)
    max_blocks = max(1, max(-(-n // block_size) for n in seq_lens))
    num_blocks = 1 + sum(max(1, -(-n // block_size)) for n in seq_lens) + 3
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    block_table = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    for s, n in enumerate(seq_lens):
        for b in range(max(1, -(-n // block_size))):
            block_table[s, b] = perm.pop()
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen)
    k_cache[..., 0] += key_offset
    v_cache = torch.randn(shape, generator=gen)
    q = torch.randn(len(seq_lens), num_kv_heads * groups, head_dim, generator=gen)
    return PagedScenario(
        q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), block_table,
        torch.tensor(seq_lens, dtype=torch.int32), page_size,
    )

