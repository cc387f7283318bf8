"""The LOCKS budget and what one decode step read against it: tokens and KV pages per head, document pages, and
with a tail estimate the share of the estimated attention mass that the pages not read carried."""

from __future__ import annotations

from textual.widgets import Static

from locks_chat.reading import StepReading
from locks_chat.settings import LOCKS_DEFAULTS
from locks_engine.config import LocksConfig


class BudgetPanel(Static):
    """Budget and rank in use (the engine's ``LocksConfig``: page size included), and the latest step's reading
    against the total."""

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.locks = LOCKS_DEFAULTS
        self.reading: StepReading | None = None
        self.doc_pages_total = 0
        self.max_context: int | None = None
        self._read = self._total = 0
        self._tail_shares: list[float] = []

    def set_locks(self, locks: LocksConfig, max_context: int | None = None) -> None:
        """Show the configuration the engine runs with (``max_context``: its context in tokens, once known)."""
        self.locks, self.max_context = locks, max_context or self.max_context
        self._show()

    def set_document_pages(self, pages: int) -> None:
        self.doc_pages_total = pages
        self._show()

    def new_answer(self) -> None:
        self.reading, self._read, self._total = None, 0, 0
        self._tail_shares = []
        self._show()

    def show_step(self, reading: StepReading) -> None:
        """Show one decode step's reading (and add it to the answer's total)."""
        self.reading = reading
        self._read += reading.pages_read
        self._total += reading.pages_total
        if reading.tail_mass_share is not None:
            self._tail_shares.append(reading.tail_mass_share)
        self._show()

    def _show(self) -> None:
        cfg, page_size = self.locks, self.locks.page_size
        if cfg.dense:
            lines = ["[b]dense[/]: every KV page read (A/B against LOCKS)"]
        else:
            tail = f", tail estimate [b]{cfg.tail}[/]" if cfg.tail != "none" else ""
            lines = [f"[b]LOCKS[/] budget [b]{cfg.budget:,}[/] tokens ({cfg.budget_pages} KV pages) per head, "
                     f"rank [b]{cfg.rank}[/]{tail}"]
        r = self.reading
        if r is None:
            lines.append("no decode step yet")
        else:
            kv_pages = -(-r.seq_len // page_size)
            pairs = max(1, r.pages_total // max(1, kv_pages))
            per_head = r.pages_read / pairs
            # every step reads the last KV page, which holds only seq_len - (kv_pages - 1) * B tokens
            tokens = max(0.0, per_head * page_size - (kv_pages * page_size - r.seq_len))
            exactly = " exactly" if r.tail_mass_share is not None else ""
            lines.append(
                f"read{exactly} [b]{tokens:,.0f}[/] of {r.seq_len:,} tokens per head "
                f"({per_head:,.0f} of {kv_pages:,} KV pages, {r.pages_read / max(1, r.pages_total):.0%})"
            )
            if not cfg.dense and per_head > cfg.budget_pages:
                # the backend reads every page where summaries of every page plus the budget would cost more
                lines.append("every page read: fewer bytes than the summaries plus the budget")
            if r.tail_mass_share is not None:
                lines.append(f"tail estimate: [b]{r.tail}[/], [b]{r.tail_mass_share:.0%}[/] of the estimated mass")
            lines.append(f"document pages read: [b]{len(r.doc_pages)}[/] of {self.doc_pages_total}")
            answer = f"this answer: {self._read / max(1, self._total):.0%} of KV pages read"
            if self._tail_shares:
                answer += f" exactly, the tail {sum(self._tail_shares) / len(self._tail_shares):.0%} of the mass"
            lines.append(answer)
        if self.max_context:
            used = f"{r.seq_len:,}" if r is not None else "-"
            lines.append(f"context {used} of {self.max_context:,} tokens")
        self.update("\n".join(lines))
