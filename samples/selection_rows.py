"""Issue 27's target table from one GPU run: the two-level selection (``locks-2l``) and the flat scan against vLLM's
FLASH_ATTN, each target's figure with ``met`` or ``missed``.

Inputs, all from one machine and lease:

- ``--e2e DIR``: ``samples/bench_e2e.py``'s ``result-*.json`` at Llama-3.1-8B shapes, backends ``flash``,
  ``locks-2l`` (and ``locks``, the flat scan, where run), contexts 131072 and 262144 at batch 1 and 131072 at batch 6;
- ``--kernels FILE``: ``samples/bench_kernels.py --two-level ... --table T``'s ``two_level.json`` (one layer's
  decode step at the GLM-4-9B-1M-like shape at 1M tokens: flat, each ``c`` of the table, the table's mean over its
  layers, vLLM's FA3 decode call);
- ``--fit FILE`` (default ``samples/results/e2e.json``): the GLM 1M depth fit of an earlier H200 run
  (``one_gpu_device_fits``), for the parts of a layer that are not attention.

The GLM rows are composed, and labelled so: a layer of the fit (``locks_per_layer_ms``, the flat scan plus the rest
of the layer) with its flat decode step replaced by the table's (``- flat + table``, both from ``--kernels``),
against the fit's FLASH_ATTN layer; 40 layers add the fit's fixed cost. The 1M bytes are those the kernels read by
construction (``bench_kernels``' formula: page summaries scanned, superpage centroids; the budget's K+V left out).

Usage::

    python samples/selection_rows.py --e2e OUT/e2e --kernels OUT/kernels/two_level.json --json OUT/targets.json

Prints a Markdown table; exit status 2 (one line) when an input is missing or holds none of the cells needed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: issue 27's targets: key, measure, sense ("min": at least, "max": at most), value, unit
TARGETS = (
    ("glm_layer", "GLM-4-9B-1M-like at 1M, per layer (composed)", "min", 2.5, "x"),
    ("glm_40", "GLM 1M, 40 layers, extrapolated", "min", 2.3, "x"),
    ("llama_256k", "Llama-3.1-8B shapes, 256K, batch 1", "min", 2.2, "x"),
    ("llama_128k_ms", "Llama-3.1-8B shapes, 128K, batch 1", "max", 5.6, "ms"),
    ("llama_128k_x6", "Llama-3.1-8B shapes, 128K x 6 sequences, throughput", "min", 4.0, "x"),
    ("bytes_1m", "summary bytes scanned per step at 1M, of dense K+V", "max", 3.0, "%"),
)


class InputError(ValueError):
    """An input file or folder is missing or lacks the cells the table needs (one line)."""


def load_e2e(folder: Path) -> dict[tuple[str, int, int], dict]:
    """``{(backend, context, batch): cell}`` of the ``result-*.json`` in ``folder`` (skipped cells left out).

    Raises:
        InputError: no result file there.
    """
    cells = {}
    files = sorted(folder.glob("result-*.json"))
    if not files:
        raise InputError(f"{folder}: no result-*.json of bench_e2e.py")
    for path in files:
        result = json.loads(path.read_text())
        for cell in result.get("cells", []):
            if "skipped" not in cell and cell.get("tpot_ms"):
                cells[(result["backend"], cell["context"], cell["batch"])] = {**cell, "result": result}
    return cells


def kernel_row(doc: dict, shape: str = "glm-4-9b 1M") -> dict:
    """The ``shape`` row of ``two_level.json`` with integer ``c`` keys.

    Raises:
        InputError: no such row, or it has no table mean (run bench_kernels with ``--table``).
    """
    row = next((r for r in doc.get("rows", []) if r.get("shape") == shape), None)
    if row is None or "table" not in row:
        raise InputError(f"two_level.json has no {shape!r} row with a table (bench_kernels --two-level --table)")
    return {**row, "two_level": {int(c): v for c, v in row["two_level"].items()}}


def summary_pct(row: dict, bytes_pct: float) -> float:
    """Page summaries and superpage centroids a step reads, in % of the layer's K+V: ``bytes_pct`` (all a step
    reads) less the budget's K+V pages (``budget / context``)."""
    return bytes_pct - 100 * row["budget"] / row["context"]


def verdict(sense: str, value: float | None, target: float) -> str:
    """``met`` / ``missed`` (``not measured`` for None)."""
    if value is None:
        return "not measured"
    return "met" if (value >= target if sense == "min" else value <= target) else "missed"


