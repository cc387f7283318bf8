"""An engine wrapper that reports progress and bytes from every engine step, for the live panels.

:func:`locks_chat.ask.ask` turns the LOCKS step records into document pages (``StepReading``); what it does not
hand out, the panels need too: how far the prefill has got, and the K+V bytes of each decode step. The wrapper
sees each ``StreamEvent`` before ``ask`` does and passes it on unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from locks_chat.engine_client import ChatEngine
from locks_engine.sampling import GREEDY, Sampling


@dataclass(frozen=True)
class EngineTick:
    """What one engine step of the answer in flight did."""

    elapsed_s: float
    """seconds since the request was added"""
    prompt_tokens: int
    prefilled_tokens: int
    """prompt tokens prefilled so far (tokens served from the prefix cache are not counted)"""
    generated: int
    """tokens generated so far"""
    bytes_read: int | None
    """K+V bytes plus summary bytes the latest decode step read, summed over layers; ``None``: no decode yet"""
    bytes_dense: int | None
    """K+V bytes a dense decode step would have read, same units"""
    summary_bytes: int | None
    """page-summary bytes resident for this sequence (estimated from the step's counters); ``None``: unknown"""


def summary_bytes_resident(record: dict[str, Any]) -> int | None:
    """Bytes of page summaries resident for the decode rows of one step record.

    A decode step reads ``summaries_read`` summaries and ``pages_read`` K+V pages for ``bytes_read`` bytes
    (the statistics ring, ``locks_engine.stats``); a dense step would read ``pages_total`` pages for
    ``bytes_dense``. That gives bytes per summary, times the pages of the sequence.
    """
    pages_total, summaries = int(record.get("pages_total", 0)), int(record.get("summaries_read", 0))
    if not pages_total or not summaries:
        return None
    page_bytes = int(record["bytes_dense"]) / pages_total
    per_summary = (int(record["bytes_read"]) - int(record.get("pages_read", 0)) * page_bytes) / summaries
    return max(0, round(per_summary * pages_total))


class MeteredEngine:
    """A :class:`ChatEngine` that calls ``on_tick`` with an :class:`EngineTick` as a request goes in (nothing
    done yet) and then for every event it streams."""

    def __init__(self, engine: ChatEngine, on_tick: Callable[[EngineTick], None]) -> None:
        self.engine = engine
        self.on_tick = on_tick
        self.tokenizer = engine.tokenizer
        self.max_context = engine.max_context
        self.dtype = getattr(engine, "dtype", None)
        self.model_sampling = getattr(engine, "model_sampling", None)

    def stream(self, prompt_ids: list[int], max_tokens: int, cancel: threading.Event | None = None,
               sampling: Sampling = GREEDY) -> Iterator[Any]:
        prefilled, last = 0, (None, None, None)
        self.on_tick(EngineTick(0.0, len(prompt_ids), 0, 0, None, None, None))
        for event in self.engine.stream(prompt_ids, max_tokens, cancel, sampling=sampling):
            for record in event.stats:
                prefilled += int(record["num_prefill_tokens"])
                if int(record["num_decodes"]) > 0:
                    last = (int(record["bytes_read"]), int(record["bytes_dense"]), summary_bytes_resident(record))
            if event.num_tokens:
                prefilled = len(prompt_ids)
            self.on_tick(EngineTick(event.elapsed_s, len(prompt_ids), prefilled, event.num_tokens, *last))
            yield event

    def close(self) -> None:
        self.engine.close()
