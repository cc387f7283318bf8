"""Step statistics on the CUDA path, counted on the device inside CUDA graphs.

The host-side counters of ``step_stats.StepStats`` run Python in ``forward``, which a replayed CUDA graph skips.
Here every LOCKS layer copies its selection into its row of one device buffer (one copy kernel a layer), and the
model's last layer turns the buffer into the step's record with a handful of tensor ops: pages read per row, the
per-page-bin histogram the app's Pages-read panel draws, the totals behind bytes read against dense; with a tail
estimate also the share of the estimated mass the tail carried (each layer copies its sum over KV heads into a
second buffer; no launch without a tail). The record goes into slot ``step % SLOTS`` of a small device ring, and
the whole ring is copied to pinned host memory
(``copy_(non_blocking=True)``, a memcpy node of the graph), then each slot's step number a second time, after its
body. All of it is captured once and replayed every step.

On the host, :meth:`DeviceStepStats.collect` (called by the metadata builder before each step, and by
``LocksWorkerExtension.locks_flush_stats`` on request) appends every finished slot it has not appended yet to the
statistics ring (``locks_engine.stats``), oldest first, so readers see the same records as on the CPU path, a step
or two later. A slot's body begins with its step number and its tail (copied after the body) repeats it; a slot
whose two differ is being copied and is left for the next call. ``time_ns`` is the time of collection.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import Tensor

from locks_engine.ops.superpages import two_level_scanned
from locks_engine.stats import StatsRing

#: Slots of the device ring: steps the host may fall behind by before it loses one.
SLOTS = 4
#: int32 fields of a slot before the per-row fields: step, decode rows, prefill tokens, pages read, pages total,
#: summaries scanned (pages, layers and KV heads counted as in ``locks_engine.stats``).
_HEAD = 6
#: per-row fields of a slot: sequence length, pages read, pages total, and the tail's mass share (fp32 bits)
_ROW_FIELDS = 4

_live: list["DeviceStepStats"] = []
"""Every ``DeviceStepStats`` of this process (``flush_all``): the worker extension reaches them through it."""


class DeviceStepStats:
    """One KV cache group's statistics on a CUDA device.

    Args:
        ring (StatsRing): where finished steps go.
        page_bytes (int): K+V bytes of one page of one KV head.
        summary_page_bytes (int): bytes read to score one page of one KV head: its summary, its K for the
            ``oracle`` (0 when none are read; ``step_stats.scan_bytes``).
        layer_names (list[str]): the group's LOCKS layers, in model order (the last one closes the step).
        num_kv_heads (int): H. max_num_seqs (int): most decode rows of a step (vLLM's ``max_num_seqs``).
        device (torch.device): the KV cache's device.
    """

    def __init__(self, ring: StatsRing, page_bytes: int, summary_page_bytes: int, layer_names: list[str],
                 num_kv_heads: int, max_num_seqs: int, device: torch.device) -> None:
        self.ring = ring
        self.page_bytes = page_bytes
        self.summary_page_bytes = summary_page_bytes
        self.index = {name: i for i, name in enumerate(layer_names)}
        self.num_layers = len(layer_names)
        self.kv_heads = num_kv_heads
        self.max_rows = int(ring.header["max_rows"])
        self.bins = int(ring.header["hist_bins"])
        self.pages_per_bin = int(ring.header["pages_per_bin"])
        self.page_size = int(ring.header["page_size"])
        self.slot_len = _HEAD + _ROW_FIELDS * self.max_rows + self.max_rows * self.bins
        self.max_num_seqs = max_num_seqs
        self.selected: Tensor | None = None
        """int64 `[L, max_num_seqs, H, W]` this step's selection of every layer (``W``: the selection's slots,
        ``min(K, Pmax)`` or ``Pmax`` where every page is read; allocated by the first decode, an eager one)."""
        self.tail = torch.zeros(self.num_layers, max_num_seqs, dtype=torch.float32, device=device)
        """fp32 `[L, max_num_seqs]` this step's tail mass share of every layer, summed over KV heads (zeroed
        by the step's close: a layer without a tail leaves 0)."""
        self.tailed = False
        """Some layer gave a tail share (the records then carry it; without a tail no launch is added)."""
        self.step = torch.zeros((), dtype=torch.int32, device=device)
        self.slots = torch.zeros(SLOTS, self.slot_len, dtype=torch.int32, device=device)
        self.tails = torch.zeros(SLOTS, dtype=torch.int32, device=device)
        pinned = torch.device(device).type == "cuda"  # pinned: the copies stay asynchronous (and capturable)
        self.host = torch.zeros(SLOTS, self.slot_len, dtype=torch.int32, pin_memory=pinned)
        self.host_tails = torch.zeros(SLOTS, dtype=torch.int32, pin_memory=pinned)
        self.collected = 0
        """The newest step appended to the ring."""
        self.two_level: dict[tuple[int, float], int] = {}
        """Layers of this step that scanned two-level with a fixed ``c``, by ``(slots, coarse_fraction)`` (on the
        host: for a graph, at capture)."""
        self.live: dict[float, list[Tensor]] = {}
        """Calibrated two-level layers of this step, their int32 `[1]` slots on the device by ``coarse_fraction``:
        counted together, one set of launches a step whatever the number of layers."""
        _live.append(self)

    def count(self, layer_name: str, selected: Tensor | None, every: bool | None, seq_lens: Tensor,
              num_prefill_tokens: Tensor, two_level: tuple[int, float] | None = None,
              tail_share: Tensor | None = None) -> None:
        """Record one layer's decode selection (no host sync: CUDA-graph safe); the last layer closes the step.

        Args:
            layer_name (str): the layer (one of ``layer_names``).
            selected (Tensor | None): int64 `[S, H, width]` logical pages read, ``-1`` unused (None: no decodes).
            every (bool | None): every page read unscored (no summaries scanned).
            seq_lens (Tensor): `[S]` int32 tokens of the decode rows.
            num_prefill_tokens (Tensor): `[]` int32 tokens of the step's prefill rows.
            two_level (tuple | None): ``(slots, coarse_fraction)`` of a two-level layer, ``slots`` an int or, for a
                calibrated layer, its int32 `[1]` on the device (the summaries it scanned
                are counted from the lengths once a step, ``ops.superpages.two_level_scanned``, not by more launches
                in every layer's graph); None for a flat scan (every complete page).
            tail_share (Tensor | None): fp32 `[S, H]` share of each KV head's estimated mass that the tail
                estimate carried (``ops.tail.tail_mass_share``); None: no tail this layer (counted as 0).
        Raises:
            RuntimeError: the selection buffer would be allocated inside CUDA graph capture.
        """
        layer = self.index[layer_name]
        rows = 0 if selected is None else selected.shape[0]
        if rows:
            self._buffer(selected)[layer, :rows].copy_(selected)
            if tail_share is not None:
                self.tail[layer, :rows].copy_(tail_share.sum(-1))
                self.tailed = True
            if two_level is not None and not every:
                slots, coarse = two_level
                if isinstance(slots, Tensor):
                    self.live.setdefault(coarse, []).append(slots)
                else:
                    self.two_level[two_level] = self.two_level.get(two_level, 0) + 1
        if layer == self.num_layers - 1:
            self._close(rows, bool(every), seq_lens, num_prefill_tokens)
            self.two_level, self.live = {}, {}

    def _buffer(self, selected: Tensor) -> Tensor:
        """The selection buffer for selections shaped like ``selected`` (allocated anew when the width changes)."""
        width = selected.shape[-1]
        if self.selected is None or self.selected.shape[-1] != width:
            if selected.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("LOCKS statistics: the selection buffer would be allocated inside CUDA graph "
                                   "capture; vLLM should run an eager warm-up step first")
            shape = (self.num_layers, self.max_num_seqs, self.kv_heads, width)
            self.selected = torch.full(shape, -1, dtype=torch.int64, device=selected.device)
        return self.selected

    def _close(self, rows: int, every: bool, seq_lens: Tensor, num_prefill_tokens: Tensor) -> None:
        """Write the step's record into its device slot and copy the slots to the host."""
        self.step.add_(1)
        record = torch.zeros(self.slot_len, dtype=torch.int32, device=self.step.device)
        record[0] = self.step
        record[2] = num_prefill_tokens
        if rows:
            heads = self.num_layers * self.kv_heads
            seq = seq_lens[:rows].to(torch.int32)
            pages = (seq + self.page_size - 1) // self.page_size  # [S]
            sel = self.selected[:, :rows].transpose(0, 1).reshape(rows, -1)  # [S, L*H*width]
            valid = sel >= 0
            per_row = valid.sum(dim=1, dtype=torch.int32)  # [S]
            shown = min(rows, self.max_rows)
            record[1] = (seq > 0).sum()
            record[3] = per_row.sum()
            record[4] = pages.sum() * heads
            if not every:
                two_level = sum(self.two_level.values()) + sum(len(v) for v in self.live.values())
                record[5] = (seq // self.page_size).sum() * (self.num_layers - two_level) * self.kv_heads
                if two_level:
                    scanned = [n * two_level_scanned(seq, self.page_size, slots, coarse)
                               for (slots, coarse), n in self.two_level.items()]
                    scanned += [two_level_scanned(seq, self.page_size, torch.cat(live), coarse)
                                for coarse, live in self.live.items()]
                    record[5] += (sum(scanned) * self.kv_heads).round().to(torch.int32)
            fields = record[_HEAD:_HEAD + _ROW_FIELDS * self.max_rows].view(_ROW_FIELDS, self.max_rows)
            fields[0, :shown] = seq[:shown]
            fields[1, :shown] = per_row[:shown]
            fields[2, :shown] = pages[:shown] * heads
            if self.tailed:
                fields[3].view(torch.float32)[:shown] = self.tail[:, :shown].sum(0)
                self.tail.zero_()
            hist = record[_HEAD + _ROW_FIELDS * self.max_rows:].view(self.max_rows, self.bins)
            bins = (sel[:shown].clamp_min(0) // self.pages_per_bin).clamp_max(self.bins - 1)
            hist[:shown].scatter_add_(1, bins, valid[:shown].to(torch.int32))
        slot = (self.step % SLOTS).long().view(1)
        self.slots.index_copy_(0, slot, record.view(1, -1))
        self.tails.index_copy_(0, slot, self.step.view(1))
        self.host.copy_(self.slots, non_blocking=True)
        self.host_tails.copy_(self.tails, non_blocking=True)

    def collect(self) -> int:
        """Append the finished slots not yet appended to the ring, oldest first (host only; never waits for the
        device). Returns the records appended."""
        tails = self.host_tails.numpy().copy()
        appended = 0
        for i in sorted(range(SLOTS), key=lambda i: tails[i]):
            step = int(tails[i])
            if step <= self.collected:
                continue
            body = self.host[i].numpy().copy()
            if int(body[0]) != step:  # being copied: next time
                continue
            self._append(body)
            self.collected = step
            appended += 1
        return appended

    def _append(self, body) -> None:
        """Append one slot (a numpy int32 copy) to the ring."""
        m = self.max_rows
        step, decodes, prefill, read, total, summaries = body[:_HEAD].tolist()
        rows = body[_HEAD:_HEAD + _ROW_FIELDS * m].reshape(_ROW_FIELDS, m)
        self.ring.append({
            "time_ns": time.time_ns(),
            "step": step,
            "num_decodes": decodes,
            "num_prefill_tokens": prefill,
            "num_layers": self.num_layers,
            "num_kv_heads": self.kv_heads,
            "pages_read": read,
            "pages_total": total,
            "summaries_read": summaries,
            "bytes_read": read * self.page_bytes + summaries * self.summary_page_bytes,
            "bytes_dense": total * self.page_bytes,
            "row_seq_len": rows[0],
            "row_pages_read": rows[1],
            "row_pages_total": rows[2],
            "row_hist": body[_HEAD + _ROW_FIELDS * m:].reshape(m, self.bins).clip(0, 65535),
            "row_tail_mass": rows[3].view(np.float32),
        })


def flush_all() -> int:
    """Wait for the device, then append every finished step of every ``DeviceStepStats`` of this process.
    Returns the records appended."""
    if not _live:
        return 0
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return sum(stats.collect() for stats in _live)


class LocksWorkerExtension:
    """vLLM worker extension (``worker_extension_cls``): ``collective_rpc("locks_flush_stats")`` brings the
    statistics ring up to date with the device, e.g. after a request's last step or after the engine's start."""

    def locks_flush_stats(self) -> int:
        """Append every finished step's record (host sync). Returns the records appended."""
        return flush_all()
