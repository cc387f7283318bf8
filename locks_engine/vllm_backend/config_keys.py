"""LOCKS' keys in vLLM's ``additional_config``, checked where vLLM builds its configuration.

- ``"locks"``: the ``LocksConfig`` settings as a JSON object (``LocksConfig.to_dict``'s keys: ``page_size``,
  ``rank``, ``budget``, ...); missing keys take the defaults. Read by ``locks_config``.
- ``"locks_stats_path"``: where the per-step statistics ring is written (``locks_engine.stats``); optional.
- ``"locks_hooks"``: decode hooks, ``"module.path:ClassName"`` strings (``hooks.py``); optional.

vLLM reads these only in its workers, once the model has loaded, so a mistyped setting used to stop ``vllm serve``
half a minute in, with the tracebacks of three processes. The plugin checks them first, in the process that
builds vLLM's configuration (``plugin.check_settings_first``). Other ``additional_config`` keys belong to vLLM
and its platforms and are left alone, except names that start with ``locks`` (a misspelt key would otherwise be
ignored without a word).
"""

from __future__ import annotations

from typing import Any

from locks_engine.config import LocksConfig

CONFIG_KEY = "locks"
STATS_PATH_KEY = "locks_stats_path"
HOOKS_KEY = "locks_hooks"
KEYS = (CONFIG_KEY, STATS_PATH_KEY, HOOKS_KEY)


def check_settings(additional_config: object) -> None:
    """Check LOCKS' keys of vLLM's ``additional_config`` (a dict, or anything else vLLM allows: then no check).

    Raises:
        ValueError: one line that starts with ``additional_config["<key>"]`` and names the bad key or field, the
            value and what is allowed.
    """
    if not isinstance(additional_config, dict):
        return
    unknown = sorted(k for k in additional_config if str(k).startswith("locks") and k not in KEYS)
    if unknown:
        raise ValueError(f"additional_config{_key(unknown[0])}: unknown LOCKS key: allowed {', '.join(KEYS)}")
    settings: Any = additional_config.get(CONFIG_KEY)
    if settings is not None and not isinstance(settings, dict):
        raise ValueError(
            f"additional_config{_key(CONFIG_KEY)}={settings!r}: allowed a JSON object of LocksConfig settings "
            f"({', '.join(LocksConfig().to_dict())})"
        )
    try:
        locks_config(additional_config)
    except (TypeError, ValueError) as err:
        raise ValueError(f"additional_config{_key(CONFIG_KEY)}: {err}") from None
    path = additional_config.get(STATS_PATH_KEY)
    if path is not None and (not isinstance(path, str) or not path):
        raise ValueError(f"additional_config{_key(STATS_PATH_KEY)}={path!r}: allowed a file path (a string)")
    hooks = additional_config.get(HOOKS_KEY)
    if hooks is not None and not (isinstance(hooks, list) and all(isinstance(h, str) for h in hooks)):
        raise ValueError(
            f'additional_config{_key(HOOKS_KEY)}={hooks!r}: allowed a list of "module.path:ClassName" strings'
        )


def locks_config(additional_config: object) -> LocksConfig:
    """The ``LocksConfig`` of ``additional_config["locks"]``: the one place the backend reads it (the defaults
    without that key, or when ``additional_config`` is not a dict).

    Raises:
        ValueError, TypeError: as ``LocksConfig.from_dict`` (``check_settings`` names the key).
    """
    extra = additional_config if isinstance(additional_config, dict) else {}
    return LocksConfig.from_dict(dict(extra.get(CONFIG_KEY) or {}))


def _key(name: object) -> str:
    return f'["{name}"]'
