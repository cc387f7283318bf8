"""The command a result file records (``locks_bench.results.command``): placeholders, and no folder of the machine
that made it."""

from __future__ import annotations

from locks_bench.results import ROOT, command


def test_placeholders_and_outputs():
    argv = ["--model", "/data/models/qwen", "--out-dir", "/scratch/out", "--lengths", "8192", "--out", "rel/out"]
    assert command("bench_ruler.py", argv, {"--model": "MODEL_DIR"}) == [
        "python", "samples/bench_ruler.py", "--model", "MODEL_DIR", "--out-dir", "OUT", "--lengths", "8192",
        "--out", "rel/out"]


def test_other_absolute_paths_name_no_machine_folder():
    inside = str(ROOT / "samples" / "results" / "run" / "a.json")
    argv = ["--results", inside, "/tmp/elsewhere/b.json", "--task", "niah_multikey_3", "relative/c.json"]
    assert command("studies/ruler_failure.py", argv) == [
        "python", "samples/studies/ruler_failure.py", "--results", "samples/results/run/a.json", "b.json", "--task",
        "niah_multikey_3", "relative/c.json"]
