"""Offline selection fidelity: how much of the true attention each page selector keeps.

Works on captured post-RoPE queries, keys (and values) of one KV head (``samples/tools/make_real_qk_fixture.py``,
``samples/bench_fidelity.py``): each captured query is one decode step over the keys before it, all steps
reading one sequence. Measures, per step and query head, at a page budget:

- ``kept``: share of the exact softmax mass on the selected pages; ``ratio``: ``kept`` divided by the exact-LSE
  oracle's ``kept`` at the same budget (1.0: as good as the oracle; per query head it can pass 1.0, far at
  small budgets, the oracle being group-shared); ``group_ratio`` (per step): the same for the mean ``kept`` of
  the KV group's query heads, which the oracle maximizes, so at most 1 (up to ~1e-3: ``select_pages``
  normalizes shares over complete pages, leaving out the always-read last page's few tokens);
- ``recall`` (per step): share of the pages the oracle picks beyond the forced ones (sink, recent, last) that
  the selector picks too;
- ``out_err``: ``|o_sel - o_dense| / |o_dense|`` of the attention output (needs values).

Summaries are built by ``locks_engine.ops``; scores use the formulas of ``score_pages``, ``quest_scores`` and
``shared_basis_scores`` evaluated once for the one sequence instead of through a block table per step (the same
numbers, checked in ``tests/studies/test_fidelity.py``, at a fraction of the memory at 32K tokens). Selection is
``select_pages`` itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from locks_engine.config import QUEST_FORMATS, LocksConfig
from locks_engine.ops import (
    build_page_summaries,
    build_quest_summaries,
    build_shared_basis_summaries,
    fit_shared_basis,
    select_pages,
    shared_rank_at_equal_bytes,
    window_scores,
)
from locks_engine.ops.quant import dequantize
from locks_engine.ops.score import mask_incomplete
from locks_engine.ops.select import forced_page_mask

SELECTORS = ("oracle", "locks", "quest", "shared", "shared-bytes", "window")


def hadamard(dim: int) -> Tensor | None:
    """Orthonormal Sylvester-Hadamard matrix `[D, D]` float64 (a fixed rotation of the keys for the fidelity study),
    or None when ``D`` is not a power of two."""
    if dim & (dim - 1):
        return None
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < dim:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h / dim**0.5


@dataclass
class DecodeSteps:
    """Decode steps of one layer and KV head, all over one sequence (block size = page size)."""

    keys: Tensor
    """`[N, D]` post-RoPE keys, N a multiple of the page size."""
    queries: Tensor
    """`[T, G, D]` post-RoPE queries of the G query heads of this KV head."""
    positions: Tensor
    """`[T]` token position of each query: step ``t`` reads keys ``0 .. positions[t]``."""
    values: Tensor | None = None
    """`[N, D]` values (only needed for ``out_err``)."""
    page_size: int = 16

    def __post_init__(self) -> None:
        n, dim = self.keys.shape
        if n % self.page_size:
            raise ValueError(f"keys: {n} tokens is not a multiple of page_size={self.page_size}")
        if int(self.positions.max()) >= n:
            raise ValueError(f"positions: {int(self.positions.max())} is past the {n} keys")
        self.scale = dim**-0.5
        self.k_pages = self.keys.float().view(n // self.page_size, self.page_size, 1, dim)  # [P, B, 1, D]
        self.q = self.queries.float()
        self.seq_lens = self.positions.long() + 1
        logits = self.scale * torch.einsum("tgd,nd->tgn", self.q, self.keys.float())  # [T, G, N]
        causal = torch.arange(n) < self.seq_lens.unsqueeze(1)  # [T, N]
        logits = logits.masked_fill(~causal.unsqueeze(1), float("-inf"))
        # exact log mass of every page, the partial last one included: [T, G, P]
        self.page_lse = logits.view(*logits.shape[:2], -1, self.page_size).logsumexp(-1)
        self.lse = self.page_lse.logsumexp(-1)  # [T, G]
        self.page_out = None
        if self.values is not None:
            probs = torch.exp(logits - self.lse.unsqueeze(-1)).view(*logits.shape[:2], -1, self.page_size)
            values = self.values.float().view(-1, self.page_size, dim)
            # per-page share of the dense output, laid out for one batched matmul per evaluation
            self.page_out = torch.einsum("tgpb,pbd->tpgd", probs, values).flatten(2)  # [T, P, G*D]
            self.out_dense = self.page_out.sum(1).view(*logits.shape[:2], dim)  # [T, G, D]
        self._oracle: dict[int, Tensor] = {}

    @property
    def pages(self) -> int:
        return self.k_pages.shape[0]

    def budget(self, fraction: float, minimum_pages: int = 3) -> int:
        """Token budget for ``fraction`` of the pages (at least ``minimum_pages``)."""
        return max(minimum_pages, round(self.pages * fraction)) * self.page_size

    def scores(self, selector: str, cfg: LocksConfig, rotation: Tensor | None = None) -> Tensor:
        """Estimated log masses `[T, G, P]` of a selector (``-inf`` for pages not complete at a step):
        ``oracle``, ``locks`` (``cfg``'s rank and format), ``quest`` (``cfg``'s Quest format, else ``quest``:
        bounds per page), ``shared`` (rank ``cfg.rank``),
        ``shared-bytes`` (rank at LOCKS's bytes), ``window``.

        Args:
            rotation (Tensor | None): `[D, D]` orthonormal matrix applied to keys and queries before LOCKS
                summarizes and scores (``q.k`` is unchanged; only what the summary keeps changes).
        Raises:
            ValueError: on an unknown selector.
        """
        if selector == "oracle":
            scores = self.page_lse
        elif selector == "locks":
            scores = self._locks_scores(cfg, rotation)
        elif selector == "quest":
            fmt = cfg.summary_format if cfg.summary_format in QUEST_FORMATS else "quest"
            store = build_quest_summaries(self.k_pages, fmt)
            kmin, kmax = store.key_min[:, 0].float(), store.key_max[:, 0].float()  # [P, n, D]
            # sum_d max(q_d min_d, q_d max_d): max_d where q_d > 0, min_d where q_d < 0 (Quest's bound), per chunk
            pos = self.q.clamp_min(0)
            bound = torch.einsum("tgd,pnd->tgpn", pos, kmax) + torch.einsum("tgd,pnd->tgpn", self.q - pos, kmin)
            chunks = kmin.shape[1]
            scores = torch.logsumexp(math.log(self.page_size / chunks) + self.scale * bound, dim=-1)
        elif selector in ("shared", "shared-bytes"):
            scores = self._shared_scores(cfg, selector)
        elif selector == "window":
            scores = window_scores(self.seq_lens, self.q.shape[1], self.pages, self.page_size)
        else:
            raise ValueError(f"unknown selector {selector!r}: allowed {', '.join(SELECTORS)}")
        return mask_incomplete(scores, self.seq_lens, self.page_size)

    def _locks_scores(self, cfg: LocksConfig, rotation: Tensor | None) -> Tensor:
        """`[T, G, P]` ``score_pages``'s formula (paper Eq. 2), with the centroid term taken out of the
        logsumexp: ``s = scale * q.mu + logsumexp_i(scale * (V q).c_i)``."""
        keys, q = self.k_pages, self.q
        if rotation is not None:
            keys, q = keys @ rotation.float(), q @ rotation.float()
        centroid, basis, coeffs = build_page_summaries(keys, cfg).dequantize()  # [P,1,D] [P,1,r,D] [P,1,B,r]
        q_mu = torch.einsum("tgd,pd->tgp", q, centroid[:, 0])
        q_v = torch.einsum("tgd,prd->tgpr", q * self.scale, basis[:, 0])
        return self.scale * q_mu + torch.einsum("tgpr,pbr->tgpb", q_v, coeffs[:, 0]).logsumexp(-1)

    def _shared_scores(self, cfg: LocksConfig, selector: str) -> Tensor:
        """`[T, G, P]` ``shared_basis_scores``'s formula: Eq. 2 in one basis shared by all pages."""
        rank = cfg.rank if selector == "shared" else self.shared_rank_at_equal_bytes(cfg)
        basis = fit_shared_basis(self.k_pages[: int(self.seq_lens.min()) // self.page_size], rank)  # [1, r, D]
        store = build_shared_basis_summaries(self.k_pages, basis)
        coeffs = dequantize(store.coeffs, store.coeffs_scale)[:, 0]  # [P, B, r]
        q_mu = torch.einsum("tgd,pd->tgp", self.q, store.centroid[:, 0].float())
        q_v = torch.einsum("tgd,rd->tgr", self.q * self.scale, basis[0])
        return self.scale * q_mu + torch.einsum("tgr,pbr->tgpb", q_v, coeffs).logsumexp(-1)

    def shared_rank_at_equal_bytes(self, cfg: LocksConfig) -> int:
        """Shared-basis rank whose bytes per page match LOCKS's summary bytes (``cfg``'s format; ``float``
        is matched to ``colwise``)."""
        fmt = cfg.summary_format if cfg.summary_format != "float" else "colwise"
        return shared_rank_at_equal_bytes(
            LocksConfig(rank=cfg.rank, summary_format=fmt), self.keys.shape[1], self.pages
        )

    def selected_mask(self, scores: Tensor, cfg: LocksConfig) -> Tensor:
        """bool `[T, P]`: the pages ``select_pages`` reads at each step from ``scores`` `[T, G, P]`."""
        selected = select_pages(scores, self.seq_lens, 1, cfg)[:, 0]  # [T, K], -1 unused
        mask = torch.zeros(len(self.seq_lens), self.pages + 1, dtype=torch.bool)
        mask.scatter_(1, torch.where(selected < 0, self.pages, selected), True)
        return mask[:, : self.pages]

    def kept(self, scores: Tensor, cfg: LocksConfig) -> Tensor:
        """True attention mass `[T, G]` on the pages ``select_pages`` picks from ``scores`` `[T, G, P]`."""
        return self._kept(self.selected_mask(scores, cfg))

    def mass_kept(self, mask: Tensor, steps: Tensor | None = None) -> Tensor:
        """True attention mass `[..., T', G]` on the pages of any selection ``mask`` bool `[..., T', P]` (a
        selection reused from another step or layer, say), at steps ``steps`` `[T']` (default: all ``T``)."""
        page_lse, lse = (self.page_lse, self.lse) if steps is None else (self.page_lse[steps], self.lse[steps])
        inside = page_lse.masked_fill(~mask.unsqueeze(-2), float("-inf")).logsumexp(-1)
        return torch.exp(inside - lse).nan_to_num(0.0).clamp(0.0, 1.0)

    def _kept(self, mask: Tensor) -> Tensor:
        return self.mass_kept(mask)

    def oracle_mask(self, cfg: LocksConfig) -> Tensor:
        """bool `[T, P]`: the exact-LSE oracle's pages at ``cfg``'s budget (cached per budget)."""
        if cfg.budget not in self._oracle:
            self._oracle[cfg.budget] = self.selected_mask(self.scores("oracle", cfg), cfg)
        return self._oracle[cfg.budget]

    def evaluate(self, scores: Tensor, cfg: LocksConfig) -> dict[str, Tensor]:
        """All measures of one selector at ``cfg``'s budget (module docstring).

        Returns:
            dict: ``kept`` and ``oracle_kept`` `[T, G]`, ``ratio`` `[T, G]` (0/0 -> 1), ``group_ratio`` `[T]`
            (the KV group's mean ``kept`` over the oracle's: at most 1 up to the last page's share, the oracle
            being the best selection for the group mean, which is what group-shared selection optimizes),
            ``recall`` `[T]`, ``pages`` `[T]` pages read, and ``out_err`` `[T, G]` when values were given.
        """
        mask, oracle = self.selected_mask(scores, cfg), self.oracle_mask(cfg)
        kept, kept_oracle = self._kept(mask), self._kept(oracle)
        ratio = torch.where(kept_oracle > 0, kept / kept_oracle.clamp_min(1e-30), torch.ones_like(kept))
        group, group_oracle = kept.mean(1), kept_oracle.mean(1)
        group_ratio = torch.where(group_oracle > 0, group / group_oracle.clamp_min(1e-30), torch.ones_like(group))
        free = oracle & ~forced_page_mask(self.seq_lens, self.pages, cfg)
        hits, wanted = (mask & free).sum(1), free.sum(1)
        recall = torch.where(wanted > 0, hits / wanted.clamp_min(1), torch.ones(len(wanted)))
        out = {"kept": kept, "oracle_kept": kept_oracle, "ratio": ratio, "group_ratio": group_ratio,
               "recall": recall, "pages": mask.sum(1)}
        if self.page_out is not None:
            out_sel = torch.bmm(mask.float().unsqueeze(1), self.page_out).view_as(self.out_dense)
            out_sel = out_sel / kept.clamp_min(1e-30).unsqueeze(-1)
            out["out_err"] = (out_sel - self.out_dense).norm(dim=-1) / self.out_dense.norm(dim=-1).clamp_min(1e-30)
        return out

    def mass_vs_oracle(self, selector: str, cfg: LocksConfig) -> Tensor:
        """`[T, G]` mass kept by ``selector`` divided by the oracle's at ``cfg``'s budget (0/0 -> 1)."""
        return self.evaluate(self.scores(selector, cfg), cfg)["ratio"]
