"""The result file of ``samples/bench_ruler.py``: one row per task, length and setting, from lm-eval's output.

lm-eval's RULER tasks score each sample by the share of the expected strings found in the answer
(``string_match_all``) under a metric named after the length (``"4096,none"``); a length without samples
scores -1. Accuracy here is that mean in percent, RULER's convention.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from locks_bench.results import run_folder, write_result

#: characters of each answer kept in the result file (enough to see what the model said)
ANSWER_CHARS = 200


def task_row(results: dict[str, Any], task: str, context: int) -> dict[str, Any]:
    """Accuracy (percent, 2 decimals) and number of samples of ``task`` at ``context`` from the dict that
    ``lm_eval.simple_evaluate`` returns, with each sample's expected strings, answer (first ``ANSWER_CHARS``
    characters), score and RULER length (prompt tokens without the chat template, plus the answer's allowance)
    when it was run with ``log_samples=True``.

    Raises:
        KeyError: ``results`` has no score for ``task`` at ``context`` (lm-eval's output changed, or the task
            built no sample at that length).
    """
    score = results["results"][task][f"{context},none"]
    if score is None or score < 0:
        raise KeyError(f"{task}: no sample at length {context}")
    samples = results.get("n-samples", {}).get(task, {}).get("effective")
    predictions = []
    for s in results.get("samples", {}).get(task, []):
        answer = s.get("filtered_resps") or s.get("resps") or [""]
        while isinstance(answer, list):
            answer = answer[0] if answer else ""
        predictions.append({"doc_id": s.get("doc_id"), "expected": s["doc"].get("outputs"),
                            "answer": str(answer)[:ANSWER_CHARS], "score": s.get(str(context)),
                            "length": s["doc"].get("length")})
    if samples is None:
        samples = len(predictions)
    return {"task": task, "context": context, "accuracy": round(100 * float(score), 2), "samples": int(samples),
            "predictions": predictions}


def timed_row(row: dict[str, Any], data_s: float, eval_s: float) -> dict[str, Any]:
    """``row`` with the seconds spent building the task's samples (``data_s``) and evaluating them (``eval_s``),
    and ``s_per_sample = eval_s / samples`` (what plans a longer run)."""
    return {**row, "data_s": round(data_s, 1), "eval_s": round(eval_s, 1),
            "s_per_sample": round(eval_s / max(1, row["samples"]), 2)}


def table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every run's task rows flattened to ``{task, context, setting, accuracy, samples, s_per_sample}``, in task,
    length, setting order (the settings in the order they ran); a failed run adds nothing."""
    order = {name: i for i, name in enumerate(dict.fromkeys(r["setting"] for r in runs))}
    rows = [{"task": t["task"], "context": t["context"], "setting": r["setting"], "accuracy": t["accuracy"],
             "samples": t["samples"], "s_per_sample": t.get("s_per_sample")}
            for r in runs for t in r.get("tasks", [])]
    tasks = {name: i for i, name in enumerate(dict.fromkeys(row["task"] for row in rows))}
    return sorted(rows, key=lambda x: (tasks[x["task"]], x["context"], order[x["setting"]]))


def slug(words: list[Any]) -> str:
    """Words as a file name part, joined by ``-``: ``locks:5%`` -> ``locks5pct``, ``0.5`` -> ``0p5``,
    ``locks:5%:c=4`` -> ``locks5pctc4``; a per-layer table (``c=8,4,...``) becomes ``c`` and the first 8 hex digits
    of its SHA-1, so that the name has no commas and stays short (the table itself is in the file)."""
    def word(w: Any) -> str:
        text = str(w)
        head, sep, values = text.rpartition("c=")
        if sep and "," in values:
            text = f"{head}c{hashlib.sha1(values.encode()).hexdigest()[:8]}"
        return text.replace("=", "").replace(":", "").replace("%", "pct").replace(".", "p")
    return "-".join(word(w) for w in words)


def result_path(out_dir: str | Path, header: dict[str, Any], lengths: list[int], settings: list[str],
                tasks: list[str] | None = None) -> Path:
    """``OUT_DIR/<date>_<cpu|gpu>_<commit>/ruler_<lengths>_<settings>[_<tasks>].json``: lengths and settings
    joined by ``-`` (``locks:5%`` written ``locks5pct``), the tasks only when given (a run of some of them), so
    that runs split by length, setting or task land in files of their own."""
    name = f"ruler_{slug(lengths)}_{slug(settings)}" + (f"_{slug(tasks)}" if tasks else "")
    return Path(out_dir) / run_folder(header) / f"{name}.json"


def write_ruler_result(path: str | Path, header: dict[str, Any], run: dict[str, Any],
                       runs: list[dict[str, Any]]) -> Path:
    """Write the result file: ``header`` (command, machine, date, commit), ``run`` (model, tasks, lengths,
    settings, limit, seed, versions, engine sizes), ``runs`` (per setting and length: the attention backend,
    LOCKS' config, engine start seconds, task rows or the error) and ``table``. Returns the path."""
    return write_result(path, {**header, **run, "runs": runs, "table": table(runs)})


def as_result(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as a result file: a result file unchanged, a child's part file (one setting and length, the tasks
    it finished before it was stopped: ``{"setting", "context", "tasks"}``) wrapped as a result of that one run.

    Raises:
        ValueError: ``data`` is neither.
    """
    if "runs" in data:
        return data
    if {"setting", "context", "tasks"} <= data.keys():
        return {"runs": [data], "table": table([data])}
    raise ValueError("not a RULER result or part file: it has neither 'runs' nor 'setting', 'context' and 'tasks'")


def markdown_table(results: list[dict[str, Any]]) -> str:
    """The README's table from result files (``write_ruler_result``'s dicts): a row per task, a column per length
    and setting (in the order they ran), each cell ``accuracy (samples)``; ``-`` where a run has no row; the last
    row the mean over the tasks of each column that has all of them."""
    rows = [row for result in results for row in result["table"]]
    columns = list(dict.fromkeys((row["context"], row["setting"]) for row in rows))
    tasks = list(dict.fromkeys(row["task"] for row in rows))
    cell = {(row["task"], row["context"], row["setting"]): row for row in rows}
    lines = ["| task | " + " | ".join(f"{round(context / 1024)}K {setting}" for context, setting in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for task in tasks:
        shown = [cell.get((task, *column)) for column in columns]
        lines.append(f"| {task} | " + " | ".join(
            f"{row['accuracy']:.1f} ({row['samples']})" if row else "-" for row in shown) + " |")
    means = []
    for column in columns:
        scores = [cell[(task, *column)]["accuracy"] for task in tasks if (task, *column) in cell]
        means.append(f"{sum(scores) / len(scores):.1f}" if len(scores) == len(tasks) else "-")
    lines.append("| mean | " + " | ".join(means) + " |")
    return "\n".join(lines)


def agreement(results: list[dict[str, Any]], setting: str, reference: str = "dense") -> dict[str, dict[str, int]]:
    """Per task and length, how ``setting``'s samples scored against ``reference``'s on the same samples (the runs
    share the seed, so sample ``doc_id`` is the same prompt): ``{"same", "better", "worse"}`` counts, keyed
    ``"task@length"``."""
    scores: dict[tuple[str, int, str], dict[Any, float]] = {}
    for result in results:
        for run in result["runs"]:
            for task in run.get("tasks", []):
                scores[(task["task"], task["context"], run["setting"])] = {
                    p["doc_id"]: float(p["score"] or 0) for p in task.get("predictions", [])}
    out = {}
    for (task, context, name), mine in scores.items():
        theirs = scores.get((task, context, reference))
        if name != setting or theirs is None:
            continue
        common = [doc for doc in mine if doc in theirs]
        out[f"{task}@{context}"] = {
            "same": sum(mine[d] == theirs[d] for d in common),
            "better": sum(mine[d] > theirs[d] for d in common),
            "worse": sum(mine[d] < theirs[d] for d in common)}
    return out
