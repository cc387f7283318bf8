"""KV bytes each decode step reads against a dense step, the page summaries resident, and the bytes saved."""

from __future__ import annotations

from textual.widgets import Static

from locks_chat.tui.meter import EngineTick


def human_bytes(n: float) -> str:
    """``2.4 MB`` (decimal units, as bandwidth is quoted)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


class MemoryPanel(Static):
    """Memory traffic of the answer in flight (units: K+V bytes summed over layers, plus summary bytes)."""

    def __init__(self, **kwargs) -> None:
        super().__init__("no decode step yet", **kwargs)
        self.tick: EngineTick | None = None
        self.saved = 0
        self._generated = 0

    def new_answer(self) -> None:
        self.tick, self.saved, self._generated = None, 0, 0
        self.update("no decode step yet")

    def show_tick(self, tick: EngineTick) -> None:
        """Show the latest decode step's bytes; count bytes not read once per generated token."""
        if tick.bytes_read is None or tick.generated <= self._generated:
            return
        self._generated = tick.generated
        self.tick = tick
        self.saved += max(0, (tick.bytes_dense or 0) - tick.bytes_read)
        read, dense = tick.bytes_read, tick.bytes_dense or 0
        share = f" ({read / dense:.0%})" if dense else ""
        lines = [f"read per token [b]{human_bytes(read)}[/] of {human_bytes(dense)} dense{share}"]
        if tick.summary_bytes is not None:
            of_kv = f" ({tick.summary_bytes / dense:.0%} of K+V)" if dense else ""
            lines.append(f"summaries resident ≈ {human_bytes(tick.summary_bytes)}{of_kv}")
        else:
            lines.append("summaries: none scanned")
        lines.append(f"not read this answer: [b]{human_bytes(self.saved)}[/]")
        self.update("\n".join(lines))
