"""Engine processes of the benchmarks, seen from outside: started in a process group of their own and killed
whole, and their host time sampled by py-spy (found, and its raw samples summarized per decode step)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def run_engine_process(cmd: list[str], log, timeout: float, env: dict | None = None) -> int | str:
    """Run one engine's process in its own process group; past ``timeout`` seconds kill the whole group (vLLM's
    engine core and tensor-parallel workers too, which would otherwise keep their GPU memory and make the
    next engine fail to start). Returns the exit status, or ``"timeout"``."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # also after a normal exit: leftover workers of the group
        except ProcessLookupError:
            pass
        proc.wait()


def find_py_spy() -> str | None:
    """The ``py-spy`` executable: ``$PY_SPY``, on ``PATH``, beside this Python, or in the ``bin`` folder of a
    ``pip install --target`` directory on ``sys.path`` (how wheels are carried to the GPU machine)."""
    import shutil

    candidates = [os.environ.get("PY_SPY"), shutil.which("py-spy"), str(Path(sys.executable).parent / "py-spy")]
    candidates += [str(Path(p) / "bin" / "py-spy") for p in sys.path if p]
    return next((c for c in candidates if c and os.access(c, os.X_OK) and Path(c).is_file()), None)


def summarize_py_spy(raw: str, rate: int, steps: int, top: int = 25) -> dict:
    """py-spy ``--format raw`` lines (``process P:"cmd";...;frame;...;frame N``) to, per process (the innermost
    ``process`` entry), its busy samples as ms per decode step, the ``top`` functions by self time and by
    inclusive time (each function counted once per sample; frames in 98% or more of the process's samples, its
    entry points, left out). ``ms = samples / rate / steps * 1e3``."""
    per_process: dict[str, dict] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdecimal():
            continue
        frames = stack.split(";")
        procs = [i for i, f in enumerate(frames) if f.startswith("process ")]
        name = frames[procs[-1]] if procs else "?"
        code = [f for f in frames[(procs[-1] + 1) if procs else 0:] if f]
        entry = per_process.setdefault(name, {"samples": 0, "self": {}, "inclusive": {}})
        entry["samples"] += int(count)
        if code:
            entry["self"][code[-1]] = entry["self"].get(code[-1], 0) + int(count)
        for frame in set(code):
            entry["inclusive"][frame] = entry["inclusive"].get(frame, 0) + int(count)
    to_ms = 1e3 / rate / max(steps, 1)

    def ranked(counts: dict[str, int]) -> list[list]:
        return [[name, round(n * to_ms, 3)] for name, n in sorted(counts.items(), key=lambda kv: -kv[1])[:top]]

    def below_root(e: dict) -> dict[str, int]:
        # frames in (nearly) every sample are the process's entry points: they rank first and say nothing
        return {f: n for f, n in e["inclusive"].items() if n < 0.98 * e["samples"]}

    processes = [
        {"process": name[:160], "busy_ms_per_step": round(e["samples"] * to_ms, 3),
         "self_ms_per_step": ranked(e["self"]), "inclusive_ms_per_step": ranked(below_root(e))}
        for name, e in sorted(per_process.items(), key=lambda kv: -kv[1]["samples"])
    ]
    return {"processes": processes}
