"""The chat screen through the pilot with a scripted engine: streaming, panels, cancel, failures, history."""

import asyncio
import threading
import time

import pytest

from locks_chat.attention import attention_text
from locks_chat.engine_client import ModelTokenizer
from locks_chat.errors import EngineError
from locks_chat.sessions import SessionStore
from locks_chat.settings import Settings
from locks_chat.tui.app import build_app
from locks_chat.tui.book_chat import ChatOptions
from locks_chat.tui.screens.chat import ChatScreen
from locks_chat.tui.widgets.page_heatmap import PageHeatMap
from locks_chat.tui.widgets.prompt_input import PromptInput
from locks_chat.tui.widgets.turn_view import TurnView
from locks_engine.config import LocksConfig
from tests.support.fakes import FakeEngine, WordTokenizer
from tests.support.tui_support import Factory, GatedEngine, notices, until, write_book

SIZE = (120, 40)
pytestmark = pytest.mark.asyncio


def chat_screen(app) -> ChatScreen | None:
    return next((s for s in app.screen_stack if isinstance(s, ChatScreen)), None)


def ready(app) -> bool:
    """The chat screen is up, with its document loaded and its engine started."""
    screen = chat_screen(app)
    return (screen is not None and screen.chat.engine is not None and screen.chat.document is not None
            and not screen.doc_loading.is_set() and not screen.engine_starting.is_set())


async def ask(pilot, question: str) -> None:
    await until(pilot, lambda: ready(pilot.app), what="the app to be ready")
    prompt = pilot.app.screen.query_one(PromptInput)
    prompt.value = question
    await pilot.press("enter")


def answer_text(app) -> str:
    return app.screen.query(TurnView).last().answer


@pytest.fixture
def book(tmp_path):
    return write_book(tmp_path)


async def test_answer_streams_with_citations_and_is_saved(book):
    engine = FakeEngine(answer="The password is **BLUE** (p. 1).", bins_per_step=[[7, 8], [30, 31]])
    app = build_app(book, ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "What is the password?")
        await until(pilot, lambda: not app.screen.answering, what="the answer")
        turn = app.screen.query(TurnView).last()
        assert turn.answer == "The password is **BLUE** (p. 1)."
        footer = str(turn.query_one(".footer").render())
        assert "cited: p. 1" in footer and "TTFT 0.5 s" in footer
        check = turn.query_one(".check")
        assert str(check.render()) == "citations: p. 1 verified" and check.display and check.has_class("-verified")
        assert app.screen.query_one(PromptInput).disabled is False
        strip = app.screen.query_one(PageHeatMap)
        assert strip.token == 6 and strip.share
    store = SessionStore()
    [session] = store.list_sessions()
    [saved] = store.turns(session.id)
    assert (saved.status, saved.answer) == ("done", turn.answer)
    assert saved.citations == [{"page": "1", "physical": 1, "verified": True, "found_on": None, "score": 1.0}]
    assert saved.stats["citation_check"] == "p. 1 verified"
    assert saved.stats["attention"] == {"dense": False, "budget": 2048, "rank": 8}
    assert attention_text(saved.stats) == "LOCKS budget 2048, rank 8" and saved.stats["decode_steps"] == 6
    assert engine.closed


async def test_the_pages_change_per_token_and_keys_typed_meanwhile_are_kept(book):
    engine = GatedEngine(answer="one two three four", bins_per_step=[[7, 8], [30, 31, 45]])
    app = build_app(book, ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "Count?")
        prompt = app.screen.query_one(PromptInput)
        strip = app.screen.query_one(PageHeatMap)
        engine.release(1)
        await until(pilot, lambda: strip.token == 1, what="token 1")
        assert app.screen.answering and answer_text(app) == "one "
        assert set(strip.share) == {1}
        engine.release(1)
        await until(pilot, lambda: strip.token == 2, what="token 2")
        assert answer_text(app) == "one two " and set(strip.share) == {3, 4}
        await pilot.press("x")
        assert prompt.value == "x", "a key typed while the answer streams goes into the prompt, not nowhere"
        engine.release(2)
        await until(pilot, lambda: not app.screen.answering, what="the answer")
        assert prompt.value == "x" and app.focused is prompt


