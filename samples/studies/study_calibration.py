"""Per-layer ``c`` of the two-level selection without a hand-made table (issue 48, item 1). CPU only.

One forward pass over the first ``--tokens`` tokens of a book (``locks_bench.capture``, cached under
``--cache-dir``) keeps keys of every position and, for each context of ``--contexts``, the queries of ``--runs``
runs of ``--steps`` consecutive decode positions and of the ``--prompt`` positions before each run (the last
queries of the prefill that run continues). Per run, layer and KV head (``locks_studies.calibration``): the recall
of the flat scan's estimated mass by the two-level candidates at each ``c`` of ``--choices`` (default the engine's
4, 8, 16, 32), on the prompt's queries and on the decode steps, and the decode steps' true mass over the exact-LSE
oracle's. Then the tables a rule finds (``locks_engine.ops.calibration.pick_candidates`` at each
``--thresholds``, from the prompt's last ``--queries``, among the choices up to each ``--rule-caps``): (a) from
each run's own prompt (each head's mean recall over the queries), (b) once, from the first context's first run,
(c) each run's own prompt by the engine's rule (each head's least recall over the queries), ``--margins`` steps of
``c`` above its pick; against the flat scan, uniform ``c`` and ``--reference`` (a named table of
``locks_bench.candidates``).

Writes ``calibration_<model>.json`` into ``--out-dir/<date>_cpu_<commit>_calibration/``.

    python samples/studies/study_calibration.py --model MODEL_DIR \\
        --book ../shared/data/books/milton_paradise_lost.txt --cache-dir CACHE_DIR --tokens 16384 \\
        --contexts 16384 8192 --budgets 0.02 0.05 --budget-tokens 2048 --reference keep-needle
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from locks_bench.candidates import NAMED
from locks_bench.capture import CAPTURE_PLACEHOLDERS, load_or_capture
from locks_bench.results import RESULTS, header, log, run_folder, write_result
from locks_engine.config import LocksConfig
from locks_engine.ops.calibration import CALIBRATION_CHOICES, CALIBRATION_MARGIN
from locks_studies import calibration as cal
from locks_studies.fidelity import DecodeSteps


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--book", required=True)
    ap.add_argument("--cache-dir", required=True, help="where captures are kept (outside the repository)")
    ap.add_argument("--out-dir", default=str(RESULTS))
    ap.add_argument("--tokens", type=int, required=True, help="capture length (the longest context)")
    ap.add_argument("--contexts", type=int, nargs="+", required=True)
    ap.add_argument("--capture-contexts", type=int, nargs="*", help="contexts the capture's positions serve "
                    "(default: --contexts; give the same list to reuse one capture)")
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.02], help="fractions of the context's pages")
    ap.add_argument("--budget-tokens", type=int, nargs="*", default=[2048])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--queries", type=int, nargs="+", default=[16, 64], help="prompt queries the rule reads")
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.95, 0.97, 0.98, 0.99, 0.995])
    ap.add_argument("--reference", choices=sorted(NAMED), help="a named table to compare with")
    ap.add_argument("--choices", type=int, nargs="+", default=list(CALIBRATION_CHOICES),
                    help="the c measured (ascending); default the engine's")
    ap.add_argument("--rule-caps", type=int, nargs="*", help="the largest c the rule may take, one set of rule "
                    "rows each, among --choices up to it (default: the largest choice)")
    ap.add_argument("--layers", type=int, nargs="*", help="default: every layer")
    ap.add_argument("--margins", type=int, nargs="*", default=[0, CALIBRATION_MARGIN],
                    help="steps of c above the pick of rule (c), the engine's (the least query's recall)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if args.choices != sorted(set(args.choices)) or min(args.choices) < 1:
        ap.error("--choices: distinct positive ints, ascending")
    args.rule_caps = args.rule_caps or [args.choices[-1]]
    if not set(args.rule_caps) <= set(args.choices):
        ap.error("--rule-caps: each one of --choices")
    return args


def budget_configs(context: int, args) -> dict[str, LocksConfig]:
    """The budgets of one context by label (``2%``, ``2048``)."""
    pages = context // 16
    out = {f"{f:.0%}": LocksConfig(budget=max(3, round(pages * f)) * 16) for f in args.budgets}
    out.update({str(t): LocksConfig(budget=t) for t in args.budget_tokens if t < context})
    return out


def measure(data: dict, args) -> tuple[dict, int, int]:
    """``recs[(context, run, label)][(layer, head)]``: ``calibration.measure_head`` of every run, layer, head."""
    meta = data["meta"]["model_config"]
    heads, groups = meta["num_key_value_heads"], meta["num_attention_heads"] // meta["num_key_value_heads"]
    layers = args.layers or list(range(meta["num_hidden_layers"]))
    index = {p: i for i, p in enumerate(data["positions"].tolist())}
    recs, start = {}, time.perf_counter()
    for layer in layers:
        for head in range(heads):
            cache = cal.head_cache(data["k"][layer, head, : max(args.contexts)])
            for context in args.contexts:
                budgets = budget_configs(context, args)
                for run, (prompt, decode) in enumerate(cal.calibration_runs(context, args.steps, args.runs,
                                                                            args.prompt)):
                    take = torch.tensor([index[p] for p in prompt + decode])
                    q = data["q"][layer, head * groups:(head + 1) * groups][:, take].transpose(0, 1)  # [T, G, D]
                    steps = DecodeSteps(data["k"][layer, head, :context], q, torch.tensor(prompt + decode))
                    out = cal.measure_head(steps, len(prompt), list(budgets.values()), tuple(args.queries), cache,
                                           tuple(args.choices))
                    for label, cfg in budgets.items():
                        recs.setdefault((context, run, label), {})[layers.index(layer), head] = out[cfg.budget]
        log(f"layer {layer} done ({time.perf_counter() - start:.0f} s)")
    return recs, len(layers), heads


def summarize(recs: dict, layers: int, heads: int, args) -> list[dict]:
    """Rows: per (context, run, budget), the flat scan, uniform ``c``, the reference table, and each rule."""
    rows = []
    first, measured = min(args.contexts), tuple(args.choices)
    for (context, run, label), per in sorted(recs.items()):
        def row(name, table, **extra):
            rows.append({"context": context, "run": run, "budget": label, "policy": name, **extra,
                         **cal.evaluate_table(per, table, layers, heads, measured)})
        row("flat", [0] * layers)
        for c in measured:
            row(f"uniform c={c}", [c] * layers)
        if args.reference:
            row(f"table {args.reference}", list(NAMED[args.reference])[:layers])
        calib = recs.get((first, 0, label)) or recs[(first, 0, next(iter(budget_configs(first, args))))]
        for cap in args.rule_caps:
            choices = tuple(c for c in measured if c <= cap)
            tail = "" if cap == measured[-1] else f", c<={cap}"
            for q in args.queries:
                for tau in args.thresholds:
                    rule = dict(queries=q, threshold=tau, choices=list(choices))
                    row(f"(a) prompt, {q} queries, {tau}{tail}",
                        cal.rule_table(per, layers, heads, q, tau, choices, measured), **rule)
                    row(f"(b) once at {first}, {q} queries, {tau}{tail}",
                        cal.rule_table(calib, layers, heads, q, tau, choices, measured), **rule)
                    for m in args.margins:  # the engine's rule: the least query's recall, m steps of c above
                        row(f"(c) prompt, least of {q} queries, {tau}, +{m}{tail}",
                            cal.rule_table(per, layers, heads, q, tau, choices, measured, least=True, margin=m),
                            **rule, least=True, margin=m)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    head = header("studies/study_calibration.py", argv, CAPTURE_PLACEHOLDERS)
    positions = cal.capture_positions(args.capture_contexts or args.contexts, args.steps, args.runs, args.prompt)
    data = load_or_capture(args.cache_dir, args.model, args.book, args.tokens, positions, log)
    recs, layers, heads = measure(data, args)
    rows = summarize(recs, layers, heads, args)
    head["runtime_s"], head["torch_threads"] = round(time.perf_counter() - start), torch.get_num_threads()
    settings = {k: v for k, v in vars(args).items() if k not in ("model", "cache_dir", "out_dir")}
    settings["book"] = Path(args.book).name
    per_head = {f"{c}/{r}/{b}": {f"{layer}/{h}": v for (layer, h), v in per.items()}
                for (c, r, b), per in recs.items()}
    name = Path(args.model).name.split("-")[0].lower()
    path = Path(args.out_dir) / f"{run_folder(head)}_calibration" / f"calibration_{name}.json"
    write_result(path, {**head, "model": data["meta"], "settings": settings, "rows": rows, "per_head": per_head})
    log(f"done in {head['runtime_s']} s: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
