"""What an answer's worker thread hands the chat screen: answer text, step readings and engine ticks, in order,
taken all at once by the screen at a fixed rate.

One Textual message per token floods the screen's message queue whenever the engine produces tokens faster than
the screen handles them (a GPU engine at 5-10 ms a token, or two CPU cores shared with the engine), and Textual
repaints a screen only when its queue runs empty: the live panels then froze until the answer ended. Through a
mailbox the queue holds at most one drain request, the screen repaints between drains, and nothing is lost:
every step's reading and every tick still reach the panels, in the order the engine made them.
"""

from __future__ import annotations

import threading
from typing import Any

DRAIN_PERIOD_S = 0.05
"""how often the screen takes what arrived (seconds): 20 redraws a second at most"""


class Mailbox:
    """A thread-safe, ordered hand-over from one producer thread to the UI's event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Any] = []

    def put(self, item: Any) -> None:
        """Leave ``item`` for the next :meth:`take` (called from the worker thread)."""
        with self._lock:
            self._items.append(item)

    def pending(self) -> bool:
        """Whether anything waits to be taken."""
        with self._lock:
            return bool(self._items)

    def take(self) -> list[Any]:
        """Everything left since the last call, oldest first; the mailbox is then empty."""
        with self._lock:
            items, self._items = self._items, []
        return items
