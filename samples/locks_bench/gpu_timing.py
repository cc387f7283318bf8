"""GPU timing shared by the kernel benchmarks (``samples/bench_kernels.py``, ``bench_score.py``,
``bench_select.py``, ``bench_build.py``): CUDA-graph replays between CUDA events with L2 flushed before each, the
device-to-device copy bandwidth that sets the byte floors, and a paged KV cache with its summaries. Importing it
imports torch but neither triton nor vLLM; the functions need a CUDA GPU."""

from __future__ import annotations

import statistics
import time

import torch

from locks_engine.config import LocksConfig
from locks_engine.ops import allocate_page_summaries

#: tokens per KV cache block (vLLM's block size in the engines)
BLOCK = 64


class Timer:
    """CUDA-graph replays timed with events, median of ``reps``; an L2-sized buffer is overwritten before each."""

    def __init__(self, reps: int):
        self.reps = reps
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def capture(self, fn, graph: bool = True) -> tuple:
        """``(run, how)``: a replay of ``fn`` captured in a CUDA graph (``how == "graph"``), or ``fn`` itself when
        it will not capture or ``graph`` is False (``"eager"``). Runs ``fn`` once first (compiles, warms up)."""
        fn()
        torch.cuda.synchronize()
        if not graph:
            return fn, "eager"
        try:
            cuda_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cuda_graph):
                fn()
            return cuda_graph.replay, "graph"
        except Exception:  # a library call that will not capture: time it eagerly
            torch.cuda.synchronize()
            return fn, "eager"

    def once(self, run) -> float:
        """ms of one ``run`` after an L2 flush."""
        self.flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def __call__(self, fn, graph: bool = True) -> tuple[float, str]:
        """``(median ms, how)`` of ``reps`` replays of ``fn`` after 3 discarded ones (a third as many when one
        takes over 2 ms)."""
        run, how = self.capture(fn, graph)
        times, reps, i = [], self.reps, 0
        while len(times) < reps:
            ms = self.once(run)
            if i == 0 and ms > 2.0:
                reps = max(5, self.reps // 3)
            if i >= 3:
                times.append(ms)
            i += 1
        return statistics.median(times), how

    def interleaved(self, fns: dict) -> dict[str, float]:
        """Median ms of each of ``fns`` (``{name: fn}``), their replays taken in turn, ``reps`` rounds after 3
        discarded: drifts of clock and temperature fall on all of them alike."""
        runs = {name: self.capture(fn)[0] for name, fn in fns.items()}
        times = {name: [] for name in fns}
        for i in range(self.reps + 3):
            for name, run in runs.items():
                ms = self.once(run)
                if i >= 3:
                    times[name].append(ms)
        return {name: statistics.median(t) for name, t in times.items()}


def copy_bandwidth(timer: Timer) -> float:
    """Device-to-device copy, bytes read + written per second (eager: a graph's memcpy node runs slower)."""
    src = torch.empty(4 << 30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms, _ = timer(lambda: dst.copy_(src), graph=False)
    return 2 * (4 << 30) / (ms * 1e-3)


class Setup:
    """A batch of equal-length sequences: packed K|V cache (vLLM layout `[blocks, BLOCK, H, 2D]`, bf16 normal
    entries), permuted block table, bf16 queries, and the ``colwise8`` summaries of every page (``store``, a
    ``PageSummaries``; ``summaries``, the same tensors as the kernels' colwise8 tuple)."""

    def __init__(self, heads: int, q_heads: int, dim: int, batch: int, max_ctx: int, cfg: LocksConfig):
        import locks_kernels as lk

        self.heads, self.q_heads, self.dim, self.batch, self.cfg = heads, q_heads, dim, batch, cfg
        blocks = max_ctx // BLOCK
        self.kv = torch.empty(batch * blocks, BLOCK, heads, 2 * dim, dtype=torch.bfloat16, device="cuda").normal_()
        self.k, self.v = self.kv[..., :dim], self.kv[..., dim:]
        self.table = torch.randperm(batch * blocks, device="cuda").int().view(batch, blocks)
        self.q = torch.randn(batch, q_heads, dim, dtype=torch.bfloat16, device="cuda")
        self.store = allocate_page_summaries(batch * blocks * BLOCK // cfg.page_size, heads, dim, cfg, "cuda")
        self.summaries = self.store.colwise8()
        full = torch.full((batch,), max_ctx, dtype=torch.int32, device="cuda")
        t0 = time.perf_counter()
        lk.build_cache_summaries(self.k, self.table, full, self.summaries, cfg.page_size)
        torch.cuda.synchronize()
        self.build_all_s = time.perf_counter() - t0

    def views(self, ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(block_table [S, ctx // BLOCK], seq_lens [S])`` for sequences of ``ctx`` tokens."""
        table = self.table[:, : ctx // BLOCK].contiguous()
        return table, torch.full((self.batch,), ctx, dtype=torch.int32, device="cuda")

    def dense_views(self, ctx: int):
        """K and V of every sequence as `[S, H, ctx, D]` strided views of the cache (sequence s = blocks of row s
        in memory order), and q as `[S, H, G, D]`."""
        kv = self.kv.view(self.batch, -1, self.heads, 2 * self.dim)[:, :ctx]
        k, v = kv[..., : self.dim].transpose(1, 2), kv[..., self.dim:].transpose(1, 2)
        return self.q.view(self.batch, self.heads, -1, self.dim), k, v
