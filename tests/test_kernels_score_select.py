"""Triton scoring and selection against their ops twins: formats, GQA groups, partial pages, real keys, budgets
at and past the page count, NaN-poisoned outputs; top-k checked by the mass it keeps (ties make indices moot)."""

import pytest
import torch

import locks_kernels as lk
from locks_engine import LocksConfig
from locks_engine.config import SUMMARY_FORMATS
from locks_engine.ops import PageSummaries, build_cache_summaries, score_pages, select_pages
from locks_engine.ops.select import forced_page_mask, group_mass_shares
from tests.helpers import assert_close, make_scenario
from tests.kernels_support import (
    DEVICE, ON_GPU, on_device, poisoned, real_scenario, requires_bf16_dot, requires_kernels,
)

pytestmark = requires_kernels

LENGTHS = {"one_page": [16], "partial": [17], "odd": [100, 333, 1], "long": [1000, 16 * 40]}


def _store_on_device(store):
    return PageSummaries(store.summary_format, **{k: v.to(DEVICE) for k, v in store.tensors().items()})


def _check_scores(sc, fmt, q, tolerance, rank=8, **kernel_args):
    cfg = LocksConfig(summary_format=fmt, rank=rank)
    store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, cfg)
    ref = score_pages(q.float(), store, sc.block_table, sc.seq_lens, sc.page_size, sc.block_size)
    dev = on_device(sc)
    out = poisoned(ref.shape, torch.float32)
    lk.score_pages(q.to(DEVICE), _store_on_device(store), dev.block_table, dev.seq_lens, sc.page_size, sc.block_size,
                   out=out, **({"tile_pages": 16} | kernel_args))
    out = out.cpu()
    assert torch.equal(torch.isinf(out), torch.isinf(ref)) and not out.isnan().any(), "-inf exactly where ops has it"
    finite = torch.isfinite(ref)
    if finite.any():
        assert_close(f"{fmt} scores", ref[finite], out[finite], tolerance)


@pytest.mark.parametrize("fmt", SUMMARY_FORMATS)
@pytest.mark.parametrize("groups", [1, 4, 7], ids=lambda g: f"gqa{g}")
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("lengths", LENGTHS.values(), ids=LENGTHS.keys())
def test_scores_match_ops_fp32(fmt, groups, head_dim, lengths):
    if not ON_GPU and (len(lengths) > 1 or head_dim == 128):
        pytest.skip("interpreter: small cases only")
    sc = make_scenario(lengths, num_kv_heads=2, groups=groups, head_dim=head_dim, seed=groups, key_offset=20.0)
    # quantized formats multiply in fp16 on the tensor cores: an fp32 query is rounded to 11 bits
    _check_scores(sc, fmt, sc.q, 1e-5 if fmt == "float" else 1e-3)


@pytest.mark.parametrize("fmt", ["colwise8", "chanlog", "colwise"])
@pytest.mark.parametrize("rank", [1, 5, 16], ids=lambda r: f"r{r}")
def test_scores_match_ops_at_other_ranks(fmt, rank):
    # ranks that are not a power of two, and one that fills the 16 rows a matrix-unit product needs
    sc = make_scenario([200, 77], num_kv_heads=2, groups=4, head_dim=64, seed=rank, key_offset=20.0)
    _check_scores(sc, fmt, sc.q, 1e-3, rank)


@pytest.mark.parametrize("path,tile", [("fp16", 16), ("fp16", 32), ("int8", 8)])
@pytest.mark.parametrize("groups", [1, 4, 16], ids=lambda g: f"gqa{g}")
def test_chanlog_paths_match_ops(path, tile, groups):
    """Both ways of computing V q for per-channel scales (basis dequantized to an fp16 pair; scales folded into a
    per-page fixed-point query) give the ops scores, at D = 128, with a query that fp16 holds exactly."""
    sc = make_scenario([16 * 20 + 3, 16 * 9], num_kv_heads=2, groups=groups, head_dim=128, seed=groups, key_offset=20.0)
    _check_scores(sc, "chanlog", sc.q.bfloat16().float(), 1e-4, chanlog_path=path, tile_pages=tile)


