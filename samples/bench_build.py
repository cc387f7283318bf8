"""Summary building alone on the GPU: ``build_page_summaries`` (the prefill path) in page-heads per second.

Keys are synthetic, `[P, B, H, D]` bf16: a spectrum that decays like real post-RoPE keys' (channel ``d`` scaled by
``0.97 ** d``) plus one large near-constant channel (real keys have centroid entries up to ~145), so that the Jacobi
sweeps converge at a realistic pace; the summaries must reconstruct the keys as the ops twin's do (checked on the
first 256 pages). Timing as ``bench_kernels.py`` (``locks_bench.gpu_timing``: CUDA-graph replays between CUDA
events, L2 flushed, median of ``--reps``). The share of prefill that building adds is then ``page-heads / rate`` against the
prefill time: at Llama-3.1-8B shapes, 256K tokens are 16,384 pages x 8 KV heads x 32 layers = 4.19M page-heads.

Usage::

    python samples/bench_build.py --out OUT      # prints a table; writes OUT/build.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from locks_engine.config import LocksConfig

#: (name, pages, KV heads, head dim): one layer's prefill chunk of 16,384 tokens (1,024 pages) and a whole 256K
SHAPES = [("llama chunk 16K", 1024, 8, 128), ("llama 256K layer", 16384, 8, 128), ("glm 1M layer", 65536, 2, 128)]


def synthetic_keys(pages: int, heads: int, dim: int, seed: int) -> torch.Tensor:
    """`[P, 16, H, D]` bf16 keys with a decaying spectrum and one large near-constant channel."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    keys = torch.randn(pages, 16, heads, dim, device="cuda", generator=gen)
    keys *= 0.97 ** torch.arange(dim, device="cuda")
    keys[..., 0] += 40.0
    return keys.to(torch.bfloat16)


def reconstruction(store) -> torch.Tensor:
    """Keys `[P, H, B, D]` as a summary stands for them (eigenvector signs are arbitrary: compare these)."""
    centroid, basis, coeffs = store.dequantize()
    return centroid.unsqueeze(2) + coeffs @ basis


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("build-out"))
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    import locks_kernels as lk
    from locks_bench.gpu_timing import Timer
    from locks_engine.ops import PageSummaries, build_page_summaries

    cfg = LocksConfig()
    timer, rows, failures = Timer(args.reps), [], []
    for name, pages, heads, dim in SHAPES:
        keys = synthetic_keys(pages, heads, dim, pages + heads)
        summaries = lk.build_page_summaries(keys, cfg.rank)
        names = ("centroid", "basis", "coeffs", "basis_scale", "coeffs_scale")
        store = PageSummaries("colwise8", **{n: t[:256] for n, t in zip(names, summaries)})
        reference = reconstruction(build_page_summaries(keys[:256].float().cpu(), cfg)).to(keys.device)
        err = ((reconstruction(store) - reference).norm() / reference.norm()).item()
        if not err < 2e-2:
            failures.append(f"{name}: the summaries reconstruct the keys {err:.2e} away from the ops twin's")
        ms, _ = timer(lambda: lk.build_page_summaries(keys, cfg.rank, out=summaries))
        row = {"shape": name, "pages": pages, "kv_heads": heads, "dim": dim, "format": cfg.summary_format,
               "rank": cfg.rank, "reconstruction_rel_diff": err, "ms": round(ms, 4),
               "page_heads_per_s": round(pages * heads / ms * 1e3)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": args.reps}
    (args.out / "build.json").write_text(json.dumps({**meta, "rows": rows, "failures": failures}, indent=1))
    print("\n| shape | build |\n|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['ms']:.2f} ms ({r['page_heads_per_s'] / 1e6:.1f}M page-heads/s) |")
    print("RESULT:", "PASS" if not failures else "FAIL " + "; ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
