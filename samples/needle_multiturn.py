"""Multi-turn needles through vLLM with the LOCKS backend: one conversation over one haystack holding several
needles at different depths; each turn asks for another one (the model's own earlier answers stay in the
conversation). Per turn: accuracy and carrier retention of that turn's needle (as ``samples/bench_needle.py``).
Writes ``OUT_DIR/needle_multiturn.json`` (kept apart from ``fidelity.json``'s single-needle cells).

    python samples/needle_multiturn.py --model MODEL_DIR --books ../shared/data/books/milton_paradise_lost.txt \\
        ../shared/data/books/kjv_bible.txt --context 8192 --depths 0.8 0.2 0.5 --budgets 0.05
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from locks_bench.needle import ANSWER, INTRO, KEYS, NEEDLE, QUESTION, carrier
from locks_bench.results import header, read_prose, write_result
from locks_engine import LocksConfig
from locks_engine.sampling import GREEDY


def haystack(tokenizer, book_ids: list[int], context: int, depths: list[float], rng: random.Random) -> tuple[str, list]:
    """User text of about ``context`` tokens with one needle per depth; the (key, value) of each, in order."""
    needles = [(key, str(rng.randrange(1_000_000, 10_000_000))) for key in rng.sample(KEYS, len(depths))]
    room = context - 60 * len(depths) - 200
    start = rng.randrange(0, len(book_ids) - room)
    hay = book_ids[start:start + room]
    cuts = sorted((int(d * room), n) for d, n in zip(depths, needles))
    parts, last = [INTRO], 0
    for cut, (key, value) in cuts:
        parts += [tokenizer.decode(hay[last:cut]), NEEDLE.format(key=key, value=value)]
        last = cut
    parts.append(tokenizer.decode(hay[last:]))
    return "".join(parts), needles


def turn_prompt(tokenizer, text: str, asked: list[tuple[str, str]], key: str) -> tuple[list[int], list]:
    """Token ids of the conversation so far plus the question about ``key``; token offsets of the prompt."""
    messages = []
    for i, (old_key, answer) in enumerate(asked):
        messages += [{"role": "user", "content": text + QUESTION.format(key=old_key) if i == 0
                      else QUESTION.format(key=old_key).lstrip()},
                     {"role": "assistant", "content": ANSWER.format(key=old_key) + answer}]
    messages.append({"role": "user", "content": QUESTION.format(key=key).lstrip() if asked
                     else text + QUESTION.format(key=key)})
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt += ANSWER.format(key=key)
    enc = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], (prompt, enc["offset_mapping"])


def value_tokens(prompt: str, offsets: list, value: str) -> tuple[int, int]:
    """Token range of ``value``'s first occurrence in the prompt (the needle)."""
    at = prompt.index(value)
    inside = [i for i, (a, b) in enumerate(offsets) if a < at + len(value) and b > at]
    return inside[0], inside[-1] + 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--model-name", default="Qwen2.5-Coder-0.5B-Instruct")
    ap.add_argument("--books", nargs="+", required=True)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--depths", type=float, nargs="+", default=[0.8, 0.2, 0.5], help="needle depths, asked in order")
    ap.add_argument("--budgets", type=float, nargs="*", default=[0.05])
    ap.add_argument("--max-tokens", type=int, default=10)
    ap.add_argument("--out-dir", default="samples/results")
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    from locks_engine.engine import EngineOptions, LocksEngine

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    stacks = []
    for i, book in enumerate(args.books):
        ids = tokenizer(read_prose(book)[:2_000_000], add_special_tokens=False)["input_ids"]
        text, needles = haystack(tokenizer, ids, args.context, args.depths, random.Random(args.context + 7 * i))
        stacks.append((Path(book).stem, text, needles))
    rows, start = [], time.perf_counter()
    for mode, frac in [("dense", 1.0)] + [("locks", b) for b in args.budgets]:
        budget = max(3, round(args.context // 16 * frac)) * 16
        cfg = LocksConfig(budget=budget, dense=mode == "dense")
        engine = LocksEngine(EngineOptions(model=args.model, locks=cfg, max_model_len=args.context + 512))
        try:
            for book, text, needles in stacks:
                asked = []
                for turn, (key, value) in enumerate(needles):
                    ids, (prompt, offsets) = turn_prompt(tokenizer, text, asked, key)
                    answer, records = "", []
                    for event in engine.stream(ids, args.max_tokens, sampling=GREEDY):
                        answer += event.text
                        records += event.stats
                    shares, anys = carrier(records, value_tokens(prompt, offsets, value), cfg.page_size)
                    row = {"mode": mode, "budget_frac": frac, "book": book, "turn": turn, "depth": args.depths[turn],
                           "value": value, "answer": answer, "correct": value in answer, "prompt_tokens": len(ids),
                           "carrier_retention": sum(shares) / max(1, len(shares)),
                           "carrier_any": sum(anys) / max(1, len(anys))}
                    log(f"{mode} {frac:.0%} {book} turn {turn} depth {row['depth']}: "
                        f"{'ok ' if row['correct'] else 'MISS'} retention {row['carrier_retention']:.2f} {answer!r}")
                    rows.append(row)
                    asked.append((key, answer))
        finally:
            engine.close()
    summary = []
    for mode, frac in sorted({(r["mode"], r["budget_frac"]) for r in rows}):
        cell = [r for r in rows if (r["mode"], r["budget_frac"]) == (mode, frac)]
        summary.append({"model": args.model_name, "context": args.context, "mode": mode, "budget_frac": frac,
                        "accuracy": round(sum(r["correct"] for r in cell) / len(cell), 4), "turns": len(cell),
                        "carrier_retention": round(sum(r["carrier_retention"] for r in cell) / len(cell), 4)})
        print(summary[-1])
    words = [f"../shared/data/books/{Path(w).name}" if w in args.books else w
             for w in (argv if argv is not None else sys.argv[1:])]
    doc = {**header("needle_multiturn.py", words, {"--model": "MODEL_DIR"}),
           "runtime_s": round(time.perf_counter() - start), "summary": summary, "turns": rows}
    write_result(Path(args.out_dir, "needle_multiturn.json"), doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
