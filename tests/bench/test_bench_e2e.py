"""The end-to-end benchmark's bookkeeping (``locks_bench.e2e``, ``locks_bench.e2e_fit``) and its worker probes
(``locks_bench.probes``).

The benchmark itself needs a GPU; here: the pages read from the statistics records, the per-rank merge,
the summary in the issue's format, and the depth fit (per-layer slope, fixed cost, extrapolated full depth).
"""

from __future__ import annotations

import json

import pytest
import torch

from locks_bench import e2e, e2e_fit, engines
from locks_bench.probes import read_probes, start_profile, stop_profile, stop_profile_summary
from locks_engine import LocksConfig
from tests.backend.test_vllm_backend_scenarios import SCENARIOS, H, Run

ROW_KEYS = {"shape", "context", "batch", "budget", "rank", "dense_tpot_ms", "locks_tpot_ms", "dense_prefill_s",
            "locks_prefill_s", "pages_read_frac", "layers", "extrapolated"}


def test_read_probes_reads_summary_bytes() -> None:
    batch = SCENARIOS["medium_decode"]
    run = Run(batch, LocksConfig(budget=64), torch.float32)
    run.prefill_context()
    run.scenario_step()
    layer = torch.nn.Module()
    layer.impl = run.impl
    model = torch.nn.Sequential(layer)
    first = read_probes(model, reset=True)
    assert first["attention_layers"] == 1
    assert first["summary_bytes"] == run.impl._store.nbytes > 0


def test_merge_probes_adds_the_ranks_summaries() -> None:
    rank = {"eager_decode_calls": 0, "build_calls": 10, "build_s": 0.001, "summary_bytes": 100, "attention_layers": 2}
    merged = e2e.merge_probes([rank, {**rank, "build_s": 0.5}])
    assert merged["summary_bytes"] == 200
    assert merged["build_s"] == 0.001


def test_decode_pages_sums_the_decode_records() -> None:
    """Prefill-only steps (no decode row) are left out; the pages of the decode steps add up."""
    def record(decodes, read, total, summaries):
        return {"num_decodes": decodes, "pages_read": read, "pages_total": total, "summaries_read": summaries,
                "bytes_read": 10 * read + summaries, "bytes_dense": 10 * total}
    records = [record(0, 999, 999, 999), record(2, 40, 400, 7), record(1, 30, 200, 5)]
    assert e2e.decode_pages(records) == {"decode_steps": 2, "decode_rows": 3, "pages_read": 70, "pages_total": 600,
                                         "summaries_read": 12, "bytes_read": 712, "bytes_dense": 6000}
    assert e2e.decode_pages(records[:1]) is None
    assert e2e.decode_pages([]) is None


def test_bench_prompt_is_seeded_and_in_range() -> None:
    a, b = e2e.bench_prompt(0, 100, 0, 50), e2e.bench_prompt(0, 100, 1, 50)
    assert a == e2e.bench_prompt(0, 100, 0, 50) and a != b
    assert len(a) == 100 and min(a) >= 3 and max(a) < 50


def test_engine_name_marks_locks_without_statistics() -> None:
    assert e2e.engine_name("llama3.1-8b", "", "locks", 1) == "llama3.1-8b-locks"
    assert e2e.engine_name("llama3.1-8b", "8", "locks", 2, stats=False) == "llama3.1-8b-L8-locks-nostats-tp2"
    assert e2e.engine_name("llama3.1-8b", "", "flash", 1, stats=False) == "llama3.1-8b-flash"


def test_parse_batches() -> None:
    assert e2e.parse_batches("131072:6, 262144:3") == {131072: 6, 262144: 3}
    assert e2e.parse_batches("") == {}


def cell(ctx: int, tpot: float, batch: int = 1, **extra) -> dict:
    return {"context": ctx, "batch": batch, "tpot_ms": tpot, "tpot_ms_min": tpot - 0.1, "tpot_ms_max": tpot + 0.1,
            "decode_tok_s": batch * 1e3 / tpot, "eager_decode_calls_per_layer": 0,
            "metadata_build_us_per_step": 100.0, "summary_bytes": 0, **extra}


def result(shape: str, layers: int, backend: str, cells: list[dict]) -> dict:
    locks = backend.startswith("locks")  # bench_e2e writes the LOCKS fields for every LOCKS engine
    return {"shape": shape, "layers": layers, "backend": backend, "tp": 1, "budget": 2048 if locks else None,
            "rank": 8 if locks else None, "summary_format": "chanlog" if locks else None, "engine_start_s": 1.0,
            "cells": cells}


