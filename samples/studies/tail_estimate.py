"""Estimate the skipped pages instead of dropping them, and size the budget by mass: the offline study (issue 47).

For each context, one needle trial of ``bench_needle.py`` (the book's haystack, the needle at ``--depth``) with
the value teacher-forced after the prompt is captured once (``locks_studies.tail_capture``: post-RoPE queries at
two runs of ``--steps`` consecutive decode steps, one over the prose before the question and one ending with the
answer; keys and values of every token; cached under ``--cache-dir``). Then, per layer and KV head, every design
of ``locks_studies.tail_estimate`` at budgets of ``--fractions`` of the pages (today's top-k, the exact oracle,
each with and without a tail estimate) and mass-sized budgets at ``--levels`` (floor ``--floor`` and cap ``--cap``
of the pages): relative L2 error of the attention output against dense, mass kept, the needle's pages read at
the steps that write its value, bytes read per step (``locks_studies.tail_study``). Writes
``OUT_DIR/<date>_cpu_<commit>_tail/tail_estimate_<context>.json`` and ``tail_estimate.svg`` (error against bytes,
every context of the folder so far: contexts may be run one at a time). CPU only.
From the repository root::

    nice -n 5 python samples/studies/tail_estimate.py --model MODEL_DIR \\
        --book ../shared/data/books/milton_paradise_lost.txt --cache-dir CACHE_DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def parse_args(argv):
    from locks_bench.results import RESULTS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="evaluation model directory (fetch.sh's MODEL_DIR)")
    ap.add_argument("--book", required=True, help="haystack book (plain text)")
    ap.add_argument("--cache-dir", required=True, help="where captures are kept (outside the repository)")
    ap.add_argument("--out-dir", default=str(RESULTS))
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 16384, 32640], help="prompt tokens")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.02, 0.03, 0.05, 0.07, 0.10],
                    help="fixed budgets, fractions of the context's pages")
    ap.add_argument("--levels", type=float, nargs="+", default=[0.9, 0.95, 0.98, 0.99],
                    help="mass-sized budgets: estimated share of the mass to read")
    ap.add_argument("--floor", type=float, default=0.01, help="mass-sized budget's floor, fraction of the pages")
    ap.add_argument("--cap", type=float, default=0.10, help="mass-sized budget's cap, fraction of the pages")
    ap.add_argument("--tails", nargs="+", default=None,
                    help="tails to measure (locks_studies.tail_estimate.TAILS; default all; 'none' is required)")
    ap.add_argument("--depth", type=float, default=0.5, help="needle depth in the haystack")
    ap.add_argument("--steps", type=int, default=32, help="consecutive decode steps a run")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--redraw", action="store_true",
                    help="measure nothing: redraw --folder's figure from its JSON files")
    ap.add_argument("--folder", help="results folder under --out-dir (default <date>_cpu_<commit>_tail): to add a "
                                     "context to an earlier run's folder; each JSON keeps its own commit")
    args = ap.parse_args(argv)
    if args.redraw and not args.folder:
        ap.error("--redraw needs --folder")
    bad = [f for f in args.fractions + args.levels + [args.floor, args.cap] if not 0 < f <= 1]
    if bad or args.floor > args.cap or not 0 <= args.depth <= 1 or args.steps < 1:
        ap.error("fractions, levels, --floor and --cap must lie in (0, 1], --floor <= --cap, --depth in [0, 1], "
                 "--steps >= 1")
    from locks_studies.tail_estimate import TAILS

    if args.tails and ("none" not in args.tails or set(args.tails) - set(TAILS)):
        ap.error(f"--tails: choose among {', '.join(TAILS)}, none included")
    if not Path(args.model).is_dir() or not Path(args.book).is_file():
        ap.error(f"--model {args.model} must be a directory and --book {args.book} a file")
    return args


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_context(args, context: int, cfg) -> dict:
    """Capture (or reuse) one context's trial and measure every design on it."""
    import torch

    from locks_studies.tail_capture import needle_capture
    from locks_studies.tail_estimate import TAILS
    from locks_studies.tail_study import designs, reduce, study_context

    data = needle_capture(args.cache_dir, args.model, args.book, context, args.depth, args.steps, log)
    trial, runs = data["trial"], data["runs"]
    positions = data["positions"].tolist()
    n_answer = len(trial["answer_ids"])
    seq_len = trial["n_prompt"] + n_answer - 1
    pages = -(-seq_len // cfg.page_size)
    first, last = trial["needle"]
    needle_pages = sorted({t // cfg.page_size for t in range(first, last)})
    in_run = {name: torch.tensor([p in set(r) for p in positions]) for name, r in runs.items()}
    # the steps that write the value's tokens: the answer's first n_answer - 1 (the last writes the full stop)
    needle_steps = torch.tensor([p >= trial["n_prompt"] - 1 and p < trial["n_prompt"] + n_answer - 2
                                 for p in positions])
    floor = max(cfg.always_read_pages, round(args.floor * pages))
    cap = max(floor, round(args.cap * pages))
    start = time.perf_counter()
    grid = designs(args.fractions, args.levels, tuple(args.tails or TAILS))
    measures = study_context(data, seq_len, cfg, grid, floor, cap, needle_pages, in_run["prose"],
                             lambda m: log(f"{context}: {m}"))
    log(f"{context}: {len(measures)} designs in {time.perf_counter() - start:.0f} s")
    return {"tokens": seq_len, "pages": pages, "floor_pages": floor, "cap_pages": cap,
            "needle": {"value": trial["value"], "depth": trial["depth"], "token_span": trial["needle"],
                       "pages": needle_pages, "steps": int(needle_steps.sum())},
            "runs": {name: [r[0], r[-1]] for name, r in runs.items()},
            "capture": {k: data["meta"][k] for k in ("forward_s", "check_max_rel_err", "transformers", "torch")},
            "designs": reduce(measures, needle_steps, in_run)}


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from locks_bench.results import header, run_folder, write_result
    from locks_engine.config import LocksConfig
    from locks_studies.tail_report import figure, table
    from locks_studies.tail_study import study_config

    torch.set_num_threads(args.threads)
    cfg = study_config(LocksConfig())
    results = {}
    for context in [] if args.redraw else args.contexts:
        results[str(context)] = run_context(args, context, cfg)
        print(f"\n{context} tokens\n" + "\n".join(table(results[str(context)]["designs"])))
    head = header("studies/tail_estimate.py", argv, {"--model": "MODEL_DIR", "--cache-dir": "CACHE_DIR",
                                                     "--book": "../shared/data/books/{name}"})
    folder = Path(args.out_dir) / (args.folder or f"{run_folder(head)}_tail")
    common = {**head, "model": Path(args.model).name, "book": Path(args.book).name, "locks": cfg.to_dict(),
              "fractions": args.fractions, "levels": args.levels, "floor": args.floor, "cap": args.cap,
              "steps": args.steps}
    for context, res in results.items():
        path = write_result(folder / f"tail_estimate_{context}.json", {**common, "context": int(context), **res})
        log(f"wrote {path}")
    # the figure: every context measured into this folder so far
    shown = {}
    for path in sorted(folder.glob("tail_estimate_*.json"), key=lambda p: int(p.stem.rsplit("_", 1)[1])):
        res = json.loads(path.read_text())
        shown[str(res["context"])] = res
    (folder / "tail_estimate.svg").write_text(figure(shown, args.fractions, args.levels))
    log(f"wrote {folder / 'tail_estimate.svg'} ({', '.join(shown)} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
