"""Format sniffing, file errors, error types, the time limit helper and the progress bar."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from locks_chat.errors import DocumentError, EncryptedError, LocksChatError, NoTextError, PageRangeError
from locks_chat.ingest import limits, load_document, rich_progress
from locks_chat.ingest.timelimit import TimeLimitExceeded, call_with_time_limit
from tests.support.ingest_samples import encrypted, run_here_or_in_a_thread, text_pdf, write


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


def test_password_for_an_unencrypted_file_is_ignored_with_a_warning(tmp_path):
    path = write(tmp_path, "plain.pdf", text_pdf(["Open text."]))
    doc = load_document(path, password="unused")
    assert doc.text == "Open text."
    assert doc.warnings == (f"--password given but {path} is not encrypted; ignored",)
    assert load_document(path).warnings == ()
    notes = write(tmp_path, "notes.txt", b"Plain notes.")
    assert load_document(notes, password="").warnings == (f"--password given but {notes} is not encrypted; ignored",)
    locked = write(tmp_path, "locked.pdf", encrypted(text_pdf(["Secret text."]), "pw"))
    assert load_document(locked, password="pw").warnings == ()


def test_file_larger_than_the_cap_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MAX_DOCUMENT_BYTES", 1024)
    assert load_document(write(tmp_path, "fits.txt", b"word " * 204 + b"end.")).text.endswith("end.")
    big = write(tmp_path, "big.txt", b"word " * 205)
    with pytest.raises(DocumentError) as info:
        load_document(big)
    assert str(info.value) == (
        f"{big}: larger than 1 KiB: not a document locks-chat reads; pass a PDF, EPUB, text or Markdown file"
    )


def fifo_writer(path: Path, data: bytes, chunk: int = 4096) -> tuple[threading.Thread, dict]:
    """A thread that writes ``data`` into the FIFO ``path`` (like a device that produces data) until the reader
    hangs up; ``state["written"]`` counts the bytes the reader took (plus the pipe buffer)."""
    state = {"written": 0}

    def run() -> None:
        with open(path, "wb", buffering=0) as out:
            try:
                for start in range(0, len(data), chunk):
                    state["written"] += out.write(data[start : start + chunk])
            except BrokenPipeError:
                state["hung_up"] = True

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, state


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_endless_input_is_read_up_to_the_cap_only(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MAX_DOCUMENT_BYTES", 64 << 10)
    monkeypatch.setattr(limits, "READ_CHUNK_BYTES", 4096)
    fifo = tmp_path / "device"
    os.mkfifo(fifo)
    writer, state = fifo_writer(fifo, b"word " * (4 << 20))  # 20 MB of text: "endless" next to a 64 KiB cap
    with pytest.raises(DocumentError, match=r"device: larger than 64 KiB: not a document locks-chat reads"):
        load_document(fifo)
    writer.join(10)
    assert state.get("hung_up") and state["written"] < 1 << 20


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_pipe_is_read_as_a_document(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    text = "Piped paragraph. " * 1000  # 17 kB in writes of 1000 bytes: many reads, several pages
    writer, _ = fifo_writer(fifo, text.encode(), chunk=1000)
    doc = load_document(fifo)
    writer.join(10)
    assert doc.format == "text" and " ".join(page.text for page in doc.pages) == text.strip()
    stdin = subprocess.run(
        [sys.executable, "-c", "from locks_chat.ingest import load_document; print(load_document('/dev/stdin').text)"],
        input=b"Text from standard input.\n",
        capture_output=True,
        timeout=60,
    )
    assert (stdin.returncode, stdin.stdout) == (0, b"Text from standard input.\n"), stdin.stderr


SIGTERM_DURING_READ = """
import os, resource, signal, sys, threading, time
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # without chunked reads: MemoryError, not an OOM kill
from locks_chat.ingest import limits, load_document

class Terminated(Exception):
    pass

def on_term(signum, frame):
    raise Terminated

signal.signal(signal.SIGTERM, on_term)
limits.MAX_DOCUMENT_BYTES = 1 << 40  # so only the signal can end the read
threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM)).start()
try:
    load_document("/dev/zero")
except Terminated:
    print("terminated")
"""


@pytest.mark.skipif(not os.path.exists("/dev/zero") or sys.platform != "linux", reason="needs Linux /dev/zero")
def test_sigterm_lands_while_an_endless_device_is_read():
    result = subprocess.run([sys.executable, "-c", SIGTERM_DURING_READ], capture_output=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, b"terminated\n"), result.stderr[-2000:]


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

    run_here_or_in_a_thread(run, in_thread, 10)
    assert outcome == {"fast": "done", "slow": "stopped", "error": "propagated"}


def test_a_swallowed_time_limit_is_raised_again():
    """A library that catches every exception (or a finalizer the alarm lands in) swallows the first raise: the
    alarm repeats until the call stops, and no alarm outlives the call."""
    import signal

    swallowed = []

    def stubborn() -> str:
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            try:
                spin(0.01)
            except TimeLimitExceeded:
                if not swallowed:
                    swallowed.append(time.monotonic())  # swallowed once, as a broad ``except`` would
                else:
                    raise
        return "ran to the end"

    start = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        call_with_time_limit(stubborn, 0.1)
    assert swallowed and time.monotonic() - start < 2.5  # not the 3 s of a swallowed alarm
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert call_with_time_limit(lambda: spin(0.3), 1.0) == "done"  # the next call is not hit by a stray alarm


def test_the_time_limit_never_lands_inside_a_finalizer(monkeypatch):
    """A raise inside ``__del__`` would be swallowed and reported as an unraisable exception: the alarm waits
    until the finalizer returns, then stops the call; cyclic garbage collection is back on afterwards."""
    import gc
    import sys

    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    class Slow:
        def __del__(self):
            spin(0.4)  # past the limit, inside a finalizer

    def call():
        Slow()  # dropped at once: its __del__ runs here
        return spin(3.0)

    start = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        call_with_time_limit(call, 0.1)
    assert unraisable == [] and 0.35 < time.monotonic() - start < 1.5
    assert gc.isenabled()


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
