"""``samples/studies/ruler_failure.py``'s pure pieces (``locks_studies.ruler_failure``): words -> token positions and
pages, the steps that begin an answer word, the share of a word's pages a selection reads, the per-layer measures on a
synthetic capture, the command line's one-line refusals; and ``capture_ids`` on a tiny random model.

No lm-eval, no network, no evaluation model: offsets come from a whitespace "tokenizer" written here.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from locks_bench.ruler import RulerError
from locks_studies.ruler_failure import (
    first_difference, measure, pages_needed, share_selected, task_predictions, word_pages, word_starts, word_tokens,
    worst_doc)
from locks_engine.config import LocksConfig
from tests.support.paths import REPO as ROOT



def offsets(text: str) -> list[tuple[int, int]]:
    """A fake tokenizer's offset mapping: one token per run of non-spaces, its leading space included."""
    return [(m.start(), m.end()) for m in re.finditer(r"\s*\S+", text)]


LIST = "Words: 1. cat 2. dog 3. catalog 4. cat 5. bird 6. dog, 7. cat"
#        tokens: Words:0 1.1 cat2 2.3 dog4 3.5 catalog6 4.7 cat8 5.9 bird10 6.11 dog,12 7.13 cat14


def test_word_tokens_whole_words_only():
    got = word_tokens(LIST, ["cat", "dog", "fish"], offsets(LIST))
    assert got == {"cat": [2, 8, 14], "dog": [4, 12], "fish": []}


def test_word_pages_split_by_page_size():
    assert word_pages(LIST, ["cat", "dog", "bird"], offsets(LIST), page_size=4) == {
        "cat": [0, 2, 3], "dog": [1, 3], "bird": [2]}


def test_word_tokens_a_word_over_two_tokens():
    text = "x zucchini y"
    offs = [(0, 1), (1, 3), (3, 10), (10, 12)]  # "x", " z", "ucchini", " y"
    assert word_tokens(text, ["zucchini"], offs) == {"zucchini": [1, 2]}


def test_word_starts_marks_the_first_token_of_each_expected_word():
    answer = " cat, bird, cats, dog, cat"
    # " cat" "," " bird" "," " cats" "," " dog" "," " cat"
    offs = [(0, 4), (4, 5), (5, 10), (10, 11), (11, 16), (16, 17), (17, 21), (21, 22), (22, 26)]
    assert word_starts(answer, ["cat", "dog", "fish"], offs) == {0: "cat", 6: "dog", 8: "cat"}


def test_share_selected():
    mask = torch.tensor([[True, False, True, False, False], [False, False, False, False, True]])
    assert share_selected(mask, [0, 1, 2, 4]).tolist() == [0.5, 0.25]
    assert share_selected(mask, [2]).tolist() == [1.0, 0.0]
    assert all(math.isnan(x) for x in share_selected(mask, []).tolist())


def test_pages_needed():
    shares = torch.tensor([[0.1, 0.5, 0.1, 0.3], [0.25, 0.25, 0.25, 0.25]])
    assert pages_needed(shares, 0.5).tolist() == [1, 2]
    assert pages_needed(shares, 0.9).tolist() == [3, 4]
    assert pages_needed(shares, 1.0).tolist() == [4, 4]


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 4]) == 2
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference([1, 2], [1, 2]) is None


def prediction(doc_id: int, score: float) -> dict:
    return {"doc_id": doc_id, "expected": ["a"], "answer": " a", "score": score, "length": 100}


def result(setting: str, scores: list[float], task: str = "ruler_cwe", context: int = 4096) -> dict:
    return {"runs": [{"setting": setting, "context": context, "tasks": [
        {"task": task, "predictions": [prediction(i, s) for i, s in enumerate(scores)]}]}]}


def test_task_predictions_and_worst_doc():
    results = [result("dense", [1.0, 0.9, 0.8, 0.5]), result("locks:5%", [1.0, 0.5, 0.4, 0.6]),
               result("locks:5%", [0.0], task="ruler_vt")]
    dense = task_predictions(results, "ruler_cwe", 4096, "dense")
    sparse = task_predictions(results, "ruler_cwe", 4096, "locks:5%")
    assert sorted(sparse) == [0, 1, 2, 3] and sparse[1]["score"] == 0.5
    assert worst_doc(dense, sparse) == 1  # docs 1 and 2 both drop by 0.4: the lower id
    with pytest.raises(RulerError, match="no predictions"):
        task_predictions(results, "ruler_cwe", 8192, "dense")
    with pytest.raises(RulerError, match="no sample"):
        worst_doc(dense, dense)


def synthetic_capture(n: int = 70, layers: int = 2, heads: int = 2, groups: int = 2, dim: int = 16) -> dict:
    g = torch.Generator().manual_seed(0)
    positions = torch.arange(n - 6, n)
    return {"k": torch.randn(layers, heads, n, dim, generator=g).half(),
            "q": torch.randn(layers, heads * groups, len(positions), dim, generator=g), "positions": positions}


