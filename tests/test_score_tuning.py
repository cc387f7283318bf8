"""The score kernel's tuning (``locks_kernels.score_tuning``): the override's parsing and how arguments, override and
measured defaults combine. Plain Python: runs without triton or a GPU."""

import pytest
import torch

from locks_kernels.score_tuning import TUNING_ENV, register_cap, resolve_tuning, score_tuning


def test_score_tuning_override_from_the_environment(monkeypatch):
    monkeypatch.delenv(TUNING_ENV, raising=False)
    assert score_tuning() == (None, None, None, None, None, None)  # unset: default_tuning decides
    monkeypatch.setenv(TUNING_ENV, "broadcast")
    assert score_tuning() == ("broadcast", None, None, None, None, None)
    monkeypatch.setenv(TUNING_ENV, "direction, 32,8")
    assert score_tuning() == ("direction", 32, 8, None, None, None)
    monkeypatch.setenv(TUNING_ENV, "dot1t,16,4,3")
    assert score_tuning() == ("dot1t", 16, 4, 3, None, None)
    monkeypatch.setenv(TUNING_ENV, "halft,16,4,0,3")
    assert score_tuning() == ("halft", 16, 4, 0, 3, None)
    monkeypatch.setenv(TUNING_ENV, "dot1tc,16,4,5,2,96")
    assert score_tuning() == ("dot1tc", 16, 4, 5, 2, 96)
    for bad in ("fastest", "dot,0", "dot,16,0", "dot,16,4,2,0", "dot,16,4,2,2,256", "dot,16,4,2,2,0,1", "dot,x",
                "dot,16,4,-1"):
        monkeypatch.setenv(TUNING_ENV, bad)
        with pytest.raises(ValueError, match="expected PATH"):
            score_tuning()


def test_tuning_resolution_picks_the_persistent_kernel_for_small_batches(monkeypatch):
    """Defaults: the persistent kernel with the shifted log-sum-exp while every (KV head, sequence) gets >= 2
    programs, else the grid kernel with the unshifted path; a path alone runs in the grid kernel (unless only the
    persistent kernel has it); the environment fills what the arguments leave out."""
    monkeypatch.delenv(TUNING_ENV, raising=False)
    cpu = torch.device("cpu")  # 4 SMs stand-in: 16 programs
    assert resolve_tuning(16, "colwise8", 1, 2, cpu) == ("dot1tc", 16, 4, 4, 2, None)
    assert resolve_tuning(4, "colwise8", 2, 4, cpu) == ("halftc", 16, 4, 5, 2, None)  # 20 // 8 = 2 programs each
    assert resolve_tuning(4, "colwise8", 3, 4, cpu) == ("halft", 16, 4, 0, 2, None)  # 20 // 12 = 1 program each
    assert resolve_tuning(16, "colwise8", 1, 2, cpu, coef_path="dot1t") == ("dot1t", 16, 4, 0, 2, None)
    assert resolve_tuning(16, "colwise8", 1, 2, cpu, coef_path="halftc") == ("halftc", 16, 4, 4, 2, None)
    assert resolve_tuning(16, "colwise8", 1, 2, cpu, programs_per_sm=0) == ("dot1t", 16, 4, 0, 2, None)
    assert resolve_tuning(4, "chanlog", 1, 2, cpu) == ("dot1", 16, 4, 0, 2, None)
    monkeypatch.setenv(TUNING_ENV, "halft,8,4,5,3")
    assert resolve_tuning(16, "colwise8", 1, 2, cpu) == ("halft", 8, 4, 5, 3, None)
    assert resolve_tuning(16, "colwise8", 1, 2, cpu, tile_pages=16, programs_per_sm=0) == ("halft", 16, 4, 0, 3, None)
    monkeypatch.setenv(TUNING_ENV, "halftc,16,4,6,2,80")
    assert resolve_tuning(4, "colwise8", 1, 8, cpu) == ("halftc", 16, 4, 6, 2, 80)
    assert resolve_tuning(4, "colwise8", 1, 8, cpu, max_registers=96)[-1] == 96


def test_register_cap_fits_the_programs_an_sm():
    """The cap at which N programs fit an SM's 65,536 registers, in ptxas' steps of 8, at most 255."""
    assert [register_cap(p, 4) for p in (1, 2, 4, 5, 6, 8)] == [255, 255, 128, 96, 80, 64]
    assert register_cap(2, 8) == 128 and register_cap(7, 4) == 72


def test_lse_partials_switch_from_the_environment(monkeypatch):
    from locks_kernels.score_tuning import LSE_PARTIALS, LSE_PARTIALS_ENV, use_lse_partials

    monkeypatch.delenv(LSE_PARTIALS_ENV, raising=False)
    assert use_lse_partials() is LSE_PARTIALS
    for value, expected in (("1", True), (" 0 ", False)):
        monkeypatch.setenv(LSE_PARTIALS_ENV, value)
        assert use_lse_partials() is expected
    monkeypatch.setenv(LSE_PARTIALS_ENV, "yes")
    with pytest.raises(ValueError, match="LOCKS_LSE_PARTIALS='yes': expected 1 or 0"):
        use_lse_partials()
