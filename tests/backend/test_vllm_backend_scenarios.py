"""The LOCKS vLLM backend without an engine, vLLM-style (tests/v1/attention/test_attention_backends.py):
named batch scenarios, randomly permuted block tables with block 0 reserved, a dense SDPA reference.

Each scenario runs two steps through the real builder and impl: step 1 prefills every row's context (so the
summaries are built by the backend itself), step 2 is the scenario's batch (decodes first, then prefills).
The ``cuda`` platform (skipped without a GPU and triton) runs the same steps on the CUDA path: vLLM's cache
writer, FlashAttention for bf16 prefill rows, the Triton kernels for summaries and decode.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")

from vllm.config import VllmConfig  # noqa: E402
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402

from locks_engine.config import LocksConfig  # noqa: E402
from locks_engine.stats import StatsReader, StatsRing  # noqa: E402
from locks_engine.vllm_backend import compat, device_stats  # noqa: E402
from locks_engine.vllm_backend.impl import LocksAttentionImpl  # noqa: E402
from locks_engine.vllm_backend.builder import LocksMetadataBuilder  # noqa: E402

NUM_BLOCKS, BLOCK_SIZE, HQ, H, D = 48, 32, 6, 2, 64


@dataclass(frozen=True)
class Batch:
    seq_lens: list[int]
    query_lens: list[int]


SCENARIOS = {
    "small_decode": Batch([40, 75], [1, 1]),
    "single_prefill": Batch([53], [53]),
    "mixed_small": Batch([33, 64, 90], [1, 1, 20]),
    "chunked_prefill": Batch([100], [30]),
    "medium_decode": Batch([300, 511, 129, 17], [1, 1, 1, 1]),
    "one_page": Batch([16], [1]),
}


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, ratio: float) -> None:
    """Relative RMSE of ``out`` against ``ref`` at most ``ratio``; fails on NaN."""
    ref, out = ref.float(), out.float()
    assert torch.isfinite(out).all(), f"{name}: non-finite output"
    err = (out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-12)
    assert err <= ratio, f"{name}: relative RMSE {err:.2e} > {ratio:.0e}"


def make_builder(
    cfg: LocksConfig, dtype: torch.dtype, stats_path=None, device: str = "cpu", heads: int = H, run: str = ""
) -> LocksMetadataBuilder:
    """The builder of one layer with ``heads`` KV heads; ``run`` replaces vLLM's ``instance_id`` (one per
    engine run, shared by its tensor-parallel ranks)."""
    extra = {"locks": cfg.to_dict()}
    if stats_path is not None:
        extra["locks_stats_path"] = str(stats_path)
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=heads, head_size=D, dtype=dtype)
    config = VllmConfig(additional_config=extra)
    if run:
        config.instance_id = run
    return LocksMetadataBuilder(spec, ["layer.0"], config, torch.device(device))


def common_metadata(seq_lens, query_lens, block_table, device: str = "cpu") -> CommonAttentionMetadata:
    """vLLM's per-step metadata for rows whose last ``query_lens`` tokens are computed now."""
    starts = torch.tensor([0] + query_lens).cumsum(0).to(torch.int32)
    slots = []
    for row, (n, q) in enumerate(zip(seq_lens, query_lens)):
        pos = torch.arange(n - q, n, device=block_table.device)
        slots.append(block_table[row, pos // BLOCK_SIZE].long() * BLOCK_SIZE + pos % BLOCK_SIZE)
    return CommonAttentionMetadata(
        query_start_loc=starts.to(device),
        query_start_loc_cpu=starts.clone(),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        num_reqs=len(seq_lens),
        num_actual_tokens=int(starts[-1]),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=block_table,
        slot_mapping=torch.cat(slots),
    )


class Run:
    """Random q/k/v for a batch, a KV cache, and the two steps through builder + impl."""

    def __init__(
        self, batch: Batch, cfg: LocksConfig, dtype: torch.dtype, seed: int = 0, stats_path=None, device: str = "cpu"
    ) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.batch, self.dtype, self.device = batch, dtype, device
        self.q = [torch.randn(n, HQ, D, generator=gen).to(dtype) for n in batch.seq_lens]
        self.k = [torch.randn(n, H, D, generator=gen).to(dtype) for n in batch.seq_lens]
        self.v = [torch.randn(n, H, D, generator=gen).to(dtype) for n in batch.seq_lens]
        free = (torch.randperm(NUM_BLOCKS - 1, generator=gen) + 1).tolist()  # block 0 reserved
        width = max(-(-n // BLOCK_SIZE) for n in batch.seq_lens)
        self.block_table = torch.zeros(len(batch.seq_lens), width + 2, dtype=torch.int32)
        for row, n in enumerate(batch.seq_lens):
            for j in range(-(-n // BLOCK_SIZE)):
                self.block_table[row, j] = free.pop()
        self.block_table = self.block_table.to(device)
        self.kv_cache = torch.zeros(NUM_BLOCKS, H, BLOCK_SIZE, 2 * D, dtype=dtype, device=device)
        self.builder = make_builder(cfg, dtype, stats_path, device)
        self.impl = LocksAttentionImpl(HQ, D, D**-0.5, H)

    def _run(self, seq_lens, query_lens) -> torch.Tensor:
        rows = [i for i, q in enumerate(query_lens) if q > 0]
        seq_lens = [seq_lens[i] for i in rows]
        query_lens = [query_lens[i] for i in rows]
        cam = common_metadata(seq_lens, query_lens, self.block_table[rows], self.device)
        pick = lambda xs: torch.cat([xs[i][n - q : n] for i, n, q in zip(rows, seq_lens, query_lens)]).to(self.device)  # noqa: E731
        q, k, v = pick(self.q), pick(self.k), pick(self.v)
        self.impl.do_kv_cache_update(None, k, v, self.kv_cache, cam.slot_mapping)
        meta = self.builder.build(0, cam)
        out = torch.full_like(q, float("nan"))
        self.impl.forward(None, q, k, v, self.kv_cache, meta, out)
        if self.device == "cuda":
            device_stats.flush_all()  # the step's record, counted on the device, into the ring
        return out.cpu()

    def keep_kv_heads(self, heads: slice, stats_path, run: str) -> None:
        """Keep the KV heads ``heads`` and their query heads only, as a tensor-parallel rank does."""
        group = HQ // H
        self.q = [q[:, heads.start * group : heads.stop * group] for q in self.q]
        self.k = [k[:, heads] for k in self.k]
        self.v = [v[:, heads] for v in self.v]
        kv_heads = heads.stop - heads.start
        self.kv_cache = self.kv_cache[:, heads].clone()
        self.builder = make_builder(self.builder.cfg, self.dtype, stats_path, self.device, kv_heads, run)
        self.impl = LocksAttentionImpl(kv_heads * group, D, D**-0.5, kv_heads)

    def prefill_context(self) -> None:
        """Step 1: compute every row's tokens before the scenario's query."""
        context = [n - q for n, q in zip(self.batch.seq_lens, self.batch.query_lens)]
        if any(context):
            self._run(context, context)

    def scenario_step(self) -> torch.Tensor:
        """Step 2: the scenario's batch."""
        return self._run(self.batch.seq_lens, self.batch.query_lens)

    def reference(self) -> torch.Tensor:
        """Dense causal SDPA (fp32) of the scenario's query tokens over all their sequence's tokens."""
        outs = []
        for q, k, v, n, ql in zip(self.q, self.k, self.v, self.batch.seq_lens, self.batch.query_lens):
            qq = q[n - ql :].float().transpose(0, 1)
            mask = torch.arange(n).unsqueeze(0) <= torch.arange(n - ql, n).unsqueeze(1)
            o = torch.nn.functional.scaled_dot_product_attention(
                qq, k.float().transpose(0, 1), v.float().transpose(0, 1), attn_mask=mask, enable_gqa=True
            )
            outs.append(o.transpose(0, 1))
        return torch.cat(outs)


@pytest.fixture(params=["cpu_kernel", "torch_fallback", "cuda"])
def platform(request, monkeypatch) -> str:
    """``cpu_kernel``: vLLM's CPU platform (cpu_attn cache layout, vLLM's kernel for prefill rows);
    ``torch_fallback``: the packed K|V layout with plain-torch prefill and decode, exercised on the CPU;
    ``cuda``: the CUDA path (a GPU, triton and a CUDA build of vLLM)."""
    if request.param == "cuda":
        if not torch.cuda.is_available() or importlib.util.find_spec("triton") is None or compat.on_cpu():
            pytest.skip("the CUDA path needs a GPU, triton and a CUDA build of vLLM")
    elif request.param == "torch_fallback":
        monkeypatch.setattr(compat, "on_cpu", lambda: False)
    return request.param


def device_of(platform: str) -> str:
    return "cuda" if platform == "cuda" else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_budget_covering_context_equals_dense(name: str, dtype: torch.dtype, platform: str) -> None:
    batch = SCENARIOS[name]
    cfg = LocksConfig(budget=max(batch.seq_lens) + 3 * LocksConfig().page_size)
    run = Run(batch, cfg, dtype, device=device_of(platform))
    run.prefill_context()
    assert_close(name, run.reference(), run.scenario_step(), 1e-5 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_dense_switch_equals_dense(dtype: torch.dtype, platform: str) -> None:
    batch = SCENARIOS["medium_decode"]
    run = Run(batch, LocksConfig(budget=64, dense=True), dtype, device=device_of(platform))
    run.prefill_context()
    assert_close("dense", run.reference(), run.scenario_step(), 1e-5 if dtype == torch.float32 else 2e-2)


def test_sparse_reads_fewer_pages_and_only_those(tmp_path, platform: str) -> None:
    """Small budget on long rows: fewer pages read than a dense decode, and the output depends on nothing
    else: NaN in every page no head read leaves it finite and unchanged."""
    batch = SCENARIOS["medium_decode"]
    # 6 pages of 16; the CUDA kernels implement colwise8 only
    cfg = LocksConfig(budget=96, summary_format="colwise8" if platform == "cuda" else "float")
    run = Run(batch, cfg, torch.float32, stats_path=tmp_path / "stats.bin", device=device_of(platform))
    run.prefill_context()
    first = run.scenario_step()
    ring = StatsRing(tmp_path / "stats.bin")
    record, per_bin = ring.latest()[0], int(ring.header["pages_per_bin"])
    assert record["num_decodes"] == 4 and record["num_layers"] == 1
    assert record["pages_read"] < record["pages_total"]
    assert record["bytes_read"] < record["bytes_dense"]
    assert list(record["row_pages_read"][:4]) == [H * 6, H * 6, H * 6, H * 2]  # 17 tokens: 2 pages
    assert_unread_pages_change_nothing(run, record, per_bin, first)


def assert_unread_pages_change_nothing(run: Run, record: dict, per_bin: int, first: torch.Tensor) -> None:
    """Fill every page that no KV head read in ``record``'s step (its histogram bin is empty) with NaN, run the
    step again: the output must stay finite and equal ``first``."""
    k_cache, v_cache = compat.split_kv_cache(run.kv_cache, D, compat.kv_layout_name())
    for row, n in enumerate(run.batch.seq_lens):
        for page in range(-(-n // 16)):
            if record["row_hist"][row, page // per_bin] == 0:
                block = run.block_table[row, page * 16 // BLOCK_SIZE]
                tokens = slice(page * 16 % BLOCK_SIZE, page * 16 % BLOCK_SIZE + 16)
                k_cache[block, tokens] = float("nan")
                v_cache[block, tokens] = float("nan")
    assert torch.isnan(run.kv_cache).any()
    again = run.scenario_step()
    assert torch.isfinite(again).all()
    assert torch.equal(first, again)


@pytest.mark.parametrize("platform", ["cpu_kernel", "torch_fallback"], indirect=True)
def test_a_budget_near_the_context_reads_every_page_where_that_reads_fewer_bytes(tmp_path, platform: str) -> None:
    """Summaries of every page plus K pages cost more than every page once ``K >= Pmax * (1 - s/p)``: from that
    budget on the CPU path reads every page unscored (exact attention, dense bytes); one page less, it ranks."""
    from locks_engine.ops import summary_bytes

    batch = SCENARIOS["medium_decode"]  # longest row 511 tokens: 16 blocks of 32, Pmax = 32 pages of 16
    pmax = 32
    summary, kv = summary_bytes(16, 8, D, LocksConfig().summary_format, torch.float32)
    pages_all = math.ceil(pmax * (1 - summary / kv))
    assert 20 < pages_all < pmax
    records = {}
    for pages in (pages_all, pages_all - 1):
        path = tmp_path / f"stats-{pages}.bin"
        run = Run(batch, LocksConfig(budget=pages * 16), torch.float32, stats_path=path)
        run.prefill_context()
        out = run.scenario_step()
        records[pages] = StatsRing(path).latest()[0]
        if pages == pages_all:
            assert_close("near-full budget", run.reference(), out, 1e-5)
    every, ranked = records[pages_all], records[pages_all - 1]
    assert every["pages_read"] == every["pages_total"] and every["bytes_read"] == every["bytes_dense"]
    assert ranked["pages_read"] < ranked["pages_total"]
    assert list(ranked["row_pages_read"][:4]) == [H * 19, H * (pages_all - 1), H * 9, H * 2]


def test_summaries_follow_physical_pages() -> None:
    """Pages completed in a step are summarized once, at their physical page id."""
    run = Run(SCENARIOS["chunked_prefill"], LocksConfig(budget=64, summary_format="float"), torch.float32)
    run.prefill_context()  # 70 tokens: pages 0..3 complete
    store = run.impl._store
    ppb = BLOCK_SIZE // 16
    ids = [int(run.block_table[0, j // ppb]) * ppb + j % ppb for j in range(6)]
    written = store.centroid.abs().sum(dim=(1, 2)) > 0
    assert written[ids[:4]].all() and not written[ids[4:]].any()
    assert int(written.sum()) == 4
    before = store.centroid.clone()
    run.scenario_step()  # up to 100 tokens: pages 4, 5 complete
    written = store.centroid.abs().sum(dim=(1, 2)) > 0
    assert written[ids].all() and int(written.sum()) == 6
    assert torch.equal(store.centroid[ids[:4]], before[ids[:4]])
    expected = torch.stack([run.k[0][j * 16 : (j + 1) * 16].float().mean(0) for j in range(6)])
    torch.testing.assert_close(store.centroid[ids], expected, rtol=1e-5, atol=1e-5)


def test_page_size_must_divide_block_size() -> None:
    with pytest.raises(ValueError, match="page_size=24 must divide"):
        make_builder(LocksConfig(page_size=24, rank=8, budget=24 * 3), torch.float32)


def test_tensor_parallel_ranks_compute_and_count_what_one_rank_does(tmp_path, monkeypatch) -> None:
    """Two simulated tensor-parallel ranks holding one KV head each (and its query heads) select per local
    KV-head group: together they give one rank's output, and their merged statistics are one rank's."""
    batch = SCENARIOS["medium_decode"]
    cfg = LocksConfig(budget=96, summary_format="float")
    whole = Run(batch, cfg, torch.float32, stats_path=tmp_path / "tp1" / "stats.bin")
    whole.prefill_context()
    expected = whole.scenario_step()
    parts = []
    for rank in range(H):
        monkeypatch.setattr(compat, "stats_rank", lambda rank=rank: (rank, H))
        part = Run(batch, cfg, torch.float32)
        part.keep_kv_heads(slice(rank, rank + 1), tmp_path / "tp2" / "stats.bin", run="run-a")
        part.prefill_context()
        parts.append(part.scenario_step())
    assert_close("tp2", expected, torch.cat(parts, dim=1), 1e-6)
    assert (tmp_path / "tp2" / "stats.bin.rank1").exists()
    one, two = StatsReader(tmp_path / "tp1" / "stats.bin"), StatsReader(tmp_path / "tp2" / "stats.bin")
    assert two.world_size == H and two.num_kv_heads() == one.num_kv_heads() == H
    assert one.written() == two.written() == 2
    for a, b in zip(one.latest(2), two.latest(2)):
        assert b["pages_read"] < b["pages_total"] or not b["num_decodes"]
        for name in a:
            if name != "time_ns":
                assert np.array_equal(a[name], b[name]), name


@pytest.mark.parametrize(
    "seq_lens,block_size,width",
    [([1], 16, 1), ([16], 16, 1), ([17, 3], 16, 2), ([0, 0], 16, 1), ([], 16, 1), ([300, 40], 128, 3)],
    ids=["one_token", "one_full_block", "partial_block", "empty_rows", "no_rows", "cpu_block_size"],
)
def test_cpu_decode_reads_only_the_block_table_columns_the_longest_row_reaches(seq_lens, block_size, width):
    from locks_engine.vllm_backend.cpu import used_blocks

    table = torch.arange(len(seq_lens) * 64, dtype=torch.int32).view(len(seq_lens), 64)
    trimmed = used_blocks(table, torch.tensor(seq_lens, dtype=torch.int32), block_size)
    assert trimmed.shape == (len(seq_lens), width) and torch.equal(trimmed, table[:, :width])


@pytest.mark.parametrize("name", ["medium_decode", "mixed_small"])
def test_amx_and_vec_cpu_layouts_give_the_same_sparse_answer(name, monkeypatch) -> None:
    """bf16 on a CPU with AMX tiles: the cache takes vLLM's ``amx`` layout, read
    back by ``compat.read_cpu_kv``; ``LOCKS_CPU_ISA=vec`` keeps the ``vec`` layout. Both select and read the same
    pages at a budget under the context, and match the dense reference as closely."""
    if not compat.on_cpu() or not compat._amx_usable():
        pytest.skip("needs vLLM's CPU platform on a CPU with AMX tiles")
    cfg = LocksConfig(budget=64, summary_format="float")
    outs = {}
    for isa in ("amx", "vec"):
        monkeypatch.setenv(compat.ISA_ENV, isa)
        run = Run(SCENARIOS[name], cfg, torch.bfloat16, seed=3)
        assert run.impl.cpu_isa(run.kv_cache) == isa
        run.prefill_context()
        outs[isa] = run.scenario_step()
    assert torch.isfinite(outs["amx"]).all()
    assert_close(f"{name} amx vs vec", outs["vec"], outs["amx"], 2e-2)


def test_amx_reader_reads_what_vllms_writer_wrote() -> None:
    if not compat.on_cpu() or not compat._amx_usable():
        pytest.skip("needs vLLM's CPU platform on a CPU with AMX tiles")
    for block_size, head_size in ((32, 64), (128, 64), (32, 128)):
        compat.check_cpu_layout(head_size, torch.bfloat16, 3, block_size)
    assert compat.cpu_isa(64, torch.bfloat16, 32) == "amx" and compat.cpu_isa(64, torch.float32, 32) == "vec"
    assert compat.cpu_isa(64, torch.bfloat16, 32, allow_amx=False) == "vec"


def test_reads_every_page_counts_the_longest_rows_pages_not_the_block_table_width() -> None:
    """A 2,447-token sequence in 128-token blocks is 153 pages in a block table 160 pages wide: at a budget of 128
    pages, scoring 153 summaries and reading 128 pages costs more than reading the 153 pages, so every page is read.
    Whenever it ranks, the summaries plus the budget's pages are fewer bytes than every page's K+V."""
    from locks_engine.ops.select import reads_every_page
    from locks_engine.vllm_backend.cpu import longest_pages

    cfg, s = LocksConfig(budget=2048), 0.176  # 128 pages; colwise8's summary / K+V at r = 8
    assert longest_pages(torch.tensor([2447, 40], dtype=torch.int32), 16) == 153
    assert longest_pages(torch.tensor([], dtype=torch.int32), 16) == 0
    assert not reads_every_page(cfg, 160, s)  # by the table's width alone it would rank
    assert reads_every_page(cfg, 153, s)
    for n in range(1, 400):
        if not reads_every_page(cfg, n, s):
            assert n * s + min(cfg.budget_pages, n) < n, n
