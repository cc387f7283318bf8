"""``samples/profile_layers.py``: one layer's decode kernels from a bench_e2e profile, the calibration and the
once-a-step kernels left out."""

from __future__ import annotations

import importlib.util
import json

import pytest
from tests.support.paths import REPO

_spec = importlib.util.spec_from_file_location("profile_layers", REPO / "samples" / "profile_layers.py")
profile_layers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(profile_layers)


def profiled(layers: int, steps: int, rows: list[tuple[str, int, float, float]]) -> dict:
    """A bench_e2e result whose profile has ``rows`` of (name, calls, self device us, self CPU us)."""
    by_device = [{"name": n, "calls": c, "self_device_us": d, "device_us": d, "self_cpu_us": cpu, "cpu_us": cpu}
                 for n, c, d, cpu in rows]
    return {"layers": layers, "backend": "locks-2l", "shape": "glm4-9b-1m",
            "profile": {"context": 1 << 20, "decode_tokens": steps, "ranks": [{"by_device": by_device}]}}


def test_per_layer_kernels_leave_out_once_a_step_and_eager_rows():
    # 8 layers, 64 tokens: 63 decode steps, 504 launches of a once-a-layer kernel
    result = profiled(8, 64, [
        ("score", 520, 520 * 41.0, 0.0),       # 504 decode launches and 16 of the calibration: mean kept
        ("merge_topk", 1008, 1008 * 20.0, 0.0),  # twice a layer a step
        ("lm_head", 64, 64 * 400.0, 0.0),      # once a step: not a layer's
        ("aten::sort", 600, 600 * 30.0, 5.0),  # an eager op's row (CPU time): its kernels are rows of their own
        ("prefill_attn", 8, 8 * 470.0, 0.0),   # the one prefill step
    ])
    b = profile_layers.layer_kernels(result)
    assert b["decode_steps"] == 63 and b["layers"] == 8
    assert [(k["name"], k["launches"], k["per_layer_us"]) for k in b["kernels"]] == [
        ("score", 1, 41.0), ("merge_topk", 2, 40.0)]
    assert b["per_layer_us"] == 81.0


def test_a_result_without_a_profile_is_an_error(tmp_path, capsys):
    with pytest.raises(ValueError, match="no --profile-steps profile"):
        profile_layers.layer_kernels({"layers": 2, "profile": None})
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"layers": 2, "cells": []}))
    assert profile_layers.main([str(path)]) == 2
    assert "no --profile-steps profile" in capsys.readouterr().err


def test_the_command_prints_and_writes_each_breakdown(tmp_path, capsys):
    path = tmp_path / "result.json"
    path.write_text(json.dumps(profiled(2, 17, [("attn", 32, 32 * 10.0, 0.0), ("gemm", 64, 64 * 5.0, 0.0)])))
    out = tmp_path / "layers.json"
    assert profile_layers.main([str(path), "--json", str(out)]) == 0
    assert "20.0 us a layer a decode step (2 layers, 16 decode steps)" in capsys.readouterr().out
    assert json.loads(out.read_text())[str(path)]["per_layer_us"] == 20.0


def test_a_short_window_cancels_the_prefill_and_the_calibration():
    # 64 and 16 tokens, 8 layers: the score kernel runs once a layer a decode step (20 us) plus 16 calibration
    # calls of 500 us in each window; the difference keeps 48 x 8 decode launches of 20 us
    def rows(tokens):
        return [("score", (tokens - 1) * 8 + 16, (tokens - 1) * 8 * 20.0 + 16 * 500.0, 0.0)]
    result = profiled(8, 64, rows(64))
    short = profiled(8, 16, rows(16))["profile"]["ranks"][0]["by_device"]
    result["profile"]["ranks"][0]["short_window"] = {"decode_tokens": 16, "by_device": short}
    b = profile_layers.layer_kernels(result)
    assert (b["decode_steps"], b["windows"], b["per_layer_us"]) == (48, 2, 20.0)
    # one window alone: the calibration's calls leak into the mean
    one = profile_layers.layer_kernels(profiled(8, 64, rows(64)))
    assert one["windows"] == 1 and one["per_layer_us"] > 30.0
