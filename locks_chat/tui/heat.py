"""The numbers behind the Pages-read heat map: document pages binned to columns, tokens binned to rows, colours.

A cell is one bin of the answer's generated tokens (a row) by one bin of the document's pages (a column). Its
value is the share, 0..1, of the (KV page, layer, KV head) slots of those pages that LOCKS read at those tokens:
the per-page shares of :class:`locks_chat.reading.StepReading` averaged over the column's pages (weighted by
their text length, a stand-in for their KV pages) and over the row's tokens.

Shapes: ``T`` generated tokens recorded, ``P`` document pages, ``C`` columns, ``R`` rows (``R <= T``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rich.color import Color

from locks_chat.ingest import DocPage
from locks_chat.reading import StepReading

UNREAD = Color.parse("#262c3b")
"""a cell none of whose slots were read"""
STOPS = tuple(Color.parse(c).get_truecolor() for c in ("#3b4a6b", "#c2552a", "#ffd43b"))
"""the colour scale from the least to the most read cell (cold blue, orange, yellow)"""


def page_columns(pages: Sequence[DocPage], width: int) -> np.ndarray:
    """Weights that turn per-page shares into per-column shares.

    With at most ``width`` pages each page spans ``width / P`` columns (rounded); with more, each column holds
    ``P / width`` consecutive pages, weighted by their text length (a page without text weighs nothing).

    Args:
        pages (Sequence[DocPage]): the document's `P` pages, in order.
        width (int): columns available, at least 1.

    Returns:
        ndarray: `[P, C]` float64 with ``C = width``, each column summing to 1 (0 for a column of empty
        pages); with more pages than columns each page is in exactly one column.
    """
    count = len(pages)
    assert width >= 1 and count >= 1
    weights = np.zeros((count, width))  # [P, C]
    if count <= width:
        columns = np.arange(width)
        weights[columns * count // width, columns] = 1.0
        return weights
    size = np.array([len(p.text) for p in pages], dtype=np.float64)
    weights[np.arange(count), np.arange(count) * width // count] = size
    total = weights.sum(axis=0)
    return np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)


def first_page_of_columns(pages: Sequence[DocPage], width: int) -> list[int]:
    """Index into ``pages`` of the first page each of the ``width`` columns shows (as :func:`page_columns`)."""
    count = len(pages)
    if count <= width:
        return [c * count // width for c in range(width)]
    return [-(-c * count // width) for c in range(width)]


def page_shares(reading: StepReading, index: dict[int, int]) -> np.ndarray:
    """The share of each document page's slots that one step read.

    Args:
        reading (StepReading): one decode step.
        index (dict[int, int]): page number -> position among the document's `P` pages.

    Returns:
        ndarray: `[P]` float64 in 0..1; a page the step read with no share recorded counts as read whole.
    """
    shares = np.zeros(len(index))
    values = reading.doc_page_share or (1.0,) * len(reading.doc_pages)
    for page, share in zip(reading.doc_pages, values):
        if page.number in index:
            shares[index[page.number]] = share
    return shares


def tokens_per_row(tokens: int, rows: int) -> int:
    """How many consecutive tokens one row holds so that ``tokens`` fit in ``rows`` rows (at least 1)."""
    return max(1, -(-tokens // max(1, rows)))


def bin_rows(grid: np.ndarray, per_row: int) -> np.ndarray:
    """Mean of each run of ``per_row`` consecutive rows of ``grid`` (`[T, C]` -> `[ceil(T / per_row), C]`);
    the last run may be shorter."""
    count = grid.shape[0]
    if per_row == 1 or count == 0:
        return grid
    starts = np.arange(0, count, per_row)
    sums = np.add.reduceat(grid, starts, axis=0)
    sizes = np.minimum(starts + per_row, count) - starts
    return sums / sizes[:, None]


def heat_color(share: float, top: float) -> Color:
    """The colour of a cell read ``share`` (0..1) in a map whose most read cell is ``top``.

    Zero reads are :data:`UNREAD`; the rest go linearly from the first of :data:`STOPS` (barely read) to the
    last (as read as ``top``).
    """
    if share <= 0 or top <= 0:
        return UNREAD
    t = min(1.0, share / top) * (len(STOPS) - 1)
    low = min(int(t), len(STOPS) - 2)
    mix = t - low
    return Color.from_rgb(*(round(a + (b - a) * mix) for a, b in zip(STOPS[low], STOPS[low + 1])))
