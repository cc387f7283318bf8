"""Slash commands and resuming a book's conversation, through the pilot with a scripted engine."""

import tomllib

import pytest

from locks_chat.sessions import SessionStore, file_hash
from locks_chat.paths import settings_path
from locks_chat.tui.app import build_app
from locks_chat.tui.book_chat import ChatOptions
from locks_chat.tui.screens.help import HelpScreen
from locks_chat.tui.widgets.page_heatmap import PageHeatMap
from locks_chat.tui.widgets.prompt_input import PromptInput
from locks_chat.tui.widgets.turn_view import TurnView
from tests.support.fakes import FakeEngine
from tests.chat.tui.test_tui_chat import SIZE, ask, ready
from tests.support.tui_support import Factory, notices, until, write_book

pytestmark = pytest.mark.asyncio


@pytest.fixture
def book(tmp_path):
    return write_book(tmp_path)


async def command(pilot, text: str) -> None:
    await until(pilot, lambda: ready(pilot.app), what="the app to be ready")
    pilot.app.screen.query_one(PromptInput).value = text
    await pilot.press("enter")
    await pilot.pause()


@pytest.mark.parametrize(
    "text, field, value",
    [("/budget 512", "budget", 512), ("/rank 4", "rank", 4), ("/dense", "dense", True), ("/dense off", "dense", False)],
    ids=["budget", "rank", "dense-toggle", "dense-off"],
)
async def test_settings_commands_restart_the_engine_and_are_saved(book, text, field, value):
    factory = Factory(FakeEngine())
    app = build_app(book, ChatOptions(), factory)
    async with app.run_test(size=SIZE) as pilot:
        await command(pilot, text)
        assert any("restarting the engine" in m for m in notices(app))
        await until(pilot, lambda: len(factory.calls) == 2 and ready(app), what="the restart")
        assert getattr(factory.calls[-1], field) == value
        assert getattr(app.chat.settings, field) == value
        assert factory.engine.closed
    assert tomllib.loads(settings_path().read_text())[field] == value


async def test_a_setting_locks_refuses_is_an_error_without_restart(book):
    factory = Factory(FakeEngine())
    app = build_app(book, ChatOptions(), factory)
    async with app.run_test(size=SIZE) as pilot:
        await command(pilot, "/rank 99")
        assert any("rank=99" in m for m in notices(app, "error"))
        await command(pilot, "/budget x")
        await command(pilot, "/frobnicate")
        errors = notices(app, "error")
        assert any("/budget needs a positive whole number" in m for m in errors)
        assert any("unknown command /frobnicate" in m for m in errors)
        assert len(factory.calls) == 1 and app.chat.settings.rank == 8
    assert not settings_path().exists()


async def test_pages_reloads_the_document(book):
    app = build_app(book, ChatOptions(), Factory(FakeEngine()))
    async with app.run_test(size=SIZE) as pilot:
        await command(pilot, "/pages 2-3")
        await until(pilot, lambda: ready(app) and len(app.chat.document.pages) == 2, what="the reload")
        assert [p.label for p in app.screen.query_one(PageHeatMap).pages] == ["2", "3"]
        assert "pages 2-3" in app.sub_title
        await command(pilot, "/pages 9-12")
        await until(pilot, lambda: ready(app) and notices(app, "error"), what="the error")
        [error] = notices(app, "error")
        assert error.startswith("/pages '9-12': ") and "--pages" not in error, error
        assert len(app.chat.document.pages) == 2
    assert SessionStore().list_sessions()[0].pages == "2-3"


async def test_stats_export_and_help(book, user_home):
    engine = FakeEngine(answer="It is BLUE (p. 1).", bins_per_step=[[7, 8]])
    app = build_app(book, ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: ready(app))
        await command(pilot, "/export")
        assert any("nothing to export yet" in m for m in notices(app, "error"))
        assert not (user_home / "data" / "exports").exists()
        await ask(pilot, "What is the password?")
        await until(pilot, lambda: not app.screen.answering)
        await command(pilot, "/stats")
        note = app.screen.query(".note").last()
        assert "LOCKS budget 2048, rank 8" in note.source and "| 1 |" in note.source
        await command(pilot, "/export")
        [exported] = (user_home / "data" / "exports").glob("*.md")
        text = exported.read_text()
        assert "## Q1. What is the password?" in text and "It is BLUE (p. 1)." in text and "Cited: p. 1" in text
        assert any(str(exported) in m for m in notices(app))
        await command(pilot, "/help")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_resume_a_books_conversation(book):
    engine = FakeEngine(answer="It is BLUE, says Zanzibar (p. 1).")
    app = build_app(book, ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "What is the password?")
        await until(pilot, lambda: not app.screen.answering)

    engine = FakeEngine(answer="The northern cape (p. 1).")
    app = build_app(book, ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        # the screen's handler draws the resumed turns, then says so: it may finish after the app is ready
        await until(pilot, lambda: ready(app) and any("Resumed" in m for m in notices(app)), what="the resume")
        turns = app.screen.query(TurnView)
        assert [t.answer for t in turns] == ["It is BLUE, says Zanzibar (p. 1)."]
        prompt = app.screen.query_one(PromptInput)
        prompt.focus()
        await pilot.press("up")
        assert prompt.value == "What is the password?"
        await ask(pilot, "Where is the lighthouse?")
        await until(pilot, lambda: not app.screen.answering)
        # the earlier turn goes back into the prompt as conversation history
        prompt_ids = engine.prompts[-1]
        assert engine.tokenizer("Zanzibar")["input_ids"][0] in prompt_ids
    [session] = SessionStore().list_sessions()
    assert session.turns == 2

    app = build_app(book, ChatOptions(new_session=True), Factory(FakeEngine()))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: ready(app))
        assert not app.screen.query(TurnView)
        assert len(SessionStore().list_sessions()) == 2
    # a new conversation left without a question (and no page range to remember) is not kept
    assert [s.turns for s in SessionStore().list_sessions()] == [2]


async def test_a_turn_cut_off_by_a_crash_is_kept_as_interrupted(book):
    store = SessionStore()
    session = store.open_session(str(book), file_hash(book), "book", None)
    turn = store.begin_turn(session.id, "Half way?")
    store.save_turn(turn, "It was saying")
    app = build_app(book, ChatOptions(), Factory(FakeEngine()))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: ready(app))
        view = app.screen.query(TurnView).last()
        assert view.answer == "It was saying"
        # the resumed turns are drawn by the screen's own handler, which may finish after the app is ready
        footer = view.query_one(".footer")
        await until(pilot, lambda: "interrupted" in str(footer.render()), what="the resumed turn's footer")


async def test_pages_after_the_book_changed_on_disk_reads_nothing_into_the_session(book):
    app = build_app(book, ChatOptions(), Factory(FakeEngine()))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: ready(app), what="the app to be ready")
        before = app.chat.document
        session = app.chat.session
        book.write_text(book.read_text(encoding="utf-8").replace("BLUE", "GREEN"), encoding="utf-8")
        await command(pilot, "/pages 2-3")
        await until(pilot, lambda: ready(app) and notices(app, "error"), what="the refusal")
        [error] = notices(app, "error")
        assert "the file changed on disk since this session opened" in error and "Quit and open the book" in error
        assert app.chat.document is before and "BLUE" in app.chat.document.text, "the session's own text stays"
        saved = SessionStore().get(session.id)
        assert saved.pages is None and saved.doc_hash == session.doc_hash, "the session's range is not the reload's"
