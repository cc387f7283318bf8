"""The two-level selection through the real builder and impl (``LocksConfig(selection="two-level")``), on the CPU
path and, with a GPU, the CUDA path: superpages built by prefill and by the decode that completes one, fewer
summaries scanned than the flat scan, the output depending on the selected pages only, and with every superpage a
candidate the flat scan's answer."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")

from locks_engine.config import LocksConfig  # noqa: E402
from locks_engine.stats import StatsRing  # noqa: E402
import tests.backend.test_vllm_backend_scenarios as scenarios  # noqa: E402
from tests.backend.test_vllm_backend_scenarios import (  # noqa: E402,F401
    BLOCK_SIZE, H, Batch, Run, assert_close, assert_unread_pages_change_nothing, device_of, platform,
)

#: decode rows across superpage boundaries: 2048 and 512 tokens (their decode tokens complete superpages 7 and 1)
LONG = Batch([2048, 1500, 512], [1, 1, 1])


@pytest.fixture(autouse=True)
def _cache_for_long_rows(monkeypatch):
    monkeypatch.setattr(scenarios, "NUM_BLOCKS", 140)  # 127 blocks of 32 tokens, block 0 reserved


def _cfg(selection: str, candidates: int = 1, budget: int = 96) -> LocksConfig:
    return LocksConfig(budget=budget, selection=selection, candidates=(candidates,))


def _run(tmp_path, cfg: LocksConfig, platform: str, name: str):
    path = tmp_path / f"{name}.bin"
    run = Run(LONG, cfg, torch.float32, stats_path=path, device=device_of(platform))
    run.prefill_context()
    out = run.scenario_step()
    return run, out, StatsRing(path).latest()[0]


def test_two_level_scans_fewer_summaries_and_reads_only_the_selected_pages(tmp_path, platform: str) -> None:
    flat_run, flat, flat_rec = _run(tmp_path, _cfg("flat"), platform, "flat")
    run, first, record = _run(tmp_path, _cfg("two-level"), platform, "two")
    assert torch.isfinite(first).all()
    assert record["pages_read"] == flat_rec["pages_read"]  # the same budget
    # flat: every complete page of every row; two-level: the chosen superpages' pages + 1/16 centroids
    assert flat_rec["summaries_read"] == H * sum(n // 16 for n in LONG.seq_lens)
    assert 0 < record["summaries_read"] < flat_rec["summaries_read"] * 0.7
    assert record["bytes_read"] < flat_rec["bytes_read"]
    # NaN in every page no KV head read changes nothing
    per_bin = int(StatsRing(tmp_path / "two.bin").header["pages_per_bin"])
    assert_unread_pages_change_nothing(run, record, per_bin, first)


def test_superpages_are_built_by_prefill_and_by_the_decode_that_completes_one(tmp_path, platform: str) -> None:
    run, _, _ = _run(tmp_path, _cfg("two-level"), platform, "build")
    superpages, store = run.impl._superpages.cpu().float(), run.impl._store
    centroids = store.centroid.cpu().float()
    ppb = BLOCK_SIZE // 16
    for row, n in enumerate(LONG.seq_lens):
        for u in range(n // 16 // 16):  # every complete superpage; row 0's superpage 1 by the decode step
            ids = [int(run.block_table[row, j // ppb]) * ppb + j % ppb for j in range(16 * u, 16 * u + 16)]
            assert torch.allclose(superpages[ids[-1]], centroids[ids].mean(0), atol=2e-3), (row, u)
            assert superpages[ids[-1]].abs().sum() > 0


def test_two_level_with_every_superpage_a_candidate_answers_as_the_flat_scan(tmp_path, platform: str) -> None:
    _, flat, _ = _run(tmp_path, _cfg("flat"), platform, "flat")
    _, two, _ = _run(tmp_path, _cfg("two-level", candidates=64), platform, "wide")
    assert_close("two-level, every superpage", flat, two, 1e-4)


def test_a_per_layer_table_needs_an_entry_for_the_layer(tmp_path) -> None:
    cfg = LocksConfig(budget=96, selection="two-level", candidates=(0, 4))
    run = Run(LONG, cfg, torch.float32)
    assert run.impl.candidates(cfg, "model.layers.1.self_attn.attn") == 4
    assert run.impl.candidates(cfg, "model.layers.0.self_attn.attn") == 4  # cached per layer instance
    other = Run(LONG, cfg, torch.float32).impl
    assert other.candidates(cfg, "model.layers.0.self_attn.attn") == 0
    with pytest.raises(ValueError, match="none for layer 7"):
        Run(LONG, cfg, torch.float32).impl.candidates(cfg, "model.layers.7.self_attn.attn")


def test_a_per_layer_table_must_fit_the_model() -> None:
    from locks_engine.vllm_backend.builder import check_candidates

    table = LocksConfig(selection="two-level", candidates=(4, 0, 8))
    check_candidates(table, 3)
    check_candidates(table, 0)  # no model loaded: nothing to check
    check_candidates(LocksConfig(selection="two-level", candidates=(4,)), 30)
    check_candidates(LocksConfig(selection="flat", candidates=(4, 0)), 30)  # flat: the table is not used
    with pytest.raises(ValueError, match="3 entries for a model of 30 attention layers"):
        check_candidates(table, 30)
