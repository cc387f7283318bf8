"""Format sniffing, file errors, error types, the time limit helper and the progress bar."""

from __future__ import annotations

import io
import threading
import time

import pytest

from locks_chat.errors import DocumentError, EncryptedError, LocksChatError, NoTextError, PageRangeError
from locks_chat.ingest import load_document, rich_progress
from locks_chat.ingest.timelimit import TimeLimitExceeded, call_with_time_limit
from tests.ingest_samples import text_pdf, write


def test_pdf_is_sniffed_by_content_not_suffix(tmp_path):
    doc = load_document(write(tmp_path, "download.txt", text_pdf(["Hello from a PDF."])))
    assert doc.format == "pdf" and doc.text == "Hello from a PDF."


@pytest.mark.parametrize(
    "name, data, match",
    [
        ("scan.png", b"\x89PNG\r\n\x1a\n" + bytes(100), "PNG image"),
        ("report.docx", b"PK\x03\x04" + bytes(100), "zip archive"),
        ("paper.pdf", b"<!DOCTYPE html><html>Not found</html>", "not a PDF"),
    ],
)
def test_unsupported_files_are_refused(tmp_path, name, data, match):
    with pytest.raises(DocumentError, match=match) as info:
        load_document(write(tmp_path, name, data))
    assert "\n" not in str(info.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(DocumentError, match="no such file"):
        load_document(tmp_path / "absent.pdf")
    with pytest.raises(DocumentError, match="is a directory"):
        load_document(tmp_path)


def test_error_types_share_exit_code_2():
    for kind in (DocumentError, EncryptedError, NoTextError, PageRangeError):
        assert issubclass(kind, LocksChatError) and kind("x: y; z").exit_code == 2
    assert issubclass(EncryptedError, DocumentError)


def test_password_is_ignored_for_unencrypted_files(tmp_path):
    doc = load_document(write(tmp_path, "plain.pdf", text_pdf(["Open text."])), password="unused")
    assert doc.text == "Open text."


def spin(seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "done"


@pytest.mark.parametrize("in_thread", [False, True], ids=["main-thread-alarm", "worker-thread"])
def test_time_limit(in_thread):
    outcome = {}

    def run():
        outcome["fast"] = call_with_time_limit(lambda: spin(0.01), 2.0)
        try:
            call_with_time_limit(lambda: spin(3.0), 0.1)
        except TimeLimitExceeded:
            outcome["slow"] = "stopped"
        try:
            call_with_time_limit(lambda: 1 / 0, 1.0)
        except ZeroDivisionError:
            outcome["error"] = "propagated"

    if in_thread:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join(10)
    else:
        run()
    assert outcome == {"fast": "done", "slow": "stopped", "error": "propagated"}


def test_rich_progress_draws_only_on_a_terminal_and_for_long_documents():
    from rich.console import Console

    terminal = io.StringIO()
    console = Console(file=terminal, force_terminal=True, width=80)
    with rich_progress("Reading book.pdf", min_total=5, console=console) as progress:
        for done in range(11):
            progress(done, 10)
    assert "Reading book.pdf" in terminal.getvalue()

    short = io.StringIO()
    console = Console(file=short, force_terminal=True, width=80)
    with rich_progress("Reading note.pdf", min_total=5, console=console) as progress:
        progress(0, 2)
        progress(2, 2)
    assert short.getvalue() == ""

    piped = io.StringIO()
    with rich_progress("Reading book.pdf", min_total=1, console=Console(file=piped)) as progress:
        progress(0, 10)
        progress(10, 10)
    assert piped.getvalue() == ""
