"""Blocking calls the app can walk away from: each runs on a daemon thread of its own, and the thread worker
that waits for it gives up when it is cancelled, which Textual does to every worker when the app exits.

Textual runs thread workers on the event loop's default executor, and ``App.run()`` (``asyncio.run``) joins that
executor's threads before it returns: a worker blocked in a 40-second engine start would hold the exit that long.
A daemon thread is not joined; what it was doing finishes on its own or stops with the process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any

from textual.worker import get_current_worker


class Abandoned(Exception):
    """The worker waiting for a call was cancelled (the app is exiting); the call goes on without it."""


def in_daemon_thread(call: Callable[..., Any], *args: Any) -> Future:
    """Start ``call(*args)`` on a daemon thread; the future gets its result or its exception (never printed)."""
    future: Future = Future()
    future.set_running_or_notify_cancel()

    def run() -> None:
        try:
            future.set_result(call(*args))
        except BaseException as err:  # noqa: BLE001 - handed to whoever waits
            future.set_exception(err)

    threading.Thread(target=run, name=getattr(call, "__name__", "call"), daemon=True).start()
    return future


def abandonable(call: Callable[..., Any], *args: Any, poll_s: float = 0.1) -> Any:
    """``call(*args)`` on a daemon thread, waited for from a thread worker.

    Returns:
        what ``call`` returns (its exception is raised here).
    Raises:
        Abandoned: this worker was cancelled before ``call`` ended (checked every ``poll_s`` seconds).
    """
    worker = get_current_worker()
    future = in_daemon_thread(call, *args)
    while not future.done():
        if worker.is_cancelled:
            raise Abandoned(f"{getattr(call, '__name__', 'call')} was left running")
        wait([future], timeout=poll_s)
    return future.result()
