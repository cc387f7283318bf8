"""GPU smoke test of the LOCKS vLLM backend (vLLM 0.26, one GPU): greedy tokens equal FLASH_ATTN's when the
budget covers the context, and a small budget reads fewer pages than there are.

A small Llama config (4 layers, hidden 1024, 8 query / 2 KV heads, D 128, vocab 32000) with
``load_format="dummy"``, then every weight drawn again from a seeded normal (``--init-std``; vLLM's dummy
weights of +-1e-3 give near-flat logits, so greedy ties would decide the tokens), a seeded 4K-token prompt,
64 greedy tokens. Each mode runs in its own process, one after the other:

- ``flash``: vLLM's FLASH_ATTN backend (the reference);
- ``locks``: LOCKS, budget 65536 tokens (>= context: must give FLASH_ATTN's tokens);
- ``locks512``: LOCKS, budget 512, with the statistics ring: pages read per decode step < pages there are;
- ``flash_graph``, ``locks_graph``: the first two with CUDA graphs (no ``enforce_eager``);
- ``flash_graph_tp2``, ``locks_graph_tp2``, ``locks512_tp2``: the same at tensor-parallel size 2 (two GPUs; the
  model's heads must split in two): TP=2 tokens must equal TP=1's, and the statistics of both ranks are merged.

With ``--model DIR --prompt-ids FILE`` a real model runs instead (its own weights, no redraw; the prompt's token
ids from the JSON file's ``prompt_token_ids``): the correctness check on a real model.

Usage (GPU machine, vLLM 0.26 on PYTHONPATH)::

    python samples/gpu_smoke.py --out /tmp/smoke                       # flash, locks, locks512 (eager)
    python samples/gpu_smoke.py --modes flash_graph,locks_graph --out /tmp/smoke
    python samples/gpu_smoke.py --model BUILTIN_DIR --prompt-ids prompt.json \
        --modes flash,locks,locks512,flash_graph,locks_graph --out /tmp/smoke-real
    # TP=2 against TP=1 on the evaluation model (14 query / 2 KV heads split in two), CUDA graphs, fp16:
    python samples/gpu_smoke.py --model MODEL_DIR --write-prompt ../shared/data/books/milton_paradise_lost.txt p.json \
        "Paradise Lost"
    CUDA_VISIBLE_DEVICES=0 python samples/gpu_smoke.py --model MODEL_DIR --prompt-ids p.json --dtype float16 \
        --gen 96 --kv-gib 4 --modes locks_graph --out /tmp/smoke-tp
    python samples/gpu_smoke.py --model MODEL_DIR --prompt-ids p.json --dtype float16 --gen 96 --kv-gib 4 \
        --modes locks_graph_tp2 --out /tmp/smoke-tp      # checks locks_graph_tp2 == locks_graph

Writes ``smoke.json`` (every mode's tokens, timings, statistics) and ``smoke.log`` (the engines' output) in
``--out``, prints a table last; exit status 1 when a check fails or a mode does not run. A divergence is
reported with both runs' logprob gap between the two tokens: two correct attention kernels part at the first
near-tie of the logits (H200, 2026-11-29: bf16 at token 1, an exact tie in FLASH_ATTN's run; fp16 at token 28,
0.002 nats; results in ``samples/results/2026-11-29_gpu_*/gpu_smoke.json``), so ``--dtype float16`` is the stricter check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from locks_bench.engines import run_engine_process  # one process group per engine, killed whole
from locks_bench.results import header, write_result

MODES = {
    "flash": {"backend": "FLASH_ATTN", "budget": None, "eager": True},
    "locks": {"backend": "CUSTOM", "budget": 65536, "eager": True},
    "locks512": {"backend": "CUSTOM", "budget": 512, "eager": True, "stats": True},
    "flash_graph": {"backend": "FLASH_ATTN", "budget": None, "eager": False},
    "locks_graph": {"backend": "CUSTOM", "budget": 65536, "eager": False},
    "flash_graph_tp2": {"backend": "FLASH_ATTN", "budget": None, "eager": False, "tp": 2},
    "locks_graph_tp2": {"backend": "CUSTOM", "budget": 65536, "eager": False, "tp": 2},
    "locks512_tp2": {"backend": "CUSTOM", "budget": 512, "eager": True, "stats": True, "tp": 2},
}
#: (mode, reference): greedy tokens must be equal.
TOKEN_CHECKS = [("locks", "flash"), ("locks_graph", "flash_graph"), ("locks_graph", "locks"), ("flash_graph", "flash"),
                ("locks_graph_tp2", "locks_graph"), ("locks_graph_tp2", "flash_graph_tp2"),
                ("flash_graph_tp2", "flash_graph")]

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "vocab_size": 32000,
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def reinit_weights(model, std: float = 0.02, seed: int = 0) -> int:
    """Draw every weight again from a normal seeded by its name (norms: ones); runs in the worker."""
    import zlib

    import torch

    count = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            else:
                gen = torch.Generator(device=param.device).manual_seed(seed + zlib.crc32(name.encode()))
                noise = torch.randn(param.shape, generator=gen, device=param.device, dtype=torch.float32)
                param.copy_((noise * std).to(param.dtype))
            count += 1
    return count


def run_child(mode: str, args: argparse.Namespace) -> dict:
    """One engine, one generation: tokens, top logprobs per step, timings, LOCKS statistics."""
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model sends reinit_weights
    from vllm import LLM, SamplingParams

    spec = MODES[mode]
    model_dir = Path(args.model) if args.model else Path(args.out) / "model"
    extra = {}
    stats_path = Path(args.out) / f"stats-{mode}.bin"
    if spec["budget"] is not None:
        extra["locks"] = {"budget": spec["budget"]}
        if spec.get("stats"):
            extra["locks_stats_path"] = str(stats_path)
    start = time.perf_counter()
    prompt = load_prompt(args)
    llm = LLM(
        model=str(model_dir),
        load_format="auto" if args.model else "dummy",
        skip_tokenizer_init=True,
        dtype=args.dtype,
        max_model_len=len(prompt) + args.gen + 256,
        enforce_eager=spec["eager"],
        attention_backend=spec["backend"],
        additional_config=extra,
        kv_cache_memory_bytes=args.kv_gib << 30,
        tensor_parallel_size=spec.get("tp", 1),
        seed=0,
    )
    start_s = time.perf_counter() - start
    if args.init_std > 0 and not args.model:
        llm.apply_model(lambda model: reinit_weights(model, args.init_std))
    params = SamplingParams(temperature=0.0, max_tokens=args.gen, ignore_eos=True, logprobs=5, detokenize=False)
    t0 = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0]
    gen_s = time.perf_counter() - t0
    result = {
        "mode": mode,
        **spec,
        "engine_start_s": round(start_s, 1),
        "generate_s": round(gen_s, 3),
        "tp": spec.get("tp", 1),
        "args": child_args(args),
        "tokens": list(out.token_ids),
        "logprobs": [{str(t): lp.logprob for t, lp in step.items()} for step in out.logprobs],
    }
    if spec.get("stats"):
        result["stats"] = read_stats(stats_path)
    return result


def write_book_prompt(model_dir: str, book: str, path: str, title: str = "", start: int = 20000,
                      tokens: int = 7000) -> int:
    """Write ``--prompt-ids`` JSON for a real model: ``tokens`` tokens of ``book`` (plain text, from token
    ``start``) in a chat turn asking for a retelling of the passage of ``title`` (default: the file's stem);
    returns the prompt length in tokens. The TP=2 check on the evaluation model used Paradise Lost from token
    20,000 (title "Paradise Lost", 7,051 prompt tokens)."""
    from transformers import AutoTokenizer

    from locks_bench.results import read_prose

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer(read_prose(book), add_special_tokens=False)["input_ids"][start:start + tokens]
    turn = [{"role": "user", "content": f"Read this passage of {title or Path(book).stem}:\n\n{tokenizer.decode(ids)}\n\n"
             "Retell what happens in it, in order, in about ten sentences."}]
    text = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    Path(path).write_text(json.dumps({"prompt_token_ids": prompt, "source": f"{Path(book).name} tokens "
                                      f"{start}-{start + tokens}, chat template, retell instruction"}))
    return len(prompt)


def load_prompt(args: argparse.Namespace) -> list[int]:
    """The prompt's token ids: ``--prompt-ids`` JSON (``prompt_token_ids``), else ``--prompt-len`` seeded ids."""
    if args.prompt_ids:
        return [int(t) for t in json.loads(Path(args.prompt_ids).read_text())["prompt_token_ids"]]
    import numpy as np

    return np.random.default_rng(args.seed).integers(3, CONFIG["vocab_size"], args.prompt_len).tolist()


def read_stats(path: Path) -> dict:
    """Sum the ring's decode steps: pages read vs pages there are, bytes read vs dense."""
    from locks_engine.stats import require_locks

    ring = require_locks(path, timeout_s=10.0)
    written = ring.written()
    records = [r for r in ring.latest(min(written, ring.capacity)) if r["num_decodes"] > 0]
    keys = ("pages_read", "pages_total", "bytes_read", "bytes_dense")
    total = {k: int(sum(int(r[k]) for r in records)) for k in keys}
    last = {f"last_step_{k}": int(records[-1][k]) for k in keys} if records else {}
    layers = {"layers_total": int(ring.header["layers_total"]), "layers_locks": int(ring.header["layers_locks"]),
              "world_size": ring.world_size, "num_kv_heads_all_ranks": ring.num_kv_heads()}
    return {"decode_steps": len(records), **layers, **total, **last}


def compare(mode: dict, ref: dict) -> dict:
    """Equal tokens, or the first divergence with the logprob gap between the two picks in each run."""
    a, b = mode["tokens"], ref["tokens"]
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None and len(a) == len(b):
        return {"equal": True, "first_divergence": None}
    i = first if first is not None else min(len(a), len(b))
    gap = {}
    if first is not None:
        for name, run in (("mode", mode), ("ref", ref)):
            lps = run["logprobs"][i]
            x, y = str(a[i]), str(b[i])
            gap[name] = lps[x] - lps[y] if x in lps and y in lps else None
    return {"equal": False, "first_divergence": i, "tokens": [a[i] if i < len(a) else None, b[i] if i < len(b)
            else None], "logprob_gap": gap}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="flash,locks,locks512", help=f"comma list of {', '.join(MODES)}")
    parser.add_argument("--out", default="smoke-out", help="folder for smoke.json, smoke.log, the model config")
    parser.add_argument("--prompt-len", type=int, default=4096, help="prompt tokens")
    parser.add_argument("--gen", type=int, default=64, help="greedy tokens")
    parser.add_argument("--init-std", type=float, default=0.02, help="std of the redrawn weights (0: vLLM's dummy)")
    parser.add_argument("--kv-gib", type=int, default=2, help="KV cache GiB (summaries come on top)")
    parser.add_argument("--seed", type=int, default=0, help="prompt seed")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"], help="model dtype")
    parser.add_argument("--timeout", type=int, default=420, help="seconds per mode")
    parser.add_argument("--total-s", type=int, default=3600, help="seconds for all modes: later ones are skipped")
    parser.add_argument("--model", default="", help="a real model folder (HF format) instead of the dummy config")
    parser.add_argument("--prompt-ids", default="", help="JSON file with prompt_token_ids (with --model)")
    parser.add_argument("--write-prompt", nargs="+", metavar="BOOK FILE [TITLE]",
                        help="with --model: write FILE (--prompt-ids) from a plain-text BOOK, then exit")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_prompt:
        if not args.model or len(args.write_prompt) not in (2, 3):
            parser.error("--write-prompt BOOK FILE [TITLE] needs --model (its tokenizer and chat template)")
        print(f"{args.write_prompt[1]}: {write_book_prompt(args.model, *args.write_prompt)} prompt tokens")
        return 0
    out = Path(args.out)
    if args.child:
        result = run_child(args.child, args)
        (out / f"result-{args.child}.json").write_text(json.dumps(result))
        return 0
    (out / "model").mkdir(parents=True, exist_ok=True)
    (out / "model" / "config.json").write_text(json.dumps(CONFIG, indent=1))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        parser.error(f"unknown modes {bad}: allowed {', '.join(MODES)}")
    results, failures = {}, []
    start = time.perf_counter()
    with open(out / "smoke.log", "a") as log:
        for mode in modes:
            t0 = time.perf_counter()
            left = min(args.timeout, args.total_s - (t0 - start))
            if left < 20:
                failures.append(f"{mode}: not run (--total-s spent)")
                continue
            log.write(f"\n===== {mode} =====\n")
            log.flush()
            cmd = [sys.executable, __file__, "--child", mode, *child_args(args)]
            rc = run_engine_process(cmd, log, left)
            path = out / f"result-{mode}.json"
            if rc == 0 and path.exists():
                results[mode] = json.loads(path.read_text())
            else:
                failures.append(f"{mode}: did not run (rc {rc}; see smoke.log)")
            print(f"{mode}: rc {rc} in {time.perf_counter() - t0:.0f} s", flush=True)
    # modes run by an earlier invocation into the same --out with the same model, prompt and settings (e.g.
    # the TP=1 modes on one GPU, then the TP=2 modes on two) take part in the checks too
    for mode in MODES:
        path = out / f"result-{mode}.json"
        if mode not in results and path.exists():
            earlier = json.loads(path.read_text())
            if earlier.get("args") == child_args(args):
                results[mode] = {**earlier, "earlier_run": True}
    checks = {}
    for mode, ref in TOKEN_CHECKS:
        if mode in results and ref in results:
            checks[f"{mode}=={ref}"] = c = compare(results[mode], results[ref])
            if not c["equal"]:
                failures.append(f"{mode} vs {ref}: tokens differ at {c['first_divergence']}: {c}")
    for sparse in ("locks512", "locks512_tp2"):
        if sparse in results:
            s = results[sparse]["stats"]
            checks[f"{sparse}_sparse"] = ok = {"pass": 0 < s["pages_read"] < s["pages_total"], **s}
            if not ok["pass"]:
                failures.append(f"{sparse}: pages read {s['pages_read']} not < total {s['pages_total']}")
    summary = {**header("gpu_smoke.py", placeholders={"--model": "MODEL_DIR", "--prompt-ids": "PROMPT_IDS"}),
               "modes": {m: {k: v for k, v in r.items() if k != "logprobs"} for m, r in results.items()},
               "checks": checks, "failures": failures, "args": vars(args)}
    write_result(out / "smoke.json", summary)
    print_table(results, checks, failures)
    return 1 if failures else 0


def child_args(args: argparse.Namespace) -> list[str]:
    return ["--out", args.out, "--prompt-len", str(args.prompt_len), "--gen", str(args.gen),
            "--init-std", str(args.init_std), "--kv-gib", str(args.kv_gib), "--seed", str(args.seed),
            "--dtype", args.dtype, "--model", args.model, "--prompt-ids", args.prompt_ids]


def print_table(results: dict, checks: dict, failures: list[str]) -> None:
    print("\n| mode | backend | budget | eager | start s | gen s | first tokens |")
    print("|---|---|---|---|---|---|---|")
    for m, r in results.items():
        print(f"| {m} | {r['backend']} | {r['budget']} | {r['eager']} | {r['engine_start_s']} | {r['generate_s']} "
              f"| {r['tokens'][:6]} |")
    for name, c in checks.items():
        print(f"check {name}: {json.dumps(c)}")
    print("RESULT:", "PASS" if not failures else "FAIL\n  " + "\n  ".join(failures))


if __name__ == "__main__":
    sys.exit(main())
