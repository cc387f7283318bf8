"""What the model read: LOCKS step records turned into KV pages, bytes and document pages.

Units: a KV page is ``page_size`` prompt tokens; the engine counts KV pages once per layer and KV head.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from locks_chat.ingest import DocPage
from locks_chat.prompt import Prompt


@dataclass(frozen=True)
class StepReading:
    """One decode step of one sequence."""

    seq_len: int
    """Tokens in the sequence (prompt + generated so far)."""
    pages_read: int
    """KV pages read, summed over layers and KV heads."""
    pages_total: int
    """KV pages a dense step reads, same units."""
    doc_pages: tuple[DocPage, ...]
    """Document pages whose tokens some layer read in this step."""
    doc_page_share: tuple[float, ...] = ()
    """For each of ``doc_pages``: the share, 0..1, of its (KV page, layer, KV head) slots read in this step
    (a page every layer and head read whole is 1.0); what changes from token to token."""


def step_reading(record: dict[str, Any], prompt: Prompt, row: int = 0) -> StepReading | None:
    """The reading of decode row ``row`` in one step record; ``None`` when the step had no such decode row."""
    if int(record["num_decodes"]) <= row or row >= len(record["row_seq_len"]):
        return None
    tokens_per_bin = int(record["pages_per_bin"]) * int(record["page_size"])
    hist = record["row_hist"][row]
    pages: dict[int, DocPage] = {}
    for b in hist.nonzero()[0].tolist():
        for page in prompt.pages_in_tokens(b * tokens_per_bin, (b + 1) * tokens_per_bin):
            pages[page.number] = page
    read = tuple(pages[n] for n in sorted(pages))
    index = {page.number: i for i, page in enumerate(prompt.pages)}
    return StepReading(
        int(record["row_seq_len"][row]),
        int(record["row_pages_read"][row]),
        int(record["row_pages_total"][row]),
        read,
        tuple(_page_share(record, hist, prompt, index[page.number]) for page in read),
    )


def _page_share(record: dict[str, Any], hist: Any, prompt: Prompt, index: int) -> float:
    """Share of the (KV page, layer, KV head) slots of ``prompt.pages[index]`` that ``hist`` (one row's bins) read."""
    tokens_per_bin = int(record["pages_per_bin"]) * int(record["page_size"])
    start = prompt.page_token_starts[index]
    end = prompt.page_token_starts[index + 1] if index + 1 < len(prompt.pages) else prompt.document_token_range[1]
    bins = hist[start // tokens_per_bin : max(start, end - 1) // tokens_per_bin + 1]
    pairs = int(record.get("num_layers", 0)) * int(record.get("num_kv_heads", 0)) or int(hist.max()) or 1
    return min(1.0, float(bins.sum()) / (len(bins) * int(record["pages_per_bin"]) * pairs))


@dataclass
class ReadingLog:
    """Totals over one answer (decode steps of the one request in flight)."""

    steps: list[StepReading] = field(default_factory=list)
    bytes_read: int = 0
    bytes_dense: int = 0
    prefill_tokens: int = 0

    def add(self, record: dict[str, Any], prompt: Prompt) -> StepReading | None:
        self.prefill_tokens += int(record["num_prefill_tokens"])
        reading = step_reading(record, prompt)
        if reading is not None:
            self.steps.append(reading)
            self.bytes_read += int(record["bytes_read"])
            self.bytes_dense += int(record["bytes_dense"])
        return reading

    def summary(self) -> dict[str, Any]:
        """JSON-ready totals: pages per step vs total, KV bytes read vs dense, document pages read; the per-step
        figures and the fraction are None (JSON null) when no decode step ran (a one-token answer)."""
        read = sum(s.pages_read for s in self.steps)
        total = sum(s.pages_total for s in self.steps)
        counts: dict[str, int] = {}
        for step in self.steps:
            for page in step.doc_pages:
                counts[page.label] = counts.get(page.label, 0) + 1
        return {
            "decode_steps": len(self.steps),
            "kv_pages_read_per_step": read / len(self.steps) if self.steps else None,
            "kv_pages_total_per_step": total / len(self.steps) if self.steps else None,
            "kv_pages_read_fraction": read / total if total else None,
            "kv_bytes_read": self.bytes_read,
            "kv_bytes_dense": self.bytes_dense,
            "document_pages_read": [{"page": label, "steps": n} for label, n in counts.items()],
        }