async def test_alt_arrows_step_the_pages_panel_through_the_answers_tokens(book):
    engine = GatedEngine(answer="one two three four", bins_per_step=[[7, 8], [30, 31, 45]])
    app = build_app(book, ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "Count?")
        strip = app.screen.query_one(PageHeatMap)
        engine.release(2)
        await until(pilot, lambda: strip.token == 2, what="token 2")
        await pilot.press("alt+left")
        assert strip.token == 1 and set(strip.share) == {1} and strip.headline().startswith("token 1 of 2:")
        assert len(strip.render().plain.split("\n")[0]) <= strip.content_region.width, "the headline is one row"
        # looking back holds while the answer goes on; the headline counts the new tokens
        engine.release(2)
        await until(pilot, lambda: not app.screen.answering, what="the answer")
        assert strip.token == 1 and strip.headline().startswith("token 1 of 4:")
        await pilot.press("alt+left")
        assert strip.token == 1, "there is no token before the first"
        await pilot.press("alt+right")
        assert strip.token == 2 and set(strip.share) == {3, 4}
        await pilot.press("alt+right", "alt+right")
        assert strip.token == 4 and strip.cursor is None and strip.headline().startswith("token 4:")
        await pilot.press("alt+right")
        assert strip.token == 4
        # the next question starts from a clean slate
        await ask(pilot, "Again?")
        await until(pilot, lambda: strip.token == 0, what="a cleared panel")
        await pilot.press("alt+left")
        assert strip.token == 0 and strip.headline().endswith("nothing read yet")
        engine.release(4)
        await until(pilot, lambda: not app.screen.answering, what="the second answer")


@pytest.mark.parametrize("key", ["escape", "ctrl+c"])
async def test_cancel_mid_answer_aborts_in_the_engine_and_keeps_the_partial_answer(book, key):
    engine = GatedEngine(answer="one two three four")
    app = build_app(book, ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "Count?")
        engine.release(2)
        await until(pilot, lambda: answer_text(app) == "one two ", what="two tokens")
        await pilot.press(key)
        await until(pilot, lambda: not app.screen.answering, what="the cancel")
        assert engine.aborted == 1
        assert app.is_running and app.screen.query_one(PromptInput).disabled is False
        assert "cancelled" in str(app.screen.query(TurnView).last().query_one(".footer").render())
    store = SessionStore()
    [saved] = store.turns(store.list_sessions()[0].id)
    assert (saved.status, saved.answer) == ("cancelled", "one two ")


async def test_ctrl_c_with_nothing_to_stop_or_copy_says_how_to_quit(book):
    """Ctrl+C out of habit: the app stays, and says Ctrl+Q quits (was: nothing at all); Esc stays quiet."""
    app = build_app(book, ChatOptions(), Factory(FakeEngine()))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: ready(app), what="the app to be ready")
        await pilot.press("escape")
        await pilot.pause()
        assert not any("to quit" in m for m in notices(app))
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert app.is_running
        assert any("ctrl+q" in m and "to quit" in m for m in notices(app)), notices(app)


async def test_cancel_during_prefill(book):
    engine = GatedEngine(answer="never said")
    engine.prefill_done.clear()
    app = build_app(book, ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "Anything?")
        await until(pilot, lambda: engine.in_prefill.is_set(), what="the prefill")
        await pilot.press("escape")
        await until(pilot, lambda: not app.screen.answering, what="the cancel")
        assert engine.aborted == 1 and answer_text(app) == ""
    store = SessionStore()
    assert store.turns(store.list_sessions()[0].id)[0].status == "cancelled"


async def test_failure_notifies_and_gives_the_prompt_back(book):
    engine = FakeEngine(answer="one two three", fail=RuntimeError("the engine fell over"))
    app = build_app(book, ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "Will it work?")
        await until(pilot, lambda: not app.screen.answering, what="the failure")
        prompt = app.screen.query_one(PromptInput)
        assert not prompt.disabled and prompt.value == "Will it work?" and app.focused is prompt
        assert any("the engine fell over" in m for m in notices(app, "error"))
    store = SessionStore()
    [saved] = store.turns(store.list_sessions()[0].id)
    assert (saved.status, saved.answer) == ("failed", "one ")


async def test_engine_that_does_not_start(book):
    factory = Factory(error=EngineError("the engine did not start: no model"))
    app = build_app(book, ChatOptions(), factory)
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        await until(pilot, lambda: not screen.engine_starting.is_set() and not screen.doc_loading.is_set())
        await pilot.pause()
        assert "the engine did not start: no model" in notices(app, "error")
        # the notification goes after a while; the Status panel keeps the reason
        status = str(screen.panels.progress.render())
        assert status.startswith("Not ready:") and "the engine did not start: no model" in status
        screen.query_one(PromptInput).value = "Hello?"
        await pilot.press("enter")
        await until(pilot, lambda: not screen.answering, what="the failure")
        assert screen.query_one(PromptInput).value == "Hello?"
        assert any("engine is not running" in m for m in notices(app, "error"))


