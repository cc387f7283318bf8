"""What the model read: LOCKS step records turned into KV pages, bytes and document pages.

Units: a KV page is ``page_size`` prompt tokens; the engine counts KV pages once per layer and KV head.

Where the model looked: each document page's share of the KV reads that fell in the document over an answer
(:meth:`ReadingLog.summary`), from the (KV page, layer, KV head) slots each step read in the page's tokens; a
histogram bin that spans two pages is split between them by tokens. The :data:`MOST_READ` pages with the largest
shares are named, not every page some step touched (at a 10% budget a long answer touches most of a book).
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
    doc_page_reads: tuple[float, ...] = ()
    """For each of ``doc_pages``: the (KV page, layer, KV head) slots read in its tokens in this step, a bin
    shared with a neighbouring page split by tokens (what :meth:`ReadingLog.summary` adds up)."""
    tail: str = "none"
    """The engine's tail estimate (``LocksConfig.tail``): ``none``, or the format of the mean values with which the
    pages not read entered the softmax (``pages_read`` then counts the pages read exactly)."""
    tail_mass_share: float | None = None
    """With a tail estimate: the share, 0..1, of the estimated attention mass that the pages not read carried, the
    mean over layers and KV heads (``locks_engine.stats``' ``row_tail_mass``); ``None`` without one."""


MOST_READ = 5
"""document pages named as the most read over an answer (``document_pages_read``)"""


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
        tuple(_page_reads(record, hist, prompt, index[page.number]) for page in read),
        *_tail(record, row),
    )


def _tail(record: dict[str, Any], row: int) -> tuple[str, float | None]:
    """``(tail, tail_mass_share)`` of decode row ``row`` (:class:`StepReading`): the sum over (layer, KV head)
    pairs of the record's ``row_tail_mass`` over the pairs; ``("none", None)`` without a tail estimate."""
    tail = str(record.get("tail") or "none")
    pairs = int(record.get("num_layers", 0)) * int(record.get("num_kv_heads", 0))
    if tail == "none" or "row_tail_mass" not in record or not pairs:
        return tail, None
    return tail, min(1.0, max(0.0, float(record["row_tail_mass"][row]) / pairs))


def _page_range(prompt: Prompt, index: int) -> tuple[int, int]:
    """``[start, end)`` prompt tokens of ``prompt.pages[index]``."""
    start = prompt.page_token_starts[index]
    end = prompt.page_token_starts[index + 1] if index + 1 < len(prompt.pages) else prompt.document_token_range[1]
    return start, end


