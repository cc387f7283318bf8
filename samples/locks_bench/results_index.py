"""``samples/results/INDEX.md``: one row per run folder of ``samples/results/`` (folder, what it measured, headline
figure, files), generated from what each folder holds (``samples/make_benchmarks.py``), so it cannot drift from them.

- what it measured: the scripts the folder's result files and ``MANIFEST.md`` name, and the manifest's first
  sentence after its title (left out where the manifest lists only commands and files);
- headline figure: read from the result files of the kinds below (:data:`FIGURES`), at most three a folder; empty
  for a folder holding none of them (its manifest tells);
- files: the folder's entries (sub-folders end in ``/``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

#: a manifest paragraph that only introduces the commands or files listed below it
GENERATED = ("Commands (", "Command (", "Command:", "Files:")
#: longest "what it measured" sentence kept whole (characters)
SENTENCE_CHARS = 160
#: cells of one result file named in its headline figure
CELLS = 4


def _k(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else f"{tokens:,}"


def _some(cells: list[str]) -> str:
    return ", ".join(cells[:CELLS]) + (" ..." if len(cells) > CELLS else "")


def tpot(doc: dict, name: str) -> str | None:
    """``bench_e2e.py`` (``cells``) and ``bench_app_engine.py`` (``contexts``) results: TPOT a context."""
    cells = doc.get("cells") if "backend" in doc else doc.get("contexts") if "config" in doc else None
    timed = [c for c in cells or [] if isinstance(c, dict) and "tpot_ms" in c]
    if not timed:
        return None
    label = name.removeprefix("result-").removesuffix(".json")
    return f"{label} TPOT " + _some([f"{_k(c['context'])}" + (f" x {c['batch']}" if c.get("batch", 1) > 1 else "")
                                     + f" {c['tpot_ms']:.2f} ms" for c in timed])


def ruler(doc: dict, name: str) -> str | None:
    """``bench_ruler.py`` results: the mean accuracy over tasks of each setting at each length."""
    if not isinstance(doc.get("table"), list) or "settings" not in doc:
        return None
    cells: dict[tuple, list[float]] = {}
    for row in doc["table"]:
        cells.setdefault((row["context"], row["setting"]), []).append(row["accuracy"])
    return "RULER " + _some([f"{_k(ctx)} {setting} {sum(acc) / len(acc):.1f} ({len(acc)} task{'s' * (len(acc) > 1)})"
                             for (ctx, setting), acc in cells.items()])


def needle(doc: dict, name: str) -> str | None:
    """``bench_needle.py`` results: trials answered of each mode and budget."""
    rows = [r for run in doc.get("runs") or [] if isinstance(run, dict) for r in run.get("summary") or []]
    if not rows:
        return None
    return "needle " + _some([f"{_k(r['context'])} {r['mode']} {r['budget_frac']:.0%} "
                              f"{round(r['accuracy'] * r['trials'])}/{r['trials']}" for r in rows])


def mass(doc: dict, name: str) -> str | None:
    """``check_two_level.py`` results: mass kept over the oracle's, two-level against flat, first context."""
    rows = doc.get("summary")
    if not (isinstance(rows, list) and rows and isinstance(rows[0], dict) and "two_level" in rows[0]):
        return None
    row, two, flat = rows[0], rows[0]["two_level"], rows[0]["flat"]
    return (f"mass kept {_k(row['context'])} {row['budget_frac']:.0%}: two-level mean {two['mean']:.4f}, worst "
            f"layer {two['worst_layer_mean']:.4f} (flat {flat['mean']:.4f} / {flat['worst_layer_mean']:.4f})")


def fuzz(doc: dict, name: str) -> str | None:
    """``fuzz_ingest.py`` results: inputs, problems, hangs and crashes."""
    t = doc.get("totals")
    if not isinstance(t, dict) or "per_kind" not in doc:
        return None
    return f"{t['inputs']:,} inputs: {t['problems']} problems, {t['hangs']} hangs, {t['crashes']} crashes"


