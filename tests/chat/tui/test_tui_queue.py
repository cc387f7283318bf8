"""What is typed while an answer streams is kept: the keys go into the prompt, and Enter queues the question (or
command), sent when the answer ends; one at a time, and given back when the answer is stopped."""

import pytest

from locks_chat.tui.app import build_app
from locks_chat.tui.book_chat import ChatOptions
from locks_chat.tui.widgets.prompt_input import PromptInput
from locks_chat.tui.widgets.turn_view import TurnView
from tests.chat.tui.test_tui_chat import SIZE, answer_text, ask
from tests.support.tui_support import Factory, GatedEngine, notices, until, write_book

pytestmark = pytest.mark.asyncio


@pytest.fixture
def book(tmp_path):
    return write_book(tmp_path)


async def type_and_enter(pilot, text: str) -> None:
    await pilot.press(*text)
    await pilot.press("enter")


async def test_a_question_entered_while_an_answer_streams_is_queued_and_sent_after(book):
    engine = GatedEngine(answer="one two")
    app = build_app(book, ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "First?")
        engine.release(1)
        await until(pilot, lambda: answer_text(app) == "one ", what="a token")
        await type_and_enter(pilot, "Next?")
        prompt = app.screen.query_one(PromptInput)
        assert prompt.value == "" and app.screen.queued == "Next?"
        assert any("Queued" in m for m in notices(app))
        await type_and_enter(pilot, "Third?")
        assert prompt.value == "Third?", "a second question waits in the prompt"
        assert any("already queued" in m for m in notices(app, "warning"))
        engine.release(2)  # the first answer ends; the queued question starts
        await until(pilot, lambda: len(app.screen.query(TurnView)) == 2, what="the queued question asked")
        assert app.screen.query(TurnView).last().question == "Next?" and app.screen.queued is None
        engine.release(2)
        await until(pilot, lambda: not app.screen.answering, what="the second answer")
        assert len(engine.prompts) == 2 and prompt.value == "Third?"


async def test_a_queued_question_is_given_back_when_the_answer_is_stopped(book):
    engine = GatedEngine(answer="one two three")
    app = build_app(book, ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "First?")
        engine.release(1)
        await until(pilot, lambda: answer_text(app) == "one ", what="a token")
        await type_and_enter(pilot, "Next?")
        await pilot.press("escape")
        await until(pilot, lambda: not app.screen.answering, what="the stop")
        assert app.screen.query_one(PromptInput).value == "Next?" and len(engine.prompts) == 1
        assert any("queued question was not sent" in m for m in notices(app))
