"""``locks-chat ask`` and the chat command with a scripted engine: the model's sampling defaults unless the user
sets them (options, settings file), said in the footer and ``--json``; an answer that loops is stopped, said so,
and saved through the loop's first occurrence."""

import json

import pytest
from typer.testing import CliRunner

import locks_chat.engine_client
from locks_chat import cli
from locks_chat.cli import app
from locks_chat.sessions import SessionStore
from locks_chat.settings import Settings, load_settings, save_settings
from locks_chat.tui.app import LocksChatApp
from locks_engine.sampling import GREEDY, Sampling
from tests.support.fakes import LOOP_FIRST, LOOP_SPAN, FakeEngine, looping_engine
from tests.support.tui_support import write_book

runner = CliRunner()
QWEN = Sampling(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.1, source="model")
STOPPED = "stopped: the answer repeated itself"


@pytest.fixture(autouse=True)
def no_model_tokenizer(monkeypatch):
    """No early count of the prompt (that needs the model): the engine's count decides."""
    monkeypatch.setattr(locks_chat.engine_client, "open_tokenizer", lambda *args, **kwargs: None)


@pytest.fixture
def book(tmp_path):
    path = tmp_path / "lighthouse.txt"
    path.write_text("The light on Gull Rock was automated in 1987.\n\n" + "The keeper kept the log. " * 40,
                    encoding="utf-8")
    return path


def use(monkeypatch, engine: FakeEngine) -> FakeEngine:
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", lambda *args, **kwargs: engine)
    return engine


def ask_json(book, *options: str) -> dict:
    result = runner.invoke(app, ["ask", str(book), "Who automated the light?", "--json", *options])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_models_own_sampling_is_used_and_said(book, monkeypatch):
    engine = use(monkeypatch, FakeEngine(answer="In 1987 (p. 1).", model_sampling=QWEN))
    assert ask_json(book)["stats"]["sampling"] == QWEN.to_json()
    assert engine.samplings == [QWEN]
    result = runner.invoke(app, ["ask", str(book), "Who automated the light?"])
    assert "temperature 0.7, top-p 0.8, top-k 20, repetition penalty 1.1, seed 0 (the model's)" in result.stderr


@pytest.mark.parametrize("options, expected", [
    (["--temperature", "0.2", "--seed", "7"], Sampling(0.2, 0.8, 20, 1.1, seed=7, source="user")),
    (["--temperature", "0"], Sampling(0.0, 0.8, 20, 1.1, source="user")),
    (["--top-p", "0.5", "--top-k", "0", "--repetition-penalty", "1"], Sampling(0.7, 0.5, 0, 1.0, source="user")),
], ids=["temperature-and-seed", "greedy", "the-rest"])
def test_the_users_options_win(book, monkeypatch, options, expected):
    engine = use(monkeypatch, FakeEngine(answer="In 1987 (p. 1).", model_sampling=QWEN))
    assert ask_json(book, *options)["stats"]["sampling"] == expected.to_json()
    assert engine.samplings == [expected]


def test_an_engine_that_gives_no_defaults_is_greedy(book, monkeypatch):
    use(monkeypatch, FakeEngine(answer="In 1987 (p. 1)."))
    assert ask_json(book)["stats"]["sampling"] == GREEDY.to_json() | {"source": "greedy"}
    result = runner.invoke(app, ["ask", str(book), "Who automated the light?"])
    assert "· greedy" in result.stderr and STOPPED not in result.stderr


@pytest.mark.parametrize("option, value", [("--temperature", "2.5"), ("--top-p", "0"), ("--top-k", "-1"),
                                           ("--repetition-penalty", "0"), ("--seed", "-3"), ("--top-p", "nan"),
                                           ("--seed", str(2**64)), ("--top-k", str(10**23))])
def test_values_outside_the_ranges_are_one_line(book, monkeypatch, option, value):
    """A seed or top-k past 64 bits too: vLLM's msgpack cannot send it to the engine core (a traceback, after the
    engine had started)."""
    engine = use(monkeypatch, FakeEngine())
    result = runner.invoke(app, ["ask", str(book), "q", "--temperature", "0.7", option, value])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert option in result.output and engine.samplings == []


