"""samples/score_sass.py: the static sm_90 compile of the score kernel (needs triton, no GPU)."""

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
    # dot1 drops the lo half of the coefficient contraction: fewer instructions than dot
    assert dot1["sass_instructions"] < dot["sass_instructions"]


def test_fast_log2_is_one_mufu_instruction():
    """The page log-sum-exp's log2 as ``lg2.approx`` (MUFU.LG2) instead of ``tl.log2``'s polynomial: fewer
    instructions for the same kernel."""
    fast, slow = (score_sass.analyse(16, 16, "dot1t", fast_math=f) for f in (True, False))
    assert fast["mufu_lg2"] > 0 and slow["mufu_lg2"] == 0
    assert fast["sass_instructions"] < slow["sass_instructions"]


def test_unknown_path_is_a_one_line_error(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["score_sass.py", "--paths", "fastest"])
    assert score_sass.main() == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown coefficient path(s) fastest") and "\n" not in err
