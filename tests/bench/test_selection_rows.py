"""Issue 27's target table (``samples/selection_rows.py``) from small generated result files: the ratios, the
composed GLM layer, the 1M summary bytes and the verdicts, and one-line refusals of missing inputs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.paths import REPO as ROOT

SCRIPT = ROOT / "samples" / "selection_rows.py"


def load():
    spec = importlib.util.spec_from_file_location("selection_rows", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def result(backend: str, cells: list[tuple[int, int, float]]) -> dict:
    return {"backend": backend, "shape": "llama3.1-8b", "layers": 32,
            "cells": [{"context": c, "batch": b, "tpot_ms": t} for c, b, t in cells]}


@pytest.fixture
def inputs(tmp_path):
    e2e = tmp_path / "e2e"
    e2e.mkdir()
    runs = {"flash": [(131072, 1, 9.0), (262144, 1, 13.2), (131072, 6, 36.0)],
            "locks": [(131072, 1, 7.2), (262144, 1, 8.25), (131072, 6, 12.0)],
            "locks-2l": [(131072, 1, 6.0), (262144, 1, 6.0), (131072, 6, 8.0)]}
    for backend, cells in runs.items():
        (e2e / f"result-llama3.1-8b-{backend}.json").write_text(json.dumps(result(backend, cells)))
    # a skipped cell is not a measurement
    skipped = result("locks-2l", [])
    skipped["cells"] = [{"context": 524288, "batch": 1, "skipped": "time limit"}]
    (e2e / "result-llama3.1-8b-locks-2l-512k.json").write_text(json.dumps(skipped))
    row = {"shape": "glm-4-9b 1M", "context": 1 << 20, "budget": 2048, "flat_ms": 0.120, "flat_bytes_pct": 17.8,
           "dense_ms": {"sdpa-flash": 0.31, "vllm-fa3": 0.30},
           "two_level": {"4": {"ms": 0.060, "bytes_pct": 0.5}}, "table": {"ms": 0.080, "bytes_pct": 2.7, "layers": 24}}
    kernels = tmp_path / "two_level.json"
    kernels.write_text(json.dumps({"rows": [row]}))
    fit = tmp_path / "e2e.json"
    fit.write_text(json.dumps({"one_gpu_device_fits": [
        {"shape": "glm4-9b-1m", "kernels": "k1", "dense_per_layer_ms": 0.44, "locks_per_layer_ms": 0.26,
         "locks_fixed_ms": 0.4, "dense_ms_at_full_depth": 18.0}]}))
    return e2e, kernels, fit


def test_figures_and_verdicts(inputs):
    rows = load()
    e2e, kernels, fit = inputs
    found = rows.figures(rows.load_e2e(e2e), rows.kernel_row(json.loads(kernels.read_text())),
                         json.loads(fit.read_text())["one_gpu_device_fits"][0])
    assert found["llama_256k"]["two_level"] == 2.2 and found["llama_256k"]["flat"] == 1.6
    assert found["llama_128k_ms"]["two_level"] == 6.0 and found["llama_128k_x6"]["two_level"] == 4.5
    # a layer of the fit with the flat step (120 us) replaced by the table's (80 us): 0.44 / 0.22
    assert found["glm_layer"]["two_level"] == 2.0 and found["glm_layer"]["flat"] == round(0.44 / 0.26, 2)
    assert found["glm_40"]["two_level"] == round(18.0 / (0.4 + 40 * 0.22), 2)
    # summaries only: the budget's 2048 of 1M tokens (0.195%) taken out of what a step reads
    assert found["bytes_1m"]["two_level"] == round(2.7 - 100 * 2048 / (1 << 20), 2)
    assert rows.verdict("min", 2.2, 2.2) == "met" and rows.verdict("max", 6.0, 5.6) == "missed"
    assert rows.verdict("min", None, 2.5) == "not measured"
    text = rows.table_markdown(found)
    assert "| Llama-3.1-8B shapes, 256K, batch 1 | at least 2.2x | 2.2x | met | 1.6x |" in text
    assert "| Llama-3.1-8B shapes, 128K, batch 1 | at most 5.6 ms | 6.0 ms | missed | 7.2 ms |" in text


def test_script_writes_json_and_refuses_missing_inputs(inputs, tmp_path):
    e2e, kernels, fit = inputs
    out = tmp_path / "targets.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--e2e", str(e2e), "--kernels", str(kernels), "--fit",
                           str(fit), "--json", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["targets"]["llama_128k_x6"]["two_level"] == 4.5
    assert "| GLM 1M, 40 layers, extrapolated |" in done.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    no_table = tmp_path / "no_table.json"
    no_table.write_text(json.dumps({"rows": [{"shape": "glm-4-9b 1M"}]}))
    for args, message in ((["--e2e", str(empty)], "no result-*.json"),
                          (["--e2e", str(e2e), "--kernels", str(tmp_path / "none.json")], "not a file"),
                          (["--e2e", str(e2e), "--kernels", str(no_table)], "with a table")):
        done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
        assert done.returncode == 2 and message in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