@pytest.mark.parametrize("path", ["dot", "direction", "broadcast", "dot1", "half", "dot1t", "halft"])
@pytest.mark.parametrize("groups,rank", [(1, 8), (4, 5), (16, 8)], ids=lambda v: str(v))
def test_colwise8_coefficient_paths_match_ops(path, groups, rank):
    """Every way of contracting the B x r coefficients with V q (batched fp16 pair, per-direction FMAs, broadcast
    sum, batched with V q as one fp16 factor, the same with V q from an fp16 product, both of these transposed)
    gives the ops scores for colwise8, partial pages and a rank that is not a power of two included. ``dot1`` and
    ``half`` (and their transposes) round V q to fp16 once (2^-11 relative), hence their looser bound."""
    sc = make_scenario([16 * 20 + 3, 16 * 9], num_kv_heads=2, groups=groups, head_dim=128, seed=groups, key_offset=20.0)
    tolerance = 1e-3 if path in ("dot1", "half", "dot1t", "halft") else 1e-4
    _check_scores(sc, "colwise8", sc.q.bfloat16().float(), tolerance, rank, coef_path=path)


@pytest.mark.parametrize("ptx", [True, False], ids=["ptx", "plain"])
@pytest.mark.parametrize("path,groups", [("half", 4), ("dot1t", 16), ("dot", 7)], ids=lambda v: str(v))
def test_colwise8_scores_with_and_without_inline_ptx(path, groups, ptx):
    """The inline PTX (lg2.approx for the log-sum-exp, int8 -> fp16 four at a time) and Triton's own tl.log2 and
    conversions both give the ops scores (under the interpreter both run the plain code)."""
    sc = make_scenario([16 * 20 + 3, 16 * 9], num_kv_heads=2, groups=groups, head_dim=128, seed=groups, key_offset=20.0)
    tolerance = 1e-4 if path == "dot" else 1e-3
    _check_scores(sc, "colwise8", sc.q.bfloat16().float(), tolerance, coef_path=path, ptx=ptx)


def test_ptx_switch_from_the_environment(monkeypatch):
    import triton

    from locks_kernels.score import PTX_ENV, _score_pages_kernel, use_ptx

    compiled = isinstance(_score_pages_kernel, triton.runtime.JITFunction)  # False under the interpreter
    monkeypatch.delenv(PTX_ENV, raising=False)
    assert use_ptx() is compiled and use_ptx(False) is False and use_ptx(True) is compiled
    monkeypatch.setenv(PTX_ENV, "0")
    assert use_ptx() is False and use_ptx(True) is compiled


def test_unknown_coefficient_path_is_refused(monkeypatch):
    from locks_kernels.score import TUNING_ENV

    monkeypatch.delenv(TUNING_ENV, raising=False)
    sc = make_scenario([40], num_kv_heads=1, groups=1, head_dim=64, seed=0)
    with pytest.raises(ValueError, match="coef_path='fma'"):
        lk.score_pages(sc.q, None, sc.block_table, sc.seq_lens, 16, 16, coef_path="fma")


PERSISTENT_LENGTHS = {"one_page": [16], "partial": [17], "mixed": [16 * 20 + 3, 16 * 9, 5], "empty_tail": [16 * 70]}


@pytest.mark.parametrize("path", ["dot1t", "halft"])
@pytest.mark.parametrize("groups", [1, 4, 16], ids=lambda g: f"gqa{g}")
@pytest.mark.parametrize("programs", [1, 3], ids=lambda p: f"{p}_per_sm")
@pytest.mark.parametrize("lengths", PERSISTENT_LENGTHS.values(), ids=PERSISTENT_LENGTHS.keys())
def test_persistent_scores_match_ops_and_the_grid_kernel(path, groups, programs, lengths):
    """The persistent grid (programs walking the tiles with the next tile's loads in flight) gives the ops scores
    and exactly the grid kernel's for the same path: sequences shorter than a page, partial tiles, programs with
    no live tile, sequences whose block table has room past their pages (``-inf`` written there)."""
    sc = make_scenario(lengths, num_kv_heads=2, groups=groups, head_dim=128, seed=groups + programs,
                       key_offset=20.0)
    # room for 48 more pages in every row of the block table (three whole tiles with no live page)
    sc.block_table = torch.cat([sc.block_table, torch.zeros(len(lengths), 24, dtype=torch.int32)], dim=1)
    q = sc.q.bfloat16().float()
    _check_scores(sc, "colwise8", q, 1e-3, coef_path=path, programs_per_sm=programs)
    store = _store_on_device(build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens,
                                                   LocksConfig(summary_format="colwise8")))
    dev = on_device(sc)
    grid, persistent = (lk.score_pages(q.to(DEVICE), store, dev.block_table, dev.seq_lens, sc.page_size,
                                       sc.block_size, tile_pages=16, coef_path=path, programs_per_sm=p).cpu()
                        for p in (0, programs))
    assert torch.equal(grid, persistent)


