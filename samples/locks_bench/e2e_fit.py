"""The end-to-end benchmark's summary: result folders of ``samples/bench_e2e.py`` merged into rows (LOCKS
against FLASH_ATTN, one row per cell, summary format and kernels' version), the bytes a decode step reads, and
the depth fits (TPOT and profiled device time as a fixed cost plus a per-layer slope, extrapolated to full
depth). Writes ``e2e.json`` (the rows) and the full results beside it; ``samples/plot_e2e.py`` draws them."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from locks_bench.e2e import HBM_PEAK_BYTES_S, SHAPES, kv_bytes_per_token, model_config
from locks_bench.results import write_result

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


def is_locks(backend: str) -> bool:
    """A LOCKS engine of ``bench_e2e`` (``locks``, ``locks-2l``, ``locks-tail``: ``locks_bench.e2e.BACKENDS``)."""
    return backend.startswith("locks")


def backend_fields(backend: str, result: dict) -> dict:
    """What a row of a LOCKS engine other than the flat scan adds: its ``backend`` name and the selection it ran
    (``selection``, ``candidates``, ``tail`` as the result records them); nothing for ``locks``, whose rows keep
    the fields they had before the other engines existed."""
    if backend == "locks":
        return {}
    return {"backend": backend, **{k: result[k] for k in ("selection", "candidates", "tail") if k in result}}


def locks_label(result: dict) -> str | None:
    """The summary format of a LOCKS result, with the score-kernel overrides that results of earlier kernels
    record (fields ``score_tuning``: ``"colwise8 score dot1t,16,4"``; ``score_ptx`` ``"0"``: ``plain``;
    ``lse_partials`` ``"1"`` / ``"0"``: ``lse-partials`` / ``own-lse``) and its kernels' version when named
    (``"colwise8 kernels 8f39075"``); None for FLASH_ATTN."""
    if not is_locks(result["backend"]):
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


def measured_row(key: tuple, r: dict, c: dict, dc: dict) -> dict:
    """One row of ``e2e.json``: the LOCKS cell ``c`` of result ``r`` (cell key ``key``) against the FLASH_ATTN
    cell ``dc`` (``{}`` when there is none): TPOT, prefill, pages read, bytes a step reads, speedup."""
    shape, layers, tp, ctx, batch, backend, walk, machine, label = key
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
    row.update(backend_fields(backend, r))
    row.update({
        "speedup": round(dc["tpot_ms"] / c["tpot_ms"], 2) if dc.get("tpot_ms") else None,
        "dense_tpot_spread_ms": [dc.get("tpot_ms_min"), dc.get("tpot_ms_max")],
        "locks_tpot_spread_ms": [c["tpot_ms_min"], c["tpot_ms_max"]],
        "dense_decode_tok_s": dc.get("decode_tok_s"), "locks_decode_tok_s": c["decode_tok_s"],
        "summary_gib": round(c["summary_bytes"] / 2**30, 2),
        "locks_metadata_build_us": c["metadata_build_us_per_step"],
        "dense_metadata_build_us": dc.get("metadata_build_us_per_step"),
    })
    return row


def summarize(folders_in: list[str], json_path: str | Path, meta: dict | str | None = None,
              full_path: str | Path | None = None) -> int:
    """Merge the ``result-*.json`` of ``folders_in`` into rows (LOCKS against FLASH_ATTN), add the depth fits, and
    write ``json_path`` (``meta``, a dict or its JSON text, gives ``gpu``, ``date``, ``vllm``, ``command`` and any
    other header fields) and every result to ``full_path`` (default: ``<json stem>_full.json`` beside it).
    Returns 0, or 2 (a message on stderr) when the folders hold no results."""
    results, folders = [], []
    for folder in folders_in:
        for path in sorted(Path(folder).glob("result-*.json")):
            results.append(json.loads(path.read_text()))
            folders.append(folder)
    if not results:
        print(f"no result-*.json in {folders_in}", file=sys.stderr)
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
        shape, layers, tp, ctx, batch, backend, walk, machine, _ = key
        if not is_locks(backend):
            continue
        dense_key = (shape, layers, tp, ctx, batch, "flash", walk, machine, None)
        dense = dense_by_folder.get((folder_of[key], *dense_key), cells.get(dense_key))
        rows.append(measured_row(key, r, c, dense[1] if dense else {}))
    rows += depth_fits(cells)
    meta = dict(json.loads(meta) if isinstance(meta, str) and meta else meta or {})
    summary = {"gpu": meta.pop("gpu", None), "date": meta.pop("date", None), "vllm": meta.pop("vllm", None),
               "command": meta.pop("command", None), **meta, "rows": rows}
    one_gpu = one_gpu_device_fits(cells)
    if one_gpu:
        summary["one_gpu_device_fits"] = one_gpu
    write_result(json_path, summary)
    full = Path(full_path or Path(json_path).with_name(Path(json_path).stem + "_full.json"))
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(json.dumps(results, indent=1) + "\n")
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
        if not is_locks(backend) or len(by_depth) < 2 or full in by_depth:
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
            # LOCKS depths whose TPOT is over 1.05x their kernel time a step: the step waits on the host there, and
            # the TPOT fit's LOCKS slope (and per_layer_ratio) is flattened by them
            row["fit"]["locks_host_bound_depths"] = sorted(d for d, t in by_depth.items()
                                                           if d in busy_l and t > 1.05 * busy_l[d])
            # a scalar for the tables: this row's extrapolated LOCKS TPOT rests on a host-bound depth
            row["locks_host_bound"] = bool(row["fit"]["locks_host_bound_depths"])
        if tp > 1:
            row["tp"] = tp
        if not walk:
            row["prefix_walk"] = False
        if machine:
            row["machine"] = machine
        row.update(label_fields(fmt))
        row.update(backend_fields(backend, cells_result(cells, shape, tp, ctx, batch, backend, walk, machine, fmt)))
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
    tpot, busy, whole = {}, {}, set()
    for (shape, layers, tp, ctx, batch, backend, walk, machine, fmt), (r, c) in cells.items():
        ms = profile_busy_ms(r, ctx) if batch == 1 and machine else None
        if ms is not None:
            if (r["profile"]["ranks"][0] or {}).get("decode_kernel_ms_per_step") is None:
                whole.add((shape, tp, ctx, walk, machine))  # a profile of one window: prefill, calibration in it
            busy.setdefault((shape, tp, ctx, walk, machine, backend, fmt), {})[layers] = ms
            tpot.setdefault((shape, tp, ctx, walk, machine, backend, fmt), {})[layers] = c["tpot_ms"]
    out = []
    for (shape, tp, ctx, walk, machine, backend, fmt), locks in sorted(busy.items(), key=by_format_last):
        dense_key = (shape, tp, ctx, walk, machine, "flash", None)
        dense = busy.get(dense_key, {})
        shared = sorted(set(locks) & set(dense))
        if fmt is None or len(locks) < 2 or not shared:
            continue
        fixed, slope = linear_fit(locks)
        dense_slope = slope + statistics.mean((dense[d] - locks[d]) / d for d in shared)
        full = SHAPES[shape]["num_hidden_layers"]
        pairs = {"locks": (shape, tp, ctx, walk, machine, backend, fmt), "flash": dense_key}
        host_bound = {b: sorted(d for d, t in tpot[k].items() if t > 1.05 * busy[k][d]) for b, k in pairs.items()}
        out.append({
            "shape": shape, "context": ctx, "tp": tp, "prefix_walk": walk, "machine": machine,
            **label_fields(fmt), **backend_fields(backend, cells_result(cells, shape, tp, ctx, 1, backend, walk,
                                                                        machine, fmt)),
            "depths_locks": sorted(locks), "depths_dense": sorted(dense),
            "locks_fixed_ms": round(fixed, 3), "locks_per_layer_ms": round(slope, 4),
            "dense_per_layer_ms": round(dense_slope, 4), "per_layer_ratio": round(dense_slope / slope, 2),
            "locks_ms_at_full_depth": round(fixed + slope * full, 3),
            "dense_ms_at_full_depth": round(fixed + dense_slope * full, 3),
            # False: some profile was one window, its prefill step and calibration counted as decode
            "decode_only": (shape, tp, ctx, walk, machine) not in whole,
            "tpot_ms": {b: tpot[k] for b, k in pairs.items()},
            "kernel_ms_per_step": {"locks": locks, "flash": dense}, "host_bound": host_bound})
    return out


def cells_result(cells: dict, shape: str, tp: int, ctx: int, batch: int, backend: str, walk: bool, machine: str,
                 fmt: str | None) -> dict:
    """The result (any depth) of a cell group of ``cells``: where a fit's row reads its engine's settings."""
    for (s, _, t, c, b, be, w, m, f), (r, _) in cells.items():
        if (s, t, c, b, be, w, m, f) == (shape, tp, ctx, batch, backend, walk, machine, fmt):
            return r
    return {}


def profile_busy_ms(result: dict | None, ctx: int) -> float | None:
    """GPU kernel time per decode step (ms; first rank) of ``result``'s ``--profile-steps`` profile when it was
    taken at ``ctx`` tokens, else None. Profiles with a short window (``decode_kernel_ms_per_step``, the
    difference of two windows) give the decode alone; older ones include the one prefill step of the cached prompt
    (1 of the steps) and the calibration of ``candidates="auto"``. Device-side entries only: profiles saved before
    ``kernel_us_total`` existed summed every entry, eager ops and launch calls too (their kernels twice); for those
    the top entries with CPU time are taken back out."""
    profile = (result or {}).get("profile") or {}
    ranks = profile.get("ranks") or [{}]
    if profile.get("context") != ctx or not profile.get("decode_tokens"):
        return None
    rank = ranks[0]
    if rank.get("decode_kernel_ms_per_step") is not None:
        return rank["decode_kernel_ms_per_step"]
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
