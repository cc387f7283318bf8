"""Captured decode steps for the tail-estimate study (issue 47): a needle trial per context, teacher-forced.

Each context is one trial of ``samples/bench_needle.py`` (``locks_bench.needle.haystack_trials``: the book's
haystack with a RULER-style needle at ``depth``); the expected value is appended after the prompt, and the
model's post-RoPE queries are kept at two runs of consecutive decode steps (``locks_bench.capture.capture_ids``):
a run over the haystack just before the question (steps that read prose) and a run that ends with the steps
writing the answer (the question, the answer prefix and the value's tokens: the steps that need the needle).
Keys and values are kept for every position. Captures are cached as one ``.pt`` per (model, book, context,
depth, steps).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch


def trial_positions(n_prompt: int, n_answer: int, steps: int, prose_end: int) -> dict[str, list[int]]:
    """The two runs of ``steps`` consecutive decode positions of a trial.

    Args:
        n_prompt (int): prompt tokens; n_answer (int): answer tokens appended after it (teacher-forced).
        steps (int): positions a run; prose_end (int): last position of the prose run (inside the haystack).
    Returns:
        dict: ``prose`` and ``answer`` sorted positions; ``answer`` ends at ``n_prompt + n_answer - 2`` (the
        step that writes the last answer token).
    Raises:
        ValueError: when the runs overlap or start before position 0.
    """
    last = n_prompt + n_answer - 2
    answer = list(range(last - steps + 1, last + 1))
    prose = list(range(prose_end - steps + 1, prose_end + 1))
    if prose[0] < 0 or prose[-1] >= answer[0]:
        raise ValueError(f"runs of {steps} steps overlap or start before 0 (prose ends at {prose_end}, "
                         f"answer at {last})")
    return {"prose": prose, "answer": answer}


def needle_capture(cache_dir: str | Path, model_dir: str | Path, book: str | Path, context: int,
                   depth: float = 0.5, steps: int = 32, log=print) -> dict:
    """The capture of one needle trial of ``context`` prompt tokens (cached under ``cache_dir``).

    Returns:
        dict: ``capture_ids``' output (``k``, ``v`` `[L, H, N, D]` float16, ``q`` `[L, HQ, T, D]`, ``positions``
        `[T]`) plus ``trial`` (``needle`` token span of the value, ``value``, ``depth``, ``book``,
        ``n_prompt``, ``answer_ids``) and ``runs`` (``trial_positions``).
    """
    from transformers import AutoTokenizer

    from locks_bench.capture import capture_ids
    from locks_bench.needle import haystack_trials
    from locks_bench.results import read_prose

    tok = AutoTokenizer.from_pretrained(model_dir)
    name = Path(book).stem
    # the book's first 2M characters, as needle_layers.py reads it
    books = {name: tok(read_prose(book)[:2_000_000], add_special_tokens=False)["input_ids"]}
    trial = haystack_trials(tok, books, context, [depth])[0]
    answer = tok(" " + trial["value"] + ".", add_special_tokens=False)["input_ids"]
    ids, n_prompt = trial["ids"] + answer, len(trial["ids"])
    suffix = len(tok("\n\nWhat", add_special_tokens=False)["input_ids"])
    question_at = n_prompt - 64  # well inside the haystack's last tokens, before the question and template
    runs = trial_positions(n_prompt, len(answer), steps, question_at - suffix)
    positions = runs["prose"] + runs["answer"]
    key = json.dumps([Path(model_dir).name, name, context, depth, steps, hashlib.sha1(str(ids).encode()).hexdigest()])
    digest = hashlib.sha1(key.encode()).hexdigest()[:10]
    path = Path(cache_dir) / f"tail_{Path(model_dir).name}_{name}_{context}_{digest}.pt"
    if path.is_file():
        log(f"capture: cached {path}")
        return torch.load(path, weights_only=False)
    data = capture_ids(model_dir, ids, positions, log)
    data["trial"] = {"needle": list(trial["needle"]), "value": trial["value"], "key": trial["key"],
                     "depth": depth, "book": name, "book_offset": trial["book_offset"], "n_prompt": n_prompt,
                     "answer_ids": answer}
    data["runs"] = runs
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(data, tmp)
    tmp.rename(path)
    log(f"capture: saved {path}")
    return data
