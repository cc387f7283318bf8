"""Accumulates one step's LOCKS statistics over the layers and hands them to the ring file.

Format and transport: ``locks_engine.stats`` (a memory-mapped ring any process can read).
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from locks_engine.config import LocksConfig
from locks_engine.ops import summary_bytes
from locks_engine.ops.tail import value_mean_bytes
from locks_engine.stats import StatsRing


def scan_bytes(cfg: LocksConfig, head_dim: int, kv_dtype: torch.dtype) -> tuple[int, int]:
    """``(page_bytes, summary_page_bytes)`` of the statistics (both paths): K+V bytes of one page of one KV head,
    and the bytes a decode step reads to score one complete page of one KV head.

    Scoring reads a page summary (``summary_bytes``); nothing with ``dense``. The ``oracle`` selection scores a
    page from its keys, so its scan costs the page's K bytes (half its K+V): a step's ``summaries_read`` counts
    the complete pages as for the flat scan, and ``bytes_read`` is then every complete page's K (the scores) plus
    the selected pages' K+V (the attention), what the oracle reads, the selected pages' keys twice. A tail estimate
    (``cfg.tail``) adds each scored page's mean value vector (``ops.tail.value_mean_bytes``: the pages not read
    enter through it; counted for every complete page, the few selected ones included).
    """
    summary, kv = summary_bytes(cfg.page_size, cfg.rank, head_dim, cfg.summary_format, kv_dtype)
    if cfg.dense:
        return kv, 0
    means = value_mean_bytes(head_dim, cfg.tail) if cfg.tail != "none" else 0
    return kv, (kv // 2 if cfg.selection == "oracle" else summary) + means


class StepStats:
    """Counters of one KV cache group for one forward step, reused from step to step (allocated once).

    Args:
        ring (StatsRing): where finished steps go.
        page_bytes (int): K+V bytes of one page of one KV head.
        summary_page_bytes (int): bytes read to score one page of one KV head: its summary, its K for the
            ``oracle`` (0 when none are read; ``scan_bytes``).
    """

    def __init__(self, ring: StatsRing, page_bytes: int, summary_page_bytes: int) -> None:
        self.ring = ring
        self.page_bytes = page_bytes
        self.summary_page_bytes = summary_page_bytes
        self.max_rows = int(ring.header["max_rows"])
        self.bins = int(ring.header["hist_bins"])
        self.pages_per_bin = int(ring.header["pages_per_bin"])
        self.hist = torch.zeros(self.max_rows, self.bins, dtype=torch.int32)  # [rows, bins]
        self.row_pages = torch.zeros(self.max_rows, dtype=torch.int64)
        self.row_tail = torch.zeros(self.max_rows, dtype=torch.float64)
        self.steps = 0
        self.reset([], 0)

    def reset(self, seq_lens: list[int], num_prefill_tokens: int) -> None:
        """Start a step whose decode rows have ``seq_lens`` tokens."""
        self.seq_lens = seq_lens
        self.num_prefill_tokens = num_prefill_tokens
        self.hist.zero_()
        self.row_pages.zero_()
        self.row_tail.zero_()
        self.layers = 0
        self.kv_heads = 0
        self.pages_read = 0
        self.pages_total = 0
        self.summaries_read = 0

    def add_layer(self, selected: Tensor | None, num_pages: Tensor | None, scored_pages: float, kv_heads: int,
                  tail_share: Tensor | None = None) -> None:
        """Count one layer's decode reads.

        Args:
            selected (Tensor | None): `[S, H, K]` logical pages read, ``-1`` padded (None: no decode rows).
            num_pages (Tensor | None): `[S]` pages of each decode row (incomplete last page included).
            scored_pages (float): page summaries scanned by this layer, summed over rows, per KV head (a two-level
                scan's superpage centroids counted as fractions of a page summary).
            kv_heads (int): H.
            tail_share (Tensor | None): `[S, H]` share of each KV head's estimated mass that the tail estimate
                carried (``ops.tail.tail_mass_share``); None: no tail this layer (counted as 0).
        """
        self.layers += 1
        self.kv_heads = kv_heads
        if selected is None:
            return
        valid = (selected >= 0).cpu()
        per_row = valid.sum(dim=(1, 2))  # [S]
        self.pages_read += int(per_row.sum())
        self.pages_total += int(num_pages.sum()) * kv_heads
        self.summaries_read += round(scored_pages * kv_heads)
        rows = min(self.max_rows, selected.shape[0])
        self.row_pages[:rows] += per_row[:rows]
        bins = (selected[:rows].clamp_min(0).cpu() // self.pages_per_bin).clamp_max(self.bins - 1).flatten(1)
        self.hist[:rows].scatter_add_(1, bins, valid[:rows].flatten(1).to(torch.int32))
        if tail_share is not None:
            self.row_tail[:rows] += tail_share[:rows].detach().cpu().double().sum(-1)

    def flush(self) -> None:
        """Append the finished step to the ring."""
        self.steps += 1
        rows = min(self.max_rows, len(self.seq_lens))
        page_size = int(self.ring.header["page_size"])
        pad = [0] * (self.max_rows - rows)
        row_total = [-(-n // page_size) * self.layers * self.kv_heads for n in self.seq_lens[:rows]]
        self.ring.append(
            {
                "time_ns": time.time_ns(),
                "step": self.steps,
                "num_decodes": len(self.seq_lens),
                "num_prefill_tokens": self.num_prefill_tokens,
                "num_layers": self.layers,
                "num_kv_heads": self.kv_heads,
                "pages_read": self.pages_read,
                "pages_total": self.pages_total,
                "summaries_read": self.summaries_read,
                "bytes_read": self.pages_read * self.page_bytes + self.summaries_read * self.summary_page_bytes,
                "bytes_dense": self.pages_total * self.page_bytes,
                "row_seq_len": list(self.seq_lens[:rows]) + pad,
                "row_pages_read": self.row_pages.tolist(),
                "row_pages_total": row_total + pad,
                "row_hist": self.hist.clamp_max(65535).numpy(),
                "row_tail_mass": self.row_tail.numpy(),
            }
        )
