"""Keep the engine's output off the app's screen.

Textual draws on the terminal through ``sys.__stderr__`` (fd 2). vLLM starts engine processes that inherit fd 2
and write logs and progress bars to it, which would tear the app's screen. While the app runs, fd 2 goes to a
log file (children inherit that), and the app draws through a duplicate of the terminal's descriptor.

Inside the app ``sys.stderr`` is Textual's print capture, whose ``fileno()`` is -1; multiprocessing's resource
tracker, which vLLM's engine processes start, passes ``sys.stderr.fileno()`` to its child and fails on it
("bad value(s) in fds_to_keep"). So the tracker is started here, before the app runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def engine_output_to(log_path: Path) -> Iterator[Path]:
    """Redirect fd 2 to ``log_path`` (appended) and point ``sys.__stderr__`` at the terminal for the app.

    Does nothing when stderr is not a terminal (a pipe or a file is no screen to tear).
    """
    if not os.isatty(2):
        start_resource_tracker()
        yield log_path
        return
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    tty_fd = os.dup(2)
    terminal = os.fdopen(tty_fd, "w", buffering=1, encoding=sys.stderr.encoding or "utf-8", errors="replace")
    saved = sys.__stderr__, sys.stderr
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 2)
    start_resource_tracker()
    sys.__stderr__ = sys.stderr = terminal
    try:
        yield log_path
    finally:
        terminal.flush()
        os.dup2(tty_fd, 2)
        sys.__stderr__, sys.stderr = saved
        terminal.close()


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker now, while ``sys.stderr`` has a real descriptor (fd 2)."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
