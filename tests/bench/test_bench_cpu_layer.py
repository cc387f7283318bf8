"""``samples/bench_cpu_layer.py`` runs end to end on a small case and writes what it printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from tests.support.paths import REPO

SCRIPT = REPO / "samples" / "bench_cpu_layer.py"


def run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=300)


def test_small_case_writes_every_op_per_thread_count(tmp_path):
    out = tmp_path / "layer.json"
    argv = ["--context", "1000", "--budget", "256", "--threads", "1", "--iters", "2", "--json", str(out)]
    done = run(argv)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    [row] = data["rows"]
    # 1,000 tokens in 128-token blocks: 8 blocks of 8 pages; a 256-token budget reads 16 of them
    assert (row["threads"], row["pages"], row["selected_pages"]) == (1, 64, 16)
    assert all(row[k] > 0 for k in ("score_ms", "select_ms", "attend_ms", "layer_ms"))
    assert data["command"][:4] == ["python", "samples/bench_cpu_layer.py", "--context", "1000"]
    assert "score" in done.stdout


def test_bad_shapes_are_refused():
    assert run(["--q-heads", "8", "--kv-heads", "3"]).returncode == 2
