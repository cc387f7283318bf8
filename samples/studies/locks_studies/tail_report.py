"""The tail-estimate study's table and its one figure, a hand-written SVG line chart (no plotting library)."""

from __future__ import annotations

import math
from html import escape

#: series of the figure: (label, design-name pattern with {f} for the fixed fraction or {p} for the level, colour)
SERIES = (
    ("top-k (today)", "fixed-{f}", "#444444"),
    ("oracle top-k", "oracle-{f}", "#aaaaaa"),
    ("top-k + tail (int8)", "fixed-{f}+est-int8", "#1f77b4"),
    ("top-k + half-page tail (int8)", "fixed-{f}+half", "#ff7f0e"),
    ("top-k + tail, fitted shrink", "fixed-{f}+fit", "#17becf"),
    ("mass-sized", "mass-{p}", "#d62728"),
    ("mass-sized + tail (int8)", "mass-{p}+est-int8", "#2ca02c"),
    ("mass-sized + half-page tail (int8)", "mass-{p}+half", "#9467bd"),
)


def series_points(rows: dict, pattern: str, fractions: list[float], levels: list[float]) -> list[tuple[float, float]]:
    """(bytes %, err) of every design of one series, sorted by bytes."""
    keys = ([pattern.format(f=f"{f * 100:g}%") for f in fractions] if "{f}" in pattern
            else [pattern.format(p=f"p{p:g}") for p in levels])
    pts = [(rows[k]["bytes"] * 100, rows[k]["err"]) for k in keys if k in rows]
    return sorted(pts)


def svg_chart(panels: list[tuple[str, dict[str, list[tuple[float, float]]]]], colours: dict[str, str],
              title: str, width: int = 300, height: int = 230) -> str:
    """An SVG of line charts side by side, log-scale y (one panel per ``(title, {label: [(x, y)]})``), shared
    legend below. Returns the SVG text."""
    ys = [y for _, s in panels for pts in s.values() for _, y in pts if y > 0]
    xs = [x for _, s in panels for pts in s.values() for x, _ in pts]
    ticks = [m * 10.0 ** e for e in range(-6, 3) for m in (1, 2, 5)]  # 1-2-5 ticks of the log axis
    y_ticks = [t for t in ticks if max(t for t in ticks if t <= min(ys)) <= t <= min(t for t in ticks if t >= max(ys))]
    y_lo, y_hi = math.log10(y_ticks[0]), math.log10(y_ticks[-1])
    x_lo, x_hi = math.floor(min(xs) / 5) * 5.0, math.ceil(max(xs) / 5) * 5.0
    x_hi = max(x_hi, x_lo + 5)
    ml, mt, pw, ph = 46, 34, width - 60, height - 70
    columns = max(2, len(panels))
    legend_h = 16 * math.ceil(len(colours) / columns) + 10
    total_w, total_h = width * len(panels), height + legend_h
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{total_h}" font-family="sans-serif" '
           f'font-size="10"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="{total_w / 2}" y="14" text-anchor="middle" font-size="12">{escape(title)}</text>']

    def px(x: float, off: int) -> float:
        return off + ml + (x - x_lo) / (x_hi - x_lo) * pw

    def py(y: float) -> float:
        return mt + ph - (math.log10(y) - y_lo) / max(y_hi - y_lo, 1e-9) * ph

    for i, (name, series) in enumerate(panels):
        off = i * width
        out.append(f'<text x="{off + ml + pw / 2}" y="{mt - 6}" text-anchor="middle">{escape(name)}</text>')
        out.append(f'<rect x="{off + ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
        for t in y_ticks:
            y = py(t)
            out.append(f'<line x1="{off + ml}" x2="{off + ml + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                       f'<text x="{off + ml - 3}" y="{y + 3:.1f}" text-anchor="end">{t:g}</text>')
        for x in range(int(x_lo), int(x_hi) + 1, 5):
            out.append(f'<text x="{px(x, off):.1f}" y="{mt + ph + 12}" text-anchor="middle">{x}</text>')
        out.append(f'<text x="{off + ml + pw / 2}" y="{mt + ph + 26}" text-anchor="middle">'
                   f'bytes read per step, % of dense K+V</text>')
        if i == 0:
            out.append(f'<text x="10" y="{mt + ph / 2}" transform="rotate(-90 10 {mt + ph / 2})" '
                       f'text-anchor="middle">relative L2 error of the attention output</text>')
        for label, pts in series.items():
            pts = [(x, y) for x, y in pts if y > 0]
            if not pts:
                continue
            path = " ".join(f"{px(x, off):.1f},{py(y):.1f}" for x, y in pts)
            c = colours[label]
            out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="1.5"/>')
    for j, (label, c) in enumerate(colours.items()):
        x, y = 20 + (j % columns) * total_w / columns, height + 8 + 16 * (j // columns)
        out.append(f'<line x1="{x}" x2="{x + 18}" y1="{y}" y2="{y}" stroke="{c}" stroke-width="2"/>'
                   f'<text x="{x + 24}" y="{y + 4}">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def figure(results: dict, fractions: list[float], levels: list[float]) -> str:
    """The study's figure: one panel per context, every ``SERIES`` line."""
    panels = []
    for context, res in results.items():
        series = {label: series_points(res["designs"], pat, fractions, levels) for label, pat, _ in SERIES}
        panels.append((f"{int(context):,} prompt tokens ({res['pages']} pages)", series))
    return svg_chart(panels, {label: c for label, _, c in SERIES},
                     "Qwen2.5-Coder-0.5B, mean over 24 layers: output error against bytes read")


#: table columns: (header, key, format)
COLUMNS = (("design", None, "{}"), ("pages", "pages", "{:.1f}"), ("bytes %", "bytes", "{:.1%}"),
           ("err", "err", "{:.4f}"), ("err worst layer", "err_worst_layer", "{1:.3f} (L{0})"),
           ("err answer run", "err_answer", "{:.4f}"), ("mass kept", "kept", "{:.3f}"),
           ("kept worst layer", "kept_worst_layer", "{1:.3f} (L{0})"), ("needle read", "needle", "{:.3f}"),
           ("needle read where attended", "needle_attended", "{:.3f}"), ("tail bias", "tail_bias", "{:+.2f}"))


def table(rows: dict, names: list[str] | None = None) -> list[str]:
    """Markdown table of ``rows`` (``tail_study.reduce``'s output), in ``names``' order (default: all)."""
    lines = ["| " + " | ".join(h for h, _, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name in names or list(rows):
        if name not in rows:
            continue
        r = rows[name]
        cells = []
        for _, key, fmt in COLUMNS:
            if key is None:
                cells.append(name)
            elif r.get(key) is None:
                cells.append("")
            else:
                v = r[key]
                cells.append(fmt.format(*v) if isinstance(v, list) else fmt.format(v))
        lines.append("| " + " | ".join(cells) + " |")
    return lines