async def test_question_asked_while_the_engine_starts_waits_for_it(book):
    engine = FakeEngine(answer="Ready now.")
    started = __import__("threading").Event()

    def slow_factory(model, locks, max_model_len):
        started.wait(5)
        return engine

    app = build_app(book, ChatOptions(), slow_factory)
    async with app.run_test(size=SIZE) as pilot:
        app.screen.query_one(PromptInput).value = "Early question?"
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert "Waiting for the engine" in str(app.screen.panels.progress.render())
        started.set()
        await until(pilot, lambda: not app.screen.answering, what="the answer")
        assert answer_text(app) == "Ready now."


async def test_prompt_history_up_and_down(book):
    app = build_app(book, ChatOptions(), Factory(FakeEngine(answer="ok")))
    async with app.run_test(size=SIZE) as pilot:
        for question in ("first?", "second?"):
            await ask(pilot, question)
            await until(pilot, lambda: not app.screen.answering)
        prompt = app.screen.query_one(PromptInput)
        prompt.focus()
        await pilot.press(*"draft")
        await pilot.press("up")
        assert prompt.value == "second?"
        await pilot.press("up", "up")
        assert prompt.value == "first?"
        await pilot.press("down", "down")
        assert prompt.value == "draft"


async def test_quitting_mid_answer_saves_the_partial_answer_as_cancelled(book):
    engine = GatedEngine(answer="one two three four")
    app = build_app(book, ChatOptions(), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "Count?")
        engine.release(1)
        await until(pilot, lambda: answer_text(app) == "one ", what="one token")
        await pilot.press("ctrl+q")
    # the worker thread ends after the app (app.run() waits for it; run_test does not)
    store = SessionStore()
    session = store.list_sessions()[0].id
    deadline = time.monotonic() + 5
    while store.turns(session)[0].status == "interrupted" and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    [saved] = store.turns(session)
    assert (saved.status, saved.answer) == ("cancelled", "one ") and engine.aborted == 1 and engine.closed


async def test_a_book_that_does_not_fit_says_to_use_pages(book):
    # 64 tokens for the answer: the prompt leaves room for a short page, not for the book
    app = build_app(book, ChatOptions(settings=Settings(max_tokens=64)), Factory(FakeEngine(max_context=300)))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "Too long?")
        await until(pilot, lambda: not app.screen.answering, what="the failure")
        [error] = notices(app, "error")
        assert "do not fit" in error and "/pages" in error and "--pages" not in error
        assert "do not fit" in str(app.screen.query(TurnView).last().query_one(".footer").render())


async def test_a_book_that_cannot_fit_is_said_when_it_loads_without_waiting_for_the_engine(book):
    engine, started = FakeEngine(max_context=300), threading.Event()

    def slow_factory(model, locks, max_model_len):
        started.wait(10)
        return engine

    def counted(model, max_model_len):
        return ModelTokenizer(WordTokenizer(), 300)

    app = build_app(book, ChatOptions(), slow_factory, tokenizer_factory=counted)
    try:
        async with app.run_test(size=SIZE) as pilot:
            screen = app.screen
            await until(pilot, lambda: notices(app, "error"), what="the early error")
            [error] = notices(app, "error")
            assert "do not fit the 300-token context" in error and "/pages" in error
            assert screen.engine_starting.is_set()
            prompt = screen.query_one(PromptInput)
            prompt.value = "Too long?"
            await pilot.press("enter")
            await until(pilot, lambda: not screen.answering, what="the refusal")
            assert prompt.value == "Too long?" and len(notices(app, "error")) == 2
            assert screen.engine_starting.is_set() and engine.prompts == []
    finally:
        started.set()


class FastEngine(FakeEngine):
    """Streams a long answer at ``step_s`` seconds a token, faster than the screen handles per-token work."""

    def __init__(self, words: int, step_s: float) -> None:
        super().__init__(answer=" ".join(f"w{i}" for i in range(words)), bins_per_step=[[7, 8], [30, 31], [45]])
        self.step_s = step_s

    def stream(self, prompt_ids, max_tokens, cancel=None, sampling=None):
        for event in super().stream(prompt_ids, max_tokens, cancel, sampling):
            time.sleep(self.step_s)
            yield event