def figures(cells: dict, row: dict | None, fit: dict | None) -> dict[str, dict]:
    """Each target's figure for the two-level table (``two_level``) and the flat scan (``flat``), None where the
    inputs lack it, with the numbers it comes from (``detail``)."""
    out: dict[str, dict] = {key: {"two_level": None, "flat": None, "detail": ""} for key, *_ in TARGETS}

    def tpot(backend, ctx, batch):
        cell = cells.get((backend, ctx, batch))
        return cell["tpot_ms"] if cell else None

    def shown(value):
        return "-" if value is None else f"{value}"

    for key, ctx, batch in (("llama_256k", 262144, 1), ("llama_128k_x6", 131072, 6)):
        dense = tpot("flash", ctx, batch)
        for name, backend in (("two_level", "locks-2l"), ("flat", "locks")):
            locks = tpot(backend, ctx, batch)
            out[key][name] = round(dense / locks, 2) if dense and locks else None
        out[key]["detail"] = (f"TPOT ms: FLASH_ATTN {shown(dense)}, two-level {shown(tpot('locks-2l', ctx, batch))}, "
                              f"flat {shown(tpot('locks', ctx, batch))}")
    out["llama_128k_ms"].update(two_level=tpot("locks-2l", 131072, 1), flat=tpot("locks", 131072, 1),
                                detail=f"TPOT ms: FLASH_ATTN {shown(tpot('flash', 131072, 1))}")
    if row is not None:
        flat_ms, table_ms = row["flat_ms"], row["table"]["ms"]
        fa3 = row["dense_ms"].get("vllm-fa3")
        out["bytes_1m"].update(two_level=round(summary_pct(row, row["table"]["bytes_pct"]), 2),
                               flat=round(summary_pct(row, row["flat_bytes_pct"]), 2),
                               detail=f"{row['table']['layers']}-layer table, by construction")
        attention = f"a layer's attention step: table {table_ms * 1e3:.1f} us, flat {flat_ms * 1e3:.1f} us" + (
            f", vLLM FA3 {fa3 * 1e3:.1f} us" if fa3 else "")
        out["glm_layer"]["detail"] = attention
        if fit is not None:
            dense_layer, flat_layer = fit["dense_per_layer_ms"], fit["locks_per_layer_ms"]
            table_layer = flat_layer - flat_ms + table_ms
            out["glm_layer"].update(two_level=round(dense_layer / table_layer, 2),
                                    flat=round(dense_layer / flat_layer, 2))
            out["glm_layer"]["detail"] += (f"; layer (fit of machine {fit.get('machine')}, kernels "
                                           f"{fit.get('kernels')}): FLASH_ATTN "
                                           f"{dense_layer:.4f} ms, flat {flat_layer:.4f}, table {table_layer:.4f}")
            fixed, dense_full = fit["locks_fixed_ms"], fit["dense_ms_at_full_depth"]
            out["glm_40"].update(two_level=round(dense_full / (fixed + 40 * table_layer), 2),
                                 flat=round(dense_full / (fixed + 40 * flat_layer), 2),
                                 detail=f"FLASH_ATTN {dense_full:.2f} ms, fixed {fixed:.2f} ms + 40 layers")
    return out


def table_markdown(found: dict[str, dict]) -> str:
    """The target table: measure, target, two-level figure and verdict, flat figure, what it comes from."""
    lines = ["| measure | target | two-level | verdict | flat scan | from |", "|---|---|---|---|---|---|"]
    for key, label, sense, target, unit in TARGETS:
        f = found[key]
        sep = " " if unit == "ms" else ""
        fmt = (lambda v: "-" if v is None else f"{v}{sep}{unit}")
        bound = f"{'at least' if sense == 'min' else 'at most'} {target}{sep}{unit}"
        lines.append(f"| {label} | {bound} | {fmt(f['two_level'])} | {verdict(sense, f['two_level'], target)} | "
                     f"{fmt(f['flat'])} | {f['detail']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--e2e", type=Path, required=True, help="folder of bench_e2e.py's result-*.json")
    ap.add_argument("--kernels", type=Path, help="bench_kernels.py's two_level.json (with --table)")
    ap.add_argument("--fit", type=Path, default=Path(__file__).resolve().parent / "results" / "e2e.json",
                    help="e2e.json with the GLM 1M depth fit (one_gpu_device_fits)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    try:
        cells = load_e2e(args.e2e)
        row = None
        if args.kernels is not None:
            if not args.kernels.is_file():
                raise InputError(f"{args.kernels}: not a file")
            row = kernel_row(json.loads(args.kernels.read_text()))
        fits = json.loads(args.fit.read_text()).get("one_gpu_device_fits", []) if args.fit.is_file() else []
        fit = next((f for f in reversed(fits) if f.get("shape") == "glm4-9b-1m"), None)
    except (InputError, json.JSONDecodeError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    found = figures(cells, row, fit)
    if all(f["two_level"] is None for f in found.values()):
        print(f"error: {args.e2e}: no locks-2l cell at 128K or 256K and no kernel table", file=sys.stderr)
        return 2
    text = table_markdown(found)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"targets": found, "fit": fit, "e2e": str(args.e2e),
                                         "kernels": str(args.kernels) if args.kernels else None}, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
