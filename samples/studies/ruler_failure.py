"""Explain one RULER sample LOCKS loses: which pages held the answer, and whether LOCKS read them (issue 28).

Rebuilds the sample's prompt as ``samples/bench_ruler.py`` did (checked against the result file's ``length`` and
``expected``), teacher-forces dense's answer (the result file's first 200 characters) after it, captures the
model's post-RoPE queries at the answer steps and keys of every token (HF transformers, float32, CPU), and
measures per layer, KV head and step the true attention mass on LOCKS' pages and on the oracle's at the run's
budget, and the share of each expected word's pages each reads (``locks_studies.ruler_failure``). Prints a table,
writes ``OUT_DIR/ruler_failure_<task>_<length>_doc<id>.json`` (summaries only; ``..._doc<id>_<setting>.json`` for a
setting other than ``locks:5%``, written as result files write it: ``locks5pctquest4``). From the repository root::

    python samples/studies/ruler_failure.py --model MODEL_DIR \\
        --results samples/results/2026-12-04_cpu_3de6db0/ruler_4096_dense-locks5pct.json \\
        --task ruler_cwe --length 4096 --setting locks:5% --out-dir OUT
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="local model directory (MODEL_DIR) of the RULER run")
    ap.add_argument("--results", nargs="+", required=True, help="bench_ruler result files (dense and LOCKS runs)")
    ap.add_argument("--task", default="ruler_cwe")
    ap.add_argument("--length", type=int, default=4096, help="RULER length (tokens)")
    ap.add_argument("--setting", default="locks:5%",
                    help="the LOCKS setting of the run (locks:TOKENS|PERCENT%%, optionally :quest|:quest2|:quest4)")
    ap.add_argument("--doc-id", type=int, help="sample (default: the one LOCKS scores lowest against dense)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--nltk-data", help="where NLTK's punkt_tab is kept (default: the user cache)")
    ap.add_argument("--capture-file", help="keep the capture here (.pt) and reuse it when its ids match")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top-p-max", type=int, metavar="PAGES",
                    help="also compare the fixed budget with top-p over LOCKS' estimates at the same mean pages, "
                         "at most PAGES a step, layer and KV head (locks_bench/mass_budget.py; the result's top_p)")
    ap.add_argument("--top-p-min", type=int, default=0, metavar="PAGES",
                    help="with --top-p-max: at least PAGES a step, layer and KV head")
    ap.add_argument("--candidates", metavar="C",
                    help="measure the two-level selection at the setting's budget in the flat scan's place: 'study' "
                         "(the evaluation model's per-layer table) or c per layer, comma separated (0 = flat); the "
                         "sample is still chosen by the run's predictions")
    ap.add_argument("--out-dir", default="samples/results")
    return ap.parse_args(argv)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def prepare(args) -> dict:
    """Everything checked before the model runs: settings, predictions, doc, prompt, ids (RulerError if not)."""
    from platformdirs import user_cache_dir

    from locks_bench.ruler import (
        TASKS, RulerError, budget_tokens, check_model_dir, ensure_punkt_tab, locks_settings, parse_setting)
    from locks_studies.ruler_failure import rebuild_prompt, task_predictions, worst_doc

    if args.task not in TASKS:
        raise RulerError(f"--task {args.task}: allowed {', '.join(TASKS)}")
    args.model = check_model_dir(args.model)
    setting = parse_setting(args.setting)
    cfg = locks_settings(setting, args.length)
    if args.candidates is not None:
        from dataclasses import replace

        from locks_bench.candidates import parse_candidates

        if args.top_p_max or setting.selection:
            raise RulerError("--candidates: not with --top-p-max, nor with a setting that names its own selection")
        try:
            cfg = replace(cfg, selection="two-level", candidates=parse_candidates(args.candidates))
        except ValueError as err:
            raise RulerError(f"--candidates: {err}") from None
    if args.top_p_min and not args.top_p_max:
        raise RulerError("--top-p-min needs --top-p-max")
    if args.top_p_max and not args.top_p_min <= cfg.budget_pages <= args.top_p_max:
        raise RulerError(f"--top-p-min {args.top_p_min} / --top-p-max {args.top_p_max}: the budget's "
                         f"{cfg.budget_pages} pages must lie between them (top-p reads as many on average)")
    results = []
    for path in args.results:
        try:
            results.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as err:
            raise RulerError(f"--results {path}: {err}") from None
    dense = task_predictions(results, args.task, args.length, "dense")
    sparse = task_predictions(results, args.task, args.length, setting.name)
    doc_id = worst_doc(dense, sparse) if args.doc_id is None else args.doc_id
    if doc_id not in dense or doc_id not in sparse:
        raise RulerError(f"--doc-id {doc_id}: not among the predictions of both dense and {setting.name}")
    nltk_dir = ensure_punkt_tab(Path(args.nltk_data or Path(user_cache_dir("locks-chat")) / "nltk_data"))
    prompt, doc, max_gen_toks = rebuild_prompt(args.model, args.task, args.length, doc_id, args.seed, nltk_dir)
    if doc.get("length") != dense[doc_id]["length"] or doc.get("outputs") != dense[doc_id]["expected"]:
        raise RulerError(f"doc_id {doc_id}: rebuilt length {doc.get('length')} / expected {doc.get('outputs')} "
                         f"differ from the result file's {dense[doc_id]['length']} / {dense[doc_id]['expected']}")
    return {"cfg": cfg, "budget": budget_tokens(setting, args.length), "setting": setting.name, "doc_id": doc_id,
            "prompt": prompt, "doc": doc, "max_gen_toks": max_gen_toks, "dense": dense[doc_id], "locks": sparse[doc_id]}


def run(args, p: dict) -> dict:
    """Tokenize, capture (or reuse), measure, summarize."""
    import torch
    from transformers import AutoTokenizer

    from locks_bench.capture import capture_ids
    from locks_studies.ruler_failure import first_difference, measure, summarize, word_pages, word_starts

    tok = AutoTokenizer.from_pretrained(args.model)
    enc = tok(p["prompt"], return_offsets_mapping=True)
    ans = tok(p["dense"]["answer"], add_special_tokens=False, return_offsets_mapping=True)
    # RULER's length: the prompt's tokens without the chat template, plus the answer's allowance
    doc = p["doc"]
    ruler_tokens = len(tok(doc["input"] + " " + doc["gen_prefix"])["input_ids"]) + p["max_gen_toks"]
    if ruler_tokens != doc["length"]:
        log(f"warning: {ruler_tokens} tokens (input, gen prefix, max_gen_toks) against RULER's length "
            f"{doc['length']}: this task counts its length otherwise")
    ids, n_prompt, n_ans = enc["input_ids"] + ans["input_ids"], len(enc["input_ids"]), len(ans["input_ids"])
    positions = list(range(n_prompt - 1, n_prompt + n_ans - 1))
    words = p["doc"]["outputs"]
    pages = word_pages(p["prompt"], words, enc["offset_mapping"], p["cfg"].page_size)
    starts = word_starts(p["dense"]["answer"], words, ans["offset_mapping"])
    cached = Path(args.capture_file) if args.capture_file else None
    data = torch.load(cached, weights_only=False) if cached and cached.is_file() else None
    if data is None or data["ids"] != ids:
        data = capture_ids(args.model, ids, positions, log)
        data["ids"] = ids
        if cached:
            torch.save(data, cached)
    start = time.perf_counter()
    orders = [] if args.top_p_max else None
    m = measure(data, n_prompt + n_ans - 1, p["cfg"], pages, orders)
    log(f"measured {m['kept'].shape[0]} layers x {m['kept'].shape[1]} KV heads in {time.perf_counter() - start:.0f} s")
    tokens = [tok.decode([i]) for i in ans["input_ids"]]
    locks_ids = tok(p["locks"]["answer"], add_special_tokens=False)["input_ids"]
    summary = summarize(m, words, pages, starts, tokens)
    if orders is not None:
        from locks_studies.mass_budget import compare

        steps_of_word = {w: [t for t, s in starts.items() if s == w] for w in words}
        summary["top_p"] = compare(orders, p["cfg"].budget_pages, args.top_p_max, pages, steps_of_word,
                                     args.top_p_min)
    prompt_pages = -(-n_prompt // p["cfg"].page_size)
    any_word = sorted({pg for ps in pages.values() for pg in ps})
    return {"prompt_tokens": n_prompt, "ruler_length": doc["length"], "ruler_length_counted": ruler_tokens,
            "answer_tokens": n_ans, "answer_ids_decode_to_answer": tok.decode(ans["input_ids"]) == p["dense"]["answer"],
            "prompt_pages": prompt_pages, "pages_with_an_expected_word": len(any_word),
            "locks_answer_differs_at_step": first_difference(ans["input_ids"], locks_ids),
            "budget_tokens": p["budget"], "budget_pages": p["cfg"].budget_pages,
            "capture": {k: data["meta"][k] for k in ("forward_s", "check_max_rel_err", "transformers", "torch")},
            **summary}


def main(argv=None) -> int:
    args = parse_args(argv)
    from locks_bench.ruler import RulerError

    try:
        p = prepare(args)
    except RulerError as err:
        print(f"ruler_failure: {err}", file=sys.stderr)
        return 2
    import torch

    from locks_bench.results import header, write_result
    from locks_bench.ruler_results import slug
    from locks_studies.ruler_failure import table

    torch.set_num_threads(args.threads)
    log(f"{args.task} at {args.length}, doc {p['doc_id']}: dense {p['dense']['score']}, "
        f"{p['setting']} {p['locks']['score']}; rebuilt prompt matches (RULER length {p['doc']['length']})")
    out = run(args, p)
    print("\n".join(table(out)))
    t = out["totals"]
    print(f"mass kept: {p['setting']} {t['kept_mean']:.3f} (worst layer per step, mean {t['kept_worst_layer_mean']:.3f}), "
          f"oracle {t['oracle_kept_mean']:.3f} at {out['budget_pages']} pages of {out['prompt_pages']}; "
          f"{out['pages_with_an_expected_word']} pages hold an expected word; the forced pages alone hold "
          f"{t['forced_kept_mean']:.3f}; 90% of the mass needs {t['pages_for_90_mean']:.0f} pages (mean); "
          f"{p['setting']}'s answer leaves dense's at step {out['locks_answer_differs_at_step']}")
    for word, w in out["words"].items():
        print(f"{word:<14} {len(w['pages']):>3} pages, answer steps {w['answer_steps']}, read over all steps: "
              f"{p['setting']} {w['locks_share_all_steps']:.2f}, oracle {w['oracle_share_all_steps']:.2f}")
    if "top_p" in out:
        c = out["top_p"]
        for name in ("fixed", "top_p"):
            r = c[name]
            print(f"{name:>6}: mass kept {r['kept_mean']:.3f}, worst layer {r['kept_worst_layer'][1]:.3f} "
                  f"({r['kept_worst_layer'][0]}), pages a layer {min(r['pages_per_layer']):.0f}-"
                  f"{max(r['pages_per_layer']):.0f}, answer's pages read (its steps / all) " +
                  ", ".join(f"{w} {v:.2f} / {r['word_read_all_steps'][w]:.2f}" for w, v in r["word_read"].items()))
        print(f"top-p: p = {c['level']}, {c['k_min']} to {c['k_max']} pages, the same mean pages as {c['k']} fixed")
    head = header("studies/ruler_failure.py", argv, {"--model": "MODEL_DIR", "--nltk-data": "NLTK_DATA",
                                             "--capture-file": "CAPTURE_FILE"})
    result = {**head, "task": args.task, "length": args.length, "setting": p["setting"], "doc_id": p["doc_id"],
              "seed": args.seed, "locks": p["cfg"].to_dict(), "expected": p["doc"]["outputs"],
              "dense": p["dense"], "locks_run": p["locks"], **out}
    name = f"ruler_failure_{args.task}_{args.length}_doc{p['doc_id']}"
    if p["setting"] != "locks:5%":
        name += "_" + slug([p["setting"]])
    if args.candidates is not None:
        name += "_two-level-" + ("study" if args.candidates.strip().lower() == "study" else "c")
    path = write_result(Path(args.out_dir) / f"{name}.json", result)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
