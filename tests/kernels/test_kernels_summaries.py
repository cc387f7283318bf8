"""Triton summary build against its ops twin: the Jacobi eigensolver, colwise8 summaries, real keys, the cache
walks for prefill and for the page a decode step completes, and NaN-poisoned summaries."""

import pytest
import torch

import locks_kernels as lk
from locks_engine import LocksConfig
from locks_engine.ops import build_cache_summaries, build_page_summaries, score_pages
from tests.support.helpers import assert_close, make_scenario
from tests.support.kernels_support import (
    DEVICE, ON_GPU, allocate_summaries, as_store, on_device, real_scenario, requires_kernels,
)

pytestmark = requires_kernels


def _reconstruction(summaries):
    centroid, basis, coeffs = summaries.dequantize()  # [P,H,D], [P,H,r,D], [P,H,B,r]
    return centroid.unsqueeze(2) + coeffs @ basis  # [P, H, B, D]


MATRICES = {
    "gram_d128": lambda g: (lambda x: x @ x.mT)(torch.randn(16, 128, generator=g)),
    "rank3": lambda g: (lambda x: x @ x.mT)(torch.randn(16, 3, generator=g)),
    "zeros": lambda g: torch.zeros(16, 16),
    "all_ones": lambda g: torch.ones(16, 16),
    "diagonal": lambda g: torch.diag(torch.randn(16, generator=g)),
    "indefinite": lambda g: (lambda x: x + x.mT)(torch.randn(16, 16, generator=g)),
}


@pytest.mark.parametrize("gather", [True, False], ids=["gathers", "products"])
@pytest.mark.parametrize("name", MATRICES)
def test_batched_eigh_matches_torch(name, gather):
    """Both ways of applying a Jacobi round's rotations give torch's eigenvalues and an orthonormal basis."""
    g = torch.Generator().manual_seed(0)
    a = torch.stack([MATRICES[name](g) for _ in range(3)]).to(DEVICE)
    lam, u = lk.batched_eigh(a, gather=gather)
    ref = torch.linalg.eigh(a.double().cpu()).eigenvalues.flip(-1)
    scale = a.double().cpu().norm(dim=(1, 2)).clamp_min(1e-12).unsqueeze(1)
    assert ((lam.double().cpu() - ref).abs() / scale).max() < 1e-5
    eye = torch.eye(16, device=DEVICE)
    assert (u.mT @ u - eye).abs().max() < 1e-5, "eigenvectors orthonormal"
    rebuilt = u @ torch.diag_embed(lam) @ u.mT
    assert_close("A = U diag(lam) U^T", a, rebuilt, 1e-5)


@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("rank", [8, 2, 16], ids=lambda r: f"r{r}")
def test_page_summaries_match_ops(head_dim, rank):
    gen = torch.Generator().manual_seed(rank + head_dim)
    keys = torch.randn(6 if ON_GPU else 2, 16, 2, head_dim, generator=gen)
    keys[..., 0] += 20.0  # a large near-constant channel, as real keys have
    ref = build_page_summaries(keys, LocksConfig(rank=rank))
    out = lk.build_page_summaries(keys.to(DEVICE), rank, out=allocate_summaries(keys.shape[0], 2, head_dim, rank,
                                                                                 poison=True))
    for name, tensor, expected in zip(("centroid", "basis", "coeffs", "basis_scale", "coeffs_scale"), out,
                                      ref.colwise8()):
        assert tensor.shape == expected.shape and tensor.dtype == expected.dtype, name
        assert torch.isfinite(tensor.float()).all() and (tensor != 99).any(), name
    # eigenvector signs are arbitrary: compare what the summary stands for, the reconstructed keys
    assert_close("colwise8 reconstruction", _reconstruction(ref), _reconstruction(as_store(out)), 2e-2)


def test_degenerate_pages_give_finite_summaries():
    keys = torch.zeros(3, 16, 2, 64)
    keys[1] = 5.0  # identical keys: zero spread
    keys[2, :, :, 0] = torch.arange(16.0).unsqueeze(1)  # rank one
    out = lk.build_page_summaries(keys.to(DEVICE), 8)
    for tensor in out:
        assert torch.isfinite(tensor.float()).all()
    assert_close("colwise8", keys, _reconstruction(as_store(out)).transpose(1, 2), 0.02)


@pytest.mark.parametrize("layer", [0, 12, 23], ids=lambda layer: f"L{layer}")
def test_real_keys_score_like_ops(layer):
    sc = real_scenario(layer, num_tokens=2048 if ON_GPU else 160)
    cfg = LocksConfig()
    ref = build_cache_summaries(sc.k_cache.cpu(), sc.block_table.cpu(), sc.seq_lens.cpu(), cfg)
    out = allocate_summaries(ref.num_pages, 1, 64)
    lk.build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, out, sc.page_size)
    args = (sc.block_table.cpu(), sc.seq_lens.cpu(), sc.page_size, sc.block_size)
    s_ref = score_pages(sc.q.cpu(), ref, *args)[0]
    s_out = score_pages(sc.q.cpu(), as_store(out), *args)[0]
    # fp32 instead of fp64 moves a few int8 roundings: far below the 0.3-nat bound of the format itself
    gap = (s_out - s_ref).abs()
    assert gap.mean() < 0.01 and gap.max() < 0.3, f"mean {gap.mean():.4f}, max {gap.max():.4f} nats"


def test_cache_walks_match_ops():
    lengths = [40, 16, 7, 100] if ON_GPU else [40, 16, 7]
    sc = make_scenario(lengths, num_kv_heads=2, groups=3, head_dim=64, seed=3)
    cfg = LocksConfig()
    ppb = sc.block_size // sc.page_size
    ref = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, cfg)
    dev = on_device(sc)
    out = allocate_summaries(ref.num_pages, 2, 64, poison=True)
    lk.build_cache_summaries(dev.k_cache, dev.block_table, dev.seq_lens, out, sc.page_size)
    complete = [int(sc.block_table[s, j // ppb]) * ppb + j % ppb for s, n in enumerate(lengths) for j in range(n // 16)]
    ids = torch.tensor(complete)
    assert_close("complete pages", _reconstruction(ref.index(ids)), _reconstruction(as_store(out).index(ids)), 2e-2)
    # decode: lengths + 1 token; only sequences whose token completes a page (here 47 -> no, 31 -> no, ...)
    step_lens = torch.tensor([48, 17, 16] + ([101] if ON_GPU else []), dtype=torch.int32)
    summaries = allocate_summaries(ref.num_pages, 2, 64, poison=True)
    lk.build_completed_page_summaries(dev.k_cache, dev.block_table, step_lens.to(DEVICE), summaries, sc.page_size)
    written = torch.isfinite(summaries[0].float()).all(dim=(1, 2)).nonzero().flatten().cpu().tolist()
    expected = [int(sc.block_table[0, 2 // ppb]) * ppb + 2 % ppb, int(sc.block_table[2, 0]) * ppb]
    assert sorted(written) == sorted(expected)
    step_ref = build_cache_summaries(sc.k_cache, sc.block_table, step_lens, cfg)
    assert_close("completed page", _reconstruction(step_ref.index(torch.tensor(expected[:1]))),
                 _reconstruction(as_store(summaries).index(torch.tensor(expected[:1]))), 2e-2)
