"""User settings: a TOML file in the user config directory (``locks_chat.paths.settings_path``).

The LOCKS settings (budget, rank, dense, tail) default to ``LocksConfig``'s, and the settings carry the ``LocksConfig``
they make (:attr:`Settings.locks`), built and validated once with them. A missing or unreadable settings file gives
the defaults (with a warning for an unreadable one); the file is rewritten whole, atomically, on every change.
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from locks_chat.errors import LocksChatError
from locks_chat.paths import settings_path
from locks_chat.sampling import SAMPLING_KEYS, sampling_refusal
from locks_engine.config import MAX_BUDGET, TAILS, LocksConfig

LOCKS_DEFAULTS = LocksConfig()
"""the engine's LOCKS defaults: those of the settings and of the command line's options"""

#: the smallest ``--context`` (tokens) and ``--kv-cache-gib`` the command line and the settings file take
MIN_CONTEXT = 256
MIN_KV_CACHE_GIB = 0.1


@dataclass(frozen=True)
class Settings:
    """What the chat remembers between runs; command-line options override it for one run."""

    model: str | None = None
    """``--model``: a Hugging Face directory or hub id; ``None``: the built-in model."""
    budget: int = LOCKS_DEFAULTS.budget
    """LOCKS token budget per decode step and KV head (``/budget N``)."""
    rank: int = LOCKS_DEFAULTS.rank
    """Rank r of each KV page's key summary (``/rank r``)."""
    dense: bool = LOCKS_DEFAULTS.dense
    """Read every KV page, for A/B comparisons (``/dense``)."""
    tail: str = LOCKS_DEFAULTS.tail
    """What the KV pages a step does not read contribute: ``none``, or their estimate with mean values kept in
    ``int8`` or ``bf16`` (``LocksConfig.tail``; ``--tail``)."""
    max_tokens: int = 512
    """Most tokens in one answer."""
    context: int | None = None
    """Context length in tokens; ``None``: the model's."""
    kv_cache_gib: float | None = None
    """KV cache size in GiB; ``None``: on a GPU vLLM's share of its memory (the page summaries reserved), on the
    CPU 1 GiB."""
    temperature: float | None = None
    """Sampling temperature (0: greedy); ``None``: the model's (``generation_config.json``), else greedy."""
    top_p: float | None = None
    """Nucleus sampling's probability mass, in (0, 1]; ``None``: the model's."""
    top_k: int | None = None
    """Only the k most likely tokens (0: off); ``None``: the model's."""
    repetition_penalty: float | None = None
    """Penalty on tokens already in the prompt or answer (1: off); ``None``: the model's."""
    seed: int | None = None
    """Seed of sampled answers; ``None``: ``locks_engine.sampling.DEFAULT_SEED``."""
    locks: LocksConfig = field(init=False, repr=False, compare=False)
    """the engine's LOCKS configuration of ``budget``, ``rank``, ``dense`` and ``tail`` (:func:`locks_config`),
    built with the settings: they are refused together"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "locks", locks_config(self.budget, self.rank, self.dense, self.tail))

    def with_overrides(self, **values: Any) -> "Settings":
        """A copy with the values that are not ``None`` replaced (command-line options)."""
        return replace(self, **{k: v for k, v in values.items() if v is not None})

    def sampling_overrides(self) -> dict[str, Any]:
        """The sampling values set (``locks_chat.sampling.SAMPLING_KEYS``), for ``Sampling.merged``."""
        return {key: getattr(self, key) for key in SAMPLING_KEYS if getattr(self, key) is not None}


def locks_config(budget: int, rank: int, dense: bool, tail: str = "none", name_prefix: str = "") -> LocksConfig:
    """The one place the app builds a ``LocksConfig`` from what the user gave (settings, options, ``/budget``);
    it is then passed down as it is, to the TUI's panels and to the engine.

    Args:
        budget (int): tokens per decode step and KV head. rank (int): summary rank. dense (bool): read every page.
        tail (str): the tail estimate (``LocksConfig.tail``).
        name_prefix (str): put before the field a refusal names (``--`` for command-line options).
    Raises:
        LocksChatError: a value ``LocksConfig`` refuses (its message, naming the setting), or a budget past
            :data:`MAX_BUDGET`.
    """
    if budget > MAX_BUDGET:
        raise LocksChatError(f"{name_prefix}budget={budget} tokens is more than any context holds: allowed budget <= "
                             f"{MAX_BUDGET} (a budget that covers the context reads every page)")
    try:
        return LocksConfig(budget=budget, rank=rank, dense=dense, tail=tail)
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
    known = {f.name: f for f in fields(Settings) if f.init}
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
    try:
        return Settings(**values)
    except LocksChatError as err:
        reason = err.message
    locks_keys = [k for k in ("budget", "rank", "dense", "tail") if k in values]
    for key in locks_keys:  # the one value whose default makes the rest valid
        rest = {k: v for k, v in values.items() if k != key}
        try:
            settings = Settings(**rest)
        except LocksChatError:
            continue
        warnings.append(f"{path}: {key} = {values[key]!r} refused ({reason}); using the default")
        return settings
    warnings.append(f"{path}: {', '.join(locks_keys)} refused ({reason}); using the defaults")
    return Settings(**{k: v for k, v in values.items() if k not in locks_keys})


def _allowed(key: str, value: Any) -> str | None:
    """None when ``value`` is one the command line would take for ``key`` (its option's limits), else what is."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key == "dense":
        return None if isinstance(value, bool) else "true or false"
    if key == "tail":
        return None if value in TAILS else ", ".join(TAILS)
    if key == "model":
        return None if isinstance(value, str) and value.strip() else "a model directory or hub id"
    if key == "kv_cache_gib":
        ok = number and math.isfinite(value) and value >= MIN_KV_CACHE_GIB
        return None if ok else f"a number of GiB, at least {MIN_KV_CACHE_GIB}"
    if key == "context":
        return None if number and isinstance(value, int) and value >= MIN_CONTEXT else f"tokens, at least {MIN_CONTEXT}"
    if key in SAMPLING_KEYS:
        return sampling_refusal(key, value)
    return None if number and isinstance(value, int) and value > 0 else "a whole number above 0"


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    """Write the settings file atomically (unset values are left out); returns its path."""
    import tomli_w

    path = path or settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    values = {f.name: getattr(settings, f.name) for f in fields(settings) if f.init}
    values = {k: v for k, v in values.items() if v is not None}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(tomli_w.dumps(values), encoding="utf-8")
    os.replace(tmp, path)
    return path