def test_the_largest_seed_and_top_k_are_taken(book, monkeypatch):
    engine = use(monkeypatch, FakeEngine(answer="In 1987 (p. 1)."))
    biggest = str(2**63 - 1)
    ask_json(book, "--temperature", "0.7", "--seed", biggest, "--top-k", biggest)
    assert engine.samplings[0].seed == engine.samplings[0].top_k == 2**63 - 1


def test_a_looping_answer_is_stopped_and_said_so(book, monkeypatch):
    engine = use(monkeypatch, looping_engine())
    result = runner.invoke(app, ["ask", str(book), "Who automated the light?", "--max-tokens", "512"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"{LOOP_FIRST} {LOOP_SPAN} {LOOP_SPAN}")  # streamed before the guard saw it
    assert STOPPED in result.stderr and "--max-tokens" not in result.stderr
    # the engine aborted the request (the cancel path) once the loop covered 32 words, from the first sentence's
    # 6th word ("was automated in 1987." ends both sentences), not at the token limit
    assert engine.aborted == 1 and engine.streamed == [5 + 32]
    [session] = SessionStore().list_sessions()
    [turn] = SessionStore().turns(session.id)
    assert turn.answer == f"{LOOP_FIRST} {LOOP_SPAN}" and turn.status == "done"
    assert turn.stats["finish_reason"] == "repetition"


def test_a_looping_answer_in_json(book, monkeypatch):
    use(monkeypatch, looping_engine())
    data = ask_json(book, "--max-tokens", "512")
    assert data["answer"] == f"{LOOP_FIRST} {LOOP_SPAN}" and data["stopped"] == "the answer repeated itself"
    assert data["stats"]["finish_reason"] == "repetition" and data["stats"]["generated_tokens"] == 37
    assert data["citations"] == [] and data["proposed_page"]["page"] == "1"  # checked on the kept answer


def test_an_answer_that_does_not_loop_is_not_stopped(book, monkeypatch):
    use(monkeypatch, FakeEngine(answer=" ".join(f"The keeper wrote entry {n} in the log." for n in range(60))))
    data = ask_json(book, "--max-tokens", "512")
    assert data["stopped"] is None and data["stats"]["finish_reason"] == "stop"


@pytest.fixture
def opened(monkeypatch):
    """Capture the app the chat command builds instead of running it."""
    apps = []
    monkeypatch.setattr(LocksChatApp, "run", lambda self, *args, **kwargs: apps.append(self))
    monkeypatch.setattr("locks_chat.cli.chat.terminal_attached", lambda: True)
    monkeypatch.setattr(LocksChatApp, "return_code", None, raising=False)
    return apps


def test_the_chat_command_takes_sampling_over_the_settings_file(tmp_path, monkeypatch, opened):
    save_settings(Settings(temperature=0.3, top_k=40, seed=11))
    monkeypatch.setattr("sys.argv", ["locks-chat", str(write_book(tmp_path)), "--temperature", "0.9", "--top-p",
                                     "0.95"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code in (0, None)
    [chat_app] = opened
    assert chat_app.chat.settings.sampling_overrides() == {"temperature": 0.9, "top_p": 0.95, "top_k": 40,
                                                           "seed": 11}


def test_bad_sampling_values_in_the_settings_file_are_one_line_each(user_home):
    from locks_chat.paths import settings_path

    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("temperature = 5\ntop_p = 0.9\ntop_k = 1.5\nrepetition_penalty = -1\nseed = \"x\"\n")
    settings, warnings = load_settings()
    assert settings.sampling_overrides() == {"top_p": 0.9}
    assert len(warnings) == 4 and all(w.startswith(f"{path}: ") and "\n" not in w for w in warnings)
    for key in ("temperature = 5", "top_k = 1.5", "repetition_penalty = -1", "seed = 'x'"):
        assert any(key in w for w in warnings), key


def test_a_seed_or_top_k_past_64_bits_in_the_settings_file_is_ignored_with_a_warning(user_home):
    from locks_chat.paths import settings_path

    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"seed = {2**64}\ntop_k = {2**63}\ntemperature = 0.5\n")
    settings, warnings = load_settings()
    assert settings.sampling_overrides() == {"temperature": 0.5}
    assert warnings == [f"{path}: {key} = {value} is not allowed (a whole number from 0 to {2**63 - 1}); using the "
                        "default" for key, value in (("seed", 2**64), ("top_k", 2**63))]
