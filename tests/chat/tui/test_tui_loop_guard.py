"""The chat app with an engine that loops: the answer is stopped in the engine, cut after the loop's first
occurrence on screen and in the session, and a line under it says why; the sampling used is in the footer."""

import pytest

from locks_chat.sessions import SessionStore
from locks_chat.settings import Settings
from locks_chat.tui.app import build_app
from locks_chat.tui.book_chat import ChatOptions
from locks_chat.tui.widgets.turn_view import TurnView
from locks_engine.sampling import Sampling
from tests.chat.tui.test_tui_chat import ask
from tests.support.fakes import LOOP_FIRST, LOOP_SPAN, FakeEngine, looping_engine
from tests.support.tui_support import Factory, notices, until, write_book

SIZE = (120, 40)
pytestmark = pytest.mark.asyncio


def footer(app) -> str:
    return str(app.screen.query(TurnView).last().query_one(".footer").render())


async def test_a_looping_answer_is_stopped_cut_and_said_so(tmp_path):
    engine = looping_engine()
    app = build_app(write_book(tmp_path), ChatOptions(Settings(max_tokens=512)), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "Who automated the light?")
        await until(pilot, lambda: not app.screen.answering, what="the answer")
        await pilot.pause()
        turn = app.screen.query(TurnView).last()
        assert turn.answer == f"{LOOP_FIRST} {LOOP_SPAN}"
        assert footer(app).startswith("stopped: the answer repeated itself · ")
        assert any("repeated itself" in n for n in notices(app, "warning"))
        assert engine.aborted == 1 and engine.streamed == [37]
        [session] = SessionStore().list_sessions()
        [saved] = SessionStore().turns(session.id)
        assert saved.answer == turn.answer and saved.status == "done"
        assert saved.stats["finish_reason"] == "repetition"
        exported = app.screen.chat.export().read_text(encoding="utf-8")
        assert f"{LOOP_FIRST} {LOOP_SPAN}\n\n*(stopped: the answer repeated itself)*" in exported


async def test_the_footer_says_the_sampling_and_the_settings_win(tmp_path):
    model = Sampling(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.1, source="model")
    engine = FakeEngine(answer="It is BLUE (p. 1).", model_sampling=model)
    settings = Settings(temperature=0.4, seed=3)
    app = build_app(write_book(tmp_path), ChatOptions(settings), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "What is the password?")
        await until(pilot, lambda: not app.screen.answering, what="the answer")
        await pilot.pause()
        assert engine.samplings == [Sampling(0.4, 0.8, 20, 1.1, seed=3, source="user")]
        text = footer(app)
        assert "T 0.4, top-p 0.8, top-k 20, rp 1.1 (yours)" in text and "stopped" not in text