def test_summarize_writes_the_issue_rows_and_the_depth_fit(tmp_path) -> None:
    runs = [
        result("llama3.1-8b", 32, "flash", [cell(131072, 9.0, prefill_s=10.0), cell(131072, 36.0, batch=6)]),
        result("llama3.1-8b", 32, "locks", [cell(131072, 4.5, prefill_s=10.3, pages_read_frac=0.016),
                                            cell(131072, 12.0, batch=6, pages_read_frac=0.016),
                                            {"context": 262144, "batch": 1, "skipped": "--time-limit"}]),
        # 1M on the 40-layer shape at 4 and 8 layers: dense 4 + 0.25 L ms, LOCKS 3.5 + 0.125 L ms
        result("glm4-9b-1m", 4, "flash", [cell(1 << 20, 5.0)]),
        result("glm4-9b-1m", 8, "flash", [cell(1 << 20, 6.0)]),
        result("glm4-9b-1m", 4, "locks", [cell(1 << 20, 4.0, pages_read_frac=0.002)]),
        result("glm4-9b-1m", 8, "locks", [cell(1 << 20, 4.5, pages_read_frac=0.002)]),
    ]
    folder = tmp_path / "out"
    folder.mkdir()
    for i, r in enumerate(runs):
        (folder / f"result-{i}.json").write_text(json.dumps(r))
    out = tmp_path / "e2e.json"
    meta = json.dumps({"gpu": "H200", "date": "2026-11-29", "vllm": "0.26.0", "command": "bench"})
    assert e2e_fit.summarize([str(folder)], out, meta) == 0
    summary = json.loads(out.read_text())
    assert {summary[k] for k in ("gpu", "date", "vllm", "command")} == {"H200", "2026-11-29", "0.26.0", "bench"}
    rows = summary["rows"]
    assert all(ROW_KEYS <= set(r) for r in rows)
    by = {(r["shape"], r["layers"], r["context"], r["batch"], r["extrapolated"]): r for r in rows}
    single = by[("llama3.1-8b", 32, 131072, 1, False)]
    assert (single["dense_tpot_ms"], single["locks_tpot_ms"], single["speedup"]) == (9.0, 4.5, 2.0)
    assert (single["dense_prefill_s"], single["locks_prefill_s"], single["pages_read_frac"]) == (10.0, 10.3, 0.016)
    assert by[("llama3.1-8b", 32, 131072, 6, False)]["speedup"] == 3.0
    assert ("llama3.1-8b", 32, 262144, 1, False) not in by  # skipped cells make no row
    fit = by[("glm4-9b-1m", 40, 1 << 20, 1, True)]
    assert fit["dense_tpot_ms"] == pytest.approx(14.0) and fit["locks_tpot_ms"] == pytest.approx(8.5)
    assert fit["fit"]["per_layer_ratio"] == pytest.approx(2.0)
    assert fit["fit"]["dense_fixed_ms"] == pytest.approx(4.0) and fit["fit"]["locks_fixed_ms"] == pytest.approx(3.5)
    # GLM at 1M: 2 KV heads x D 128 x (K, V) x bf16 x 2^20 tokens = 1.07 GB a layer, 0.224 ms at 4.8 TB/s
    assert fit["fit"]["dense_kv_read_floor_per_layer_ms"] == pytest.approx(2**30 / 4.8e12 * 1e3, rel=1e-3)
    assert fit["fit"]["dense_slope_below_floor"] is False
    assert json.loads((tmp_path / "e2e_full.json").read_text())[0]["shape"] == "llama3.1-8b"


