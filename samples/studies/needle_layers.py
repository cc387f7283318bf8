"""Which layers read the needle's value, per selection: the flat scan against the two-level selection at each ``c``
(issue 27: the per-layer table keeps the mass but reads the needle less; this finds where). CPU only.

Builds the needle trials of ``samples/bench_needle.py`` (same books, offsets, seeds and depths at ``--context``),
teacher-forces the expected answer (the value and a period) after each prompt, captures the model's post-RoPE
queries at the answer steps and the keys of every token (``locks_bench.capture.capture_ids``, HF float32), and
measures with ``locks_studies.ruler_failure.measure`` the share of the value's pages each selection reads per layer
(mean over KV heads, answer steps and trials: the per-layer carrier retention). Selections: the flat scan, the
two-level selection at each uniform ``c`` of ``--uniform``, and each ``--table`` (c per layer, or ``study``).
Prints the per-layer table and the cheapest ``c`` per layer that keeps the flat scan's retention (within
``--tolerance``), raised to the study table's ``c`` where that is larger: a table that keeps both the mass and the
needle. Writes ``OUT_DIR/needle_layers.json``. From the repository root::

    python samples/studies/needle_layers.py --model MODEL_DIR --books ../shared/data/books/milton_paradise_lost.txt \\
        ../shared/data/books/kjv_bible.txt --context 8192 --depths 0.3 0.7 --capture-dir CACHE --out-dir OUT
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="evaluation model directory (MODEL_DIR)")
    ap.add_argument("--books", nargs="+", required=True, help="haystack books (plain text), as bench_needle.py")
    ap.add_argument("--context", type=int, default=8192, help="prompt tokens")
    ap.add_argument("--depths", type=float, nargs="+", default=[0.3, 0.7])
    ap.add_argument("--budget-frac", type=float, default=0.02, help="budget as a share of the context's pages")
    ap.add_argument("--uniform", default="4,8,16,32", help="c values measured in every layer, comma separated")
    ap.add_argument("--table", action="append", default=[], help="a per-layer table: 'study' or c per layer")
    ap.add_argument("--tolerance", type=float, default=0.0, help="retention a layer may lose against the flat scan")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--capture-dir", help="keep each trial's capture here (.pt) and reuse it when its ids match")
    ap.add_argument("--out-dir", default="samples/results")
    return ap.parse_args(argv)


def check(args) -> None:
    """Raises ValueError (one line) on arguments the run cannot use, before the model loads."""
    from locks_bench.candidates import parse_candidates

    if not Path(args.model).is_dir():
        raise ValueError(f"--model {args.model}: not a directory")
    for book in args.books:
        if not Path(book).is_file():
            raise ValueError(f"--books {book}: not a file")
    if not 0 < args.budget_frac <= 1 or not all(0 <= d <= 1 for d in args.depths) or args.context < 1024:
        raise ValueError("--budget-frac in (0, 1], --depths in [0, 1], --context at least 1024")
    if args.tolerance < 0:
        raise ValueError(f"--tolerance {args.tolerance}: must be at least 0")
    args.uniform_c = [int(c) for c in parse_candidates(args.uniform)]
    if args.uniform.strip().lower() == "study" or min(args.uniform_c) < 1:
        raise ValueError(f"--uniform {args.uniform!r}: allowed comma-separated c >= 1")
    args.tables = {t: parse_candidates(t) for t in args.table}
    try:
        layers = json.loads((Path(args.model) / "config.json").read_text())["num_hidden_layers"]
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"--model {args.model}: no readable config.json with num_hidden_layers ({err})") from None
    for text, table in args.tables.items():
        if len(table) not in (1, layers):
            raise ValueError(f"--table {text!r}: {len(table)} values, the model has {layers} layers "
                             f"(give 1 or {layers})")


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        check(args)
    except ValueError as err:
        print(f"needle_layers: {err}", file=sys.stderr)
        return 2
    import torch
    from transformers import AutoTokenizer

    from locks_bench.candidates import STUDY_CANDIDATES, keep_needle_table
    from locks_bench.capture import capture_ids
    from locks_bench.needle import haystack_trials
    from locks_bench.results import header, read_prose, write_result
    from locks_studies.ruler_failure import measure
    from locks_engine.config import LocksConfig

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    cfg = LocksConfig()
    budget_pages = max(3, round(args.context // cfg.page_size * args.budget_frac))
    base = LocksConfig(budget=budget_pages * cfg.page_size)
    selections = {"flat": base}
    selections.update({f"c={c}": LocksConfig(budget=base.budget, selection="two-level", candidates=(c,))
                       for c in args.uniform_c})
    selections.update({name: LocksConfig(budget=base.budget, selection="two-level", candidates=table)
                       for name, table in args.tables.items()})
    shares: dict[str, list] = {name: [] for name in selections}
    trials = []
    books = {Path(b).stem: tok(read_prose(b)[:2_000_000], add_special_tokens=False)["input_ids"] for b in args.books}
    for trial in haystack_trials(tok, books, args.context, args.depths):
        depth, book = trial["depth"], trial["book"]
        answer = tok(" " + trial["value"] + ".", add_special_tokens=False)["input_ids"]
        full, n_prompt = trial["ids"] + answer, len(trial["ids"])
        positions = list(range(n_prompt - 1, n_prompt + len(answer) - 1))
        cached = Path(args.capture_dir) / f"needle_{args.context}_{book}_{depth}.pt" \
            if args.capture_dir else None
        data = torch.load(cached, weights_only=False) if cached and cached.is_file() else None
        if data is None or data.get("ids") != full:
            data = capture_ids(args.model, full, positions, log)
            data["ids"] = full
            if cached:
                cached.parent.mkdir(parents=True, exist_ok=True)
                torch.save(data, cached)
        first, last = trial["needle"]
        pages = {"value": sorted({t // cfg.page_size for t in range(first, last)})}
        for name, sel in selections.items():
            m = measure(data, len(full) - 1, sel, pages)
            shares[name].append(m["locks_share"][..., 0].mean(dim=(1, 2)))  # [L]
        trials.append({"book": book, "depth": depth, "value": trial["value"], "pages": pages["value"]})
        log(f"{book} depth {depth}: flat {shares['flat'][-1].mean():.3f}, " + ", ".join(
            f"{n} {shares[n][-1].mean():.3f}" for n in selections if n != "flat"))
    per_layer = {name: [round(v, 4) for v in torch.stack(s).mean(0).tolist()] for name, s in shares.items()}
    uniform = {c: per_layer[f"c={c}"] for c in args.uniform_c}
    floor = STUDY_CANDIDATES if len(per_layer["flat"]) == len(STUDY_CANDIDATES) else None
    table = keep_needle_table(per_layer["flat"], uniform, floor, args.tolerance)
    print("layer " + " ".join(f"{name:>7}" for name in per_layer) + "  suggested")
    for layer in range(len(per_layer["flat"])):
        print(f"{layer:5d} " + " ".join(f"{per_layer[n][layer]:7.3f}" for n in per_layer) + f"  {table[layer]:>9}")
    print("mean  " + " ".join(f"{sum(v) / len(v):7.3f}" for v in per_layer.values()))
    print("suggested table: " + ",".join(map(str, table)))
    head = header("studies/needle_layers.py", argv,
                  {"--model": "MODEL_DIR", "--capture-dir": "CACHE", "--out-dir": "OUT"})
    result = {**head, "context": args.context, "budget_pages": budget_pages, "trials": trials,
              "retention_per_layer": per_layer, "suggested": table, "tolerance": args.tolerance}
    path = write_result(Path(args.out_dir) / "needle_layers.json", result)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
