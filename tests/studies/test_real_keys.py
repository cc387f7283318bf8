"""The premise on real data: page-local summaries keep the oracle's attention mass; a shared basis does not.

Fixture: post-RoPE queries and keys of Qwen2.5-Coder-0.5B-Instruct over real prose (layers 0, 12, 23; one KV
head and its 7 query heads; see ``samples/tools/make_real_qk_fixture.py`` for how it was made).
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from locks_engine import LocksConfig
from locks_studies.fidelity import DecodeSteps
from tests.support.paths import FIXTURES

FIXTURE = FIXTURES / "real_qk_qwen25coder05b.npz"
BUDGET_FRACTION = 0.0625


def steps_of(data, layer: int) -> DecodeSteps:
    return DecodeSteps(
        torch.from_numpy(data[f"k_L{layer}"]), torch.from_numpy(data[f"q_L{layer}"]),
        torch.from_numpy(data["positions"]),
    )


@pytest.fixture(scope="module")
def real():
    data = np.load(FIXTURE)
    meta = json.loads(str(data["meta"]))
    return data, meta


def test_fixture_is_real_and_small(real):
    data, meta = real
    assert FIXTURE.stat().st_size < 1_000_000
    assert 0 in meta["layers"] and len(meta["layers"]) >= 3
    assert data["k_L0"].shape[0] >= 1024


@pytest.mark.parametrize("fmt", ["colwise8", "chanlog", "colwise", "float"])
def test_locks_keeps_the_oracle_mass_and_beats_a_shared_basis(real, fmt, capsys):
    """Mass kept / oracle mass kept, mean over steps and query heads: >= 0.98 in every layer; the shared
    basis (fitted on these very keys, at rank 8 and at equal bytes) keeps less, as the mean over layers.
    Measured 2026-11-29 (colwise): LOCKS 0.991 / 0.999 / 0.998 in layers 0 / 12 / 23 (mean 0.9960); shared
    at rank 8: 0.973 / 0.995 / 0.983; shared at equal bytes (rank 21): 1.001 / 0.994 / 0.992 (mean 0.9958).
    At equal bytes the margin is thin, and at layer 0 the shared basis keeps more: the int4 basis is the
    loss there (unquantized LOCKS: 1.000). chanlog: 0.995 / 0.998 / 1.000 (mean 0.9976); shared at its
    equal bytes (rank 24): mean 0.9974. colwise8 (2026-12-01): 0.9993 / 0.9981 / 1.0003 (mean 0.9992); shared at
    its equal bytes (rank 35): 1.0015 / 0.9947 / 0.9941 (mean 0.9968)."""
    data, meta = real
    means = {}
    for layer in meta["layers"]:
        steps = steps_of(data, layer)
        cfg = LocksConfig(budget=steps.budget(BUDGET_FRACTION), rank=8, summary_format=fmt)
        locks, shared_rank, shared_bytes = (
            steps.mass_vs_oracle(selector, cfg).mean().item() for selector in ("locks", "shared", "shared-bytes")
        )
        equal_bytes = steps.shared_rank_at_equal_bytes(cfg)
        means[layer] = (locks, shared_rank, shared_bytes)
        with capsys.disabled():
            print(
                f"\n{fmt:8s} layer {layer:2d}: mass kept / oracle at {BUDGET_FRACTION:.2%} budget: LOCKS r=8 {locks:.4f}, "
                f"shared r=8 {shared_rank:.4f}, shared r={equal_bytes} (equal bytes) {shared_bytes:.4f}"
            )
    locks, shared_rank, shared_bytes = np.mean(list(means.values()), axis=0)
    assert locks >= 0.98, f"mean over layers {locks:.4f}"
    for layer, per_layer in means.items():
        assert per_layer[0] >= 0.98, f"layer {layer}: {per_layer[0]:.4f}"
    assert shared_rank < locks, f"shared basis at equal rank keeps {shared_rank:.4f} >= {locks:.4f}"
    assert shared_bytes < locks, f"shared basis at equal bytes keeps {shared_bytes:.4f} >= {locks:.4f}"


def test_paper_format_loses_tail_mass_in_layer_0(real, capsys):
    """The paper's one-scale-per-tensor int8/int4 format, on layer 0's large near-constant channels, keeps
    less than the colwise format (DESIGN.md, "Quantization needs care")."""
    data, _ = real
    steps = steps_of(data, 0)
    kept = {}
    for fmt in ("paper", "colwise"):
        cfg = LocksConfig(budget=steps.budget(BUDGET_FRACTION), summary_format=fmt)
        kept[fmt] = steps.kept(steps.scores("locks", cfg), cfg).mean().item()
    with capsys.disabled():
        print(f"\nlayer 0 absolute mass kept at {BUDGET_FRACTION:.2%}: {kept}")
    assert kept["paper"] < kept["colwise"]


def test_chanlog_and_int8_basis_keep_more_than_colwise_in_the_worst_layer(real, capsys):
    """One log2 scale per channel of the int4 basis (``chanlog``) against one scale per direction
    (``colwise``): the worst layer's mean mass / oracle is at least as high; an int8 basis (``colwise8``) at
    least as high again. Measured 2026-11-29: layer 0, chanlog 0.9951, colwise 0.9905 (on 32K tokens of the
    same model: 0.965 against 0.940); 2026-12-01: colwise8 0.9981 (layer 12; layer 0: 0.9993)."""
    data, meta = real
    worst = {}
    for fmt in ("colwise8", "chanlog", "colwise"):
        means = []
        for layer in meta["layers"]:
            steps = steps_of(data, layer)
            cfg = LocksConfig(budget=steps.budget(BUDGET_FRACTION), rank=8, summary_format=fmt)
            means.append(steps.mass_vs_oracle("locks", cfg).mean().item())
        worst[fmt] = min(means)
    with capsys.disabled():
        print(f"\nworst layer mass / oracle at {BUDGET_FRACTION:.2%}: {worst}")
    assert worst["colwise8"] >= worst["chanlog"] >= worst["colwise"], worst