def cpu_decode(doc: dict, name: str) -> str | None:
    """``bench_cpu_decode.py`` results: median TPOT of each mode."""
    rows = [r for r in doc.get("results") or [] if isinstance(r, dict) and "tpot_ms_median" in r]
    if not rows:
        return None
    return "CPU TPOT " + _some([f"{r['mode']} {r.get('dtype', '')} {r['tpot_ms_median']:.1f} ms" for r in rows])


def smoke(doc: dict, name: str) -> str | None:
    """``gpu_smoke.py`` results: checks and failures."""
    if not (isinstance(doc.get("checks"), dict) and "failures" in doc):
        return None
    return f"smoke: {len(doc['checks'])} checks, {len(doc['failures'])} failures"


#: the readers of a headline figure, tried in order on every result file
FIGURES = (tpot, ruler, needle, mass, fuzz, cpu_decode, smoke)


def _json_files(folder: Path) -> list[tuple[Path, dict | list]]:
    out = []
    for path in sorted(folder.rglob("*.json")):
        try:
            out.append((path, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue
    return out


def _commands(value) -> list[str]:
    """Every command string or argv word found under ``command`` keys of a result file."""
    if isinstance(value, dict):
        return [w for k, v in value.items() for w in (_flatten(v) if k == "command" else _commands(v))]
    return [w for v in value for w in _commands(v)] if isinstance(value, list) else []


def _flatten(value) -> list[str]:
    return [value] if isinstance(value, str) else [w for v in value for w in _flatten(v)] \
        if isinstance(value, list) else []


def scripts(manifest: str, docs: list) -> list[str]:
    """The sample scripts a folder's result files and manifest name (``bench_e2e.py``), first seen first."""
    text = " ".join(_commands([doc for _, doc in docs])) + " " + manifest
    found = re.findall(r"samples/((?:\w+/)*\w+\.(?:py|sh))", text)
    return list(dict.fromkeys(found))


def first_sentence(manifest: str) -> str:
    """The manifest's first sentence after its title, one line, without emphasis; cut at a word past
    :data:`SENTENCE_CHARS`. Empty when the first paragraph only introduces commands or files."""
    body = manifest.split("\n", 1)[1] if manifest.startswith("#") else manifest
    paragraph = next((p for p in body.split("\n\n") if p.strip()), "").strip()
    if not paragraph or paragraph.startswith(GENERATED):
        return ""
    text = " ".join(paragraph.replace("**", "").split())
    end = text.find(". ")
    text = text if end < 0 else text[: end + 1]
    if len(text) > SENTENCE_CHARS:
        text = text[: text.rfind(" ", 0, SENTENCE_CHARS)] + " ..."
    return text


def row(folder: Path) -> str:
    """The index row of one run folder."""
    manifest_path = folder / "MANIFEST.md"
    manifest = manifest_path.read_text() if manifest_path.is_file() else ""
    docs = _json_files(folder)
    named = ", ".join(f"`{s}`" for s in scripts(manifest, docs))
    what = "; ".join(part for part in (named, first_sentence(manifest)) if part) or "-"
    figures = [f for path, doc in docs if isinstance(doc, dict)
               for f in [next((r for r in (read(doc, path.name) for read in FIGURES) if r), None)] if f]
    headline = "; ".join(dict.fromkeys(figures[:3])) + (" ..." if len(figures) > 3 else "") or "-"
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    files = ", ".join(f"`{e}`" for e in entries)
    cells = [f"[{folder.name}]({folder.name}/)", what, headline, files]
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def index_md(results: Path) -> str:
    """The text of ``INDEX.md`` for the run folders in ``results`` (sub-folders, oldest first)."""
    lines = ["# Run folders", "",
             "Generated by `python samples/make_benchmarks.py` from the folders here (do not edit by hand): each",
             "folder's scripts and the first sentence of its `MANIFEST.md`, a headline figure read from its result",
             "files where their kind is known, and its files. The summary files beside them feed `../BENCHMARKS.md`.",
             "", "| folder | what it measured | headline figure | files |", "|---|---|---|---|"]
    lines += [row(folder) for folder in sorted(p for p in results.iterdir() if p.is_dir())]
    return "\n".join(lines) + "\n"
