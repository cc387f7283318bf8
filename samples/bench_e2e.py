"""End-to-end decode benchmark in vLLM: LOCKS vs vLLM's FLASH_ATTN backend at long contexts (GPU machine).

vLLM with ``load_format="dummy"`` at real model shapes (a ``config.json`` written here, Llama architecture,
``max_position_embeddings`` = the context), ``skip_tokenizer_init=True`` with seeded random prompt token ids,
greedy decoding with ``ignore_eos``, CUDA graphs and prefix caching on (vLLM's defaults, graph capture sizes
limited to the batch sizes used). Each engine (shape, depth, backend) runs in its own process, one after the
other, and serves every context of the run:

- prefill: the first request of a prompt, timed whole: ``max_tokens=2``, the prompt and one decode step (TTFT of a
  cold prompt and the step after it, where ``candidates="auto"`` calibrates each layer once per prompt);
- TPOT: the same prompt again, now cached, generating ``n1`` and then ``n2`` tokens; TPOT is the time difference
  over ``n2 - n1`` (per-request costs cancel), repeated ``--reps`` times: median and spread are reported;
- batch: ``--batch`` sequences of distinct prompts at once, the same two lengths (decode throughput);
- sparsity: the pages LOCKS read, from the statistics ring the app reads (written on the device inside the CUDA
  graphs, ``locks_engine.vllm_backend.device_stats``; ``--no-stats`` runs without it, for its cost); eager decode
  calls of the attention backend are counted too, so a silent fallback from CUDA graphs to eager shows
  (expected: 0 after capture);
- the backend's metadata build time per step (host), and the GPU memory of LOCKS' page summaries;
- ``--profile-steps N``: torch's profiler over N decode tokens (kernels inside the CUDA graph, device busy time per
  step against the wall time); ``--py-spy-steps N``: py-spy over N decode tokens, this process and vLLM's engine
  processes, host time per step by process and Python function (py-spy found through ``$PY_SPY``, ``PATH`` or the
  ``bin`` folder of a ``pip install --target`` directory on ``sys.path``; carry its wheel to the GPU machine);
- ``--no-prefix-walk``: both engines with cascade attention off and vLLM 0.26's per-step walk of the running
  request's block list cut (``locks_bench.scheduler``): the host floor at 1M without that walk.

Shapes: ``llama3.1-8b`` (32 layers, 32 query / 8 KV heads, D 128, hidden 4096) and ``glm4-9b-1m`` (GLM-4-9B-1M-like:
hidden 4096, 32 query / 2 KV heads, D 128, 40 layers at full depth; Llama architecture). ``--layers`` runs shallow
variants: the per-layer decode time is the slope of TPOT over depth, the intercept the per-step fixed cost; the
full-depth TPOT extrapolated from them is labelled ``extrapolated``. With ``--profile-steps`` at two or more depths
the summary also fits the profiled GPU kernel time per step (``fit.device``), which host waits do not flatten.

Usage (GPU machine, vLLM 0.26 and this project installed; each command under 10 minutes)::

    python samples/bench_e2e.py --shape llama3.1-8b --contexts 32768,131072,262144 --batch 131072:5,262144:2 \\
        --backends flash --out OUT
    python samples/bench_e2e.py --shape llama3.1-8b ... --backends locks --out OUT
    python samples/bench_e2e.py --shape glm4-9b-1m --layers 8 --contexts 1048576 --out OUT
    python samples/bench_e2e.py --summarize OUT [OUT2 ...] --json samples/results/e2e.json   # rows, fits
    python samples/plot_e2e.py samples/results/e2e.json                                      # the figure

Writes ``result-<engine>.json`` per engine (with the command, machine, date and commit) and ``bench.log`` (the
engines' output) in ``--out``; prints a table last. The summary (``--summarize``) is ``locks_bench.e2e_fit``. Exit status 1 when an engine fails or a check fails (LOCKS reads every page, eager decode after capture).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from locks_bench import e2e_fit
from locks_bench.e2e import (
    BACKENDS,
    bench_prompt,
    build_parser,
    child_args,
    decode_pages,
    engine_name,
    kv_bytes_per_token,
    merge_probes,
    model_config,
    parse_batches,
    parse_ints,
    prefix_walk_kwargs,
    selection_settings,
)
from locks_bench.engines import find_py_spy, run_engine_process, summarize_py_spy
from locks_bench.probes import (
    install_probes,
    read_probes,
    reset_probes,
    start_profile,
    stop_profile_summary,
)
from locks_bench.results import header
from locks_engine.config import LocksConfig

CHILD_START = time.perf_counter()
#: seconds past ``--time-limit`` in which ``--profile-steps`` may still start (``--timeout`` keeps 120 s spare)
PROFILE_GRACE_S = 100


def run_header(args: argparse.Namespace) -> dict:
    """The result's command (the parent's, rebuilt from the engine's arguments), machine, date and commit."""
    argv = ["--backends", args.backend, "--layers", args.layers or "", *child_args(args)]
    return header("bench_e2e.py", argv)


