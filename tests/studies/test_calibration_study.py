"""The calibration study (``locks_studies.calibration``): where it reads a capture, what one head's measurement
holds (the flat scan's mass once ``c`` covers every superpage, recall in ``[0, 1]``), and how a table is judged."""

import pytest
import torch

from locks_engine import LocksConfig
from locks_engine.ops.calibration import CALIBRATION_CHOICES
from locks_studies import calibration as cal
from locks_studies.fidelity import DecodeSteps


def test_runs_put_the_prompt_queries_just_before_each_decode_run():
    runs = cal.calibration_runs(4096, steps=8, runs=2, prompt=16)
    assert len(runs) == 2
    for prompt, decode in runs:
        assert len(prompt) == 16 and len(decode) == 8 and prompt[-1] + 1 == decode[0]
        assert decode == list(range(decode[0], decode[0] + 8))
    assert runs[0][1][-1] == 4095
    positions = cal.capture_positions([4096, 2048], steps=8, runs=2, prompt=16)
    assert positions == sorted(set(positions)) and len(positions) == 4 * 24
    with pytest.raises(ValueError, match="do not fit"):
        cal.calibration_runs(64, steps=8, runs=1, prompt=64)


def _steps(seed=0, pages=16 * 6, prompt=4, decode=3):
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(pages * 16, 32, generator=gen)
    positions = torch.arange(pages * 16 - prompt - decode, pages * 16)
    return DecodeSteps(keys, torch.randn(len(positions), 2, 32, generator=gen), positions)


def test_one_head_measures_recall_mass_and_scan_per_c():
    steps = _steps()
    cfgs = [LocksConfig(budget=16 * 4), LocksConfig(budget=16 * 40)]
    out = cal.measure_head(steps, 4, cfgs, (2, 4), cal.head_cache(steps.keys))
    small, large = out[16 * 4], out[16 * 40]
    assert set(small["prompt_recall"]) == {2, 4}
    for entry in (small, large):
        for key in ("decode_recall", "mass", "mass_min", "scanned"):
            assert len(entry[key]) == len(CALIBRATION_CHOICES)
        assert all(0 <= r <= 1 for r in entry["decode_recall"] + entry["prompt_recall"][4])
    # 40 pages of budget at c >= 4: every superpage is a candidate, the flat scan's selection and mass
    n = len(CALIBRATION_CHOICES)
    assert large["decode_recall"] == [1.0] * n and large["mass"] == [large["mass_flat"]] * n
    # 4 pages at c = 4: one superpage and the forced ones read, fewer summaries than the flat scan
    assert small["scanned"][0] < 1.0 and small["scanned"] == sorted(small["scanned"])


def test_a_table_is_judged_by_its_layers_entries():
    entry = lambda flat, masses: {"mass_flat": flat, "mass_flat_min": flat - 0.1, "mass": masses,  # noqa: E731
                                  "mass_min": [m - 0.2 for m in masses], "scanned": [0.1, 0.2, 0.4, 0.8, 1.0],
                                  "prompt_recall": {16: [0.9, 0.95, 0.99, 1.0, 1.0]}}
    recs = {(0, 0): entry(0.99, [0.9, 0.95, 0.97, 0.99, 0.99]), (1, 0): entry(0.98, [0.98] * 5)}
    got = cal.evaluate_table(recs, [0, 4], layers=2, heads=1)
    assert got["mass_mean"] == pytest.approx((0.99 + 0.98) / 2) and got["scanned_share"] == pytest.approx(0.55)
    assert got["worst_layer"] == 1 and got["worst_step"] == pytest.approx(0.78)
    assert cal.rule_table(recs, 2, 1, 16, 0.94) == [8, 8] and cal.rule_table(recs, 2, 1, 16, 0.999) == [32, 32]


def test_a_rule_with_a_lower_capacity_reads_the_first_of_the_measured_choices():
    entry = {"prompt_recall": {16: [0.9, 0.95, 0.97, 0.98, 1.0]}}
    recs = {(0, 0): entry, (0, 1): entry}
    measured = (4, 8, 16, 32, 64)
    assert cal.rule_table(recs, 1, 2, 16, 0.99, measured) == [64]  # only the flat-capable c reaches 0.99
    assert cal.rule_table(recs, 1, 2, 16, 0.99, (4, 8, 16, 32), measured) == [32]  # capped: the largest
    assert cal.rule_table(recs, 1, 2, 16, 0.96, (4, 8, 16, 32), measured) == [16]
    with pytest.raises(ValueError, match="not all among"):
        cal.rule_table(recs, 1, 2, 16, 0.99, (4, 128), measured)


def test_a_measurement_at_c_64_holds_one_entry_per_choice():
    steps = _steps()
    out = cal.measure_head(steps, 4, [LocksConfig(budget=16 * 4)], (4,), cal.head_cache(steps.keys),
                           (4, 8, 16, 32, 64))[16 * 4]
    assert len(out["mass"]) == len(out["prompt_recall"][4]) == 5
    assert out["scanned"] == sorted(out["scanned"])
