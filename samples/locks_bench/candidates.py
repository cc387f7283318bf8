"""The two-level selection's ``candidates`` (``LocksConfig.candidates``) as the benchmarks take them."""

from __future__ import annotations

#: c per layer for Qwen2.5-Coder-0.5B-Instruct (the evaluation model): the policy "centroid c or flat, flat-0.005" at
#: 8K and 2% (the cheapest superpage-centroid c within 0.005 of the flat scan's mass on each layer; 0 = flat),
#: ``samples/results/2026-12-04_cpu_dbb84a2/selection_cost.json``; ``LocksConfig.candidates`` for that model
STUDY_CANDIDATES = (8, 4, 4, 32, 4, 4, 4, 32, 4, 32, 32, 0, 4, 32, 4, 32, 0, 4, 4, 4, 16, 32, 16, 16)


def parse_candidates(text: str) -> tuple[int, ...]:
    """``--candidates`` of the benchmarks: ``study`` (:data:`STUDY_CANDIDATES`) or comma-separated integers >= 0.

    Raises:
        ValueError: anything else (one line).
    """
    if text.strip().lower() == "study":
        return STUDY_CANDIDATES
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 0:
        raise ValueError(f"candidates {text!r}: allowed 'study' or comma-separated integers >= 0 (c per layer)")
    return values


def keep_needle_table(flat: list[float], uniform: dict[int, list[float]], floor: tuple[int, ...] | None,
                      tolerance: float) -> list[int]:
    """A two-level table that keeps the needle (``samples/needle_layers.py``): per layer, the cheapest ``c`` of
    ``uniform`` whose carrier retention is at least the flat scan's less ``tolerance`` (0 = flat where none is),
    raised to ``floor``'s ``c`` where that is larger (0 in ``floor`` stays flat).

    Args:
        flat (list[float]): the flat scan's retention per layer `[L]` (share of the value's pages read).
        uniform (dict): ``c`` -> retention per layer `[L]` of the two-level selection at that ``c`` everywhere.
        floor (tuple | None): a table to keep at least (the mass-calibrated one), `[L]`.
        tolerance (float): retention a layer may lose against the flat scan (absolute share).
    Returns:
        list[int]: ``c`` per layer, 0 = flat.
    """
    out = []
    for layer, keep in enumerate(flat):
        pick = next((c for c in sorted(uniform) if uniform[c][layer] >= keep - tolerance), 0)
        if floor is not None and pick:
            pick = 0 if floor[layer] == 0 else max(pick, floor[layer])
        out.append(pick)
    return out
