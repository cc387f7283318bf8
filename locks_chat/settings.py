"""User settings (a TOML file in the user config directory) and the user directories.

``$LOCKS_CHAT_HOME`` overrides the base of every directory (tests point it at ``tmp_path``): settings then live in
``$LOCKS_CHAT_HOME/config/settings.toml``, data (sessions, exports) in ``$LOCKS_CHAT_HOME/data`` and the converted
built-in model in ``$LOCKS_CHAT_HOME/models``; otherwise the platform's directories (``platformdirs``) are used.
A missing or unreadable settings file gives the defaults (with a warning for an unreadable one); the file is
rewritten whole, atomically, on every change.
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from locks_chat.errors import LocksChatError

APP_NAME = "locks-chat"
HOME_ENV = "LOCKS_CHAT_HOME"
"""environment variable that overrides the base of the user directories"""


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


def settings_path() -> Path:
    return config_dir() / "settings.toml"


#: the smallest ``--context`` (tokens) and ``--kv-cache-gib`` the command line and the settings file take
MIN_CONTEXT = 256
MIN_KV_CACHE_GIB = 0.1


@dataclass(frozen=True)
class Settings:
    """What the chat remembers between runs; command-line options override it for one run."""

    model: str | None = None
    """``--model``: a Hugging Face directory or hub id; ``None``: the built-in model."""
    budget: int = 2048
    """LOCKS token budget per decode step and KV head (``/budget N``)."""
    rank: int = 8
    """Rank r of each KV page's key summary (``/rank r``)."""
    dense: bool = False
    """Read every KV page, for A/B comparisons (``/dense``)."""
    max_tokens: int = 512
    """Most tokens in one answer."""
    context: int | None = None
    """Context length in tokens; ``None``: the model's."""
    kv_cache_gib: float | None = None
    """KV cache size in GiB; ``None``: on a GPU vLLM's share of its memory (the page summaries reserved), on the
    CPU 1 GiB."""

    def locks_config(self) -> Any:
        """The engine's ``LocksConfig`` for these settings (:func:`locks_config`)."""
        return locks_config(self.budget, self.rank, self.dense)

    def with_overrides(self, **values: Any) -> "Settings":
        """A copy with the values that are not ``None`` replaced (command-line options)."""
        return replace(self, **{k: v for k, v in values.items() if v is not None})


def locks_config(budget: int, rank: int, dense: bool, name_prefix: str = "") -> Any:
    """The one place the app builds a ``LocksConfig`` from what the user gave (settings, options, ``/budget``);
    it is then passed down as it is, to the TUI's panels and to the engine.

    Args:
        budget (int): tokens per decode step and KV head. rank (int): summary rank. dense (bool): read every page.
        name_prefix (str): put before the field a refusal names (``--`` for command-line options).
    Raises:
        LocksChatError: a value ``LocksConfig`` refuses (its message, naming the setting).
    """
    from locks_engine.config import LocksConfig

    try:
        return LocksConfig(budget=budget, rank=rank, dense=dense)
    except ValueError as err:
        raise LocksChatError(str(err).replace("LocksConfig.", name_prefix)) from err


def load_settings(path: Path | None = None) -> tuple[Settings, list[str]]:
    """Read the settings file; returns the settings and warnings (one line each) about what was ignored."""
    path = path or settings_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Settings(), []
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        return Settings(), [f"{path}: unreadable ({err}); using the defaults"]
    known = {f.name: f for f in fields(Settings)}
    values, warnings = {}, []
    for key, value in data.items():
        if key not in known:
            warnings.append(f"{path}: unknown setting {key!r} ignored")
        elif (allowed := _allowed(key, value)) is not None:
            warnings.append(f"{path}: {key} = {value!r} is not allowed ({allowed}); using the default")
        else:
            values[key] = value
    return _valid_locks_values(path, values, warnings), warnings


def _valid_locks_values(path: Path, values: dict[str, Any], warnings: list[str]) -> Settings:
    """``Settings(**values)`` without the LOCKS values that ``LocksConfig`` refuses (rank past the page size, a
    budget under the always-read pages), each dropped with a warning naming the file; appends to ``warnings``."""
    settings = Settings(**values)
    try:
        settings.locks_config()
        return settings
    except LocksChatError as err:
        reason = err.message
    locks_keys = [k for k in ("budget", "rank", "dense") if k in values]
    for key in locks_keys:  # the one value whose default makes the rest valid
        rest = {k: v for k, v in values.items() if k != key}
        try:
            Settings(**rest).locks_config()
        except LocksChatError:
            continue
        warnings.append(f"{path}: {key} = {values[key]!r} refused ({reason}); using the default")
        return Settings(**rest)
    warnings.append(f"{path}: {', '.join(locks_keys)} refused ({reason}); using the defaults")
    return Settings(**{k: v for k, v in values.items() if k not in locks_keys})


def _allowed(key: str, value: Any) -> str | None:
    """None when ``value`` is one the command line would take for ``key`` (its option's limits), else what is."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key == "dense":
        return None if isinstance(value, bool) else "true or false"
    if key == "model":
        return None if isinstance(value, str) and value.strip() else "a model directory or hub id"
    if key == "kv_cache_gib":
        ok = number and math.isfinite(value) and value >= MIN_KV_CACHE_GIB
        return None if ok else f"a number of GiB, at least {MIN_KV_CACHE_GIB}"
    if key == "context":
        return None if number and isinstance(value, int) and value >= MIN_CONTEXT else f"tokens, at least {MIN_CONTEXT}"
    return None if number and isinstance(value, int) and value > 0 else "a whole number above 0"


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    """Write the settings file atomically (unset values are left out); returns its path."""
    import tomli_w

    path = path or settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    values = {k: v for k, v in asdict(settings).items() if v is not None}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(tomli_w.dumps(values), encoding="utf-8")
    os.replace(tmp, path)
    return path
