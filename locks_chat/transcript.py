"""A session as a Markdown transcript (questions, answers, page citations, statistics), and its export file."""

from __future__ import annotations

import re
import time
from pathlib import Path

from locks_chat.sessions import SessionInfo, Turn
from locks_chat.settings import data_dir

_STATUS_NOTE = {
    "cancelled": "*(cancelled: the answer stops here)*",
    "failed": "*(failed)*",
    "interrupted": "*(interrupted: the app stopped during this answer)*",
    "answering": "*(still being answered)*",
}


def citation_text(citations: list[dict]) -> str:
    """``p. 3, p. 7 (not in the selected pages)`` for a turn's citations."""
    parts = []
    for c in citations:
        parts.append(f"p. {c['page']}" + ("" if c.get("physical") is not None else " (not in the selected pages)"))
    return ", ".join(parts)


def turn_stats_text(stats: dict) -> str:
    """One line of a turn's statistics: tokens, TTFT, TPOT, share of KV pages read, settings."""
    if not stats:
        return ""
    parts = [f"{stats.get('generated_tokens', 0)} tokens"]
    if stats.get("ttft_ms") is not None:
        parts.append(f"TTFT {stats['ttft_ms'] / 1000:.1f} s")
    if stats.get("tpot_ms") is not None:
        parts.append(f"TPOT {stats['tpot_ms']:.0f} ms")
    if stats.get("decode_steps"):
        parts.append(f"read {stats['kv_pages_read_fraction']:.0%} of KV pages")
    if stats.get("mode"):
        parts.append(stats["mode"])
    return " · ".join(parts)


def render_transcript(session: SessionInfo, turns: list[Turn]) -> str:
    """The whole conversation as Markdown."""
    pages = f" (pages {session.pages})" if session.pages else ""
    lines = [f"# {session.title}{pages}", "", f"Document: `{session.doc_path}`  ", f"SHA-256: `{session.doc_hash}`", ""]
    for number, turn in enumerate(turns, 1):
        lines += [f"## Q{number}. {turn.question}", "", turn.answer.strip() or "*(no answer)*", ""]
        if turn.status in _STATUS_NOTE:
            lines += [_STATUS_NOTE[turn.status], ""]
        if turn.citations:
            lines += [f"Cited: {citation_text(turn.citations)}", ""]
        if turn.stats:
            lines += [f"<sub>{turn_stats_text(turn.stats)}</sub>", ""]
    return "\n".join(lines).rstrip() + "\n"


def export_transcript(session: SessionInfo, turns: list[Turn], directory: Path | None = None) -> Path:
    """Write the transcript to ``exports/<title>-<time>.md`` in the user data directory; returns the path."""
    directory = directory or data_dir() / "exports"
    directory.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", session.title).strip("-")[:60] or "session"
    path = directory / f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}.md"
    number = 1
    while path.exists():
        number += 1
        path = directory / f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}-{number}.md"
    path.write_text(render_transcript(session, turns), encoding="utf-8")
    return path
