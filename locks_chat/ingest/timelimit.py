"""Run one call under a wall-clock limit, so a pathological PDF page cannot hang ingestion.

In the main thread of a POSIX process the call runs in place under ``SIGALRM``
(``signal.setitimer``): the handler raises :class:`TimeLimitExceeded` inside the call,
which unwinds cleanly; past the limit the alarm repeats every :data:`REPEAT_S` seconds, so a
raise that something swallowed (a broad ``except`` in the PDF library) is raised again; cyclic garbage collection
is off during the call and no alarm raises inside a ``__del__``, where a raise would be swallowed and reported as an
unraisable exception. Elsewhere (a Textual worker thread, Windows, or when another
``ITIMER_REAL`` timer is already running) the call runs in a daemon thread that is
abandoned when the limit passes: it may go on computing in the background, so the
caller must not share mutable state with it afterwards (the PDF reader opens a fresh
reader after a timeout). A signal only lands between Python bytecodes, so a single
long C call (a huge zlib stream) overruns the limit by its own length.
"""

from __future__ import annotations

import gc
import signal
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class TimeLimitExceeded(Exception):
    """The call ran past its limit and was interrupted or abandoned."""


def call_with_time_limit(fn: Callable[[], T], seconds: float | None) -> T:
    """Return ``fn()``, or raise :class:`TimeLimitExceeded` after ``seconds`` (wall clock).

    Args:
        fn (Callable[[], T]): the call; exceptions it raises propagate unchanged.
        seconds (float | None): the limit in seconds; ``None`` runs ``fn`` unlimited.
    """
    if seconds is None:
        return fn()
    if _can_use_alarm():
        return _call_with_alarm(fn, seconds)
    return _call_in_thread(fn, seconds)


def _can_use_alarm() -> bool:
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        return False
    return signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


#: seconds between repeated alarms once the limit has passed (module docstring)
REPEAT_S = 0.05


def _call_with_alarm(fn: Callable[[], T], seconds: float) -> T:
    state = {"finished": False, "stopping": False}

    def on_alarm(signum, frame):
        # not inside a finalizer: a raise there is swallowed and reported as unraisable; the next alarm comes
        if _in_finalizer(frame):
            return
        if not (state["finished"] or state["stopping"]):
            raise TimeLimitExceeded(f"over {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    # no cyclic garbage collection during the call: the finalizers it runs are where a raise would be swallowed
    collecting = gc.isenabled()
    gc.disable()
    try:
        # the alarm repeats: a raise that lands where it is swallowed (a library's broad ``except``, a weakref
        # callback or ``__del__`` run by the garbage collector) is followed by another
        signal.setitimer(signal.ITIMER_REAL, seconds, REPEAT_S)
        value = fn()
        state["finished"] = True
        return value
    finally:
        while True:  # an alarm may land here too: disarm until it took
            try:
                state["stopping"] = True
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
                break
            except TimeLimitExceeded:
                continue
        if collecting:
            gc.enable()


def _in_finalizer(frame) -> bool:
    """Whether ``frame`` runs inside a ``__del__`` (anywhere up its stack)."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _call_in_thread(fn: Callable[[], T], seconds: float) -> T:
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # handed to the caller below
            outcome["error"] = exc

    worker = threading.Thread(target=target, name="locks-chat-page", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeLimitExceeded(f"over {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
