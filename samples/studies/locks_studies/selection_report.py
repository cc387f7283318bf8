"""The selection-cost study's outputs: the bytes-against-mass figure, the Markdown tables and the layer-overlap
summary (``selection_study`` rows)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from locks_studies import selection_cost as sc

FAMILY_STYLE = {  # family: (colour, marker)
    "reference": ("0.4", "x"), "baseline": ("black", "s"), "fused": ("0.3", "D"), "lean": ("tab:green", "v"),
    "two-level": ("tab:blue", "o"), "reuse-steps": ("tab:orange", "^"), "reuse-layers": ("tab:purple", "P"),
    "combo": ("tab:red", "*"), "adaptive": ("tab:brown", "h"),
}


def overlap_summary(overlap: torch.Tensor, anchors: dict[int, list[int]]) -> dict:
    """Top-K overlap between layers `[L, L]` (``overlap[a, l]``: share of layer ``l``'s chosen pages that layer
    ``a`` chooses too): the next layer's, every pair's, the full matrix (2 decimals) and the anchors chosen."""
    layers = overlap.shape[0]
    nxt = torch.tensor([overlap[i, i + 1].item() for i in range(layers - 1)])
    off = overlap[~torch.eye(layers, dtype=torch.bool)]
    return {"next_layer_mean": round(nxt.mean().item(), 3), "next_layer_min": round(nxt.min().item(), 3),
            "next_layer_max": round(nxt.max().item(), 3), "next_layer": [round(v, 3) for v in nxt.tolist()],
            "any_pair_mean": round(off.mean().item(), 3), "anchors": {str(k): v for k, v in anchors.items()},
            "matrix": [[round(v, 2) for v in row] for row in overlap.tolist()]}


def table(rows: list[dict], context: int, budget: float) -> str:
    """Markdown table of every candidate at one context and budget."""
    sel = [r for r in rows if r["context"] == context and r["budget_frac"] == budget]
    if not sel:
        return ""
    k = next((r["budget_pages"] for r in sel if r["budget_pages"]), "?")
    lines = [f"Context {context:,} tokens ({sel[0]['pages']:.0f} pages), budget {budget:.0%} ({k} pages):", "",
             "| candidate | bytes % (D=64) | bytes % (D=128) | pages read | summaries read | mass median | "
             "mass mean | worst layer mean (layer) |", "|---|---|---|---|---|---|---|---|"]
    for r in sel:
        lines.append(f"| {r['candidate']} | {r['bytes_pct_d64']:.2f} | {r['bytes_pct_d128']:.2f} | "
                     f"{r['pages_read']:.1f} | {r['summaries_read']:.0f} | {r['mass_median']:.4f} | "
                     f"{r['mass_mean']:.4f} | {r['mass_worst_layer_mean']:.4f} ({r['worst_layer']}) |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], context: int, budget: float, path: Path, dim: int = 64) -> Path:
    """Bytes per step (x, % of dense K+V at head dim ``dim``) against mass kept / oracle (y): mean (left) and worst
    layer's mean (right), every candidate but the oracle, numbered, at one context and budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    sel = [r for r in rows if r["context"] == context and r["budget_frac"] == budget and r["candidate"] != "oracle"]
    fig = plt.figure(figsize=(15, 6.2))
    grid = fig.add_gridspec(1, 3, width_ratios=(1, 1, 0.42))
    axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])]
    for ax, key, title in ((axes[0], "mass_mean", "mean"), (axes[1], "mass_worst_layer_mean", "worst layer's mean")):
        for family, (colour, marker) in FAMILY_STYLE.items():
            pts = [r for r in sel if r["family"] == family]
            ax.scatter([r[f"bytes_pct_d{dim}"] for r in pts], [r[key] for r in pts], c=colour, marker=marker,
                       s=34, label=family, zorder=3)
        for i, r in enumerate(sel, 1):
            ax.annotate(str(i), (r[f"bytes_pct_d{dim}"], r[key]), fontsize=6.5, xytext=(3, 2),
                        textcoords="offset points")
        ax.axhline(0.99 if key == "mass_mean" else 0.95, color="0.5", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(ScalarFormatter())
        ax.tick_params(axis="x", which="minor", labelsize=6)
        ax.set_xlabel(f"bytes read per decode step, % of dense K+V (D = {dim}, bf16)")
        ax.set_ylabel(f"attention mass kept / exact-LSE oracle ({title})")
        ax.set_title(f"{title}; dashed: issue 27's gate ({0.99 if key == 'mass_mean' else 0.95})", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7, loc="lower right")
    key = fig.add_subplot(grid[0, 2])
    key.axis("off")
    key.text(0, 1, "\n".join(f"{i:>2}  {r['candidate']}" for i, r in enumerate(sel, 1)), va="top", fontsize=7,
             family="monospace", transform=key.transAxes)
    k = next((r["budget_pages"] for r in sel if r["budget_pages"]), "?")
    fig.suptitle(f"Selection cost against fidelity: Qwen2.5-Coder-0.5B, {context:,} tokens, budget {budget:.0%} "
                 f"({k} pages), 24 layers x 2 KV heads, consecutive decode steps", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def projected_bytes(candidate: dict, tokens: int, budget: int = 2048, dim: int = 128, page_size: int = 16,
                    layers: int = 24) -> float:
    """Bytes per step, % of dense K+V, of a candidate (a row's fields) projected to a long context by
    ``selection_cost.step_bytes``: ``P = tokens / B`` pages, ``K = budget / B`` read, a two-level scan reading
    ``ceil(c K / SP)`` superpages and half a superpage of tail, a flat scan every page. Bytes only: the mass kept
    at that context is not measured here. Scores are taken as fused (no round trip)."""
    pages, k = tokens / page_size, budget / page_size
    if candidate["coarse"]:
        sp = candidate["superpage"]
        scored = min(pages, math.ceil(candidate["candidate_pages"] * k / sp) * sp + sp / 2)
        coarse, coarse_b = pages / sp, sc.coarse_bytes(candidate["coarse"], dim, sp, page_size)
    else:
        scored, coarse, coarse_b = pages, 0, 0
    summary = sc.page_bytes(candidate["summary"], candidate["rank"], dim, page_size, candidate["superpage"])
    share = min(candidate["anchors"] or layers, layers) / layers
    kv_page = 2 * page_size * dim * 2
    total = sc.step_bytes(scored, coarse, k, summary, coarse_b, kv_page, candidate["interval"], share)
    return 100 * total / (pages * kv_page)


def projections(rows: list[dict], context: int, budget_frac: float, shapes: dict[str, int]) -> dict:
    """``projected_bytes`` of every candidate measured at ``context`` and ``budget_frac`` (a layer-adaptive row:
    the mean over its layers' choices) at each of ``shapes`` (name: tokens), budget 2048, D = 128."""
    sel = {r["candidate"]: r for r in rows if r["context"] == context and r["budget_frac"] == budget_frac}
    out = {}
    for name, row in sel.items():
        if row["summary"] in ("oracle", "window"):
            continue
        choice = list(row["layer_choice"].values()) if "layer_choice" in row else None
        out[name] = {shape: round(sum(projected_bytes(sel[c], tokens) for c in choice) / len(choice) if choice
                                  else projected_bytes(row, tokens), 2) for shape, tokens in shapes.items()}
    return out
