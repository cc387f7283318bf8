"""The worker process and the bookkeeping of ``samples/tools/fuzz_ingest.py``: inputs are loaded one at a time in a
spawned process (its address space capped), which is restarted when it hangs or dies; counts per input kind, the
slowest input and every input that broke the property (``locks_tools.fuzz_check``) are kept in a :class:`Tally`.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import resource
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path


class Worker:
    """One process that loads inputs in order; restarted after a crash or a hang."""

    def __init__(self, hang_s: float, memory_limit_gib: float) -> None:
        self.hang_s, self.limit = hang_s, int(memory_limit_gib * (1 << 30))
        self.context = multiprocessing.get_context("spawn")
        self.pending: list[tuple] = []
        self.peak_mib = 0
        self._start()

    def _start(self) -> None:
        self.conn, child = self.context.Pipe()
        self.process = self.context.Process(target=serve, args=(child, self.limit), daemon=True)
        self.process.start()
        child.close()
        self.since = time.monotonic()

    def submit(self, task: tuple):
        """Queue ``task``; yield (task, outcome dict or None, failure) for those finished meanwhile."""
        self.pending.append(task)
        self.conn.send(task)
        while len(self.pending) >= 2:
            yield from self._next()

    def drain(self):
        while self.pending:
            yield from self._next()

    def _next(self):
        task = self.pending[0]
        try:
            ready = self.conn.poll(max(0.0, self.since + self.hang_s - time.monotonic()))
            answer = self.conn.recv() if ready else None
        except (EOFError, OSError):
            ready, answer = True, None
        if answer is not None:
            self.pending.pop(0)
            self.since = time.monotonic()
            self.peak_mib = max(self.peak_mib, answer.pop("worker_peak_rss_mib"))
            yield task, answer, None
            return
        failure = "hang" if not ready else f"crash (exit code {self.process.exitcode})"
        self.process.kill()
        self.process.join()
        self.pending.pop(0)
        yield task, None, failure
        self._start()
        for again in self.pending:
            self.conn.send(again)

    def close(self) -> int:
        self.conn.send(None)
        self.process.join(10)
        return self.peak_mib


def serve(conn, limit: int) -> None:
    """The worker's loop: load each (index, kind, data, name, pages) task, answer with its outcome as a dict;
    ``None`` ends it."""
    from locks_tools.fuzz_check import load_outcome

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    with tempfile.TemporaryDirectory(prefix="fuzz-ingest-") as work:
        os.chdir(work)  # messages then name the input as "doc.pdf", not a path
        while (task := conn.recv()) is not None:
            _, _, data, name, pages = task
            path = Path(name)
            path.write_bytes(data)
            outcome = asdict(load_outcome(path, pages))
            outcome["worker_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
            conn.send(outcome)
            path.unlink()
        os.chdir("/")  # out of the folder before it is removed


class Tally:
    """Counts per kind, the slowest input, and the failing inputs saved under ``failures/``."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.total = folder, 0
        self.kinds: dict[str, dict] = defaultdict(lambda: {"inputs": 0, "loaded": 0, "errors": Counter(),
                                                            "problems": 0, "hangs": 0, "crashes": 0,
                                                            "max_rss_growth_mib": 0.0, "max_seconds": 0.0})
        self.slowest: dict = {"seconds": 0.0}
        self.failures: list[dict] = []

    def add(self, task: tuple, outcome: dict | None, failure: str | None) -> None:
        index, kind, data, name, pages = task
        counts = self.kinds[kind]
        counts["inputs"] += 1
        digest = hashlib.sha256(data).hexdigest()[:16]
        described = {"kind": kind, "index": index, "bytes": len(data), "pages": pages, "sha256_16": digest}
        if failure is not None:
            counts["hangs" if failure == "hang" else "crashes"] += 1
            self._save(data, name, digest, {**described, "failure": failure})
            return
        if outcome["status"] == "loaded":
            counts["loaded"] += 1
        else:
            counts["errors"][outcome["error"]] += 1
        counts["max_seconds"] = round(max(counts["max_seconds"], outcome["seconds"]), 3)
        growth = (outcome["rss_growth"] or 0) / (1 << 20)
        counts["max_rss_growth_mib"] = round(max(counts["max_rss_growth_mib"], growth), 1)
        if outcome["problems"]:
            counts["problems"] += 1
            self._save(data, name, digest, {**described, "status": outcome["status"], "problems": outcome["problems"]})
        if outcome["seconds"] > self.slowest["seconds"]:
            self.slowest = {**described, "seconds": round(outcome["seconds"], 3), "outcome": outcome["message"][:200],
                            "file": f"slowest_input{Path(name).suffix}"}
            (self.folder / self.slowest["file"]).write_bytes(data)

    def _save(self, data: bytes, name: str, digest: str, record: dict) -> None:
        record["file"] = f"failures/{digest}{Path(name).suffix}"
        (self.folder / record["file"]).write_bytes(data)
        self.failures.append(record)

    def summary(self) -> dict:
        totals = Counter()
        for counts in self.kinds.values():
            totals.update({k: v for k, v in counts.items() if isinstance(v, int)})
            totals.update({f"error {k}": v for k, v in counts["errors"].items()})
        kinds = {k: {**v, "errors": dict(v["errors"])} for k, v in self.kinds.items()}
        return {"inputs": self.total, "totals": dict(totals), "per_kind": kinds, "slowest": self.slowest,
                "failures": self.failures[:200]}
