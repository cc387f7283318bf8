"""Where the model read while it wrote each part of the answer: the book's pages across, the answer's tokens down.

Columns are the document's pages binned to the panel's width; rows are the answer's generated tokens, two to a
line (half blocks: the upper half's colour in the foreground, the lower half's in the background), the newest
at the bottom: the map grows upward as the answer streams, and once the tokens outnumber the rows each row
holds several consecutive tokens. A cell's colour is the share of its pages' (KV page, layer, KV head) slots
that LOCKS read at its tokens (``locks_chat.tui.heat``), relative to the map's most read cell (the legend says
how much that is).

One token is selected: the newest while the answer streams, or the one Alt+Left / Alt+Right
(:meth:`PageHeatMap.step`) went back to. A marker in the left margin points at its row (its half of the line),
the headline gives its numbers (``token 17 of 40: 11 of 12 pages; most read p. 4, 9, 2``), and the row of bars
under the page labels (marked ``▸``) is its own reading, page by page: height relative to its most read page, the
map's colours. The page labels under the map are bold for pages read at the selected token and dim for pages
not read at all during this answer. Stepping past the newest token follows the answer live again.
"""

from __future__ import annotations

import math

import numpy as np
from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from locks_chat.ingest import DocPage, Document
from locks_chat.reading import StepReading
from locks_chat.tui.heat import (
    UNREAD,
    bin_rows,
    first_page_of_columns,
    heat_color,
    page_columns,
    page_shares,
    tokens_per_row,
)

BARS = " ▁▂▃▄▅▆▇█"
GUTTER = 2
"""columns left of the map: the selected row's marker and a space"""


