"""Progress of the slow phases: reading the document, starting the engine, prefilling the prompt (with ETA).

Phases can overlap (the document loads while the engine starts): one line each, with a bar when the total is
known, elapsed seconds, and an ETA from the rate so far or, before any progress, from an expected duration.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from textual.widgets import Static

BAR_WIDTH = 12


def eta_text(elapsed: float, done: float, total: float | None, expected_s: float | None) -> str:
    """``ETA 12 s`` from the rate so far, else from an expected duration; ``""`` when there is no basis."""
    if total and done > 0:
        remaining = elapsed * (total - done) / done
    elif expected_s:
        remaining = expected_s - elapsed
    else:
        return ""
    return f"ETA {remaining:.0f} s" if remaining >= 0.5 else "ETA soon"


def bar(done: float, total: float, width: int = BAR_WIDTH) -> str:
    filled = round(width * max(0.0, min(1.0, done / total))) if total else 0
    return "█" * filled + "░" * (width - filled)


@dataclass
class Phase:
    label: str
    started: float
    total: float | None = None
    unit: str = ""
    expected_s: float | None = None
    done: float = 0.0


class ProgressPanel(Static):
    """Running phases, one line each, refreshed twice a second; the status line when none runs."""

    def __init__(self, **kwargs) -> None:
        super().__init__("Starting", **kwargs)
        self.phases: dict[str, Phase] = {}
        self.status = "Starting"

    def on_mount(self) -> None:
        self.set_interval(0.5, self._show)

    def begin(self, key: str, label: str, total: float | None = None, unit: str = "",
              expected_s: float | None = None) -> None:
        """Start (or restart) phase ``key``; ``expected_s`` gives an ETA before any progress is known."""
        self.phases[key] = Phase(label, time.monotonic(), total, unit, expected_s)
        self._show()

    def advance(self, key: str, done: float, total: float | None = None) -> None:
        """Report progress of phase ``key`` (``done`` of ``total`` units)."""
        phase = self.phases.get(key)
        if phase is not None:
            phase.done, phase.total = done, total if total is not None else phase.total
            self._show()

    def end(self, key: str) -> None:
        self.phases.pop(key, None)
        self._show()

    def finish(self, status: str) -> None:
        """End every phase and show ``status`` (e.g. "Ready: ...")."""
        self.phases.clear()
        self.status = status
        self._show()

    @property
    def busy(self) -> bool:
        return bool(self.phases)

    def _show(self) -> None:
        if not self.phases:
            self.update(self.status)
            return
        now, lines = time.monotonic(), []
        for phase in self.phases.values():
            elapsed = now - phase.started
            parts = [phase.label]
            if phase.total:
                count = f"{phase.done:,.0f}/{phase.total:,.0f} {phase.unit}".rstrip()
                parts.append(f"{bar(phase.done, phase.total)} {count}")
            parts.append(f"{elapsed:.0f} s")
            eta = eta_text(elapsed, phase.done, phase.total, phase.expected_s)
            if eta:
                parts.append(eta)
            lines.append(" · ".join(parts))
        self.update("\n".join(lines))