def run_engine(args: argparse.Namespace) -> dict:
    """One engine: every context of the run; returns the result dict (also written by the caller)."""
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model sends the probe functions
    from locks_engine.engine import EngineOptions, LocksEngine

    contexts = parse_ints(args.contexts)
    batches = parse_batches(args.batch)
    n1, n2 = parse_ints(args.decode)
    max_len = max(contexts) + n2 + 64
    cfg = model_config(args.shape, int(args.layers) if args.layers else None, max_len)
    model_dir = Path(args.out) / f"model-{args.shape}-{cfg['num_hidden_layers']}"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    locks = args.backend.startswith("locks")
    per_token = kv_bytes_per_token(cfg, args.tp)
    seqs = max([1, *[batches.get(c, 1) for c in contexts]])
    # KV for the largest (context x batch) cell, with 2% and 1 GiB of slack; LOCKS' summaries come on top
    need_tokens = max(c * batches.get(c, 1) for c in contexts) + seqs * (n2 + 64)
    kv_bytes = int(need_tokens * per_token * 1.02) + (1 << 30)
    locks_cfg = LocksConfig(budget=args.budget, rank=args.rank, dense=not locks,
                            **selection_settings(args.backend, args.candidates, cfg["num_hidden_layers"]),
                            **({"summary_format": args.summary_format} if args.summary_format else {}))
    capture = sorted({1, *batches.values()})
    # the app's engine (locks_engine.LocksEngine): its platform arguments, its statistics ring (counted on the
    # device inside the CUDA graphs), here with dummy weights and a KV cache sized to the run
    options = EngineOptions(
        model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", max_model_len=max_len,
        locks=locks_cfg, kv_cache_gib=kv_bytes / 2**30, max_num_seqs=seqs, enforce_eager=args.eager or None,
        tensor_parallel_size=args.tp, cudagraph_capture_sizes=tuple(capture), stats=locks and not args.no_stats,
        engine_args={"enable_prefix_caching": True, **prefix_walk_kwargs(args.no_prefix_walk)},
    )
    start = time.perf_counter()
    engine = LocksEngine(options)
    start_s = time.perf_counter() - start
    try:
        return measure_engine(engine, args, cfg, contexts, batches, (n1, n2), start_s, kv_bytes)
    finally:
        engine.close()


def measure_engine(engine, args: argparse.Namespace, cfg: dict, contexts: list[int], batches: dict[int, int],
                   decode: tuple[int, int], start_s: float, kv_bytes: int) -> dict:
    """Every cell of one started engine (then the profiles asked for); returns the result dict."""
    import torch

    n1, n2 = decode
    locks = args.backend.startswith("locks")
    engine.llm.apply_model(install_probes)
    free = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0
    result = {
        **run_header(args),
        "shape": args.shape, "layers": cfg["num_hidden_layers"], "backend": args.backend, "tp": args.tp,
        "budget": args.budget if locks else None, "rank": args.rank if locks else None,
        "summary_format": (args.summary_format or LocksConfig().summary_format) if locks else None,
        **(selection_settings(args.backend, args.candidates, cfg["num_hidden_layers"]) if locks else {}),
        # a name for the kernels' version (--kernels), so that summaries fit depths within one version only
        "kernels": args.kernels if locks else None,
        # False: vLLM's per-step common-prefix walk cut (--no-prefix-walk, locks_bench.scheduler)
        "prefix_walk": not args.no_prefix_walk,
        # which GPU ran it (a hash of its UUID): summaries fit depths and pair rows within one machine
        "machine": machine_tag(torch),
        "statistics": engine.ring is not None,
        # decode without CUDA graphs: --eager, or the CPU (the check of eager decode calls then does not apply)
        "eager": bool(engine.llm.vllm_config.model_config.enforce_eager),
        "engine_start_s": round(start_s, 1), "kv_cache_bytes": kv_bytes, "n1": n1, "n2": n2, "reps": args.reps,
        "gpu_free_after_start_gib": round(free / 2**30, 1), "cells": [],
    }
    deadline = CHILD_START + args.time_limit
    # batch-1 cells first (TPOT, prefill), then the batched ones (throughput)
    plan = [(ctx, 1) for ctx in contexts] + [(ctx, batches[ctx]) for ctx in contexts if batches.get(ctx, 1) > 1]
    for ctx, batch in plan:
        if time.perf_counter() > deadline:
            result["cells"].append({"context": ctx, "batch": batch, "skipped": "--time-limit"})
        else:
            cell = measure(engine, ctx, batch, n1, n2, args, cfg)
            result["cells"].append(cell)
            print(json.dumps({k: v for k, v in cell.items() if k != "tpot_ms_reps"}), flush=True)
        save_result(args, result)  # after every cell: a timed-out engine keeps what it measured
    # the profile is a few seconds of decode: it may start up to PROFILE_GRACE_S past the cells' deadline
    if args.profile_steps and time.perf_counter() < deadline + PROFILE_GRACE_S:
        result["profile"] = profile_decode(engine, max(contexts), args.profile_steps, args, cfg)
        save_result(args, result)
    if args.py_spy_steps and time.perf_counter() < deadline + PROFILE_GRACE_S:
        result["host_profile"] = py_spy_decode(engine, max(contexts), args.py_spy_steps, args, cfg)
        save_result(args, result)
    return result