async def test_a_fast_engine_is_drawn_mid_answer_and_no_step_is_lost(book, monkeypatch):
    """The screen takes what the answer's worker left 20 times a second (not one message per token): the panels
    are drawn while the answer streams, every word arrives in order, and every step's pages count."""
    drawn: list[int] = []
    render = PageHeatMap.render

    def spy(strip):
        if strip.screen.answering:
            drawn.append(strip.token)
        return render(strip)

    monkeypatch.setattr(PageHeatMap, "render", spy)
    engine = FastEngine(words=400, step_s=0.0005)
    app = build_app(book, ChatOptions(Settings(max_tokens=400)), Factory(engine))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "Talk?")
        await until(pilot, lambda: not app.screen.answering, timeout=60, what="the answer")
        mid_answer = {token for token in drawn if 0 < token < 400}
        assert len(mid_answer) >= 2, f"the pages panel was drawn mid-answer at tokens {sorted(mid_answer)}"
        strip = app.screen.query_one(PageHeatMap)
        assert strip.token == 400 and answer_text(app).split() == [f"w{i}" for i in range(400)]
        assert strip.seen == {1, 3, 4}


@pytest.mark.parametrize(("seq_len", "pages_read", "said"), [
    (1167, 73 * 6, "read 1,167 of 1,167 tokens per head (73 of 73 KV pages, 100%)"),
    (1167, 16 * 6, "read 255 of 1,167 tokens per head (16 of 73 KV pages, 22%)"),
])
async def test_budget_panel_counts_the_partial_last_page(seq_len, pages_read, said):
    """Tokens read per head: the last KV page, always read, holds fewer than 16 tokens (6 layer-head pairs)."""
    from textual.app import App

    from locks_chat.reading import StepReading
    from locks_chat.tui.widgets.budget_panel import BudgetPanel

    class One(App):
        def compose(self):
            yield BudgetPanel()

    async with One().run_test() as pilot:
        panel = pilot.app.query_one(BudgetPanel)
        panel.show_step(StepReading(seq_len, pages_read, 73 * 6, ()))
        await pilot.pause()
        assert said in str(panel.render())


@pytest.mark.parametrize(("pages_read", "every_page"), [(73 * 6, True), (64 * 6, False)])
async def test_budget_panel_says_when_every_page_is_read_past_the_budget(pages_read, every_page):
    """A budget of 64 KV pages near a 73-page context: the backend reads every page (fewer bytes than
    summaries plus 64 pages), and the panel says why more pages than the budget were read."""
    from textual.app import App

    from locks_chat.reading import StepReading
    from locks_chat.tui.widgets.budget_panel import BudgetPanel

    class One(App):
        def compose(self):
            yield BudgetPanel()

    async with One().run_test() as pilot:
        panel = pilot.app.query_one(BudgetPanel)
        panel.locks = LocksConfig(budget=1024)
        panel.show_step(StepReading(1167, pages_read, 73 * 6, ()))
        await pilot.pause()
        assert ("every page read: fewer bytes" in str(panel.render())) == every_page


async def test_the_panels_give_way_to_the_conversation_on_narrow_terminals(book):
    from locks_chat.tui.widgets.reading_panels import ReadingPanels

    app = build_app(book, ChatOptions(), Factory(FakeEngine()))
    async with app.run_test(size=(60, 24)) as pilot:
        await ask(pilot, "What is the password?")
        await until(pilot, lambda: not app.screen.answering, what="the answer")
        panels, column = app.screen.query_one(ReadingPanels), app.screen.query_one("#chat-column")
        assert not panels.display and column.size.width == 60
        assert any("panels are hidden below 70 columns" in n for n in notices(app))
        for width, panel_width in ((80, 30), (100, 32), (120, 52), (140, 52)):
            await pilot.resize_terminal(width, 30)
            await pilot.pause()
            assert panels.display and panels.size.width == panel_width, width
            assert column.size.width == width - panel_width
        assert answer_text(app) == "It is BLUE (p. 2)."


async def test_a_document_without_text_quits_the_app_with_its_error(tmp_path):
    """The whole document unreadable once the app is up (a PDF without a text layer: only extraction tells): no
    ``/pages`` can help, so the app quits with the error (the command prints it, exit 2) and keeps no session."""
    from tests.support.ingest_samples import text_pdf, write

    scanned = write(tmp_path, "scan.pdf", text_pdf([None, None], image_pages=[0, 1]))
    app = build_app(scanned, ChatOptions(), Factory(FakeEngine()))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.return_code is not None, what="the app to quit")
    assert app.return_code == 2 and "no text" in app.fatal_error
    assert SessionStore().list_sessions() == []


async def test_a_selection_without_text_keeps_the_app_open_for_pages(tmp_path):
    from tests.support.ingest_samples import text_pdf, write

    pdf = write(tmp_path, "half.pdf", text_pdf(["Page one has text.", None], image_pages=[1]))
    app = build_app(pdf, ChatOptions(pages="2"), Factory(FakeEngine()))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: not chat_screen(app).doc_loading.is_set(), what="the load")
        await pilot.pause()
        assert app.return_code is None and app.fatal_error is None
        assert any("no text" in n for n in notices(app))


