"""The two-level selection's ``candidates`` (``LocksConfig.candidates``) as the benchmarks take them."""

from __future__ import annotations

#: c per layer for Qwen2.5-Coder-0.5B-Instruct (the evaluation model): the policy "centroid c or flat, flat-0.005" at
#: 8K and 2% (the cheapest superpage-centroid c within 0.005 of the flat scan's mass on each layer; 0 = flat),
#: ``samples/results/2026-12-04_cpu_dbb84a2/selection_cost.json``; ``LocksConfig.candidates`` for that model
STUDY_CANDIDATES = (8, 4, 4, 32, 4, 4, 4, 32, 4, 32, 32, 0, 4, 32, 4, 32, 0, 4, 4, 4, 16, 32, 16, 16)

#: c per layer for the evaluation model that keeps the needle (``samples/studies/needle_layers.py`` on 8K needle
#: trials, :func:`keep_needle_table` with tolerance 0.05 over :data:`STUDY_CANDIDATES`;
#: ``samples/studies/SELECTION_COST.md``): the table of issue 27's CPU fidelity gate and of RULER at 16K/32K
#: (``2026-12-05_*_46d6d71``)
KEEP_NEEDLE_CANDIDATES = (8, 4, 16, 32, 16, 32, 0, 32, 16, 32, 32, 0, 32, 32, 16, 32, 0, 32, 32, 16, 16, 32, 16, 32)

#: named tables that ``--candidates`` takes
NAMED = {"study": STUDY_CANDIDATES, "keep-needle": KEEP_NEEDLE_CANDIDATES}


def parse_candidates(text: str) -> tuple[int, ...]:
    """``--candidates`` of the benchmarks: a name of :data:`NAMED` (``study``, ``keep-needle``) or comma-separated
    integers >= 0.

    Raises:
        ValueError: anything else (one line).
    """
    if text.strip().lower() in NAMED:
        return NAMED[text.strip().lower()]
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 0:
        raise ValueError(f"candidates {text!r}: allowed {', '.join(NAMED)} or comma-separated integers >= 0 "
                         "(c per layer)")
    return values


def stretch(table: tuple[int, ...], layers: int) -> tuple[int, ...]:
    """A per-layer table resampled to ``layers`` layers, layer ``i`` taking entry ``i * len(table) // layers`` (a
    one-entry table stays one entry). For speed at another model's depth only (dummy weights): a table is
    calibrated per model, and its shares of flat and large-``c`` layers are what set the step's cost.

    Raises:
        ValueError: ``layers`` < 1.
    """
    if layers < 1:
        raise ValueError(f"layers={layers}: at least 1")
    if len(table) in (1, layers):
        return tuple(table)
    return tuple(table[i * len(table) // layers] for i in range(layers))


def table_mean(row: dict, table: list[int]) -> dict:
    """A per-layer table's mean decode step and bytes over its layers, from one shape's timings of
    ``samples/bench_kernels.py --two-level``: ``c = 0`` is the flat scan (``row["flat_ms"]``,
    ``row["flat_bytes_pct"]``), any other ``c`` the two-level step timed at it (``row["two_level"][c]``).

    Returns:
        dict: ``ms`` (mean ms a layer), ``bytes_pct`` (mean % of the layer's K+V read a step), ``layers``.
    Raises:
        KeyError: a ``c`` of ``table`` that ``row`` did not time.
    """
    ms = [row["flat_ms"] if c == 0 else row["two_level"][c]["ms"] for c in table]
    pct = [row["flat_bytes_pct"] if c == 0 else row["two_level"][c]["bytes_pct"] for c in table]
    return {"ms": sum(ms) / len(ms), "bytes_pct": sum(pct) / len(pct), "layers": len(table)}


def keep_needle_table(flat: list[float], uniform: dict[int, list[float]], floor: tuple[int, ...] | None,
                      tolerance: float) -> list[int]:
    """A two-level table that keeps the needle (``samples/studies/needle_layers.py``): per layer, the cheapest ``c``
    of ``uniform`` whose carrier retention is at least the flat scan's less ``tolerance`` (0 = flat where none is),
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
