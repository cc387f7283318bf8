"""One decode step of one attention layer: LOCKS (Triton score + select + sparse attention) vs dense decode.

What it measures, on one CUDA GPU (the README's table came from an H200):

- the device-to-device copy bandwidth (bytes read + written per second), which sets every floor below;
- dense decode with torch SDPA, cuDNN and flash backends, GQA as ``G`` query
  rows per KV head (no K/V expansion), over a contiguous cache; and the Triton sparse kernel reading every page;
- LOCKS stages over a permuted paged cache (block size 64, page 16): ``score_pages``, ``select_pages``,
  ``sparse_paged_attention`` alone and the three together as ``decode_step`` (``select_step`` then
  ``sparse_paged_attention``, the functions the vLLM backend's CUDA path calls), plus
  ``build_completed_page_summaries`` with every sequence completing a page (its worst case; a page completes once
  per 16 steps).

Each timing is a CUDA-graph replay between CUDA events, L2 flushed before each replay, median of ``--reps``.
Floors: bytes / copy bandwidth. LOCKS bytes = summaries of complete pages + K and V of the selected pages +
queries and outputs; dense bytes = all K and V + queries and outputs.

With ``--baseline-module NAME`` it also times the decode step (score + select + attend, same inputs) with the
kernels of module ``NAME`` (an earlier copy of this package under another import name, with the earlier API:
``score_pages(q, store, ...)`` on a ``PageSummaries``, ``select_pages(scores, seq_lens, num_kv_heads, cfg)``,
``decode_step(q, k_cache, v_cache, block_table, seq_lens, store, cfg)``), the two steps' replays in turn, at
GLM-4-9B-1M shapes at 1M tokens and Llama-3.1-8B shapes at 128K, batch 1 (``baseline.json``).

Run (writes ``kernels.json``, ``kernels_full.json`` and ``kernels.png`` under ``--out``)::

    python samples/bench_kernels.py --out samples/results
    python samples/bench_kernels.py --out OUT --baseline-module locks_kernels_old --baseline-only
    python samples/bench_kernels.py --out OUT --two-level 2,4,8
    python samples/bench_kernels.py --out OUT --select-chunks 512,1024,2048,4096
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import locks_kernels as lk
from locks_bench.candidates import parse_candidates, table_mean
from locks_bench.gpu_timing import BLOCK, Setup, Timer, copy_bandwidth
from locks_engine import LocksConfig
from locks_engine.ops import summary_bytes

SHAPES = {"llama-3.1-8b": (8, 32, 128), "glm-4-9b": (2, 32, 128)}  # KV heads, query heads, head dim
CONTEXTS = (32 * 1024, 128 * 1024, 256 * 1024, 1024 * 1024)
BATCHES = (1, 8, 32)
#: the memory-efficient backend is left out: far slower than flash at long contexts
DENSE = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}
#: old-vs-new decode step: (name, shape in SHAPES, context tokens), batch 1
BASELINE = (("glm-4-9b 1M", "glm-4-9b", 1 << 20), ("llama-3.1-8b 128K", "llama-3.1-8b", 1 << 17))


def budget_args(cfg: LocksConfig) -> dict:
    """The budget arguments of ``locks_kernels.select_pages`` / ``decode_step`` for ``cfg``."""
    return dict(budget_pages=cfg.budget_pages, page_size=cfg.page_size, sink_pages=cfg.sink_pages,
                recent_pages=cfg.recent_pages)


def bench_row(s: Setup, ctx: int, timer: Timer, bw: float) -> dict:
    cfg, b, h, hq, d = s.cfg, s.batch, s.heads, s.q_heads, s.dim
    table, lens = s.views(ctx)
    summ_t = s.summaries
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
    budget = budget_args(cfg)
    scores = lk.score_pages(s.q, summ_t, table, lens, cfg.page_size, BLOCK)
    selected = lk.select_pages(scores, lens, h, **budget)
    row["locks"]["score"] = timer(lambda: lk.score_pages(s.q, summ_t, table, lens, cfg.page_size, BLOCK, out=scores))
    row["locks"]["select"] = timer(lambda: lk.select_pages(scores, lens, h, **budget, out=selected))
    row["locks"]["attention"] = timer(lambda: lk.sparse_paged_attention(s.q, s.k, s.v, table, lens, selected,
                                                                        cfg.page_size))
    row["locks"]["step"] = timer(lambda: lk.decode_step(s.q, s.k, s.v, table, lens, summ_t, **budget, build=False))
    row["locks"]["build_completed"] = timer(lambda: lk.build_completed_page_summaries(s.k, table, lens, summ_t,
                                                                                      cfg.page_size))
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


def baseline(module: str, timer: Timer, cfg: LocksConfig) -> list[dict]:
    """Old vs new decode step (``build=False``) at :data:`BASELINE`'s shapes, batch 1, on the same cache,
    summaries and queries; their replays interleaved. Returns one row per shape: ms of each and ``new / old``."""
    # the old kernels read tuning switches from LOCKS_* variables: time both at their defaults
    for name in [n for n in os.environ if n.startswith("LOCKS_")]:
        del os.environ[name]
    old = importlib.import_module(module)
    todays_api = "budget_pages" in inspect.signature(old.decode_step).parameters
    budget = budget_args(cfg)
    rows = []
    for label, shape, ctx in BASELINE:
        h, hq, d = SHAPES[shape]
        s = Setup(h, hq, d, 1, ctx, cfg)
        table, lens = s.views(ctx)
        # today's API takes the summaries and the budget's numbers; up to abb3e44 the store and the LocksConfig
        old_args = (s.summaries, budget) if todays_api else (s.store, {"cfg": cfg})
        steps = {
            "old": lambda: old.decode_step(s.q, s.k, s.v, table, lens, old_args[0], **old_args[1], build=False),
            "new": lambda: lk.decode_step(s.q, s.k, s.v, table, lens, s.summaries, **budget, build=False),
        }
        (out_old, lse_old), (out_new, lse_new) = steps["old"](), steps["new"]()
        same = torch.equal(out_old, out_new) and torch.equal(lse_old, lse_new)
        ms = timer.interleaved(steps)
        rows.append({"shape": label, "context": ctx, "kv_heads": h, "q_heads": hq, "head_dim": d, "batch": 1,
                     "budget": cfg.budget, "old_ms": ms["old"], "new_ms": ms["new"],
                     "new_over_old": ms["new"] / ms["old"], "same_output": same})
        print(f"{label:20s} old {ms['old'] * 1e3:8.1f} us | new {ms['new'] * 1e3:8.1f} us | new / old "
              f"{ms['new'] / ms['old']:.3f} | outputs {'equal' if same else 'DIFFER'}", flush=True)
        del s, steps
        torch.cuda.empty_cache()
    return rows


#: two-level against flat decode steps: (name, shape in SHAPES, context tokens), batch 1
TWO_LEVEL = (("glm-4-9b 1M", "glm-4-9b", 1 << 20), ("llama-3.1-8b 128K", "llama-3.1-8b", 1 << 17),
             ("llama-3.1-8b 256K", "llama-3.1-8b", 1 << 18))


def vllm_flash_attn(s: Setup, ctx: int, table: torch.Tensor, lens: torch.Tensor):
    """vLLM's FLASH_ATTN decode call on the setup's paged cache, as vLLM 0.26's ``FlashAttentionImpl`` makes it
    under full CUDA graphs (``vllm/v1/attention/backends/flash_attn.py``: FA3 ``flash_attn_varlen_func`` with the
    block table, ``seqused_k``, an ahead-of-time schedule and ``num_splits`` = 32, vLLM's
    ``flash_attn_max_num_splits_for_cuda_graph``), batch 1, one query token. ``None`` without vLLM's FA3."""
    try:
        from vllm.vllm_flash_attn import flash_attn_varlen_func, get_scheduler_metadata, is_fa_version_supported
    except ImportError:
        return None
    if not is_fa_version_supported(3):
        return None
    b, hq, d = s.batch, s.q_heads, s.dim
    q = s.q.view(b, hq, d)
    out = torch.empty_like(q)
    cu_q = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    meta = get_scheduler_metadata(batch_size=b, max_seqlen_q=1, max_seqlen_k=ctx, num_heads_q=hq,
                                  num_heads_kv=s.heads, headdim=d, cache_seqlens=lens, qkv_dtype=torch.bfloat16,
                                  cu_seqlens_q=cu_q, page_size=BLOCK, causal=True, num_splits=32)
    return lambda: flash_attn_varlen_func(q=q, k=s.k, v=s.v, out=out, cu_seqlens_q=cu_q, max_seqlen_q=1,
                                          seqused_k=lens, max_seqlen_k=ctx, softmax_scale=d ** -0.5, causal=True,
                                          block_table=table, scheduler_metadata=meta, fa_version=3, num_splits=32)