@pytest.mark.parametrize("path", ["dot1tc", "halftc"])
@pytest.mark.parametrize("groups", [1, 4, 16], ids=lambda g: f"gqa{g}")
def test_persistent_centroid_shifted_lse_matches_ops(path, groups):
    """The log-sum-exp shifted by each page's centroid logit instead of its largest logit gives the ops scores,
    with logits spread far around the centroid's (a query scaled by 6: tens of nats across a page)."""
    sc = make_scenario([16 * 20 + 3, 16 * 9, 5], num_kv_heads=2, groups=groups, head_dim=128, seed=groups,
                       key_offset=20.0)
    sc.block_table = torch.cat([sc.block_table, torch.zeros(3, 24, dtype=torch.int32)], dim=1)
    for q in (sc.q, 6.0 * sc.q):
        _check_scores(sc, "colwise8", q.bfloat16().float(), 1e-3, coef_path=path, programs_per_sm=2)


@pytest.mark.parametrize("path", ["dot1t", "dot1tc", "halftc"])
@pytest.mark.parametrize("groups", [1, 4, 16], ids=lambda g: f"gqa{g}")
def test_persistent_lse_partials_give_each_heads_log_sum_exp(path, groups):
    """The persistent kernel's per-program partials combine to the log-sum-exp of each query head's scores over
    its pages (programs with no page: ``-inf`` and 0), and asking for them leaves the scores as they were."""
    lengths = [16 * 20 + 3, 16 * 9, 5]
    sc = make_scenario(lengths, num_kv_heads=2, groups=groups, head_dim=128, seed=7 + groups, key_offset=20.0)
    sc.block_table = torch.cat([sc.block_table, torch.zeros(3, 24, dtype=torch.int32)], dim=1)
    store = _store_on_device(build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens,
                                                   LocksConfig(summary_format="colwise8")))
    dev = on_device(sc)
    args = (sc.q.bfloat16().to(DEVICE), store, dev.block_table, dev.seq_lens, sc.page_size, sc.block_size)
    kw = dict(coef_path=path, programs_per_sm=2)
    alone = lk.score_pages(*args, **kw).cpu()
    scores, parts = lk.score_pages(*args, lse_partials=True, **kw)
    scores, parts = scores.cpu(), parts.cpu()
    assert torch.equal(scores, alone)
    assert parts.shape[:2] == (3, 2 * groups) and parts.shape[3] == 2
    m, l = parts[..., 0], parts[..., 1]
    assert torch.equal(m == float("-inf"), l == 0), "a program with no page writes (-inf, 0), and only then"
    top = m.amax(-1, keepdim=True).clamp(min=-1e30)  # a sequence with no complete page: -inf throughout
    combined = top.squeeze(-1) + torch.log((l * torch.exp(m - top)).sum(-1))
    expected = torch.logsumexp(scores.double(), dim=-1).float()
    torch.testing.assert_close(combined, expected, rtol=1e-5, atol=1e-5)
    grid_scores, none = lk.score_pages(*args, lse_partials=True, coef_path="dot1t", programs_per_sm=0)
    assert none is None and torch.equal(grid_scores.cpu(), lk.score_pages(*args, coef_path="dot1t",
                                                                         programs_per_sm=0).cpu())


