"""How a command ends: errors users cause as one line on stderr with their exit code, and output that cannot be
written (a closed pipe, a full disk). The codes: 0 ok, 1 the output could not be written, 2 bad input or a document
that does not fit, 3 engine failure, 130 interrupted, 141 stdout's pipe closed, 143 SIGTERM
(``locks_chat.signals``).

With ``--json`` every failure the command knows is also one JSON object on stdout (:func:`print_error_json`), as
a success is: ``{"error": {"message": ..., "kind": ..., "exit_code": ...}}``, ``kind`` one of the
:attr:`locks_chat.errors.LocksChatError.kind` words (``bad_input``, ``document``, ``encrypted``, ``no_text``,
``page_range``, ``context``, ``model_path``, ``home_dir``, ``sessions``, ``follow_up``, ``engine``,
``cancelled``, ``terminated``) or ``usage`` (an option Typer refused). A closed pipe or a full disk leaves
stdout unwritable: those end without the object."""

from __future__ import annotations

import errno
import fcntl
import functools
import io
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console

from locks_chat.errors import Cancelled, LocksChatError, TerminatedError
from locks_chat.signals import Terminated, sigterm_received

err_console = Console(stderr=True)
"""where the one-line errors go"""

#: Exit code when stdout's reader closed the pipe (128 + SIGPIPE, what a shell reports for ``yes | head``).
BROKEN_PIPE_EXIT_CODE = 141
#: Exit code when the output could not be written (a full disk or quota): the command's work is lost, say so.
OUTPUT_ERROR_EXIT_CODE = 1
_OUTPUT_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class ClosedStdout(io.TextIOBase):
    """``sys.stdout`` while file descriptor 1 is closed (``>&-``): Python then sets ``sys.stdout`` to ``None``, so
    that ``print`` drops the output unsaid and ``sys.stdout.flush()`` is an ``AttributeError``. Writing here raises
    ``OSError(EBADF)``, which :func:`output_not_written` says in one line; flushing does nothing."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "stdout is closed")

    def fileno(self) -> int:
        raise OSError(errno.EBADF, "stdout is closed")

    def isatty(self) -> bool:
        return False


def stdout_writable() -> bool:
    """Whether the output can be written: ``sys.stdout`` is set and file descriptor 1 is open for writing (``>&-``
    closes it; ``1<file`` opens it for reading only, and every write fails with ``EBADF``)."""
    if sys.stdout is None or isinstance(sys.stdout, ClosedStdout):
        return False
    try:
        flags = fcntl.fcntl(1, fcntl.F_GETFL)
    except OSError:
        return False
    return flags & os.O_ACCMODE != os.O_RDONLY


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of a closed pipe raises nothing."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    finally:
        os.close(devnull)


def _print_line(markup: str) -> None:
    """One line on stderr; nothing when stderr is gone (a SIGHUP: the terminal closed), the exit code still tells."""
    try:
        err_console.print(markup, highlight=False, soft_wrap=True)
    except (OSError, ValueError):
        pass


def print_error_json(message: str, kind: str, exit_code: int) -> None:
    """Print ``{"error": {"message", "kind", "exit_code"}}`` on stdout, one line; nothing when stdout cannot be
    written (closed or full: the exit code still tells)."""
    try:
        print(json.dumps({"error": {"message": message, "kind": kind, "exit_code": exit_code}}), flush=True)
    except (OSError, ValueError):
        pass


def one_line_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Map :class:`LocksChatError`, Ctrl+C and SIGTERM to one line on stderr and their exit codes; a command given
    ``json_out=True`` (``--json``) also prints the error as a JSON object on stdout (:func:`print_error_json`)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        json_out = bool(kwargs.get("json_out"))
        try:
            result = command(*args, **kwargs)
            sys.stdout.flush()  # a full disk shows here, not in the interpreter's last flush
            return result
        except LocksChatError as err:
            if sigterm_received() and not isinstance(err, Cancelled):
                # a SIGTERM sent to the process group reached vLLM's engine core too, which failed the request
                err = TerminatedError("terminated: the engine was shut down")
            # a stop the user asked for is no error
            prefix = "" if isinstance(err, Cancelled) else "[bold red]error:[/] "
            _print_line(f"{prefix}{err.message}")
            if json_out:
                print_error_json(err.message, err.kind, err.exit_code)
            raise typer.Exit(err.exit_code) from None
        except KeyboardInterrupt as err:
            terminated = isinstance(err, Terminated)
            word = err.word if terminated else "interrupted"
            _print_line(word)
            code = err.exit_code if terminated else 130
            if json_out:
                print_error_json(word, "terminated" if terminated else "cancelled", code)
            raise typer.Exit(code) from None
        except BrokenPipeError:
            # the reader of stdout went away (``| head``): stop quietly, as tools that SIGPIPE ends do
            _drop_stdout()
            raise typer.Exit(BROKEN_PIPE_EXIT_CODE) from None
        except OSError as err:
            raise typer.Exit(output_not_written(err)) from None

    return wrapper


def output_not_written(err: OSError) -> int:
    """Say in one line that stdout could not be written (a full disk, a quota; stdout closed or open for reading
    only) and return the exit code.

    Raises:
        OSError: ``err`` again when it is another error (an ``EBADF`` too, while stdout is writable).
    """
    if err.errno == errno.EBADF and not stdout_writable():
        reason, step = "stdout is closed or open for reading only", "redirect it to a file (> out.txt)"
    elif err.errno in _OUTPUT_FULL:
        reason, step = err.strerror, "free space or write elsewhere"
    else:
        raise err
    _drop_stdout()
    err_console.print(f"[bold red]error:[/] cannot write the output ({reason}); {step}, then run again",
                      highlight=False, soft_wrap=True)
    return OUTPUT_ERROR_EXIT_CODE
