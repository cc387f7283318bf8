"""Page scoring alone, and scoring then selection, on the GPU, at the GQA groups of the end-to-end shapes.

Setup as ``bench_kernels.py`` (``locks_bench.gpu_timing``): bf16 keys drawn from a normal distribution in a
permuted paged KV cache, ``colwise8`` summaries built by ``build_cache_summaries`` (budget 2048 tokens, r = 8,
page 16, block 64), one bf16 query per query head, batch 1; timing is CUDA-graph replays between CUDA events with
L2 flushed before each, median of ``--reps``. The scores must match the ops twin's (``locks_engine.ops``, fp32 on
the same summaries) to 1e-3 relative to the largest score on the finite entries (checked). Byte floor: the
summaries read, ``pages x KV heads x summary bytes``, at the device-to-device copy bandwidth.

Usage::

    python samples/bench_score.py --out OUT      # prints a table; writes OUT/score.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from locks_engine.config import LocksConfig

#: (name, KV heads, query heads, contexts timed)
SHAPES = [
    ("glm4-9b-1m", 2, 32, (1 << 20, 1 << 17)),
    ("llama3.1-8b", 8, 32, (1 << 20, 1 << 17)),
]


def check_scores(s, scores, table, lens, cfg) -> float:
    """Largest difference from the ops twin's scores (plain torch, fp32, on the GPU) on the finite entries,
    relative to the largest score; ``inf`` when the ``-inf`` entries differ."""
    from locks_engine.ops import score_pages

    ref = score_pages(s.q.float(), s.store, table, lens, cfg.page_size, s.kv.shape[1])
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(scores), finite):
        return float("inf")
    return ((scores[finite] - ref[finite]).abs().max() / ref[finite].abs().max()).item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("score-out"))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--time-limit", type=float, default=300.0, help="seconds; later shapes are skipped")
    args = ap.parse_args()
    import locks_kernels as lk
    from locks_bench.gpu_timing import BLOCK, Setup, Timer, copy_bandwidth
    from locks_engine.ops.summaries import summary_bytes

    cfg = LocksConfig(budget=2048, rank=8)
    budget = (cfg.budget_pages, cfg.page_size, cfg.sink_pages, cfg.recent_pages)
    timer, rows, failures, start = Timer(args.reps), [], [], time.perf_counter()
    bw = copy_bandwidth(timer)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": args.reps,
            "copy_bw_bytes_per_s": bw, "config": cfg.to_dict()}
    for shape, heads, q_heads, contexts in SHAPES:
        if time.perf_counter() - start > args.time_limit:
            failures.append(f"{shape}: skipped (time limit)")
            continue
        s = Setup(heads, q_heads, 128, 1, max(contexts), cfg)
        for ctx in contexts:
            table, lens = s.views(ctx)
            pages = ctx // cfg.page_size
            floor_ms = pages * heads * summary_bytes(cfg.page_size, cfg.rank, 128, cfg.summary_format)[0] / bw * 1e3
            scores = lk.score_pages(s.q, s.summaries, table, lens, cfg.page_size, BLOCK)
            selected = lk.select_pages(scores, lens, heads, *budget)
            diff = check_scores(s, scores, table, lens, cfg)
            if diff > 1e-3:
                failures.append(f"{shape} {ctx}: scores differ from ops by {diff:.2e}")

            def score():
                lk.score_pages(s.q, s.summaries, table, lens, cfg.page_size, BLOCK, out=scores)

            def score_and_select():
                score()
                lk.select_pages(scores, lens, heads, *budget, out=selected)

            row = {"shape": shape, "context": ctx, "kv_heads": heads, "groups": q_heads // heads,
                   "byte_floor_ms": round(floor_ms, 4), "max_rel_diff": diff,
                   "score_ms": round(timer(score)[0], 4), "score_and_select_ms": round(timer(score_and_select)[0], 4)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del s
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "score.json").write_text(json.dumps({**meta, "rows": rows, "failures": failures}, indent=1))
    print(f"\n{meta['gpu']}: device-to-device copy {bw / 1e12:.2f} TB/s; times in us (floor: summary bytes)")
    print("| shape | context | G | floor | score | score + select |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['context'] // 1024}K | {r['groups']} | {r['byte_floor_ms'] * 1e3:.1f} | "
              f"{r['score_ms'] * 1e3:.1f} | {r['score_and_select_ms'] * 1e3:.1f} |")
    print("RESULT:", "PASS" if not failures else "FAIL " + "; ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
