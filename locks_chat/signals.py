"""SIGTERM stops the app the way Ctrl+C does: ``kill``, ``timeout`` and service managers get a clean exit.

Without a handler SIGTERM ends the process on the spot: the request in flight is not aborted, vLLM's engine core
is left to notice on its own (seconds later, after the app has exited), and the chat app leaves the terminal in
its alternate screen with mouse reporting on. With :func:`raise_on_sigterm` the signal raises
:class:`Terminated` in the main thread; it subclasses KeyboardInterrupt, so every path that cleans up after a
Ctrl+C (the request aborted in the engine, the engine shut down, the engine start held until vLLM is up) does so
for SIGTERM too, and the CLI ends with one line and exit code 143 (128 + SIGTERM, what a shell reports for a
process the signal ended). The chat app, whose main thread runs asyncio's loop, handles it on the loop instead
(``LocksChatApp``) and quits as Ctrl+Q does.
"""

from __future__ import annotations

import signal
import threading

#: Exit code after a SIGTERM (128 + signal number, as shells report it).
TERMINATED_EXIT_CODE = 128 + signal.SIGTERM

_received = threading.Event()


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (raised in the main thread by the handler :func:`raise_on_sigterm` installs)."""


def _raise_terminated(signum: int, frame: object) -> None:
    _received.set()
    raise Terminated(signal.Signals(signum).name)


def raise_on_sigterm() -> None:
    """Make SIGTERM raise :class:`Terminated` in this process (main thread only; elsewhere a no-op). A SIGTERM
    that is ignored (``nohup`` does not, but a caller may) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        return
    signal.signal(signal.SIGTERM, _raise_terminated)


def note_sigterm() -> None:
    """Record a SIGTERM handled elsewhere (the chat app's loop), for :func:`sigterm_received`."""
    _received.set()


def sigterm_received() -> bool:
    """Whether a SIGTERM has arrived in this process since :func:`raise_on_sigterm` (or :func:`note_sigterm`)."""
    return _received.is_set()
