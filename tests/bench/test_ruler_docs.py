"""RULER samples kept between settings and machines (``locks_bench.ruler_docs``): the file, its fingerprint, and
the task loading that uses it. The file logic runs everywhere; the two tests that hand samples to lm-eval skip
without the ``ruler`` extra (CI does not install it)."""

from __future__ import annotations

import gzip
import json
import random
import types

import pytest

from locks_bench import ruler_docs

DOCS = [{"input": f"haystack {i}", "outputs": [str(i)], "length": 100 + i, "max_length": 4096, "gen_prefix": ""}
        for i in range(6)]


def model_dir(tmp_path, text="{}"):
    path = tmp_path / "model"
    path.mkdir(exist_ok=True)
    (path / "tokenizer.json").write_text(text)
    return path


def test_round_trip_keeps_the_first_limit_samples(tmp_path):
    fp = ruler_docs.fingerprint("niah_single_1", 16384, 1234, "0.4.13", model_dir(tmp_path))
    path = ruler_docs.write_docs(ruler_docs.docs_path(tmp_path / "cache", "niah_single_1", 16384, 1234), fp, DOCS)
    assert path.name == "niah_single_1_16384_seed1234.json.gz"
    assert ruler_docs.read_docs(path, fp, 4) == DOCS[:4]
    assert ruler_docs.read_docs(path, fp, 6) == DOCS
    assert ruler_docs.read_docs(path, fp, 7) is None  # fewer kept than asked: build again
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


@pytest.mark.parametrize("field, value", [("task", "niah_single_2"), ("length", 32640), ("seed", 1),
                                          ("lm_eval", "0.4.14"), ("tokenizer", "another")])
def test_another_fingerprint_is_not_used(tmp_path, field, value):
    fp = ruler_docs.fingerprint("niah_single_1", 16384, 1234, "0.4.13", model_dir(tmp_path))
    path = ruler_docs.write_docs(tmp_path / "docs.json.gz", fp, DOCS)
    assert ruler_docs.read_docs(path, {**fp, field: value}, 1) is None


def test_the_tokenizer_is_part_of_the_fingerprint(tmp_path):
    before = ruler_docs.tokenizer_digest(model_dir(tmp_path, '{"a": 1}'))
    assert before == ruler_docs.tokenizer_digest(model_dir(tmp_path, '{"a": 1}'))
    assert before != ruler_docs.tokenizer_digest(model_dir(tmp_path, '{"a": 2}'))


@pytest.mark.parametrize("content", [b"", b"not gzip", gzip.compress(b"not json"), gzip.compress(b"[1, 2]"),
                                     gzip.compress(json.dumps({"fingerprint": {}, "docs": "x"}).encode())],
                         ids=["empty", "not-gzip", "not-json", "a-list", "docs-not-a-list"])
def test_a_damaged_file_is_built_again(tmp_path, content):
    path = tmp_path / "docs.json.gz"
    path.write_bytes(content)
    assert ruler_docs.read_docs(path, {}, 1) is None  # {}: the last file's fingerprint matches, its docs do not
    assert ruler_docs.read_docs(tmp_path / "missing.json.gz", {}, 1) is None


class FakeManager:
    """lm-eval's ``TaskManager.load`` for one task: builds its 'samples' from Python's global generator, as the
    RULER tasks do, or, when lm-eval's ``download`` has been replaced, takes what it sets."""

    def __init__(self, download=None):
        self.download, self.builds = download, 0

    def load(self, names):
        task = types.SimpleNamespace(config=types.SimpleNamespace(test_split="test"))
        if self.download is not None:
            self.download(task)
        else:
            self.builds += 1
            draws = [random.random() for _ in range(len(DOCS))]
            task.dataset = {"test": [{**d, "draw": x} for d, x in zip(DOCS, draws)]}
        return {"tasks": {names[0]: task}}


def test_load_task_builds_seeded_then_keeps_then_reuses(tmp_path):
    pytest.importorskip("lm_eval")
    from lm_eval.api.task import ConfigurableTask

    model, cache = model_dir(tmp_path), tmp_path / "cache"
    manager = FakeManager()
    task, how = ruler_docs.load_task(manager, "niah_single_1", 16384, 1234, 4, model, cache)
    assert how == "built" and manager.builds == 1
    random.seed(1234)
    assert [d["draw"] for d in task.dataset["test"]] == [random.random() for _ in DOCS]  # seeded before building
    kept = task.dataset["test"][:4]

    # the next setting: lm-eval's own download is replaced while the task loads, and only then
    original = ConfigurableTask.download
    reuse = FakeManager(download=lambda t: ConfigurableTask.download(t))
    task2, how2 = ruler_docs.load_task(reuse, "niah_single_1", 16384, 1234, 4, model, cache)
    assert how2 == "kept" and reuse.builds == 0
    assert task2.dataset["test"].to_list() == kept
    assert ConfigurableTask.download is original

    # more samples than kept, or no cache: built again
    assert ruler_docs.load_task(FakeManager(), "niah_single_1", 16384, 1234, 5, model, cache)[1] == "built"
    assert ruler_docs.load_task(FakeManager(), "niah_single_1", 16384, 1234, 4, model, None)[1] == "built"


def test_kept_samples_load_without_hashing_the_dataset(tmp_path, monkeypatch):
    """Kept samples become lm-eval's dataset with their digest as its fingerprint: datasets' dill hashing of the
    table, which failed on a GPU machine ("Can't pickle MonthDayNano"), is never asked for."""
    pytest.importorskip("lm_eval")
    import pickle

    import datasets.fingerprint
    from lm_eval.api.task import ConfigurableTask

    model, cache = model_dir(tmp_path), tmp_path / "cache"
    ruler_docs.load_task(FakeManager(), "niah_single_1", 16384, 1234, 4, model, cache)

    def no_hashing(*args, **kwargs):
        raise pickle.PicklingError("Can't pickle <class 'MonthDayNano'>")

    monkeypatch.setattr(datasets.fingerprint.Hasher, "hash", no_hashing)
    monkeypatch.setattr(datasets.fingerprint.Hasher, "update", no_hashing)
    task, how = ruler_docs.load_task(FakeManager(download=lambda t: ConfigurableTask.download(t)), "niah_single_1",
                                     16384, 1234, 4, model, cache)
    assert how == "kept" and len(task.dataset["test"]) == 4
    assert task.dataset["test"]._fingerprint
