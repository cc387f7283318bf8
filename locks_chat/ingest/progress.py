"""An optional rich progress bar the CLI hands to :func:`load_document`.

Library use passes no callback and stays silent; the CLI does::

    with rich_progress("Reading book.pdf") as progress:
        document = load_document("book.pdf", progress=progress)

The bar goes to stderr, appears only on a terminal and only for documents of at least
``min_total`` pages, and disappears when done.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

ProgressCallback = Callable[[int, int], None]
"""``progress(done, total)``: units (pages) done so far out of ``total``"""


@contextlib.contextmanager
def rich_progress(description: str, *, min_total: int = 20, console=None) -> Iterator[ProgressCallback]:
    """Yield a progress callback that drives a transient rich bar on stderr.

    Args:
        description (str): the text left of the bar.
        min_total (int): totals below this (pages) show no bar.
        console (rich.console.Console | None): where to draw; default stderr.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = console or Console(stderr=True)
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
    task: list[int] = []

    def progress(done: int, total: int) -> None:
        if not task:
            if total < min_total or not console.is_terminal:
                return
            bar.start()
            task.append(bar.add_task(description, total=total))
        bar.update(task[0], completed=done, total=total)

    try:
        yield progress
    finally:
        if task:
            bar.stop()
