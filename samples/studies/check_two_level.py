"""The two-level selection as shipped, on real decode steps: the attention mass it keeps against the exact-LSE oracle,
beside the flat scan's (issue 27's fidelity gate on the CPU harness). CPU only.

The decode steps are the selection study's (``study_selection_cost.py``, the same cached captures: ``--runs`` runs of
``--steps`` consecutive positions a context, each measured at its last steps). Per layer and KV head, the keys are
laid out as a paged cache (one page a block), summarized by ``ops.build_cache_summaries`` and
``ops.superpages.write_superpage_centroids``, and every measured step selects with
``ops.superpages.select_two_level`` at the layer's ``c`` (``--candidates``: one per layer, 0 = flat; the default is
the study's table for this model, calibrated at 8K and 2%: ``locks_studies.selection_policy``). Mass kept = the KV group's mean true softmax mass on the
pages read over the oracle's at the same budget, as ``bench_fidelity.py`` reports it. Writes ``two_level.json`` and
``MANIFEST.md`` into ``--out-dir/<date>_cpu_<commit>/``.

    python samples/studies/check_two_level.py --model MODEL_DIR --book ../shared/data/books/milton_paradise_lost.txt \\
        --cache-dir CACHE_DIR --contexts 16384 32768
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from locks_bench.capture import CAPTURE_PLACEHOLDERS, add_capture_arguments, captured_runs
from locks_bench.results import command_text, header, log, run_folder, write_result
from locks_studies.selection_cost import paged_summaries, shipped_two_level_mask
from locks_bench.candidates import STUDY_CANDIDATES
from locks_studies.selection_study import measured_steps
from locks_engine.config import LocksConfig
from locks_studies.fidelity import DecodeSteps



def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_capture_arguments(ap, contexts=[16384, 32768], budgets=[0.01, 0.02, 0.05])
    ap.add_argument("--candidates", type=int, nargs="+", default=list(STUDY_CANDIDATES), help="c per layer (0 = flat)")
    return ap.parse_args(argv)


def check_context(data: dict, context: int, positions: list[int], args, log) -> list[dict]:
    meta = data["meta"]["model_config"]
    layers, heads = meta["num_hidden_layers"], meta["num_key_value_heads"]
    if len(args.candidates) != layers:
        raise SystemExit(f"--candidates has {len(args.candidates)} values: give one per layer ({layers})")
    groups = meta["num_attention_heads"] // heads
    index = {p: i for i, p in enumerate(data["positions"].tolist())}
    take = torch.tensor([index[p] for p in positions])
    rows = []
    for layer in range(layers):
        c = args.candidates[layer]
        for head in range(heads):
            q = data["q"][layer, head * groups:(head + 1) * groups][:, take].transpose(0, 1)  # [T, G, D]
            steps = DecodeSteps(data["k"][layer, head, :context], q, torch.tensor(positions))
            at = measured_steps(steps.positions)
            cache = paged_summaries(steps) if c else None
            flat_scores = steps.scores("locks", LocksConfig(budget=48))
            for frac in args.budgets:
                cfg = LocksConfig(budget=steps.budget(frac))
                oracle = steps.mass_kept(steps.oracle_mask(cfg)[at], at).mean(-1)  # [E]

                def ratio(mask):
                    kept = steps.mass_kept(mask, at).mean(-1)
                    return torch.where(oracle > 0, kept / oracle.clamp_min(1e-30), torch.ones_like(kept))
                flat = ratio(steps.selected_mask(flat_scores, cfg)[at])
                complete = (steps.seq_lens[at] // steps.page_size).tolist()
                if c:
                    mask, scanned = shipped_two_level_mask(steps, at, cfg, c, cache)
                    two = ratio(mask)
                else:
                    two, scanned = flat, complete
                rows.append({"context": context, "budget_frac": frac, "layer": layer, "head": head, "c": c,
                             "flat": [round(v, 5) for v in flat.tolist()],
                             "two_level": [round(v, 5) for v in two.tolist()],
                             "scanned_pages": statistics.mean(scanned), "complete_pages": statistics.mean(complete)})
        log(f"{context}: layer {layer} (c = {c}) done")
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for context in sorted({r["context"] for r in rows}):
        for frac in sorted({r["budget_frac"] for r in rows}):
            sel = [r for r in rows if r["context"] == context and r["budget_frac"] == frac]
            entry = {"context": context, "budget_frac": frac}
            for key in ("flat", "two_level"):
                values = [v for r in sel for v in r[key]]
                layers = sorted({r["layer"] for r in sel})
                means = [statistics.mean(v for r in sel if r["layer"] == l for v in r[key]) for l in layers]
                worst = min(range(len(means)), key=means.__getitem__)
                entry[key] = {"median": round(statistics.median(values), 4), "mean": round(statistics.mean(values), 4),
                              "worst_layer_mean": round(means[worst], 4), "worst_layer": layers[worst],
                              "layer_means": [round(m, 4) for m in means]}
            entry["scanned_over_flat"] = round(sum(r["scanned_pages"] for r in sel)
                                               / sum(r["complete_pages"] for r in sel), 4)
            out.append(entry)
    return out


def manifest(head: dict, summary: list[dict], args) -> str:
    m = head["machine"]
    lines = [f"# {run_folder(head)}", "", "The two-level selection as shipped (`ops.superpages.select_two_level`) on "
             "real decode steps, against the flat scan (issue 27's fidelity gate on the CPU harness).", "",
             "Command:", "", f"    {command_text(head['command'])}", "",
             f"Machine: {m['cpus']}-core {m['cpu']} ({m['cpu_class']}); torch threads: {head['torch_threads']}; "
             f"{head['runtime_s']} s. Date {head['date']}, commit {head['commit']}.", "",
             f"Qwen2.5-Coder-0.5B-Instruct (24 layers, 2 KV heads, D = 64), {Path(args.book).name}, the selection "
             f"study's captures: {args.runs} runs of {args.steps} consecutive decode steps a context, measured at "
             "their last steps, every layer and KV head. c per layer: "
             f"{', '.join(str(c) for c in args.candidates)} (0 = flat). Mass kept: the KV group's mean over the "
             "exact-LSE oracle's at the same budget (median, mean, lowest per-layer mean). Scanned: page summaries "
             "scored over the flat scan's (every complete page), superpage centroids not counted.", "",
             "| context | budget | flat: median / mean / worst layer | two-level: median / mean / worst layer "
             "| summaries scanned / flat |", "|---|---|---|---|---|"]
    for e in summary:
        f, t = e["flat"], e["two_level"]
        lines.append(f"| {e['context']} | {e['budget_frac']:.0%} | {f['median']} / {f['mean']} / "
                     f"{f['worst_layer_mean']} ({f['worst_layer']}) | {t['median']} / {t['mean']} / "
                     f"{t['worst_layer_mean']} ({t['worst_layer']}) | {e['scanned_over_flat']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    head = header("studies/check_two_level.py", argv, CAPTURE_PLACEHOLDERS)
    rows = []
    for context, data, positions in captured_runs(args, log):
        rows += check_context(data, context, positions, args, log)
    summary = summarize(rows)
    head["runtime_s"], head["torch_threads"] = round(time.perf_counter() - start), torch.get_num_threads()
    folder = Path(args.out_dir) / run_folder(head)
    folder.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("model", "cache_dir", "out_dir", "book")}
    # per layer, KV head and budget: the mean over the measured steps (the summary holds the per-step statistics)
    per_head = [{**{k: v for k, v in r.items() if k not in ("flat", "two_level")},
                 "flat_mean": round(statistics.mean(r["flat"]), 4),
                 "two_level_mean": round(statistics.mean(r["two_level"]), 4)} for r in rows]
    write_result(folder / "two_level.json", {**head, "book": Path(args.book).name, "settings": settings,
                                            "summary": summary, "rows": per_head})
    (folder / "MANIFEST.md").write_text(manifest(head, summary, args))
    print((folder / "MANIFEST.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
