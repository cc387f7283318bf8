"""``samples/bench_needle.py --summarize`` (``locks_bench.needle``): cells recomputed from every run's trials (no
engine here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from locks_bench import needle


def trial(mode, book, depth, correct, retention, fmt=None, context=16384, value="1234567"):
    row = {"context": context, "mode": mode, "budget_frac": 1.0 if mode == "dense" else 0.05, "book": book,
           "depth": depth, "value": value, "correct": correct, "carrier_retention": retention}
    if fmt is not None:
        row["summary_format"] = fmt
    return row


def write(out: Path, runs: list[dict], cells: list[dict]) -> None:
    out.mkdir(exist_ok=True)
    (out / "needle_full.json").write_text(json.dumps({"runs": runs}))
    (out / "fidelity.json").write_text(json.dumps({"mass": [{"kept": True}], "needle": cells}))


def test_summarize_adds_runs_up_and_counts_a_prompt_once(tmp_path):
    old_cell = {"model": "m", "context": 8192, "mode": "dense", "budget_frac": 1.0, "accuracy": 1.0, "trials": 20,
                "carrier_retention": 1.0}
    runs = [
        {"date": "2026-11-29T16:00:00", "trials": [trial("locks", "a", 0.5, False, 0.5),
                                                   trial("dense", "a", 0.5, True, 1.0)]},
        # the same LOCKS prompt again (latest counts), and a new book
        {"date": "2026-11-29T18:00:00", "trials": [trial("locks", "a", 0.5, True, 0.7, "chanlog"),
                                                   trial("locks", "b", 0.1, True, 0.9, "chanlog"),
                                                   trial("dense", "b", 0.1, False, 1.0)]},
    ]
    write(tmp_path, runs, [old_cell])
    cells = needle.summarize_runs(tmp_path, [16384], "m")
    by = {c["mode"]: c for c in cells}
    assert by["locks"] == {"model": "m", "context": 16384, "mode": "locks", "budget_frac": 0.05, "accuracy": 1.0,
                           "trials": 2, "carrier_retention": 0.8, "summary_format": "chanlog"}
    assert (by["dense"]["accuracy"], by["dense"]["trials"]) == (0.5, 2) and "summary_format" not in by["dense"]
    doc = json.loads((tmp_path / "fidelity.json").read_text())
    assert doc["mass"] == [{"kept": True}] and old_cell in doc["needle"] and len(doc["needle"]) == 3


def test_summarize_refuses_mixed_formats_and_empty_contexts(tmp_path):
    runs = [{"date": "d1", "trials": [trial("locks", "a", 0.5, True, 0.5, "colwise"),
                                      trial("locks", "b", 0.5, True, 0.5, "chanlog")]}]
    write(tmp_path, runs, [])
    with pytest.raises(ValueError, match="several summary formats"):
        needle.summarize_runs(tmp_path, [16384], "m")
    with pytest.raises(ValueError, match="no trials at contexts"):
        needle.summarize_runs(tmp_path, [32768], "m")


def test_a_two_level_run_adds_its_cells_and_leaves_the_contexts_provenance(tmp_path):
    def header(machine, date, command):
        return {"machine": {"kind": machine, "name": machine}, "commit": "c" + date[-1], "date": date, "command": command}

    def cell(mode, budget):
        return {"model": "m", "context": 32704, "mode": mode, "budget_frac": budget, "accuracy": 1.0, "trials": 20,
                "carrier_retention": 0.5}

    needle.merge_results(tmp_path, header("gpu", "2026-12-01", ["flat"]), [cell("locks", 0.02)], [])
    needle.merge_results(tmp_path, header("cpu", "2026-12-05", ["two-level"]), [cell("locks-2l", 0.02)], [])
    doc = json.loads((tmp_path / "fidelity.json").read_text())
    assert sorted((c["mode"], c["budget_frac"]) for c in doc["needle"]) == [("locks", 0.02), ("locks-2l", 0.02)]
    assert doc["needle_provenance"]["32704"]["machine"]["name"] == "gpu"
    assert doc["needle_command"] == [["flat"], ["two-level"]]
    # a later flat run at that context is the row's provenance
    needle.merge_results(tmp_path, header("cpu", "2026-12-06", ["flat again"]), [cell("locks", 0.05)], [])
    doc = json.loads((tmp_path / "fidelity.json").read_text())
    assert doc["needle_provenance"]["32704"]["command"] == [["flat again"]]
    assert len(doc["needle"]) == 3


class _CharTokenizer:
    """One token per character: enough for ``build_trial``."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "<u>" + messages[0]["content"] + "</u><a>"

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        out = {"input_ids": [ord(c) for c in text]}
        if return_offsets_mapping:
            out["offset_mapping"] = [(i, i + 1) for i in range(len(text))]
        return out


def test_haystack_trials_one_haystack_per_book_deepest_needle_first():
    tok = _CharTokenizer()
    books = {"a": list(range(1000, 6000)), "b": list(range(7000, 12000))}
    trials = needle.haystack_trials(tok, books, 1024, [0.2, 0.8, 0.5])
    assert [(t["book"], t["depth"]) for t in trials] == [("a", 0.8), ("a", 0.5), ("a", 0.2), ("b", 0.8), ("b", 0.5),
                                                         ("b", 0.2)]
    assert len({t["book_offset"] for t in trials if t["book"] == "a"}) == 1  # one haystack a book
    assert all(len(t["ids"]) == 1024 for t in trials)
    for t in trials:
        first, last = t["needle"]
        assert "".join(chr(i) for i in t["ids"][first:last]) == t["value"]
    assert trials == needle.haystack_trials(tok, books, 1024, [0.2, 0.8, 0.5])  # deterministic
