"""Processes below a test's app (vLLM's engine core and worker), read from /proc, to check none outlives it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from tests.support.paths import REPO

#: the sample document the real-engine tests ask about
SAMPLE = REPO / "samples" / "lighthouse.md"


def long_answer_command(model_dir: str) -> list[str]:
    """``locks-chat ask`` on :data:`SAMPLE` with a question whose answer streams for a while (up to 400 tokens)."""
    question = "Describe the lighthouse, its keepers and its light in as much detail as you can."
    return [sys.executable, "-m", "locks_chat.cli", "ask", str(SAMPLE), question, "--model", model_dir,
            "--budget", "256", "--max-tokens", "400"]


def engine_processes(pids: set[int]) -> set[int]:
    """Which of ``pids`` are still alive."""
    alive = set()
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive.add(pid)
        except ProcessLookupError:
            pass
    return alive


def descendants(pid: int) -> set[int]:
    """Processes below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found
