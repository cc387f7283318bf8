"""What page selection costs per decode step, and what cheaper selections keep (issue 27, part 1). CPU only.

One forward pass over the first tokens of a book per capture length (``locks_bench.capture``, cached under
``--cache-dir``; a 16K pass serves 8K too, attention being causal) keeps keys, values and the queries of
``--runs`` runs of ``--steps`` consecutive decode positions per context. Then every candidate of
``locks_studies.selection_study`` (flat scan, two levels, reuse over steps and layers, leaner summaries, fused
scoring) at every context, budget, layer and KV head, against the exact-LSE oracle. Anchor layers and the head
each layer reads are chosen from the top-K overlap measured at the first context (so that context is in-sample).

Bytes per decode step, one layer and KV head, as a fraction of dense K+V (``locks_studies.selection_cost``)::

    bytes = (a / k) * (n_scored * s + n_coarse * c) + n_read * p        dense = n_pages * p

Writes ``selection_cost.json``, ``selection_cost.png`` and ``MANIFEST.md`` into the run folder
``--out-dir/<date>_cpu_<commit>/``.

    python samples/studies/study_selection_cost.py --model MODEL_DIR \\
        --book ../shared/data/books/milton_paradise_lost.txt --cache-dir CACHE_DIR --contexts 8192 16384
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from locks_studies import selection_report as report
from locks_studies import selection_study as study
from locks_studies.selection_policy import layer_adaptive
from locks_bench.capture import CAPTURE_PLACEHOLDERS, add_capture_arguments, captured_runs
from locks_bench.results import command_text, header, log, run_folder, write_result
from locks_studies.selection_cost import choose_anchors

#: long-context shapes the bytes are projected to (budget 2048, D = 128; issue 27's targets)
SHAPES = {"128K": 131072, "256K": 262144, "1M": 1048576}
PLACEHOLDERS = CAPTURE_PLACEHOLDERS


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_capture_arguments(ap, contexts=[8192, 16384], budgets=[0.01, 0.02, 0.05])
    ap.add_argument("--layers", type=int, nargs="*", help="default: every layer")
    ap.add_argument("--plot-budget", type=float, default=0.02)
    return ap.parse_args(argv)


def manifest(head: dict, rows: list[dict], overlaps: dict, spread: dict, proj: dict, args) -> str:
    m = head["machine"]
    lines = [f"# {run_folder(head)}", "", "Selection cost against fidelity, issue 27 part 1 (offline, CPU).", "",
             "Command:", "", f"    {command_text(head['command'])}", "",
             f"Machine: {m['cpus']}-core {m['cpu']} ({m['cpu_class']}), shared with other jobs (one benchmark on "
             f"one core); torch threads: {head['torch_threads']}; {head['runtime_s']} s. Date {head['date']}, "
             f"commit {head['commit']}.", "",
             f"Model Qwen2.5-Coder-0.5B-Instruct (24 layers, 14 query / 2 KV heads, D = 64), float32 capture; "
             f"contexts {', '.join(str(c) for c in args.contexts)} tokens of {Path(args.book).name}; per context "
             f"{args.runs} runs of {args.steps} consecutive decode steps, each measured at its last "
             f"{args.steps - study.LAGS} steps (every rescoring lag on the same steps); all layers and KV heads. "
             "Mass kept: true softmax mass on the pages read, the KV group's mean over its 7 query heads, over the "
             "exact-LSE oracle's at the same budget (as `bench_fidelity.py`), per layer, KV head, step and lag: "
             "median, mean, and the lowest per-layer mean. Bytes per step, one layer "
             "and KV head, % of dense bf16 K+V: `(a/k)(n_scored s + n_coarse c) + n_read p` "
             "(`locks_bench/selection_cost.py`); D = 128 applies the same page counts to D = 128 summaries. "
             "Anchor layers and head mapping chosen at the first context's overlap (in-sample there).", "",
             "Files: `selection_cost.json` (rows, per-layer means, layer overlap matrices), `selection_cost.png` "
             f"(context {max(args.contexts)}, budget {args.plot_budget:.0%}).", ""]
    for context, by_budget in overlaps.items():
        o = by_budget.get(str(args.plot_budget)) or next(iter(by_budget.values()))
        lines.append(f"Top-K overlap between layers at {context} ({args.plot_budget:.0%}): next layer mean "
                     f"{o['next_layer_mean']} (min {o['next_layer_min']}, max {o['next_layer_max']}), any pair "
                     f"{o['any_pair_mean']}; anchors {o['anchors']}.")
    for context, by_budget in spread.items():
        per_layer = by_budget.get(str(args.plot_budget)) or next(iter(by_budget.values()))
        lines.append(f"Superpages (16 pages) spanned by the oracle's chosen pages, per chosen page, at {context} "
                     f"({args.plot_budget:.0%}), by layer: {', '.join(f'{v:.2f}' for v in per_layer)}.")
    lines += ["", f"Bytes per step projected to long contexts (% of dense K+V, D = 128, budget 2048 tokens, scores "
              f"fused; per-layer choices as measured at {max(args.contexts)} and {args.plot_budget:.0%}; the mass "
              "kept there is not measured):", "", "| candidate | " + " | ".join(SHAPES) + " |",
              "|---|" + "---|" * len(SHAPES)]
    lines += [f"| {name} | " + " | ".join(f"{v[s]:.2f}" for s in SHAPES) + " |" for name, v in proj.items()]
    lines.append("")
    for context in args.contexts:
        for budget in args.budgets:
            lines.append(report.table(rows, context, budget))
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    head = header("studies/study_selection_cost.py", argv, PLACEHOLDERS)
    folder = Path(args.out_dir) / run_folder(head)
    rows, overlaps, spread, calib = [], {}, {}, None
    for context, data, positions in captured_runs(args, log):
        recs, ctx = study.study_context(data, context, positions, args, log)
        study.layer_reuse(recs, ctx, calib or {"overlap": ctx["overlap"]}, args)
        context_rows = study.summarize(recs, ctx, context)
        calib = calib or {"overlap": ctx["overlap"], "rows": context_rows}
        rows += context_rows + study.summarize(layer_adaptive(recs, calib["rows"]), ctx, context)
        overlaps[context] = {str(f): report.overlap_summary(
            ov, {n: choose_anchors(calib["overlap"][f][0], min(n, len(ov))) for n in (12, 8, 6, 4)})
            for f, (ov, _) in ctx["overlap"].items()}
        spread[context] = {str(f): v for f, v in ctx["spread"].items()}
        del recs, ctx
        head["runtime_s"], head["torch_threads"] = round(time.perf_counter() - start), torch.get_num_threads()
        kept = {k: v for k, v in vars(args).items() if k not in ("model", "cache_dir", "out_dir")}
        out = {**head, "settings": kept,
               "rows": rows, "layer_overlap": overlaps, "oracle_superpage_spread": spread}
        out["settings"]["book"] = Path(args.book).name
        write_result(folder / "selection_cost.json", out)
        log(f"{context}: written {folder / 'selection_cost.json'}")
    plot_ctx = max(c for c in args.contexts if any(r["context"] == c for r in rows))
    proj = report.projections(rows, plot_ctx, args.plot_budget, SHAPES)
    write_result(folder / "selection_cost.json", {**out, "projected_bytes_pct": proj})
    report.plot(rows, plot_ctx, args.plot_budget, folder / "selection_cost.png")
    (folder / "MANIFEST.md").write_text(manifest(head, rows, overlaps, spread, proj, args))
    print(report.table(rows, plot_ctx, args.plot_budget))
    log(f"done in {head['runtime_s']} s: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
