"""Capture post-RoPE queries, keys and values of every layer of a model over a book, for ``samples/bench_fidelity.py``.

One forward pass with transformers (CPU, float32, ``attn_implementation="sdpa"``: causal attention without an
``N x N`` matrix) over the first ``tokens`` tokens of a plain-text book. RoPE outputs are recorded by wrapping the
model module's ``apply_rotary_pos_emb`` (as ``tools/make_real_qk_fixture.py`` does; the calls arrive in layer order),
values by a hook on ``v_proj``. Keys and values of every position are kept (float16, ``[L, H, N, D]``); queries
only at the requested positions (float32, ``[L, HQ, T, D]``), so memory stays small at 32K tokens.

Check, per layer (the capture fails otherwise): ``softmax(q k^T / sqrt(D)) v`` from the captured float32 q/k/v
at the kept positions equals the model's own per-head attention output (the input of ``o_proj``) to 1e-4.

The result is cached as one ``.pt`` file per (model, book, tokens, positions); :func:`load_or_capture` reuses it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import torch

from locks_bench.results import first_tokens, read_prose


def query_positions(context: int, steps: int = 64, span: float = 0.125) -> list[int]:
    """``steps`` decode positions spread evenly over the last ``span`` of a ``context``-token text, ending at
    ``context - 1``: each is one decode step that reads every key before it."""
    start = context - 1 - int(context * span)
    return torch.linspace(start, context - 1, steps).round().long().tolist()


def decode_runs(context: int, steps: int = 32, runs: int = 2) -> list[list[int]]:
    """``runs`` runs of ``steps`` consecutive decode positions of a ``context``-token text (the queries a decode
    that teacher-forces the book would see, step after step), for studies that reuse a selection over steps.
    Run ``i`` ends at ``context - 1 - i * context // 16``, so the first ends at the context's last token.

    Raises:
        ValueError: when the runs would start before position 0 or overlap.
    """
    ends = [context - 1 - i * (context // 16) for i in range(runs)]
    if ends[-1] - steps + 1 < 0 or (runs > 1 and context // 16 < steps):
        raise ValueError(f"{runs} runs of {steps} steps do not fit apart in a {context}-token context")
    return [list(range(end - steps + 1, end + 1)) for end in ends]


def cache_path(cache_dir: str | Path, model_dir: str | Path, text: str | Path, tokens: int, positions: list[int]) -> Path:
    """Cache file name: readable prefix plus a hash of everything that changes the capture."""
    key = json.dumps([Path(model_dir).name, Path(text).name, tokens, positions, "v1"])
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    return Path(cache_dir) / f"{Path(model_dir).name}_{Path(text).stem}_{tokens}_{digest}.pt"


def load_or_capture(
    cache_dir: str | Path, model_dir: str | Path, text: str | Path, tokens: int, positions: list[int], log=print
) -> dict:
    """The cached capture, or a new one (saved to the cache first). See :func:`capture`."""
    path = cache_path(cache_dir, model_dir, text, tokens, positions)
    if path.is_file():
        log(f"capture: cached {path}")
        return torch.load(path, weights_only=False)
    start = time.perf_counter()
    data = capture(model_dir, text, tokens, positions, log)
    data["meta"]["capture_s"] = round(time.perf_counter() - start, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(data, tmp)
    tmp.rename(path)
    log(f"capture: {data['meta']['capture_s']} s, saved {path} ({path.stat().st_size / 2**20:.0f} MiB)")
    return data


def capture(model_dir: str | Path, text: str | Path, tokens: int, positions: list[int], log=print) -> dict:
    """Run the model once over the first ``tokens`` tokens of ``text`` and record q (at ``positions``), k and v
    (:func:`capture_ids`; ``meta`` adds ``source_text``).

    Raises:
        SystemExit: the text is too short, or as :func:`capture_ids`.
    """
    from transformers import AutoTokenizer

    ids = first_tokens(AutoTokenizer.from_pretrained(model_dir), read_prose(text), tokens)
    data = capture_ids(model_dir, ids, positions, log)
    data["meta"]["source_text"] = Path(text).name
    return data


def capture_ids(model_dir: str | Path, ids: list[int], positions: list[int], log=print) -> dict:
    """Run the model once over the token ids ``ids`` (``N`` tokens, positions ``0 .. N-1``) and record q (at
    ``positions``), k and v.

    Returns:
        dict: ``k``, ``v`` float16 `[L, H, N, D]`; ``q`` float32 `[L, HQ, T, D]`; ``positions`` int64 `[T]`
        (sorted, distinct); ``meta`` (model config, tokens, versions, date, forward seconds, max check error).
    Raises:
        AssertionError: a position outside ``0 .. N-1``.
        SystemExit: the RoPE wrapper saw the wrong number of calls, or a layer fails the output check.
    """
    import transformers
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    cfg = model.config
    n_layers, n_q, n_kv = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_q
    tokens = len(ids)
    pos = torch.tensor(sorted(set(positions)), dtype=torch.long)
    assert 0 <= int(pos.min()) and int(pos.max()) < tokens, "positions must lie in 0..tokens-1"

    module = sys.modules[type(model.model.layers[0].self_attn).__module__]
    orig_rope = module.apply_rotary_pos_emb
    qs, ks, vs, o_in = [], [], [], []

    def recording_rope(q, k, cos, sin, *a, **kw):
        qe, ke = orig_rope(q, k, cos, sin, *a, **kw)
        qs.append(qe[0][:, pos].detach().clone())  # [HQ, T, D]
        ks.append(ke[0].detach().clone())  # [H, N, D]
        return qe, ke

    hooks = []
    for layer in model.model.layers:
        attn = layer.self_attn
        hooks.append(attn.v_proj.register_forward_hook(
            lambda mod, a, out: vs.append(out[0].view(tokens, n_kv, dim).transpose(0, 1).clone())))
        hooks.append(attn.o_proj.register_forward_pre_hook(
            lambda mod, a: o_in.append(a[0][0][pos].view(len(pos), n_q, dim).transpose(0, 1).clone())))
    module.apply_rotary_pos_emb = recording_rope
    start = time.perf_counter()
    try:
        with torch.no_grad():
            # the decoder stack only: the LM head at 32K tokens would be a 20 GB logits tensor
            model.model(input_ids=torch.tensor([ids]), position_ids=torch.arange(tokens)[None], use_cache=False)
    finally:
        module.apply_rotary_pos_emb = orig_rope
        for hook in hooks:
            hook.remove()
    forward_s = time.perf_counter() - start
    if not len(qs) == len(ks) == len(vs) == len(o_in) == n_layers:
        raise SystemExit(f"captured {len(qs)}/{len(vs)}/{len(o_in)} calls for {n_layers} layers: "
                         "this transformers version applies RoPE elsewhere; the capture needs updating")
    worst = 0.0
    mask = torch.arange(tokens)[None, :] <= pos[:, None]  # [T, N]
    for layer in range(n_layers):
        k = ks[layer].repeat_interleave(n_q // n_kv, dim=0)  # [HQ, N, D]
        v = vs[layer].repeat_interleave(n_q // n_kv, dim=0)
        logits = torch.einsum("htd,hnd->htn", qs[layer], k) / math.sqrt(dim)
        out = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1) @ v  # [HQ, T, D]
        err = ((out - o_in[layer]).abs().max() / o_in[layer].abs().max()).item()
        worst = max(worst, err)
        if err > 1e-4:
            raise SystemExit(f"layer {layer}: captured q/k/v reproduce the model's attention output only to {err:.1e}")
    log(f"capture: {model_dir} {tokens} tokens, forward {forward_s:.0f} s; q/k/v reproduce the model's "
        f"attention output to {worst:.1e} (relative, worst layer)")
    meta = {
        "model": Path(model_dir).name,
        "model_config": {"num_hidden_layers": n_layers, "num_attention_heads": n_q, "num_key_value_heads": n_kv,
                         "head_dim": dim, "model_type": cfg.model_type},
        "tokens": tokens,
        "dtype": "k, v float16; q float32 (captured in float32, sdpa, one forward pass, positions 0..N-1)",
        "forward_s": round(forward_s, 1), "check_max_rel_err": worst,
        "transformers": transformers.__version__, "torch": torch.__version__,
        "threads": torch.get_num_threads(), "date": datetime.date.today().isoformat(),
    }
    return {"k": torch.stack(ks).half(), "v": torch.stack(vs).half(), "q": torch.stack(qs), "positions": pos,
            "meta": meta}


def capture_contexts(tokens: int, captures: list[int], smallest: int = 8192) -> list[int]:
    """Contexts whose decode runs a capture of ``tokens`` tokens holds: ``tokens``, ``tokens / 2``, ... down to
    ``smallest``, less those a shorter capture holds (so a capture's positions, hence its cache file, do not
    depend on the contexts asked for)."""
    out, c = [], tokens
    while c >= smallest and not any(c <= t < tokens for t in captures):
        out.append(c)
        c //= 2
    return out


#: how the capture scripts write their machine-specific arguments into a result's command
CAPTURE_PLACEHOLDERS = {"--model": "MODEL_DIR", "--cache-dir": "CACHE_DIR", "--book": "../shared/data/books/{name}"}


def add_capture_arguments(ap, contexts: list[int], budgets: list[float]) -> None:
    """The arguments of the scripts that read the decode runs of cached captures (``captured_runs``)."""
    from locks_bench.results import RESULTS

    ap.add_argument("--model", required=True, help="evaluation model directory (fetch.sh's MODEL_DIR)")
    ap.add_argument("--book", required=True)
    ap.add_argument("--cache-dir", required=True, help="where captures are kept (outside the repository)")
    ap.add_argument("--out-dir", default=str(RESULTS))
    ap.add_argument("--contexts", type=int, nargs="+", default=contexts)
    ap.add_argument("--captures", type=int, nargs="+", default=[16384, 32768],
                    help="capture lengths; each context is read from the shortest capture that holds it")
    ap.add_argument("--budgets", type=float, nargs="+", default=budgets)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=32, help="consecutive decode steps a run")
    ap.add_argument("--threads", type=int, default=1)


def captured_runs(args, log):
    """Yield ``(context, data, positions)`` for every ``args.contexts``: the capture that holds it (loaded from
    ``args.cache_dir`` or captured, ``load_or_capture``) and the positions of its ``args.runs`` decode runs of
    ``args.steps`` steps (``decode_runs``), sorted."""
    for tokens in sorted(args.captures):
        held = capture_contexts(tokens, args.captures)
        served = [c for c in args.contexts if c in held]
        if not served:
            continue
        runs = {c: sorted(p for run in decode_runs(c, args.steps, args.runs) for p in run) for c in held}
        data = load_or_capture(args.cache_dir, args.model, args.book, tokens, sorted(sum(runs.values(), [])), log)
        for context in served:
            yield context, data, runs[context]
