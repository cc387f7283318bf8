"""The real app in a real terminal (tmux): vLLM with LOCKS, the built-in model, a generated PDF.

One question; while the answer streams, the "Pages read" panel is captured as often as tmux answers; after it,
Alt+Left steps the panel back through the answer's tokens. The panel must show at least two tokens and differ
between some of them (LOCKS picks other KV pages from token to token); the answer is then read off the screen.
About a minute on two CPU cores, most of it the engine start. Skipped without tmux, vLLM or the built-in model.
"""

from __future__ import annotations

import re
import sys
import time

import pytest
from rich.text import Text

from tests.support.tmux_support import TmuxApp, have_tmux, panel, signature

if not have_tmux():
    pytest.skip("tmux is not installed (apt-get install tmux)", allow_module_level=True)
pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")
pytest.importorskip("fpdf", reason="fpdf2 is a test requirement")

FACT_PAGE = 4
FACT = "The lighthouse on Gull Rock was automated in 1987, and no keeper has lived there since."
QUESTION = "In which year was the lighthouse on Gull Rock automated?"
TOKEN = re.compile(r"token (\d+)(?: of \d+)?:")


@pytest.fixture
def fact_pdf(tmp_path):
    from tests.support.ingest_samples import text_pdf

    places = ["harbour wall", "fish market", "chandler's shop", "sea road", "ferry slip", "net loft"]
    pages = []
    for number, place in enumerate(places, 1):
        text = " ".join(f"Morning {i} at the {place}: the tide turned and the gulls circled." for i in range(16))
        pages.append(f"{text} {FACT} {text[:300]}" if number == FACT_PAGE else text)
    path = tmp_path / "harbour.pdf"
    path.write_bytes(text_pdf(pages))
    return path


@pytest.fixture
def terminal(fact_pdf, model_dir, user_home):
    command = [sys.executable, "-m", "locks_chat.cli", str(fact_pdf), "--model", model_dir, "--budget", "256",
               "--max-tokens", "40"]
    app = TmuxApp(command, {"LOCKS_CHAT_HOME": str(user_home), "TERM": "xterm-256color", "COLORTERM": "truecolor"})
    yield app
    app.close()


def pages_panel(screen: str) -> tuple[int, list]:
    """The generated-token number the panel shows on ``screen`` (captured with escapes), and the panel's strip
    (rows below its headline)."""
    rows = panel(screen, "Pages read")
    match = TOKEN.search(rows[0].plain) if rows else None
    return (int(match.group(1)) if match else 0), signature(rows[1:])


def test_real_app_answers_and_the_pages_panel_changes_between_tokens(terminal, user_home):
    terminal.wait_for(lambda s: "Ready:" in s, timeout=400, what="the engine to start")
    terminal.type_text(QUESTION)
    terminal.send("Enter")
    moments: dict[int, list] = {}
    deadline = time.monotonic() + 400
    # one capture a turn, as often as tmux answers: the answer streams for two or three seconds only
    while time.monotonic() < deadline:
        screen = terminal.capture(escapes=True)
        token, strip = pages_panel(screen)
        if token:
            moments.setdefault(token, strip)
        if moments and "Ready:" in Text.from_ansi(screen).plain:
            break
        time.sleep(0.02)
    screen = terminal.wait_for(lambda s: "Ready:" in s and "tokens ·" in s, timeout=60, what="the answer")
    live = sorted(moments)
    assert live, "the pages panel showed no token while the answer streamed"
    # the panel settles on the answer's last token (a capture right after the footer may still hold an earlier one)
    total = int(re.search(r"(\d+) tokens ·", Text.from_ansi(screen).plain).group(1))
    settle = time.monotonic() + 20
    while pages_panel(terminal.capture(escapes=True))[0] != total and time.monotonic() < settle:
        time.sleep(0.1)
    # a loaded machine may repaint once or twice in a short answer: the panel keeps every token to step back to
    shown, strip = pages_panel(terminal.capture(escapes=True))
    assert shown == total, f"the pages panel shows token {shown} of an answer of {total}"
    newest = shown
    moments.setdefault(shown, strip)
    stepped = []
    while shown > 1 and len(stepped) < 4:
        terminal.send("M-Left")
        before = shown
        terminal.wait_for(lambda s, before=before: f"token {before}" not in s, timeout=20,
                          what=f"the pages panel to step back from token {before}")
        screen_back = terminal.capture(escapes=True)
        shown, strip = pages_panel(screen_back)
        assert shown == before - 1 and f"of {newest}:" in Text.from_ansi(screen_back).plain, screen_back
        moments.setdefault(shown, strip)
        stepped.append(shown)
    assert len(moments) >= 2, f"the panel showed one token only: {sorted(moments)}"
    strips = [moments[token] for token in sorted(moments)]
    assert any(strip != strips[0] for strip in strips[1:]), "the pages panel never changed between tokens"

    # the conversation is the left column, up to the panels' borders
    column = min(line.find("╭─ ") for line in screen.splitlines() if "╭─ " in line)
    lines = [line[:column].strip() for line in screen.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("> In which year"))
    end = next(i for i in range(start + 1, len(lines)) if "tokens ·" in lines[i])
    answer, footer = " ".join(line for line in lines[start + 1 : end] if line), lines[end]
    assert answer, f"no answer on the screen:\n{screen}"
    assert "1987" in answer, f"the answer on the screen: {answer!r}"
    assert "TTFT" in footer
    # what the screen shows is the answer the session saved
    from locks_chat.sessions import SessionStore

    store = SessionStore(user_home / "data" / "sessions.sqlite")
    [saved] = store.turns(store.list_sessions()[0].id)
    assert saved.status == "done" and saved.answer.split()[:5] == answer.split()[:5], screen
    changed = sum(strip != strips[0] for strip in strips[1:])
    print(f"\npanel captured live at tokens {live}, stepped back to {stepped}; "
          f"{changed} differ from the first; answer: {answer!r}")
