"""Typed errors for what users cause, each carrying its exit code.

The CLI edge maps every :class:`LocksChatError` to its one-line message and its
``exit_code`` without a traceback; anything else is a bug. Messages name what is
wrong and the next step, on one line, e.g.
``book.pdf: encrypted: pass --password``.
"""

from __future__ import annotations

import re
import textwrap

# control characters that are not whitespace (whitespace is collapsed): shown escaped, never sent to the terminal
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f]")


class LocksChatError(Exception):
    """Base of the errors a user can cause and fix.

    Args:
        message (str): one line: what is wrong, then the next step.
    """

    exit_code: int = 2
    """process exit status the CLI returns for this error (2: bad input)"""
    kind: str = "bad_input"
    """what went wrong, for scripts (``--json``'s ``error.kind``): one word per subclass"""

    def __init__(self, message: str) -> None:
        message = escape_breaks(message)
        super().__init__(message)
        self.message = message


def escape_breaks(text: str) -> str:
    """``text`` kept to one line: line breaks, tabs and other control characters shown escaped (``\\n``,
    ``\\x07``), as a file name holding them is shown; what a user types can hold them."""
    text = text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")
    return re.sub(r"[\x00-\x1f\x7f-\x9f]", lambda match: f"\\x{ord(match.group()):02x}", text)


def is_text(text: str) -> bool:
    """Whether ``text`` is valid Unicode: a command-line argument whose bytes were not UTF-8 reaches Python with
    lone surrogates (``\\udcff``), which no encoder, tokenizer or database takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class DocumentError(LocksChatError):
    """A document that cannot be read: missing, unsupported or malformed."""

    kind = "document"


class EncryptedError(DocumentError):
    """An encrypted document that needs a password, or was given a wrong one."""

    kind = "encrypted"


class NoTextError(DocumentError):
    """A document, or a selected page range, with no extractable text (scanned)."""

    kind = "no_text"


class PageRangeError(LocksChatError):
    """A ``--pages`` selection that is malformed, empty or out of range."""

    kind = "page_range"


def exception_reason(exc: BaseException, limit: int = 120) -> str:
    """A library exception squeezed into a short fragment for a one-line message: whitespace collapsed, cut at a
    word boundary with ``...`` past ``limit`` characters; a ``KeyError``'s message without its quotes."""
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str) else str(exc)
    return shorten_reason(text, limit) or type(exc).__name__


def shorten_reason(text: str, limit: int = 120) -> str:
    """``text`` on one line, cut at a word boundary with ``...`` when longer than ``limit`` characters; control
    characters (a damaged file's bytes quoted by a library: ``/\\x00lateDecode``) escaped."""
    text = _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)
    short = textwrap.shorten(text, width=limit, placeholder="...", break_on_hyphens=False)
    if short == "..." and text.strip():  # one word longer than the limit: cut inside it
        short = " ".join(text.split())[: max(1, limit - 3)] + "..."
    return short


class ContextError(LocksChatError):
    """A document (or page range) that does not fit the model's context: never truncated silently."""

    kind = "context"


class ModelPathError(LocksChatError):
    """A ``--model`` path that does not exist or is not a model directory (bad input: exit code 2)."""

    kind = "model_path"


HOME_ENV = "LOCKS_CHAT_HOME"
"""environment variable that overrides the base of the user directories (``locks_chat.paths``): the fix that
:class:`HomeDirError` names"""


class HomeDirError(LocksChatError):
    """A directory locks-chat must write (model cache, engine log, sessions) is read-only or not permitted: the
    user's environment, fixed by making it writable or pointing ``LOCKS_CHAT_HOME`` elsewhere (exit code 2)."""

    kind = "home_dir"

    @classmethod
    def unwritable(cls, what: str, path: object, reason: str) -> "HomeDirError":
        """``cannot write the model cache /ro/models: Read-only file system; make it writable or set
        LOCKS_CHAT_HOME to a writable directory`` for ``what`` = ``the model cache``."""
        return cls(f"cannot write {what} {path}: {reason}; make it writable or set {HOME_ENV} to a writable directory")


class EngineError(LocksChatError):
    """The engine failed to start or to generate (exit code 3)."""

    exit_code = 3
    kind = "engine"


class Cancelled(LocksChatError):
    """The user interrupted (Ctrl+C); the request was aborted in the engine (exit code 130)."""

    exit_code = 130
    kind = "cancelled"


class TerminatedError(Cancelled):
    """SIGTERM stopped the app; the request was aborted in the engine (exit code 143, 128 + SIGTERM; a SIGHUP,
    129, passes ``exit_code``)."""

    exit_code = 143
    kind = "terminated"

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
