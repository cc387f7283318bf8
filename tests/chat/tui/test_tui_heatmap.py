"""The Pages-read heat map: its binning (pages to columns, tokens to rows, colours) and, through the pilot with a
scripted engine, rows that grow with the answer, the selected token's marker and bars, and binning at scale."""

import numpy as np
import pytest
from rich.console import Console
from rich.style import Style
from rich.text import Text

from locks_chat.ingest import DocPage
from locks_chat.settings import Settings
from locks_chat.tui.app import build_app
from locks_chat.tui.book_chat import ChatOptions
from locks_chat.tui.heat import (
    STOPS,
    UNREAD,
    bin_rows,
    first_page_of_columns,
    heat_color,
    page_columns,
    tokens_per_row,
)
from locks_chat.tui.widgets.page_heatmap import GUTTER, PageHeatMap
from tests.chat.tui.test_tui_chat import FastEngine, ask
from tests.support.fakes import Event, FakeEngine
from tests.support.tui_support import Factory, GatedEngine, until, write_book

SIZE = (120, 40)
WAIT = 30.0
"""seconds a step may take on a loaded machine"""


def pages(*lengths: int) -> tuple[DocPage, ...]:
    out, start = [], 0
    for number, length in enumerate(lengths, 1):
        out.append(DocPage(number, str(number), "x" * length, start, start + length))
        start += length
    return tuple(out)


@pytest.mark.parametrize(("count", "width"), [(1, 1), (1, 9), (3, 10), (7, 7), (8, 7), (200, 48), (5, 2)],
                         ids=lambda v: str(v))
def test_every_page_has_a_column_and_every_column_its_pages(count, width):
    weights = page_columns(pages(*[100 + i for i in range(count)]), width)
    assert weights.shape == (count, width)
    assert np.allclose(weights.sum(axis=0), 1.0), "a column is the weighted mean of its pages"
    assert (weights.sum(axis=1) > 0).all(), "no page falls between columns"
    if count > width:
        assert ((weights > 0).sum(axis=1) == 1).all(), "with more pages than columns a page is in one column"
    first = first_page_of_columns(pages(*[1] * count), width)
    assert first == [int(np.flatnonzero(weights[:, c])[0]) for c in range(width)]


def test_few_pages_share_the_width_evenly():
    weights = page_columns(pages(10, 10, 10), 10)
    assert weights.sum(axis=1).tolist() == [4, 3, 3]


def test_many_pages_weigh_by_their_text_and_empty_pages_weigh_nothing():
    weights = page_columns(pages(300, 100, 0, 0, 0, 0), 3)  # columns: pages 1-2, 3-4, 5-6
    assert weights[:, 0].tolist()[:2] == [0.75, 0.25]
    assert weights[:, 1].sum() == 0 and weights[:, 2].sum() == 0, "a column of empty pages reads as unread"


@pytest.mark.parametrize(("tokens", "rows", "per_row"), [(0, 4, 1), (8, 8, 1), (9, 8, 2), (17, 8, 3), (5, 0, 5)])
def test_tokens_per_row_fits_every_token(tokens, rows, per_row):
    assert tokens_per_row(tokens, rows) == per_row


def test_binned_rows_are_means_and_the_last_run_may_be_short():
    grid = np.arange(14, dtype=float).reshape(7, 2)
    binned = bin_rows(grid, 3)
    assert binned.tolist() == [grid[0:3].mean(0).tolist(), grid[3:6].mean(0).tolist(), grid[6:].tolist()[0]]
    assert bin_rows(grid, 1) is grid


def test_colours_run_from_unread_through_the_scale_to_the_most_read():
    assert heat_color(0.0, 0.5) == UNREAD and heat_color(0.3, 0.0) == UNREAD
    assert heat_color(0.5, 0.5).get_truecolor() == STOPS[-1] == heat_color(0.9, 0.5).get_truecolor()
    assert heat_color(1e-6, 0.5).get_truecolor() == STOPS[0]
    ramp = [heat_color(s, 1.0).get_truecolor().red for s in (0.1, 0.3, 0.5, 0.7, 1.0)]
    assert ramp == sorted(ramp) and len(set(ramp)) == len(ramp)


def cells(line: Text) -> list[tuple[str, Style]]:
    """One (character, style) per cell of a rendered line."""
    console = Console(width=400, color_system="truecolor")
    return [(char, seg.style or Style()) for seg in line.render(console) for char in seg.text]


