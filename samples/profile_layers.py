"""One decoder layer's GPU kernels in a decode step, read from ``bench_e2e.py --profile-steps`` results (any machine).

``bench_e2e``'s profile covers ``N`` tokens of a cached prompt: one prefill step (the prompt's last tokens, and with
``candidates="auto"`` the calibration at the step after it) and ``N - 1`` decode steps. Its device time per step
(``device_busy_ms_per_step``, the depth fits' ``fit.device``) therefore carries the calibration, which at 1M tokens
is several ms a layer. This reads the per-kernel rows instead: a kernel launched at least once in every layer of
every decode step has ``calls >= (N - 1) x layers``; its share of one layer's step is its mean time a call times
``round(calls / ((N - 1) x layers))`` (launches a layer a step). Kernels launched once a step (embedding, LM head,
sampler) fall under the threshold and are left out, so the sum is the per-layer decode cost on the device:
attention, the layer's GEMMs and norms. A calibration that runs one of those kernels adds its calls to the mean
(at most ``2 x layers`` of ``(N - 1) x layers``): the figure leans high for LOCKS, never low. Profiles with a
short window (``bench_e2e.profile_decode``) are read as the difference of the two windows, calls and time kernel by
kernel: the prefill step and the calibration cancel, and ``N`` is the difference of their tokens.

Usage::

    python samples/profile_layers.py OUT/result-glm4-9b-1m-L8-flash.json OUT/result-glm4-9b-1m-L8-locks-2l.json

Prints each result's per-layer total and its top kernels; ``--json PATH`` writes them. Exit status 2 when a
result has no profile.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def layer_kernels(result: dict) -> dict:
    """Per-layer decode kernels of one ``bench_e2e`` result: ``{"layers", "decode_steps", "windows", "per_layer_us",
    "kernels": [{"name", "per_layer_us", "launches"}...]}`` (microseconds a layer a decode step, first rank;
    device-side rows only, those without CPU time: an eager op's row repeats its kernels' time).

    Raises:
        ValueError: the result has no profile (``--profile-steps`` was 0 or the cell was skipped).
    """
    profile = result.get("profile") or {}
    ranks = profile.get("ranks") or []
    steps = profile.get("decode_tokens") or 0
    if not ranks or steps < 2:
        raise ValueError("no --profile-steps profile in this result")
    layers = int(result["layers"])
    rank = ranks[0]
    rows = {row["name"]: row for row in rank.get("by_device", []) if row["self_cpu_us"] == 0}
    short = rank.get("short_window")
    if short:  # the difference of two windows: each request's prefill step and calibration cancel
        decode = steps - short["decode_tokens"]
        for row in short["by_device"]:
            if row["name"] in rows and row["self_cpu_us"] == 0:
                long_row = rows[row["name"]]
                rows[row["name"]] = {**long_row, "calls": long_row["calls"] - row["calls"],
                                     "self_device_us": long_row["self_device_us"] - row["self_device_us"]}
    else:
        decode = steps - 1
    per = decode * layers  # launches of a once-a-layer kernel over the decode steps
    kernels = []
    for row in rows.values():
        if row["calls"] < per:
            continue
        launches = round(row["calls"] / per)
        kernels.append({"name": row["name"], "launches": launches,
                        "per_layer_us": round(row["self_device_us"] / row["calls"] * launches, 2)})
    kernels.sort(key=lambda k: -k["per_layer_us"])
    return {"layers": layers, "decode_steps": decode, "windows": 2 if short else 1,
            "per_layer_us": round(sum(k["per_layer_us"] for k in kernels), 1), "kernels": kernels}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="result-*.json files of bench_e2e.py")
    parser.add_argument("--top", type=int, default=10, help="kernels shown a result")
    parser.add_argument("--json", help="write every result's breakdown here")
    args = parser.parse_args(argv)
    out = {}
    for path in args.results:
        result = json.loads(Path(path).read_text())
        try:
            out[path] = {"backend": result.get("backend"), "shape": result.get("shape"), **layer_kernels(result)}
        except ValueError as err:
            print(f"error: {path}: {err}", file=sys.stderr)
            return 2
    for path, b in out.items():
        print(f"{Path(path).name}: {b['per_layer_us']:.1f} us a layer a decode step ({b['layers']} layers, "
              f"{b['decode_steps']} decode steps)")
        for k in b["kernels"][:args.top]:
            print(f"  {k['per_layer_us']:8.2f} us  x{k['launches']}  {k['name'][:80]}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
