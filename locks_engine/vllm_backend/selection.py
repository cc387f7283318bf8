"""What a layer's decode selection reads, handed from the impl to its device path."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from locks_engine.ops.summaries import PageSummaries


@dataclass(frozen=True)
class Selection:
    """The layer's summaries and how it scans them.

    Attributes:
        store (PageSummaries | None): page summaries by physical page id; None without ``cfg.summarized``.
        superpages (Tensor | None): fp16 `[P, H, D]` superpage centroids (``two-level`` selection), else None.
        candidates (int): ``c`` of this layer: 0 for the flat scan, else the two-level scan's candidates (with
            ``live``, the capacity).
        live (Tensor | None): int32 `[1]` on the device, a calibrated layer's superpages chosen per step
            (``calibration.LayerCalibration``; CUDA path), else None.
    """

    store: PageSummaries | None
    superpages: Tensor | None
    candidates: int
    live: Tensor | None = None

    @property
    def two_level(self) -> bool:
        return self.candidates > 0 and self.superpages is not None and self.store is not None