def test_measure_reads_everything_when_the_budget_covers_every_page():
    data = synthetic_capture()
    pages = {"a": [0, 2], "b": [1]}
    m = measure(data, 70, LocksConfig(page_size=16, rank=4, budget=80), pages)
    assert m["kept"].shape == (2, 2, 6) and m["locks_share"].shape == (2, 2, 6, 2)
    torch.testing.assert_close(m["kept"], torch.ones(2, 2, 6))
    torch.testing.assert_close(m["oracle_kept"], torch.ones(2, 2, 6))
    assert (m["locks_share"] == 1).all() and (m["pages_read"] == 5).all()


def test_measure_small_budget_keeps_less_and_the_oracle_keeps_most():
    data = synthetic_capture(n=160)
    m = measure(data, 160, LocksConfig(page_size=16, rank=4, budget=64), {"a": list(range(1, 8))})
    assert (m["pages_read"] == 4).all()
    assert (m["kept"] < 1).all() and (m["oracle_kept"] >= m["kept"] - 2e-3).all()
    assert (m["forced_kept"] <= m["kept"] + 1e-6).all()
    # 4 of 10 pages read, sink (page 0) and the last two among them: at most 1 of the word's 7 pages
    assert (m["locks_share"] <= 1 / 7 + 1e-6).all()


def test_measure_two_level_reads_within_the_budget_and_matches_flat_when_every_superpage_is_a_candidate():
    n, pages = 16 * 100 + 5, {"a": list(range(20, 27))}
    data = synthetic_capture(n=n)  # rank: the default, at which the shipped two-level path summarizes
    flat_cfg = LocksConfig(page_size=16, budget=64)
    flat = measure(data, n, flat_cfg, pages)
    # c = 32: ceil(32 * 4 / 16) = 8 superpages, more than the context's 7: every page is scored, as the flat scan
    wide = measure(data, n, LocksConfig(page_size=16, budget=64, selection="two-level", candidates=(32,)),
                   pages)
    for key in ("kept", "locks_share", "pages_read"):
        torch.testing.assert_close(wide[key], flat[key])
    # c = 0 in layer 0 (flat), 1 in layer 1: there one superpage besides the first and the last two (4 of 7)
    narrow = measure(data, n, LocksConfig(page_size=16, budget=64, selection="two-level",
                                          candidates=(0, 1)), pages)
    torch.testing.assert_close(narrow["kept"][0], flat["kept"][0])
    assert (narrow["pages_read"] <= 4).all() and (narrow["oracle_kept"] >= narrow["kept"] - 2e-3).all()
    assert not torch.equal(narrow["kept"][1], flat["kept"][1])


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "samples" / "studies" / "ruler_failure.py"), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_script_refuses_bad_input_with_one_line(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    results = tmp_path / "r.json"
    results.write_text(json.dumps({"runs": result("dense", [1.0])["runs"] + result("locks:5%", [0.5])["runs"]}))
    cases = [(["--model", str(tmp_path / "none")], "not a directory"),
             (["--model", str(model), "--task", "ruler_qa"], "--task ruler_qa"),
             (["--model", str(model), "--doc-id", "7"], "--doc-id 7"),
             (["--model", str(model), "--results", str(tmp_path / "missing.json")], "missing.json"),
             (["--model", str(model), "--top-p-min", "4"], "--top-p-min needs --top-p-max"),
             (["--model", str(model), "--top-p-max", "2"], "must lie between them"),
             (["--model", str(model), "--candidates", "4,x"], "--candidates: candidates '4,x'"),
             (["--model", str(model), "--candidates", "study", "--top-p-max", "20"], "--candidates: not with"),
             (["--model", str(model), "--setting", "locks:5%:study", "--candidates", "4"], "--candidates: not with")]
    for extra, needle in cases:
        args = ["--results", str(results), *extra] if "--results" not in extra else extra
        out = run_script(*args)
        assert out.returncode == 2, out.stderr
        assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_capture_ids_on_a_tiny_random_model(tmp_path):
    transformers = pytest.importorskip("transformers")
    from locks_bench.capture import capture_ids

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(tmp_path)
    ids = torch.randint(0, 64, (40,)).tolist()
    data = capture_ids(tmp_path, ids, [39, 20, 20], log=lambda m: None)
    assert data["k"].shape == (2, 2, 40, 8) and data["v"].shape == (2, 2, 40, 8)
    assert data["q"].shape == (2, 4, 2, 8) and data["positions"].tolist() == [20, 39]
    assert data["meta"]["tokens"] == 40 and data["meta"]["check_max_rel_err"] <= 1e-4
