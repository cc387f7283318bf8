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
        candidates (int): ``c`` of this layer: 0 for the flat scan, else the two-level scan's candidates.
    """

    store: PageSummaries | None
    superpages: Tensor | None
    candidates: int

    @property
    def two_level(self) -> bool:
        return self.candidates > 0 and self.superpages is not None and self.store is not None
