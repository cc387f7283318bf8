"""``candidates="auto"``: each layer's ``c`` of the two-level selection, found at the end of every prefill from the
prompt's own last queries (``locks_engine.ops.calibration``; why: ``kernels/NOTES.md``, two-level selection).

The layer keeps its ``c`` twice: on the host for the CPU path, and on the device as the superpages a step chooses
(``M = ceil(c K / 16)`` plus the forced ones, int32 `[1]`), which the CUDA kernels read as data
(``locks_kernels.select_two_level(live=)``): the decode graphs are captured once at the capacity, the largest
``c``, and take every calibrated ``c`` without a new capture. The batch shares the layer's ``c``: the latest
prompt's sets it. Until a prompt longer than the budget has been seen the layer takes the capacity.

Once per prompt, from its last chunk: vLLM prefills a long prompt in chunks, and calibrating at every chunk (each
over every page so far) cost more than the prefill itself (one H100, Llama-3.1-8B shapes, 128K prompt: prefill 34.0
s against 11.1 s with a fixed table, ``samples/studies/CALIBRATION.md``). So a prefill chunk only keeps its longest
row's last queries (:meth:`LayerCalibration.stash`), and the builder settles them at the start of the next step
(:class:`CalibrationQueue`, eagerly, before a decode graph replays): dropped when that step goes on prefilling the
same row, calibrated otherwise (the prompt was complete).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from locks_engine.config import LocksConfig
from locks_engine.ops.calibration import (
    CALIBRATION_CHOICES, CALIBRATION_MARGIN, CALIBRATION_THRESHOLD, pick_from_scores, prompt_queries, with_margin,
)
from locks_engine.ops.score import score_pages
from locks_engine.ops.summaries import PageSummaries
from locks_engine.ops.superpages import superpage_config, superpage_scores
from locks_engine.vllm_backend.prefill import PrefillRows


@dataclass
class PendingCalibration:
    """A prefill row's last queries, kept until the builder knows whether the prompt is complete."""

    query: Tensor
    """`[T, HQ, D]` the row's last ``T`` query tokens (a copy)."""
    lens: Tensor
    """`[T]` int32 tokens each query sees."""
    table: Tensor
    """`[T, W]` int32 the row's block table, once per query (a copy)."""
    seq_len: int
    """Tokens of the row after its chunk: a next chunk of the same prompt starts there."""
    run: Callable[[PendingCalibration], None]
    """Calibrates the layer from this."""


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
        self.margin = CALIBRATION_MARGIN
        """Steps of ``c`` taken above the rule's pick (``ops.calibration.with_margin``)."""

    def slots(self, c: int) -> int:
        """``M``, superpages chosen per step at ``c`` (``ops.superpages.superpage_config``)."""
        return superpage_config(self.cfg, c).budget_pages

    def stash(self, query: Tensor, rows: PrefillRows, store: PageSummaries, superpages: Tensor,
              num_kv_heads: int, block_size: int, scale: float, cuda: bool, queue: CalibrationQueue) -> None:
        """Keep the longest prefill row's last queries for :meth:`calibrate` (host syncs: prefill runs eagerly); the
        batch's other rows share its ``c``. A row of at most ``K`` complete pages (every page read) leaves ``c`` as
        it is.

        Args:
            query (Tensor): `[T, HQ, D]` the prefill rows' query tokens, in row order.
            rows (PrefillRows): the prefill rows. store (PageSummaries): the layer's summaries, this step's pages
                written. superpages (Tensor): fp16 `[P, H, D]`, this step's superpages written.
            num_kv_heads (int): H. block_size (int): tokens a block. scale (float): softmax scale.
            cuda (bool): score with the Triton kernels (``colwise8``) instead of the ops.
            queue (CalibrationQueue): the builder's, which settles the stash at the next step.
        """
        starts = rows.query_start_loc_cpu
        row = max(range(len(rows.seq_lens_cpu)), key=rows.seq_lens_cpu.__getitem__)  # a short prompt says little
        seq_len = rows.seq_lens_cpu[row]
        if seq_len // self.cfg.page_size <= self.cfg.budget_pages:
            return
        take, lens = prompt_queries(starts[row + 1] - starts[row], seq_len)
        q = query[starts[row]:starts[row + 1]][take].clone()
        # the prompt's own blocks only: the scores and selections below then span its pages, not the engine's
        # longest context (every step of them costs in proportion)
        blocks = -(-seq_len // block_size)
        table = rows.block_table[row:row + 1, :blocks].expand(len(lens), -1).contiguous()

        def run(pending: PendingCalibration) -> None:
            self.calibrate(pending, store, superpages, num_kv_heads, block_size, scale, cuda)

        queue.put(self, PendingCalibration(q, lens.to(q.device), table, seq_len, run))

    def calibrate(self, pending: PendingCalibration, store: PageSummaries, superpages: Tensor, num_kv_heads: int,
                  block_size: int, scale: float, cuda: bool) -> None:
        """Set ``c`` (host) and ``live`` (device) from a complete prompt's last queries (one host sync).

        Args:
            pending (PendingCalibration): from :meth:`stash`. The others: as :meth:`stash`.
        """
        q, lens, table = pending.query, pending.lens, pending.table
        if cuda:
            import locks_kernels as lk

            scores = lk.score_pages(q, store.colwise8(), table, lens, self.cfg.page_size, block_size, scale)
            coarse = lk.superpage_scores(q, superpages, table, lens, self.cfg.page_size, block_size, scale)
        else:
            scores = score_pages(q, store, table, lens, self.cfg.page_size, block_size, scale)
            coarse = superpage_scores(q, superpages, table, lens, self.cfg.page_size, block_size, scale)
        picked = pick_from_scores(scores, coarse, lens, num_kv_heads, self.cfg, self.threshold)
        self.c = with_margin(picked, margin=self.margin)
        self.live.fill_(self.slots(self.c))


class CalibrationQueue:
    """The layers' stashed prompt queries of the last step, settled by the builder at the start of the next."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple[LayerCalibration, PendingCalibration]] = {}
        self.calibrated = 0
        """Layer calibrations run so far (for tests and statistics)."""

    def put(self, layer: LayerCalibration, pending: PendingCalibration) -> None:
        """Replace ``layer``'s stash."""
        self.pending[id(layer)] = (layer, pending)

    def settle(self, seq_lens: list[int], query_lens: list[int]) -> None:
        """At the start of a step: drop the stashes whose row this step goes on prefilling (a row of more than one
        query token whose cached tokens, ``seq_len - query_len``, are where the stash's chunk ended), calibrate the
        others (their prompt was complete).

        Args:
            seq_lens (list[int]): this step's rows' tokens after the step. query_lens (list[int]): their query
                tokens this step.
        """
        if not self.pending or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
            return  # nothing stashed, or a graph being captured (vLLM builds capture batches at start only)
        going_on = {n - q for n, q in zip(seq_lens, query_lens) if q > 1}
        pending, self.pending = self.pending, {}
        for layer, stash in pending.values():
            if stash.seq_len not in going_on:
                stash.run(stash)
                self.calibrated += 1
