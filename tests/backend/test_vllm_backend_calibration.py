"""``candidates="auto"`` through the real builder and impl (CPU path): each layer calibrates its ``c`` once per
prompt, from the longest prefill row's last queries of its last chunk, at the start of the next step
(``locks_engine.vllm_backend.calibration``), decodes as a hand-given table of that ``c`` would, and a hand-given
table wins."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")

from locks_engine.config import LocksConfig  # noqa: E402
from locks_engine.ops.calibration import (  # noqa: E402
    CALIBRATION_CHOICES, candidate_recall, pick_candidates, with_margin,
)
from locks_engine.ops.superpages import superpage_config  # noqa: E402
import tests.backend.test_vllm_backend_scenarios as scenarios  # noqa: E402
from tests.backend.test_vllm_backend_scenarios import BLOCK_SIZE, D, H, Batch, Run, platform  # noqa: E402,F401

#: prefill 2047, 1499 and 511 tokens, then one decode token each; the last prefill row (511 tokens, 31 pages) is the
#: one calibrated on
LONG = Batch([2048, 1500, 512], [1, 1, 1])
CFG = LocksConfig(budget=96, selection="two-level")


@pytest.fixture(autouse=True)
def _cache_for_long_rows(monkeypatch):
    monkeypatch.setattr(scenarios, "NUM_BLOCKS", 140)


def test_auto_is_the_default_and_a_hand_table_wins() -> None:
    assert CFG.candidates == "auto" and CFG.calibrated
    run = Run(LONG, replace(CFG, candidates=(4,)), torch.float32)
    run.prefill_context()
    assert run.impl.calibration is None


@pytest.mark.parametrize("threshold", [0.0, None], ids=["any-c", "default"])
def test_auto_calibrates_from_the_prompt_last_queries(threshold, monkeypatch) -> None:
    import locks_engine.vllm_backend.calibration as calibration

    if threshold is not None:
        monkeypatch.setattr(calibration, "CALIBRATION_THRESHOLD", threshold)
    run = Run(LONG, CFG, torch.float32)
    assert run.impl.calibration is None  # made with the summary store
    run.prefill_context()
    cal = run.impl.calibration
    assert cal.c == CALIBRATION_CHOICES[-1], "calibrated at the next step, once the prompt is known complete"
    row = max(range(len(LONG.seq_lens)), key=LONG.seq_lens.__getitem__)  # the longest prompt calibrates
    n = LONG.seq_lens[row] - 1
    picked = _expected_c(run, row, n, cal.threshold)
    expected = with_margin(picked, margin=cal.margin)  # the engine takes one step above the rule's pick
    if threshold == 0.0:
        assert picked == CALIBRATION_CHOICES[0]  # every c reaches 0: the smallest, not the capacity
        assert expected == CALIBRATION_CHOICES[1]
    out = run.scenario_step()
    assert cal.c == expected
    assert int(cal.live) == superpage_config(CFG, expected).budget_pages
    hand = Run(LONG, replace(CFG, candidates=(expected,)), torch.float32)
    hand.prefill_context()
    assert torch.equal(out, hand.scenario_step())


def _expected_c(run: Run, row: int, n: int, threshold: float) -> int:
    """The ``c`` the rule picks from row ``row``'s queries at positions ``[n - 16, n)`` over its first ``n``
    tokens."""
    lens = torch.arange(n - 15, n + 1, dtype=torch.int32)
    table = run.block_table[row:row + 1].expand(16, -1).cpu()
    recall = candidate_recall(run.q[row][n - 16 : n], run.impl._store, run.impl._superpages, table, lens, H, CFG,
                              BLOCK_SIZE, scale=D**-0.5)
    return pick_candidates(recall, threshold=threshold)


def test_a_chunked_prompt_calibrates_once_from_its_last_chunk(monkeypatch) -> None:
    """A prompt prefilled in chunks: each chunk's stash is dropped when the next step goes on prefilling the same
    row, and the prompt's last chunk is calibrated once, at the start of the first decode step, from that chunk's
    last queries."""
    from locks_engine.vllm_backend.calibration import LayerCalibration

    calls = []
    calibrate = LayerCalibration.calibrate
    monkeypatch.setattr(LayerCalibration, "calibrate", lambda self, p, *a: calls.append(p.seq_len) or
                        calibrate(self, p, *a))
    run = Run(Batch([2049], [1]), CFG, torch.float32, seed=3)
    for end, query in ((700, 700), (1400, 700), (2047, 647)):
        run._run([end], [query])
    assert calls == [], "every chunk went on: nothing calibrated yet"
    cal = run.impl.calibration
    expected = with_margin(_expected_c(run, 0, 2047, cal.threshold), margin=cal.margin)
    run._run([2048], [1])
    assert calls == [2047] and cal.c == expected
    assert run.builder.calibration.calibrated == 1 and not run.builder.calibration.pending
    run._run([2049], [1])
    assert calls == [2047], "decode steps stash nothing"


def test_a_prompt_within_the_budget_leaves_c() -> None:
    run = Run(Batch([80, 64], [1, 1]), CFG, torch.float32)
    run.prefill_context()
    assert run.impl.calibration.c == CALIBRATION_CHOICES[-1]


def test_auto_on_cuda_reads_c_as_data(platform: str, monkeypatch) -> None:
    """The CUDA path scores the prompt with the kernels, keeps ``c`` on the device, and decodes at the capacity
    with that ``c`` as data as a hand-given table of it decodes."""
    import locks_engine.vllm_backend.calibration as calibration

    if platform != "cuda":
        pytest.skip("the CUDA path's calibration (the CPU path's: the tests above)")
    monkeypatch.setattr(calibration, "CALIBRATION_THRESHOLD", 0.0)
    run = Run(LONG, CFG, torch.float32, device="cuda")
    run.prefill_context()
    cal = run.impl.calibration
    out = run.scenario_step()
    assert cal.c == with_margin(CALIBRATION_CHOICES[0]) and cal.live.is_cuda
    assert int(cal.live) == superpage_config(CFG, cal.c).budget_pages
    hand = Run(LONG, replace(CFG, candidates=(cal.c,)), torch.float32, device="cuda")
    hand.prefill_context()
    assert torch.equal(out, hand.scenario_step())