def test_persistent_scores_with_a_register_cap_are_the_same():
    """Capping the persistent kernel's registers (so that more programs fit an SM) changes where values live, not
    what is computed: the same scores to the bit."""
    from locks_kernels.score_tuning import register_cap

    sc = make_scenario([16 * 40 + 7, 16 * 3], num_kv_heads=2, groups=16, head_dim=128, seed=3, key_offset=20.0)
    store = _store_on_device(build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens,
                                                   LocksConfig(summary_format="colwise8")))
    dev = on_device(sc)
    free, capped = (lk.score_pages(sc.q.bfloat16().to(DEVICE), store, dev.block_table, dev.seq_lens, sc.page_size,
                                   sc.block_size, coef_path="dot1tc", programs_per_sm=5, max_registers=cap).cpu()
                    for cap in (None, register_cap(5, 4)))
    assert torch.equal(free, capped) and torch.isfinite(free).any()


def test_persistent_grid_refuses_other_formats_and_paths():
    sc = make_scenario([40], num_kv_heads=1, groups=4, head_dim=64, seed=0)
    for fmt, path in (("chanlog", "dot1t"), ("colwise8", "dot")):
        store = _store_on_device(build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens,
                                                       LocksConfig(summary_format=fmt)))
        dev = on_device(sc)
        with pytest.raises(ValueError, match="persistent score kernel takes colwise8"):
            lk.score_pages(sc.q.to(DEVICE), store, dev.block_table, dev.seq_lens, 16, sc.block_size, coef_path=path,
                           programs_per_sm=2)
    with pytest.raises(ValueError, match="persistent score kernel only"):
        lk.score_pages(sc.q.to(DEVICE), store, dev.block_table, dev.seq_lens, 16, sc.block_size, coef_path="dot1tc",
                       programs_per_sm=0)


@requires_bf16_dot
@pytest.mark.parametrize("fmt", ["colwise8", "chanlog", "colwise", "paper"])
@pytest.mark.parametrize("groups", [4, 16], ids=lambda g: f"gqa{g}")
def test_scores_match_ops_bf16_query(fmt, groups):
    sc = make_scenario([16 * 70 + 5, 3000], num_kv_heads=2, groups=groups, head_dim=128, seed=5, key_offset=20.0)
    # q . mu is exact (bf16 in fp16); V q carries q as a 16-bit fixed-point pair (error <= max|q| / 65024) on the
    # exact colwise8 path (the default ones round V q to fp16: test_default_colwise8_path_on_real_keys_keeps_the_mass)
    _check_scores(sc, fmt, sc.q.bfloat16(), 1e-4, coef_path="dot")


@pytest.mark.parametrize("fmt", ["colwise8", "chanlog", "colwise"])
@pytest.mark.parametrize("layer", [0, 12, 23], ids=lambda layer: f"L{layer}")
def test_scores_on_real_keys(fmt, layer):
    sc = real_scenario(layer, num_tokens=2048 if ON_GPU else 200)
    cpu = type(sc)(*(t.cpu() for t in (sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens)), sc.page_size)
    _check_scores(cpu, fmt, cpu.q.half(), 1e-4, coef_path="dot")  # fp16 queries, as the fixture stores them


@pytest.mark.parametrize("layer", [0, 12, 23], ids=lambda layer: f"L{layer}")
def test_default_colwise8_path_on_real_keys_keeps_the_mass(layer):
    """colwise8's default path (the persistent kernel, V q rounded to fp16 once, ~2^-11 relative, the log-sum-exp
    shifted by the centroid logit): on real keys (large near-constant channels, rotated by RoPE) its scores stay
    within 5e-4 relative RMSE of the ops scores, and the pages it selects at a budget of a quarter of the pages keep
    the attention mass (the ops scores' group shares) that the exact selection keeps."""
    sc = real_scenario(layer, num_tokens=2048 if ON_GPU else 1024)
    cpu = type(sc)(*(t.cpu() for t in (sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens)), sc.page_size)
    cfg = LocksConfig(summary_format="colwise8", budget=int(cpu.seq_lens[0]) // 4)
    store = build_cache_summaries(cpu.k_cache, cpu.block_table, cpu.seq_lens, cfg)
    q = cpu.q.half()
    ref = score_pages(q.float(), store, cpu.block_table, cpu.seq_lens, cpu.page_size, cpu.block_size)
    out = lk.score_pages(q.to(DEVICE), _store_on_device(store), sc.block_table, sc.seq_lens, cpu.page_size,
                         cpu.block_size).cpu()
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(out), finite)
    assert_close("colwise8 default-path scores", ref[finite], out[finite], 5e-4)
    shares = group_mass_shares(ref, 1)

    def kept(scores):
        pages = select_pages(scores, cpu.seq_lens, 1, cfg)
        return (shares.gather(-1, pages.clamp(min=0)) * (pages >= 0)).sum().item()

    assert cfg.budget_pages < finite.sum().item()  # a real choice
    assert kept(out) >= kept(ref) - 1e-3


