"""Device-side totals of the decode pages LOCKS reads, for benchmarks under CUDA graphs (``bench_e2e.py``)."""

from __future__ import annotations

import torch
from torch import Tensor

#: ``additional_config`` key: keep device-side totals of the decode pages read (``DeviceCounters``).
COUNTERS_KEY = "locks_device_counters"


class DeviceCounters:
    """Totals of the decode pages read, kept on the device by the model's last LOCKS layer, so that a replayed
    CUDA graph counts too (the statistics ring counts on the host, which a replay skips). Every layer selects
    the same number of pages per KV head, so the last layer's totals give the read fraction of all layers.
    Costs three small kernels per step. Read and reset with ``totals()`` / ``reset()`` (host syncs: call
    between requests, e.g. from ``LLM.apply_model``).

    ``values`` `[3]` int64: decode rows with tokens, (row, KV head, page) selections, pages there are x KV heads.
    """

    def __init__(self) -> None:
        self.values: Tensor | None = None

    def add(self, selected: Tensor, seq_lens: Tensor, page_size: int, num_kv_heads: int) -> None:
        """Add one step: ``selected`` `[S, H, K]` (``-1`` unused), ``seq_lens`` `[S]` tokens."""
        if self.values is None or self.values.device != selected.device:
            if selected.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("LOCKS device counters would be allocated inside CUDA graph capture")
            self.values = torch.zeros(3, dtype=torch.int64, device=selected.device)
        pages = (seq_lens.long() + page_size - 1) // page_size
        step = torch.stack([(seq_lens > 0).sum(), (selected >= 0).sum(), pages.sum() * num_kv_heads])
        self.values.add_(step)

    def reset(self) -> None:
        if self.values is not None:
            with torch.inference_mode():  # the values were made in vLLM's inference mode
                self.values.zero_()

    def totals(self) -> dict[str, int]:
        """``{"decode_rows", "pages_read", "pages_total"}`` summed since the last reset (KV heads counted)."""
        rows, read, total = self.values.tolist() if self.values is not None else (0, 0, 0)
        return {"decode_rows": int(rows), "pages_read": int(read), "pages_total": int(total)}
