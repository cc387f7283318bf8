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


def test_every_group_size_times_the_defaults_with_and_without_inline_ptx_and_persistent(bench):
    from locks_kernels.score_tuning import GRID_PATH, PERSISTENT_PATHS, default_tuning

    persistent = set()
    for groups, variants in bench.VARIANTS.items():
        plain = {(p, tp, nw) for p, tp, nw, ptx, progs, _, _ in variants if not ptx and not progs}
        with_ptx = {(p, tp, nw) for p, tp, nw, ptx, progs, _, _ in variants if ptx and not progs}
        assert plain and plain <= with_ptx
        path, tile, programs = default_tuning(groups, "colwise8")
        timed = {(p, tp, progs, st) for p, tp, nw, ptx, progs, st, cap in variants if ptx and nw == 4 and not cap}
        assert (path, tile, programs, 2) in timed and (GRID_PATH[path], tile, 0, 0) in timed
        # the persistent kernel's paths (all of them over the group sizes), and those only there
        persistent |= {p for p, _, _, _, progs, _, _ in variants if progs}
        assert not {p for p, _, _, _, progs, _, _ in variants if not progs} & set(PERSISTENT_PATHS[2:])
        # a register cap only where there is a persistent kernel to cap
        assert all(progs for *_, progs, _, cap in variants if cap)
    assert persistent == set(PERSISTENT_PATHS)


def test_fastest_persistent_variant_is_a_five_field_tuning(bench):
    """A persistent variant's label (``... pN sM``) becomes ``PATH,TILE,WARPS,PROGRAMS_PER_SM,STAGES``, which
    ``score_tuning`` reads back."""
    name = bench.label("dot1t", 16, 4, True, 3, 2)
    assert name == "dot1t tp16 w4 p3 s2" and bench.label("halft", 8, 4, False, 0, 0) == "halft tp8 w4 plain"
    row = {"ms": {"dot1t tp16 w4": 0.100, name: 0.070}}
    assert bench.fastest_tuning(row, "dot1t tp16 w4") == "dot1t,16,4,3,2"
    # a capped variant adds the cap at which its programs fit an SM (5 programs of 4 warps: 96 registers)
    capped = bench.label("dot1tc", 16, 4, True, 5, 2, True)
    assert capped == "dot1tc tp16 w4 p5 s2 cap"
    row["ms"][capped] = 0.060
    assert bench.fastest_tuning(row, "dot1t tp16 w4") == "dot1tc,16,4,5,2,96"