def test_summarize_keeps_one_row_per_summary_format(tmp_path) -> None:
    """LOCKS engines of two summary formats at the same cell give two rows, each against the one dense cell."""
    other = {**result("llama3.1-8b", 32, "locks", [cell(131072, 6.0)]), "summary_format": "colwise8"}
    runs = [result("llama3.1-8b", 32, "flash", [cell(131072, 9.0)]),
            result("llama3.1-8b", 32, "locks", [cell(131072, 10.0)]), other]
    for i, r in enumerate(runs):
        (tmp_path / f"result-{i}.json").write_text(json.dumps(r))
    out = tmp_path / "e2e.json"
    assert e2e_fit.summarize([str(tmp_path)], out) == 0
    rows = {r["summary_format"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"chanlog", "colwise8"}
    assert (rows["chanlog"]["speedup"], rows["colwise8"]["speedup"]) == (0.9, 1.5)
    assert rows["chanlog"]["dense_tpot_ms"] == rows["colwise8"]["dense_tpot_ms"] == 9.0


def test_summarize_pairs_runs_without_the_prefix_walk_with_each_other(tmp_path) -> None:
    """``--no-prefix-walk`` engines make their own rows (``prefix_walk: false``), against the dense engine run
    the same way; rows of the default runs carry no such key."""
    cut = lambda r: {**r, "prefix_walk": False}
    runs = [result("glm4-9b-1m", 4, "flash", [cell(1 << 20, 6.0)]),
            result("glm4-9b-1m", 4, "locks", [cell(1 << 20, 6.0)]),
            cut(result("glm4-9b-1m", 4, "flash", [cell(1 << 20, 2.0)])),
            cut(result("glm4-9b-1m", 4, "locks", [cell(1 << 20, 1.6)]))]
    for i, r in enumerate(runs):
        (tmp_path / f"result-{i}.json").write_text(json.dumps(r))
    out = tmp_path / "e2e.json"
    assert e2e_fit.summarize([str(tmp_path)], out) == 0
    rows = {r.get("prefix_walk", True): r for r in json.loads(out.read_text())["rows"]}
    assert (rows[True]["dense_tpot_ms"], rows[True]["locks_tpot_ms"]) == (6.0, 6.0)
    assert (rows[False]["dense_tpot_ms"], rows[False]["locks_tpot_ms"], rows[False]["speedup"]) == (2.0, 1.6, 1.25)


def test_summarize_keeps_a_score_tuning_override_out_of_the_depth_fit(tmp_path) -> None:
    """A LOCKS engine run with a score-kernel tuning override (results of earlier kernels) makes its own row (``score_tuning`` named, against the same
    dense cell) and stays out of the depth fit of the engines that ran the default kernel."""
    glm = lambda layers, backend, tpot: result("glm4-9b-1m", layers, backend, [cell(1 << 20, tpot)])  # noqa: E731
    runs = [glm(4, "flash", 5.0), glm(8, "flash", 6.0), glm(4, "locks", 4.0), glm(8, "locks", 4.5),
            {**glm(8, "locks", 3.0), "score_tuning": "dot1t,16,4"}]
    for i, r in enumerate(runs):
        (tmp_path / f"result-{i}.json").write_text(json.dumps(r))
    out = tmp_path / "e2e.json"
    assert e2e_fit.summarize([str(tmp_path)], out) == 0
    rows = json.loads(out.read_text())["rows"]
    at8 = {r.get("score_tuning"): r for r in rows if r["layers"] == 8}
    assert (at8[None]["locks_tpot_ms"], at8["dot1t,16,4"]["locks_tpot_ms"]) == (4.5, 3.0)
    assert at8["dot1t,16,4"]["dense_tpot_ms"] == 6.0 and at8["dot1t,16,4"]["summary_format"] == "chanlog"
    (fit,) = [r for r in rows if r["extrapolated"]]
    assert fit["locks_tpot_ms"] == pytest.approx(3.5 + 0.125 * 40) and "score_tuning" not in fit
    panels, _ = e2e.plot_panels(rows)
    assert [(kind, len(rs)) for kind, _, rs in panels] == [("depth", 3)]
    assert e2e_fit.locks_label({**glm(8, "locks", 3.0), "score_ptx": "0"}) == "chanlog score plain"
    assert e2e_fit.locks_label({**glm(8, "locks", 3.0), "lse_partials": "1", "kernels": "abc"}) == \
        "chanlog score lse-partials kernels abc"


def test_summarize_fits_a_named_kernels_version_on_its_own(tmp_path) -> None:
    """LOCKS engines named with ``--kernels`` make their own rows and their own depth fit against the dense
    engines (which need not share a depth with them), apart from the unnamed LOCKS engines' fit."""
    glm = lambda layers, backend, tpot: result("glm4-9b-1m", layers, backend, [cell(1 << 20, tpot)])  # noqa: E731
    runs = [glm(4, "flash", 5.0), glm(24, "flash", 13.0), glm(4, "locks", 4.0), glm(24, "locks", 9.0),
            {**glm(12, "locks", 5.0), "kernels": "abc"}, {**glm(24, "locks", 8.0), "kernels": "abc"}]
    for i, r in enumerate(runs):
        (tmp_path / f"result-{i}.json").write_text(json.dumps(r))
    out = tmp_path / "e2e.json"
    assert e2e_fit.summarize([str(tmp_path)], out) == 0
    rows = json.loads(out.read_text())["rows"]
    fits = {r.get("kernels"): r["fit"] for r in rows if r["extrapolated"]}
    assert fits["abc"]["depths_locks"] == [12, 24] and fits["abc"]["locks_per_layer_ms"] == pytest.approx(0.25)
    assert fits[None]["depths_locks"] == [4, 24] and fits[None]["locks_per_layer_ms"] == pytest.approx(0.25)
    assert fits["abc"]["dense_per_layer_ms"] == pytest.approx(0.4) and fits["abc"]["per_layer_ratio"] == 1.6
    at12 = [r for r in rows if r["layers"] == 12]
    assert [(r["kernels"], r["dense_tpot_ms"], r["locks_tpot_ms"]) for r in at12] == [("abc", None, 5.0)]
    panels, fits_by_key = e2e.plot_panels(rows)
    assert [(kind, len(rs)) for kind, _, rs in panels] == [("depth", 4)]
    assert {k[-1] for k in fits_by_key} == {None, "abc"}
    assert e2e_fit.label_parts(e2e_fit.locks_label(runs[-1])) == ("chanlog", None, "abc")


def test_summarize_keeps_the_two_level_engine_apart_from_the_flat_scan(tmp_path) -> None:
    """``locks-2l`` (and ``locks-tail``) engines make rows and depth fits of their own against FLASH_ATTN, named by
    ``backend`` and the selection they ran; the flat scan's rows keep their fields as before."""
    glm = lambda layers, backend, tpot: result("glm4-9b-1m", layers, backend, [cell(1 << 20, tpot)])  # noqa: E731
    two = lambda layers, tpot: {**glm(layers, "locks-2l", tpot), "selection": "two-level",  # noqa: E731
                                "candidates": "auto"}
    runs = [glm(2, "flash", 2.0), glm(8, "flash", 5.0), glm(2, "locks", 1.9), glm(8, "locks", 3.4),
            two(2, 1.7), two(8, 2.3)]
    for i, r in enumerate(runs):
        (tmp_path / f"result-{i}.json").write_text(json.dumps(r))
    out = tmp_path / "e2e.json"
    assert e2e_fit.summarize([str(tmp_path)], out) == 0
    rows = json.loads(out.read_text())["rows"]
    at8 = {r.get("backend", "locks"): r for r in rows if r["layers"] == 8}
    assert (at8["locks"]["locks_tpot_ms"], at8["locks-2l"]["locks_tpot_ms"]) == (3.4, 2.3)
    assert at8["locks-2l"]["dense_tpot_ms"] == 5.0 and at8["locks-2l"]["candidates"] == "auto"
    assert "selection" not in at8["locks"]
    fits = {r.get("backend", "locks"): r["fit"] for r in rows if r["extrapolated"]}
    assert fits["locks"]["locks_per_layer_ms"] == pytest.approx(0.25)
    assert fits["locks-2l"]["locks_per_layer_ms"] == pytest.approx(0.1)
    assert fits["locks-2l"]["per_layer_ratio"] == 5.0


def test_summarize_pairs_a_locks_row_with_the_dense_cell_of_its_own_run(tmp_path) -> None:
    """Two runs (folders) at the same cell: each LOCKS row takes its own run's FLASH_ATTN TPOT; a LOCKS run
    without a dense cell of its own takes the last one given."""
    llama = lambda backend, tpot: result("llama3.1-8b", 32, backend, [cell(1 << 17, tpot)])  # noqa: E731
    old, new, alone = tmp_path / "old", tmp_path / "new", tmp_path / "alone"
    for folder, runs in ((new, [llama("flash", 8.6), {**llama("locks", 6.9), "kernels": "abc"}]),
                         (old, [llama("flash", 8.8), llama("locks", 7.7)]),
                         (alone, [{**llama("locks", 7.0), "kernels": "xyz"}])):
        folder.mkdir()
        for i, r in enumerate(runs):
            (folder / f"result-{i}.json").write_text(json.dumps(r))
    out = tmp_path / "e2e.json"
    assert e2e_fit.summarize([str(new), str(old), str(alone)], out) == 0
    rows = {r.get("kernels"): r for r in json.loads(out.read_text())["rows"]}
    assert (rows["abc"]["dense_tpot_ms"], rows["abc"]["speedup"]) == (8.6, 1.25)
    assert (rows[None]["dense_tpot_ms"], rows[None]["locks_tpot_ms"]) == (8.8, 7.7)
    assert rows["xyz"]["dense_tpot_ms"] == 8.8


def test_summarize_fits_and_pairs_within_one_gpu(tmp_path) -> None:
    """Results that name their GPU (``machine``) fit depths and pair rows with engines of that GPU only: dense
    engines of another GPU at the same depths stay out of the fit, and a LOCKS depth without a dense engine on
    its GPU gets no dense TPOT."""
    glm = lambda layers, backend, tpot, gpu: {  # noqa: E731
        **result("glm4-9b-1m", layers, backend, [cell(1 << 20, tpot)]), "machine": gpu, "kernels": "abc"}
    runs = [glm(6, "flash", 3.6, "a"), glm(12, "flash", 6.9, "a"), glm(6, "locks", 2.4, "a"),
            glm(12, "locks", 3.8, "a"), glm(6, "flash", 3.0, "b"), glm(12, "flash", 5.7, "b"),
            glm(18, "locks", 5.0, "a")]
    for i, r in enumerate(runs):
        (tmp_path / f"result-{i}.json").write_text(json.dumps(r))
    out = tmp_path / "e2e.json"
    assert e2e_fit.summarize([str(tmp_path)], out) == 0
    rows = json.loads(out.read_text())["rows"]
    (fit,) = [r for r in rows if r["extrapolated"]]
    assert fit["machine"] == "a" and fit["fit"]["depths_dense"] == [6, 12]
    assert fit["fit"]["dense_per_layer_ms"] == pytest.approx(0.55)
    assert fit["fit"]["locks_per_layer_ms"] == pytest.approx((5.0 - 2.4) / 12, rel=0.05)
    measured = {r["layers"]: r for r in rows if not r["extrapolated"]}
    assert (measured[6]["dense_tpot_ms"], measured[12]["dense_tpot_ms"]) == (3.6, 6.9)
    assert measured[18]["dense_tpot_ms"] is None and measured[18]["machine"] == "a"


def test_prefix_walk_flag_reaches_the_engine_arguments() -> None:
    """The flags go on to every engine child; without them the engines get the defaults."""
    assert e2e.prefix_walk_kwargs(False) == {}
    assert "--no-prefix-walk" in e2e.child_args(e2e.build_parser().parse_args(["--no-prefix-walk"]))
    assert "--no-prefix-walk" not in e2e.child_args(e2e.build_parser().parse_args([]))
    # the kernels' version reaches the engine processes, which write it into their results
    child = e2e.child_args(e2e.build_parser().parse_args(["--kernels", "abc1234"]))
    assert e2e.build_parser().parse_args(child).kernels == "abc1234"
    assert "--kernels" not in e2e.child_args(e2e.build_parser().parse_args([]))


def test_prefix_walk_cut_names_the_scheduler() -> None:
    pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")
    from locks_bench.scheduler import SCHEDULER_CLS

    assert e2e.prefix_walk_kwargs(True) == {"disable_cascade_attn": True, "scheduler_cls": SCHEDULER_CLS}


def test_plot_panels_keep_runs_without_the_prefix_walk_apart() -> None:
    row = lambda layers, ctx, **k: {"shape": "glm4-9b-1m", "layers": layers, "context": ctx, "batch": 1,  # noqa: E731
                                    "extrapolated": False, "dense_tpot_ms": 1.0, **k}
    rows = [row(4, 1 << 20), row(24, 1 << 20), row(4, 1 << 20, prefix_walk=False), row(24, 1 << 20, prefix_walk=False),
            row(40, 1 << 17), row(40, 1 << 18, prefix_walk=False),
            {**row(40, 1 << 20, prefix_walk=False), "extrapolated": True}]
    panels, fits = e2e.plot_panels(rows)
    keys = [(kind, key, len(rs)) for kind, key, rs in panels]
    assert keys == [("context", ("glm4-9b-1m", False), 1), ("context", ("glm4-9b-1m", True), 1),
                    ("depth", ("glm4-9b-1m", 1 << 20, False), 2), ("depth", ("glm4-9b-1m", 1 << 20, True), 2)]
    assert list(fits) == [("glm4-9b-1m", 1 << 20, False, None)]


def test_depth_fit_flags_a_host_bound_depth() -> None:
    """Llama shapes at 1M read 4.3 GB of K+V a layer (0.89 ms at the HBM peak): a dense slope of 0.61 ms a
    layer (as measured over 2 and 6 layers, the 2-layer step waiting on the host) cannot be the GPU's."""
    c = lambda layers, backend, tpot: (("llama3.1-8b", layers, 1, 1 << 20, 1, backend, True, "",
                                         "chanlog" if backend == "locks" else None), (None, {"tpot_ms": tpot}))
    cells = dict([c(2, "flash", 4.8), c(6, "flash", 7.24), c(2, "locks", 4.63), c(6, "locks", 8.09)])
    (row,) = e2e_fit.depth_fits(cells)
    assert row["extrapolated"] and row["layers"] == 32
    assert row["fit"]["dense_per_layer_ms"] == pytest.approx(0.61)
    assert row["fit"]["dense_kv_read_floor_per_layer_ms"] == pytest.approx(0.8948, rel=1e-3)
    assert row["fit"]["dense_slope_below_floor"] is True
    assert row["summary_format"] == "chanlog"


def test_depth_fit_over_profiled_device_time() -> None:
    """With profiles at two depths the fit also covers GPU kernel time per step: a 4-layer step that waits on
    the host (TPOT 5.8 ms, kernels 2.5 ms) flattens the TPOT slope, not the device one."""
    def c(layers, backend, tpot, busy, ctx=1 << 20):
        result = {"profile": {"context": ctx, "decode_tokens": 64, "ranks": [{"kernel_us_total": busy * 64e3}]}}
        return (("glm4-9b-1m", layers, 1, 1 << 20, 1, backend, True, "", "colwise8" if backend == "locks" else None),
                (result, {"tpot_ms": tpot}))
    cells = dict([c(4, "flash", 5.8, 2.5), c(24, "flash", 10.4, 11.3), c(4, "locks", 5.8, 2.1),
                  c(24, "locks", 9.0, 8.7)])
    (row,) = e2e_fit.depth_fits(cells)
    dev = row["fit"]["device"]
    assert dev["dense_per_layer_ms"] == pytest.approx(0.44) and dev["locks_per_layer_ms"] == pytest.approx(0.33)
    assert dev["per_layer_ratio"] == pytest.approx(1.33)
    assert dev["dense_fixed_ms"] == pytest.approx(0.74) and dev["locks_fixed_ms"] == pytest.approx(0.78)
    assert dev["dense_ms_at_full_depth"] == pytest.approx(0.74 + 40 * 0.44)
    assert row["fit"]["dense_per_layer_ms"] == pytest.approx(0.23)  # the TPOT fit, host-bound at 4 layers
    assert row["fit"]["locks_host_bound_depths"] == [4] and row["locks_host_bound"]  # TPOT 5.8 ms, kernels 2.1
    # a profile taken at another context is not this cell's
    cells = dict([c(4, "flash", 5.8, 2.5, ctx=1 << 17), c(24, "flash", 10.4, 11.3), c(4, "locks", 5.8, 2.1),
                  c(24, "locks", 9.0, 8.7)])
    (row,) = e2e_fit.depth_fits(cells)
    assert "device" not in row["fit"]


def test_one_gpu_device_fit_from_one_dense_depth() -> None:
    """LOCKS profiled at 6 and 12 layers and FLASH_ATTN at 6 on one GPU: dense's per-layer device time is LOCKS'
    slope plus the engines' kernel-time difference per layer at 6; a LOCKS step whose TPOT is over its kernel
    time is listed as host-bound. Results that name no GPU, or a dense engine of another GPU, give no fit."""
    def c(layers, backend, tpot, busy, machine="a"):
        result = {"profile": {"context": 1 << 20, "decode_tokens": 64, "ranks": [{"kernel_us_total": busy * 64e3}]}}
        return (("glm4-9b-1m", layers, 1, 1 << 20, 1, backend, False, machine,
                 "colwise8 kernels abc" if backend == "locks" else None), (result, {"tpot_ms": tpot}))
    cells = dict([c(6, "locks", 2.3, 1.9), c(12, "locks", 3.5, 3.5), c(6, "flash", 2.9, 3.0)])
    (fit,) = e2e_fit.one_gpu_device_fits(cells)
    assert fit["machine"] == "a" and fit["kernels"] == "abc"
    assert fit["locks_per_layer_ms"] == pytest.approx(1.6 / 6, rel=1e-3)
    assert fit["dense_per_layer_ms"] == pytest.approx(1.6 / 6 + 1.1 / 6, rel=1e-3)
    assert fit["per_layer_ratio"] == pytest.approx(2.7 / 1.6, abs=0.01)
    assert fit["locks_fixed_ms"] == pytest.approx(0.3, abs=1e-3)
    assert fit["host_bound"] == {"locks": [6], "flash": []}
    assert fit["decode_only"] is False  # one-window profiles: the prefill step and any calibration counted
    for _, (result, _) in cells.items():
        rank = result["profile"]["ranks"][0]
        rank["decode_kernel_ms_per_step"] = rank["kernel_us_total"] / 64e3
    assert e2e_fit.one_gpu_device_fits(cells)[0]["decode_only"] is True
    other = dict([c(6, "locks", 2.3, 1.9), c(12, "locks", 3.5, 3.5), c(6, "flash", 2.9, 3.0, machine="b")])
    assert e2e_fit.one_gpu_device_fits(other) == []
    unnamed = dict([c(6, "locks", 2.3, 1.9, ""), c(12, "locks", 3.5, 3.5, ""), c(6, "flash", 2.9, 3.0, "")])
    assert e2e_fit.one_gpu_device_fits(unnamed) == []


def test_profile_busy_counts_each_kernel_once() -> None:
    """An eager op (``aten::mm``) carries its kernel's device time as well as the kernel's own entry: profiles
    without ``kernel_us_total`` have the top entries with CPU time taken back out of ``device_us_total``."""
    rows = [{"name": "nvjet_lm_head", "self_device_us": 300.0 * 64, "self_cpu_us": 0.0},
            {"name": "aten::mm", "self_device_us": 300.0 * 64, "self_cpu_us": 50.0 * 64},
            {"name": "_score_pages_kernel", "self_device_us": 700.0 * 64, "self_cpu_us": 0.0}]
    old = {"context": 1 << 20, "decode_tokens": 64, "ranks": [{"by_device": rows, "device_us_total": 1300.0 * 64}]}
    assert e2e_fit.profile_busy_ms({"profile": old}, 1 << 20) == pytest.approx(1.0)
    new = {**old, "ranks": [{**old["ranks"][0], "kernel_us_total": 1000.0 * 64}]}
    assert e2e_fit.profile_busy_ms({"profile": new}, 1 << 20) == pytest.approx(1.0)
    assert e2e_fit.profile_busy_ms({"profile": old}, 1 << 17) is None and e2e_fit.profile_busy_ms(None, 1 << 20) is None
    # with a short window the decode alone: the difference of the two windows' kernel time over their tokens
    two = {**new, "ranks": [{**new["ranks"][0], "decode_kernel_ms_per_step": 0.8}]}
    assert e2e_fit.profile_busy_ms({"profile": two}, 1 << 20) == pytest.approx(0.8)


def test_summarize_without_results_fails(tmp_path, capsys) -> None:
    assert e2e_fit.summarize([str(tmp_path)], tmp_path / "e2e.json") == 2
    assert "no result-*.json" in capsys.readouterr().err


def test_engine_process_group_is_killed_whole(tmp_path) -> None:
    """A timed-out engine process takes its children with it (vLLM's TP workers would keep their GPU memory)."""
    import sys
    import time

    pid_file = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
              f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
              "time.sleep(60)\n")
    with open(tmp_path / "log", "w") as log:
        assert engines.run_engine_process([sys.executable, "-c", script], log, timeout=3.0) == "timeout"
    pid = int(pid_file.read_text())
    time.sleep(0.5)  # the kill is delivered; the orphan is reaped by init
    try:
        with open(f"/proc/{pid}/stat") as stat:
            alive = stat.read().split(")")[-1].split()[0] not in ("Z", "X")  # state after the command name
    except FileNotFoundError:
        alive = False
    assert not alive, "the grandchild outlived the timeout"
    with open(tmp_path / "log", "w") as log:
        assert engines.run_engine_process([sys.executable, "-c", "pass"], log, timeout=30.0) == 0


