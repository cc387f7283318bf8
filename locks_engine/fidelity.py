"""Offline selection fidelity: how much of the true attention mass each page selector keeps.

Works on captured post-RoPE queries and keys of one KV head (``samples/make_real_qk_fixture.py``,
``samples/bench_fidelity.py``): each captured query is one decode step over the keys before it.
The measure is ``mass kept by the selector / mass kept by the exact-LSE oracle`` at the same page budget,
per step and query head (1.0: as good as the oracle; it can pass 1.0, the oracle being group-shared).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from locks_engine.config import LocksConfig
from locks_engine.ops import (
    attention_mass_kept,
    build_cache_summaries,
    build_quest_summaries,
    build_shared_basis_summaries,
    fit_shared_basis,
    oracle_scores,
    quest_scores,
    score_pages,
    select_pages,
    shared_basis_scores,
    shared_rank_at_equal_bytes,
    window_scores,
)


@dataclass
class DecodeSteps:
    """Decode steps of one layer and KV head as a batch sharing one block table (block size = page size)."""

    keys: Tensor
    """`[N, D]` post-RoPE keys, N a multiple of the page size."""
    queries: Tensor
    """`[T, G, D]` post-RoPE queries of the G query heads of this KV head."""
    positions: Tensor
    """`[T]` token position of each query: step ``t`` reads keys ``0 .. positions[t]``."""
    page_size: int = 16

    def __post_init__(self) -> None:
        n, dim = self.keys.shape
        if n % self.page_size:
            raise ValueError(f"keys: {n} tokens is not a multiple of page_size={self.page_size}")
        self.k_cache = self.keys.float().view(n // self.page_size, self.page_size, 1, dim)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.q = self.queries.float()
        self.seq_lens = self.positions.long() + 1
        self.block_table = torch.arange(n // self.page_size).expand(len(self.positions), -1)

    @property
    def pages(self) -> int:
        return self.k_cache.shape[0]

    def budget(self, fraction: float, minimum_pages: int = 3) -> int:
        """Token budget for ``fraction`` of the pages (at least ``minimum_pages``)."""
        return max(minimum_pages, round(self.pages * fraction)) * self.page_size

    def kept(self, scores: Tensor, cfg: LocksConfig) -> Tensor:
        """True attention mass `[T, G]` on the pages ``select_pages`` picks from ``scores`` `[T, G, Pmax]`."""
        selected = select_pages(scores, self.seq_lens, 1, cfg)
        return attention_mass_kept(
            self.q, self.k_cache, self.v_cache, self.block_table, self.seq_lens, selected, self.page_size
        )

    def scores(self, selector: str, cfg: LocksConfig) -> Tensor:
        """Estimated log masses `[T, G, Pmax]` of a selector: ``oracle``, ``locks`` (``cfg``'s rank and
        format), ``quest``, ``shared`` (rank ``cfg.rank``), ``shared-bytes`` (rank at LOCKS's bytes),
        ``window``.

        Raises:
            ValueError: on an unknown selector.
        """
        args = (self.block_table, self.seq_lens, self.page_size)
        if selector == "oracle":
            return oracle_scores(self.q, self.k_cache, *args)
        if selector == "locks":
            store = build_cache_summaries(self.k_cache, self.block_table, self.seq_lens, cfg)
            return score_pages(self.q, store, *args, self.page_size)
        if selector == "quest":
            return quest_scores(self.q, build_quest_summaries(self.k_cache), *args, self.page_size)
        if selector in ("shared", "shared-bytes"):
            rank = cfg.rank if selector == "shared" else self.shared_rank_at_equal_bytes(cfg)
            basis = fit_shared_basis(self.k_cache[: int(self.seq_lens.min()) // self.page_size], rank)
            store = build_shared_basis_summaries(self.k_cache, basis)
            return shared_basis_scores(self.q, store, basis, *args, self.page_size)
        if selector == "window":
            return window_scores(self.seq_lens, self.q.shape[1], self.pages, self.page_size)
        raise ValueError(f"unknown selector {selector!r}: allowed oracle, locks, quest, shared, shared-bytes, window")

    def shared_rank_at_equal_bytes(self, cfg: LocksConfig) -> int:
        """Shared-basis rank whose bytes per page match LOCKS's summary bytes (``cfg``'s format)."""
        fmt = cfg.summary_format if cfg.summary_format != "float" else "colwise"
        return shared_rank_at_equal_bytes(
            LocksConfig(rank=cfg.rank, summary_format=fmt), self.keys.shape[1], self.pages
        )

    def mass_vs_oracle(self, selector: str, cfg: LocksConfig) -> Tensor:
        """`[T, G]` mass kept by ``selector`` divided by the oracle's at ``cfg``'s budget (0/0 -> 1)."""
        oracle = self.kept(self.scores("oracle", cfg), cfg)
        kept = self.kept(self.scores(selector, cfg), cfg)
        return torch.where(oracle > 0, kept / oracle.clamp_min(1e-30), torch.ones_like(kept))
