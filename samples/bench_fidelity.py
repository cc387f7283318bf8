"""Selection fidelity on real models and real books: LOCKS vs the exact-LSE oracle, Quest, a shared basis and a
window, at every layer (issue 8, offline part). CPU only.

For each model: one forward pass over the first N tokens of a book (``locks_bench.capture``; cached under
``--cache-dir``, so a re-run skips it), keeping keys and values of every position and the queries of ``--steps``
decode positions spread over the last eighth of each context (a 32K pass serves 8K and 16K too: attention is
causal). Then, per context, layer and KV head, every selector at every budget (a fraction of the context's
16-token pages; sink, last and previous page always read, as in the backend) and rank:

- ``locks`` (the default format, ``colwise8``), ``locks-chanlog`` (the previous default), ``locks-colwise``,
  ``locks-paper`` (the paper's int8/int4 format), ``locks-float`` (unquantized), ``locks-colwise-hadamard``
  (colwise on keys rotated by a fixed Hadamard matrix);
- ``quest`` (fp16 channel min/max), ``shared`` (one rank-r basis per KV head fitted on these very keys, equal
  rank), ``shared-bytes`` (its rank raised to the bytes of ``locks`` at rank r), ``window``.

Measures (``locks_studies.fidelity``): attention mass kept / the oracle's (median, mean, per-layer minimum of the
mean), top-k recall of the oracle's pages, relative error of the attention output vs dense, bytes per page.
Writes ``fidelity.json`` (issue 8's summary format; its ``needle`` list, from ``bench_needle.py``, is kept),
``fidelity_table.md`` and PNG plots to ``--out-dir``, ``fidelity_full.json`` into the run's folder under it. The ``oracle`` rows are the
reference itself (ratio 1): their absolute mass and output error are the floor of what any selector can reach.

Run from the repository root, in a venv with torch, transformers, numpy, matplotlib and this package::

    python samples/bench_fidelity.py --eval-model MODEL_DIR --builtin-model BUILTIN_DIR \\
        --book ../shared/data/books/milton_paradise_lost.txt --cache-dir CACHE_DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from locks_bench.capture import load_or_capture, query_positions
from locks_bench.fidelity_report import summarize, write_plots, write_table
from locks_bench.results import header as result_header
from locks_bench.results import run_folder, write_result
from locks_engine import LocksConfig
from locks_studies.fidelity import DecodeSteps, hadamard
from locks_engine.ops import build_quest_summaries, build_shared_basis_summaries, summary_bytes


def selector_grid(ranks: list[int], dim: int) -> list[dict]:
    """(name, selector, format, rank) of every selector measured; rank 0 for rank-free selectors."""
    grid, default = [], LocksConfig().summary_format
    for rank in ranks:
        grid.append({"name": "locks", "selector": "locks", "format": default, "rank": rank})
        for fmt in [f for f in ("colwise8", "chanlog", "colwise", "paper", "float") if f != default]:
            grid.append({"name": f"locks-{fmt}", "selector": "locks", "format": fmt, "rank": rank})
        if hadamard(dim) is not None:
            grid.append({"name": "locks-colwise-hadamard", "selector": "locks", "format": "colwise", "rank": rank})
        grid.append({"name": "shared", "selector": "shared", "format": "colwise", "rank": rank})
        grid.append({"name": "shared-bytes", "selector": "shared-bytes", "format": default, "rank": rank})
    grid.append({"name": "oracle", "selector": "oracle", "format": "colwise", "rank": 0})
    grid.append({"name": "quest", "selector": "quest", "format": "colwise", "rank": 0})
    grid.append({"name": "window", "selector": "window", "format": "colwise", "rank": 0})
    return grid


def bytes_per_page(steps: DecodeSteps, entry: dict, page_size: int) -> tuple[int, int]:
    """(summary bytes per page and KV head, the rank actually used), measured from allocated tensors; the
    shared basis (fp16) is amortized over the context's pages."""
    dim, pages = steps.keys.shape[1], steps.pages
    if entry["selector"] == "locks":
        return summary_bytes(page_size, entry["rank"], dim, entry["format"])[0], entry["rank"]
    if entry["selector"] == "quest":
        return build_quest_summaries(steps.k_pages[:1]).nbytes, 0
    if entry["selector"] == "window":
        return 0, 0
    if entry["selector"] == "oracle":  # it scores a page by reading all its keys (bf16)
        return page_size * dim * 2, 0
    cfg = LocksConfig(rank=entry["rank"], summary_format=entry["format"])
    rank = entry["rank"] if entry["selector"] == "shared" else steps.shared_rank_at_equal_bytes(cfg)
    page = build_shared_basis_summaries(steps.k_pages[:1], torch.zeros(1, rank, dim)).nbytes
    return round(page + rank * dim * 2 / pages), rank


