"""A session as a Markdown transcript (questions, answers, page citations, statistics), and its export file."""

from __future__ import annotations

import re
import time
from pathlib import Path

from locks_chat.attention import attention_text
from locks_chat.citations import UNSUPPORTED_TEXT
from locks_chat.errors import LocksChatError, escape_breaks
from locks_chat.loop_guard import FINISH_REASON, STOPPED_TEXT
from locks_chat.paths import data_dir
from locks_chat.sampling import sampling_text
from locks_chat.sessions import SessionInfo, Turn

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
    # a cancelled turn keeps only its attention setting: no count was made, so none is shown
    parts = [f"{stats['generated_tokens']} tokens"] if "generated_tokens" in stats else []
    if stats.get("ttft_ms") is not None:
        parts.append(f"TTFT {stats['ttft_ms'] / 1000:.1f} s")
    if stats.get("tpot_ms") is not None:
        parts.append(f"TPOT {stats['tpot_ms']:.0f} ms")
    if stats.get("decode_steps"):
        parts.append(f"read {stats['kv_pages_read_fraction']:.0%} of KV pages")
        if stats.get("tail_mass_share") is not None:
            parts.append(f"tail {stats['tail_mass_share']:.0%} of the estimated mass")
    if attention := attention_text(stats):
        parts.append(attention)
    if sampling := sampling_text(stats.get("sampling"), "short"):
        parts.append(sampling)
    return " · ".join(parts)


def stopped_text(stats: dict) -> str:
    """``stopped: the answer repeated itself`` for a turn the loop guard stopped (``locks_chat.loop_guard``), else
    ``""``."""
    stopped = stats.get("finish_reason") == FINISH_REASON
    return f"stopped: {STOPPED_TEXT}" if stopped else ""


#: control characters but line feed and tab: in a transcript printed to a terminal they would be obeyed (an escape
#: sequence in a stored answer recolours or retitles the terminal; a carriage return overwrites a line)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with its control characters but line feeds and tabs shown escaped (``\\x1b``)."""
    return _CONTROLS.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def render_transcript(session: SessionInfo, turns: list[Turn]) -> str:
    """The whole conversation as Markdown; what the model or a file name put there cannot drive the terminal: the
    title, path and questions are kept to their line (``escape_breaks``), the answers' control characters escaped."""
    pages = f" (pages {escape_breaks(session.pages)})" if session.pages else ""
    lines = [f"# {escape_breaks(session.title)}{pages}", "", f"Document: `{escape_breaks(session.doc_path)}`  ",
             f"SHA-256: `{session.doc_hash}`", ""]
    for number, turn in enumerate(turns, 1):
        lines += [f"## Q{number}. {escape_breaks(turn.question)}", "", printable(turn.answer.strip()) or "*(no answer)*",
                  ""]
        if turn.status in _STATUS_NOTE:
            lines += [_STATUS_NOTE[turn.status], ""]
        elif stopped := stopped_text(turn.stats):
            lines += [f"*({stopped})*", ""]
        if turn.stats.get("supported") is False:
            lines += [f"**{UNSUPPORTED_TEXT}**", ""]
        if turn.citations:
            lines += [f"Cited: {citation_text(turn.citations)}", ""]
        if turn.stats:
            lines += [f"<sub>{turn_stats_text(turn.stats)}</sub>", ""]
    return "\n".join(lines).rstrip() + "\n"


def export_transcript(session: SessionInfo, turns: list[Turn], directory: Path | None = None) -> Path:
    """Write the transcript to ``exports/<title>-<time>.md`` in the user data directory; returns the path.

    Raises:
        LocksChatError: the folder or the file cannot be written (a file in the folder's place, no permission,
            a full disk); nothing is left behind.
    """
    directory = directory or data_dir() / "exports"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", session.title).strip("-")[:60] or "session"
    path = directory / f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}.md"
    number = 1
    while path.exists():
        number += 1
        path = directory / f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}-{number}.md"
    written = False
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with path.open("x", encoding="utf-8") as out:
            written = True
            out.write(render_transcript(session, turns))
    except OSError as err:
        if written:
            path.unlink(missing_ok=True)
        reason = err.strerror or type(err).__name__
        raise LocksChatError(f"cannot write the transcript to {directory} ({reason}); make it a writable folder "
                             f"or free space, then /export again") from None
    return path
