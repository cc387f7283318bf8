"""How the next token is drawn: one frozen :class:`Sampling` per answer, from the model's own
``generation_config.json`` (as ``vllm serve`` and Hugging Face's ``generate`` take it) with the user's values over it.

Greedy (temperature 0) is what the benchmarks, RULER and the tests use (:data:`GREEDY`); the app uses the model's
defaults unless the user sets them. A sampled answer is seeded (vLLM's per-request ``seed``), so one run is
reproducible. Importing this module imports no vLLM.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

#: where a :class:`Sampling` came from: the model's ``generation_config.json``, the user (an option or the settings
#: file, the rest from the model), or neither (greedy, no penalty)
SOURCES = ("model", "user", "greedy")
#: the seed of sampled answers when the user gives none
DEFAULT_SEED = 0
#: the sampling keys of ``generation_config.json`` read (Hugging Face's names, which are also vLLM's)
GENERATION_CONFIG_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: each field's test and what it allows (vLLM's ranges)
_RULES = {
    "temperature": (lambda v: _number(v) and 0.0 <= v <= 2.0, "a number from 0 to 2 (0: greedy)"),
    "top_p": (lambda v: _number(v) and 0.0 < v <= 1.0, "a number above 0, at most 1"),
    "top_k": (lambda v: _whole(v) and v >= 0, "a whole number, 0 (off) or more"),
    "repetition_penalty": (lambda v: _number(v) and v > 0.0, "a number above 0 (1: off)"),
    "seed": (lambda v: _whole(v) and v >= 0, "a whole number, 0 or more"),
    "source": (lambda v: v in SOURCES, " or ".join(SOURCES)),
}


def refusal(name: str, value: Any) -> str | None:
    """``None`` when :class:`Sampling` takes ``value`` for field ``name``, else what it takes (for messages).

    Raises:
        KeyError: ``name`` is not a field of :class:`Sampling`.
    """
    test, allowed = _RULES[name]
    return None if test(value) else allowed


@dataclass(frozen=True)
class Sampling:
    """The sampling settings of one request.

    Raises:
        ValueError: a field outside vLLM's range (message names the field, the value and what is allowed).
    """

    temperature: float = 0.0
    """0: greedy (the most likely token); at most 2 (vLLM's limit)."""
    top_p: float = 1.0
    """nucleus sampling: the smallest set of tokens whose probabilities reach ``top_p``, in (0, 1]; 1: off."""
    top_k: int = 0
    """only the ``top_k`` most likely tokens; 0: off."""
    repetition_penalty: float = 1.0
    """divides the logits of tokens already in the prompt or the answer (CTRL, Keskar et al. 2019); 1: off."""
    seed: int = DEFAULT_SEED
    """seed of the request's random draws (unused when greedy)."""
    source: str = "greedy"
    """``model``, ``user`` or ``greedy`` (:data:`SOURCES`)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            allowed = refusal(f.name, getattr(self, f.name))
            if allowed is not None:
                raise ValueError(f"Sampling.{f.name} = {getattr(self, f.name)!r} is not allowed ({allowed})")

    @property
    def greedy(self) -> bool:
        """The most likely token every step (temperature 0); a repetition penalty still applies."""
        return self.temperature == 0.0

    @classmethod
    def from_generation_config(cls, path: str | Path | None) -> "Sampling":
        """The model's defaults from its ``generation_config.json``.

        As ``vllm serve`` does, the file's ``temperature``, ``top_p``, ``top_k`` and ``repetition_penalty`` are
        taken; as Hugging Face's ``generate`` does, an explicit ``"do_sample": false`` means greedy (the penalty
        kept). Values outside :class:`Sampling`'s ranges are left out.

        Args:
            path (str | Path | None): the file, or the model directory that holds it.
        Returns:
            Sampling: source ``model`` when the file gives any of those keys; otherwise greedy (source ``greedy``):
            no path, no file, or a file that cannot be read or gives none.
        """
        if path is None:
            return GREEDY
        path = Path(path)
        if path.is_dir():
            path = path / "generation_config.json"
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return GREEDY
        if not isinstance(config, dict):
            return GREEDY
        values = {key: config[key] for key in GENERATION_CONFIG_KEYS
                  if key in config and refusal(key, config[key]) is None}
        if config.get("do_sample") is False:
            values.pop("temperature", None)
        if not values:
            return GREEDY
        return replace(GREEDY, **values, source="model")

    def merged(self, **overrides: Any) -> "Sampling":
        """These settings with the user's over them.

        Args:
            overrides: any of ``temperature``, ``top_p``, ``top_k``, ``repetition_penalty``, ``seed``; ``None``
                values are not given. ``temperature=0`` is greedy.
        Returns:
            Sampling: source ``user`` when the user gave a value other than ``seed``, else this source.
        Raises:
            ValueError: an unknown key, or a value outside the ranges.
        """
        given = {key: value for key, value in overrides.items() if value is not None}
        unknown = set(given) - {f.name for f in fields(self)} | ({"source"} & set(given))
        if unknown:
            raise ValueError(f"Sampling.merged: unknown setting(s) {', '.join(sorted(unknown))}")
        source = "user" if set(given) - {"seed"} else self.source
        return replace(self, **given, source=source)

    def to_params(self) -> dict[str, Any]:
        """Keyword arguments of ``vllm.SamplingParams`` (greedy: no seed, top-p and top-k off)."""
        if self.greedy:
            return {"temperature": 0.0, "repetition_penalty": self.repetition_penalty}
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "repetition_penalty": self.repetition_penalty, "seed": self.seed}

    def to_json(self) -> dict[str, Any]:
        """Every field, for ``--json`` and a turn's statistics."""
        return asdict(self)


GREEDY = Sampling()
"""Greedy decoding, no repetition penalty: the benchmarks', RULER's and the tests' setting."""


def model_sampling(model: str | Path | None) -> Sampling:
    """The sampling defaults of the model the engine loads.

    Args:
        model (str | Path | None): the model directory (the built-in model's converted one, or a local one), or a
            hub id, whose ``generation_config.json`` is looked up in the local Hugging Face cache only.
    Returns:
        Sampling: :meth:`Sampling.from_generation_config` of its file; greedy when there is none (or nothing is
        cached for a hub id).
    """
    if model is None:
        return GREEDY
    path = Path(model).expanduser()
    if path.is_dir():
        return Sampling.from_generation_config(path)
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(str(model), "generation_config.json")
    except Exception:  # noqa: BLE001 - not a valid repo id, or no hub library: nothing cached
        return GREEDY
    return Sampling.from_generation_config(cached) if isinstance(cached, str) else GREEDY
