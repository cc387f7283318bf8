"""The sampling an answer is made with, as the app chooses and shows it: the model's own defaults (the engine's
``model_sampling``, from ``generation_config.json``) with the user's values over them (``--temperature`` and the
other options, or the settings file), and the text that says which was used (``ask``'s footer, a turn's footer,
``/stats``).
"""

from __future__ import annotations

from typing import Any

from locks_engine.sampling import GREEDY, Sampling

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty", "seed")
"""what the user may set: the options (``--top-p`` for ``top_p``) and the settings file's keys"""

_SOURCE_NOTE = {"model": "the model's", "user": "yours"}


def answer_sampling(engine: Any, overrides: dict[str, Any]) -> Sampling:
    """The sampling of the next answer: ``engine``'s ``model_sampling`` (greedy for an engine without it), the
    values of ``overrides`` that are not ``None`` over it (keys :data:`SAMPLING_KEYS`, checked by the caller)."""
    base = getattr(engine, "model_sampling", None)
    return (base if isinstance(base, Sampling) else GREEDY).merged(**overrides)


def sampling_text(record: dict[str, Any] | None, form: str = "full") -> str:
    """What a turn's ``stats["sampling"]`` (:meth:`Sampling.to_json`) says, in one of three forms.

    Args:
        record (dict | None): the saved sampling; ``None`` or unreadable (a turn saved before it was kept): ``""``.
        form (str): ``full`` (``ask``'s footer): ``temperature 0.7, top-p 0.8, top-k 20, repetition penalty 1.1,
            seed 0 (the model's)``; ``short`` (a turn's footer): ``T 0.7, top-p 0.8, top-k 20, rp 1.1 (the
            model's)``; ``cell`` (``/stats``): ``T 0.7`` or ``greedy``.
    """
    try:
        sampling = Sampling(**record) if isinstance(record, dict) else None
    except (TypeError, ValueError):
        sampling = None
    if sampling is None:
        return ""
    if form == "cell":
        return "greedy" if sampling.greedy else f"T {sampling.temperature:g}"
    full = form == "full"
    parts = ["greedy"] if sampling.greedy else [f"{'temperature' if full else 'T'} {sampling.temperature:g}"]
    if not sampling.greedy and sampling.top_p < 1:
        parts.append(f"top-p {sampling.top_p:g}")
    if not sampling.greedy and sampling.top_k:
        parts.append(f"top-k {sampling.top_k}")
    if sampling.repetition_penalty != 1:
        parts.append(f"{'repetition penalty' if full else 'rp'} {sampling.repetition_penalty:g}")
    if full and not sampling.greedy:
        parts.append(f"seed {sampling.seed}")
    note = _SOURCE_NOTE.get(sampling.source)
    return ", ".join(parts) + (f" ({note})" if note else "")