def columns_of(heatmap: PageHeatMap, page_numbers: set[int], columns: int) -> set[int]:
    """The map columns that hold any of ``page_numbers``."""
    rows = [i for i, page in enumerate(heatmap.pages) if page.number in page_numbers]
    return set(np.flatnonzero(page_columns(heatmap.pages, columns)[rows].sum(axis=0)).tolist())


def map_lines(heatmap: PageHeatMap) -> list[Text]:
    """The rendered map's lines (below the headline)."""
    _, lines, _ = heatmap.map_size()
    return heatmap.render().split("\n")[1 : 1 + lines]


@pytest.mark.asyncio
async def test_a_row_per_token_grows_upward_with_the_newest_at_the_bottom(tmp_path):
    engine = GatedEngine(answer="one two three four", bins_per_step=[[7, 8], [30, 31, 45]])
    app = build_app(write_book(tmp_path), ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "Count?")
        heatmap = app.screen.query_one(PageHeatMap)
        columns, lines, extras = heatmap.map_size()
        assert lines >= 8 and extras == ["axis", "bars", "legend"]
        axis = heatmap.render().split("\n")[1 + lines].plain
        for page in heatmap.pages:  # four pages: each label where its columns start
            start = GUTTER + min(columns_of(heatmap, {page.number}, columns))
            assert axis[start : start + len(page.label)] == page.label and axis[start - 1] == " "
        engine.release(1)
        await until(pilot, lambda: heatmap.token == 1, timeout=WAIT, what="token 1")
        rows, per_row = heatmap.binned(columns, lines)
        page1 = columns_of(heatmap, {1}, columns)
        assert per_row == 1 and rows.shape == (1, columns)
        assert set(np.flatnonzero(rows[0])) == page1, "token 1 read page 1 only"
        # one row: the lower half of the last line, marked in the margin
        last = cells(map_lines(heatmap)[-1])
        assert last[0][0] == "▄" and {char for char, _ in last[GUTTER:]} == {"▄"}
        assert last[GUTTER + min(page1)][1].color.triplet == heat_color(rows[0, min(page1)], rows.max()).triplet
        engine.release(1)
        await until(pilot, lambda: heatmap.token == 2, timeout=WAIT, what="token 2")
        rows, _ = heatmap.binned(columns, lines)
        assert rows.shape == (2, columns)
        assert set(np.flatnonzero(rows[1])) == columns_of(heatmap, {3, 4}, columns), "token 2 read pages 3, 4"
        # both rows on the last line: token 1 in the upper half (foreground), token 2 in the lower (background)
        last = cells(map_lines(heatmap)[-1])
        char, style = last[GUTTER + min(page1)]
        assert char == "▀" and style.color.triplet != style.bgcolor.triplet == UNREAD.get_truecolor()
        assert last[0][0] == "▄", "the marker points at the newest token's half"
        assert all(char == " " for char, _ in cells(map_lines(heatmap)[-2])), "nothing above the answer yet"
        engine.release(2)
        await until(pilot, lambda: not app.screen.answering, timeout=WAIT, what="the answer")


@pytest.mark.asyncio
async def test_alt_arrows_move_the_marker_and_the_bars_to_the_selected_token(tmp_path):
    engine = GatedEngine(answer="one two three four", bins_per_step=[[7, 8], [30, 31, 45]])
    app = build_app(write_book(tmp_path), ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "Count?")
        heatmap = app.screen.query_one(PageHeatMap)
        engine.release(4)
        await until(pilot, lambda: not app.screen.answering, timeout=WAIT, what="the answer")
        await pilot.pause()

        def marker() -> tuple[int, str]:
            """The marked line, counted from the map's bottom (-1: the last), and its half: the panel's height can
            change once the answer ends (a loaded machine draws that later), the marker's place from the bottom
            cannot."""
            found = [(i, line.plain[0]) for i, line in enumerate(map_lines(heatmap)) if line.plain[0] != " "]
            assert len(found) == 1, found
            return found[0][0] - heatmap.map_size()[1], found[0][1]

        def bars() -> set[int]:
            columns, lines, _ = heatmap.map_size()
            row = cells(heatmap.render().split("\n")[1 + lines + 1])
            assert row[0][0] == "▸"
            return {c - GUTTER for c, (char, _) in enumerate(row) if c >= GUTTER and char != " "}

        def pages(numbers: set[int]) -> set[int]:
            return columns_of(heatmap, numbers, heatmap.map_size()[0])

        assert marker() == (-1, "▄") and heatmap.token == 4
        assert bars() == pages({3, 4})
        await pilot.press("alt+left")
        assert marker() == (-1, "▀") and heatmap.headline().startswith("token 3 of 4:")
        assert bars() == pages({1})
        await pilot.press("alt+left")
        assert marker() == (-2, "▄") and bars() == pages({3, 4})
        await pilot.press("alt+right", "alt+right")
        assert marker() == (-1, "▄") and heatmap.cursor is None


