"""Summary building alone on the GPU: ``build_page_summaries`` (the prefill path) in page-heads per second, with the
Jacobi rotations as matrix products or elementwise with gathered partners, and warps per program (GPU machine).

Keys are synthetic, `[P, B, H, D]` bf16: a spectrum that decays like real post-RoPE keys' (channel ``d`` scaled by
``0.97 ** d``) plus one large near-constant channel (real keys have centroid entries up to ~145), so that the Jacobi
sweeps converge at a realistic pace. Timing as ``bench_kernels.py`` (CUDA-graph replays between CUDA events, L2
flushed, median of ``--reps``). The share of prefill that building adds is then ``page-heads / rate`` against the
prefill time: at Llama-3.1-8B shapes, 256K tokens are 16,384 pages x 8 KV heads x 32 layers = 4.19M page-heads.

Usage::

    python samples/bench_build.py --out OUT      # prints a table; writes OUT/build.json
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

#: (name, pages, KV heads, head dim): one layer's prefill chunk of 16,384 tokens (1,024 pages) and a whole 256K
SHAPES = [("llama chunk 16K", 1024, 8, 128), ("llama 256K layer", 16384, 8, 128), ("glm 1M layer", 65536, 2, 128)]
#: (label, Jacobi by gathers, warps)
VARIANTS = [("products, 2 warps", False, 2), ("gathers, 1 warp", True, 1), ("gathers, 2 warps", True, 2),
            ("gathers, 4 warps", True, 4)]


def synthetic_keys(pages: int, heads: int, dim: int, seed: int) -> torch.Tensor:
    """`[P, 16, H, D]` bf16 keys with a decaying spectrum and one large near-constant channel."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    keys = torch.randn(pages, 16, heads, dim, device="cuda", generator=gen)
    keys *= 0.97 ** torch.arange(dim, device="cuda")
    keys[..., 0] += 40.0
    return keys.to(torch.bfloat16)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("build-out"))
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    import locks_kernels as lk
    from bench_kernels import Timer

    cfg = LocksConfig()
    timer, rows, failures = Timer(args.reps), [], []
    for name, pages, heads, dim in SHAPES:
        keys = synthetic_keys(pages, heads, dim, pages + heads)
        row = {"shape": name, "pages": pages, "kv_heads": heads, "dim": dim, "format": cfg.summary_format,
               "rank": cfg.rank, "ms": {}, "page_heads_per_s": {}}
        reference = None
        for label, gather, warps in VARIANTS:
            store = lk.build_page_summaries(keys, cfg, num_warps=warps, gather=gather)
            centroid, basis, coeffs = store.dequantize()
            rebuilt = centroid.unsqueeze(2) + coeffs @ basis  # [P, H, B, D]
            if reference is None:
                reference = rebuilt
            else:
                err = ((rebuilt - reference).norm() / reference.norm()).item()
                if not err < 1e-2:
                    failures.append(f"{name}: {label} reconstructs the keys {err:.2e} away from the first variant")
            ms, _ = timer(lambda g=gather, w=warps: lk.build_page_summaries(keys, cfg, out=store, num_warps=w,
                                                                             gather=g))
            row["ms"][label] = round(ms, 4)
            row["page_heads_per_s"][label] = round(pages * heads / ms * 1e3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": args.reps}
    (args.out / "build.json").write_text(json.dumps({**meta, "rows": rows, "failures": failures}, indent=1))
    labels = [v[0] for v in VARIANTS]
    print("\n| shape | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for r in rows:
        print(f"| {r['shape']} | " + " | ".join(f"{r['ms'][k]:.2f} ms ({r['page_heads_per_s'][k] / 1e6:.1f}M/s)"
                                                for k in labels) + " |")
    print("RESULT:", "PASS" if not failures else "FAIL " + "; ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