def _random_scores(seqs, heads, pmax, seq_lens, seed):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(seqs, heads, pmax, generator=gen) * 3
    complete = torch.arange(pmax) < (seq_lens.long() // 16).unsqueeze(1)
    return scores.masked_fill(~complete.unsqueeze(1), float("-inf"))


SELECT_CASES = {
    "long_partial": ([1000, 333], 70, 160),
    "budget_at_pages": ([16 * 10, 16 * 10], 10, 160),
    "budget_past_pages": ([40, 5], 70, 160),
    "budget_at_pmax": ([1000, 333], 70, 16 * 70),
    "budget_past_pmax": ([1000, 5], 70, 10**12),
    "one_token": ([1, 16 * 70], 70, 160),
    "many_chunks": ([16 * 5000 - 3, 16 * 3000], 5000, 2048),
}


@pytest.mark.parametrize("case", SELECT_CASES.values(), ids=SELECT_CASES.keys())
@pytest.mark.parametrize("groups", [1, 4, 7], ids=lambda g: f"gqa{g}")
@pytest.mark.parametrize("sink,recent", [(1, 1), (2, 3), (0, 0)], ids=["s1r1", "s2r3", "s0r0"])
def test_selection_matches_ops_by_mass(case, groups, sink, recent):
    lengths, pmax, budget = case
    if not ON_GPU and pmax > 1000:
        pytest.skip("interpreter: small cases only")
    cfg = LocksConfig(budget=budget, sink_pages=sink, recent_pages=recent)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    scores = _random_scores(len(lengths), 2 * groups, pmax, seq_lens, seed=pmax + groups)
    scores[0, 0, 3] = scores[0, 0, 4] = 1.0  # a tie
    ref = select_pages(scores, seq_lens, 2, cfg)
    out = poisoned(ref.shape, torch.int64)
    lk.select_pages(scores.to(DEVICE), seq_lens.to(DEVICE), 2, cfg, out=out)
    out = out.cpu()
    assert torch.equal(out >= 0, ref >= 0), "same number of pages per row, padding at the end"
    shares = group_mass_shares(scores, 2)
    forced = forced_page_mask(seq_lens, pmax, cfg)
    for s in range(len(lengths)):
        for h in range(2):
            pages = out[s, h][out[s, h] >= 0]
            assert torch.equal(pages, pages.unique()), "ascending, no duplicates"
            assert set(forced[s].nonzero().flatten().tolist()) <= set(pages.tolist())
            kept, best = shares[s, h][pages].sum(), shares[s, h][ref[s, h][ref[s, h] >= 0]].sum()
            assert torch.isclose(kept, best, rtol=1e-5, atol=1e-7), "top-k by group share"


@pytest.mark.parametrize("groups", [1, 4, 16], ids=lambda g: f"gqa{g}")
@pytest.mark.parametrize("chunk", [32, None], ids=["chunk32", "default_chunk"])
def test_selection_from_lse_partials_matches_its_own_pass(groups, chunk):
    """Selection over the persistent kernel's log-sum-exp partials (no pass of its own over the scores) keeps the
    same number of pages and the same group mass as with its chunk pass."""
    cfg = LocksConfig(budget=160, sink_pages=1, recent_pages=2, summary_format="colwise8")
    lengths = [16 * 150 - 5, 16 * 37, 9]
    sc = make_scenario(lengths, num_kv_heads=2, groups=groups, head_dim=128, seed=11 + groups, key_offset=20.0)
    store = _store_on_device(build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, cfg))
    dev = on_device(sc)
    scores, parts = lk.score_pages(sc.q.bfloat16().to(DEVICE), store, dev.block_table, dev.seq_lens, sc.page_size,
                                   sc.block_size, coef_path="dot1tc", programs_per_sm=3, lse_partials=True)
    own = lk.select_pages(scores, dev.seq_lens, 2, cfg, chunk=chunk).cpu()
    out = poisoned(own.shape, torch.int64)
    lk.select_pages(scores, dev.seq_lens, 2, cfg, out=out, chunk=chunk, lse_partials=parts)
    out = out.cpu()
    assert torch.equal(out >= 0, own >= 0)
    shares = group_mass_shares(scores.cpu(), 2)
    for s in range(len(lengths)):
        for h in range(2):
            kept = [shares[s, h][sel[s, h][sel[s, h] >= 0]].sum() for sel in (out, own)]
            assert torch.isclose(kept[0], kept[1], rtol=1e-5, atol=1e-7)


