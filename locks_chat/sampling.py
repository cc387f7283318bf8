"""The sampling an answer is made with, as the app chooses and shows it: the model's own defaults (the engine's
``model_sampling``, from ``generation_config.json``) with the user's values over them (``--temperature`` and the
other options, or the settings file), and the text that says which was used (``ask``'s footer, a turn's footer,
``/stats``).
"""

from __future__ import annotations

from typing import Any

from locks_engine.sampling import GREEDY, Sampling, refusal

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty", "seed")
"""what the user may set: the options (``--top-p`` for ``top_p``) and the settings file's keys"""

MAX_WHOLE = 2**63 - 1
"""the largest ``seed`` and ``top_k`` the app takes: vLLM sends a request to its engine core as msgpack, which
holds integers up to ``2**64 - 1`` (a larger seed was an ``OverflowError`` there, after the engine had started:
``vllm/v1/serial_utils.py``), and torch's generators take seeds up to the same (``torch.Generator.manual_seed``);
the signed 64-bit limit keeps clear of both (a ``top_k`` past the vocabulary is off anyway)"""

_SOURCE_NOTE = {"model": "the model's", "user": "yours"}


def sampling_refusal(name: str, value: Any) -> str | None:
    """``None`` when the app takes ``value`` for the sampling key ``name`` (:data:`SAMPLING_KEYS`), else what it
    takes (for messages): ``locks_engine.sampling.refusal``'s ranges, ``seed`` and ``top_k`` at most
    :data:`MAX_WHOLE`."""
    allowed = refusal(name, value)
    if allowed is None and name in ("seed", "top_k") and value > MAX_WHOLE:
        return f"a whole number from 0 to {MAX_WHOLE}"
    return allowed


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
