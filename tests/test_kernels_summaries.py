"""Triton summary build against its ops twin: the Jacobi eigensolver, every format, real keys, the cache
walks for prefill and for the page a decode step completes, and NaN-poisoned stores."""

import pytest
import torch

import locks_kernels as lk
from locks_engine import LocksConfig
from locks_engine.config import SUMMARY_FORMATS
from locks_engine.ops import (
    PageSummaries, allocate_page_summaries, build_cache_summaries, build_page_summaries, score_pages,
)
from tests.helpers import assert_close, make_scenario
from tests.kernels_support import DEVICE, ON_GPU, on_device, poisoned, real_scenario, requires_kernels

pytestmark = requires_kernels


def _reconstruction(summaries):
    centroid, basis, coeffs = summaries.dequantize()  # [P,H,D], [P,H,r,D], [P,H,B,r]
    return centroid.unsqueeze(2) + coeffs @ basis  # [P, H, B, D]


def _poisoned_store(num_pages, heads, dim, cfg):
    store = allocate_page_summaries(num_pages, heads, dim, cfg, DEVICE)
    for tensor in store.tensors().values():
        tensor.copy_(poisoned(tensor.shape, tensor.dtype))
    return store


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


@pytest.mark.parametrize("fmt", SUMMARY_FORMATS)
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("rank", [8, 2, 16], ids=lambda r: f"r{r}")
def test_page_summaries_match_ops(fmt, head_dim, rank):
    gen = torch.Generator().manual_seed(rank + head_dim)
    keys = torch.randn(6 if ON_GPU else 2, 16, 2, head_dim, generator=gen)
    keys[..., 0] += 20.0  # a large near-constant channel, as real keys have
    cfg = LocksConfig(rank=rank, summary_format=fmt)
    ref = build_page_summaries(keys, cfg)
    out = lk.build_page_summaries(keys.to(DEVICE), cfg, out=_poisoned_store(keys.shape[0], 2, head_dim, cfg))
    for name, tensor in out.tensors().items():
        assert tensor.shape == getattr(ref, name).shape and tensor.dtype == getattr(ref, name).dtype, name
        assert torch.isfinite(tensor.float()).all(), name
    # eigenvector signs are arbitrary: compare what the summary stands for, the reconstructed keys
    tolerance = 1e-3 if fmt == "float" else 2e-2
    assert_close(f"{fmt} reconstruction", _reconstruction(ref), _reconstruction(out).cpu(), tolerance)


@pytest.mark.parametrize("fmt", SUMMARY_FORMATS)
def test_degenerate_pages_give_finite_summaries(fmt):
    keys = torch.zeros(3, 16, 2, 64)
    keys[1] = 5.0  # identical keys: zero spread
    keys[2, :, :, 0] = torch.arange(16.0).unsqueeze(1)  # rank one
    out = lk.build_page_summaries(keys.to(DEVICE), LocksConfig(summary_format=fmt))
    for name, tensor in out.tensors().items():
        assert torch.isfinite(tensor.float()).all(), name
    assert_close(fmt, keys, _reconstruction(out).transpose(1, 2).cpu(), 0.02)


@pytest.mark.parametrize("fmt", ["colwise8", "chanlog", "colwise", "paper"])
@pytest.mark.parametrize("layer", [0, 12, 23], ids=lambda layer: f"L{layer}")
def test_real_keys_score_like_ops(fmt, layer):
    sc = real_scenario(layer, num_tokens=2048 if ON_GPU else 160)
    cfg = LocksConfig(summary_format=fmt)
    ref = build_cache_summaries(sc.k_cache.cpu(), sc.block_table.cpu(), sc.seq_lens.cpu(), cfg)
    out = lk.build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, cfg)
    args = (sc.block_table.cpu(), sc.seq_lens.cpu(), sc.page_size, sc.block_size)
    s_ref = score_pages(sc.q.cpu(), ref, *args)[0]
    s_out = score_pages(sc.q.cpu(), PageSummaries(fmt, **{k: v.cpu() for k, v in out.tensors().items()}), *args)[0]
    # fp32 instead of fp64 moves a few int4 roundings: far below the 0.3-nat bound of the format itself
    gap = (s_out - s_ref).abs()
    assert gap.mean() < 0.01 and gap.max() < 0.3, f"mean {gap.mean():.4f}, max {gap.max():.4f} nats"


@pytest.mark.parametrize("fmt", ["colwise8", "chanlog", "colwise", "float"])
def test_cache_walks_match_ops(fmt):
    lengths = [40, 16, 7, 100] if ON_GPU else [40, 16, 7]
    sc = make_scenario(lengths, num_kv_heads=2, groups=3, head_dim=64, seed=3)
    cfg = LocksConfig(summary_format=fmt)
    ppb = sc.block_size // sc.page_size
    ref = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, cfg)
    dev = on_device(sc)
    out = lk.build_cache_summaries(dev.k_cache, dev.block_table, dev.seq_lens, cfg,
                                   store=_poisoned_store(ref.num_pages, 2, 64, cfg))
    complete = [int(sc.block_table[s, j // ppb]) * ppb + j % ppb for s, n in enumerate(lengths) for j in range(n // 16)]
    ids = torch.tensor(complete)
    assert_close("complete pages", _reconstruction(ref.index(ids)), _reconstruction(out.index(ids.to(DEVICE))).cpu(),
                 1e-3 if fmt == "float" else 2e-2)
    # decode: lengths + 1 token; only sequences whose token completes a page (here 47 -> no, 31 -> no, ...)
    step_lens = torch.tensor([48, 17, 16] + ([101] if ON_GPU else []), dtype=torch.int32)
    store = _poisoned_store(ref.num_pages, 2, 64, cfg)
    lk.build_completed_page_summaries(dev.k_cache, dev.block_table, step_lens.to(DEVICE), store, cfg)
    written = torch.isfinite(store.centroid.float()).all(dim=(1, 2)).nonzero().flatten().cpu().tolist()
    expected = [int(sc.block_table[0, 2 // ppb]) * ppb + 2 % ppb, int(sc.block_table[2, 0]) * ppb]
    assert sorted(written) == sorted(expected)
    step_ref = build_cache_summaries(sc.k_cache, sc.block_table, step_lens, cfg)
    assert_close("completed page", _reconstruction(step_ref.index(torch.tensor(expected[:1]))),
                 _reconstruction(store.index(torch.tensor(expected[:1], device=DEVICE))).cpu(),
                 1e-3 if fmt == "float" else 2e-2)