def two_level(timer: Timer, cfg: LocksConfig, candidates: list[int],
              layer_table: list[int] | None = None, live: int = 0) -> list[dict]:
    """The decode step (``build=False``) with the flat scan and with the two-level selection at each ``c`` of
    ``candidates``, interleaved replays on the same cache, summaries and queries, at :data:`TWO_LEVEL`'s shapes,
    batch 1; the two-level stages timed alone; dense SDPA (flash, cuDNN) and vLLM's FLASH_ATTN decode call
    (:func:`vllm_flash_attn`, where vLLM is installed) on the same K/V; with ``layer_table`` (``c`` per layer, 0 =
    flat), its mean over layers
    (:func:`table_mean`). Bytes a step and layer: flat ``P s + K p``; two-level ``P / 16 * 2 D + 16 M s + K p``
    (``M`` superpages scored). With ``live`` (a capacity ``c``), each ``c`` is also timed as data at that capacity
    (``select_step(live=)``, what ``candidates="auto"`` runs): ``live_ms``."""
    from locks_engine.ops.superpages import allocate_superpages, completed_superpages, write_superpage_centroids

    budget = budget_args(cfg)
    rows = []
    for label, shape, ctx in TWO_LEVEL:
        h, hq, d = SHAPES[shape]
        s = Setup(h, hq, d, 1, ctx, cfg)
        table, lens = s.views(ctx)
        sp = allocate_superpages(s.store.num_pages, h, d, "cuda")
        write_superpage_centroids(sp, s.store, completed_superpages(lens, lens, table, cfg.page_size, BLOCK))
        steps = {"flat": lambda: lk.decode_step(s.q, s.k, s.v, table, lens, s.summaries, **budget, build=False)}
        for c in candidates:
            steps[f"c{c}"] = (lambda c=c: lk.decode_step(s.q, s.k, s.v, table, lens, s.summaries, **budget,
                                                         build=False, superpages=sp, candidates=c))
            if live:
                m = torch.tensor([lk.superpage_slots(cfg.budget_pages, cfg.sink_pages, cfg.recent_pages, c)],
                                 dtype=torch.int32, device="cuda")
                steps[f"live{c}"] = (lambda m=m: lk.decode_step(s.q, s.k, s.v, table, lens, s.summaries, **budget,
                                                                build=False, superpages=sp, candidates=live, live=m))
        ms = timer.interleaved(steps)
        q4, k, v = s.dense_views(ctx)
        dense = {}
        for name, backend in DENSE.items():
            try:
                with sdpa_kernel([backend]):
                    dense[name] = timer(lambda: F.scaled_dot_product_attention(q4, k, v))[0]
            except Exception:  # backend absent for these shapes or strides
                continue
        try:
            fa3 = vllm_flash_attn(s, ctx, table, lens)
            if fa3 is not None:
                dense["vllm-fa3"] = timer(fa3)[0]
        except Exception as exc:  # vLLM's kernel refused these strides: the row keeps SDPA's timings
            print(f"vLLM FA3 not timed: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
        summ, kv_page = summary_bytes(cfg.page_size, cfg.rank, d, cfg.summary_format)
        pages = ctx // cfg.page_size
        kv_all = h * pages * kv_page
        row = {"shape": label, "context": ctx, "kv_heads": h, "q_heads": hq, "head_dim": d, "batch": 1,
               "budget": cfg.budget, "dense_ms": dense, "flat_ms": ms["flat"],
               "flat_bytes_pct": 100 * h * (pages * summ + cfg.budget_pages * kv_page) / kv_all, "two_level": {}}
        for c in candidates:
            slots = lk.superpage_slots(cfg.budget_pages, cfg.sink_pages, cfg.recent_pages, c)
            coarse = lk.superpage_scores(s.q, sp, table, lens, cfg.page_size, BLOCK)
            chosen = lk.select_pages(coarse, lens, h, slots, cfg.page_size * 16, 1, 1)
            scores = lk.score_pages(s.q, s.summaries, table, lens, cfg.page_size, BLOCK, tiles=chosen)
            stages = {
                "superpage_scores": timer(lambda: lk.superpage_scores(s.q, sp, table, lens, cfg.page_size, BLOCK,
                                                                      out=coarse))[0],
                "superpage_select": timer(lambda: lk.select_pages(coarse, lens, h, slots, cfg.page_size * 16, 1, 1,
                                                                  out=chosen))[0],
                "page_scores": timer(lambda: lk.score_pages(s.q, s.summaries, table, lens, cfg.page_size, BLOCK,
                                                            out=scores, tiles=chosen))[0],
                "page_select": timer(lambda: lk.select_pages(scores, lens, h, **budget, tiles=chosen))[0],
            }
            read = h * (pages / 16 * 2 * d + 16 * slots * summ + cfg.budget_pages * kv_page)
            row["two_level"][c] = {"ms": ms[f"c{c}"], "superpages_scored": slots, "bytes_pct": 100 * read / kv_all,
                                   "flat_over_two_level": ms["flat"] / ms[f"c{c}"], "stages_ms": stages}
            if live:
                row["two_level"][c]["live_ms"] = ms[f"live{c}"]
        if layer_table:
            row["table"] = table_mean(row, layer_table)
        if live:
            row["calibration_ms"] = calibration_ms(timer, s, sp, table, ctx, cfg)
        rows.append(row)
        best = min(dense.values()) if dense else float("nan")
        print(f"{label:18s} dense {best * 1e3:7.1f} us | flat {ms['flat'] * 1e3:7.1f} us "
              f"({row['flat_bytes_pct']:.1f}% of K+V) | " + " | ".join(
                  f"c{c} {t['ms'] * 1e3:6.1f} us ({t['bytes_pct']:.1f}%)"
                  + (f" as data {t['live_ms'] * 1e3:6.1f} us" if live else "") for c, t in row["two_level"].items())
              + (f" | table {row['table']['ms'] * 1e3:6.1f} us ({row['table']['bytes_pct']:.1f}%)"
                 if layer_table else "")
              + (f" | vLLM FA3 {dense['vllm-fa3'] * 1e3:6.1f} us" if "vllm-fa3" in dense else "")
              + (" | calibration {first:.2f} / {every:.2f} ms".format(**row["calibration_ms"]) if live else ""),
              flush=True)
        del s, steps, sp
        torch.cuda.empty_cache()
    return rows


def calibration_ms(timer: Timer, s: Setup, sp: torch.Tensor, table: torch.Tensor, ctx: int, cfg: LocksConfig
                   ) -> dict[str, float]:
    """One layer's calibration of ``candidates="auto"`` for a prompt of ``ctx`` tokens, as the engine runs it once
    per prompt (``locks_engine.vllm_backend.calibration``): its last 16 queries scored over every page by the
    kernels, then ``pick_from_scores``, eager (host syncs). ``first``: the smallest ``c`` passes (threshold 0);
    ``every``: none does, every ``c`` is measured (a threshold above 1)."""
    from locks_engine.ops.calibration import CALIBRATION_QUERIES, pick_from_scores

    n = CALIBRATION_QUERIES
    q = s.q[:1].expand(n, -1, -1).contiguous()
    lens = torch.arange(ctx - n + 1, ctx + 1, dtype=torch.int32, device="cuda")
    rows = table[:1].expand(n, -1).contiguous()
    h = s.heads

    def run(threshold: float):
        def calibrate():
            scores = lk.score_pages(q, s.summaries, rows, lens, cfg.page_size, BLOCK)
            coarse = lk.superpage_scores(q, sp, rows, lens, cfg.page_size, BLOCK)
            pick_from_scores(scores, coarse, lens, h, cfg, threshold)
        return timer(calibrate, graph=False)[0]

    return {"first": run(0.0), "every": run(1.5)}


#: flat-selection plans: (name, shape in SHAPES, context tokens), batch 1
SELECT_PLANS = (("llama-3.1-8b 128K", "llama-3.1-8b", 1 << 17), ("llama-3.1-8b 256K", "llama-3.1-8b", 1 << 18),
                ("glm-4-9b 1M", "glm-4-9b", 1 << 20))


def select_chunks(timer: Timer, cfg: LocksConfig, chunks: list[int]) -> list[dict]:
    """The flat decode step (``build=False``) with ``locks_kernels.select.CHUNK`` (pages per first-pass program)
    at each of ``chunks``, interleaved replays on the same cache, summaries and queries, at
    :data:`SELECT_PLANS`' shapes, batch 1; each plan's attention output checked equal to the first's (the same pages). Each step is
    captured with its own constant (the launch grids and the merge's width follow it)."""
    from locks_kernels import select

    default = select.CHUNK
    budget = budget_args(cfg)
    rows = []
    try:
        for label, shape, ctx in SELECT_PLANS:
            h, hq, d = SHAPES[shape]
            s = Setup(h, hq, d, 1, ctx, cfg)
            table, lens = s.views(ctx)
            outs, steps = {}, {}
            for chunk in chunks:
                def step(chunk=chunk):
                    select.CHUNK = chunk
                    return lk.decode_step(s.q, s.k, s.v, table, lens, s.summaries, **budget, build=False)
                outs[chunk] = step()[0].clone()
                steps[f"chunk{chunk}"] = step
            ms = timer.interleaved(steps)
            row = {"shape": label, "context": ctx, "kv_heads": h, "q_heads": hq, "batch": 1, "budget": cfg.budget,
                   "ms": {c: ms[f"chunk{c}"] for c in chunks},
                   "same_output": all(torch.equal(outs[c], outs[chunks[0]]) for c in chunks)}
            rows.append(row)
            print(f"{label:18s} " + " | ".join(f"chunk {c} {row['ms'][c] * 1e3:6.1f} us" for c in chunks)
                  + f" | outputs {'equal' if row['same_output'] else 'DIFFER'}", flush=True)
            del s, steps, outs
            torch.cuda.empty_cache()
    finally:
        select.CHUNK = default
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("samples/results"))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--max-gb", type=float, default=100.0)
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=420.0, help="seconds; later setups are skipped")
    ap.add_argument("--baseline-module", help="also time the decode step with the kernels of this module (the "
                    "earlier API) against this package's, interleaved; writes baseline.json")
    ap.add_argument("--baseline-only", action="store_true", help="with --baseline-module: only that comparison")
    ap.add_argument("--two-level", default="", help="comma-separated c: time the two-level selection's decode "
                    "step against the flat scan's (two_level.json), then stop")
    ap.add_argument("--table", default="", help="with --two-level: a per-layer c table (0 = flat), comma-separated "
                    "or named (keep-needle); its mean step and bytes over its layers, each c it names timed")
    ap.add_argument("--live", type=int, default=0, help="with --two-level: also time each c as data at this "
                    "capacity c (candidates=\"auto\": 32)")
    ap.add_argument("--select-chunks", default="", help="comma-separated pages per first-pass program of the "
                    "flat selection: time the decode step with each (select_chunks.json), then stop")
    ap.add_argument("--merge-small", type=int, default=None, help="select.MERGE_SMALL for every timing: the "
                    "width at which the merge searches a calibrated layer's live candidates (0 = the capacity's)")
    args = ap.parse_args()
    if args.merge_small is not None:
        from locks_kernels import select

        select.MERGE_SMALL = args.merge_small
    changed = {k: v for k, v in vars(args).items() if k != "out" and v != ap.get_default(k)}
    command = "python samples/bench_kernels.py" + "".join(
        f" --{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in changed.items())
    cfg = LocksConfig(budget=args.budget, rank=args.rank)
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    timer = Timer(args.reps)

    def write(name: str, rows: list[dict], **extra) -> None:
        (args.out / name).write_text(json.dumps(
            {"gpu": gpu, "date": datetime.date.today().isoformat(), "command": command, "reps": args.reps, **extra,
             "rows": rows}, indent=1))

    if args.two_level:
        table = list(parse_candidates(args.table)) if args.table else []
        cs = sorted({int(c) for c in args.two_level.split(",")} | {c for c in table if c})
        return write("two_level.json", two_level(timer, cfg, cs, table, args.live), table=table, live=args.live)
    if args.select_chunks:
        return write("select_chunks.json",
                     select_chunks(timer, cfg, [int(c) for c in args.select_chunks.split(",")]))
    if args.baseline_module:
        write("baseline.json", baseline(args.baseline_module, timer, cfg), baseline_module=args.baseline_module)
        if args.baseline_only:
            return
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
