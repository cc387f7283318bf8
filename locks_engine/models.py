"""Which model the engine loads: a built-in model, a local Hugging Face directory, or a hub id.

The built-in models (``locks_engine.builtin_models``: ``qwen0.5b``, the default, 32K context; ``smollm2``, 8K) ship
as GGUFs inside registry packages and are converted once (``locks_engine.gguf_convert``) into a cache directory
the caller chooses (``cache_dir``; the app passes one under its user directory), by default the platform's user
cache directory:

    <cache_dir, default platformdirs.user_cache_dir("locks-chat")/models>/<BuiltinModel.dir_name>/
"""

from __future__ import annotations

import json
import os
import socket
import sys
import urllib.parse
from pathlib import Path

#: Distribution name, for the default cache directory (``platformdirs.user_cache_dir``).
CACHE_APP_NAME = "locks-chat"
#: What to run when a package is missing (the README's install command does all of it).
INSTALL_HINT = "run the install command from the README"
#: ``config.json`` keys vLLM reads a model's context length from (``derive_max_model_len_and_key``).
CONTEXT_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
    "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len",
)


class ModelError(Exception):
    """A model cannot be found, installed or converted. ``str(err)`` is one line that names the next step."""


class ModelPathError(ModelError):
    """A local model path that does not exist or is not a Hugging Face model directory (the user's input)."""


class CacheDirError(ModelError):
    """The model cache directory cannot be written: read-only or not permitted (the user's environment, fixable
    by making it writable or choosing another one).

    Args:
        cache_dir (Path): the directory that could not be written.
        reason (str): why, as the system said it (``Read-only file system``).
    """

    def __init__(self, cache_dir: Path, reason: str) -> None:
        super().__init__(
            f"cannot write the model cache {cache_dir}: {reason}; make it writable or choose another cache directory"
        )
        self.cache_dir, self.reason = cache_dir, reason


def default_cache_dir() -> Path:
    """Where converted models go when the caller names no directory: ``<user cache dir>/models``."""
    from platformdirs import user_cache_dir

    return Path(user_cache_dir(CACHE_APP_NAME)) / "models"


