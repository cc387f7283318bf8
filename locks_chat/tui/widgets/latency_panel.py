"""Time to first token and per-token latency (TPOT) of the answer in flight, with a sparkline of each step."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Sparkline, Static

from locks_chat.tui.meter import EngineTick

HISTORY = 80
"""steps the sparkline shows"""


class LatencyPanel(Vertical):
    """TTFT and TPOT (ms per generated token), from the engine's step times."""

    DEFAULT_CSS = """
    LatencyPanel { height: auto; }
    LatencyPanel > Sparkline { height: 2; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ttft_s: float | None = None
        self.step_ms: list[float] = []
        self._last: tuple[float, int] | None = None

    def compose(self) -> ComposeResult:
        yield Static("no answer yet", id="latency-text")
        yield Sparkline([])

    def new_answer(self) -> None:
        self.ttft_s, self.step_ms, self._last = None, [], None
        self._show()

    def show_tick(self, tick: EngineTick) -> None:
        """Account for one engine step: the first token sets TTFT, later ones add a per-token time."""
        if tick.generated == 0:
            return
        if self._last is None:
            self.ttft_s = tick.elapsed_s
        elif tick.generated > self._last[1]:
            ms = (tick.elapsed_s - self._last[0]) * 1000 / (tick.generated - self._last[1])
            # rounded: the sparkline scales to min..max, and float noise on equal steps would show as bars
            self.step_ms = (self.step_ms + [round(ms, 1)])[-HISTORY:]
        if self._last is None or tick.generated > self._last[1]:
            self._last = (tick.elapsed_s, tick.generated)
            self._show()

    def _show(self) -> None:
        parts = [f"TTFT [b]{self.ttft_s:.1f} s[/]" if self.ttft_s is not None else "TTFT -"]
        if self.step_ms:
            mean = sum(self.step_ms) / len(self.step_ms)
            parts.append(f"TPOT [b]{mean:.0f} ms[/] (last {self.step_ms[-1]:.0f} ms)")
        text = " · ".join(parts) if self.ttft_s is not None else "no answer yet"
        self.query_one("#latency-text", Static).update(text)
        self.query_one(Sparkline).data = list(self.step_ms)
