"""Page scoring alone on the GPU: the ``colwise8`` coefficient paths of ``locks_kernels.score`` (batched fp16
products with ``V q`` as a hi + lo pair or as one fp16 factor, ``half``: also ``V q`` from one fp16 product,
per-direction int8 products with fp32 FMAs, one product and a broadcast sum) and their tile sizes, at the GQA
groups of the end-to-end shapes (GPU machine).

Setup as ``bench_kernels.py``: bf16 keys drawn from a normal distribution in a permuted paged KV cache, summaries
built by ``build_cache_summaries`` (budget 2048, r = 8, page 16, block 64), one bf16 query per query head; timing
is CUDA-graph replays between CUDA events with L2 flushed before each, median of ``--reps``. Every variant's
scores must match the ``dot`` path's to 1e-3 (relative to the largest score) on the finite entries (checked).
Byte floor: the summaries read, ``pages x KV heads x summary bytes``, at the device-to-device copy bandwidth.
Variants labelled ``plain`` run without the kernel's inline PTX (``score_pages(ptx=False)``), to time what it
saves; they are never proposed as a tuning.

Usage::

    python samples/bench_score.py --out OUT      # prints a table; writes OUT/score.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from locks_engine.config import LocksConfig  # noqa: E402

#: (name, KV heads, query heads, largest context; contexts timed)
SHAPES = [
    ("glm4-9b-1m", 2, 32, (1 << 20, 1 << 17)),
    ("llama3.1-8b", 8, 32, (1 << 20, 1 << 17)),
]
PATHS = ("dot", "dot1", "half", "dot1t", "halft", "direction", "broadcast")
#: (coef_path, tile_pages, num_warps, inline PTX, programs_per_sm, pipeline stages, register cap) per GQA group
#: size. The grid kernel (programs_per_sm 0) at its old defaults, also without the inline PTX (label suffix " plain":
#: Triton's own tl.log2 and int8 -> fp16); then the persistent kernel (label suffix " pN sM"): 4 and 5 programs
#: an SM with 2 stages (the defaults: ``score_tuning.default_tuning``), more programs an SM with the registers
#: capped so that they fit (suffix " cap": ``score_tuning.register_cap``, 96 for 5 programs of 4 warps, 80 for 6,
#: 72 for 7, 64 for 8; ``score_sass.py`` counts the spills), 8 warps, 3 stages, and the unshifted paths at their
#: best occupancy of the fifth run. This is the sixth run's list (2026-12-03, ``samples/results/score.json``); each
#: row also times the default kernel and ``select_pages`` together, with and without the score kernel's
#: log-sum-exp partials (``score_and_select``).
VARIANTS = {
    16: [("dot1t", 16, 4, True, 0, 0, False), ("dot1t", 16, 4, False, 0, 0, False)]
    + [("dot1tc", 16, 4, True, 4, 2, False), ("dot1tc", 16, 4, True, 5, 2, True), ("dot1tc", 16, 4, True, 4, 3, False),
       ("dot1tc", 16, 8, True, 2, 2, False), ("dot1tc", 8, 4, True, 5, 2, False), ("dot1tc", 8, 4, True, 6, 2, True),
       ("dot1tc", 8, 4, True, 7, 2, True), ("halftc", 16, 4, True, 4, 2, False), ("halftc", 16, 4, True, 5, 2, True),
       ("dot1t", 8, 4, True, 5, 2, False)],
    4: [("halft", 16, 4, True, 0, 0, False), ("halft", 16, 4, False, 0, 0, False)]
    + [("halftc", 16, 4, True, 4, 2, False), ("halftc", 16, 4, True, 5, 2, False), ("halftc", 16, 4, True, 5, 2, True),
       ("halftc", 16, 4, True, 6, 2, True), ("halftc", 16, 8, True, 3, 2, False), ("halftc", 8, 4, True, 6, 2, False),
       ("halftc", 8, 4, True, 8, 2, True), ("dot1tc", 16, 4, True, 4, 2, False), ("halft", 8, 4, True, 6, 2, False)],
}


def label(path: str, tile: int, warps: int, ptx: bool, programs: int, stages: int, cap: bool = False) -> str:
    """``"PATH tpTILE wWARPS"``, `` pN sM`` for the persistent kernel, `` cap`` with its registers capped so that
    N programs fit an SM, `` plain`` without the inline PTX."""
    return (f"{path} tp{tile} w{warps}" + (f" p{programs} s{stages}" if programs else "") + (" cap" if cap else "")
            + ("" if ptx else " plain"))


def save(out: Path, meta: dict, rows: list, failures: list) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "score.json").write_text(json.dumps({**meta, "rows": rows, "failures": failures}, indent=1))


def fastest_tuning(row: dict, default: str, margin: float = 0.9) -> str:
    """``PATH,TILE_PAGES,NUM_WARPS[,PROGRAMS_PER_SM,STAGES[,MAX_REGISTERS]]`` (``$LOCKS_SCORE_TUNING``) of the
    fastest variant of a row, or "" when the ``default`` variant (its ``label``, the kernel's ``default_tuning`` for
    the row's group size) is within ``1 / margin`` of it (or missing)."""
    ok = {k: v for k, v in row["ms"].items() if v is not None and not k.endswith(" plain")}
    best = min(ok, key=ok.get)
    if default in ok and ok[best] >= margin * ok[default]:
        return ""
    path, tp, nw, *persistent = best.split()
    fields = [path, tp[2:], nw[1:]] + [f[1:] for f in persistent if f != "cap"]
    if "cap" in persistent:
        from locks_kernels.score_tuning import register_cap

        fields.append(str(register_cap(int(fields[3]), int(fields[2]))))
    return ",".join(fields)


def score_and_select(lk, timer, s, table, lens, cfg, failures: list, where: str) -> dict:
    """ms of the default score kernel then ``select_pages`` in one graph: ``own pass`` (selection's
    ``_chunk_lse_kernel`` over the scores), ``partials`` (the score kernel's log-sum-exp partials, the pass
    skipped), and ``select`` alone. The two must select pages keeping the same group mass (checked, 1e-5)."""
    from bench_kernels import BLOCK

    scores, parts = lk.score_pages(s.q, s.store, table, lens, 16, BLOCK, lse_partials=True)
    if parts is None:
        return {}
    own, shared = (lk.select_pages(scores, lens, s.heads, cfg, lse_partials=p) for p in (None, parts))
    shares = torch.softmax(scores.double(), dim=-1).unflatten(1, (s.heads, -1)).mean(2)  # [S, H, Pmax]
    kept = [shares.gather(2, sel.clamp(min=0)).masked_fill(sel < 0, 0).sum(-1) for sel in (own, shared)]
    if not torch.allclose(kept[0], kept[1], rtol=1e-5, atol=1e-7):
        failures.append(f"{where}: selection over the partials keeps another mass than its own pass")

    def step(partials: bool) -> None:
        out = lk.score_pages(s.q, s.store, table, lens, 16, BLOCK, out=scores, lse_partials=partials)
        sc, pa = out if partials else (out, None)
        lk.select_pages(sc, lens, s.heads, cfg, out=own, lse_partials=pa)

    return {"own pass": round(timer(lambda: step(False))[0], 4), "partials": round(timer(lambda: step(True))[0], 4),
            "select": round(timer(lambda: lk.select_pages(scores, lens, s.heads, cfg, out=own))[0], 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("score-out"))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--time-limit", type=float, default=300.0, help="seconds; later shapes are skipped")
    ap.add_argument("--partials-file", type=Path, help="write 1 when score + select is faster with the score "
                    "kernel's log-sum-exp partials at the first shape's largest context, else 0 ($LOCKS_LSE_PARTIALS)")
    ap.add_argument("--tuning-file", type=Path, help="write the fastest variant at the first shape's largest "
                    "context as a $LOCKS_SCORE_TUNING value (empty when the default is within 10%% of it)")
    args = ap.parse_args()
    import locks_kernels as lk
    from bench_kernels import BLOCK, Setup, Timer, copy_bandwidth
    from locks_kernels.score_tuning import register_cap
    from locks_engine.ops.summaries import summary_bytes

    cfg = LocksConfig(budget=2048, rank=8, summary_format="colwise8")
    timer, rows, failures, start = Timer(args.reps), [], [], time.perf_counter()
    bw = copy_bandwidth(timer)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": args.reps,
            "copy_bw_bytes_per_s": bw, "config": cfg.to_dict()}
    for shape, heads, q_heads, contexts in SHAPES:
        if time.perf_counter() - start > args.time_limit:
            failures.append(f"{shape}: skipped (time limit)")
            continue
        s = Setup(heads, q_heads, 128, 1, max(contexts), cfg)
        groups = q_heads // heads
        for ctx in contexts:
            table = s.table[:, : ctx // BLOCK].contiguous()
            lens = torch.full((1,), ctx, dtype=torch.int32, device="cuda")
            pages = ctx // cfg.page_size
            floor_ms = pages * heads * summary_bytes(cfg.page_size, cfg.rank, 128, cfg.summary_format)[0] / bw * 1e3
            row = {"shape": shape, "context": ctx, "kv_heads": heads, "groups": groups,
                   "byte_floor_ms": round(floor_ms, 4), "ms": {}, "max_rel_diff": {}}
            reference = lk.score_pages(s.q, s.store, table, lens, 16, BLOCK, coef_path="dot").clone()
            finite = torch.isfinite(reference)
            top = reference[finite].abs().max().item()
            for path, tp, nw, ptx, progs, stages, cap in VARIANTS[groups]:
                name = label(path, tp, nw, ptx, progs, stages, cap)
                out = torch.empty_like(reference)
                kw = dict(out=out, tile_pages=tp, num_warps=nw, coef_path=path, ptx=ptx, programs_per_sm=progs,
                          pipeline_stages=stages or None, max_registers=register_cap(progs, nw) if cap else None)
                try:
                    lk.score_pages(s.q, s.store, table, lens, 16, BLOCK, **kw)
                except Exception as exc:  # a tile the compiler refuses (registers, shared memory)
                    row["ms"][name] = None
                    row["max_rel_diff"][name] = f"{type(exc).__name__}: {str(exc)[:160]}"
                    continue
                same_inf = torch.equal(torch.isfinite(out), finite)
                diff = (out[finite] - reference[finite]).abs().max().item() / top if same_inf else float("inf")
                row["max_rel_diff"][name] = diff
                if diff > 1e-3:
                    failures.append(f"{shape} {ctx}: {name} differs from dot by {diff:.2e}")
                ms, _ = timer(lambda kw=kw: lk.score_pages(s.q, s.store, table, lens, 16, BLOCK, **kw))
                row["ms"][name] = round(ms, 4)
            row["select_ms"] = score_and_select(lk, timer, s, table, lens, cfg, failures, f"{shape} {ctx}")
            rows.append(row)
            print(json.dumps(row), flush=True)
            save(args.out, meta, rows, failures)
        del s
        torch.cuda.empty_cache()
    save(args.out, meta, rows, failures)
    print(f"\n{meta['gpu']}: device-to-device copy {bw / 1e12:.2f} TB/s; score time in us (floor: summary bytes)")
    for r in rows:
        ok = {k: v for k, v in r["ms"].items() if v is not None}
        best = min(ok, key=ok.get)
        print(f"{r['shape']} {r['context'] // 1024}K G={r['groups']}: floor {r['byte_floor_ms'] * 1e3:.1f} | best "
              f"{best} {ok[best] * 1e3:.1f} | " + " | ".join(f"{k} {v * 1e3:.1f}" for k, v in ok.items()))
        if r.get("select_ms"):
            t = r["select_ms"]
            print(f"  score + select: own pass {t['own pass'] * 1e3:.1f} | partials {t['partials'] * 1e3:.1f} | "
                  f"select alone {t['select'] * 1e3:.1f}")
    if args.partials_file and rows:
        t = rows[0].get("select_ms") or {}
        args.partials_file.write_text(("1" if t and t["partials"] < t["own pass"] else "0") + "\n")
    if args.tuning_file and rows:
        from locks_kernels.score_tuning import default_tuning

        path, tile, programs = default_tuning(rows[0]["groups"], cfg.summary_format)
        default = label(path, tile, 4, True, programs, 2 if programs else 0)
        args.tuning_file.write_text(fastest_tuning(rows[0], default) + "\n")
    print("RESULT:", "PASS" if not failures else "FAIL " + "; ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
