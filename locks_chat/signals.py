"""SIGTERM stops the app the way Ctrl+C does: ``kill``, ``timeout`` and service managers get a clean exit.

Without a handler SIGTERM ends the process on the spot: the request in flight is not aborted, vLLM's engine core
is left to notice on its own (seconds later, after the app has exited), and the chat app leaves the terminal in
its alternate screen with mouse reporting on. With :func:`raise_on_sigterm` the signal raises
:class:`Terminated` in the main thread; it subclasses KeyboardInterrupt, so every path that cleans up after a
Ctrl+C (the request aborted in the engine, the engine shut down, the engine start held until vLLM is up) does so
for SIGTERM too, and the CLI ends with one line and exit code 143 (128 + SIGTERM, what a shell reports for a
process the signal ended). The chat app, whose main thread runs asyncio's loop, handles it on the loop instead
(``LocksChatApp``) and quits as Ctrl+Q does. SIGHUP (the terminal closed, an SSH session dropped) does what
SIGTERM does, with exit code 129 (128 + SIGHUP): the turn in flight is saved; a SIGHUP ignored (``nohup``) stays
ignored.

While the engine starts, both signals are held (:func:`interrupts_held`): ``locks_chat.engine_client`` wraps the
start in it. vLLM's child processes, which the terminal's Ctrl+C reaches too, are the engine's to keep quiet
(``locks_engine.processes``).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

#: Exit code after a SIGTERM (128 + signal number, as shells report it).
TERMINATED_EXIT_CODE = 128 + signal.SIGTERM
#: The signals :func:`raise_on_sigterm` turns into :class:`Terminated`: SIGTERM, and SIGHUP (the terminal went away).
STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

_received = threading.Event()


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived (raised in the main thread by the handler :func:`raise_on_sigterm` installs)."""

    @property
    def signum(self) -> int:
        """the signal that arrived (its name is the exception's argument; SIGTERM when none is)"""
        name = self.args[0] if self.args else ""
        return int(signal.Signals[name]) if name in signal.Signals.__members__ else int(signal.SIGTERM)

    @property
    def exit_code(self) -> int:
        """128 + :attr:`signum`, as shells report a process the signal ended (143 SIGTERM, 129 SIGHUP)"""
        return 128 + self.signum

    @property
    def word(self) -> str:
        """``terminated``, or ``hung up`` for SIGHUP: what the one-line stop message starts with"""
        return "hung up" if self.signum == signal.SIGHUP else "terminated"


def _raise_terminated(signum: int, frame: object) -> None:
    _received.set()
    raise Terminated(signal.Signals(signum).name)


def raise_on_sigterm() -> None:
    """Make SIGTERM and SIGHUP (:data:`STOPPING_SIGNALS`) raise :class:`Terminated` in this process (main thread
    only; elsewhere a no-op). A signal that is ignored (``nohup`` ignores SIGHUP) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOPPING_SIGNALS:
        if signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, _raise_terminated)


def note_sigterm(signum: int | None = None, frame: object = None) -> None:
    """Record a SIGTERM or SIGHUP handled elsewhere, for :func:`sigterm_received`. Also a signal handler: the chat
    app puts it in place of asyncio's no-op one, so that the stop is recorded as soon as the main thread runs
    Python again, before the event loop gets to its own handler (``locks_chat.tui.app``)."""
    _received.set()


def sigterm_received(wait_s: float = 0.0) -> bool:
    """Whether a SIGTERM (or SIGHUP) has arrived in this process since :func:`raise_on_sigterm` (or
    :func:`note_sigterm`); with ``wait_s`` > 0, waits up to that many seconds for one to be recorded (a thread that
    saw the engine core die of the same signal asks so: the main thread records it a moment later)."""
    return _received.wait(wait_s) if wait_s > 0 else _received.is_set()


#: The signals held while the engine starts: Ctrl+C, SIGTERM (``kill``, ``timeout``, service managers) and SIGHUP.
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class HeldSignal:
    """The first of :data:`HELD_SIGNALS` that arrived in an :func:`interrupts_held` block (``signum``), if any."""

    def __init__(self, notice: str | None = None) -> None:
        self.signum: int | None = None
        self.notice = notice
        """a line for stderr at the first signal held (what happens now), or None"""

    def is_set(self) -> bool:
        return self.signum is not None

    def hold(self, signum: int, frame: object = None) -> None:
        if self.signum is None:
            self.signum = signum
            if self.notice:
                try:
                    sys.stderr.write(f"\n{self.notice}\n")
                    sys.stderr.flush()
                except (OSError, ValueError):  # stderr closed or full: the stop goes on without the line
                    pass

    def redeliver(self) -> None:
        """Send the held signal to this process again, once its own handler is back: Ctrl+C raises
        KeyboardInterrupt, SIGTERM does what the process's handler does (by default: the process ends)."""
        if self.signum is not None:
            signal.raise_signal(self.signum)