@pytest.mark.asyncio
async def test_a_long_answer_bins_tokens_into_rows_and_keeps_every_token(tmp_path):
    engine = FastEngine(words=300, step_s=0.0)
    app = build_app(write_book(tmp_path), ChatOptions(Settings(max_tokens=300)), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "Talk?")
        await until(pilot, lambda: not app.screen.answering, timeout=60, what="the answer")
        heatmap = app.screen.query_one(PageHeatMap)
        columns, lines, _ = heatmap.map_size()
        rows, per_row = heatmap.binned(columns, lines)
        grid = heatmap.grid(columns)
        assert grid.shape == (300, columns)
        assert per_row == -(-300 // (2 * lines)) > 1 and len(rows) == -(-300 // per_row) <= 2 * lines
        assert np.allclose(rows[0], grid[:per_row].mean(axis=0))
        assert f"{per_row} tokens a row" in heatmap.render().plain
        # stepping back one row's worth of tokens moves the marker one half-line up
        before = [line.plain[0] for line in map_lines(heatmap)]
        for _ in range(per_row):
            await pilot.press("alt+left")
        after = [line.plain[0] for line in map_lines(heatmap)]
        assert before != after and heatmap.token == 300 - per_row


@pytest.mark.asyncio
async def test_a_book_with_more_pages_than_columns_bins_pages(tmp_path):
    text = "\f".join(f"Page {n} says the tide turned {n} times. " * 2 for n in range(1, 151))
    engine = GatedEngine(answer="one two", bins_per_step=[[3, 30, 31, 60]])
    app = build_app(write_book(tmp_path, text=text), ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "Count?")
        heatmap = app.screen.query_one(PageHeatMap)
        engine.release(1)
        await until(pilot, lambda: heatmap.token == 1, timeout=WAIT, what="token 1")
        columns, lines, _ = heatmap.map_size()
        assert len(heatmap.pages) == 150 > columns
        rows, _ = heatmap.binned(columns, lines)
        read = {page.number for page in heatmap.history[0][1].doc_pages}
        assert len(read) >= 3
        assert set(np.flatnonzero(rows[0])) == columns_of(heatmap, read, columns)
        axis = heatmap.render().split("\n")[1 + lines].plain
        labels = [int(word) for word in axis.split()]
        assert labels[0] == 1 and labels == sorted(labels) and len(labels) > 3
        engine.release(1)
        await until(pilot, lambda: not app.screen.answering, timeout=WAIT, what="the answer")


class CoalescingEngine(FakeEngine):
    """Streams its answer in events of several tokens, each with the records of its steps (as vLLM batches its
    outputs on a loaded machine): event sizes ``sizes``, then one token an event."""

    def __init__(self, sizes: list[int], **kwargs) -> None:
        super().__init__(**kwargs)
        self.sizes = sizes

    def stream(self, prompt_ids, max_tokens, cancel=None, sampling=None):
        events = list(super().stream(prompt_ids, max_tokens, cancel, sampling))
        sizes = self.sizes + [1] * len(events)
        start = 0
        for size in sizes:
            group = events[start : start + size]
            if not group:
                return
            last = group[-1]
            yield Event("".join(e.text for e in group), last.num_tokens, last.finished, last.finish_reason,
                        last.elapsed_s, [r for e in group for r in e.stats], last.cached_tokens)
            start += size


@pytest.mark.asyncio
async def test_steps_that_arrive_together_keep_their_own_tokens(tmp_path):
    """Three steps in one engine event are tokens 2, 3 and 4, not three times token 4: stepping back from the
    last token goes one token at a time (each reading's token is its step's sequence length past the prompt)."""
    engine = CoalescingEngine([1, 3], answer="one two three four five",
                              bins_per_step=[[7, 8], [30, 31, 45], [12], [20, 21]])
    app = build_app(write_book(tmp_path), ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "Count?")
        heatmap = app.screen.query_one(PageHeatMap)
        await until(pilot, lambda: not app.screen.answering, timeout=WAIT, what="the answer")
        await pilot.pause()
        assert [token for token, _ in heatmap.history] == [1, 2, 3, 4, 5]
        for token in (4, 3, 2, 1):
            await pilot.press("alt+left")
            assert heatmap.headline().startswith(f"token {token} of 5:")