SEARCH_TUNINGS = {f"arity{a}": {"search_arity": a} for a in (2, 4, 16, 32)} | {
    f"merge_{w}warp": {"merge_warps": w} for w in (1, 2)}


@pytest.mark.parametrize("tuning", SEARCH_TUNINGS.values(), ids=SEARCH_TUNINGS.keys())
def test_search_tunings_select_the_same_pages(tuning):
    """However many thresholds a round of the K-th-largest search counts (and so however many rounds), and however
    few warps the group pass and the merge take (1: reductions without barriers), the pages are the same, ties
    across chunks included, through the chunk, group and merge passes."""
    from locks_kernels.select import search_rounds

    arity = tuning.get("search_arity", 8)
    assert arity ** search_rounds(arity) > 1 << 30 >= arity ** (search_rounds(arity) - 1)
    cfg = LocksConfig(budget=160, sink_pages=1, recent_pages=2)
    seq_lens = torch.tensor([16 * 150 - 5, 16 * 37, 16 * 9], dtype=torch.int32)
    scores = _random_scores(3, 8, 150, seq_lens, seed=arity + tuning.get("merge_warps", 0))
    scores[0, :, 40:60] = 0.5
    args = (scores.to(DEVICE), seq_lens.to(DEVICE), 2, cfg)
    for chunk, group in ((16, 4), (32, 0)):
        assert torch.equal(lk.select_pages(*args, chunk=chunk, group=group, **tuning).cpu(),
                           lk.select_pages(*args, chunk=chunk, group=group).cpu())


@pytest.mark.parametrize("chunk, group", [(16, 2), (16, 4), (32, 2), (16, 8)])
def test_group_pass_selects_what_one_merge_selects(chunk, group):
    """The group pass (top K of each group of chunks, then the merge) gives exactly the single merge's pages,
    ties included, for groups that do and do not divide the chunk count."""
    cfg = LocksConfig(budget=160, sink_pages=1, recent_pages=2)  # K = 10 pages, 16 slots
    seq_lens = torch.tensor([16 * 150 - 5, 16 * 37, 16 * 9], dtype=torch.int32)
    scores = _random_scores(3, 8, 150, seq_lens, seed=chunk + group)
    scores[0, :, 40:60] = 0.5  # ties across chunk and group borders
    args = (scores.to(DEVICE), seq_lens.to(DEVICE), 2, cfg)
    one = lk.select_pages(*args, chunk=chunk, group=0).cpu()
    grouped = lk.select_pages(*args, chunk=chunk, group=group).cpu()
    assert torch.equal(grouped, one)
    assert torch.equal(one >= 0, select_pages(scores, seq_lens, 2, cfg) >= 0)


