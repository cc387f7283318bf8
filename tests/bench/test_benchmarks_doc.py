"""``samples/BENCHMARKS.md`` and the README's results table match the summary JSON (``locks_bench.benchmarks_doc``);
``samples/results/INDEX.md`` matches the run folders (``locks_bench.results_index``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from locks_bench.benchmarks_doc import END, START, benchmarks_md, readme_table, rewrite_readme
from locks_bench.results_index import index_md
from tests.support.paths import REPO as ROOT

RESULTS = ROOT / "samples" / "results"


def test_committed_benchmarks_md_matches_the_json():
    assert (ROOT / "samples" / "BENCHMARKS.md").read_text() == benchmarks_md(RESULTS)


def test_committed_index_matches_the_run_folders():
    assert (RESULTS / "INDEX.md").read_text() == index_md(RESULTS)


def test_committed_readme_table_matches_the_json():
    text = (ROOT / "README.md").read_text()
    if START not in text:
        pytest.skip("README has no results markers yet")
    assert rewrite_readme(text, RESULTS) == text


def synthetic(results: Path) -> None:
    row = lambda kernels, ctx, batch, dense, locks: {  # noqa: E731
        "shape": "llama3.1-8b", "context": ctx, "batch": batch, "layers": 32, "extrapolated": False,
        "dense_tpot_ms": dense, "locks_tpot_ms": locks, "speedup": round(dense / locks, 2), "kernels": kernels}
    e2e = {"gpu": "H", "command": ["python samples/bench_e2e.py --out A", "python samples/bench_e2e.py --kernels k2"],
           "provenance": {"": {"date": "2026-01-01", "commit": "aaa", "machine": "GPU1"},
                          "k2": {"date": "2026-01-02", "commit": "k2", "machine": "GPU2"}},
           "rows": [row(None, 131072, 1, 9.0, 8.0), row("k2", 131072, 1, 9.0, 6.0), row(None, 131072, 6, 36.0, 12.0)]}
    fidelity = {"date": "2026-01-03T10:00:00", "machine": "cpu", "command": ["python", "samples/bench_fidelity.py"],
                "mass": [{"model": "m", "selector": "locks", "context": 32768, "budget_frac": 0.02, "rank": 8,
                          "mass_vs_oracle": 0.995, "mass_vs_oracle_mean": 0.99, "min_layer_mean": 0.95}],
                "needle": [{"model": "m", "context": 8192, "mode": "locks", "budget_frac": 0.05, "accuracy": 1.0,
                            "trials": 10}, {"model": "m", "context": 8192, "mode": "dense", "budget_frac": 1.0,
                            "accuracy": 0.9, "trials": 10}], "needle_command": [["python", "samples/bench_needle.py"]],
                "needle_provenance": {"8192": {"machine": {"kind": "cpu", "name": "CPU1", "cpu_class": "AVX2"},
                                               "commit": "ccc", "date": "2026-01-04T09:00:00",
                                               "command": [["python", "samples/bench_needle.py"]]}}}
    results.mkdir()
    (results / "e2e.json").write_text(json.dumps(e2e))
    (results / "fidelity.json").write_text(json.dumps(fidelity))


def test_generator_on_synthetic_json(tmp_path):
    """The latest kernels' row of a cell is the headline, with its own machine, commit, date and command."""
    results = tmp_path / "results"
    synthetic(results)
    table = readme_table(results)
    assert table[0] == "| result | LOCKS | baseline | ratio | machine | commit | date | command |"
    first, batched, mass, needle = table[2:]
    assert "| 6.00 ms | 9.00 ms | **1.50x** | GPU2 | k2 | 2026-01-02 | `python samples/bench_e2e.py --kernels k2` |" in first
    assert "x 6 sequences: TPOT (flat scan, summary format `None`) | 12.00 ms | 36.00 ms | **3.00x** | GPU1 | aaa | " \
        "2026-01-01" in batched
    assert "median 0.995, mean 0.990, worst layer 0.950 |  | - | cpu |  | 2026-01-03 | `python samples/bench_fidelity.py`" in mass
    assert "Needle in 8,192 tokens, m | 10/10 at 5% of pages | dense 9/10 | - | CPU1 (AVX2) | ccc | 2026-01-04 |" in needle
    readme = f"# Title\n\n{START}\nold\n{END}\n\nafter\n"
    new = rewrite_readme(readme, results)
    assert new.startswith(f"# Title\n\n{START}\n| result") and new.endswith(f"{END}\n\nafter\n")
    assert rewrite_readme(new, results) == new
    with pytest.raises(ValueError, match="markers"):
        rewrite_readme("# no markers\n", results)
    doc = benchmarks_md(results)
    assert "## End to end in vLLM" in doc and "## Needle in a haystack" in doc


