"""The GPU machine's stage scripts (``samples/gpu_*.sh``): each parses, and an unknown stage is refused with exit
2 before anything runs (a device call that ran the wrong stage would cost minutes of device time)."""

from __future__ import annotations

import subprocess

import pytest
from tests.support.paths import REPO

SCRIPTS = sorted((REPO / "samples").glob("gpu_*.sh"))


def test_there_are_stage_scripts():
    assert {p.name for p in SCRIPTS} >= {"gpu_default_rows.sh", "gpu_calibration.sh", "gpu_selection_rows.sh"}


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_each_script_parses_and_refuses_an_unknown_stage(script, tmp_path):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    done = subprocess.run(["bash", str(script), "no-such-stage", str(tmp_path / "out")], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown stage no-such-stage" in done.stdout + done.stderr