def measure_head(steps: DecodeSteps, grid: list[dict], fractions: list[float], page_size: int) -> list[dict]:
    """Every selector at every budget on one layer and KV head: per-step arrays as lists."""
    rows = []
    for entry in grid:
        cfg = LocksConfig(rank=max(entry["rank"], 1), summary_format=entry["format"], budget=3 * page_size)
        rotation = hadamard(steps.keys.shape[1]) if entry["name"].endswith("hadamard") else None
        scores = steps.scores(entry["selector"], cfg, rotation)
        nbytes, used_rank = bytes_per_page(steps, entry, page_size)
        for fraction in fractions:
            cfg = LocksConfig(rank=max(entry["rank"], 1), summary_format=entry["format"],
                              budget=steps.budget(fraction))
            result = steps.evaluate(scores, cfg)
            rows.append({"selector": entry["name"], "rank": entry["rank"], "used_rank": used_rank,
                         "budget_frac": fraction, "budget_pages": cfg.budget_pages, "bytes_per_page": nbytes,
                         **{k: v.float() for k, v in result.items()}})
    return rows


def run_model(args, model_dir: str, name: str, contexts: list[int], log) -> list[dict]:
    """Capture once (cached), then measure every context, layer and KV head. Returns per-head rows."""
    positions = {c: query_positions(c, args.steps) for c in contexts}
    union = sorted({p for ps in positions.values() for p in ps})
    data = load_or_capture(args.cache_dir, model_dir, args.book, max(contexts), union, log)
    meta = data["meta"]
    cfg = meta["model_config"]
    groups = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
    grid = selector_grid(args.ranks, cfg["head_dim"])
    index = {p: i for i, p in enumerate(data["positions"].tolist())}
    layers = args.layers if args.layers else range(cfg["num_hidden_layers"])
    rows = []
    for context in contexts:
        start = time.perf_counter()
        take = torch.tensor([index[p] for p in positions[context]])
        for layer in layers:
            for head in range(cfg["num_key_value_heads"]):
                q = data["q"][layer, head * groups:(head + 1) * groups][:, take].transpose(0, 1)  # [T, G, D]
                steps = DecodeSteps(data["k"][layer, head, :context], q, torch.tensor(positions[context]),
                                    values=data["v"][layer, head, :context], page_size=args.page_size)
                for row in measure_head(steps, grid, args.budgets, args.page_size):
                    rows.append({"model": name, "context": context, "layer": layer, "kv_head": head, **row})
        log(f"{name} {context}: {len(layers)} layers measured in {time.perf_counter() - start:.0f} s")
    return rows, meta


#: Options whose values are machine paths: recorded as placeholders (no machine path goes into the results).
PLACEHOLDERS = {"--eval-model": "MODEL_DIR", "--builtin-model": "BUILTIN_DIR", "--cache-dir": "CACHE_DIR",
                "--book": "../shared/data/books/{name}"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--eval-model", required=True, help="evaluation model directory (MODEL_DIR from fetch.sh)")
    ap.add_argument("--eval-name", default="Qwen2.5-Coder-0.5B-Instruct")
    ap.add_argument("--builtin-model", help="built-in model's converted directory (resolve_model(None))")
    ap.add_argument("--builtin-name", default="SmolLM2-135M-Instruct")
    ap.add_argument("--book", required=True, help="plain-text book, e.g. ../shared/data/books/milton_paradise_lost.txt")
    ap.add_argument("--cache-dir", required=True, help="where captures are kept (outside the repository)")
    ap.add_argument("--out-dir", default="samples/results")
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 16384, 32768])
    ap.add_argument("--builtin-contexts", type=int, nargs="+", default=[8192])
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.01, 0.02, 0.05, 0.10])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--steps", type=int, default=64, help="decode positions per context")
    ap.add_argument("--layers", type=int, nargs="*", help="default: every layer")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--replot", action="store_true", help="only redraw the plots from the latest OUT_DIR/*/fidelity_full.json")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replot:
        latest = sorted(Path(args.out_dir).glob("*/fidelity_full.json"))[-1]
        write_plots(json.loads(latest.read_text()), Path(args.out_dir))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    start = time.perf_counter()
    models = [(args.eval_model, args.eval_name, args.contexts)]
    if args.builtin_model:
        models.append((args.builtin_model, args.builtin_name, args.builtin_contexts))
    rows, metas = [], {}
    for model_dir, name, contexts in models:
        model_rows, metas[name] = run_model(args, model_dir, name, contexts, log)
        rows += model_rows
    header = {**result_header("bench_fidelity.py", argv, PLACEHOLDERS), "torch_threads": torch.get_num_threads(),
              "runtime_s": round(time.perf_counter() - start)}
    summary, full = summarize(rows, header, metas, vars(args))
    previous = out_dir / "fidelity.json"
    if previous.is_file():  # keep the end-to-end results of bench_needle.py
        old = json.loads(previous.read_text())
        summary["needle"] = old.get("needle", [])
        for key in ("needle_command", "needle_provenance"):
            if key in old:
                summary[key] = old[key]
    previous.write_text(json.dumps(summary, indent=1) + "\n")
    (out_dir / "fidelity_table.md").write_text(write_table(summary, ranks=(0, 2, 4, 8)) + "\n")
    write_result(out_dir / run_folder(header) / "fidelity_full.json", full)
    write_plots(full, out_dir)
    print(write_table(summary))
    log(f"wrote {out_dir}/fidelity.json, fidelity_full.json and plots in {header['runtime_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
