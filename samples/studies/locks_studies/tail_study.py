"""Run every design of ``tail_estimate`` over a capture's layers and KV heads, and reduce to JSON-sized rows.

A design is a selection (``fixed`` or ``oracle`` at a fraction of the pages, ``mass`` at a level ``p``) and a tail
(``tail_estimate.TAILS``). Bytes read per step and KV head are counted as a share of the step's dense K+V (bf16):
the exact pages' K+V, every page's summary (``summary_bytes``: LOCKS scores every page; the oracle is charged the
same, though it would read every key), and the tail's mean value vectors (``value_mean_bytes``) of the pages it
covers (``super``: a bf16 mean value and centroid per whole superpage, a bf16 mean per other unread page).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from locks_engine.config import LocksConfig
from locks_engine.ops.summaries import summary_bytes
from locks_engine.ops.tail import value_mean_bytes
from locks_studies.tail_estimate import FITTED, SUPER, TAILS, HeadStudy, fit_bias, head_steps


def designs(fractions: list[float], levels: list[float], tails: tuple[str, ...] = TAILS) -> list[dict]:
    """The grid: ``fixed`` with every tail of ``tails`` (``tail_estimate.TAILS``), ``oracle`` bare and with
    ``est-int8``, ``mass`` bare and with ``est-int8``, ``half`` and ``fit`` (each as far as ``tails`` holds it).

    Raises:
        ValueError: on an unknown tail, or without ``none`` (the baseline).
    """
    unknown = [t for t in tails if t not in TAILS]
    if unknown or "none" not in tails:
        raise ValueError(f"tails {', '.join(unknown) or '(no none)'}: allowed {', '.join(TAILS)}, none included")
    keep = lambda *names: tuple(t for t in names if t in tails)
    out = []
    for f in fractions:
        out.append({"selection": "fixed", "size": f, "tails": keep(*TAILS)})
        out.append({"selection": "oracle", "size": f, "tails": keep("none", "est-int8")})
    for p in levels:
        out.append({"selection": "mass", "size": p, "tails": keep("none", "est-int8", "half", "fit")})
    return out


#: the per-layer biases ``fit`` tries (natural log of the factor on the tail masses)
FIT_GRID = (-2.0, -1.5, -1.0, -0.75, -0.5, -0.25, 0.0, 0.25)


def fitted_bias(tail: str, studies: list[HeadStudy], masks: list[Tensor], fit_steps: Tensor) -> float:
    """``b_l`` of a fitted tail on one layer, from the steps ``fit_steps`` bool `[T]` of its KV heads: ``bc`` the
    median log ratio of true to estimated tail mass (``fit_bias``), ``fit`` the ``FIT_GRID`` value with the least
    mean output error (the first on ties)."""
    if tail == "bc":
        ref = [s.run(m, ("est-int8",))["est-int8"] for s, m in zip(studies, masks)]
        return fit_bias(torch.stack([r["true_tail"][fit_steps] for r in ref]),
                        torch.stack([r["est_tail"][fit_steps] for r in ref]))
    errs = [sum(s.run(m, ("fit",), b)["fit"]["err"][fit_steps].mean().item() for s, m in zip(studies, masks))
            for b in FIT_GRID]
    return FIT_GRID[min(range(len(errs)), key=errs.__getitem__)]


def design_name(selection: str, size: float, tail: str) -> str:
    """``fixed-5%+est-int8``, ``mass-p0.95``, ..."""
    head = f"{selection}-p{size:g}" if selection == "mass" else f"{selection}-{size * 100:g}%"
    return head if tail == "none" else f"{head}+{tail}"


def tail_bytes(tail: str, mask: Tensor, seq_lens: Tensor, page_size: int, dim: int) -> Tensor:
    """fp32 `[T]` bytes of the tail's mean value vectors (and superpage centroids) a step reads, one KV head."""
    pages = (seq_lens + page_size - 1) // page_size
    unread = (pages - mask.sum(-1)).float()
    if tail == "none":
        return torch.zeros_like(unread)
    if tail == "super":
        supers = mask.shape[1] // SUPER
        touched = mask[:, : supers * SUPER].view(-1, supers, SUPER).any(-1)
        complete = (torch.arange(supers) + 1) * SUPER * page_size <= seq_lens.unsqueeze(1)
        whole = (complete & ~touched).sum(-1).float()
        return whole * 4 * dim + (unread - whole * SUPER) * 2 * dim
    if tail == "half":
        return 2 * unread * value_mean_bytes(dim, "int8")
    return unread * value_mean_bytes(dim, "int8" if tail in ("est-int8",) + FITTED else "bf16")