@pytest.mark.parametrize("groups", [1, 4, 7], ids=lambda g: f"gqa{g}")
@pytest.mark.parametrize("block, warps", [(1, 4), (2, None), (8, 8)], ids=["1head_4warps", "2heads", "8heads_8warps"])
def test_chunk_pass_heads_a_block_selects_the_same_pages(groups, block, warps):
    """However many query heads the chunk pass loads as one block (masked past the group), and with however many
    warps, the pages are the default's."""
    cfg = LocksConfig(budget=160, sink_pages=1, recent_pages=2)
    seq_lens = torch.tensor([16 * 150 - 5, 16 * 37], dtype=torch.int32)
    scores = _random_scores(2, 2 * groups, 150, seq_lens, seed=groups + block)
    args = (scores.to(DEVICE), seq_lens.to(DEVICE), 2, cfg)
    default = lk.select_pages(*args, chunk=32).cpu()
    tuned = lk.select_pages(*args, chunk=32, heads_a_block=block, chunk_warps=warps).cpu()
    assert torch.equal(tuned >= 0, default >= 0)
    shares = group_mass_shares(scores, 2)
    for s in range(2):
        for h in range(2):
            kept = [shares[s, h][sel[s, h][sel[s, h] >= 0]].sum() for sel in (tuned, default)]
            assert torch.isclose(kept[0], kept[1], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "pmax, expected",
    [(65_576, (2048, 8)), (16_424, (2048, 0)), (8_232, (2048, 0)), (70, (128, 0)), (300, (512, 0))],
    ids=["1m", "256k", "128k", "tiny", "small"],
)
def test_plan_bounds_the_merge(pmax, expected):
    from locks_kernels.select import MAX_MERGE_KEYS, plan

    assert plan(pmax, 128) == expected
    chunk, group = plan(pmax, 128)
    nchunk = -(-pmax // chunk)
    assert (-(-nchunk // group) if group else nchunk) * 128 <= MAX_MERGE_KEYS
    assert plan(pmax, 128, chunk=64, group=0) == (128, 0)  # a chunk is never smaller than K's slots


def test_dense_switch_reads_every_page():
    cfg = LocksConfig(budget=48, dense=True)
    seq_lens = torch.tensor([200, 5], dtype=torch.int32)
    scores = _random_scores(2, 4, 13, seq_lens, 0)
    out = lk.select_pages(scores.to(DEVICE), seq_lens.to(DEVICE), 2, cfg)
    assert torch.equal(out.cpu(), select_pages(scores, seq_lens, 2, cfg))


def test_all_minus_inf_scores_still_select_forced_pages():
    cfg = LocksConfig(budget=48, sink_pages=1, recent_pages=1)
    scores = torch.full((1, 2, 20), float("-inf"))
    out = lk.select_pages(scores.to(DEVICE), torch.tensor([20 * 16 - 3], dtype=torch.int32, device=DEVICE), 1, cfg)
    assert torch.equal(out[0, 0].cpu(), torch.tensor([0, 18, 19]))


@pytest.mark.parametrize("partials", ["0", "1"], ids=["own_lse_pass", "lse_partials"])
def test_decode_step_and_backend_selection_with_either_lse(monkeypatch, partials):
    """``$LOCKS_LSE_PARTIALS`` switches the decode step (``decode_step`` and the backend's ``gpu.select``) between
    selection's own log-sum-exp pass and the score kernel's partials: the same group mass either way, and the
    step attends over the pages selected."""
    from locks_engine.vllm_backend import gpu

    monkeypatch.setenv("LOCKS_LSE_PARTIALS", partials)
    monkeypatch.delenv("LOCKS_SCORE_TUNING", raising=False)
    cfg = LocksConfig(budget=160, sink_pages=1, recent_pages=2, summary_format="colwise8")
    sc = on_device(make_scenario([16 * 40 + 5, 16 * 9 + 3], num_kv_heads=2, groups=4, head_dim=128, seed=5,
                                 key_offset=10.0))
    store = lk.build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, cfg)
    scale = 128 ** -0.5
    selected = gpu.select(sc.q, sc.k_cache, sc.block_table, sc.seq_lens, store, cfg, scale, 2).cpu()
    scores = lk.score_pages(sc.q, store, sc.block_table, sc.seq_lens, 16, sc.block_size)
    own = lk.select_pages(scores, sc.seq_lens, 2, cfg).cpu()
    assert torch.equal(selected >= 0, own >= 0)
    shares = group_mass_shares(scores.cpu(), 2)
    for s in range(2):
        for h in range(2):
            kept = [shares[s, h][sel[s, h][sel[s, h] >= 0]].sum() for sel in (selected, own)]
            assert torch.isclose(kept[0], kept[1], rtol=1e-5, atol=1e-7)
    out, lse = lk.decode_step(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, store, cfg, build=False)
    ref_out, ref_lse = lk.sparse_paged_attention(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens,
                                                 selected.to(DEVICE), 16)
    assert_close("step out", ref_out.float().cpu(), out.float().cpu(), 1e-5)
    assert_close("step lse", ref_lse.cpu(), lse.cpu(), 1e-6)