#: what keeps the Hugging Face hub client, transformers and vLLM (usage statistics) off the network
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def stay_offline() -> None:
    """A local model needs no network: turn the hub off for this process and the engine's children
    (:data:`OFFLINE_ENV`, each unless the environment sets it already).

    Without it a machine whose outbound connections are dropped rather than refused (a GPU box behind a
    firewall) hung for minutes in the engine start, which holds SIGINT and SIGTERM until vLLM is up.
    huggingface_hub reads ``HF_HUB_OFFLINE`` once, when it is imported: when it already is, its constant is set
    too (the setting it documents, ``huggingface_hub.constants.HF_HUB_OFFLINE``)."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None and os.environ["HF_HUB_OFFLINE"].strip().lower() in {"1", "on", "yes", "true"}:
        constants.HF_HUB_OFFLINE = True


def resolve_model(name_or_path: str | None, cache_dir: str | Path | None = None) -> Path | str:
    """Turn a ``--model`` value into what ``vllm.LLM(model=...)`` takes.

    Args:
        name_or_path (str | None): a built-in model's name (``qwen0.5b``, ``smollm2``, ``builtin``; ``None``:
            the default one, ``locks_engine.builtin_models.find_builtin``); a local directory holding a Hugging
            Face model (``config.json``); anything else is a hub id (``org/name``).
        cache_dir (str | Path | None): directory the built-in models are converted into (created if needed);
            ``None``: :func:`default_cache_dir`.

    Returns:
        Path | str: the built-in model's converted directory (converted on first call: 15-60 s on 2 cores),
        the local directory, or the hub id unchanged (hubs are unreachable offline; vLLM reports that itself).

    A local model (built-in or a directory) turns the hub off for the process (:func:`stay_offline`).

    Raises:
        ModelError: a built-in model's package or the converter is missing, its GGUF's SHA-256 is not the
            model's, or the conversion failed (one line naming the install command).
        ModelPathError: a path that looks local does not exist or is not a model directory.
        CacheDirError: ``cache_dir`` cannot be written.
    """
    from locks_engine.builtin_models import builtin_model_dir, find_builtin

    builtin = find_builtin(name_or_path)
    if builtin is not None:
        stay_offline()
        return builtin_model_dir(builtin, cache_dir)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelPathError(f"{path} is a directory but not a Hugging Face model (no config.json in it): pass "
                                 f"the directory that holds config.json, or a built-in model ({_builtin_list()})")
        stay_offline()
        return path
    if path.is_file():
        raise ModelPathError(f"{path} is a file: pass a Hugging Face model directory or a hub id (org/name)")
    if _looks_local(name_or_path):
        raise ModelPathError(f"no such model directory: {path}; check the path, or pass a built-in model "
                             f"({_builtin_list()})")
    _require_hub_model(name_or_path)
    return name_or_path


def _require_hub_model(repo_id: str) -> None:
    """Fail at once for a hub id that cannot load: not in the local Hugging Face cache while the hub is off
    (``HF_HUB_OFFLINE``) or out of reach (its host does not resolve). Otherwise huggingface_hub retries for
    ~30 s before vLLM reports it; a mistyped relative path like ``models/qwen`` reads as a hub id.

    Raises:
        ModelPathError: not a valid hub id, or neither cached nor reachable.
    """
    try:
        from huggingface_hub import constants, try_to_load_from_cache
    except ImportError:  # vLLM brings huggingface_hub; without it the engine reports for itself
        return
    try:
        cached = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # huggingface_hub's HFValidationError
        raise ModelPathError(f"{repo_id!r} is neither a local model directory nor a valid hub id (org/name)") from None
    if isinstance(cached, str):
        return
    missing = f"{repo_id!r} is not a local model directory and not in the Hugging Face cache"
    if constants.HF_HUB_OFFLINE:
        raise ModelPathError(f"{missing}, and HF_HUB_OFFLINE is set: pass a local model directory")
    host = urllib.parse.urlparse(constants.ENDPOINT).hostname or ""
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        raise ModelPathError(f"{missing}, and the model hub is out of reach (no network): pass a local model "
                             "directory") from None


def _looks_local(name: str) -> bool:
    """Whether a string that names nothing on disk was meant as a path rather than a hub id (``org/name``)."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def local_model_dir(
    name_or_path: str | None, convert: bool = True, cache_dir: str | Path | None = None
) -> Path | None:
    """The local directory :func:`resolve_model` gives for ``name_or_path``; ``None`` for a hub id, and for the
    built-in model before its conversion when ``convert`` is false.

    Raises:
        ModelError: see :func:`resolve_model`.
    """
    from locks_engine.builtin_models import builtin_target, find_builtin

    builtin = find_builtin(name_or_path)
    if not convert and builtin is not None and not (builtin_target(builtin, cache_dir) / "config.json").is_file():
        return None
    resolved = resolve_model(name_or_path, cache_dir)
    return resolved if isinstance(resolved, Path) else None


def context_upper_bound(model_dir: Path) -> int | None:
    """The most context (tokens) vLLM can give the model in ``model_dir`` when no ``max_model_len`` is set.

    vLLM takes the smallest of the lengths that ``config.json`` states under :data:`CONTEXT_KEYS`, lowers it to
    the tokenizer's ``model_max_length`` and raises it by the RoPE scaling factor of some RoPE types
    (``vllm/config/model.py``, ``_get_and_verify_max_len``). This takes the largest length times the largest
    factor: never below vLLM's value, so a prompt refused against it would be refused by the engine too.

    Returns:
        int | None: the bound; ``None`` when ``config.json`` is unreadable or states no length.
    """
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    configs = [c for c in (config, config.get("text_config")) if isinstance(c, dict)]
    lengths = [c[k] for c in configs for k in CONTEXT_KEYS if _is_number(c.get(k))]
    if not lengths:
        return None
    factors = [f for c in configs for k in ("rope_scaling", "rope_parameters") for f in _factors(c.get(k))]
    return int(max(lengths) * max([1.0, *factors]))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _factors(rope: object) -> list[float]:
    """Every ``factor`` in a RoPE configuration (one dict, or one per layer type)."""
    if not isinstance(rope, dict):
        return []
    found = [rope["factor"]] if _is_number(rope.get("factor")) else []
    return found + [f for value in rope.values() for f in _factors(value)]


def _builtin_list() -> str:
    """``qwen0.5b, smollm2``: the built-in models' short names, for a refusal's next step."""
    from locks_engine.builtin_models import BUILTIN_MODELS

    return ", ".join(m.name for m in BUILTIN_MODELS)
