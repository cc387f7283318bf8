"""The right-hand column: progress, the pages being read, budget, latency, memory and bandwidth."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical

from locks_chat.ingest import Document
from locks_chat.reading import StepReading
from locks_chat.tui.meter import EngineTick
from locks_chat.tui.widgets.budget_panel import BudgetPanel
from locks_chat.tui.widgets.latency_panel import LatencyPanel
from locks_chat.tui.widgets.memory_panel import MemoryPanel
from locks_chat.tui.widgets.page_heatmap import PageHeatMap
from locks_chat.tui.widgets.progress_panel import ProgressPanel
from locks_engine.config import LocksConfig


class ReadingPanels(Vertical):
    """Live panels fed by the engine's per-step LOCKS statistics."""

    DEFAULT_CSS = """
    ReadingPanels { width: 52; height: 1fr; }
    ReadingPanels > * { border: round $primary-darken-1; border-title-color: $text-accent; padding: 0 1; }
    ReadingPanels > #pages-box { height: 1fr; min-height: 6; }
    ReadingPanels > BudgetPanel, ReadingPanels > MemoryPanel { height: auto; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.generated = 0
        """tokens generated so far in the answer in flight"""
        self.prompt_tokens = 0
        """the prompt's tokens of the answer in flight (0 until its first engine tick)"""

    def compose(self) -> ComposeResult:
        yield ProgressPanel(id="progress")
        with Vertical(id="pages-box"):
            yield PageHeatMap(id="pages")
        yield BudgetPanel(id="budget")
        yield LatencyPanel(id="latency")
        yield MemoryPanel(id="memory")

    def on_mount(self) -> None:
        titles = {"progress": "Status", "pages-box": "Pages read", "budget": "Budget",
                  "latency": "Latency", "memory": "Memory & bandwidth"}
        for widget_id, title in titles.items():
            self.query_one(f"#{widget_id}").border_title = title

    @property
    def progress(self) -> ProgressPanel:
        return self.query_one(ProgressPanel)

    def set_document(self, document: Document) -> None:
        self.query_one(PageHeatMap).set_document(document)
        self.query_one(BudgetPanel).set_document_pages(len(document.pages))

    def set_locks(self, locks: LocksConfig, max_context: int | None = None) -> None:
        self.query_one(BudgetPanel).set_locks(locks, max_context)

    def new_answer(self) -> None:
        """Clear the per-answer panels as a question goes to the engine."""
        self.generated = self.prompt_tokens = 0
        self.query_one(PageHeatMap).new_answer()
        self.query_one(BudgetPanel).new_answer()
        self.query_one(LatencyPanel).new_answer()
        self.query_one(MemoryPanel).new_answer()

    def show_step(self, reading: StepReading) -> None:
        """One decode step's reading, drawn at the token that step generated: a step over ``seq_len`` tokens of a
        ``P``-token prompt generates token ``seq_len - P + 1`` (the prefill generates token 1). Several steps can
        arrive with one engine event under load: each keeps its own token, so stepping back through the answer
        goes one token at a time; a step's reading can also come before the event that carries its token (the
        engine publishes the step's statistics first), and keeps its own token then too. The latest generated
        token when the prompt's length is not known yet, or for a prefill chunk's reading."""
        token = reading.seq_len - self.prompt_tokens + 1 if self.prompt_tokens else 0
        self.query_one(PageHeatMap).show_step(reading, token if token >= 1 else self.generated)
        self.query_one(BudgetPanel).show_step(reading)

    def show_tick(self, tick: EngineTick, max_tokens: int, prefill_rate: float | None) -> None:
        """One engine step: prefill then answer progress (ETA from ``prefill_rate``, tokens/s), latency, bytes."""
        progress = self.progress
        if tick.generated == 0 and tick.elapsed_s == 0:
            expected = tick.prompt_tokens / prefill_rate if prefill_rate else None
            progress.begin("answer", "Prefill", tick.prompt_tokens, "tokens", expected)
        elif tick.generated == 0:
            progress.advance("answer", tick.prefilled_tokens)
        elif self.generated == 0:
            progress.begin("answer", "Answering", max_tokens, "tokens max")
        if tick.generated:
            progress.advance("answer", tick.generated)
        self.generated = tick.generated
        self.prompt_tokens = tick.prompt_tokens
        self.query_one(LatencyPanel).show_tick(tick)
        self.query_one(MemoryPanel).show_tick(tick)
