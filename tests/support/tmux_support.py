"""Drive a real terminal app under tmux: start it, type, capture the screen, cut panels out of it.

Each :class:`TmuxApp` runs on its own tmux server (``-L`` socket), so it never touches the user's sessions.
Captures with escapes (``capture-pane -e``) keep the colours; :func:`panel` cuts a bordered box out of one by
its title, as Rich ``Text`` lines (characters and styles).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable

from rich.console import Console
from rich.terminal_theme import SVG_EXPORT_THEME, TerminalTheme
from rich.text import Text


def have_tmux() -> bool:
    return shutil.which("tmux") is not None


class TmuxApp:
    """A command running in a detached tmux session of ``size`` (columns, rows)."""

    def __init__(self, command: list[str], env: dict[str, str], size: tuple[int, int] = (140, 45)) -> None:
        self.socket = f"locks-chat-{os.getpid()}-{time.monotonic_ns()}"
        self.size = size
        assignments = [f"{k}={v}" for k, v in env.items()]
        # COLUMNS/LINES from this process (pytest may have them) would override the pane's size in the app;
        # the pane stays open after the app exits, so its last screen and exit status can be read
        shell = f"env -u COLUMNS -u LINES {shlex.join(assignments)} {shlex.join(command)}; echo EXITED $?; sleep 600"
        self._tmux("new-session", "-d", "-s", "app", "-x", str(size[0]), "-y", str(size[1]), shell)

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"tmux {args[0]} failed: {done.stderr.strip()}")
        return done.stdout

    def capture(self, escapes: bool = False) -> str:
        """The visible screen, as text (with SGR escape sequences when ``escapes``).

        A tmux server starved of CPU (the engine start keeps both cores busy) may miss a 30 s reply: the screen
        is asked for up to three times.

        Raises:
            subprocess.TimeoutExpired: tmux answered none of the three.
        """
        args = ("capture-pane", "-p", "-t", "app", *(["-e"] if escapes else []))
        for _ in range(2):
            try:
                return self._tmux(*args)
            except subprocess.TimeoutExpired:
                continue
        return self._tmux(*args)

    def send(self, *keys: str) -> None:
        """Type ``keys`` (tmux key names such as ``Enter`` and ``Escape``, or literal text)."""
        self._tmux("send-keys", "-t", "app", *keys)

    def type_text(self, text: str) -> None:
        self._tmux("send-keys", "-t", "app", "-l", text)

    def wait_for(self, predicate: Callable[[str], bool], timeout: float, what: str, interval: float = 0.5) -> str:
        """Capture until ``predicate(screen)`` holds; returns that screen.

        Raises:
            AssertionError: not within ``timeout`` seconds (the message holds the last screen).
        """
        deadline = time.monotonic() + timeout
        while True:
            screen = self.capture()
            if predicate(screen):
                return screen
            if time.monotonic() > deadline or "EXITED" in screen:
                raise AssertionError(f"timed out waiting for {what}; last screen:\n{screen}")
            time.sleep(interval)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def panel(screen_with_escapes: str, title: str) -> list[Text]:
    """The inside of the bordered box titled ``title`` (``╭─ title ──╮`` ... ``╰──╯``), one Text per row."""
    rows = [Text.from_ansi(line) for line in screen_with_escapes.splitlines()]
    for top, row in enumerate(rows):
        left = row.plain.find(f"╭─ {title} ")
        if left < 0:
            continue
        right = row.plain.find("╮", left)
        inside = []
        for line in rows[top + 1 :]:
            if line.plain[left : left + 1] != "│":
                break
            inside.append(line[left + 1 : right])
        return inside
    raise AssertionError(f"no panel titled {title!r} on the screen")


def signature(lines: list[Text]) -> list[tuple[str, list[str]]]:
    """Characters and per-span styles of panel rows, to compare two captures."""
    return [(line.plain, [f"{s.start}:{s.end}:{s.style}" for s in line.spans]) for line in lines]


def screen_svg(screen: str, title: str, width: int, background: tuple[int, int, int] = (18, 18, 18)) -> str:
    """An SVG picture of a screen captured with escapes (Rich's exporter, the look of Textual's screenshots).

    The capture is parsed as one stream: tmux carries colours over from line to line. Cells left in the
    terminal's default colours get ``background`` (Textual's dark theme).
    """
    colors = [tuple(SVG_EXPORT_THEME.ansi_colors[i]) for i in range(16)]
    theme = TerminalTheme(background, tuple(SVG_EXPORT_THEME.foreground_color), colors[:8], colors[8:])
    with open(os.devnull, "w") as sink:
        console = Console(record=True, width=width, force_terminal=True, color_system="truecolor", file=sink)
        for line in Text.from_ansi(screen).split("\n"):
            console.print(line, no_wrap=True, overflow="crop")
    return console.export_svg(title=title, theme=theme)
