"""RULER samples built once per task, length and seed, and kept (``samples/bench_ruler.py --docs-cache``).

lm-eval's RULER tasks draw 500 samples whenever a task is built (``lm_eval/tasks/ruler/*_utils.py``: haystacks
sized with the model's tokenizer), of which a run uses the first ``--limit``. At 16K tokens that takes about a
minute a task on one CPU core, and bench_ruler builds every task again for every setting, in the setting's own
engine process: at 16K and 32K the sample building costs more time than the evaluation on a GPU. Built once with
the same seed, the samples are the same for every setting (the tasks draw them from Python's and numpy's global
generators, which bench_ruler seeds before building each task), so the first ``limit`` of them are kept in a
file and handed to lm-eval in place of the task's own ``download``. A file is used only when its fingerprint
(task, length, seed, lm-eval's version, the tokenizer's files) matches and it holds at least ``limit`` samples;
otherwise the task is built as usual and the file written.

File: ``<cache>/<task>_<length>_seed<seed>.json.gz``, JSON ``{"fingerprint": {...}, "docs": [...]}``.
Nothing here imports lm-eval at module level.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

#: tokenizer files whose bytes decide how RULER sizes its haystacks
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model")


def tokenizer_digest(model_dir: str | Path) -> str:
    """sha256 (hex, 16 characters) over the tokenizer files present in ``model_dir``, by name."""
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = Path(model_dir) / name
        if path.is_file():
            h.update(name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def fingerprint(task: str, length: int, seed: int, lm_eval_version: str, model_dir: str | Path) -> dict[str, Any]:
    """What a kept file must match to stand in for building ``task`` at ``length`` tokens with ``seed``."""
    return {"task": task, "length": length, "seed": seed, "lm_eval": lm_eval_version,
            "tokenizer": tokenizer_digest(model_dir)}


def docs_path(cache_dir: str | Path, task: str, length: int, seed: int) -> Path:
    return Path(cache_dir) / f"{task}_{length}_seed{seed}.json.gz"


def read_docs(path: str | Path, expected: dict[str, Any], limit: int) -> list[dict] | None:
    """The first ``limit`` samples kept in ``path``, or None when the file is missing, unreadable, of another
    fingerprint, or holds fewer than ``limit`` samples (then the task is built again)."""
    try:
        data = json.loads(gzip.decompress(Path(path).read_bytes()))
    except (OSError, EOFError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("fingerprint") != expected:
        return None
    docs = data.get("docs")
    if not isinstance(docs, list) or len(docs) < limit:
        return None
    return docs[:limit]


def write_docs(path: str | Path, fp: dict[str, Any], docs: list[dict]) -> Path:
    """Write ``docs`` with their fingerprint, atomically (a temporary file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = gzip.compress(json.dumps({"fingerprint": fp, "docs": docs}).encode(), mtime=0)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_task(manager: Any, task: str, length: int, seed: int, limit: int, model_dir: str | Path,
              cache_dir: str | Path | None) -> tuple[Any, str]:
    """lm-eval's task object for ``task`` (``manager.load``), with its samples from the kept file when one fits,
    else built by the task itself (Python's and numpy's generators seeded with ``seed`` first, as bench_ruler
    always did) and, with a ``cache_dir``, kept. Returns the task and ``"kept"`` or ``"built"``.

    The kept samples reach lm-eval through ``ConfigurableTask.download`` (``lm_eval/api/task.py``), replaced for
    the duration of this call only: the task sets ``self.dataset`` there, a ``DatasetDict`` of its test split.
    """
    import random

    import lm_eval
    import numpy as np

    fp = fingerprint(task, length, seed, lm_eval.__version__, model_dir)
    path = docs_path(cache_dir, task, length, seed) if cache_dir is not None else None
    docs = read_docs(path, fp, limit) if path is not None else None
    if docs is not None:
        return _load_with_docs(manager, task, docs), "kept"
    random.seed(seed)
    np.random.seed(seed)
    task_obj = manager.load([task])["tasks"][task]
    if path is not None:
        split = task_obj.dataset[task_obj.config.test_split]
        write_docs(path, fp, [split[i] for i in range(min(limit, len(split)))])
    return task_obj, "built"


def _load_with_docs(manager: Any, task: str, docs: list[dict]) -> Any:
    import datasets
    from datasets.table import InMemoryTable
    from lm_eval.api.task import ConfigurableTask

    original = ConfigurableTask.download

    # the docs' own digest as the dataset's fingerprint: ``Dataset.from_list`` would hash the table and its
    # features with dill, which failed on one GPU machine (pyarrow 26 under Python 3.12.3: "Can't pickle
    # MonthDayNano") and is not needed, the samples being fixed
    table = InMemoryTable.from_pylist(docs)
    digest = hashlib.sha256(json.dumps(docs, sort_keys=True).encode()).hexdigest()[:16]

    def download(self, dataset_kwargs=None, **kwargs) -> None:
        self.dataset = datasets.DatasetDict({self.config.test_split: datasets.Dataset(table, fingerprint=digest)})

    ConfigurableTask.download = download
    try:
        return manager.load([task])["tasks"][task]
    finally:
        ConfigurableTask.download = original
