"""Result files of the benchmarks: the header every result JSON carries (command, machine, date, commit), the
run folder it belongs in under ``samples/results/``, and the book text the benchmarks read.

A header's ``command`` is a list of argv strings (``["python", "samples/bench_e2e.py", "--shape", ...]``), with
the values of options that name machine paths replaced by placeholders (``MODEL_DIR``), so a result file names
no path of the machine that wrote it.
"""

from __future__ import annotations

import datetime
import json
import platform
import re
import subprocess
import sys
from pathlib import Path

#: the repository root (``samples/locks_bench/`` is two levels below it)
ROOT = Path(__file__).resolve().parents[2]
#: where the current summary files and the run folders live
RESULTS = ROOT / "samples" / "results"
#: the CPU feature that decides which CPU kernels run, strongest first (``/proc/cpuinfo`` flag, label)
CPU_CLASSES = (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))


def cpu_class(flags: set[str]) -> str:
    """The strongest of AMX, AVX-512, AVX2 among ``/proc/cpuinfo`` ``flags``; ``"other"`` when none."""
    return next((label for flag, label in CPU_CLASSES if flag in flags), "other")


def machine() -> dict:
    """What ran: ``kind`` (``"gpu"`` or ``"cpu"``), ``name`` (the GPU's name, else the CPU model), ``cpu`` (the CPU
    model), ``cpu_class`` (AMX, AVX-512, AVX2), ``cpus`` (logical CPUs) and ``gpus`` (visible CUDA devices)."""
    import os

    model, flags = platform.processor() or platform.machine(), set()
    try:
        info = Path("/proc/cpuinfo").read_text()
        model = re.search(r"^model name\s*:\s*(.+)$", info, re.M).group(1).strip()
        flags = set(re.search(r"^flags\s*:\s*(.+)$", info, re.M).group(1).split())
    except (OSError, AttributeError):
        pass
    out = {"kind": "cpu", "name": model, "cpu": model, "cpu_class": cpu_class(flags), "cpus": os.cpu_count(),
           "gpus": 0}
    try:
        import torch

        if torch.cuda.is_available():
            out.update(kind="gpu", name=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count())
    except ImportError:
        pass
    return out


def commit() -> str | None:
    """The short commit of the checkout this package runs from (``+`` appended when files differ from it); None
    outside a git checkout."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout

    try:
        head = git("rev-parse", "--short=7", "HEAD").strip()
        dirty = git("status", "--porcelain", "--untracked-files=no").strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+" if dirty else "")


def command(script: str, argv: list[str] | None = None, placeholders: dict[str, str] | None = None) -> list[str]:
    """The command line as argv strings: ``["python", "samples/<script>", *argv]`` with the value of each option
    in ``placeholders`` (``{"--model": "MODEL_DIR"}``; ``{name}`` in a placeholder is the file name) replaced, and
    absolute paths given to ``--out`` / ``--out-dir`` / ``--json`` replaced by ``OUT``. Any other absolute path is
    written relative to the repository when it lies inside it, else as its file name alone: a result names no
    folder of the machine it ran on. ``argv`` defaults to ``sys.argv[1:]``."""
    placeholders = {**{o: "OUT" for o in ("--out", "--out-dir", "--json")}, **(placeholders or {})}
    words, previous = [], None
    for word in sys.argv[1:] if argv is None else argv:
        word = str(word)
        if previous in placeholders and (Path(word).is_absolute() or placeholders[previous] != "OUT"):
            word = placeholders[previous].format(name=Path(word).name)
        elif Path(word).is_absolute():
            path = Path(word)
            word = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
        words.append(word)
        previous = word if word.startswith("--") else None
    return ["python", f"samples/{script}", *words]


def header(script: str, argv: list[str] | None = None, placeholders: dict[str, str] | None = None) -> dict:
    """``{"command", "machine", "date", "commit"}`` of a result file (date: ISO, seconds)."""
    return {"command": command(script, argv, placeholders), "machine": machine(),
            "date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit()}


def run_folder(head: dict) -> str:
    """The run folder's name of a result with header ``head``: ``<date>_<gpu-or-cpu>_<commit>``
    (``2026-12-03_gpu_74b1d58``); ``unknown`` for a missing commit."""
    kind = head["machine"]["kind"] if isinstance(head.get("machine"), dict) else "cpu"
    sha = (head.get("commit") or "unknown").rstrip("+")
    return f"{str(head['date'])[:10]}_{kind}_{sha}"


def write_result(path: str | Path, data: dict) -> Path:
    """Write ``data`` as indented JSON (a trailing newline), creating the folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def command_text(cmd: list[str] | str) -> str:
    """One shell line of a header's ``command`` (older result files hold a string: returned as it is)."""
    import shlex

    return cmd if isinstance(cmd, str) else " ".join(shlex.quote(w) for w in cmd)


def read_prose(path: str | Path) -> str:
    """Text of the book, without a Project Gutenberg header/footer if the file has one."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    start = re.search(r"\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG[^\n]*\n", text, re.IGNORECASE)
    if start:
        text = text[start.end():]
    end = re.search(r"\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG", text, re.IGNORECASE)
    return (text[: end.start()] if end else text).lstrip()


def first_tokens(tokenizer, text: str, n: int) -> list[int]:
    """The first ``n`` token ids of ``text`` (no special tokens), tokenizing only a generous prefix.

    Raises:
        SystemExit: the text has fewer than ``n`` tokens."""
    chars = 8 * n
    while True:
        ids = tokenizer(text[:chars], add_special_tokens=False)["input_ids"]
        if len(ids) > n or chars >= len(text):
            break
        chars *= 2
    if len(ids) < n:
        raise SystemExit(f"text has only {len(ids)} tokens, need {n}")
    return ids[:n]


def log(message: str) -> None:
    """One progress line on stdout, with the time of day (``[HH:MM:SS] message``), flushed."""
    import time

    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)
