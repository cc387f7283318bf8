"""The needle-in-a-haystack trials that ``samples/bench_needle.py`` and ``samples/needle_multiturn.py`` share, and
the bookkeeping of their results: RULER-style single needle ("One of the special magic numbers for KEY is:
VALUE."), its carrier pages, and the ``needle`` cells of ``fidelity.json`` recomputed from every run's trials.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from locks_bench.results import run_folder, write_result
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


def haystack_trials(tokenizer, books: dict[str, list[int]], context: int, depths: list[float]) -> list[dict]:
    """The needle trials of one context, as ``samples/bench_needle.py`` runs them: one haystack per book (book ``i``
    from token ``Random(context + i).randrange(len - context)``), its needles deepest first (so that vLLM's prefix
    cache serves each later trial the haystack before its needle), seeded ``1000 context + 100 i + j``
    (:func:`build_trial`; each trial also names its ``book``)."""
    trials = []
    for i, (name, ids) in enumerate(books.items()):
        offset = random.Random(context + i).randrange(0, len(ids) - context)
        for j, depth in enumerate(sorted(depths, reverse=True)):
            trial = build_trial(tokenizer, ids, context, depth, seed=1000 * context + 100 * i + j, start=offset)
            trials.append({**trial, "book": name})
    return trials


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


#: The modes of the README's needle row, whose run ``needle_provenance`` names (``benchmarks_doc.fidelity_rows``).
HEADLINE_MODES = ("locks", "dense")


def merge_results(out_dir: Path, header: dict, summary: list[dict], rows: list[dict]) -> None:
    """Add this run's cells to ``needle_full.json`` in the run's folder under ``out_dir`` (one entry per run) and
    to ``out_dir/fidelity.json``'s ``needle`` list (replacing cells of the same model, context, mode and budget);
    ``needle_command`` lists every command (argv lists) that wrote cells; ``needle_provenance`` (per context: machine,
    commit, date, command) follows the runs that wrote :data:`HEADLINE_MODES` cells only."""
    full_path = out_dir / run_folder(header) / "needle_full.json"
    runs = json.loads(full_path.read_text())["runs"] if full_path.is_file() else []
    runs.append({**header, "summary": summary, "trials": rows})
    write_result(full_path, {"runs": runs})
    fidelity = out_dir / "fidelity.json"
    doc = json.loads(fidelity.read_text()) if fidelity.is_file() else {"date": header["date"], "mass": []}
    cell = lambda e: (e["model"], e["context"], e["mode"], e["budget_frac"])
    fresh = {cell(e) for e in summary}
    doc["needle"] = [e for e in doc.get("needle", []) if cell(e) not in fresh] + summary
    commands = doc.get("needle_command", [])
    doc["needle_command"] = commands + [header["command"]] * (header["command"] not in commands)
    # the provenance of a context is that of its headline cells (the README's row: flat LOCKS and dense); a run of
    # other modes only (the two-level selection) adds its cells and leaves it
    for context in {e["context"] for e in summary if e["mode"] in HEADLINE_MODES}:
        doc.setdefault("needle_provenance", {})[str(context)] = {
            k: header.get(k) for k in ("machine", "commit", "date")} | {"command": [header["command"]]}
    write_result(fidelity, doc)


def summarize_runs(out_dir: Path, contexts: list[int], model: str) -> list[dict]:
    """Recompute the ``needle`` cells of ``fidelity.json`` at ``contexts`` from every trial in
    ``needle_full.json`` files (``out_dir``'s own and its run folders'; runs of one book or mode each add up; a
    prompt measured twice counts once, the
    latest run's). LOCKS trials must all use one summary format per cell (those older runs that did not record
    it count as the current default, ``LocksConfig().summary_format``). Returns the new cells.

    Raises:
        ValueError: no trials at those contexts, or two summary formats in one cell.
    """
    paths = sorted(out_dir.glob("needle_full.json")) + sorted(out_dir.glob("*/needle_full.json"))
    runs = [run for path in paths for run in json.loads(path.read_text())["runs"]]
    latest = {}
    for run in sorted(runs, key=lambda r: r["date"]):
        for t in run["trials"]:
            if t["context"] in contexts:
                latest[(t["context"], t["mode"], t["budget_frac"], t["book"], t["depth"], t["value"])] = t
    if not latest:
        raise ValueError(f"no trials at contexts {contexts} in {[str(p) for p in paths]}")
    cells = {}
    for t in latest.values():
        cells.setdefault((t["context"], t["mode"], t["budget_frac"]), []).append(t)
    summary = []
    for (context, mode, frac), trials in sorted(cells.items()):
        formats = {t.get("summary_format") or LocksConfig().summary_format for t in trials} if mode != "dense" else set()
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
    write_result(fidelity, doc)
    return summary


