"""Helpers for the app tests: engines that stream on cue, a book, and waiting for the app to catch up."""

from __future__ import annotations

import asyncio
import re
import threading
import time

from tests.support.fakes import Event, FakeEngine, GenerationCancelled, step_record

BOOK_TEXT = "\f".join(
    [
        "The keeper's password is BLUE. The lighthouse stands on the northern cape.",
        "The harbour holds twelve boats. " * 20,
        "The winter storms came in November. " * 20,
        "The library keeps the charts of the coast. " * 20,
    ]
)
"""four form-feed pages; page 1 holds the answer. With ``WordTokenizer`` the pages are KV pages 7-9, 9-23,
23-40 and 40-62 of the prompt."""


def write_book(tmp_path, name: str = "book.txt", text: str = BOOK_TEXT):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


class GatedEngine(FakeEngine):
    """A :class:`FakeEngine` that prefills until ``prefill_done`` is set, then streams one word per
    ``release()``; it honours ``cancel`` while it waits, like the real engine between steps."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps = threading.Semaphore(0)
        self.prefill_done = threading.Event()
        self.prefill_done.set()
        self.in_prefill = threading.Event()

    def release(self, steps: int = 1) -> None:
        for _ in range(steps):
            self.steps.release()

    def _wait(self, ready, cancel) -> None:
        while not ready():
            if cancel is not None and cancel.is_set():
                self.aborted += 1
                raise GenerationCancelled("cancelled")

    def stream(self, prompt_ids, max_tokens, cancel=None, sampling=None):
        self.samplings.append(sampling)
        self.prompts.append(list(prompt_ids))
        self.in_prefill.set()
        self._wait(lambda: self.prefill_done.wait(0.01), cancel)
        words = re.findall(r"\S+\s*", self.answer)[:max_tokens]
        for i, word in enumerate(words):
            self._wait(lambda: self.steps.acquire(timeout=0.01), cancel)
            bins = self.bins_per_step[i % len(self.bins_per_step)]
            done = i == len(words) - 1
            yield Event(word, i + 1, done, "stop" if done else None, 0.5 + 0.1 * i,
                        [step_record(len(prompt_ids) + i, bins)])


class Factory:
    """An engine factory that records the LOCKS configurations it was called with."""

    def __init__(self, engine=None, error: Exception | None = None) -> None:
        self.engine = engine or FakeEngine()
        self.error = error
        self.calls: list = []

    def __call__(self, model, locks, max_model_len):
        self.calls.append(locks)
        if self.error is not None:
            raise self.error
        return self.engine


async def until(pilot, predicate, timeout: float = 10.0, what: str = "condition") -> None:
    """Let the app run until ``predicate()`` holds (workers are threads: a pause alone does not wait)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)
    await asyncio.sleep(0)


def notices(app, severity: str | None = None) -> list[str]:
    """Messages of the app's notifications (of one severity)."""
    return [n.message for n in app._notifications if severity is None or n.severity == severity]
