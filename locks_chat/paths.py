"""The user directories: settings, data (sessions, exports, logs) and the converted built-in model.

``$LOCKS_CHAT_HOME`` overrides the base of every directory (tests point it at ``tmp_path``): settings then live in
``$LOCKS_CHAT_HOME/config/settings.toml``, data (sessions, exports) in ``$LOCKS_CHAT_HOME/data`` and the converted
built-in model in ``$LOCKS_CHAT_HOME/models``; otherwise the platform's directories (``platformdirs``) are used.
"""

from __future__ import annotations

import os
from pathlib import Path

from locks_chat.errors import HOME_ENV, LocksChatError

APP_NAME = "locks-chat"


def home_override() -> Path | None:
    """``$LOCKS_CHAT_HOME`` with ``~`` expanded, or None when it is not set (or empty).

    Raises:
        LocksChatError: a ``~user`` that names no user (exit code 2).
    """
    home = os.environ.get(HOME_ENV)
    if not home:
        return None
    try:
        return Path(home).expanduser()
    except RuntimeError:
        raise LocksChatError(f"{HOME_ENV}={home}: no such user's home to expand ~ into; set it to a directory "
                             "path") from None


def config_dir() -> Path:
    """Where ``settings.toml`` lives."""
    home = home_override()
    if home is not None:
        return home / "config"
    from platformdirs import user_config_dir

    return Path(user_config_dir(APP_NAME))


def data_dir() -> Path:
    """Where sessions (``sessions.sqlite``) and exported transcripts live."""
    home = home_override()
    if home is not None:
        return home / "data"
    from platformdirs import user_data_dir

    return Path(user_data_dir(APP_NAME))


def model_cache_dir() -> Path:
    """Where the built-in model is converted into once (``$LOCKS_CHAT_HOME/models``; else the engine's default,
    ``locks_engine.models.default_cache_dir``)."""
    home = home_override()
    if home is not None:
        return home / "models"
    from locks_engine.models import default_cache_dir

    return default_cache_dir()


def path_problem(path: Path) -> str | None:
    """Why ``path`` cannot even be looked up, else ``None`` (it exists, or it is missing: callers say that
    themselves). pathlib's ``exists``, ``is_file``, ``is_dir`` and ``is_fifo`` return False for a missing file but
    raise for the rest: a name longer than the file system takes (``ENAMETOOLONG``, a text pasted as a path),
    a loop of symbolic links (``ELOOP``), a folder on the way that cannot be searched (``EACCES``).

    Returns:
        str | None: the system's reason (``File name too long``).
    """
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL byte, which no file has
        return None
    except OSError as err:
        return err.strerror or str(err)
    return None


def settings_path() -> Path:
    """The settings file, ``settings.toml`` in :func:`config_dir`."""
    return config_dir() / "settings.toml"
