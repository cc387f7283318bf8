"""samples/score_sass.py: the static sm_90 compile of the score kernel (needs triton, no GPU)."""

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("compiling for sm_90 needs Triton's compiler, not its interpreter", allow_module_level=True)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "samples"))

import score_sass  # noqa: E402


def test_counts_registers_and_instructions_and_orders_the_paths():
    dot, dot1 = (score_sass.analyse(16, 16, path) for path in ("dot", "dot1"))
    for row in (dot, dot1):
        assert 0 < row["registers"] <= 255 and row["sass_instructions"] > 100
        assert row["warp_instr_per_page_head"] == round(row["sass_instructions"] * 4 / 16, 1)
        assert sum(row["top"].values()) <= row["sass_instructions"]
        # the line table names the kernel's own source lines, and counts no more than the whole
        assert any(where.startswith("score.py:") for where, _, _ in row["by_line"])
        assert sum(n for _, n, _ in row["by_line"]) <= row["sass_instructions"]
    # dot1 drops the lo half of the coefficient contraction: fewer instructions than dot
    assert dot1["sass_instructions"] < dot["sass_instructions"]


def test_rows_record_the_ptx_switch_and_write_as_json(tmp_path, monkeypatch):
    """A row says whether the inline PTX was on (a bool, not the temporary file's path), and ``--json`` writes."""
    out = tmp_path / "rows.json"
    monkeypatch.setattr(sys, "argv", ["score_sass.py", "--groups", "16", "--tiles", "16", "--paths", "dot1t",
                                      "--json", str(out)])
    assert score_sass.main() == 0
    rows = json.loads(out.read_text())
    assert [r["ptx"] for r in rows] == [True] and rows[0]["coef_path"] == "dot1t"


def test_fast_log2_is_one_mufu_instruction():
    """The page log-sum-exp's log2 as ``lg2.approx`` (MUFU.LG2) instead of ``tl.log2``'s polynomial: fewer
    instructions for the same kernel."""
    fast, slow = (score_sass.analyse(16, 16, "dot1t", ptx=f) for f in (True, False))
    assert fast["mufu_lg2"] > 0 and slow["mufu_lg2"] == 0
    assert fast["sass_instructions"] < slow["sass_instructions"]


def test_fast_int8_to_fp16_leaves_the_conversion_units_alone():
    """``half`` converts the int8 basis and coefficients to fp16 four at a time with integer and fp16x2 arithmetic
    on the GPU: no I2F (quarter rate) left, fewer instructions than with ``.to(tl.float16)``."""
    fast, slow = (score_sass.analyse(4, 16, "half", ptx=f) for f in (True, False))
    assert fast["i2f"] == 0 < slow["i2f"]
    assert fast["sass_instructions"] < slow["sass_instructions"]


def test_persistent_kernel_pipelines_its_loads_through_shared_memory():
    """With 2 stages Triton's pipeliner issues the next tile's loads as cp.async (LDGSTS) into shared memory; with 1
    there is nothing in flight and no LDGSTS. Neither spills."""
    piped, plain = (score_sass.analyse(16, 16, "dot1t", persistent=True, stages=s) for s in (2, 1))
    assert piped["ldgsts"] > 0 == plain["ldgsts"]
    assert piped["spill_stores_bytes"] == 0 == plain["spill_stores_bytes"]
    assert piped["shared_bytes"] > plain["shared_bytes"]
    # the loop body alone: fewer instructions a page-head than the whole kernel; the grid kernel has no loop
    assert 0 < piped["loop_warp_instr_per_page_head"] < piped["warp_instr_per_page_head"]
    assert score_sass.analyse(16, 16, "dot1t")["loop_warp_instr_per_page_head"] is None
    # a register cap is honoured (spilling if it must)
    capped = score_sass.analyse(16, 16, "dot1tc", persistent=True, stages=2, maxnreg=96)
    assert capped["registers"] <= 96 and capped["maxnreg"] == 96
    with pytest.raises(ValueError, match="paths only"):
        score_sass.analyse(16, 16, "dot", persistent=True)


def test_unknown_path_is_a_one_line_error(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["score_sass.py", "--paths", "fastest"])
    assert score_sass.main() == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown coefficient path(s) fastest") and "\n" not in err


def test_instructions_by_line_follow_the_line_marks():
    listing = "\n".join([
        '\t//## File "/x/kernels/score.py", line 12',
        "        /*0010*/                   IMAD R1, R2, R3, R4 ;",
        "        /*0020*/              @!P0 IMAD R1, R2, R3, R4 ;",
        '\t//## File "/x/triton/language/standard.py", line 170',
        "        /*0030*/                   FMNMX R5, R5, R6, !PT ;",
    ])
    assert score_sass.instructions_by_line(listing, 5) == [["score.py:12", 2, {"IMAD": 2}],
                                                            ["standard.py:170", 1, {"FMNMX": 1}]]
