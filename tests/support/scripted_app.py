"""The chat app with the scripted engine, for real-terminal tests without vLLM:
``python -m tests.support.scripted_app BOOK`` (the book: ``tests.support.tui_support.write_book``).

It answers every question with :data:`ANSWER`, one word every ``--step-s`` seconds, reading the KV pages of
:data:`DRIFT`: page 1's always, and a window that moves from page 2 through page 3 to page 4 as the answer goes on.
"""

from __future__ import annotations

import argparse
import time

from locks_chat.tui.app import build_app
from locks_chat.tui.book_chat import ChatOptions
from tests.support.fakes import FakeEngine
from tests.support.tui_support import Factory

ANSWER = (
    "The keeper's password is BLUE (p. 1). The harbour holds twelve boats (p. 2), and in winter the storms "
    "came in November (p. 3), when the boats stayed in and the keeper wrote in the log. The library keeps "
    "the charts of the coast (p. 4), which the keeper read each evening after the lamp was lit and the "
    "tide had turned."
)
DRIFT = [[7, 10 + i * 4 // 5, 11 + i * 4 // 5, 12 + i * 4 // 5] for i in range(64)]
"""KV pages read at token i (with ``tests.support.fakes.WordTokenizer`` the book's pages are KV pages 7-9, 9-23, 23-40,
40-62)"""


class PacedEngine(FakeEngine):
    """A :class:`FakeEngine` that takes ``step_s`` seconds a token."""

    def __init__(self, step_s: float) -> None:
        super().__init__(answer=ANSWER, bins_per_step=DRIFT)
        self.step_s = step_s

    def stream(self, prompt_ids, max_tokens, cancel=None, sampling=None):
        for event in super().stream(prompt_ids, max_tokens, cancel, sampling):
            time.sleep(self.step_s)
            yield event


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("book")
    parser.add_argument("--step-s", type=float, default=0.05, help="seconds per generated token")
    args = parser.parse_args()
    app = build_app(args.book, ChatOptions(), Factory(PacedEngine(args.step_s)))
    app.run()


if __name__ == "__main__":
    main()