_stopping: dict[int, object] | None = None
"""The handlers :func:`hold_further_interrupts` replaced, while it holds."""


def hold_further_interrupts() -> None:
    """Once a Ctrl+C or a SIGTERM has started a stop, drop the next ones until :func:`release_held_interrupts`.

    ``timeout`` sends its signal twice (to the process, then to its process group), and a user may press Ctrl+C
    twice: the second KeyboardInterrupt landed in the middle of the stop, between the saved session and its
    turn (an empty session, the partial answer lost) or before the newline after the partial answer. The stop
    it asks for is under way, so it is dropped. ``locks-chat ask`` holds them too once its answer is complete and
    saved, while it reports it and shuts the engine down (``locks_chat.cli.ask``). Main thread only (elsewhere a
    no-op); an ignored signal stays ignored; a second call while holding does nothing.
    """
    global _stopping
    if threading.current_thread() is not threading.main_thread() or _stopping is not None:
        return
    _stopping = {signum: signal.getsignal(signum) for signum in HELD_SIGNALS}
    for signum, handler in _stopping.items():
        if handler not in (signal.SIG_IGN, None):
            signal.signal(signum, HeldSignal().hold)


def release_held_interrupts() -> None:
    """Give Ctrl+C and SIGTERM back their handlers after :func:`hold_further_interrupts` (else a no-op)."""
    global _stopping
    if threading.current_thread() is not threading.main_thread() or _stopping is None:
        return
    for signum, handler in _stopping.items():
        if handler not in (signal.SIG_IGN, None):
            signal.signal(signum, handler)
    _stopping = None


@contextlib.contextmanager
def interrupts_held(notice: str | None = None) -> Iterator[HeldSignal]:
    """Hold a Ctrl+C or a SIGTERM that arrives in this block: it is recorded, nothing is raised; the caller
    stops after, and :meth:`HeldSignal.redeliver` hands it to the process's own handler. ``notice``, when
    given, is written to stderr at the first one (the stop may take seconds: the user sees it was heard).

    While vLLM starts its engine core the main thread is mostly in pyzmq's ``zmq_poll`` (the startup handshake,
    then the wait for the ready message), which runs Python's signal handlers when its poll is interrupted: the
    KeyboardInterrupt was dropped there, or broke the handshake half-way and left the client waiting for a ready
    message that would never come (the app hung). vLLM's start cannot be interrupted safely, so it is allowed
    to finish (or to fail, when the signal reached the engine core too) and the caller shuts the engine down.
    Off the main thread the handlers are left as they are; so is a signal ignored here (a background job
    ignores SIGINT).
    """
    held = HeldSignal(notice)
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = {signum: signal.getsignal(signum) for signum in HELD_SIGNALS}
    for signum, handler in previous.items():
        if handler not in (signal.SIG_IGN, None):
            signal.signal(signum, held.hold)
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            if handler not in (signal.SIG_IGN, None):
                signal.signal(signum, handler)
