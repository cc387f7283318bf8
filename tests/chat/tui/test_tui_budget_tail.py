"""The Budget panel with a tail estimate, through the pilot with a scripted engine: the pages read exactly, and
the share of the estimated mass that the pages not read carried (this step's, and the answer's mean)."""

import pytest

from locks_chat.attention import attention_text
from locks_chat.sessions import SessionStore
from locks_chat.transcript import turn_stats_text
from locks_chat.settings import Settings
from locks_chat.tui.app import build_app
from locks_chat.tui.book_chat import ChatOptions
from locks_chat.tui.widgets.budget_panel import BudgetPanel
from tests.chat.tui.test_tui_chat import SIZE, ask
from tests.support.fakes import FakeEngine
from tests.support.tui_support import Factory, until, write_book

pytestmark = pytest.mark.asyncio


async def answered_panel(tmp_path, tail: str) -> tuple[str, Factory]:
    """The Budget panel's text after one answer of six steps whose tail shares alternate 0.2 and 0.3."""
    engine = FakeEngine(answer="The password is BLUE (p. 1).", bins_per_step=[[7, 8], [30, 31]], tail=tail,
                        tail_shares=(0.2, 0.3))
    factory = Factory(engine)
    app = build_app(write_book(tmp_path), ChatOptions(Settings(tail=tail)), factory)
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "What is the password?")
        await until(pilot, lambda: not app.screen.answering, what="the answer")
        await pilot.pause()
        return str(app.screen.query_one(BudgetPanel).render()), factory


async def test_budget_panel_says_the_pages_read_exactly_and_the_tails_share(tmp_path):
    text, factory = await answered_panel(tmp_path, "int8")
    assert factory.calls[-1].tail == "int8"  # the engine started with the tail the settings give
    assert "rank 8, tail estimate int8" in text
    assert "read exactly " in text
    assert "tail estimate: int8, 30% of the estimated mass" in text  # the last step's share
    assert "of KV pages read exactly, the tail 25% of the mass" in text  # the answer's mean
    [session] = SessionStore().list_sessions()
    [turn] = SessionStore().turns(session.id)
    assert (turn.stats["tail_estimate"], turn.stats["tail_mass_share"]) == ("int8", 0.25)
    # the setting is kept with the answer, so /stats compares it apart from the same budget without a tail
    assert turn.stats["attention"] == {"dense": False, "budget": 2048, "rank": 8, "tail": "int8"}
    assert attention_text(turn.stats) == "LOCKS budget 2048, rank 8, tail int8"
    assert "of KV pages · tail 25% of the estimated mass · LOCKS budget 2048, rank 8, tail int8" in turn_stats_text(
        turn.stats)


async def test_budget_panel_without_a_tail_says_nothing_of_one(tmp_path):
    text, factory = await answered_panel(tmp_path, "none")
    assert factory.calls[-1].tail == "none"
    assert "tail" not in text and "exactly" not in text and "read " in text
    [session] = SessionStore().list_sessions()
    [turn] = SessionStore().turns(session.id)
    assert turn.stats["attention"] == {"dense": False, "budget": 2048, "rank": 8}
    assert "tail" not in turn_stats_text(turn.stats) and "tail_mass_share" not in turn.stats
