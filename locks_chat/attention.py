"""The attention setting an answer was made with, as a turn's statistics record it (``stats["attention"]``).

A turn keeps the numbers (budget, rank, dense, and a tail estimate when one ran); the text shown (``LOCKS budget 512, rank 8``, ``dense``) is made
from them. Sessions saved before kept that text instead (``stats["mode"]``): :meth:`Attention.from_stats` reads
both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: the text sessions saved before the numbers were kept: ``LOCKS budget 512, rank 8``
_OLD_LOCKS_TEXT = re.compile(r"LOCKS budget (\d+), rank (\d+)")


@dataclass(frozen=True)
class Attention:
    """What the attention of one answer read."""

    dense: bool
    """every KV page read"""
    budget: int | None
    """LOCKS token budget per decode step and KV head; ``None``: not recorded (a dense answer of an older session)"""
    rank: int | None
    """rank of each KV page's key summary; ``None``: not recorded (as ``budget``)"""
    tail: str = "none"
    """the tail estimate of the pages not read (``LocksConfig.tail``); ``none`` too for turns saved before"""

    @classmethod
    def of(cls, locks: Any) -> "Attention":
        """The setting of a ``LocksConfig``."""
        return cls(dense=locks.dense, budget=locks.budget, rank=locks.rank, tail=getattr(locks, "tail", "none"))

    @classmethod
    def from_stats(cls, stats: dict[str, Any]) -> "Attention | None":
        """The setting a turn's statistics record; ``None`` when they record none. Reads the older form too
        (``{"mode": "LOCKS budget 512, rank 8"}`` or ``{"mode": "dense"}``)."""
        record = stats.get("attention")
        if isinstance(record, dict):
            return cls(bool(record.get("dense")), record.get("budget"), record.get("rank"),
                       str(record.get("tail") or "none"))
        mode = stats.get("mode")
        if mode == "dense":
            return cls(True, None, None)
        matched = _OLD_LOCKS_TEXT.fullmatch(mode) if isinstance(mode, str) else None
        return cls(False, int(matched[1]), int(matched[2])) if matched else None

    def to_json(self) -> dict[str, Any]:
        """``{"dense", "budget", "rank"}``, and ``"tail"`` with a tail estimate, what a turn's statistics keep under
        ``attention``."""
        tail = {"tail": self.tail} if self.tail != "none" and not self.dense else {}
        return {"dense": self.dense, "budget": self.budget, "rank": self.rank, **tail}

    def text(self) -> str:
        """``LOCKS budget 512, rank 8`` (``..., tail int8`` with a tail estimate) or ``dense``."""
        tail = f", tail {self.tail}" if self.tail != "none" else ""
        return "dense" if self.dense else f"LOCKS budget {self.budget}, rank {self.rank}{tail}"

    def short_text(self) -> str:
        """``LOCKS 512/r8`` (``LOCKS 512/r8+int8`` with a tail estimate) or ``dense``, for narrow table cells."""
        tail = f"+{self.tail}" if self.tail != "none" else ""
        return "dense" if self.dense else f"LOCKS {self.budget}/r{self.rank}{tail}"


def attention_text(stats: dict[str, Any], missing: str = "", short: bool = False) -> str:
    """The text of the setting ``stats`` record (:meth:`Attention.text`, or :meth:`Attention.short_text`);
    an older text that names no setting as it is; ``missing`` when they record none."""
    attention = Attention.from_stats(stats)
    if attention is None:
        return str(stats.get("mode") or missing)
    return attention.short_text() if short else attention.text()