def profile_decode(engine, ctx: int, steps: int, args, cfg: dict) -> dict:
    """Torch profiler in every worker around ``steps`` decode tokens on the cached batch-1 prompt of ``ctx``
    tokens (measured before, so its prefix is cached): per rank, the top kernels by self device time and the top
    host ranges by inclusive CPU time, and the device busy time per decode step against the wall time per token
    (a step whose device time is well under its wall time waits on the host).

    Each profiled request starts with a prefill step (the prompt's last tokens) and, with ``candidates="auto"``,
    every layer's calibration after it. A second, shorter window of ``steps // 4`` tokens (at least 2) is
    profiled the same way, and the difference of the two is the decode alone: ``decode_kernel_ms_per_step`` (kernel
    time per decode step) per rank, and ``short_window`` (its ``decode_tokens``, ``kernel_us_total`` and
    ``by_device`` rows, for ``samples/profile_layers.py``'s per-kernel difference)."""
    prompt = bench_prompt(args.seed, ctx, 0, cfg["vocab_size"])  # measure()'s batch-1 prompt: cached
    engine.generate([prompt], 1)
    ranks, elapsed = profile_window(engine, prompt, steps)
    short_steps = max(2, steps // 4)
    short = profile_window(engine, prompt, short_steps)[0] if steps > short_steps else []
    for summary, brief in zip(ranks, short):
        if summary and brief:
            summary["short_window"] = {"decode_tokens": short_steps, "kernel_us_total": brief["kernel_us_total"],
                                       "by_device": brief["by_device"]}
            summary["decode_kernel_ms_per_step"] = round(
                (summary["kernel_us_total"] - brief["kernel_us_total"]) / (steps - short_steps) / 1e3, 3)
    for summary in ranks:
        for rows in (summary.get("by_device", []), summary.get("by_cpu", [])):
            for row in rows:
                row["self_device_us_per_step"] = round(row["self_device_us"] / steps, 2)
                row["cpu_us_per_step"] = round(row["cpu_us"] / steps, 2)
        if summary:
            summary["device_busy_ms_per_step"] = round(summary["kernel_us_total"] / steps / 1e3, 3)
    return {"context": ctx, "decode_tokens": steps, "wall_ms_per_token": round(elapsed / steps * 1e3, 3),
            "ranks": ranks}


def profile_window(engine, prompt: list[int], steps: int) -> tuple[list[dict], float]:
    """One profiled request of ``steps`` tokens on ``prompt``: every rank's ``stop_profile_summary`` and the wall
    time (s)."""
    engine.llm.apply_model(start_profile)
    t0 = time.perf_counter()
    engine.generate([prompt], steps, ignore_eos=True)
    elapsed = time.perf_counter() - t0
    return engine.llm.apply_model(stop_profile_summary), elapsed


def py_spy_decode(engine, ctx: int, steps: int, args, cfg: dict, rate: int = 250) -> dict:
    """Sample this process and its children (vLLM's engine core) with py-spy while ``steps`` tokens are decoded on
    the cached batch-1 prompt of ``ctx`` tokens: where the host's time per decode step goes, by process and Python
    function (``summarize_py_spy``). The raw samples are kept in ``--out``. ``{"skipped": why}`` without py-spy."""
    exe = find_py_spy()
    if exe is None:
        return {"skipped": "py-spy not found (PY_SPY, PATH, or a --target install's bin on sys.path)"}
    prompt = bench_prompt(args.seed, ctx, 0, cfg["vocab_size"])
    engine.generate([prompt], 1)
    raw = Path(args.out) / f"pyspy-{engine_name(args.shape, args.layers, args.backend, args.tp, not args.no_stats)}.txt"
    cmd = [exe, "record", "--pid", str(os.getpid()), "--subprocesses", "--rate", str(rate), "--format", "raw",
           "--output", str(raw), "--nonblocking"]
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)  # attach to every process first
    t0 = time.perf_counter()
    engine.generate([prompt], steps, ignore_eos=True)
    elapsed = time.perf_counter() - t0
    spy.send_signal(signal.SIGINT)  # py-spy writes its samples on SIGINT
    try:
        _, err = spy.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        spy.kill()
        _, err = spy.communicate()
    if not raw.exists():
        return {"skipped": f"py-spy wrote nothing: {' '.join(err.split())[:300]}"}
    # the samples also cover the 2 s attach wait and the request's prefill: per step figures are upper bounds
    summary = summarize_py_spy(raw.read_text(), rate, steps)
    return {"context": ctx, "decode_tokens": steps, "wall_ms_per_token": round(elapsed / steps * 1e3, 3),
            "rate_hz": rate, "raw": raw.name, **summary}


