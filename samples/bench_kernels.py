"""One decode step of one attention layer: LOCKS (Triton score + select + sparse attention) vs dense decode.

What it measures, on one CUDA GPU (the README's table came from an H200):

- the device-to-device copy bandwidth (bytes read + written per second), which sets every floor below;
- dense decode with torch SDPA, cuDNN and flash backends, GQA as ``G`` query
  rows per KV head (no K/V expansion), over a contiguous cache; and the Triton sparse kernel reading every page;
- LOCKS stages over a permuted paged cache (block size 64, page 16): ``score_pages``, ``select_pages``,
  ``sparse_paged_attention`` alone and the three together, plus ``build_completed_page_summaries`` with every
  sequence completing a page (its worst case; a page completes once per 16 steps).

Each timing is a CUDA-graph replay between CUDA events, L2 flushed before each replay, median of ``--reps``.
Floors: bytes / copy bandwidth. LOCKS bytes = summaries of complete pages + K and V of the selected pages +
queries and outputs; dense bytes = all K and V + queries and outputs.

Run (writes ``kernels.json``, ``kernels_full.json`` and ``kernels.png`` under ``--out``)::

    python samples/bench_kernels.py --out samples/results
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import locks_kernels as lk
from locks_engine import LocksConfig
from locks_engine.ops import allocate_page_summaries, summary_bytes

SHAPES = {"llama-3.1-8b": (8, 32, 128), "glm-4-9b": (2, 32, 128)}  # KV heads, query heads, head dim
CONTEXTS = (32 * 1024, 128 * 1024, 256 * 1024, 1024 * 1024)
BATCHES = (1, 8, 32)
BLOCK = 64
# the memory-efficient backend ran 30x slower than flash at 1M tokens (first run): left out
DENSE = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}


class Timer:
    """CUDA-graph replays timed with events; an L2-sized buffer is overwritten before each replay."""

    def __init__(self, reps: int):
        self.reps = reps
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def __call__(self, fn, graph: bool = True) -> tuple[float, str]:
        fn()  # compile / warm up outside the graph
        torch.cuda.synchronize()
        try:
            assert graph, "eager timing asked for"
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            run, how = graph.replay, "graph"
        except Exception:  # a library call that will not capture: time it eagerly
            torch.cuda.synchronize()
            run, how = fn, "eager"
        times, reps, i = [], self.reps, 0
        while len(times) < reps:
            self.flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            if i == 0 and start.elapsed_time(end) > 2.0:
                reps = max(5, self.reps // 3)  # slow kernels: fewer replays
            if i >= 3:
                times.append(start.elapsed_time(end))
            i += 1
        return statistics.median(times), how


def copy_bandwidth(timer: Timer) -> float:
    """Device-to-device copy, bytes read + written per second (eager: a graph's memcpy node runs slower)."""
    src = torch.empty(4 << 30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms, _ = timer(lambda: dst.copy_(src), graph=False)
    return 2 * (4 << 30) / (ms * 1e-3)


class Setup:
    """A batch of equal-length sequences: packed K|V cache (vLLM layout), permuted block table, summaries."""

    def __init__(self, heads, q_heads, dim, batch, max_ctx, cfg):
        self.heads, self.q_heads, self.dim, self.batch, self.cfg = heads, q_heads, dim, batch, cfg
        blocks = max_ctx // BLOCK
        self.kv = torch.empty(batch * blocks, BLOCK, heads, 2 * dim, dtype=torch.bfloat16, device="cuda").normal_()
        self.k, self.v = self.kv[..., :dim], self.kv[..., dim:]
        perm = torch.randperm(batch * blocks, device="cuda").int()
        self.table = perm.view(batch, blocks)
        self.q = torch.randn(batch, q_heads, dim, dtype=torch.bfloat16, device="cuda")
        self.store = allocate_page_summaries(batch * blocks * BLOCK // cfg.page_size, heads, dim, cfg, "cuda")
        full = torch.full((batch,), max_ctx, dtype=torch.int32, device="cuda")
        t0 = time.perf_counter()
        lk.build_cache_summaries(self.k, self.table, full, cfg, self.store)
        torch.cuda.synchronize()
        self.build_all_s = time.perf_counter() - t0

    def dense_views(self, ctx):
        """K and V of every sequence as `[S, H, ctx, D]` strided views of the cache (sequence s = blocks of row s
        in memory order), and q as `[S, H, G, D]`."""
        kv = self.kv.view(self.batch, -1, self.heads, 2 * self.dim)[:, :ctx]
        k, v = kv[..., : self.dim].transpose(1, 2), kv[..., self.dim:].transpose(1, 2)
        return self.q.view(self.batch, self.heads, -1, self.dim), k, v


def bench_row(s: Setup, ctx: int, timer: Timer, bw: float) -> dict:
    cfg, b, h, hq, d = s.cfg, s.batch, s.heads, s.q_heads, s.dim
    table = s.table[:, : ctx // BLOCK].contiguous()
    lens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    pages = ctx // cfg.page_size
    row = {"context": ctx, "batch": b, "kv_heads": h, "q_heads": hq, "head_dim": d, "budget": cfg.budget,
           "rank": cfg.rank, "summary_format": cfg.summary_format, "dense": {}, "locks": {}}
    # dense
    q4, k, v = s.dense_views(ctx)
    for name, backend in DENSE.items():
        try:
            with sdpa_kernel([backend]):
                row["dense"][name] = timer(lambda: F.scaled_dot_product_attention(q4, k, v))
        except Exception as exc:  # backend absent for these shapes or strides
            row["dense"][name] = (None, f"{type(exc).__name__}: {str(exc)[:120]}")
    every = torch.arange(pages, device="cuda").expand(b, h, pages).contiguous()
    row["dense"]["triton-paged"] = timer(lambda: lk.sparse_paged_attention(s.q, s.k, s.v, table, lens, every, 16))
    # LOCKS stages
    scores = lk.score_pages(s.q, s.store, table, lens, 16, BLOCK)
    selected = lk.select_pages(scores, lens, h, cfg)
    row["locks"]["score"] = timer(lambda: lk.score_pages(s.q, s.store, table, lens, 16, BLOCK, out=scores))
    row["locks"]["select"] = timer(lambda: lk.select_pages(scores, lens, h, cfg, out=selected))
    row["locks"]["attention"] = timer(lambda: lk.sparse_paged_attention(s.q, s.k, s.v, table, lens, selected, 16))
    row["locks"]["step"] = timer(lambda: lk.decode_step(s.q, s.k, s.v, table, lens, s.store, cfg, build=False))
    row["locks"]["build_completed"] = timer(lambda: lk.build_completed_page_summaries(s.k, table, lens, s.store, cfg))
    # bytes and floors
    summ, kv_page = summary_bytes(cfg.page_size, cfg.rank, d, cfg.summary_format)
    qo = 2 * b * hq * d * 2
    row["dense_bytes"] = b * h * pages * kv_page + qo
    row["locks_bytes"] = b * h * (pages * summ + min(cfg.budget_pages, pages) * kv_page) + qo
    row["copy_bw_bytes_per_s"] = bw
    ok = {n: t for n, (t, _) in row["dense"].items() if t is not None}
    row["dense_kernel"] = min(ok, key=ok.get)
    row["dense_ms"] = ok[row["dense_kernel"]]
    row["dense_floor_ms"] = row["dense_bytes"] / bw * 1e3
    row["locks_ms"] = row["locks"]["step"][0]
    row["locks_floor_ms"] = row["locks_bytes"] / bw * 1e3
    return row


def sweep(s: Setup, ctx: int, timer: Timer) -> dict:
    """Tuning knobs of each kernel at one size (for the notes): ``{knob setting: ms}``."""
    table = s.table[:, : ctx // BLOCK].contiguous()
    lens = torch.full((s.batch,), ctx, dtype=torch.int32, device="cuda")
    scores = lk.score_pages(s.q, s.store, table, lens, 16, BLOCK)
    selected = lk.select_pages(scores, lens, s.heads, s.cfg)
    out = {}
    for tp, nw in ((16, 4), (32, 4), (32, 8), (64, 8)):
        out[f"score tile_pages={tp} num_warps={nw}"] = timer(lambda: lk.score_pages(
            s.q, s.store, table, lens, 16, BLOCK, out=scores, tile_pages=tp, num_warps=nw))[0]
    if s.cfg.summary_format == "chanlog":
        for path, tp in (("int8", 8), ("int8", 16), ("fp16", 16), ("fp16", 32)):
            out[f"score chanlog_path={path} tile_pages={tp}"] = timer(lambda: lk.score_pages(
                s.q, s.store, table, lens, 16, BLOCK, out=scores, tile_pages=tp, chanlog_path=path))[0]
    for nw in (2, 8):
        out[f"build_completed num_warps={nw}"] = timer(lambda: lk.build_completed_page_summaries(
            s.k, table, lens, s.store, s.cfg, num_warps=nw))[0]
    for chunk in (2048, 4096):
        out[f"select chunk={chunk}"] = timer(lambda: lk.select_pages(scores, lens, s.heads, s.cfg, chunk=chunk))[0]
    for tp, pps in ((2, None), (4, None)):
        out[f"attention tile_pages={tp} pages_per_split={pps}"] = timer(lambda: lk.sparse_paged_attention(
            s.q, s.k, s.v, table, lens, selected, 16, tile_pages=tp, pages_per_split=pps))[0]
    return out


def plan(max_gb: float, cfg: LocksConfig):
    for b in BATCHES:
        for name, (h, hq, d) in SHAPES.items():
            per_token = h * d * 2 * 2 * (1 + summary_bytes(16, cfg.rank, d, cfg.summary_format)[0] / (2 * 16 * d * 2))
            fits = [c for c in CONTEXTS if b * c * per_token <= max_gb * 1e9]
            if fits:
                yield name, h, hq, d, b, fits


def summary(rows, gpu, command) -> dict:
    keys = ("context", "batch", "kv_heads", "head_dim", "budget", "rank", "dense_ms", "dense_kernel", "locks_ms",
            "locks_floor_ms")
    return {"gpu": gpu, "date": datetime.date.today().isoformat(), "command": command,
            "rows": [{k: r[k] for k in keys} for r in rows]}


def plot(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SHAPES), figsize=(6 * len(SHAPES), 4.5), squeeze=False)
    for ax, (name, (h, _, _)) in zip(axes[0], SHAPES.items()):
        for b, color in zip(BATCHES, ("C0", "C1", "C2")):
            sel = sorted((r for r in rows if r["kv_heads"] == h and r["batch"] == b), key=lambda r: r["context"])
            if not sel:
                continue
            x = [r["context"] / 1024 for r in sel]
            ax.plot(x, [r["dense_ms"] for r in sel], "s--", color=color, label=f"dense, batch {b}")
            ax.plot(x, [r["locks_ms"] for r in sel], "o-", color=color, label=f"LOCKS, batch {b}")
            ax.plot(x, [r["locks_floor_ms"] for r in sel], ":", color=color, label=f"LOCKS byte floor, batch {b}")
        ax.set(xscale="log", yscale="log", xlabel="context (K tokens)", ylabel="ms per layer per decode step",
               title=f"{name} KV shapes ({h} KV heads, D 128)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("samples/results"))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--max-gb", type=float, default=100.0)
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--summary-format", default=LocksConfig().summary_format, help="summaries to time")
    ap.add_argument("--time-limit", type=float, default=420.0, help="seconds; later setups are skipped")
    ap.add_argument("--sweep", action="store_true", help="also time each kernel's tuning knobs at batch 1, 1M")
    args = ap.parse_args()
    changed = {k: v for k, v in vars(args).items() if k != "out" and v != ap.get_default(k)}
    command = "python samples/bench_kernels.py" + "".join(
        f" --{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in changed.items())
    cfg = LocksConfig(budget=args.budget, rank=args.rank, summary_format=args.summary_format)
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    timer = Timer(args.reps)
    start = time.perf_counter()
    bw = copy_bandwidth(timer)
    print(f"{gpu}: device-to-device copy {bw / 1e12:.2f} TB/s (read + write)", flush=True)
    rows = []
    log = {"gpu": gpu, "copy_bw_bytes_per_s": bw, "config": cfg.to_dict(), "setups": [], "rows": rows}
    for name, h, hq, d, b, contexts in plan(args.max_gb, cfg):
        if time.perf_counter() - start > args.time_limit:
            log["setups"].append({"shape": name, "batch": b, "skipped": "time limit"})
            continue
        s = Setup(h, hq, d, b, max(contexts), cfg)
        log["setups"].append({"shape": name, "batch": b, "build_all_pages_s": s.build_all_s})
        if args.sweep and b == 1:
            log[f"sweep {name} b1 {max(contexts) // 1024}K"] = sweep(s, max(contexts), timer)
        for ctx in contexts:
            try:
                row = bench_row(s, ctx, timer, bw)
            except torch.OutOfMemoryError as exc:
                print(f"{name} b{b} {ctx}: out of memory ({exc})", flush=True)
                continue
            row["shape"] = name
            rows.append(row)
            st = row["locks"]
            print(f"{name:12s} b{b:<3d} {ctx // 1024:5d}K dense {row['dense_ms']:.3f} ({row['dense_kernel']}) "
                  f"locks {row['locks_ms']:.3f} floor {row['locks_floor_ms']:.3f} | score {st['score'][0]:.3f} "
                  f"select {st['select'][0]:.3f} attn {st['attention'][0]:.3f} build {st['build_completed'][0]:.3f}",
                  flush=True)
            (args.out / "kernels_full.json").write_text(json.dumps(log, indent=1))
        del s
        torch.cuda.empty_cache()
    (args.out / "kernels.json").write_text(json.dumps(summary(rows, gpu, command), indent=1))
    plot(rows, args.out / "kernels.png")
    print(f"\n{gpu}, {datetime.date.today()}, budget {cfg.budget} tokens, r = {cfg.rank}, {cfg.summary_format}")
    print("| KV heads | batch | context | dense ms (kernel) | dense floor | LOCKS ms | LOCKS floor | speedup "
          "| x floor |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kv_heads']} | {r['batch']} | {r['context'] // 1024}K | {r['dense_ms']:.3f} ({r['dense_kernel']}) "
              f"| {r['dense_floor_ms']:.3f} "
              f"| {r['locks_ms']:.3f} | {r['locks_floor_ms']:.3f} | {r['dense_ms'] / r['locks_ms']:.1f}x "
              f"| {r['locks_ms'] / r['locks_floor_ms']:.2f} |")


if __name__ == "__main__":
    main()
