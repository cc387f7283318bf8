"""Shared fixtures: every test gets its own user directory (``LOCKS_CHAT_HOME``); the built-in model's directory
for the real-engine tests (skipped when it cannot be installed). Hypothesis profiles: ``ci``, the default, sized so
that the fuzzed-ingestion tests (``tests/ingest/test_ingest_fuzz.py``) take under two minutes on two CPU cores and draw the
same inputs on every run; ``fuzz`` (``pytest --hypothesis-profile=fuzz``) draws 20 times more, at random, and keeps
failing inputs in ``.hypothesis/``."""

import os
import signal

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                           HealthCheck.function_scoped_fixture],
)
settings.register_profile("fuzz", settings.get_profile("ci"), max_examples=4000, derandomize=False,
                          database=settings.get_profile("default").database)
settings.load_profile("ci")

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # a shell without job control starts background jobs with SIGINT ignored, and Python then installs no
    # KeyboardInterrupt handler; the signal tests need the handler an interactive start gives
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def user_home(tmp_path, monkeypatch):
    home = tmp_path / "locks-home"
    monkeypatch.setenv("LOCKS_CHAT_HOME", str(home))
    return home


#: the hub settings this test session started with (``locks_engine.models.stay_offline`` changes them for the process)
import huggingface_hub.constants as _hub_constants  # noqa: E402

from locks_engine.models import OFFLINE_ENV  # noqa: E402

_SESSION_HUB = ({key: os.environ.get(key) for key in OFFLINE_ENV}, _hub_constants.HF_HUB_OFFLINE)


@pytest.fixture(autouse=True)
def hub_settings_restored(monkeypatch):
    """Each test starts with the session's hub settings, whatever a local model turned off before it."""
    env, offline = _SESSION_HUB
    for key, value in env.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    monkeypatch.setattr(_hub_constants, "HF_HUB_OFFLINE", offline)


@pytest.fixture(scope="module")
def model_dir():
    """The built-in SmolLM2-135M's local directory (converted on first use): the tests' real model, small and fast
    (the app's default, ``qwen0.5b``, is five times its size); skips the module when unavailable."""
    from locks_engine.models import ModelError, resolve_model

    try:
        return str(resolve_model("smollm2"))
    except ModelError as err:
        pytest.skip(f"built-in model unavailable: {err}")


@pytest.fixture(autouse=True)
def no_sigterm_carried_over():
    """A SIGTERM a test sends (or records) stays in ``locks_chat.signals`` for the process: forget it after."""
    yield
    from locks_chat import signals

    signals._received.clear()