def _page_reads(record: dict[str, Any], hist: Any, prompt: Prompt, index: int) -> float:
    """(KV page, layer, KV head) slots ``hist`` read in the tokens of ``prompt.pages[index]``; a bin that spans
    the page's edge counts for the share of its tokens inside the page."""
    tokens_per_bin = int(record["pages_per_bin"]) * int(record["page_size"])
    start, end = _page_range(prompt, index)
    reads = 0.0
    for b in range(start // tokens_per_bin, -(-end // tokens_per_bin)):
        if b < len(hist) and hist[b]:
            inside = min(end, (b + 1) * tokens_per_bin) - max(start, b * tokens_per_bin)
            reads += float(hist[b]) * inside / tokens_per_bin
    return reads


def _page_share(record: dict[str, Any], hist: Any, prompt: Prompt, index: int) -> float:
    """Share of the (KV page, layer, KV head) slots of ``prompt.pages[index]`` that ``hist`` (one row's bins) read."""
    tokens_per_bin = int(record["pages_per_bin"]) * int(record["page_size"])
    start, end = _page_range(prompt, index)
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
        """JSON-ready totals: pages per step vs total, KV bytes read vs dense, and where in the document the model
        looked; the per-step figures and the fraction are None (JSON null) when no decode step ran (a one-token
        answer).

        ``document_pages_read`` holds the :data:`MOST_READ` most-read document pages, most read first, each
        ``{"page": label, "physical": n, "share": s, "steps": k}``: ``s`` its share (0-1, 3 decimals) of the KV
        slots read in the document over the answer, ``k`` the decode steps that read some of it.
        ``document_pages_touched`` counts every page some step read; ``document_pages_rest_share`` is the share
        of the pages not named (0 when every page touched is named).

        With a tail estimate (``LocksConfig.tail``; the keys are absent without one): ``tail_estimate`` its format,
        ``kv_pages_read_exactly_per_step`` the KV pages read exactly (the others entered as the estimate) and
        ``tail_mass_share`` the share (0-1, 3 decimals) of the estimated attention mass the estimate carried, the
        mean over decode steps, layers and KV heads.
        """
        read = sum(s.pages_read for s in self.steps)
        total = sum(s.pages_total for s in self.steps)
        counts: dict[int, int] = {}
        reads: dict[int, float] = {}
        pages: dict[int, DocPage] = {}
        for step in self.steps:
            slots = step.doc_page_reads or (1.0,) * len(step.doc_pages)
            for page, slot in zip(step.doc_pages, slots):
                pages[page.number] = page
                counts[page.number] = counts.get(page.number, 0) + 1
                reads[page.number] = reads.get(page.number, 0.0) + slot
        in_document = sum(reads.values())
        most = sorted(reads, key=lambda n: (-reads[n], n))[:MOST_READ]
        share = {n: reads[n] / in_document if in_document else 0.0 for n in reads}
        return {
            "decode_steps": len(self.steps),
            "kv_pages_read_per_step": read / len(self.steps) if self.steps else None,
            "kv_pages_total_per_step": total / len(self.steps) if self.steps else None,
            "kv_pages_read_fraction": read / total if total else None,
            "kv_bytes_read": self.bytes_read,
            "kv_bytes_dense": self.bytes_dense,
            "document_pages_read": [{"page": pages[n].label, "physical": n, "share": round(share[n], 3),
                                     "steps": counts[n]} for n in most],
            "document_pages_touched": len(reads),
            "document_pages_rest_share": round(max(0.0, 1.0 - sum(share[n] for n in most)), 3),
            **self._tail_summary(),
        }

    def _tail_summary(self) -> dict[str, Any]:
        """The tail estimate's keys of :meth:`summary` (none without a tail estimate)."""
        tailed = [s for s in self.steps if s.tail_mass_share is not None]
        if not tailed:
            return {}
        return {
            "tail_estimate": tailed[-1].tail,
            "kv_pages_read_exactly_per_step": sum(s.pages_read for s in self.steps) / len(self.steps),
            "tail_mass_share": round(sum(s.tail_mass_share for s in tailed) / len(tailed), 3),
        }


def tail_text(summary: dict[str, Any]) -> str | None:
    """``tail estimate: int8, 18% of the estimated mass`` from :meth:`ReadingLog.summary`; ``None`` without a tail
    estimate."""
    if summary.get("tail_estimate") is None or summary.get("tail_mass_share") is None:
        return None
    return f"tail estimate: {summary['tail_estimate']}, {summary['tail_mass_share']:.0%} of the estimated mass"


def most_read_text(summary: dict[str, Any]) -> str:
    """``p. 52 41%, p. 51 12% (+18 more pages, 30%)`` from :meth:`ReadingLog.summary`; ``-`` when no page was read.
    Saved summaries from before the shares were kept name their pages without one."""
    named = summary.get("document_pages_read") or []
    if not named:
        return "-"
    text = ", ".join(f"p. {p['page']} {p['share']:.0%}" if "share" in p else f"p. {p['page']}" for p in named)
    rest = summary.get("document_pages_touched", len(named)) - len(named)
    if rest > 0:
        text += f" (+{rest} more page{'s' if rest > 1 else ''}, {summary.get('document_pages_rest_share', 0):.0%})"
    return text
