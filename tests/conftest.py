"""Shared fixtures: every test gets its own user directory (``LOCKS_CHAT_HOME``)."""

import pytest


@pytest.fixture(autouse=True)
def user_home(tmp_path, monkeypatch):
    home = tmp_path / "locks-home"
    monkeypatch.setenv("LOCKS_CHAT_HOME", str(home))
    return home
