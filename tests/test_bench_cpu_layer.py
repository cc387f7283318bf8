"""``samples/bench_cpu_layer.py`` runs end to end on a small case and writes what it printed."""

from __future__ import annotations

import json

import pytest

from tests.helpers import load_sample_script


def _bench():
    return load_sample_script("bench_cpu_layer")


def test_small_case_writes_every_op_per_thread_count(tmp_path, capsys):
    out = tmp_path / "layer.json"
    argv = ["--context", "1000", "--budget", "256", "--threads", "1", "--iters", "2", "--json", str(out)]
    assert _bench().main(argv) == 0
    data = json.loads(out.read_text())
    [row] = data["rows"]
    # 1,000 tokens in 128-token blocks: 8 blocks of 8 pages; a 256-token budget reads 16 of them
    assert (row["threads"], row["pages"], row["selected_pages"]) == (1, 64, 16)
    assert all(row[k] > 0 for k in ("score_ms", "select_ms", "attend_ms", "layer_ms"))
    assert data["command"].startswith("python samples/bench_cpu_layer.py --context 1000")
    assert "score" in capsys.readouterr().out


def test_bad_shapes_are_refused():
    with pytest.raises(SystemExit) as exited:
        _bench().main(["--q-heads", "8", "--kv-heads", "3"])
    assert exited.value.code == 2
