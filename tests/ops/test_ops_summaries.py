"""Page summaries and scoring: exact at full rank, bounded error when quantized, sizes as allocated."""

import pytest
import torch

from locks_engine import LocksConfig
from locks_engine.config import LOCKS_FORMATS
from locks_engine.ops import (
    build_cache_summaries,
    build_page_summaries,
    oracle_scores,
    score_pages,
    summary_bytes,
)
from locks_engine.ops.quant import log2_scale, pack_int4, quantize_log2_scale, unpack_int4
from tests.support.helpers import assert_close, make_scenario

# The stated bound of build_page_summaries' docstring for quantized formats (see test below).
QUANTIZED_SCORE_BOUND = 0.3


@pytest.mark.parametrize("groups", [1, 4, 7], ids=lambda g: f"gqa{g}")
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("lengths", [[16], [17], [100, 333, 1]], ids=["one_page", "partial", "odd"])
def test_full_rank_float_score_is_exact_page_lse(groups, head_dim, lengths):
    sc = make_scenario(lengths, num_kv_heads=2, groups=groups, head_dim=head_dim, seed=groups, key_offset=20.0)
    cfg = LocksConfig(rank=16, summary_format="float")
    store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, cfg)
    est = score_pages(sc.q, store, sc.block_table, sc.seq_lens, sc.page_size, sc.block_size)
    exact = oracle_scores(sc.q, sc.k_cache, sc.block_table, sc.seq_lens, sc.page_size)
    complete = torch.isfinite(exact)
    assert torch.equal(torch.isfinite(est), complete)
    assert_close("page lse", exact[complete], est[complete], 1e-5)


def _reconstruction(summaries):
    centroid, basis, coeffs = summaries.dequantize()  # [P,H,D], [P,H,r,D], [P,H,B,r]
    return centroid.unsqueeze(2) + coeffs @ basis  # [P, H, B, D]


@pytest.mark.parametrize("fmt", ["paper", "colwise", "chanlog", "colwise8"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
def test_quantized_score_error_within_stated_bounds(fmt, head_dim):
    """Two bounds on |s_quantized - s_float| at the same rank r = 8:
    - per page (Cauchy-Schwarz, logsumexp is 1-Lipschitz in the max norm):
      scale * |q| * max_i |k_hat_i - k_float_i|, k_* the two reconstructions;
    - on keys with standard-normal entries and queries of norm sqrt(D): at most QUANTIZED_SCORE_BOUND nats.
    """
    for seed in range(6):
        sc = make_scenario([16 * 24], num_kv_heads=2, groups=4, head_dim=head_dim, seed=seed)
        q = sc.q / sc.q.norm(dim=-1, keepdim=True) * head_dim**0.5
        exact = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, LocksConfig(summary_format="float"))
        quant = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, LocksConfig(summary_format=fmt))
        s_f = score_pages(q, exact, sc.block_table, sc.seq_lens, sc.page_size, sc.block_size)
        s_q = score_pages(q, quant, sc.block_table, sc.seq_lens, sc.page_size, sc.block_size)
        err = (s_q - s_f).abs()[0]  # [HQ, P]
        assert torch.isfinite(err).all()
        assert err.max() <= QUANTIZED_SCORE_BOUND, f"seed {seed}: {float(err.max()):.3f} nats"
        ids = (sc.block_table[0].long().unsqueeze(1) * 2 + torch.arange(2)).flatten()  # physical pages, ppb=2
        gap = (_reconstruction(quant.index(ids)) - _reconstruction(exact.index(ids))).norm(dim=-1)  # [P, H, B]
        page_bound = head_dim**-0.5 * head_dim**0.5 * gap.amax(dim=-1).repeat_interleave(4, dim=1)  # [P, HQ]
        assert (err <= page_bound.T + 1e-4).all()


@pytest.mark.parametrize("fmt", LOCKS_FORMATS)
def test_degenerate_pages_give_finite_summaries(fmt):
    keys = torch.zeros(3, 16, 2, 64)
    keys[1] = 5.0  # identical keys: zero spread
    keys[2, :, :, 0] = torch.arange(16.0).unsqueeze(1)  # rank one
    summaries = build_page_summaries(keys, LocksConfig(summary_format=fmt))
    for name, tensor in summaries.tensors().items():
        assert torch.isfinite(tensor.float()).all(), name
    rebuilt = _reconstruction(summaries).transpose(1, 2)  # [P, B, H, D]
    assert_close(fmt, keys, rebuilt, 0.02)