class PageHeatMap(Widget):
    """Pages of the loaded document by tokens of the answer, coloured by the share read."""

    COMPONENT_CLASSES = {"page-heat-map--cursor"}
    DEFAULT_CSS = """
    PageHeatMap { height: 1fr; }
    PageHeatMap > .page-heat-map--cursor { color: $accent; text-style: bold; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.pages: tuple[DocPage, ...] = ()
        self.share: dict[int, float] = {}
        """page number -> share read at the selected token (pages not read are absent)"""
        self.seen: set[int] = set()
        """page numbers read at some token of this answer"""
        self.token = 0
        """the selected generated token (1-based), 0 before the first step"""
        self.history: list[tuple[int, StepReading]] = []
        """every step of the answer: (generated token, reading), oldest first"""
        self.cursor: int | None = None
        """index into ``history`` of the selected step; ``None``: the newest, following the answer live"""
        self._index: dict[int, int] = {}
        self._shares: list[np.ndarray] = []  # per step: [P]
        self._grid = np.zeros((0, 1))  # [T, C] for the width in _grid_width
        self._grid_width = 0
        self._weights = np.zeros((0, 1))  # [P, C] page_columns for that width

    def set_document(self, document: Document) -> None:
        """Show a newly loaded document, nothing read yet."""
        self.pages = document.pages
        self._index = {page.number: i for i, page in enumerate(self.pages)}
        self.new_answer()

    def new_answer(self) -> None:
        """Clear the reading before an answer starts."""
        self.share, self.seen, self.token = {}, set(), 0
        self.history, self.cursor, self._shares = [], None, []
        self._grid_width = 0
        self.refresh(layout=True)

    def show_step(self, reading: StepReading, token: int) -> None:
        """Record the pages ``reading`` read at generated token ``token``: a new row at the bottom, selected
        unless an earlier token is (:meth:`step`)."""
        self.history.append((token, reading))
        self._shares.append(page_shares(reading, self._index))
        self.seen.update(page.number for page in reading.doc_pages)
        if self.cursor is None:
            self._select(len(self.history) - 1)
        else:
            self.refresh()  # the new row, the headline's "of N"

    def step(self, direction: int) -> bool:
        """Select the previous (``-1``) or next (``1``) recorded token; past the newest, follow the answer live.

        Returns:
            whether the selected token changed (``False`` at the first token, or with nothing recorded).
        """
        if not self.history:
            return False
        newest = len(self.history) - 1
        index = (newest if self.cursor is None else self.cursor) + direction
        if index < 0 or (self.cursor is None and index > newest):
            return False
        self.cursor = None if index >= newest else index
        self._select(min(index, newest))
        return True

    @property
    def selected(self) -> int:
        """Index into ``history`` of the selected step (-1 with none)."""
        return len(self.history) - 1 if self.cursor is None else self.cursor

    def _select(self, index: int) -> None:
        token, reading = self.history[index]
        shares = reading.doc_page_share or (1.0,) * len(reading.doc_pages)
        self.share = {page.number: s for page, s in zip(reading.doc_pages, shares)}
        self.token = token
        self.refresh()

    def headline(self) -> str:
        """``token 17: 11 of 12 pages; most read p. 4, 9, 2`` (``token 5 of 17: ...`` looking back)."""
        if not self.pages:
            return "no document yet"
        if not self.token:
            return f"{len(self.pages)} page{'' if len(self.pages) == 1 else 's'}; nothing read yet"
        top = sorted(self.share, key=lambda n: (-self.share[n], n))[:3]
        labels = {p.number: p.label for p in self.pages}
        most = ", ".join(labels[n] for n in top)
        of = f" of {self.history[-1][0]}" if self.cursor is not None else ""
        return f"token {self.token}{of}: {len(self.share)} of {len(self.pages)} pages; most read p. {most}"

    def grid(self, width: int) -> np.ndarray:
        """The unbinned map for a map ``width`` columns wide: `[T, C]` shares, one row per recorded token."""
        if width != self._grid_width:
            self._grid_width, self._grid = width, np.zeros((0, width))
            self._weights = page_columns(self.pages, width)  # [P, C]
        new = self._shares[len(self._grid) :]
        if new:
            self._grid = np.vstack([self._grid, np.stack(new) @ self._weights])
        return self._grid

    def map_size(self) -> tuple[int, int, list[str]]:
        """The map's size at the widget's size: columns, lines (two token rows each), and what is drawn under
        it as the height allows, in order: ``axis`` (page labels), ``bars`` (the selected token's), ``legend``."""
        width = max(GUTTER + 1, self.content_region.width or 40)
        height = max(1, self.content_region.height or 8)
        extras = [part for part, least in (("axis", 4), ("bars", 6), ("legend", 8)) if height >= least]
        return width - GUTTER, max(1, height - 1 - len(extras)), extras

    def binned(self, columns: int, lines: int) -> tuple[np.ndarray, int]:
        """The map as drawn: `[R, C]` shares with ``C = columns`` and ``R <= 2 * lines`` rows, the last row the
        newest tokens; and how many consecutive tokens a row holds (the last row may hold fewer)."""
        grid = self.grid(columns)
        per_row = tokens_per_row(len(grid), 2 * lines)
        return bin_rows(grid, per_row), per_row

    def render(self) -> Text:
        columns, lines, extras = self.map_size()
        width = columns + GUTTER
        text = Text().append(self.headline(), "bold")
        text.truncate(width, overflow="ellipsis")  # one row, however long the labels: the map stays in place
        if not self.pages:
            return text
        rows, per_row = self.binned(columns, lines)
        top = float(rows.max(initial=0.0))
        marked = self.selected // per_row if self.history else -1
        for line in self._map_lines(rows, lines, top, marked):
            text.append("\n")
            text.append_text(line)
        row = self.grid(columns)[self.selected] if self.history else np.zeros(columns)
        below = {"bars": lambda: self._bars(row, top), "axis": lambda: self._axis(width),
                 "legend": lambda: self._legend(top, per_row, width)}
        for part in extras:
            text.append("\n")
            text.append_text(below[part]())
        return text

    def _map_lines(self, rows: np.ndarray, lines: int, top: float, marked: int) -> list[Text]:
        """``lines`` lines of half-block cells, ``rows`` filling the last ones (newest at the bottom)."""
        offset = 2 * lines - len(rows)  # half-lines above the first row
        cursor = self.get_component_rich_style("page-heat-map--cursor", partial=True)
        out = []
        for line in range(lines):
            upper, lower = 2 * line - offset, 2 * line + 1 - offset
            mark = "▀" if marked == upper else "▄" if marked == lower else " "
            cells = Text().append(mark, cursor).append(" " * (GUTTER - 1))
            for c in range(rows.shape[1]):
                up = heat_color(rows[upper, c], top) if upper >= 0 else None
                down = heat_color(rows[lower, c], top) if lower >= 0 else None
                if up is not None:
                    cells.append("▀", Style(color=up, bgcolor=down))
                elif down is not None:
                    cells.append("▄", Style(color=down))
                else:
                    cells.append(" ")
            out.append(cells)
        return out

    def _bars(self, row: np.ndarray, top: float) -> Text:
        """The selected token's reading: a bar a column, its height relative to its most read column."""
        cursor = self.get_component_rich_style("page-heat-map--cursor", partial=True)
        bars = Text().append("▸", cursor).append(" " * (GUTTER - 1))
        most = float(row.max(initial=0.0))
        for share in row.tolist():
            level = 0 if share <= 0 else max(1, math.ceil(share / most * (len(BARS) - 1)))
            bars.append(BARS[level], Style(color=heat_color(share, top)))
        return bars

    def _axis(self, width: int) -> Text:
        """Page labels under the columns where a page starts and the label has room."""
        axis = Text(" " * GUTTER)
        starts = first_page_of_columns(self.pages, width - GUTTER)
        for column, index in enumerate(starts):
            if len(axis) > GUTTER + column:
                continue  # under the label before
            page = self.pages[index]
            first = column == 0 or index != starts[column - 1]
            if first and (column == 0 or axis.plain.endswith(" ")):
                axis.append(page.label, self._label_style(page))
            else:
                axis.append(" ")
        axis.truncate(width)
        return axis

    def _label_style(self, page: DocPage) -> str:
        if page.number in self.share:
            return "bold"
        return "" if page.number in self.seen or not self.token else "dim"

    def _legend(self, top: float, per_row: int, width: int) -> Text:
        """``■ none ■■■■■ to 34% read · 3 tokens a row``"""
        legend = Text(" " * GUTTER).append("■", Style(color=UNREAD)).append(" none ")
        for share in (0.2, 0.4, 0.6, 0.8, 1.0):
            legend.append("■", Style(color=heat_color(share, 1.0)))
        if top > 0:
            legend.append(f" to {top:.0%} read" if top >= 0.1 else f" to {top:.1%} read")
        if per_row > 1:
            legend.append(f" · {per_row} tokens a row")
        legend.truncate(width, overflow="ellipsis")
        return legend
