"""Shared support for the kernel tests: skip markers, the device, real-key paged scenarios, poisoned buffers.

The kernel tests import without triton (``locks_kernels`` loads its modules on first use) and skip cleanly
when triton or a CUDA GPU is absent. ``TRITON_INTERPRET=1`` runs them on the CPU through Triton's
interpreter (slow; for debugging kernels at small sizes; bf16 matrix products are wrong there).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from locks_engine import LocksConfig
from locks_engine.ops import PageSummaries, allocate_page_summaries
from tests.support.helpers import PagedScenario
from tests.support.paths import FIXTURES

HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if HAS_CUDA and not INTERPRET else "cpu"
ON_GPU = DEVICE == "cuda"

requires_kernels = pytest.mark.skipif(
    not (HAS_TRITON and (HAS_CUDA or INTERPRET)),
    reason="Triton kernels need triton and a CUDA GPU (or TRITON_INTERPRET=1 for the CPU interpreter)",
)
requires_cuda_graphs = pytest.mark.skipif(
    not (HAS_TRITON and HAS_CUDA and not INTERPRET), reason="CUDA graph capture needs triton and a CUDA GPU"
)
requires_bf16_dot = pytest.mark.skipif(not ON_GPU, reason="Triton's interpreter multiplies bf16 wrongly")

FIXTURE = FIXTURES / "real_qk_qwen25coder05b.npz"


def on_device(sc: PagedScenario) -> PagedScenario:
    """The scenario's tensors on ``DEVICE``."""
    return PagedScenario(*(t.to(DEVICE) for t in (sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens)),
                         sc.page_size)


def poisoned(shape, dtype: torch.dtype) -> torch.Tensor:
    """A buffer of NaN (floats) or of 99 (integers: out of int4 range, improbable as int8), so that unwritten
    elements show."""
    fill = float("nan") if dtype.is_floating_point else 99
    return torch.full(shape, fill, dtype=dtype, device=DEVICE)


def real_scenario(layer: int, num_tokens: int, block_size: int = 32, query: int = -1, seed: int = 0) -> PagedScenario:
    """Real post-RoPE keys of Qwen2.5-Coder-0.5B (one KV head, its 7 query heads; D = 64) in a permuted paged
    cache of ``num_tokens`` tokens, with the real query of that position; values are random."""
    data = np.load(FIXTURE)
    keys = torch.from_numpy(data[f"k_L{layer}"][:num_tokens]).float()  # [N, D]
    q = torch.from_numpy(data[f"q_L{layer}"][query]).float()  # [G, D]
    gen = torch.Generator().manual_seed(seed)
    blocks = -(-num_tokens // block_size)
    perm = torch.randperm(blocks + 3, generator=gen)[:blocks] + 1  # block 0 reserved
    k_cache = torch.randn(blocks + 4, block_size, 1, keys.shape[1], generator=gen)
    padded = torch.cat((keys, torch.zeros(blocks * block_size - num_tokens, keys.shape[1])))
    k_cache[perm] = padded.view(blocks, block_size, 1, -1)
    v_cache = torch.randn(k_cache.shape, generator=gen)
    sc = PagedScenario(q.unsqueeze(0), k_cache, v_cache, perm.view(1, -1).int(),
                       torch.tensor([num_tokens], dtype=torch.int32), 16)
    return on_device(sc)


def summaries_on_device(store: PageSummaries) -> tuple[torch.Tensor, ...]:
    """A ``colwise8`` store as the kernels take it: the colwise8 tuple on ``DEVICE``."""
    return tuple(t.to(DEVICE) for t in store.colwise8())


def as_store(summaries: tuple[torch.Tensor, ...]) -> PageSummaries:
    """The kernels' colwise8 tuple as a ``PageSummaries`` on the CPU (for the ops twins)."""
    names = ("centroid", "basis", "coeffs", "basis_scale", "coeffs_scale")
    return PageSummaries("colwise8", **{n: t.cpu() for n, t in zip(names, summaries)})


def allocate_summaries(num_pages: int, heads: int, dim: int, rank: int = 8, poison: bool = False):
    """A colwise8 tuple of ``num_pages`` pages on ``DEVICE``: zeros, or ``poisoned`` (NaN scales and centroids,
    99 in the int8 tensors) so that unwritten pages show."""
    store = allocate_page_summaries(num_pages, heads, dim, LocksConfig(rank=rank), DEVICE)
    tensors = store.colwise8()
    if poison:
        for tensor in tensors:
            tensor.copy_(poisoned(tensor.shape, tensor.dtype))
    return tensors