def study_context(data: dict, seq_len: int, cfg: LocksConfig, grid: list[dict], floor: int, cap: int,
                  needle_pages: list[int], prose_steps: Tensor, log=print) -> dict[str, dict[str, Tensor]]:
    """Every design on every layer and KV head of one capture.

    Args:
        data (dict): ``capture_ids``' output (``k``, ``v`` `[L, H, N, D]`, ``q`` `[L, HQ, T, D]`, ``positions``).
        seq_len (int): tokens the keys cover; cfg (LocksConfig): summaries, sink and recent pages.
        grid (list): ``designs``' output (fractions of the context's pages; levels ``p``).
        floor, cap (int): the mass-sized budget's bounds (pages).
        needle_pages (list[int]): pages holding the needle's value.
        prose_steps (Tensor): bool `[T]` steps the fitted tails (``bc``, ``fit``) fit their per-layer bias on.
    Returns:
        dict: design name -> measure -> `[L, H, T, (G)]` (``tail_estimate.HeadStudy.run``'s measures, plus
        ``bytes`` `[L, H, T]` read per step and KV head, and ``bias`` `[L, H]` for fitted tails).
    """
    n_layers, n_kv = data["k"].shape[:2]
    dim = data["k"].shape[-1]
    page_summary = summary_bytes(cfg.page_size, cfg.rank, dim, cfg.summary_format)[0]
    kv_page = 2 * cfg.page_size * dim * 2
    out: dict[str, dict[str, list]] = {}
    for layer in range(n_layers):
        studies = []
        for head in range(n_kv):
            steps, values = head_steps(data, layer, head, seq_len, cfg.page_size)
            studies.append(HeadStudy(steps, values, cfg, needle_pages))
        seq_lens = studies[0].steps.seq_lens
        pages = (seq_lens + cfg.page_size - 1) // cfg.page_size
        for d in grid:
            k = max(cfg.always_read_pages, round(d["size"] * int(pages.max())))
            masks = [s.fixed(k) if d["selection"] == "fixed" else s.oracle(k) if d["selection"] == "oracle"
                     else s.mass(d["size"], floor, cap) for s in studies]
            plain = [t for t in d["tails"] if t not in FITTED]
            rows = [s.run(m, tuple(plain)) for s, m in zip(studies, masks)]
            for tail in [t for t in d["tails"] if t in FITTED]:
                bias = fitted_bias(tail, studies, masks, prose_steps)
                for r, s, m in zip(rows, studies, masks):
                    r.update(s.run(m, (tail,), bias))
                    r[tail]["bias"] = torch.tensor(bias)
            for tail in d["tails"]:
                name = design_name(d["selection"], d["size"], tail)
                slot = out.setdefault(name, {})
                per_head = []
                for r, m in zip(rows, masks):
                    row = dict(r[tail])
                    spent = row["pages"] * kv_page + pages.float() * page_summary
                    row["bytes"] = (spent + tail_bytes(tail, m, seq_lens, cfg.page_size, dim)) / (
                        pages.float() * kv_page)
                    per_head.append(row)
                for key in per_head[0]:
                    slot.setdefault(key, []).append(torch.stack([row[key] for row in per_head]))
        log(f"layer {layer}: done")
    return {name: {k: torch.stack(v) for k, v in m.items()} for name, m in out.items()}


def reduce(measures: dict[str, dict[str, Tensor]], needle_steps: Tensor, runs: dict[str, Tensor]) -> dict:
    """JSON-sized rows: per design, means over layers, KV heads, steps and query heads, per layer and per run.

    Args:
        measures: ``study_context``'s output; needle_steps (Tensor): bool `[T]` steps that write the needle's
            value; runs (dict): run name -> bool `[T]` steps.
    Returns:
        dict: design -> ``err`` (mean), ``err_worst_layer`` ([layer, value]), ``err_per_layer``, ``err_<run>``,
        ``kept``, ``kept_worst_layer``, ``needle`` (share of the needle's pages read at the needle steps, mean over
        layers and KV heads), ``needle_worst_layer``, ``needle_attended`` (the same where the needle's pages hold
        at least 1% of the true mass, over ``needle_attended_cases`` (layer, KV head, step) cases), ``pages``,
        ``bytes`` (share of dense K+V), ``tail_bias`` (median of ``log(true / est)``), ``tail_bias_per_layer``,
        ``bias_per_layer`` (a fitted tail's ``b_l``).
    """
    out = {}
    for name, m in measures.items():
        err = m["err"].mean(dim=(1, 2, 3))  # [L]
        kept = m["kept"].mean(dim=(1, 2))
        needle = m["needle"][:, :, needle_steps].mean(dim=(1, 2))
        # where the needle matters: (layer, KV head, needle step) whose needle pages hold >= 1% of the true mass
        attended = m["needle_mass"][:, :, needle_steps] >= 0.01
        row = {"err": round(err.mean().item(), 4), "err_worst_layer": [int(err.argmax()), round(err.max().item(), 4)],
               "err_per_layer": [round(x, 4) for x in err.tolist()],
               **{f"err_{run}": round(m["err"][:, :, steps].mean().item(), 4) for run, steps in runs.items()},
               "kept": round(kept.mean().item(), 4),
               "kept_worst_layer": [int(kept.argmin()), round(kept.min().item(), 4)],
               "needle": round(needle.mean().item(), 4),
               "needle_worst_layer": [int(needle.argmin()), round(needle.min().item(), 4)],
               "needle_attended": (round(m["needle"][:, :, needle_steps][attended].mean().item(), 4)
                                   if attended.any() else None),
               "needle_attended_cases": int(attended.sum()),
               "pages": round(m["pages"].mean().item(), 1), "bytes": round(m["bytes"].mean().item(), 4)}
        bias = m["tail_bias"]
        if not bias.isnan().all():
            row["tail_bias"] = round(bias.nanmedian().item(), 3)
            row["tail_bias_per_layer"] = [round(bias[i].nanmedian().item(), 3) for i in range(bias.shape[0])]
        if "bias" in m:
            row["bias_per_layer"] = [round(x, 3) for x in m["bias"][:, 0].tolist()]
        out[name] = row
    return out


def study_config(cfg: LocksConfig) -> LocksConfig:
    """``cfg`` as the study scores with it: the flat selection (the two-level one is measured through ``super``)."""
    return replace(cfg, selection="flat")
