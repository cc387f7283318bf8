"""The Pages-read heat map in a real terminal (tmux), with the scripted engine (``tests.support.scripted_app``).

The answer's reading drifts from page 2 to page 4 while page 1 is read at every token. Captured with colours as
the terminal shows them: the map grows a row per token while the answer streams, ends with every token in a row
(binned once they outnumber the rows), shows page 1 read all along and page 4 read only late, and Alt+Left moves
the selected token's marker up a row. A few seconds; skipped without tmux.
"""

from __future__ import annotations

import math
import re
import sys
import time
from pathlib import Path

import pytest
from rich.style import Style
from rich.text import Text

from locks_chat.tui.heat import UNREAD
from tests.support.tmux_support import TmuxApp, have_tmux, panel
from tests.support.tui_support import write_book
from tests.support.paths import REPO

if not have_tmux():
    pytest.skip("tmux is not installed (apt-get install tmux)", allow_module_level=True)

TOKEN = re.compile(r"token (\d+)(?: of (\d+))?:")


@pytest.fixture
def terminal(tmp_path, user_home):
    env = {"LOCKS_CHAT_HOME": str(user_home), "PYTHONPATH": str(REPO), "TERM": "xterm-256color",
           "COLORTERM": "truecolor"}
    app = TmuxApp([sys.executable, "-m", "tests.support.scripted_app", str(write_book(tmp_path))], env, size=(160, 45))
    yield app
    app.close()


class HeatMap:
    """The Pages-read panel of one capture: headline, map lines, page labels, legend."""

    def __init__(self, screen: str) -> None:
        rows = panel(screen, "Pages read")
        match = TOKEN.search(rows[0].plain)
        self.token, self.of = (int(match.group(1)), match.group(2)) if match else (0, None)
        axis = next(i for i, row in enumerate(rows) if row.plain.strip().startswith("1 "))
        self.lines, self.axis = rows[1:axis], rows[axis].plain
        self.legend = rows[axis + 2].plain if len(rows) > axis + 2 else ""

    def half_rows(self) -> int:
        """Token rows drawn (two per line, the first line's upper half empty when it starts with ``▄``)."""
        used = [line.plain[3:].strip() for line in self.lines]
        first = next((i for i, cells in enumerate(used) if cells), len(used))
        if first == len(used):
            return 0
        return 2 * (len(used) - first) - (used[first][0] == "▄")

    def marker(self) -> int:
        """The selected row's half-line, counted from the top of the map."""
        [(line, glyph)] = [(i, row.plain[1]) for i, row in enumerate(self.lines) if row.plain[1] != " "]
        return 2 * line + (glyph == "▄")

    def column(self, label: str) -> int:
        return re.search(rf"(?<!\S){re.escape(label)}(?!\S)", self.axis).start()

    def colours(self, column: int) -> list[tuple[int, int, int] | None]:
        """Colour of each half-line of the map at ``column`` (``None``: nothing drawn there)."""
        out: list[tuple[int, int, int] | None] = []
        for line in self.lines:
            glyph, style = line.plain[column], style_at(line, column)
            fg = style.color.triplet if style.color and style.color.triplet else None
            bg = style.bgcolor.triplet if style.bgcolor and style.bgcolor.triplet else None
            out += [fg, bg] if glyph == "▀" else [None, fg] if glyph == "▄" else [None, None]
        return [tuple(c) if c else None for c in out]


def style_at(line: Text, x: int) -> Style:
    return Style.combine(span.style for span in line.spans if span.start <= x < span.end)


def test_heat_map_grows_per_token_bins_and_steps_in_a_real_terminal(terminal):
    terminal.wait_for(lambda s: "Ready:" in s, timeout=60, what="the app")
    terminal.type_text("Tell me about the coast.")
    terminal.send("Enter")
    live: dict[int, set[int]] = {}  # token in the headline -> the map's half rows seen with it
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        screen = terminal.capture(escapes=True)
        heat = HeatMap(screen)
        if heat.token:
            live.setdefault(heat.token, set()).add(heat.half_rows())
        plain = Text.from_ansi(screen).plain
        if "Ready:" in plain and "tokens ·" in plain:  # the status panel, and the answer's footer
            break
        time.sleep(0.05)
    heat = HeatMap(terminal.capture(escapes=True))
    assert heat.token == 62 and heat.of is None, Text.from_ansi(terminal.capture(escapes=True)).plain
    early = [(token, rows) for token, rows in sorted(live.items()) if token < 2 * len(heat.lines)]
    # a row per token; a capture can catch the terminal mid-frame (the headline drawn, the new row not yet: seen
    # on a loaded 2-core machine), never a row ahead of its token or two behind
    assert all(max(rows) <= token <= min(rows) + 1 for token, rows in early), f"a row per token: {early}"
    assert sum(token in rows for token, rows in early) >= 2, f"a row per token: {early}"

    per_row = int(re.search(r"(\d+) tokens a row", heat.legend).group(1))
    assert heat.half_rows() == math.ceil(62 / per_row) <= 2 * len(heat.lines)
    unread = UNREAD.get_truecolor()
    first = [c for c in heat.colours(heat.column("1")) if c is not None]
    last = [c for c in heat.colours(heat.column("4")) if c is not None]
    assert len(first) == heat.half_rows() and unread not in first, "page 1 is read at every token"
    assert last[0] == unread != last[-1], "page 4 is read late in the answer only"
    assert len(set(first + last)) >= 3, "colours for how much is read"

    assert heat.marker() == 2 * len(heat.lines) - 1, "the newest token is selected, at the bottom"
    for _ in range(per_row):
        terminal.send("M-Left")
    target = f"token {62 - per_row} of 62:"
    terminal.wait_for(lambda s: target in s, timeout=20, what="the marker to step back")
    back = HeatMap(terminal.capture(escapes=True))
    assert back.marker() == heat.marker() - 1 and back.half_rows() == heat.half_rows()
    print(f"\nrows seen while streaming (token: rows): {early}; at the end {heat.half_rows()} rows of {per_row} "
          f"tokens; page 1 column {len(set(first))} colours, page 4 column {len(set(last))}")
