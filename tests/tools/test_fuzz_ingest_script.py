"""The fuzzing script's bookkeeping (``samples/tools/fuzz_ingest.py``): counts per kind, the run folder, and a worker
that hangs or dies is restarted with the inputs it still had."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from locks_tools.fuzz_run import Tally, Worker
from tests.support.paths import REPO

SCRIPT = REPO / "samples" / "tools" / "fuzz_ingest.py"


def load_script():
    spec = importlib.util.spec_from_file_location("fuzz_ingest", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_small_run_writes_counts_and_a_manifest(tmp_path):
    load_script().main(["-n", "9", "--seed", "3", "--out", str(tmp_path), "--kinds", "text-markdown", "pdf-mutated"])
    (folder,) = tmp_path.iterdir()
    result = json.loads((folder / "fuzz_ingest.json").read_text())
    assert result["inputs"] == 9 and result["totals"]["inputs"] == 9
    assert {k: v["inputs"] for k, v in result["per_kind"].items()} == {"pdf-mutated": 5, "text-markdown": 4}
    for counts in result["per_kind"].values():
        answered = counts["loaded"] + sum(counts["errors"].values())
        assert answered + counts["hangs"] + counts["crashes"] == counts["inputs"]
    assert result["totals"]["problems"] == result["totals"]["hangs"] == result["totals"]["crashes"] == 0
    assert (folder / result["slowest"]["file"]).is_file() and "/" not in result["slowest"]["outcome"].split(":")[0]
    manifest = (folder / "MANIFEST.md").read_text()
    assert "python samples/tools/fuzz_ingest.py -n 9 --seed 3 --out OUT" in manifest


def test_a_hanging_worker_is_counted_and_restarted(tmp_path):
    worker = Worker(hang_s=0.0, memory_limit_gib=4.0)
    tally = Tally(tmp_path)
    (tmp_path / "failures").mkdir()
    for index in range(3):
        for done in worker.submit((index, "text-markdown", b"some text %d" % index, "doc.txt", None)):
            tally.add(*done)
    for done in worker.drain():
        tally.add(*done)
    worker.close()
    counts = tally.kinds["text-markdown"]
    assert counts["inputs"] == 3 and counts["hangs"] == 3 and counts["loaded"] == 0
    assert [f["failure"] for f in tally.failures] == ["hang"] * 3
    assert all((tmp_path / f["file"]).read_bytes().startswith(b"some text") for f in tally.failures)
