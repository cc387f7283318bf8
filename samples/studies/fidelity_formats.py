"""Where the quantized summary loses mass, and candidate formats at about the same bytes (the study behind the
formats ``chanlog``, the log2-byte per-channel variant below, and ``colwise8``, the "colwise, int8 basis" row,
the default since 2026-12-01: it keeps the most and scores fastest on the GPU; the others stay proposals).

On a capture cached by ``samples/bench_fidelity.py``: for every layer and KV head, the KV group's mass kept over the
exact-LSE oracle's (``group_ratio``) at one budget and rank, for summaries that quantize one part at a time
(centroid, basis, coefficients), and for three candidate bases: one int4 scale per channel (column of the basis)
in fp16 or as a 1-byte log2 code, and a fixed Hadamard rotation of the head dim before the per-direction int4.
Everything else follows ``build_page_summaries`` (coefficients fitted to the stored basis by least squares).

    python samples/studies/fidelity_formats.py CACHE_DIR/CAPTURE.pt --context 32768 --budget 0.02
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from locks_bench.capture import query_positions
from locks_bench.results import header, write_result
from locks_engine import LocksConfig
from locks_studies.fidelity import DecodeSteps, hadamard
from locks_engine.ops.quant import dequantize, quantize_symmetric
from locks_engine.ops.score import mask_incomplete
from locks_engine.ops.summaries import _page_basis

#: name -> how the centroid, basis and coefficients are stored, and whether keys are rotated first
VARIANTS = {
    "float": ("fp32", "fp32", "fp32", False),
    "colwise": ("fp16", "int4-row", "int8", False),
    "colwise, fp32 centroid": ("fp32", "int4-row", "int8", False),
    "colwise, fp32 coefficients": ("fp16", "int4-row", "fp32", False),
    "colwise, fp32 basis": ("fp16", "fp32", "int8", False),
    "colwise, int8 basis": ("fp16", "int8-row", "int8", False),
    "colwise, Hadamard-rotated": ("fp16", "int4-row", "int8", True),
    "int4 basis, fp16 scale per channel": ("fp16", "int4-col", "int8", False),
    "int4 basis, log2-byte scale per channel": ("fp16", "int4-col-log", "int8", False),
}


def variant_bytes(centroid: str, basis: str, coeffs: str, page_size: int, rank: int, dim: int) -> int:
    """Bytes of one page's summary and KV head (fp16 scales; fp32 parts unscaled)."""
    total = dim * (2 if centroid == "fp16" else 4)
    total += page_size * rank * 4 if coeffs == "fp32" else page_size * rank + rank * 2
    return total + {"fp32": rank * dim * 4, "int8-row": rank * dim + rank * 2, "int4-row": rank * dim // 2 + rank * 2,
                    "int4-col": rank * dim // 2 + dim * 2, "int4-col-log": rank * dim // 2 + dim}[basis]


def quantize_basis(basis: torch.Tensor, mode: str) -> torch.Tensor:
    """Dequantized basis `[P, r, D]` as stored in ``mode``."""
    if mode == "fp32":
        return basis
    if mode in ("int4-row", "int8-row"):
        q, scale = quantize_symmetric(basis, (-1,), 4 if mode == "int4-row" else 8)
        return dequantize(q, scale).double()
    amax = basis.abs().amax(dim=-2, keepdim=True)  # [P, 1, D]: one scale per channel
    if mode == "int4-col":
        q, scale = quantize_symmetric(basis, (-2,), 4)
        return dequantize(q, scale).double()
    # 1-byte code: scale = 2 ** (code / 4), rounded up so that no entry clips
    code = torch.ceil(4 * torch.log2((amax / 7).clamp_min(2.0**-31))).clamp(-127, 127)
    scale = torch.where(amax > 0, 2.0 ** (code / 4), torch.zeros_like(amax))
    return torch.round(basis / scale.clamp_min(1e-30)).clamp(-7, 7) * scale


def variant_scores(steps: DecodeSteps, centroid: str, basis_mode: str, coeffs_mode: str, rotate: bool, rank: int):
    """`[T, G, P]` Eq. 2 scores of one variant (``build_page_summaries`` with the parts stored as given)."""
    keys, q = steps.k_pages[:, :, 0].double(), steps.q  # [P, B, D], [T, G, D]
    if rotate:
        h = hadamard(keys.shape[-1])
        keys, q = keys @ h, q @ h.float()
    mu = keys.mean(1)
    mu = mu.half().double() if centroid == "fp16" else mu
    centered = keys - mu.unsqueeze(1)
    basis = quantize_basis(_page_basis(centered, rank), basis_mode)
    gram = basis @ basis.transpose(-1, -2)
    coeffs = centered @ basis.transpose(-1, -2) @ torch.linalg.pinv(gram, hermitian=True)  # [P, B, r]
    if coeffs_mode == "int8":
        cq, cs = quantize_symmetric(coeffs, (-2,), 8)
        coeffs = dequantize(cq, cs).double()
    q_mu = torch.einsum("tgd,pd->tgp", q, mu.float())
    q_v = torch.einsum("tgd,prd->tgpr", q * steps.scale, basis.float())
    scores = steps.scale * q_mu + torch.einsum("tgpr,pbr->tgpb", q_v, coeffs.float()).logsumexp(-1)
    return mask_incomplete(scores, steps.seq_lens, steps.page_size)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("capture", help="a .pt capture written by bench_fidelity.py into its --cache-dir")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--budget", type=float, default=0.02)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS), metavar="NAME",
                    help=f"default: all of {list(VARIANTS)}")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    variants = {name: VARIANTS[name] for name in args.variants}
    torch.set_num_threads(1)
    data = torch.load(args.capture, weights_only=False)
    cfg = data["meta"]["model_config"]
    groups = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
    positions = query_positions(args.context, args.steps)
    index = {p: i for i, p in enumerate(data["positions"].tolist())}
    take = torch.tensor([index[p] for p in positions])
    per_layer = {name: [] for name in variants}
    for layer in range(cfg["num_hidden_layers"]):
        ratios = {name: [] for name in variants}
        for head in range(cfg["num_key_value_heads"]):
            q = data["q"][layer, head * groups:(head + 1) * groups][:, take].transpose(0, 1)
            steps = DecodeSteps(data["k"][layer, head, :args.context], q, torch.tensor(positions))
            budget = LocksConfig(rank=args.rank, budget=steps.budget(args.budget))
            for name, (centroid, basis, coeffs, rotate) in variants.items():
                scores = variant_scores(steps, centroid, basis, coeffs, rotate, args.rank)
                ratios[name].append(steps.evaluate(scores, budget)["group_ratio"])
        for name in variants:
            per_layer[name].append(torch.cat(ratios[name]))
        print(f"layer {layer:2d}: " + ", ".join(f"{n} {per_layer[n][-1].mean():.4f}" for n in variants), flush=True)
    page, dim = 16, cfg["head_dim"]
    results = []
    for name, (centroid, basis, coeffs, _) in variants.items():
        values = torch.cat(per_layer[name])
        means = [v.mean().item() for v in per_layer[name]]
        results.append({"format": name, "bytes_per_page": variant_bytes(centroid, basis, coeffs, page, args.rank, dim),
                        "median": round(values.median().item(), 4), "mean": round(values.mean().item(), 4),
                        "min_layer_mean": round(min(means), 4), "min_layer": means.index(min(means))})
    print(f"\n{data['meta']['model']} {args.context} tokens, {args.budget:.0%} budget, r={args.rank}: group mass / oracle")
    print("| format | bytes/page | median | mean | min layer (which) |\n|---|---|---|---|---|")
    for r in results:
        print(f"| {r['format']} | {r['bytes_per_page']} | {r['median']:.4f} | {r['mean']:.4f} | "
              f"{r['min_layer_mean']:.4f} ({r['min_layer']}) |")
    if args.out:
        meta = {"model": data["meta"]["model"], "context": args.context, "budget_frac": args.budget, "rank": args.rank}
        words = [("CACHE_DIR/" + Path(w).name) if w == args.capture else w for w in (argv or sys.argv[1:])]
        head = header("studies/fidelity_formats.py", words)
        write_result(args.out, {**head, **meta, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
