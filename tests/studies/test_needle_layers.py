"""The needle-keeping two-level table (``locks_bench.candidates.keep_needle_table``) and the script's refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from locks_bench.candidates import keep_needle_table
from tests.support.paths import REPO as ROOT



def test_keep_needle_table_takes_the_cheapest_c_that_keeps_the_flat_retention():
    flat = [0.5, 0.9, 0.2, 0.0]
    uniform = {4: [0.5, 0.1, 0.0, 0.0], 16: [0.5, 0.86, 0.1, 0.0], 32: [0.5, 0.9, 0.16, 0.0]}
    assert keep_needle_table(flat, uniform, None, 0.0) == [4, 32, 0, 4]
    assert keep_needle_table(flat, uniform, None, 0.05) == [4, 16, 32, 4]
    # a floor raises c and keeps its flat layers flat; a layer no c keeps stays flat
    assert keep_needle_table(flat, uniform, (8, 32, 4, 0), 0.0) == [8, 32, 0, 0]


def test_script_refuses_bad_input_with_one_line(tmp_path):
    book = tmp_path / "book.txt"
    book.write_text("words " * 100)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"num_hidden_layers": 4}')
    cases = [(["--model", str(tmp_path / "none"), "--books", str(book)], "not a directory"),
             (["--model", str(model), "--books", str(tmp_path / "missing.txt")], "missing.txt"),
             (["--model", str(model), "--books", str(book), "--budget-frac", "0"], "--budget-frac"),
             (["--model", str(model), "--books", str(book), "--table", "4,x"], "candidates '4,x'"),
             (["--model", str(model), "--books", str(book), "--table", "4,8"], "the model has 4 layers"),
             (["--model", str(model), "--books", str(book), "--uniform", "0,4"], "--uniform"),
             (["--model", str(model), "--books", str(book), "--tolerance", "-1"], "--tolerance"),
             (["--model", str(tmp_path), "--books", str(book)], "config.json")]
    for args, needle in cases:
        out = subprocess.run([sys.executable, str(ROOT / "samples" / "studies" / "needle_layers.py"), *args],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert out.returncode == 2, out.stderr
        assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_named_tables_and_their_stretch_to_another_depth():
    from locks_bench.candidates import KEEP_NEEDLE_CANDIDATES, parse_candidates, stretch

    assert parse_candidates("keep-needle") == KEEP_NEEDLE_CANDIDATES and len(KEEP_NEEDLE_CANDIDATES) == 24
    assert parse_candidates("4,0,32") == (4, 0, 32)
    # layer i takes entry i * len // layers: each entry repeated, the order kept
    assert stretch((8, 0, 32), 6) == (8, 8, 0, 0, 32, 32)
    assert stretch((8, 0, 32, 4), 2) == (8, 32)
    assert stretch((4,), 40) == (4,) and stretch((1, 2), 2) == (1, 2)
    stretched = stretch(KEEP_NEEDLE_CANDIDATES, 32)
    assert len(stretched) == 32 and stretched.count(0) == 4 and set(stretched) == set(KEEP_NEEDLE_CANDIDATES)


def test_table_mean_weighs_each_c_by_its_layers():
    from locks_bench.candidates import table_mean

    row = {"flat_ms": 0.120, "flat_bytes_pct": 18.0,
           "two_level": {4: {"ms": 0.060, "bytes_pct": 0.5}, 32: {"ms": 0.080, "bytes_pct": 1.5}}}
    mean = table_mean(row, [0, 4, 4, 32])
    assert abs(mean["ms"] - (0.120 + 0.060 * 2 + 0.080) / 4) < 1e-12
    assert abs(mean["bytes_pct"] - (18.0 + 1.0 + 1.5) / 4) < 1e-12 and mean["layers"] == 4
    import pytest

    with pytest.raises(KeyError):
        table_mean(row, [16])
