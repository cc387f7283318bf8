"""``--tail``: the tail estimate through ``ask`` (the engine's setting, the ``--json`` statistics, the footer) and
the chat command (over the settings file), with a scripted engine."""

import json

import pytest
from typer.testing import CliRunner

import locks_chat.engine_client
from locks_chat.cli import app
from locks_chat.settings import Settings, load_settings, save_settings
from tests.chat.cli.test_cli_chat import opened  # noqa: F401
from tests.support.fakes import FakeEngine
from tests.support.tui_support import write_book

runner = CliRunner()
TAIL_KEYS = ("tail_estimate", "kv_pages_read_exactly_per_step", "tail_mass_share")


@pytest.fixture(autouse=True)
def no_tokenizer(monkeypatch):
    monkeypatch.setattr(locks_chat.engine_client, "open_tokenizer", lambda *args, **kwargs: None)


@pytest.fixture
def engine(monkeypatch):
    """A scripted engine whose records carry a tail share (0.2, then 0.3, ...) when it is started with a tail."""
    fake = FakeEngine(answer="The password is BLUE (p. 1).", bins_per_step=[list(range(0, 40))],
                      tail_shares=(0.2, 0.3))
    fake.calls = []

    def open_engine(model, locks, max_model_len=None, kv_cache_gib=None):
        fake.calls.append(locks)
        fake.tail = locks.tail
        return fake

    monkeypatch.setattr(locks_chat.engine_client, "open_engine", open_engine)
    return fake


@pytest.fixture
def book(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("The keeper's password is BLUE.\n\n" + "Filler text about the sea. " * 50, encoding="utf-8")
    return path


def test_json_says_the_pages_read_exactly_and_the_tails_share_of_the_mass(book, engine):
    result = runner.invoke(app, ["ask", str(book), "What is the password?", "--json", "--tail", "int8"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)["stats"]
    assert engine.calls[-1].tail == "int8"
    assert stats["decode_steps"] == 6 and stats["tail_estimate"] == "int8"
    assert stats["tail_mass_share"] == 0.25  # the mean of 0.2 and 0.3 over six steps
    assert stats["kv_pages_read_exactly_per_step"] == stats["kv_pages_read_per_step"] == 40 * 3


def test_without_a_tail_the_json_has_no_tail_keys(book, engine):
    result = runner.invoke(app, ["ask", str(book), "What is the password?", "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)["stats"]
    assert engine.calls[-1].tail == "none" and not set(TAIL_KEYS) & set(stats)


def test_the_footer_names_the_tail_and_its_share(book, engine):
    result = runner.invoke(app, ["ask", str(book), "What is the password?", "--tail", "bf16"])
    assert result.exit_code == 0, result.output
    assert "of KV pages exactly (" in result.stderr
    assert "· tail estimate: bf16, 25% of the estimated mass ·" in result.stderr
    plain = runner.invoke(app, ["ask", str(book), "What is the password?"])
    assert "tail estimate" not in plain.stderr and "exactly" not in plain.stderr


def test_an_unknown_tail_is_a_usage_error(book, engine, capsys, monkeypatch):
    from locks_chat import cli

    monkeypatch.setattr("sys.argv", ["locks-chat", "ask", str(book), "q", "--tail", "fp8"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2 and engine.calls == []
    assert "'fp8' is not a tail estimate: give none, int8 or bf16" in capsys.readouterr().err


def test_chat_takes_the_tail_from_the_option_over_the_settings_file(tmp_path, opened):  # noqa: F811
    book = write_book(tmp_path)
    save_settings(Settings(tail="bf16"))
    assert load_settings() == (Settings(tail="bf16"), [])
    assert runner.invoke(app, ["chat", str(book)]).exit_code == 0
    assert runner.invoke(app, ["chat", str(book), "--tail", "none"]).exit_code == 0
    assert [a.chat.options.settings.locks.tail for a in opened] == ["bf16", "none"]


def test_a_bad_tail_in_the_settings_file_gives_the_default_and_a_warning(tmp_path):
    from locks_chat.paths import settings_path

    settings_path().parent.mkdir(parents=True)
    settings_path().write_text("tail = 'fp8'\n")
    settings, warnings = load_settings()
    assert settings.tail == "none" and len(warnings) == 1
    assert "tail = 'fp8' is not allowed (none, int8, bf16)" in warnings[0]
