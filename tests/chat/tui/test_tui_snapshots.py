"""How the app looks, at a fixed terminal size, with a scripted engine (pytest-textual-snapshot).

Update after a deliberate change with ``pytest tests/chat/tui/test_tui_snapshots.py --snapshot-update`` and look at the
SVGs under ``tests/chat/tui/__snapshots__/`` before committing them.
"""

import pytest

from locks_chat.settings import Settings
from locks_chat.tui.app import build_app
from locks_chat.tui.book_chat import ChatOptions
from locks_chat.tui.widgets.prompt_input import PromptInput
from tests.support.fakes import FakeEngine, looping_engine
from tests.support.scripted_app import ANSWER as DRIFT_ANSWER, DRIFT
from tests.chat.tui.test_tui_chat import chat_screen, ready
from tests.support.tui_support import Factory, until, write_book

SIZE = (120, 40)
ANSWER = (
    "The keeper's password is **BLUE** (p. 1). The lighthouse stands on the *northern cape* (p. 1), "
    "and the storms came in November (p. 3)."
)


@pytest.fixture
def chat_app(tmp_path):
    engine = FakeEngine(answer=ANSWER, bins_per_step=[[7, 8, 9, 30], [8, 25, 26, 27], [7, 41, 50, 51]])
    return build_app(write_book(tmp_path), ChatOptions(), Factory(engine))


async def settle(pilot) -> None:
    """Wait for the workers, then hide what varies between runs (toasts, the blinking cursor)."""
    screen = lambda: chat_screen(pilot.app)  # noqa: E731
    await until(pilot, lambda: ready(pilot.app) and not screen().answering, what="the app to settle")
    await pilot.pause()
    pilot.app.clear_notifications()
    screen().query_one(PromptInput).cursor_blink = False
    await pilot.pause()


def typed(*texts: str):
    """A ``run_before`` that submits each text at the prompt, waiting for each to finish."""

    async def run_before(pilot) -> None:
        for text in texts:
            await settle(pilot)
            prompt = pilot.app.screen.query_one(PromptInput)
            prompt.value = text
            await pilot.press("enter")
            # the handler empties the prompt, then starts the answer in the same turn: once the prompt is empty,
            # settling waits for that answer (under load a bare pause could come before the handler ran)
            await until(pilot, lambda: prompt.value == "", what="the prompt to be sent")
        await settle(pilot)

    return run_before


def test_answer_with_citations_and_reading_panels(snap_compare, chat_app):
    assert snap_compare(chat_app, terminal_size=SIZE, run_before=typed("What is the password?"))


def test_stats_after_an_answer(snap_compare, chat_app):
    assert snap_compare(chat_app, terminal_size=SIZE, run_before=typed("What is the password?", "/stats"))


def test_help(snap_compare, chat_app):
    assert snap_compare(chat_app, terminal_size=SIZE, run_before=typed("/help"))


@pytest.fixture
def drifting_app(tmp_path):
    engine = FakeEngine(answer=DRIFT_ANSWER, bins_per_step=DRIFT)
    return build_app(write_book(tmp_path), ChatOptions(), Factory(engine))


def stepped_back(question: str, tokens: int):
    """A ``run_before`` that asks ``question`` and then steps the Pages-read panel back ``tokens`` tokens."""

    async def run_before(pilot) -> None:
        await typed(question)(pilot)
        for _ in range(tokens):
            await pilot.press("alt+left")
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("size", [(80, 24), (160, 45)], ids=lambda size: f"{size[0]}x{size[1]}")
def test_heat_map_of_a_long_answer_stepped_back(snap_compare, drifting_app, size):
    assert snap_compare(drifting_app, terminal_size=size, run_before=stepped_back("Tell me about the coast.", 12))


def test_an_answer_that_repeated_itself(snap_compare, tmp_path):
    """Cut after the loop's first occurrence, with the reason first in its footer."""
    app = build_app(write_book(tmp_path), ChatOptions(Settings(max_tokens=512)), Factory(looping_engine()))
    assert snap_compare(app, terminal_size=SIZE, run_before=typed("Who automated the light?"))