def save_result(args: argparse.Namespace, result: dict) -> None:
    path = Path(args.out) / f"result-{engine_name(args.shape, args.layers, args.backend, args.tp, not args.no_stats)}.json"
    path.write_text(json.dumps(result, indent=1))


def measure(engine, ctx: int, batch: int, n1: int, n2: int, args, cfg: dict) -> dict:
    """Prefill (cold, batch 1 only), then ``reps`` x (n1, n2) generations of the cached prompts."""
    prompts = [bench_prompt(args.seed, ctx, i, cfg["vocab_size"]) for i in range(batch)]
    cell = {"context": ctx, "batch": batch}
    records: list[dict] = []

    def generate(n: int) -> float:
        t0 = time.perf_counter()
        tokens, stats = engine.generate(prompts, n, ignore_eos=True)
        elapsed = time.perf_counter() - t0
        got = [len(t) for t in tokens]
        if got != [n] * batch:
            raise RuntimeError(f"asked for {n} tokens per sequence, got {got}")
        records.extend(stats)
        return elapsed

    # batch 1: a cold prompt and one decode step (a calibrated two-level selection pays its calibration there, not
    # in the timed generations below); batch > 1: prompt 0 is cached, the rest are not
    t_prefill = generate(2)
    if batch == 1:
        cell["prefill_s"] = round(t_prefill, 3)
    engine.llm.apply_model(reset_probes)
    records.clear()
    reps = []
    for _ in range(args.reps):
        short = generate(n1)
        long = generate(n2)
        reps.append((long - short) / (n2 - n1) * 1e3)
    probes = merge_probes(engine.llm.apply_model(read_probes))
    steps = args.reps * (n1 + n2)  # decode steps of the timed generations (first token of each is prefill)
    cell.update({
        "tpot_ms": round(statistics.median(reps), 3),
        "tpot_ms_min": round(min(reps), 3), "tpot_ms_max": round(max(reps), 3),
        "tpot_ms_reps": [round(r, 3) for r in reps],
        "decode_tok_s": round(batch * 1e3 / statistics.median(reps), 1),
        "eager_decode_calls_per_layer": probes["eager_decode_calls"] // max(probes["attention_layers"], 1),
        "metadata_build_us_per_step": round(probes["build_s"] / max(probes["build_calls"], 1) * 1e6, 1),
        "decode_steps": steps,
        "summary_bytes": probes["summary_bytes"],
    })
    pages = decode_pages(records)
    if pages is not None:
        cell["pages_read_frac"] = round(pages["pages_read"] / max(pages["pages_total"], 1), 5)
        cell["decode_pages"] = pages
    return cell


