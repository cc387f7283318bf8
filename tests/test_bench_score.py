"""samples/bench_score.py's bookkeeping (the timing itself needs a GPU)."""

import pytest

from tests.helpers import load_sample_script


@pytest.fixture(scope="module")
def bench():
    return load_sample_script("bench_score")


def test_fastest_tuning_names_a_faster_variant_and_never_a_plain_one(bench):
    """A variant more than 10% faster than the default is proposed as ``PATH,TILE,WARPS``; one within 10% is not;
    the ``plain`` variants (no inline PTX) are a measurement, never a tuning."""
    row = {"ms": {"half tp16 w4": 0.40, "half tp16 w4 plain": 0.20, "dot1t tp32 w4": 0.31, "dot tp32 w4": None}}
    assert bench.fastest_tuning(row, "half tp16 w4") == "dot1t,32,4"
    row["ms"]["half tp16 w4"] = 0.33
    assert bench.fastest_tuning(row, "half tp16 w4") == ""


def test_every_group_size_times_the_defaults_with_and_without_inline_ptx(bench):
    for groups, variants in bench.VARIANTS.items():
        plain = {(p, tp, nw) for p, tp, nw, ptx in variants if not ptx}
        with_ptx = {(p, tp, nw) for p, tp, nw, ptx in variants if ptx}
        assert plain and plain <= with_ptx
