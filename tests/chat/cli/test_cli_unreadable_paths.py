"""Paths that cannot even be looked up (a name longer than the file system takes, ``~user`` of no user, a loop of
links) as the document or ``--model``: one line and exit code 2 before anything starts, never a traceback
(pathlib's ``is_dir``/``is_fifo`` raise for them instead of answering)."""

import pytest
from typer.testing import CliRunner

import locks_chat.engine_client
from locks_chat.cli import app

runner = CliRunner()
TOO_LONG = "a" * 300 + ".md"
NEXT = "pass a model directory, a hub id (org/name) or a built-in model (qwen0.5b, smollm2)"


def engine_started(*args, **kwargs):
    pytest.fail("the engine was started")


@pytest.fixture
def book(tmp_path, monkeypatch):
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", engine_started)
    path = tmp_path / "book.txt"
    path.write_text("The keeper's password is BLUE.", encoding="utf-8")
    return path


def one_line(result) -> str:
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    [line] = result.stderr.splitlines()
    return line


@pytest.mark.parametrize("command", ["ask", "chat"])
def test_a_document_name_too_long_is_one_line(tmp_path, book, command):
    doc = tmp_path / TOO_LONG
    args = [command, str(doc)] + (["q"] if command == "ask" else [])
    assert one_line(runner.invoke(app, args)) == f"error: {doc}: cannot read (File name too long); check the path"


@pytest.mark.parametrize("command", ["ask", "chat"])
def test_a_loop_of_links_is_one_line(tmp_path, book, command):
    loop = tmp_path / "loop.md"
    loop.symlink_to(loop)
    args = [command, str(loop)] + (["q"] if command == "ask" else [])
    assert one_line(runner.invoke(app, args)) == (
        f"error: {loop}: cannot read (Too many levels of symbolic links); check the path")


def test_a_model_name_too_long_is_one_line(tmp_path, book):
    model = str(tmp_path / TOO_LONG)
    line = one_line(runner.invoke(app, ["ask", str(book), "q", "--model", model]))
    assert line == f"error: --model {model}: cannot read (File name too long); {NEXT}"


def test_a_model_under_the_home_of_no_user_is_one_line(book):
    model = "~no-such-user-of-locks-chat/model"
    line = one_line(runner.invoke(app, ["ask", str(book), "q", "--model", model, "--json"]))
    assert line == f"error: --model {model}: no such user's home to expand ~ into; {NEXT}"