def test_the_default_selection_heads_the_table_and_a_one_window_glm_fit_stays_out(tmp_path):
    """``e2e_default.json`` (the default selection) gives its own rows, named, before the flat scan's; its batched
    cell is whatever batch it measured; a GLM fit whose profiles counted a prefill step and a calibration as decode
    (``decode_only`` false) makes no headline row."""
    results = tmp_path / "results"
    synthetic(results)
    e2e = json.loads((results / "e2e.json").read_text())
    fit = {"locks_per_layer_ms": 0.36, "dense_per_layer_ms": 0.53, "per_layer_ratio": 1.46, "kernels": "k3"}
    rows = [{**r, "summary_format": "colwise8"} for r in e2e["rows"]]
    default = {**e2e, "rows": [r for r in rows if r["batch"] == 1] + [{**rows[2], "batch": 3}],
               "one_gpu_device_fits": [{**fit, "decode_only": False}]}
    (results / "e2e_default.json").write_text(json.dumps(default))
    table = readme_table(results)
    labels = [line.split(" | ")[0] for line in table[2:]]
    assert labels[:3] == ["| Llama-3.1-8B shapes, 128K, batch 1: TPOT (default: two-level, `c` calibrated)",
                          "| Llama-3.1-8B shapes, 128K x 3 sequences: TPOT (default: two-level, `c` calibrated)",
                          "| Llama-3.1-8B shapes, 128K, batch 1: TPOT (flat scan, summary format `None`)"]
    assert not any("GLM" in label for label in labels)
    default["one_gpu_device_fits"] = [{**fit, "decode_only": True}]
    (results / "e2e_default.json").write_text(json.dumps(default))
    glm = [line for line in readme_table(results) if "GLM" in line]
    assert len(glm) == 1 and "(default: two-level, `c` calibrated) | 0.360 ms | 0.530 ms | **1.46x**" in glm[0]
    assert "## End to end in vLLM, the default selection" in benchmarks_md(results)
    # the README keeps the current rows: the flat scan's end-to-end rows only in BENCHMARKS.md's headline
    readme = rewrite_readme(f"{START}\n{END}\n", results)
    assert "(flat scan" not in readme and "(default: two-level" in readme and "Needle in 8,192" in readme
    assert "(flat scan" in "\n".join(readme_table(results))


def test_index_rows_come_from_each_folders_files(tmp_path):
    """A folder with a manifest: its scripts and first sentence, a figure from a known result kind; a folder without
    one still gets a row from its files."""
    results = tmp_path / "results"
    run = results / "2026-01-05_gpu_abc1234"
    run.mkdir(parents=True)
    (run / "MANIFEST.md").write_text("# 2026-01-05_gpu_abc1234\n\nThe **app's engine** at 128K. More text.\n")
    (run / "result-app-locks.json").write_text(json.dumps({
        "command": ["python", "samples/bench_app_engine.py"], "config": "locks", "contexts": [
            {"context": 131072, "tpot_ms": 6.25}, {"context": 262144, "tpot_ms": 6.291}]}))
    bare = results / "2026-01-06_cpu_def5678"
    (bare / "sub").mkdir(parents=True)
    (bare / "fuzz_ingest.json").write_text(json.dumps({
        "command": ["python", "samples/tools/fuzz_ingest.py"], "per_kind": {},
        "totals": {"inputs": 1000, "problems": 0, "hangs": 1, "crashes": 0}}))
    (results / "e2e.json").write_text("{}")
    lines = index_md(results).splitlines()
    rows = [line for line in lines if line.startswith("| [")]
    assert rows == [
        "| [2026-01-05_gpu_abc1234](2026-01-05_gpu_abc1234/) | `bench_app_engine.py`; The app's engine at 128K. | "
        "app-locks TPOT 128K 6.25 ms, 256K 6.29 ms | `MANIFEST.md`, `result-app-locks.json` |",
        "| [2026-01-06_cpu_def5678](2026-01-06_cpu_def5678/) | `tools/fuzz_ingest.py` | "
        "1,000 inputs: 0 problems, 1 hangs, 0 crashes | `fuzz_ingest.json`, `sub/` |"]


def test_check_exits_1_on_a_stale_file(tmp_path):
    import subprocess
    import sys

    results = tmp_path / "results"
    synthetic(results)
    readme = tmp_path / "README.md"
    readme.write_text(f"{START}\n{END}\n")
    args = [sys.executable, str(ROOT / "samples" / "make_benchmarks.py"), "--results", str(results),
            "--benchmarks", str(tmp_path / "B.md"), "--readme", str(readme)]
    assert subprocess.run([*args, "--check"], capture_output=True).returncode == 1
    assert subprocess.run(args, capture_output=True).returncode == 0
    assert subprocess.run([*args, "--check"], capture_output=True).returncode == 0
    (results / "2026-01-07_cpu_0000000").mkdir()
    stale = subprocess.run([*args, "--check"], capture_output=True, text=True)
    assert stale.returncode == 1 and "INDEX.md differs" in stale.stderr


def test_the_hand_kept_ruler_tables_close_benchmarks_md(tmp_path):
    assert "## RULER" not in benchmarks_md(tmp_path)
    (tmp_path / "RULER.md").write_text("| length | mean |\n|---|---|\n| 4K dense | 68.1 |\n")
    text = benchmarks_md(tmp_path)
    assert text.index("## RULER") > text.index("## Headline")
    assert text.rstrip().endswith("| 4K dense | 68.1 |")
