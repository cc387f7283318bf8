"""One frozen, validated configuration for the LOCKS method.

Built once at the edge (CLI, vLLM ``additional_config``, a benchmark) and passed down explicitly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

#: Summary storage formats (see ``locks_engine/ops/summaries.py`` for the exact layouts).
SUMMARY_FORMATS = ("float", "paper", "colwise", "chanlog", "colwise8")


@dataclass(frozen=True)
class LocksConfig:
    page_size: int = 16
    """B: tokens per KV page (paper: 16). Must divide the KV cache block size."""
    rank: int = 8
    """r: rank of each page's local key basis, 1 <= r <= page_size."""
    budget: int = 2048
    """Token budget per decode step and KV head: at most ``budget // page_size`` pages are read."""
    sink_pages: int = 1
    """Pages at the start of the sequence that are always read (attention sinks)."""
    recent_pages: int = 1
    """Pages before the last page that are always read; the last page (it holds the current token,
    complete or not) is always read too."""
    summary_format: str = "colwise8"
    """How summaries are stored: ``float`` (fp32, reference), ``paper`` (int8 centroid, int4 basis,
    int8 coefficients, one scale per tensor per page), ``colwise`` (fp16 centroid, int4 basis and
    int8 coefficients with one scale per basis direction), ``chanlog`` (as ``colwise``, but one
    1-byte log2 scale per channel of the int4 basis) or ``colwise8`` (as ``colwise`` with an int8 basis)."""
    dense: bool = False
    """A/B switch: read every page (dense attention) instead of selecting."""

    def __post_init__(self) -> None:
        _check_int("page_size", self.page_size, 1)
        _check_int("rank", self.rank, 1)
        _check_int("budget", self.budget, 1)
        _check_int("sink_pages", self.sink_pages, 0)
        _check_int("recent_pages", self.recent_pages, 0)
        if self.rank > self.page_size:
            raise ValueError(
                f"LocksConfig.rank={self.rank} is larger than page_size={self.page_size}: "
                f"allowed 1..{self.page_size} (a page of B keys has at most B directions)"
            )
        if self.summary_format not in SUMMARY_FORMATS:
            raise ValueError(
                f"LocksConfig.summary_format={self.summary_format!r}: allowed {', '.join(SUMMARY_FORMATS)}"
            )
        if not isinstance(self.dense, bool):
            raise ValueError(f"LocksConfig.dense={self.dense!r}: allowed True or False")
        if self.budget_pages < self.always_read_pages:
            raise ValueError(
                f"LocksConfig.budget={self.budget} tokens holds {self.budget_pages} pages of {self.page_size}, "
                f"fewer than the {self.always_read_pages} always read "
                f"(sink_pages + recent_pages + the last page): allowed budget >= {self.min_budget}"
            )

    @property
    def budget_pages(self) -> int:
        """K: pages read per step and KV head, ``budget // page_size`` (tokens -> pages)."""
        return self.budget // self.page_size

    @property
    def always_read_pages(self) -> int:
        """Pages every step reads whatever the budget: ``sink_pages + recent_pages + 1`` (the last page)."""
        return self.sink_pages + self.recent_pages + 1

    @property
    def min_budget(self) -> int:
        """The smallest ``budget`` (tokens) these pages allow: ``always_read_pages * page_size``."""
        return self.always_read_pages * self.page_size

    @property
    def quantized(self) -> bool:
        """Whether summaries are stored quantized (any format but ``float``)."""
        return self.summary_format != "float"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "LocksConfig":
        """Build from a plain dict (e.g. vLLM ``additional_config["locks"]``).

        Raises:
            ValueError: on an unknown key, naming it and the allowed keys; or on a bad value.
        """
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"LocksConfig: unknown setting(s) {unknown}: allowed {sorted(names)}")
        return cls(**values)


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"LocksConfig.{name}={value!r}: allowed an integer >= {minimum}")
