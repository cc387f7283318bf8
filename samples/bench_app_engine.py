"""TPOT of the app's own engine (``LocksEngine``, the path ``locks-chat`` runs) at long contexts on a GPU, with
the app's defaults: CUDA graphs, vLLM's share of the GPU for the KV cache (the page summaries' bytes reserved),
statistics counted on the device. Run it beside ``bench_e2e.py`` (same shapes, same dummy weights, same
``--decode`` lengths) to see that the app gets the benchmark's speed.

Configurations, each in its own process, one after the other: ``flash`` (``--dense``: vLLM's own FLASH_ATTN),
``locks`` (statistics on, as the app runs), ``locks-nostats`` (``EngineOptions.stats=False``: the cost of the
statistics) and ``locks-2l`` (``LocksConfig(selection="two-level")`` with ``--candidates``, statistics on). Per
context: prefill (first request, timed), then TPOT as in ``bench_e2e.py``: the cached prompt again, ``n1`` and
``n2`` tokens, ``(t2 - t1) / (n2 - n1)``, ``--reps`` times (median, min, max). Also: eager decode calls of the
attention backend after the start (``locks_bench.probes``; expected 0: every decode step a CUDA-graph replay), the
pages read from the statistics ring, and the bytes of the KV cache and the summaries.

Usage (GPU machine; vLLM 0.26 and this project installed; under 10 minutes)::

    python samples/bench_app_engine.py --shape llama3.1-8b --contexts 131072,262144 --out OUT

Writes ``result-app-<config>.json`` per configuration in ``--out`` (with the command, machine, date, commit) and
prints a table last. Exit status 1 when a configuration fails or decodes eagerly after its start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from locks_bench.e2e import SHAPES, model_config, parse_ints, selection_settings
from locks_bench.engines import run_engine_process
from locks_bench.probes import install_probes, kv_cache_bytes, read_probes
from locks_bench.results import header
from locks_engine.sampling import GREEDY

CONFIGS = ("flash", "locks", "locks-nostats", "locks-2l")


def timed(engine, prompt: list[int], tokens: int) -> tuple[float, list[dict]]:
    """Seconds to generate ``tokens`` tokens after ``prompt`` (EOS ignored), and the statistics records."""
    start, records = time.perf_counter(), []
    for event in engine.stream(prompt, tokens, sampling=GREEDY, ignore_eos=True):
        records += event.stats
    return time.perf_counter() - start, records


def run_config(args: argparse.Namespace) -> dict:
    """One configuration: start the engine, measure every context; returns the result."""
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model sends the probe functions
    import random

    from locks_engine.config import LocksConfig
    from locks_engine.engine import EngineOptions, LocksEngine

    contexts, (n1, n2) = parse_ints(args.contexts), parse_ints(args.decode)
    max_len = max(contexts) + n2 + 64
    model_dir = Path(args.out) / f"model-{args.shape}"
    model_dir.mkdir(parents=True, exist_ok=True)
    cfg = model_config(args.shape, None, max_len)
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    options = EngineOptions(
        model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, max_model_len=max_len,
        locks=LocksConfig(budget=args.budget, dense=args.config == "flash",
                          **selection_settings(args.config, args.candidates, cfg["num_hidden_layers"])),
        stats=args.config != "locks-nostats",
    )
    start = time.perf_counter()
    engine = LocksEngine(options)
    result = {**header("bench_app_engine.py", sys.argv[1:]), "config": args.config, "shape": args.shape,
              "budget": args.budget, **selection_settings(args.config, args.candidates, cfg["num_hidden_layers"]),
              "start_s": round(time.perf_counter() - start, 1), "contexts": []}
    try:
        engine.llm.apply_model(install_probes)
        result["kv_cache_bytes"] = sum(engine.llm.apply_model(kv_cache_bytes))
        rng = random.Random(0)
        for context in contexts:
            prompt = [rng.randrange(10, cfg["vocab_size"]) for _ in range(context)]
            prefill_s, _ = timed(engine, prompt, 1)
            engine.llm.apply_model(read_probes)  # reset: the prefill step's calls are eager by design
            tpots, records = [], []
            for _ in range(args.reps):
                t1, _ = timed(engine, prompt, n1)
                t2, rec = timed(engine, prompt, n2)
                tpots.append((t2 - t1) / (n2 - n1) * 1e3)
                records += rec
            probes = engine.llm.apply_model(read_probes)[0]
            decode = [r for r in records if r["num_decodes"]]
            read, total = sum(r["pages_read"] for r in decode), sum(r["pages_total"] for r in decode)
            result["contexts"].append({
                "context": context, "prefill_s": round(prefill_s, 2), "tpot_ms": round(statistics.median(tpots), 3),
                "tpot_min_ms": round(min(tpots), 3), "tpot_max_ms": round(max(tpots), 3), "reps": args.reps,
                "decode": [n1, n2], "eager_decode_calls": probes["eager_decode_calls"],
                "summary_bytes": probes["summary_bytes"], "stats_records": len(decode),
                "pages_read_fraction": round(read / total, 5) if total else None,
            })
    finally:
        engine.close()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3.1-8b")
    parser.add_argument("--contexts", default="131072,262144", help="context lengths in tokens, comma separated")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--decode", default="16,80", help="n1,n2 tokens (as bench_e2e.py)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--budget", type=int, default=2048, help="LOCKS budget in tokens")
    parser.add_argument("--candidates", default="4", help="locks-2l: c, one value or one per layer, comma separated")
    parser.add_argument("--timeout", type=float, default=400, help="seconds per configuration")
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", help=argparse.SUPPRESS)  # the child process's configuration
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.config:
        result = run_config(args)
        (out / f"result-app-{args.config}.json").write_text(json.dumps(result, indent=1))
        return 0
    failed, rows = False, []
    for config in args.configs.split(","):
        with open(out / "bench-app.log", "a") as log:
            status = run_engine_process([sys.executable, *sys.argv, "--config", config], log, args.timeout)
        path = out / f"result-app-{config}.json"
        if status != 0 or not path.exists():
            print(f"{config}: failed ({status}); see {out / 'bench-app.log'}")
            failed = True
            continue
        result = json.loads(path.read_text())
        for row in result["contexts"]:
            rows.append((config, row, result["kv_cache_bytes"]))
            failed |= config != "flash" and row["eager_decode_calls"] > 0
    flash = {row["context"]: row["tpot_ms"] for config, row, _ in rows if config == "flash"}
    print(f"{'config':14} {'context':>8} {'TPOT ms':>8} {'min-max':>15} {'x flash':>7} {'eager':>5} "
          f"{'KV GiB':>7} {'summ GiB':>8} {'read':>7}")
    for config, row, kv in rows:
        speedup = f"{flash[row['context']] / row['tpot_ms']:.2f}" if row["context"] in flash else "-"
        read = f"{row['pages_read_fraction']:.2%}" if row["pages_read_fraction"] is not None else "-"
        print(f"{config:14} {row['context']:>8} {row['tpot_ms']:>8.3f} {row['tpot_min_ms']:>7.3f}-"
              f"{row['tpot_max_ms']:<7.3f} {speedup:>7} {row['eager_decode_calls']:>5} {kv / 2**30:>7.2f} "
              f"{row['summary_bytes'] / 2**30:>8.2f} {read:>7}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
