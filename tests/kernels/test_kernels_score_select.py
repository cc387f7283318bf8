"""Triton scoring and selection against their ops twins: GQA groups, partial pages, real keys, budgets at and past
the page count, NaN-poisoned outputs; top-k checked by the mass it keeps (ties make indices moot)."""

import pytest
import torch

import locks_kernels as lk
from locks_engine import LocksConfig
from locks_engine.config import MAX_BUDGET
from locks_engine.ops import build_cache_summaries, score_pages, select_pages
from locks_engine.ops.select import forced_page_mask, group_mass_shares
from tests.support.helpers import assert_close, make_scenario
from tests.support.kernels_support import (
    DEVICE, ON_GPU, on_device, poisoned, real_scenario, requires_bf16_dot, requires_kernels, summaries_on_device,
)

pytestmark = requires_kernels

LENGTHS = {"one_page": [16], "partial": [17], "odd": [100, 333, 1], "long": [1000, 16 * 40]}


def _check_scores(sc, q, tolerance, rank=8):
    store = build_cache_summaries(sc.k_cache, sc.block_table, sc.seq_lens, LocksConfig(rank=rank))
    ref = score_pages(q.float(), store, sc.block_table, sc.seq_lens, sc.page_size, sc.block_size)
    dev = on_device(sc)
    out = poisoned(ref.shape, torch.float32)
    lk.score_pages(q.to(DEVICE), summaries_on_device(store), dev.block_table, dev.seq_lens, sc.page_size,
                   sc.block_size, out=out)
    out = out.cpu()
    assert torch.equal(torch.isinf(out), torch.isinf(ref)) and not out.isnan().any(), "-inf exactly where ops has it"
    finite = torch.isfinite(ref)
    if finite.any():
        assert_close("colwise8 scores", ref[finite], out[finite], tolerance)
    return out


@pytest.mark.parametrize("groups", [1, 4, 7], ids=lambda g: f"gqa{g}")
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("lengths", LENGTHS.values(), ids=LENGTHS.keys())
def test_scores_match_ops_fp32(groups, head_dim, lengths):
    if not ON_GPU and (len(lengths) > 1 or head_dim == 128):
        pytest.skip("interpreter: small cases only")
    sc = make_scenario(lengths, num_kv_heads=2, groups=groups, head_dim=head_dim, seed=groups, key_offset=20.0)
    # q . mu and V q multiply in fp16 on the tensor cores: an fp32 query is rounded to 11 bits
    _check_scores(sc, sc.q, 1e-3)


@pytest.mark.parametrize("rank", [1, 5, 16], ids=lambda r: f"r{r}")
def test_scores_match_ops_at_other_ranks(rank):
    # ranks that are not a power of two, and one that fills the 16 rows a matrix-unit product needs
    sc = make_scenario([200, 77], num_kv_heads=2, groups=4, head_dim=64, seed=rank, key_offset=20.0)
    _check_scores(sc, sc.q, 1e-3, rank)


PERSISTENT_LENGTHS = {"one_page": [16], "partial": [17], "mixed": [16 * 20 + 3, 16 * 9, 5], "empty_tail": [16 * 70]}


@pytest.mark.parametrize("groups", [1, 4, 16], ids=lambda g: f"gqa{g}")
@pytest.mark.parametrize("lengths", PERSISTENT_LENGTHS.values(), ids=PERSISTENT_LENGTHS.keys())
def test_persistent_scores_match_ops(groups, lengths):
    """The persistent grid (programs walking the tiles with the next tile's loads in flight) gives the ops scores:
    sequences shorter than a page, partial tiles, programs with no live tile, sequences whose block table has room
    past their pages (``-inf`` written there)."""
    sc = make_scenario(lengths, num_kv_heads=2, groups=groups, head_dim=128, seed=groups, key_offset=20.0)
    # room for 48 more pages in every row of the block table (three whole tiles with no live page)
    sc.block_table = torch.cat([sc.block_table, torch.zeros(len(lengths), 24, dtype=torch.int32)], dim=1)
    _check_scores(sc, sc.q.bfloat16().float(), 1e-3)


@pytest.mark.parametrize("groups", [1, 16], ids=lambda g: f"gqa{g}")
def test_one_program_per_head_walks_every_tile(groups):
    """A batch whose (KV head, sequence) pairs leave each fewer than 2 programs: one program a pair walks all of
    its tiles, with the same scores as ops."""
    from locks_kernels.score import TUNING, _programs_per_head

    programs_per_sm = TUNING[groups <= 4][-1]
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count if ON_GPU else 4
    seqs = sms * programs_per_sm // 2 + 1  # 2 KV heads
    lengths = [16 * (3 + s % 5) + s % 16 for s in range(seqs)]
    sc = make_scenario(lengths, num_kv_heads=2, groups=groups, head_dim=64, seed=groups, key_offset=20.0)
    assert _programs_per_head(seqs, 2, 1 << 20, programs_per_sm, torch.device(DEVICE)) == 1
    _check_scores(sc, sc.q.bfloat16().float(), 1e-3)


