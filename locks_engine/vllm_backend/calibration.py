"""``candidates="auto"``: each layer's ``c`` of the two-level selection, found at the end of every prefill from the
prompt's own last queries (``locks_engine.ops.calibration``; why: ``kernels/NOTES.md``, two-level selection).

The layer keeps its ``c`` twice: on the host for the CPU path, and on the device as the superpages a step chooses
(``M = ceil(c K / 16)`` plus the forced ones, int32 `[1]`), which the CUDA kernels read as data
(``locks_kernels.select_two_level(live=)``): the decode graphs are captured once at the capacity, the largest
``c``, and take every calibrated ``c`` without a new capture. The batch shares the layer's ``c``: the latest
prompt's sets it. Until a prompt longer than the budget has been seen the layer takes the capacity.
"""

from __future__ import annotations

import torch
from torch import Tensor

from locks_engine.config import LocksConfig
from locks_engine.ops.calibration import (
    CALIBRATION_CHOICES, CALIBRATION_THRESHOLD, candidate_recall, pick_candidates, prompt_queries, recall_from_scores,
)
from locks_engine.ops.summaries import PageSummaries
from locks_engine.ops.superpages import superpage_config
from locks_engine.vllm_backend.prefill import PrefillRows


class LayerCalibration:
    """One layer's calibrated ``c``.

    Args:
        cfg (LocksConfig): ``two-level`` with ``candidates="auto"``. device: where the kernels read ``live``.
    """

    def __init__(self, cfg: LocksConfig, device: torch.device | str) -> None:
        self.cfg = cfg
        self.c = CALIBRATION_CHOICES[-1]
        """``c`` on the host (the CPU path's)."""
        self.live = torch.tensor([self.slots(self.c)], dtype=torch.int32, device=device)
        """int32 `[1]`: the superpages a step chooses at ``c``, read by the CUDA kernels (fixed address)."""
        self.capacity = CALIBRATION_CHOICES[-1]
        self.threshold = CALIBRATION_THRESHOLD
        """Least recall a ``c`` must reach (``ops.calibration.pick_candidates``)."""

    def slots(self, c: int) -> int:
        """``M``, superpages chosen per step at ``c`` (``ops.superpages.superpage_config``)."""
        return superpage_config(self.cfg, c).budget_pages

    def update(self, query: Tensor, rows: PrefillRows, store: PageSummaries, superpages: Tensor,
               num_kv_heads: int, block_size: int, scale: float, cuda: bool) -> None:
        """Calibrate from the longest prefill row's last queries (host syncs: prefill runs eagerly); the batch's
        other rows share its ``c``. A row of at most ``K`` complete pages (every page read) leaves ``c`` as it is.

        Args:
            query (Tensor): `[T, HQ, D]` the prefill rows' query tokens, in row order.
            rows (PrefillRows): the prefill rows. store (PageSummaries): the layer's summaries, this step's pages
                written. superpages (Tensor): fp16 `[P, H, D]`, this step's superpages written.
            num_kv_heads (int): H. block_size (int): tokens a block. scale (float): softmax scale.
            cuda (bool): score with the Triton kernels (``colwise8``) instead of the ops.
        """
        starts = rows.query_start_loc_cpu
        row = max(range(len(rows.seq_lens_cpu)), key=rows.seq_lens_cpu.__getitem__)  # a short prompt says little
        seq_len = rows.seq_lens_cpu[row]
        if seq_len // self.cfg.page_size <= self.cfg.budget_pages:
            return
        take, lens = prompt_queries(starts[row + 1] - starts[row], seq_len)
        q = query[starts[row]:starts[row + 1]][take].contiguous()
        lens = lens.to(q.device)
        table = rows.block_table[row:row + 1].expand(len(lens), -1).contiguous()
        if cuda:
            import locks_kernels as lk

            scores = lk.score_pages(q, store.colwise8(), table, lens, self.cfg.page_size, block_size, scale)
            coarse = lk.superpage_scores(q, superpages, table, lens, self.cfg.page_size, block_size, scale)
            recall = recall_from_scores(scores, coarse, lens, num_kv_heads, self.cfg)
        else:
            recall = candidate_recall(q, store, superpages, table, lens, num_kv_heads, self.cfg, block_size,
                                      scale=scale)
        self.c = pick_candidates(recall, threshold=self.threshold)
        self.live.fill_(self.slots(self.c))
