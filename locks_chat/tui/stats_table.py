"""``/stats``: every answer of the session in a Markdown table, and LOCKS against dense side by side."""

from __future__ import annotations

from locks_chat.attention import attention_text
from locks_chat.sampling import sampling_text
from locks_chat.sessions import Turn
from locks_chat.tui.widgets.memory_panel import human_bytes


def _row(number: int, turn: Turn) -> str:
    s = turn.stats
    ttft = f"{s['ttft_ms'] / 1000:.1f} s" if s.get("ttft_ms") is not None else "-"
    tpot = f"{s['tpot_ms']:.0f} ms" if s.get("tpot_ms") is not None else "-"
    read = f"{s.get('kv_pages_read_fraction', 0):.0%}" if s.get("decode_steps") else "-"
    # most read first (turns saved before the shares were kept: by the steps that read each page)
    most = sorted(s.get("document_pages_read", []), key=lambda p: -p.get("share", p["steps"]))[:4]
    pages = ", ".join(p["page"] for p in most) or "-"
    mode = attention_text(s, "-", short=True)
    return f"| {number} | {mode} | {s.get('generated_tokens', 0)} | {ttft} | {tpot} | {read} | {pages} |"


def stats_markdown(turns: list[Turn]) -> str:
    """The table of answered turns, then one line per attention setting (the A/B comparison), then one per
    sampling the answers were made with (turns saved before it was kept: none)."""
    answered = [(n, t) for n, t in enumerate(turns, 1) if t.stats]
    if not answered:
        return "**Statistics**: no answer yet in this session."
    lines = [
        "**Statistics** of this session's answers",
        "",
        "| # | attention | tokens | TTFT | TPOT | KV read | pages most read |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [_row(n, t) for n, t in answered]
    by_mode: dict[str, list[dict]] = {}
    for _, turn in answered:
        by_mode.setdefault(attention_text(turn.stats, "-"), []).append(turn.stats)
    lines.append("")
    for mode, stats in by_mode.items():
        tpots = [s["tpot_ms"] for s in stats if s.get("tpot_ms") is not None]
        read = sum(s.get("kv_bytes_read", 0) for s in stats)
        dense = sum(s.get("kv_bytes_dense", 0) for s in stats)
        steps = max(1, sum(s.get("decode_steps", 0) for s in stats))
        tpot = f"{sum(tpots) / len(tpots):.0f} ms" if tpots else "-"
        share = f"{read / dense:.0%}" if dense else "-"
        lines.append(f"- **{mode}**: {len(stats)} answers, mean TPOT {tpot}, KV bytes read {share} of dense "
                     f"({human_bytes(read / steps)} of {human_bytes(dense / steps)} per token)")
    by_sampling: dict[str, list[str]] = {}
    for number, turn in answered:
        if text := sampling_text(turn.stats.get("sampling"), "short"):
            by_sampling.setdefault(text, []).append(str(number))
    for text, numbers in by_sampling.items():
        lines.append(f"- sampling **{text}**: answer{'s' if len(numbers) > 1 else ''} {', '.join(numbers)}")
    return "\n".join(lines)