async def test_a_book_opened_and_closed_without_a_question_leaves_no_session(book):
    app = build_app(book, ChatOptions(), Factory(FakeEngine()))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: ready(app), what="the app to be ready")
        assert len(SessionStore().list_sessions()) == 1
    assert SessionStore().list_sessions() == []
    app = build_app(book, ChatOptions(), Factory(FakeEngine()))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "What is the password?")
        await until(pilot, lambda: not app.screen.answering, what="the answer")
    [kept] = SessionStore().list_sessions()
    assert kept.turns == 1


@pytest.mark.parametrize("command", ["/budget ²", "/rank ¹", "/pages ²"])
async def test_superscript_digits_in_commands_are_refused_with_the_usual_message(book, command):
    app = build_app(book, ChatOptions(), Factory(FakeEngine()))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: ready(app), what="the app to be ready")
        prompt = app.screen.query_one(PromptInput)
        prompt.value = command
        await pilot.press("enter")
        await until(pilot, lambda: not chat_screen(app).doc_loading.is_set(), what="the command")
        await pilot.pause()
        assert app.return_code is None
        said = " ".join(notices(app))
        assert ("needs a positive whole number" in said) if command != "/pages ²" else ("valid pages" in said)
        assert "ValueError" not in said


async def test_a_session_deleted_from_another_terminal_is_said_and_export_still_works(book):
    """``locks-chat sessions delete N`` while the window has N open: the next answer is saved in a new session
    and a warning says so; ``/export`` writes the conversation (was: a traceback, then every question failed)."""
    app = build_app(book, ChatOptions(), Factory(FakeEngine(answer="Blue (p. 1).")))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "First?")
        await until(pilot, lambda: not app.screen.answering, what="the first answer")
        store = SessionStore()
        gone = app.screen.chat.session.id
        assert store.delete(gone)
        prompt = app.screen.query_one(PromptInput)
        prompt.value = "/export"
        await pilot.press("enter")
        await until(pilot, lambda: any("Transcript saved" in m for m in notices(app)), what="the export")
        await ask(pilot, "Second?")
        await until(pilot, lambda: not app.screen.answering and len(app.screen.chat.turns) == 2,
                    what="the second answer")
        await until(pilot, lambda: any(f"Session {gone} was deleted" in m for m in notices(app, "warning")),
                    what="the warning")
        now = app.screen.chat.session.id
    assert now != gone and [t.question for t in store.turns(now)] == ["Second?"]
    assert [t.status for t in store.turns(now)] == ["done"]


async def test_settings_warnings_are_shown_when_the_app_opens(book):
    """A settings file's refused values are said on screen, not only dropped (``load_settings``' warnings)."""
    from locks_chat.tui.app import WARNING_SECONDS

    warning = "settings.toml: budget, rank refused (rank=99 is larger than page_size=16); using the defaults"
    app = build_app(book, ChatOptions(), Factory(FakeEngine()), warnings=(warning,))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: ready(pilot.app), what="the app to be ready")
        assert notices(app, "warning") == [warning]
        [note] = [n for n in app._notifications if n.message == warning]
        assert note.timeout == WARNING_SECONDS >= 20


async def test_readings_ahead_of_their_token_keep_their_own_token():
    """The engine publishes a step's statistics before the event that carries its token: under load the readings
    of tokens 22-24 arrive while the panels have seen 21 tokens. Each keeps its own token, so stepping back from
    the answer's end goes one token at a time (was: all three drawn at token 21, and Alt+Left jumped 25 -> 21)."""
    from textual.app import App

    from locks_chat.reading import StepReading
    from locks_chat.tui.meter import EngineTick
    from locks_chat.tui.widgets.page_heatmap import PageHeatMap
    from locks_chat.tui.widgets.reading_panels import ReadingPanels

    class One(App):
        def compose(self):
            yield ReadingPanels()

    async with One().run_test(size=(140, 40)) as pilot:
        panels = pilot.app.query_one(ReadingPanels)
        panels.show_tick(EngineTick(1.0, 100, 100, 21, None, None, None), 64, None)
        for token in (22, 23, 24):
            panels.show_step(StepReading(100 + token - 1, 6, 6 * 8, ()))
        panels.show_tick(EngineTick(1.2, 100, 100, 25, None, None, None), 64, None)
        panels.show_step(StepReading(100 + 25 - 1, 6, 6 * 8, ()))
        await pilot.pause()
        assert [token for token, _ in panels.query_one(PageHeatMap).history] == [22, 23, 24, 25]
