"""Aggregation, tables and plots for ``bench_fidelity.py``.

Aggregates per (model, context, selector, rank, budget) over layers, KV heads and decode steps, one value per
selection (layer, KV head, step): ``mass_vs_oracle`` (median of the ``group_ratio``: the KV group's mean mass kept
over the oracle's, at most 1), ``mass_vs_oracle_mean``, ``min_layer_mean`` (the smallest per-layer mean). The full
results add the per-layer means, low percentiles, the same three per query head (``qhead_*``: each query head's
mass over the oracle's; its mean is pulled above 1 by heads the group-shared oracle starves), recall, output error
and the absolute mass kept.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch

KV_BYTES = 2 * 2  # K and V, bf16


def _key(row: dict) -> tuple:
    return row["model"], row["context"], row["selector"], row["rank"], row["budget_frac"]


def _ratio_stats(members: list[dict], field: str) -> tuple[torch.Tensor, dict[int, float]]:
    """All values of ``field`` pooled, and its mean per layer."""
    per_layer = defaultdict(list)
    for m in members:
        per_layer[m["layer"]].append(m[field].flatten())
    values = torch.cat([v for vs in per_layer.values() for v in vs])
    return values, {layer: torch.cat(v).mean().item() for layer, v in sorted(per_layer.items())}


def summarize(rows: list[dict], header: dict, metas: dict, args: dict) -> tuple[dict, dict]:
    """(summary in issue 8's format, full results)."""
    groups = defaultdict(list)
    for row in rows:
        groups[_key(row)].append(row)
    mass, full = [], []
    for key, members in groups.items():
        model, context, selector, rank, budget = key
        group, layer_means = _ratio_stats(members, "group_ratio")
        head, head_layer_means = _ratio_stats(members, "ratio")
        first = members[0]
        entry = {
            "model": model, "context": context, "selector": selector, "rank": rank, "budget_frac": budget,
            "mass_vs_oracle": round(group.median().item(), 4), "mass_vs_oracle_mean": round(group.mean().item(), 4),
            "min_layer_mean": round(min(layer_means.values()), 4), "bytes_per_page": int(first["bytes_per_page"]),
        }
        mass.append(entry)
        out_err = torch.cat([m["out_err"].flatten() for m in members]) if "out_err" in first else None
        kv = KV_BYTES * args["page_size"] * metas[model]["model_config"]["head_dim"]
        full.append({
            **entry,
            "used_rank": first["used_rank"], "budget_pages": first["budget_pages"],
            "summary_frac_of_kv": round(first["bytes_per_page"] / kv, 4),
            "min_layer": min(layer_means, key=layer_means.get),
            "ratio_p1": round(group.quantile(0.01).item(), 4), "ratio_p5": round(group.quantile(0.05).item(), 4),
            "qhead_median": round(head.median().item(), 4), "qhead_mean": round(head.mean().item(), 4),
            "qhead_min_layer_mean": round(min(head_layer_means.values()), 4),
            "qhead_p5": round(head.quantile(0.05).item(), 4),
            "kept_mean": round(torch.cat([m["kept"].flatten() for m in members]).mean().item(), 4),
            "oracle_kept_mean": round(torch.cat([m["oracle_kept"].flatten() for m in members]).mean().item(), 4),
            "recall_mean": round(torch.cat([m["recall"] for m in members]).mean().item(), 4),
            "out_err_median": None if out_err is None else round(out_err.median().item(), 4),
            "out_err_mean": None if out_err is None else round(out_err.mean().item(), 4),
            "out_err_p95": None if out_err is None else round(out_err.quantile(0.95).item(), 4),
            "layer_means": {str(layer): round(v, 4) for layer, v in layer_means.items()},
            "steps": group.numel(),
        })
    summary = {"date": header["date"], "command": header["command"], "machine": header["machine"],
               "mass": mass, "needle": []}
    full_doc = {**header, "settings": {k: v for k, v in args.items() if k in (
                    "contexts", "builtin_contexts", "budgets", "ranks", "steps", "page_size")},
                "captures": metas, "results": full}
    return summary, full_doc


def write_table(summary: dict, ranks: tuple[int, ...] = (0, 8)) -> str:
    """Markdown table of the summary rows at the given ranks (0: rank-free selectors)."""
    lines = ["| model | context | selector | rank | budget | median | mean | min layer | bytes/page |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in sorted(summary["mass"], key=lambda e: (e["model"], e["context"], e["budget_frac"], e["selector"], e["rank"])):
        if e["rank"] in ranks:
            lines.append(f"| {e['model']} | {e['context']} | {e['selector']} | {e['rank']} | {e['budget_frac']:.0%} | "
                         f"{e['mass_vs_oracle']:.4f} | {e['mass_vs_oracle_mean']:.4f} | {e['min_layer_mean']:.4f} | "
                         f"{e['bytes_per_page']} |")
    return "\n".join(lines)


def write_plots(full: dict, out_dir: Path) -> list[Path]:
    """Three PNGs: measures vs budget at rank 8, per-layer means at 2%, mass vs bytes at 2%."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    results = full["results"]
    cases = sorted({(r["model"], r["context"]) for r in results})
    shown = ["locks", "locks-chanlog", "locks-colwise", "locks-paper", "locks-float", "locks-colwise-hadamard",
             "shared", "shared-bytes", "quest", "window", "oracle"]
    metrics = [("mass_vs_oracle_mean", "mass / oracle, mean"), ("min_layer_mean", "mass / oracle, worst layer"),
               ("recall_mean", "recall of oracle pages"), ("out_err_median", "output rel. error, median")]
    paths = []
    fig, axes = plt.subplots(len(cases), len(metrics), figsize=(4.2 * len(metrics), 3.2 * len(cases)), squeeze=False)
    for i, (model, context) in enumerate(cases):
        for j, (metric, label) in enumerate(metrics):
            ax = axes[i][j]
            for name in shown:
                pts = sorted((r["budget_frac"], r[metric]) for r in results if r["model"] == model and
                             r["context"] == context and r["selector"] == name and r["rank"] in (0, 8))
                if pts and pts[0][1] is not None:
                    ax.plot([100 * p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
            ax.set_xscale("log")
            ax.set_xticks([1, 2, 5, 10], ["1", "2", "5", "10"])
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xlabel("budget, % of pages")
            ax.set_title(f"{model.split('-')[0]} {context // 1024}K: {label}", fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "fidelity_vs_budget.png")
    fig.savefig(paths[-1], dpi=90)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(cases), figsize=(4.5 * len(cases), 3.4), squeeze=False)
    for i, (model, context) in enumerate(cases):
        ax = axes[0][i]
        for name in shown[:-2]:
            hit = [r for r in results if r["model"] == model and r["context"] == context and r["selector"] == name
                   and r["rank"] in (0, 8) and r["budget_frac"] == 0.02]
            if hit:
                layers = sorted(hit[0]["layer_means"], key=int)
                ax.plot([int(x) for x in layers], [hit[0]["layer_means"][x] for x in layers], marker=".", label=name)
        ax.set_xlabel("layer")
        ax.set_title(f"{model.split('-')[0]} {context // 1024}K, 2% budget, r=8: mass / oracle", fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "fidelity_per_layer.png")
    fig.savefig(paths[-1], dpi=90)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(cases), figsize=(4.5 * len(cases), 3.4), squeeze=False)
    for i, (model, context) in enumerate(cases):
        ax = axes[0][i]
        for name in shown[:-2]:
            pts = sorted((r["bytes_per_page"], r["mass_vs_oracle_mean"]) for r in results if r["model"] == model
                         and r["context"] == context and r["selector"] == name and r["budget_frac"] == 0.02)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_xscale("log")
        ax.set_xticks([200, 300, 500, 1000, 2000, 3000], ["200", "300", "500", "1000", "2000", "3000"])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("summary bytes per page and KV head")
        ax.set_title(f"{model.split('-')[0]} {context // 1024}K, 2% budget: mean mass / oracle", fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "fidelity_vs_bytes.png")
    fig.savefig(paths[-1], dpi=90)
    plt.close(fig)
    return paths
