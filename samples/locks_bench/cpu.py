"""What ``samples/bench_cpu_decode.py`` and its tests share: the modes it times and its command line."""

from __future__ import annotations

import argparse
from pathlib import Path

#: vLLM's own CPU attention, LOCKS at the budget, LOCKS reading every page
MODES = ("cpu_attn", "locks", "locks_dense", "locks_2l")
#: the modes run unless ``--modes`` says otherwise
DEFAULT_MODES = ("cpu_attn", "locks", "locks_dense")


def parse(description: str = "", argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of ``samples/bench_cpu_decode.py`` (``description`` heads its help).

    Raises:
        SystemExit: exit status 2 with a one-line message for bad ``--n1``/``--n2`` or ``--modes``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--book", required=True, help="UTF-8 text to cut the prompt from")
    p.add_argument("--model", default=None, help="model directory or hub id (default: the built-in model)")
    p.add_argument("--context", type=int, default=7000, help="prompt tokens")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--budget", type=int, default=2048, help="LOCKS token budget")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--summary-format", default="", help="LOCKS summary format (default: LocksConfig's)")
    p.add_argument("--candidates", default="4", help="locks_2l: c of the two-level selection, one or one per layer, or auto "
                   "(calibrated per layer)")
    p.add_argument("--dtype", default="auto",
                   help="vLLM dtype: auto (the app's choice: locks_engine.engine.cpu_dtype), bfloat16, float32")
    p.add_argument("--n1", type=int, default=16)
    p.add_argument("--n2", type=int, default=80)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.n2 <= args.n1 or args.n1 < 1:
        p.error("need 1 <= --n1 < --n2")
    if bad := [m for m in args.modes.split(",") if m not in MODES]:
        p.error(f"unknown mode(s) {', '.join(bad)}; allowed: {', '.join(MODES)}")
    return args
