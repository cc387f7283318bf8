"""Standard output closed (``>&-``: Python sets ``sys.stdout`` to ``None``) or open for reading only
(``1</dev/null``: every write fails with ``EBADF``): one line on stderr and an exit code, never a traceback."""

import os
import subprocess
import sys

import pytest

from locks_chat.sessions import SessionStore, file_hash

NOT_WRITTEN = ("error: cannot write the output (stdout is closed or open for reading only); redirect it to a file "
               "(> out.txt), then run again")


def close_stdout() -> None:
    os.close(1)


def run_cli(args: list[str], stdout: str) -> subprocess.CompletedProcess:
    """``python -m locks_chat.cli ARGS`` with file descriptor 1 ``closed`` or ``read_only``."""
    if stdout == "closed":
        return subprocess.run([sys.executable, "-m", "locks_chat.cli", *args], preexec_fn=close_stdout,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    with open(os.devnull, "rb") as read_only:
        return subprocess.run([sys.executable, "-m", "locks_chat.cli", *args], stdout=read_only,
                              stderr=subprocess.PIPE, text=True, timeout=60)


@pytest.fixture
def session_id(tmp_path, user_home):
    book = tmp_path / "book.txt"
    book.write_text("Some text.", encoding="utf-8")
    store = SessionStore()
    session = store.open_session(str(book), file_hash(book), "book", None)
    store.save_turn(store.begin_turn(session.id, "Q?"), "A.", "done")
    return session.id


@pytest.mark.parametrize("stdout", ["closed", "read_only"])
@pytest.mark.parametrize("args", [["sessions", "show", "{id}"], ["sessions", "list", "--json"], ["sessions", "list"],
                                  ["--help"], ["--version"]], ids=["show", "list-json", "list", "help", "version"])
def test_output_to_an_unwritable_stdout_is_one_line_and_exit_1(session_id, args, stdout):
    result = run_cli([arg.format(id=session_id) for arg in args], stdout)
    assert result.returncode == 1 and result.stderr.splitlines() == [NOT_WRITTEN], result.stderr


@pytest.mark.parametrize("stdout", ["closed", "read_only"])
@pytest.mark.parametrize("json_out", [[], ["--json"]], ids=["text", "json"])
def test_ask_refuses_an_unwritable_stdout_before_reading_the_document(tmp_path, stdout, json_out):
    result = run_cli(["ask", str(tmp_path / "missing.pdf"), "q", *json_out], stdout)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        "error: stdout is closed or open for reading only: the answer has nowhere to go; redirect it (> answer.txt) "
        "instead"], result.stderr


def test_the_chat_app_without_stdout_is_one_line(tmp_path):
    book = tmp_path / "book.txt"
    book.write_text("Some text.", encoding="utf-8")
    result = run_cli([str(book)], "closed")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "the chat app needs a terminal" in result.stderr


def test_delete_writes_no_stdout_and_works_with_it_closed(session_id):
    result = run_cli(["sessions", "delete", str(session_id)], "closed")
    assert result.returncode == 0 and result.stderr.splitlines() == [f"deleted session {session_id}"], result.stderr
    assert SessionStore().get(session_id) is None