def main() -> int:
    parser = build_parser(__doc__.split("\n\n")[0])
    args = parser.parse_args()
    if args.summarize is not None:
        return e2e_fit.summarize(args.summarize, args.json, args.meta)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        save_result(args, run_engine(args))
        return 0
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = [b for b in backends if b not in BACKENDS]
    if bad:
        parser.error(f"unknown backends {bad}: allowed {', '.join(BACKENDS)}")
    depths = [str(d) for d in parse_ints(args.layers)] or [""]
    failures, results, start = [], [], time.perf_counter()
    with open(out / "bench.log", "a") as log:
        for depth in depths:
            for backend in backends:
                name = engine_name(args.shape, depth, backend, args.tp, not args.no_stats)
                left = min(args.timeout, args.total_s - (time.perf_counter() - start))
                if left < 60:
                    failures.append(f"{name}: not run (--total-s spent)")
                    continue
                (out / f"result-{name}.json").unlink(missing_ok=True)
                log.write(f"\n===== {name} =====\n")
                log.flush()
                limit = min(args.time_limit, left - 120)  # 120 s for the cell in flight, the profile, the exit
                cmd = [sys.executable, __file__, "--child", "--backend", backend, "--layers", depth,
                       *child_args(args), "--time-limit", str(limit)]
                print(f"{name}: cells start within {limit:.0f} s of the engine's process start (engine start "
                      f"included), killed after {left:.0f} s", flush=True)
                t0 = time.perf_counter()
                env = dict(os.environ)
                if backend == "flash":
                    env["LOCKS_OVERRIDE_CPU_ATTN"] = "0"  # CPU only: vLLM's own CPU_ATTN is the dense baseline
                rc = run_engine_process(cmd, log, left, env)
                path = out / f"result-{name}.json"
                if path.exists():
                    results.append(json.loads(path.read_text()))  # partial when the engine timed out
                if rc != 0:
                    failures.append(f"{name}: rc {rc} (see bench.log)")
                print(f"{name}: rc {rc} in {time.perf_counter() - t0:.0f} s", flush=True)
    failures += check(results)
    print_table(results)
    print("RESULT:", "PASS" if not failures else "FAIL\n  " + "\n  ".join(failures))
    return 1 if failures else 0


def machine_tag(torch) -> str | None:
    """A short tag of the first visible GPU: the first 10 hex digits of the SHA-256 of its UUID (no serial
    number in the results); None without CUDA. FlashAttention-3's decode time differs by up to a third between
    H200s of equal copy bandwidth (kernels/NOTES.md), so per-layer ratios take both backends from one GPU."""
    if not torch.cuda.is_available():
        return None
    uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", "") or "")
    return hashlib.sha256(uuid.encode()).hexdigest()[:10] if uuid else None


def check(results: list[dict]) -> list[str]:
    """Every cell measured (a cell skipped by ``--time-limit`` fails the run: its row is missing); LOCKS read
    fewer pages than there are where the budget is below the context (with its statistics on); no eager decode
    calls after graph capture (unless ``--eager``)."""
    failures = []
    for r in results:
        for c in r["cells"]:
            where = f"{r['shape']} L{r['layers']} {r['backend']} ctx {c['context']} batch {c['batch']}"
            if "skipped" in c:
                failures.append(f"{where}: skipped by {c['skipped']} (engine start {r['engine_start_s']} s)")
                continue
            if r["backend"].startswith("locks") and r.get("statistics", True) and c["context"] > (r["budget"] or 0):
                frac = c.get("pages_read_frac")
                if frac is None or not 0 < frac < 1:
                    failures.append(f"{where}: pages read fraction {frac} (expected in (0, 1))")
            if not r.get("eager") and c["eager_decode_calls_per_layer"] > 0 and "--eager" not in sys.argv:
                failures.append(f"{where}: {c['eager_decode_calls_per_layer']} eager decode calls per layer")
    return failures


def print_table(results: list[dict]) -> None:
    print("\n| shape | layers | backend | context | batch | prefill s | TPOT ms (min-max) | tok/s | pages read "
          "| build us | start s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for c in r["cells"]:
            if "skipped" in c:
                print(f"| {r['shape']} | {r['layers']} | {r['backend']} | {c['context']} | {c['batch']} | skipped |")
                continue
            print(f"| {r['shape']} | {r['layers']} | {r['backend']} | {c['context']} | {c['batch']} "
                  f"| {c.get('prefill_s', '')} | {c['tpot_ms']} ({c['tpot_ms_min']}-{c['tpot_ms_max']}) "
                  f"| {c['decode_tok_s']} | {c.get('pages_read_frac', '')} | {c['metadata_build_us_per_step']} "
                  f"| {r['engine_start_s']} |")


if __name__ == "__main__":
    sys.exit(main())