def test_worker_profile_lists_what_ran() -> None:
    assert stop_profile(None) == []  # nothing started
    model = torch.nn.Linear(64, 64)
    assert start_profile(model) == 0
    for _ in range(3):
        model(torch.randn(8, 64))
    rows = stop_profile(model, top=200)
    names = {r["name"]: r for r in rows}
    assert "aten::addmm" in names and names["aten::addmm"]["calls"] == 3
    assert all(set(r) == {"name", "calls", "self_device_us", "device_us", "self_cpu_us", "cpu_us"} for r in rows)
    assert stop_profile(model) == []  # stopped once


def test_worker_profile_summary_totals_the_device_and_host_time() -> None:
    assert stop_profile_summary(None) == {}
    model = torch.nn.Linear(64, 64)
    start_profile(model)
    for _ in range(3):
        model(torch.randn(8, 64))
    summary = stop_profile_summary(model, top=5)
    assert set(summary) == {"by_device", "by_cpu", "device_us_total", "kernel_us_total", "cpu_us_total"}
    assert len(summary["by_cpu"]) <= 5
    cpu = [r["cpu_us"] for r in summary["by_cpu"]]
    assert cpu == sorted(cpu, reverse=True) and cpu[0] > 0
    if not torch.cuda.is_available():
        assert summary["device_us_total"] == summary["kernel_us_total"] == 0.0  # no accelerator: nothing ran there
    else:
        assert 0 < summary["kernel_us_total"] <= summary["device_us_total"]
    assert summary["cpu_us_total"] >= max(r["self_cpu_us"] for r in summary["by_cpu"])


