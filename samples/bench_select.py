"""Top-K page selection alone on the GPU (``locks_kernels.select_pages``) at the shapes of the end-to-end engines.

Scores are random (fp32 `[S, HQ, Pmax]`, ``Pmax`` = the block table's width in pages for ``max_model_len`` =
context + 640, as in ``bench_e2e.py``), budget 2048 tokens (K = 128 pages of 16); the pages must keep the group
mass that the ops twin's selection keeps (checked). Timing as ``bench_kernels.py`` (``locks_bench.gpu_timing``):
CUDA-graph replays between CUDA events, L2 flushed before each, median of ``--reps``.

Usage::

    python samples/bench_select.py --out OUT      # prints a table; writes OUT/select.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from locks_engine.config import LocksConfig

#: (name, context tokens, KV heads, query heads, sequences)
SHAPES = [
    ("glm 1M", 1 << 20, 2, 32, 1),
    ("llama 1M", 1 << 20, 8, 32, 1),
    ("llama 256K", 1 << 18, 8, 32, 1),
    ("llama 128K", 1 << 17, 8, 32, 1),
    ("glm 128K", 1 << 17, 2, 32, 1),
    ("llama 128K b6", 1 << 17, 8, 32, 6),
]


def kept_mass(scores, selected, heads: int) -> torch.Tensor:
    """Group mass share `[S, H]` of the selected pages (``-1`` slots left out)."""
    shares = torch.softmax(scores.double(), dim=-1).unflatten(1, (heads, -1)).mean(2)  # [S, H, Pmax]
    return shares.gather(2, selected.clamp(min=0)).masked_fill(selected < 0, 0).sum(-1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("select-out"))
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--shapes", help="comma list of shape names to time (default: all), e.g. 'glm 1M,glm 128K'")
    args = ap.parse_args()
    shapes = [s for s in SHAPES if not args.shapes or s[0] in args.shapes.split(",")]
    import locks_kernels as lk
    from locks_bench.gpu_timing import Timer
    from locks_engine.ops import select_pages

    cfg = LocksConfig(budget=2048)
    budget = (cfg.budget_pages, cfg.page_size, cfg.sink_pages, cfg.recent_pages)
    timer, rows, failures = Timer(args.reps), [], []
    for name, ctx, heads, q_heads, seqs in shapes:
        pmax = -(-(ctx + 640) // cfg.page_size)
        gen = torch.Generator(device="cuda").manual_seed(ctx + heads)
        scores = torch.randn(seqs, q_heads, pmax, device="cuda", generator=gen)
        seq_lens = torch.full((seqs,), ctx, dtype=torch.int32, device="cuda")
        out = lk.select_pages(scores, seq_lens, heads, *budget)
        ref = select_pages(scores, seq_lens, heads, cfg)
        if not torch.allclose(kept_mass(scores, out, heads), kept_mass(scores, ref, heads), rtol=1e-5, atol=1e-7):
            failures.append(f"{name}: the pages keep another group mass than ops' selection")
        ms, _ = timer(lambda: lk.select_pages(scores, seq_lens, heads, *budget, out=out))
        row = {"shape": name, "context": ctx, "kv_heads": heads, "seqs": seqs, "pmax": pmax, "ms": round(ms, 4)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": args.reps}
    (args.out / "select.json").write_text(json.dumps({**meta, "rows": rows, "failures": failures}, indent=1))
    print("\n| shape | Pmax | select |\n|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['pmax']} | {r['ms'] * 1e3:.1f} us |")
    print("RESULT:", "PASS" if not failures else "FAIL " + "; ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
