"""Triton sparse paged attention against its ops twin: GQA groups, head dims, dtypes, partial last pages,
vLLM's packed K|V cache, budgets at and past the page count (= dense attention), empty rows, poisoned outputs."""

import pytest
import torch

import locks_kernels as lk
from locks_engine import LocksConfig
from locks_engine.ops import dense_paged_attention, select_pages, sparse_paged_attention
from tests.support.helpers import assert_close, make_scenario
from tests.support.kernels_support import DEVICE, ON_GPU, on_device, poisoned, real_scenario, requires_kernels

pytestmark = requires_kernels

DTYPES = {"fp32": (torch.float32, 1e-5), "bf16": (torch.bfloat16, 1e-2), "fp16": (torch.float16, 2e-3)}


def _selection(sc, budget, seed, dense=False):
    pmax = sc.block_table.shape[1] * sc.block_size // sc.page_size
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(sc.q.shape[0], sc.q.shape[1], pmax, generator=gen)
    return select_pages(scores, sc.seq_lens.cpu(), sc.k_cache.shape[2], LocksConfig(budget=budget, dense=dense))


def _run(sc, selected, **kwargs):
    dev = on_device(sc)
    out, lse = poisoned(dev.q.shape, dev.q.dtype), poisoned(dev.q.shape[:2], torch.float32)
    lk.sparse_paged_attention(dev.q, dev.k_cache, dev.v_cache, dev.block_table, dev.seq_lens, selected.to(DEVICE),
                              sc.page_size, out=out, lse=lse, **kwargs)
    return out.cpu(), lse.cpu()


def _check(name, ref, out, tolerance):
    (r_out, r_lse), (o_out, o_lse) = ref, out
    assert torch.equal(torch.isinf(r_lse), torch.isinf(o_lse)), f"{name}: -inf rows differ"
    assert_close(f"{name} out", r_out.float(), o_out.float(), tolerance)
    finite = torch.isfinite(r_lse)
    assert_close(f"{name} lse", r_lse[finite], o_lse[finite], 1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPES.keys())
@pytest.mark.parametrize("groups", [1, 4, 7], ids=lambda g: f"gqa{g}")
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
def test_sparse_attention_matches_ops(dtype, groups, head_dim):
    torch_dtype, tolerance = DTYPES[dtype]
    if not ON_GPU and (dtype == "bf16" or head_dim == 128):
        pytest.skip("interpreter: small cases only, and its bf16 products are wrong")
    lengths = [40, 16, 7, 1000, 1] if ON_GPU else [40, 7, 300, 1]
    sc = make_scenario(lengths, num_kv_heads=2, groups=groups, head_dim=head_dim, seed=groups, dtype=torch_dtype)
    selected = _selection(sc, budget=160, seed=groups)
    ref = sparse_paged_attention(sc.q.float(), sc.k_cache.float(), sc.v_cache.float(), sc.block_table, sc.seq_lens,
                                 selected, sc.page_size)
    _check(dtype, ref, _run(sc, selected, tile_pages=2), tolerance)


@pytest.mark.parametrize("pages_per_split", [None, 2, 64], ids=["auto", "pps2", "pps64"])
def test_budget_past_page_count_is_dense_attention(pages_per_split):
    lengths = [40, 16, 7, 333] if ON_GPU else [40, 7, 93]
    sc = make_scenario(lengths, num_kv_heads=2, groups=4, head_dim=64, seed=1)
    ref = dense_paged_attention(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens)
    for budget, dense in ((16 * 64, False), (48, True)):  # past every sequence's pages; the dense switch
        selected = _selection(sc, budget=budget, seed=2, dense=dense)
        _check(f"budget {budget}", ref, _run(sc, selected, tile_pages=2, pages_per_split=pages_per_split), 1e-5)


def test_vllm_packed_cache_and_real_keys():
    sc = real_scenario(12, num_tokens=2048 if ON_GPU else 300)
    packed = torch.cat((sc.k_cache, sc.v_cache), dim=-1)  # [num_blocks, block_size, H, 2D] as vLLM packs it
    k_view, v_view = packed[..., :64], packed[..., 64:]
    selected = _selection(sc, budget=256, seed=3).to(DEVICE)
    ref = sparse_paged_attention(sc.q.cpu(), sc.k_cache.cpu(), sc.v_cache.cpu(), sc.block_table.cpu(),
                                 sc.seq_lens.cpu(), selected.cpu(), 16)
    out = lk.sparse_paged_attention(sc.q, k_view, v_view, sc.block_table, sc.seq_lens, selected, 16)
    _check("packed", ref, tuple(t.cpu() for t in out), 1e-5)


def test_rows_that_read_nothing_give_zeros_and_minus_inf():
    sc = make_scenario([40, 7], num_kv_heads=2, groups=2, head_dim=64, seed=4)
    selected = torch.full((2, 2, 5), -1, dtype=torch.int64)
    selected[1, 1, 0] = 0
    out, lse = _run(sc, selected)
    assert (out[0] == 0).all() and torch.isinf(lse[0]).all() and (lse[0] < 0).all()
    assert torch.isfinite(lse[1, 2:]).all() and torch.isinf(lse[1, :2]).all()