@pytest.mark.parametrize("groups", [1, 4, 16], ids=lambda g: f"gqa{g}")
def test_persistent_centroid_shifted_lse_matches_ops(groups):
    """The log-sum-exp shifted by each page's centroid logit instead of its largest logit gives the ops scores,
    with logits spread far around the centroid's (a query scaled by 6: tens of nats across a page)."""
    sc = make_scenario([16 * 20 + 3, 16 * 9, 5], num_kv_heads=2, groups=groups, head_dim=128, seed=groups,
                       key_offset=20.0)
    sc.block_table = torch.cat([sc.block_table, torch.zeros(3, 24, dtype=torch.int32)], dim=1)
    for q in (sc.q, 6.0 * sc.q):
        _check_scores(sc, q.bfloat16().float(), 1e-3)


@requires_bf16_dot
@pytest.mark.parametrize("groups", [4, 16], ids=lambda g: f"gqa{g}")
def test_scores_match_ops_bf16_query(groups):
    sc = make_scenario([16 * 70 + 5, 3000], num_kv_heads=2, groups=groups, head_dim=128, seed=5, key_offset=20.0)
    # q . mu is exact (bf16 in fp16); V q is rounded to fp16 once (2^-11 relative)
    _check_scores(sc, sc.q.bfloat16(), 1e-3)


@pytest.mark.parametrize("layer", [0, 12, 23], ids=lambda layer: f"L{layer}")
def test_scores_on_real_keys_keep_the_mass(layer):
    """On real keys (large near-constant channels, rotated by RoPE) the scores (V q rounded to fp16 once, ~2^-11
    relative, the log-sum-exp shifted by the centroid logit) stay within 5e-4 relative RMSE of the ops scores, and
    the pages they select at a budget of a quarter of the pages keep the attention mass (the ops scores' group
    shares) that the exact selection keeps."""
    sc = real_scenario(layer, num_tokens=2048 if ON_GPU else 1024)
    cpu = type(sc)(*(t.cpu() for t in (sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens)), sc.page_size)
    cfg = LocksConfig(budget=int(cpu.seq_lens[0]) // 4)
    store = build_cache_summaries(cpu.k_cache, cpu.block_table, cpu.seq_lens, cfg)
    q = cpu.q.half()  # fp16 queries, as the fixture stores them
    ref = score_pages(q.float(), store, cpu.block_table, cpu.seq_lens, cpu.page_size, cpu.block_size)
    out = lk.score_pages(q.to(DEVICE), summaries_on_device(store), sc.block_table, sc.seq_lens, cpu.page_size,
                         cpu.block_size).cpu()
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(out), finite)
    assert_close("colwise8 scores", ref[finite], out[finite], 5e-4)
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
    "budget_past_pmax": ([1000, 5], 70, MAX_BUDGET),
    "one_token": ([1, 16 * 70], 70, 160),
    "many_chunks": ([16 * 5000 - 3, 16 * 3000], 5000, 2048),
}


def _select(scores, seq_lens, num_kv_heads, cfg, out=None):
    """The kernel's selection with a ``LocksConfig``'s budget, page size, sink and recent pages."""
    return lk.select_pages(scores.to(DEVICE), seq_lens.to(DEVICE), num_kv_heads, cfg.budget_pages, cfg.page_size,
                           cfg.sink_pages, cfg.recent_pages, out=out)


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
    _select(scores, seq_lens, 2, cfg, out=out)
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


@pytest.mark.parametrize("chunk, group", [(16, 2), (16, 4), (32, 2), (16, 8)])
def test_group_pass_selects_what_one_merge_selects(monkeypatch, chunk, group):
    """The group pass (top K of each group of chunks, then the merge) gives exactly the single merge's pages,
    ties included, for groups that do and do not divide the chunk count (the plan's constants set so that short
    scores take each route)."""
    from locks_kernels import select

    cfg = LocksConfig(budget=160, sink_pages=1, recent_pages=2)  # K = 10 pages, 16 slots
    seq_lens = torch.tensor([16 * 150 - 5, 16 * 37, 16 * 9], dtype=torch.int32)
    scores = _random_scores(3, 8, 150, seq_lens, seed=chunk + group)
    scores[0, :, 40:60] = 0.5  # ties across chunk and group borders
    monkeypatch.setattr(select, "CHUNK", chunk)
    monkeypatch.setattr(select, "MERGE_GROUP", group)
    monkeypatch.setattr(select, "MAX_MERGE_KEYS", 1 << 30)
    assert select._plan(150, 16) == (chunk, 0)
    one = _select(scores, seq_lens, 2, cfg).cpu()
    monkeypatch.setattr(select, "MAX_MERGE_KEYS", 0)
    assert select._plan(150, 16) == (chunk, group)
    grouped = _select(scores, seq_lens, 2, cfg).cpu()
    assert torch.equal(grouped, one)
    assert torch.equal(one >= 0, select_pages(scores, seq_lens, 2, cfg) >= 0)


