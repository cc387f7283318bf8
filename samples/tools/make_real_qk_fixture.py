"""Capture real post-RoPE attention queries and keys from a real model over real prose, as a small test fixture.

What it does
------------
Loads a Qwen2-architecture causal LM (the project's evaluation model, Qwen2.5-Coder-0.5B-Instruct) with
transformers on CPU in float32 with eager attention, tokenizes the beginning of a plain-text book (a Project
Gutenberg header, if present, is skipped), and runs ONE forward pass over exactly ``--tokens`` (default 2048)
tokens at positions 0..N-1. During that pass it records, for the chosen layers, the query and key tensors as
they come out of RoPE (by wrapping ``apply_rotary_pos_emb`` in ``transformers.models.qwen2.modeling_qwen2``;
the calls arrive in layer order), and independently recomputes them from each layer's input hidden states
(q_proj / k_proj + the layer's cos/sin) as a cross-check.

It saves, with ``np.savez_compressed``:

* ``k_L{L}``    float16 ``[N, D]``     keys of KV head ``--kv-head`` (default 0) at every position 0..N-1
* ``q_L{L}``    float16 ``[T, G, D]``  queries of the G query heads sharing that KV head (Qwen2 GQA layout:
                                        query head h reads KV head h // G), at T positions
* ``positions`` int64 ``[T]``          those positions, N-1-(T-1)*stride .. N-1 at ``--query-stride``
                                        (query at position p attends keys 0..p)
* ``meta``      a JSON string           model, source text, token count, layers, kv head, dtype, script, date

Sanity checks (printed, and the script fails if they do not hold): for each layer and each of the G query
heads, softmax(q . k / sqrt(D)) over keys 0..p at every stored position p, computed from the captured keys,
matches the model's own eager attention probabilities from the float32 capture (to 1e-4; the script fails
otherwise), and those probabilities times the layer's values for the KV head reproduce the model's per-head
attention output (the input of o_proj). The same is printed for the float16 values actually stored: ~1e-3
where keys are small, but layer 0 keys have near-constant channels up to ~145 that float16 rounds by up to
1/16, which moves probabilities by a few 1e-2 there. Tests should therefore build their references from the
stored float16 q/k (upcast to float32), never from the model's own probabilities. It also prints the
spread of the attention logits per layer.

How to run (CPU, a minute or two; needs torch, transformers, numpy)
-------------------------------------------------------------------
Build the evaluation model once with ``bash ../shared/tools/eval-model/fetch.sh MODEL_DIR`` and use the venv it
creates next to it (``MODEL_DIR.work/venv``), then, from the repository root::

    python samples/tools/make_real_qk_fixture.py MODEL_DIR ../shared/data/books/milton_paradise_lost.txt \\
        --out tests/fixtures/real_qk_qwen25coder05b.npz

Options: ``--tokens 2048 --queries 32 --query-stride 16 --layers 0 12 23 --kv-head 0 --threads N``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys

import numpy as np
import torch

from locks_bench.results import first_tokens, read_prose


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", help="Hugging Face model directory (Qwen2 architecture), e.g. MODEL_DIR from fetch.sh")
    ap.add_argument("text", help="plain-text prose, e.g. ../shared/data/books/milton_paradise_lost.txt")
    ap.add_argument("--out", default="tests/fixtures/real_qk_qwen25coder05b.npz")
    ap.add_argument("--tokens", type=int, default=2048, help="N, tokens in the forward pass")
    ap.add_argument("--queries", type=int, default=32, help="T, positions whose queries are kept")
    ap.add_argument("--query-stride", type=int, default=16,
                    help="keep the queries at N-1, N-1-stride, ... (T of them), spread over the end of the text")
    ap.add_argument("--layers", type=int, nargs="+", default=[0, 12, 23])
    ap.add_argument("--kv-head", type=int, default=0)
    ap.add_argument("--model-name", default="Qwen2.5-Coder-0.5B-Instruct (AWQ Q4_K_M GGUF, dequantized; "
                                              "built by shared/tools/eval-model/fetch.sh)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    ap.add_argument("--tol16", type=float, default=2e-3,
                    help="|prob difference| of the float16-stored q/k vs the model above which a note is printed")
    ap.add_argument("--max-bytes", type=int, default=1_000_000, help="fail if the fixture is larger")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer
    import transformers
    import transformers.models.qwen2.modeling_qwen2 as mq

    N, T, layers, kvh = args.tokens, args.queries, sorted(set(args.layers)), args.kv_head
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    cfg = model.config
    n_layers, n_q, n_kv = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_q
    G = n_q // n_kv
    assert all(0 <= L < n_layers for L in layers), f"layers must be in 0..{n_layers - 1}"
    stride = args.query_stride
    assert 0 <= kvh < n_kv and 0 < T and stride >= 1 and (T - 1) * stride < N
    qheads = list(range(kvh * G, (kvh + 1) * G))  # repeat_kv layout: query head h reads KV head h // G
    pos = np.arange(N - 1 - (T - 1) * stride, N, stride, dtype=np.int64)
    pos_t = torch.from_numpy(pos)

    ids = first_tokens(tok, read_prose(args.text), N)
    input_ids = torch.tensor([ids], dtype=torch.long)

    # --- capture 1: outputs of apply_rotary_pos_emb, one call per layer, in layer order ---------------
    rope_calls: list[tuple[torch.Tensor, torch.Tensor] | None] = []
    orig_rope = mq.apply_rotary_pos_emb

    def recording_rope(q, k, cos, sin, *a, **kw):
        qe, ke = orig_rope(q, k, cos, sin, *a, **kw)
        i = len(rope_calls)
        # q: [1, n_q, N, D], k: [1, n_kv, N, D]
        rope_calls.append((qe[0, qheads][:, pos_t].detach().clone(), ke[0, kvh].detach().clone())
                          if i in layers else None)
        return qe, ke

    # --- capture 2 (cross-check): per-layer inputs, attention probabilities, values, per-head outputs ------
    seen: dict[int, dict] = {L: {} for L in layers}
    hooks = []
    for L in layers:
        attn = model.model.layers[L].self_attn

        def pre(mod, a, kw, L=L):
            hs = kw.get("hidden_states", a[0] if a else None)
            pe = kw.get("position_embeddings", a[1] if len(a) > 1 else None)
            seen[L]["hidden"] = hs.detach().clone()
            seen[L]["cos_sin"] = tuple(t.detach().clone() for t in pe)

        def post(mod, a, out, L=L):
            w = out[1]  # eager attention probabilities [1, n_q, N, N]
            seen[L]["probs"] = w[0, qheads][:, pos_t].detach().clone()

        def v_hook(mod, a, out, L=L):
            seen[L]["v"] = out[0].view(N, n_kv, D)[:, kvh].detach().clone()

        def o_pre(mod, a, L=L):
            seen[L]["o_in"] = a[0][0].view(N, n_q, D)[pos_t][:, qheads].detach().clone()  # [T, G, D]

        hooks += [attn.register_forward_pre_hook(pre, with_kwargs=True), attn.register_forward_hook(post),
                  attn.v_proj.register_forward_hook(v_hook), attn.o_proj.register_forward_pre_hook(o_pre)]

    mq.apply_rotary_pos_emb = recording_rope
    try:
        with torch.no_grad():
            model(input_ids=input_ids, position_ids=torch.arange(N)[None], use_cache=False,
                  output_attentions=True)
    finally:
        mq.apply_rotary_pos_emb = orig_rope
        for h in hooks:
            h.remove()
    if len(rope_calls) != n_layers:
        raise SystemExit(f"apply_rotary_pos_emb was called {len(rope_calls)} times, expected {n_layers}: "
                         "this transformers version applies RoPE elsewhere; the capture needs updating")

    arrays: dict[str, np.ndarray] = {"positions": pos}
    mask = torch.arange(N)[None, :] <= torch.from_numpy(pos)[:, None]  # [T, N] causal
    ok, warn16 = True, False
    print(f"model: {n_layers} layers, {n_q} query / {n_kv} KV heads, D={D}; N={N} tokens, T={T}, "
          f"KV head {kvh} <- query heads {qheads[0]}..{qheads[-1]}")
    print(f"text starts: {tok.decode(ids[:12])!r} ... ends: {tok.decode(ids[-12:])!r}")
    for L in layers:
        q, k = rope_calls[L]  # q [G, T, D], k [N, D] float32
        s = seen[L]
        # cross-check the hook against a recomputation from the layer input
        attn = model.model.layers[L].self_attn
        with torch.no_grad():
            hs = s["hidden"]
            qr = attn.q_proj(hs).view(1, N, n_q, D).transpose(1, 2)
            kr = attn.k_proj(hs).view(1, N, n_kv, D).transpose(1, 2)
            qr, kr = orig_rope(qr, kr, *s["cos_sin"])
        d_recomp = max((qr[0, qheads][:, pos_t] - q).abs().max().item(), (kr[0, kvh] - k).abs().max().item())

        q_tgd = q.permute(1, 0, 2).contiguous()  # [T, G, D]
        q16, k16 = q_tgd.half(), k.half()
        for name, (qq, kk) in {"f32": (q_tgd, k), "f16": (q16.float(), k16.float())}.items():
            logits = torch.einsum("tgd,nd->tgn", qq, kk) / math.sqrt(D)
            logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
            probs = torch.softmax(logits, dim=-1)  # [T, G, N]
            ref = s["probs"].permute(1, 0, 2)  # [T, G, N]
            err = (probs - ref).abs().max().item()
            err_last = (probs[-1] - ref[-1]).abs().max().item()
            out = torch.einsum("tgn,nd->tgd", probs, s["v"])
            err_out = (out - s["o_in"]).abs().max().item() / s["o_in"].abs().max().item()
            if name == "f32":
                lg = logits[-1]  # last position, [G, N], all keys visible
                spread = (lg.max(-1).values - lg.min(-1).values)
                print(f"layer {L:2d}: |k| max {k.abs().max():7.2f}  |q| max {q.abs().max():6.2f}  "
                      f"logits at p={N - 1}: std {lg.std(-1).mean():.2f}, max-min {spread.min():.1f}..{spread.max():.1f}, "
                      f"top prob {ref[-1].max(-1).values.min():.3f}..{ref[-1].max(-1).values.max():.3f}; "
                      f"hook vs recompute {d_recomp:.1e}")
            if name == "f32":
                good = err <= 1e-4 and err_out <= 1e-4
                ok &= good
                verdict = "ok" if good else "FAIL"
            else:  # float16 storage rounds keys of magnitude ~100+ by up to 1/16: reported, not fatal
                verdict = "ok" if err <= args.tol16 else f"> {args.tol16:g}: float16 rounding (see note)"
                warn16 |= err > args.tol16
            print(f"          {name} q/k: max|softmax - model probs| last pos {err_last:.2e}, all {T} pos {err:.2e}; "
                  f"P@V vs model head output rel {err_out:.1e}  {verdict}")
        if not np.isfinite(k16.numpy()).all() or not np.isfinite(q16.numpy()).all():
            raise SystemExit(f"layer {L}: float16 overflow")
        arrays[f"k_L{L}"] = k16.numpy()
        arrays[f"q_L{L}"] = q16.numpy()

    meta = {
        "model": args.model_name,
        "model_config": {"num_hidden_layers": n_layers, "num_attention_heads": n_q, "num_key_value_heads": n_kv,
                         "head_dim": D, "rope_theta": (getattr(cfg, "rope_parameters", None) or {}).get(
                             "rope_theta", getattr(cfg, "rope_theta", None))},
        "source_text": os.path.basename(args.text),
        "tokens": N, "token_ids_first_last": [ids[0], ids[-1]],
        "layers": layers, "kv_head": kvh, "query_heads": qheads, "queries": T, "query_stride": stride,
        "dtype": "float16 (captured in float32, eager attention, one forward pass, positions 0..N-1)",
        "layout": {"k_L{L}": "[N, D] post-RoPE keys of kv_head", "q_L{L}": "[T, G, D] post-RoPE queries of "
                   "query_heads at positions", "positions": "[T]; query at p attends keys 0..p; scale 1/sqrt(D)"},
        "script": "samples/tools/make_real_qk_fixture.py",
        "transformers": transformers.__version__, "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
    }
    arrays["meta"] = np.array(json.dumps(meta))
    if warn16:
        print("note: the float32 capture matches the model exactly; the float16 values stored differ from the model's\n"
              "      probabilities where keys are large (large near-constant channels, e.g. layer 0). Tests must take\n"
              "      their reference from the stored float16 q/k (upcast), not from the model's probabilities.")
    if not ok:
        print("sanity checks FAILED: fixture not written", file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    size = os.path.getsize(args.out)
    print(f"wrote {args.out}: {size} bytes; " + ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in arrays.items()))
    if size > args.max_bytes:
        print(f"fixture is {size} bytes > {args.max_bytes}: lower --queries", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