def test_py_spy_samples_become_ms_per_step_by_process_and_function():
    raw = "\n".join([
        'process 1:"python bench";process 2:"VLLM::EngineCore";main (core.py:1);step (core.py:5);schedule (s.py:9) 30',
        'process 1:"python bench";process 2:"VLLM::EngineCore";main (core.py:1);step (core.py:5) 10',
        'process 1:"python bench";main (bench.py:3);wait (t.py:2) 20',
        "a line that is no sample",
    ])
    summary = engines.summarize_py_spy(raw, rate=100, steps=10)  # a sample is 10 ms: 1 ms a step over 10 steps
    core, front = summary["processes"]
    assert core["process"] == 'process 2:"VLLM::EngineCore"' and core["busy_ms_per_step"] == 40.0
    assert core["self_ms_per_step"] == [["schedule (s.py:9)", 30.0], ["step (core.py:5)", 10.0]]
    # main and step are in every sample of the engine core: entry points, left out of the inclusive ranking
    assert core["inclusive_ms_per_step"] == [["schedule (s.py:9)", 30.0]]
    assert front["busy_ms_per_step"] == 20.0 and front["self_ms_per_step"] == [["wait (t.py:2)", 20.0]]


def test_py_spy_is_found_in_a_target_install(tmp_path, monkeypatch):
    target = tmp_path / "site"
    (target / "bin").mkdir(parents=True)
    exe = target / "bin" / "py-spy"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("PY_SPY", raising=False)
    monkeypatch.setattr(engines.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(engines.sys, "path", [str(target)])
    assert engines.find_py_spy() == str(exe)
    monkeypatch.setattr(engines.sys, "path", [])
    assert engines.find_py_spy() is None


def test_step_bytes_counts_every_summary_and_the_selected_pages() -> None:
    """LOCKS reads every page's summary (colwise8: 1,440 B a page and KV head at D = 128) and the K+V (8 KiB) of
    the pages it selects; dense reads every token's K+V. Llama-3.1-8B at 128K, 128 of 8,192 pages read."""
    got = e2e_fit.step_bytes("llama3.1-8b", 1, 131072, 1, "colwise8", 8, 16, 128 / 8192)
    assert got["dense_bytes_per_layer"] == 131072 * 8 * 128 * 2 * 2
    assert got["locks_bytes_per_layer"] == 8 * (8192 * 1440 + 128 * 8192)
    assert got["bytes_ratio"] == pytest.approx(536870912 / 102760448, abs=0.01)
    # two ranks of tensor parallelism: half the KV heads on each GPU; a batch multiplies both sides
    half = e2e_fit.step_bytes("llama3.1-8b", 2, 131072, 3, "colwise8", 8, 16, 128 / 8192)
    assert half["dense_bytes_per_layer"] == 3 * got["dense_bytes_per_layer"] // 2
    assert half["bytes_ratio"] == got["bytes_ratio"]


def test_selection_settings_of_the_benchmarks_configurations():
    """bench_e2e's backends and bench_app_engine's configurations name the selection the same way."""
    two_level = e2e.selection_settings("locks-2l", "4,8")
    assert two_level == {"selection": "two-level", "candidates": (4, 8)}
    assert LocksConfig(**two_level).layer_candidates(1) == 8
    for name in ("locks", "locks-nostats", "flash"):
        assert e2e.selection_settings(name, "4") == {"selection": "flat"}
    # a named table is stretched to the engine's depth; a list is taken as given (LocksConfig checks its length)
    named = e2e.selection_settings("locks-2l", "keep-needle", 32)["candidates"]
    assert len(named) == 32 and LocksConfig(selection="two-level", candidates=named).layer_candidates(31) == 32
    assert e2e.selection_settings("locks-2l", "4,8", 32)["candidates"] == (4, 8)
    auto = e2e.selection_settings("locks-2l", "auto", 32)
    assert auto == {"selection": "two-level", "candidates": "auto"} and LocksConfig(**auto).calibrated
    # the tail estimate rides on the flat scan (LocksConfig refuses it with the two-level selection)
    tail = e2e.selection_settings("locks-tail", "auto", 32)
    assert tail == {"selection": "flat", "tail": "int8"} and LocksConfig(**tail).tail == "int8"
    assert e2e.BACKENDS["locks-tail"] == "CUSTOM"
    with pytest.raises(ValueError, match="comma-separated integers"):
        e2e.selection_settings("locks-2l", "4;8")


def test_profile_decode_takes_the_short_window_out() -> None:
    """Each profiled request carries a prefill step and the calibration; the difference of a long and a short
    window leaves the decode steps alone (``decode_kernel_ms_per_step``)."""
    import argparse
    import importlib.util

    from tests.support.paths import REPO

    spec = importlib.util.spec_from_file_location("bench_e2e_script", REPO / "samples" / "bench_e2e.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    class Engine:
        """A request of n tokens costs 5 ms of kernels once (prefill, calibration) and 1 ms a decode step."""

        def __init__(self):
            self.tokens, self.llm = 0, self

        def apply_model(self, fn):
            if fn is bench.stop_profile_summary:
                total = (5000.0 + 1000.0 * (self.tokens - 1)) if self.tokens else 0.0
                return [{"kernel_us_total": total, "by_device": [], "by_cpu": []}]
            return [0]

        def generate(self, prompts, n, ignore_eos=False):
            self.tokens = n

    args = argparse.Namespace(seed=0)
    profile = bench.profile_decode(Engine(), 64, 64, args, {"vocab_size": 1000})
    rank = profile["ranks"][0]
    assert rank["short_window"]["decode_tokens"] == 16
    assert rank["decode_kernel_ms_per_step"] == pytest.approx(1.0)
    assert rank["device_busy_ms_per_step"] == pytest.approx((5000 + 63000) / 64 / 1e3, abs=1e-3)
    assert e2e_fit.profile_busy_ms({"profile": profile}, 64) == pytest.approx(1.0)