@pytest.mark.parametrize(
    "pmax, expected",
    [(65_576, (1024, 8)), (16_424, (1024, 8)), (8_232, (1024, 0)), (70, (128, 0)), (300, (512, 0))],
    ids=["1m", "256k", "128k", "tiny", "small"],
)
def test_plan_bounds_the_merge(monkeypatch, pmax, expected):
    from locks_kernels import select

    assert select._plan(pmax, 128) == expected
    chunk, group = select._plan(pmax, 128)
    nchunk = -(-pmax // chunk)
    assert (-(-nchunk // group) if group else nchunk) * 128 <= select.MAX_MERGE_KEYS
    monkeypatch.setattr(select, "CHUNK", 64)
    assert select._plan(pmax, 128)[0] == 128  # a chunk is never smaller than K's slots


def test_budget_past_pmax_reads_every_page():
    """A budget of at least Pmax pages reads every page in Pmax slots, as ops' dense switch does."""
    seq_lens = torch.tensor([200, 5], dtype=torch.int32)
    scores = _random_scores(2, 4, 13, seq_lens, 0)
    for budget_pages in (13, 10**6):
        out = lk.select_pages(scores.to(DEVICE), seq_lens.to(DEVICE), 2, budget_pages, 16, 1, 1)
        assert torch.equal(out.cpu(), select_pages(scores, seq_lens, 2, LocksConfig(budget=48, dense=True)))


def test_all_minus_inf_scores_still_select_forced_pages():
    cfg = LocksConfig(budget=48, sink_pages=1, recent_pages=1)
    scores = torch.full((1, 2, 20), float("-inf"))
    out = _select(scores, torch.tensor([20 * 16 - 3], dtype=torch.int32), 1, cfg)
    assert torch.equal(out[0, 0].cpu(), torch.tensor([0, 18, 19]))


def test_decode_step_composes_the_stages():
    """``decode_step`` attends over the pages that ``select_pages`` picks from ``score_pages``'s scores."""
    cfg = LocksConfig(budget=160, sink_pages=1, recent_pages=2)
    sc = on_device(make_scenario([16 * 40 + 5, 16 * 9 + 3], num_kv_heads=2, groups=4, head_dim=128, seed=5,
                                 key_offset=10.0))
    store = build_cache_summaries(sc.k_cache.cpu(), sc.block_table.cpu(), sc.seq_lens.cpu(), cfg)
    summaries = summaries_on_device(store)
    scores = lk.score_pages(sc.q, summaries, sc.block_table, sc.seq_lens, 16, sc.block_size)
    selected = _select(scores, sc.seq_lens, 2, cfg)
    out, lse = lk.decode_step(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens, summaries, 16,
                              cfg.budget_pages, cfg.sink_pages, cfg.recent_pages, build=False)
    ref_out, ref_lse = lk.sparse_paged_attention(sc.q, sc.k_cache, sc.v_cache, sc.block_table, sc.seq_lens,
                                                 selected, 16)
    assert_close("step out", ref_out.float().cpu(), out.float().cpu(), 1e-5)
    assert_close("step lse", ref_lse.cpu(), lse.cpu(), 1e-6)


def _top_keys(keys: list[int], k: int) -> list[int]:
    """Positions of the ``k`` largest keys ``>= 1``, ties to the lower position, in position order."""
    order = sorted((i for i, key in enumerate(keys) if key >= 1), key=lambda i: (-keys[i], i))
    return sorted(order[:k])


@pytest.mark.parametrize("seed", range(12))
def test_take_top_is_the_exact_top_k_with_ties_to_lower_positions(seed):
    """The threshold search (and its early stop at exactly K keys) takes exactly the K largest keys, ties
    towards lower positions, over key sets with wide gaps, dense ties at the K-th key, invalid keys (0), fewer
    valid keys than K, and the forced key (bits of 2.0, + 1)."""
    from tests.support.kernels_probes import SEARCH_ARITY, SEARCH_ROUNDS, take_top_probe

    gen = torch.Generator().manual_seed(seed)
    n = 256
    forced = 0x40000001
    keys = torch.randint(1, forced, (n,), generator=gen)
    if seed % 4 == 1:
        keys = torch.randint(1, 40, (n,), generator=gen)  # few distinct keys: ties at every K
    if seed % 4 == 2:
        keys[torch.randperm(n, generator=gen)[: n // 2]] = 0  # half the slots are not pages
    if seed % 4 == 3:
        keys[:5] = forced  # forced pages
        keys[5:] = torch.where(torch.rand(n - 5, generator=gen) < 0.9, 0, keys[5:])  # few valid keys
    for k in (1, 2, 13, 64, 128, 200, 256):
        take = torch.zeros(n, dtype=torch.int32, device=DEVICE)
        slot = torch.full((n,), -1, dtype=torch.int32, device=DEVICE)
        take_top_probe[(1,)](keys.to(torch.int32).to(DEVICE), take, slot, k, N=n, NT=SEARCH_ARITY, ROUNDS=SEARCH_ROUNDS)
        taken = take.cpu().nonzero().flatten().tolist()
        assert taken == _top_keys(keys.tolist(), k), f"k={k}"
        assert slot.cpu()[take.cpu().bool()].tolist() == list(range(len(taken))), "slots in position order"
