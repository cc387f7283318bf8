"""The book's pages as a strip of cells, lit by how much of each page the model reads at the current token.

Each cell is a page label over a bar. The share of a page's (KV page, layer, KV head) slots that LOCKS read in
this decode step (``StepReading.doc_page_share``) sets the bar's colour; its height is that share relative to
the step's most-read page, so the pages the model leans on stand out even when every share is small. A bold
label marks a page read now, a dim one a page not read at all during this answer.

The strip keeps every step of the answer: Alt+Left and Alt+Right (:meth:`PageStrip.step`) go back and forth
through the tokens, during the answer or after it, and stepping past the newest token follows the answer live
again.
"""

from __future__ import annotations

import math

from rich.color import Color
from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from locks_chat.ingest import DocPage, Document
from locks_chat.reading import StepReading

BARS = " ▁▂▃▄▅▆▇█"
COLD, HOT = Color.parse("#3b4a6b").get_truecolor(), Color.parse("#ffb000").get_truecolor()
MAX_LABEL = 4
"""labels longer than this are cut on the left"""
MAX_CELL = 8
"""cells widen up to this many characters when there are few pages"""


def heat(share: float) -> Style:
    """Colour of a bar for a read share in 0..1."""
    t = max(0.0, min(1.0, share))
    rgb = [round(a + (b - a) * t) for a, b in zip(COLD, HOT)]
    return Style(color=Color.from_rgb(*rgb))


class PageStrip(Widget):
    """Pages of the loaded document with the current step's reading."""

    DEFAULT_CSS = "PageStrip { height: auto; }"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.pages: tuple[DocPage, ...] = ()
        self.share: dict[int, float] = {}
        self.seen: set[int] = set()
        self.token = 0
        """the generated token shown (1-based), 0 before the first step"""
        self.history: list[tuple[int, StepReading]] = []
        """every step of the answer: (generated token, reading), oldest first"""
        self.cursor: int | None = None
        """index into ``history`` of the step shown; ``None``: the newest, following the answer live"""

    def set_document(self, document: Document) -> None:
        """Show a newly loaded document, nothing read yet."""
        self.pages = document.pages
        self.new_answer()

    def new_answer(self) -> None:
        """Clear the reading before an answer starts."""
        self.share, self.seen, self.token = {}, set(), 0
        self.history, self.cursor = [], None
        self.refresh(layout=True)

    def show_step(self, reading: StepReading, token: int) -> None:
        """Record the pages ``reading`` read at generated token ``token``; light them unless an earlier token
        is being looked at (:meth:`step`)."""
        self.history.append((token, reading))
        self.seen.update(page.number for page in reading.doc_pages)
        if self.cursor is None:
            self._show(len(self.history) - 1)
        else:
            self.refresh()  # the headline's "of N"

    def step(self, direction: int) -> bool:
        """Show the previous (``-1``) or next (``1``) recorded token; past the newest, follow the answer live.

        Returns:
            whether the token shown changed (``False`` at the first token, or with nothing recorded).
        """
        if not self.history:
            return False
        newest = len(self.history) - 1
        index = (newest if self.cursor is None else self.cursor) + direction
        if index < 0 or (self.cursor is None and index > newest):
            return False
        self.cursor = None if index >= newest else index
        self._show(min(index, newest))
        return True

    def _show(self, index: int) -> None:
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

    def render(self) -> Text:
        width = max(8, self.content_region.width or 40)
        text = Text(self.headline(), style="bold")
        text.truncate(width, overflow="ellipsis")  # one row, however long the labels: the strip stays in place
        if not self.pages:
            return text
        label = min(MAX_LABEL, max(len(p.label) for p in self.pages))
        cell = max(label + 1, min(MAX_CELL, width // len(self.pages)))
        per_row = max(1, width // cell)
        for first in range(0, len(self.pages), per_row):
            row = self.pages[first : first + per_row]
            text.append("\n")
            for page in row:
                text.append(page.label[-MAX_LABEL:].ljust(cell - 1) + " ", self._label_style(page))
            text.append("\n")
            for page in row:
                text.append(self._bar(page, cell - 1) + " ", heat(self.share.get(page.number, 0.0)))
        return text

    def _label_style(self, page: DocPage) -> str:
        if page.number in self.share:
            return "bold"
        return "" if page.number in self.seen or not self.token else "dim"

    def _bar(self, page: DocPage, width: int) -> str:
        if not page.text:
            return "·".ljust(width)
        share, top = self.share.get(page.number, 0.0), max(self.share.values(), default=0.0)
        level = 0 if share <= 0 else max(1, math.ceil(share / top * (len(BARS) - 1)))
        return BARS[level] * width
