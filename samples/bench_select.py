"""Top-K page selection alone on the GPU: the plan of ``locks_kernels.select`` (chunk size and group pass) against
fixed plans, the chunk pass's query heads a block and warps, the arity of the K-th-largest search and the warps of
the group and merge passes, at the shapes of the end-to-end engines (GPU machine).

Scores are random (fp32 `[S, HQ, Pmax]`, ``Pmax`` = the block table's width in pages for ``max_model_len`` =
context + 640, as in ``bench_e2e.py``), budget 2048 tokens (K = 128 pages of 16); every plan must select the same
pages (checked). Timing as ``bench_kernels.py``: CUDA-graph replays between CUDA events, L2 flushed before each,
median of ``--reps``.

Usage::

    python samples/bench_select.py --out OUT      # prints a table; writes OUT/select.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from locks_engine.config import LocksConfig  # noqa: E402

#: (name, context tokens, KV heads, query heads, sequences)
SHAPES = [
    ("glm 1M", 1 << 20, 2, 32, 1),
    ("llama 1M", 1 << 20, 8, 32, 1),
    ("llama 256K", 1 << 18, 8, 32, 1),
    ("llama 128K", 1 << 17, 8, 32, 1),
    ("glm 128K", 1 << 17, 2, 32, 1),
    ("llama 128K b6", 1 << 17, 8, 32, 6),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("select-out"))
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--shapes", help="comma list of shape names to time (default: all), e.g. 'glm 1M,glm 128K'")
    args = ap.parse_args()
    shapes = [s for s in SHAPES if not args.shapes or s[0] in args.shapes.split(",")]
    import locks_kernels as lk
    from bench_kernels import Timer
    from locks_kernels.select import plan

    cfg = LocksConfig(budget=2048)
    timer, rows, failures = Timer(args.reps), [], []
    for name, ctx, heads, q_heads, seqs in shapes:
        pmax = -(-(ctx + 640) // 16)
        gen = torch.Generator(device="cuda").manual_seed(ctx + heads)
        scores = torch.randn(seqs, q_heads, pmax, device="cuda", generator=gen)
        seq_lens = torch.full((seqs,), ctx, dtype=torch.int32, device="cuda")
        out = torch.empty(seqs, heads, cfg.budget_pages, dtype=torch.int64, device="cuda")
        old_chunk = max(128, min(4096, 1 << (pmax - 1).bit_length()))
        groups = q_heads // heads
        plans = {"before (chunk 4096, no group)": (old_chunk, 0, 1, None), "plan": (None, None, None, None)}
        for chunk, group in ((1024, 8), (2048, 0), (2048, 8)):
            plans[f"chunk {chunk}, group {group}"] = (chunk, group, None, None)
        # the chunk pass: the group's query heads as one block or one at a time, and its warps
        for block, warps in ((groups, 8), (groups, 16), (1, 8), (1, 4)):
            what = "the group" if block == groups else "one head"
            plans[f"plan, {what} a block, {warps} warps"] = (None, None, block, warps)
        # the K-th-largest search: fewer thresholds a round (more rounds) or more (fewer rounds, wider reductions)
        for arity in (4, 16):
            plans[f"plan, {arity}-ary search"] = (None, None, None, None, arity, None)
        # group pass and merge in fewer warps: the search's block reductions without (1) or with fewer barriers
        for warps in (1, 2):
            plans[f"plan, merge {warps} warp{'s' if warps > 1 else ''}"] = (None, None, None, None, None, warps)
        row = {"shape": name, "context": ctx, "kv_heads": heads, "seqs": seqs, "pmax": pmax,
               "plan": plan(pmax, 128), "ms": {}}
        reference = None
        for label, (chunk, group, block, warps, *more) in plans.items():
            arity, merge_warps = more or (None, None)
            tuning = {"chunk": chunk, "group": group, "heads_a_block": block, "chunk_warps": warps,
                      "search_arity": arity, "merge_warps": merge_warps}
            picked = lk.select_pages(scores, seq_lens, heads, cfg, **tuning).clone()
            if reference is None:
                reference = picked
            elif not torch.equal(picked, reference):
                failures.append(f"{name}: {label} selects other pages")
            ms, _ = timer(lambda t=tuning: lk.select_pages(scores, seq_lens, heads, cfg, out=out, **t))
            row["ms"][label] = round(ms, 4)
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": args.reps}
    (args.out / "select.json").write_text(json.dumps({**meta, "rows": rows, "failures": failures}, indent=1))
    labels = list(rows[0]["ms"])
    print("\n| shape | plan (chunk, group) | " + " | ".join(labels) + " |")
    print("|---|---|" + "---|" * len(labels))
    for r in rows:
        print(f"| {r['shape']} | {r['plan']} | " + " | ".join(f"{r['ms'][k] * 1e3:.1f} us" for k in labels) + " |")
    print("RESULT:", "PASS" if not failures else "FAIL " + "; ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
