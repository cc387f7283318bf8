"""The end-to-end benchmark's figure: batch-1 TPOT of LOCKS and vLLM's FLASH_ATTN from the rows of ``e2e.json``
(``samples/bench_e2e.py --summarize``), by context for shapes measured at full depth and by depth (with the TPOT
fit and its extrapolated full-depth point) for contexts measured at several depths.

    python samples/plot_e2e.py samples/results/e2e.json            # writes samples/results/e2e.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from locks_bench.e2e import SHAPES, WALK_NOTE, plot_panels


def plot(rows: list[dict], path: Path) -> None:
    """Batch-1 TPOT of both backends: by context for shapes measured at full depth, and by depth (with the TPOT
    fit and its extrapolated full-depth point, hollow) for contexts measured at several depths."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    panels, fits = plot_panels(rows)
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    labels = {"dense_tpot_ms": ("o-", "vLLM FLASH_ATTN"), "locks_tpot_ms": ("s-", "LOCKS (budget 2048, r=8)")}
    for ax, (kind, key, pts) in zip(axes[0], panels):
        if kind == "context":
            pts = sorted(pts, key=lambda r: r["context"])
            xs = [r["context"] // 1024 for r in pts]
            for field, (style, label) in labels.items():
                ax.plot(xs, [r[field] for r in pts], style, label=label)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("context (K tokens)")
            shape, walk = key
            ax.set_title(f"{shape}, {SHAPES[shape]['num_hidden_layers']} layers" + WALK_NOTE[walk])
        else:
            shape, ctx, walk = key
            # rows run with a score-kernel tuning override are single points beside the lines, not on them; a
            # named kernels' version is a LOCKS line of its own, with its own fit
            tuned = [r for r in pts if r.get("score_tuning")]
            versions = sorted({r["kernels"] for r in pts if r.get("kernels") and not r.get("score_tuning")})
            series = {v: sorted((r for r in pts if r.get("kernels") == v and not r.get("score_tuning")),
                                key=lambda r: r["layers"]) for v in versions}
            pts = sorted((r for r in pts if not r.get("score_tuning") and not r.get("kernels")),
                         key=lambda r: r["layers"])
            fit = fits.get(key + (None,))
            prefixes = {"dense_tpot_ms": "dense", "locks_tpot_ms": "locks"}
            for field, (style, label) in labels.items():
                line = ax.plot([r["layers"] for r in pts], [r[field] for r in pts], style[0], label=label)[0]
                if fit:  # the fit from its intercept (0 layers) to the extrapolated full depth, dotted
                    fixed = fit["fit"][f"{prefixes[field]}_fixed_ms"]
                    ax.plot([0, fit["layers"]], [fixed, fit[field]], ":", color=line.get_color())
                    ax.plot([fit["layers"]], [fit[field]], style[0], mfc="none", color=line.get_color())
            for v, rs in series.items():
                line = ax.plot([r["layers"] for r in rs], [r["locks_tpot_ms"] for r in rs], "D-",
                               label=f"LOCKS, kernels {v}")[0]
                vfit = fits.get(key + (v,))
                if vfit:
                    ax.plot([0, vfit["layers"]], [vfit["fit"]["locks_fixed_ms"], vfit["locks_tpot_ms"]], ":",
                            color=line.get_color())
                    ax.plot([vfit["layers"]], [vfit["locks_tpot_ms"]], "D", mfc="none", color=line.get_color())
            for r in tuned:
                ax.plot([r["layers"]], [r["locks_tpot_ms"]], "*", ms=11, color="tab:red",
                        label=f"LOCKS, score kernel {r['score_tuning']}")
            ax.set_xlabel("layers (hollow: extrapolated from the TPOT fit)")
            size = f"{ctx >> 20}M" if ctx >= 1 << 20 else f"{ctx >> 10}K"
            flagged = fit and fit["fit"]["dense_slope_below_floor"]
            note = "\n(fit flagged: a host-bound depth)" if flagged else ""
            ax.set_title(f"{shape} at {size} tokens, by depth{WALK_NOTE[walk]}{note}")
            ax.set_xlim(left=0)
        ax.set_ylabel("TPOT (ms), batch 1")
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="?", default="samples/results/e2e.json", help="the summary of bench_e2e.py")
    parser.add_argument("--out", help="the figure (default: the JSON's name with .png)")
    args = parser.parse_args(argv)
    rows = json.loads(Path(args.json).read_text())["rows"]
    plot(rows, Path(args.out or Path(args.json).with_suffix(".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
