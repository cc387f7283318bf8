"""The citation check under each answer in the chat app, through the pilot with a scripted engine."""

import pytest

from locks_chat.tui.app import build_app
from locks_chat.tui.book_chat import ChatOptions
from locks_chat.tui.widgets.turn_view import TurnView
from tests.support.fakes import FakeEngine
from tests.chat.tui.test_tui_chat import SIZE, answer_text, ask, ready
from tests.support.tui_support import Factory, GatedEngine, notices, until, write_book

pytestmark = pytest.mark.asyncio


@pytest.fixture
def book(tmp_path):
    return write_book(tmp_path)


def check_line(app):
    return app.screen.query(TurnView).last().query_one(".check")


@pytest.mark.parametrize(
    "answer,line,verified",
    [
        ("The storms came in November (p. 3).", "citations: p. 3 verified", True),
        ("The password is **BLUE** (p. 3).", "citations: p. 3 cited; the text is on p. 1", False),
        ("The harbour holds twelve boats.", "citations: no page cited; the app found the text on p. 2", False),
    ],
    ids=["right", "wrong", "none"],
)
async def test_the_check_shows_under_the_answer(book, answer, line, verified):
    app = build_app(book, ChatOptions(), Factory(FakeEngine(answer=answer)))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "What is it?")
        await until(pilot, lambda: not app.screen.answering, what="the answer")
        check = check_line(app)
        assert str(check.render()) == line and check.has_class("-shown")
        assert check.has_class("-verified") is verified
        assert check.region.y < app.screen.query(TurnView).last().query_one(".footer").region.y


async def test_a_resumed_turn_shows_its_check(book):
    app = build_app(book, ChatOptions(), Factory(FakeEngine(answer="The password is BLUE (p. 2).")))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "What is the password?")
        await until(pilot, lambda: not app.screen.answering, what="the answer")

    app = build_app(book, ChatOptions(), Factory(FakeEngine()))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: ready(app) and any("Resumed" in m for m in notices(app)), what="the resume")
        assert str(check_line(app).render()) == "citations: p. 2 cited; the text is on p. 1"


async def test_the_line_comes_when_the_answer_ends(book):
    engine = GatedEngine(answer="The password is BLUE (p. 1).")
    app = build_app(book, ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "What is the password?")
        engine.release(3)
        await until(pilot, lambda: answer_text(app) == "The password is ", what="three words")
        assert not check_line(app).display
        engine.release(3)  # "BLUE ", "(p. ", "1)."
        await until(pilot, lambda: check_line(app).display, what="the check")
        assert str(check_line(app).render()) == "citations: p. 1 verified"


def unsupported_line(app):
    return app.screen.query(TurnView).last().query_one(".unsupported")


@pytest.mark.parametrize("answer,shown", [("The keeper is Olaf Berg of Bergen (p. 2).", True),
                                          ("The storms came in November (p. 3).", False)],
                         ids=["unsupported", "supported"])
async def test_an_unsupported_answer_is_said_right_under_it(book, answer, shown):
    app = build_app(book, ChatOptions(), Factory(FakeEngine(answer=answer)))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "Who is the keeper?")
        await until(pilot, lambda: not app.screen.answering, what="the answer")
        line = unsupported_line(app)
        assert line.display is shown
        if shown:
            turn = app.screen.query(TurnView).last()
            assert "Not supported by the document" in str(line.render())
            assert turn.query_one("Markdown").region.bottom <= line.region.y < turn.query_one(".check").region.y

    # a resumed session shows it too: it is saved with the turn
    app = build_app(book, ChatOptions(), Factory(FakeEngine()))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: ready(app) and any("Resumed" in m for m in notices(app)), what="the resume")
        assert unsupported_line(app).display is shown
