"""LOCKS decode stages in Triton for ``colwise8`` summaries, with the names of their ``locks_engine.ops`` twins.

``build_page_summaries -> score_pages -> select_pages -> sparse_paged_attention``, plus
``build_cache_summaries`` (prefill), ``build_completed_page_summaries`` (the page a decode step completes),
``every_page``, ``select_step`` and ``decode_step`` (one layer's step, composed once: what the vLLM backend's CUDA
path runs and what the benchmark times), the two-level selection (``build_completed_superpages``,
``superpage_scores``, ``select_two_level``, ``superpage_slots``: ``superpages.py``), the tail estimate
(``allocate_value_means``, ``build_cache_value_means``, ``build_completed_value_means``: ``value_means.py``;
``tail_split``, ``tail_paged_attention``: ``tail.py``) and ``batched_eigh`` (the 16 x 16 Jacobi eigensolver).
They take tensors and plain integers (summaries as the colwise8 tuple ``(centroid, basis, coeffs, basis_scale,
coeffs_scale)``, value means as ``(means, scale)``) and import nothing from ``locks_engine``. Each takes optional
``out`` buffers; all launch fixed grids with no host synchronization, so a whole decode step can be captured in one
CUDA graph at a fixed budget. Importing this package does not import triton: each function loads its module on
first use (so CPU-only machines can import it, and tests can skip cleanly).
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "batched_eigh": "locks_kernels.eigh",
    "build_page_summaries": "locks_kernels.summaries",
    "build_cache_summaries": "locks_kernels.summaries",
    "build_completed_page_summaries": "locks_kernels.summaries",
    "score_pages": "locks_kernels.score",
    "select_pages": "locks_kernels.select",
    "every_page": "locks_kernels.select",
    "sparse_paged_attention": "locks_kernels.attention",
    "select_step": "locks_kernels.step",
    "decode_step": "locks_kernels.step",
    "build_completed_superpages": "locks_kernels.superpages",
    "superpage_scores": "locks_kernels.superpages",
    "superpage_slots": "locks_kernels.superpages",
    "select_two_level": "locks_kernels.superpages",
    "allocate_value_means": "locks_kernels.value_means",
    "build_cache_value_means": "locks_kernels.value_means",
    "build_completed_value_means": "locks_kernels.value_means",
    "tail_split": "locks_kernels.tail",
    "tail_paged_attention": "locks_kernels.tail",
}

__all__ = sorted(_MODULES)


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module 'locks_kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULES[name]), name)