def test_summary_sizes_from_allocated_tensors(capsys):
    rows = {}
    for fmt in LOCKS_FORMATS:
        for rank in (2, 8):
            summary, kv = summary_bytes(16, rank, 128, fmt, torch.bfloat16)
            rows[fmt, rank] = summary / kv
            print(f"B=16 D=128 r={rank} {fmt:8s}: {summary:5d} B summary / {kv} B K+V = {summary / kv:6.2%}")
    assert 0.09 <= rows["paper", 8] <= 0.12
    assert rows["paper", 2] < 0.05
    assert rows["colwise", 8] < 0.12
    assert rows["chanlog", 8] < 0.13
    assert rows["colwise8", 8] < 0.18
    assert rows["float", 8] > 0.5


def test_summary_bytes_scale_with_shapes():
    small, kv_small = summary_bytes(16, 8, 64, "paper", torch.float16)
    large, kv_large = summary_bytes(16, 8, 128, "paper", torch.float32)
    assert kv_large == 4 * kv_small
    assert small < large


def test_int4_pack_roundtrip():
    values = torch.randint(-7, 8, (5, 3, 64), dtype=torch.int8)
    packed = pack_int4(values)
    assert packed.dtype == torch.uint8 and packed.shape == (5, 3, 32)
    assert torch.equal(unpack_int4(packed), values)


def test_bad_keys_shape_is_rejected():
    with pytest.raises(ValueError, match="keys must have shape"):
        build_page_summaries(torch.zeros(2, 8, 1, 64), LocksConfig())
    with pytest.raises(ValueError, match="head dim 63 must be even"):
        build_page_summaries(torch.zeros(2, 16, 1, 63), LocksConfig(summary_format="chanlog"))
    # the int8 basis packs nothing: an odd head dim is fine in the ops (the Triton kernels need powers of two)
    assert build_page_summaries(torch.zeros(2, 16, 1, 63), LocksConfig(summary_format="colwise8")).basis.shape[-1] == 63


@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("rank", [1, 8, 16], ids=lambda r: f"r{r}")
def test_chanlog_bytes_from_allocated_tensors(head_dim, rank):
    """fp16 centroid ``2D``, int4 basis ``rD/2``, one log2 code per channel ``D``, int8 coefficients ``Br``,
    fp16 coefficient scales ``2r``: 1,040 B at B=16, r=8, D=128 (12.7% of bf16 K+V), 592 B at D=64."""
    summary, kv = summary_bytes(16, rank, head_dim, "chanlog", torch.bfloat16)
    assert summary == 2 * head_dim + rank * head_dim // 2 + head_dim + 16 * rank + 2 * rank
    assert kv == 2 * 16 * head_dim * 2
    if rank == 8:
        assert summary == {64: 592, 128: 1040}[head_dim]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("spread", [1e-3, 1.0, 300.0], ids=["small", "unit", "large"])
def test_log2_scale_quantization_never_clips_and_is_within_half_a_step(seed, spread):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 3, 8, 64, generator=gen, dtype=torch.float64) * spread
    x *= torch.logspace(-3, 2, 64, dtype=torch.float64)  # channels of very different sizes
    x[0, 0, :, 5] = 0.0  # an all-zero channel
    q, code = quantize_log2_scale(x, (-2,), 4)
    assert q.dtype == torch.int8 and code.dtype == torch.int8 and code.shape == (5, 3, 1, 64)
    scale = log2_scale(code).double()
    amax = x.abs().amax(dim=-2, keepdim=True)
    assert q.abs().max() <= 7
    live = amax > 1e-9
    # rounded up (no entry clips), by less than one step of 2 ** (1/4)
    assert (scale[live] * 7 >= amax[live] * (1 - 1e-6)).all()
    assert (scale[live] * 7 < amax[live] * 2**0.25 * (1 + 1e-6)).all()
    assert ((q.double() * scale - x).abs() <= scale / 2 * (1 + 1e-6)).all()
    assert (q[0, 0, :, 5] == 0).all()


