"""Shared fixtures: every test gets its own user directory (``LOCKS_CHAT_HOME``); the built-in model's directory
for the real-engine tests (skipped when it cannot be installed)."""

import signal

import pytest

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # a shell without job control starts background jobs with SIGINT ignored, and Python then installs no
    # KeyboardInterrupt handler; the signal tests need the handler an interactive start gives
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def user_home(tmp_path, monkeypatch):
    home = tmp_path / "locks-home"
    monkeypatch.setenv("LOCKS_CHAT_HOME", str(home))
    return home


@pytest.fixture(scope="module")
def model_dir():
    """The built-in model's local directory (converted on first use); skips the module when unavailable."""
    from locks_engine.models import ModelError, resolve_model

    try:
        return str(resolve_model(None))
    except ModelError as err:
        pytest.skip(f"built-in model unavailable: {err}")


@pytest.fixture(autouse=True)
def no_sigterm_carried_over():
    """A SIGTERM a test sends (or records) stays in ``locks_chat.signals`` for the process: forget it after."""
    yield
    from locks_chat import signals

    signals._received.clear()