def test_chanlog_round_trip_error_bound():
    """The dequantized basis is within half a step of each channel's scale of the fp64 basis (up to the
    sign of each direction), and the reconstruction is as close to the keys as colwise's or closer."""
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(8, 16, 2, 64, generator=gen) * torch.logspace(-2, 1, 64)
    keys[..., 3] += 40.0  # a large near-constant channel
    summaries = build_page_summaries(keys, LocksConfig(summary_format="chanlog"))
    exact = build_page_summaries(keys, LocksConfig(summary_format="float"))
    _, basis, _ = summaries.dequantize()
    step = log2_scale(summaries.basis_scale)  # [P, H, 1, D]
    ref = exact.basis * torch.sign((basis * exact.basis).sum(-1, keepdim=True))  # eigenvector signs are arbitrary
    # the centroid is rounded to fp16 first: the basis of the fp16-centered keys moves by about 1e-3
    assert ((basis - ref).abs() <= step / 2 + 2e-3).all()
    err = {}
    for fmt in ("chanlog", "colwise"):
        rebuilt = _reconstruction(build_page_summaries(keys, LocksConfig(summary_format=fmt)))
        err[fmt] = (rebuilt - _reconstruction(exact)).norm() / _reconstruction(exact).norm()
    assert err["chanlog"] < 0.04 and err["chanlog"] <= err["colwise"], err


def test_int8_basis_bytes_and_reconstruction():
    """``colwise8``: fp16 centroid ``2D``, int8 basis ``rD``, fp16 direction scales ``2r``, int8 coefficients
    ``Br``, fp16 coefficient scales ``2r`` (1,440 B at B=16, r=8, D=128; 800 B at D=64); on keys whose channels
    differ in size by three orders of magnitude it reconstructs them closer than ``chanlog``, and its basis is
    within half a step of each direction's scale of the fp64 basis (up to each direction's sign)."""
    for head_dim in (64, 128):
        summary, _ = summary_bytes(16, 8, head_dim, "colwise8", torch.bfloat16)
        assert summary == 2 * head_dim + 8 * head_dim + 2 * 8 + 16 * 8 + 2 * 8
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(8, 16, 2, 64, generator=gen) * torch.logspace(-2, 1, 64)
    keys[..., 3] += 40.0
    exact = build_page_summaries(keys, LocksConfig(summary_format="float"))
    int8 = build_page_summaries(keys, LocksConfig(summary_format="colwise8"))
    assert int8.basis.dtype == torch.int8 and int8.basis.shape == (8, 2, 8, 64)
    _, basis, _ = int8.dequantize()
    ref = exact.basis * torch.sign((basis * exact.basis).sum(-1, keepdim=True))
    assert ((basis - ref).abs() <= int8.basis_scale.float() / 2 + 2e-3).all()
    err = {}
    for fmt in ("colwise8", "chanlog"):
        rebuilt = _reconstruction(build_page_summaries(keys, LocksConfig(summary_format=fmt)))
        err[fmt] = (rebuilt - _reconstruction(exact)).norm() / _reconstruction(exact).norm()
    assert err["colwise8"] <= err["chanlog"], err


@pytest.mark.parametrize("fmt", ["chanlog", "colwise", "colwise8"])
@pytest.mark.parametrize("groups", [1, 7], ids=lambda g: f"gqa{g}")
def test_scores_fold_the_basis_scales(groups, fmt):
    """``score_pages`` never dequantizes the basis: ``V q = U_int (s * q)`` for per-channel scales (chanlog),
    ``s * (U_int q)`` for per-direction ones (colwise, colwise8); equal to Eq. 2 on the dequantized summaries."""
    sc = make_scenario([100, 333], num_kv_heads=2, groups=groups, head_dim=64, seed=7, key_offset=20.0)
    store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, LocksConfig(summary_format=fmt))
    folded = score_pages(sc.q, store, sc.block_table, sc.seq_lens, sc.page_size, sc.block_size)
    centroid, basis, coeffs = store.dequantize()
    plain = type(store)("float", centroid, basis, coeffs)
    ref = score_pages(sc.q, plain, sc.block_table, sc.seq_lens, sc.page_size, sc.block_size)
    assert torch.equal(torch.isinf(folded), torch.isinf(ref))
    finite = torch.isfinite(ref)
    assert_close(f"{fmt} scores", ref[finite], folded[finite], 1e-6)
