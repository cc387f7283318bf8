"""The calibration study of issue 48 (``samples/studies/study_calibration.py``): does the per-layer ``c`` that the
prompt's own last queries pick (``locks_engine.ops.calibration``) keep the decode steps' attention mass?

A capture (``locks_bench.capture``) keeps, per context, ``runs`` runs of consecutive decode positions and, before
each run, the ``prompt`` positions of the prefill it continues (:func:`calibration_runs`). Per run, layer and KV
head (:func:`measure_head`): the recall of the flat scan's estimated mass by the two-level candidates at each
``c`` on the prompt's queries (what the engine sees at the end of prefill) and on the decode steps; and at the
decode steps the true attention mass of the flat scan and of the two-level selection at each ``c``, over the
exact-LSE oracle's at the same budget (as ``bench_fidelity`` reports it: the KV group's mean over its query
heads), and the page summaries each scans (superpage centroids at their byte share).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from locks_bench.capture import decode_runs
from locks_engine.config import LocksConfig
from locks_engine.ops.calibration import (CALIBRATION_CHOICES, pick_candidates, selected_shares, two_level_from_scores,
                                          with_margin)
from locks_engine.ops.score import score_pages
from locks_engine.ops.select import forced_page_mask, group_mass_shares, select_pages
from locks_engine.ops.superpages import SUPERPAGE_PAGES, coarse_fraction, superpage_config, superpage_scores
from locks_studies.fidelity import DecodeSteps
from locks_studies.selection_cost import paged_summaries


def calibration_runs(context: int, steps: int = 32, runs: int = 2, prompt: int = 64
                     ) -> list[tuple[list[int], list[int]]]:
    """``(prompt_queries, decode_steps)`` per run: the run's ``steps`` consecutive decode positions
    (``decode_runs``) and the ``prompt`` positions just before its first, the last queries of a prefill that ends
    where the run starts.

    Raises:
        ValueError: as ``decode_runs``, or when a run's prompt queries would start before position 0.
    """
    out = []
    for run in decode_runs(context, steps, runs):
        if run[0] - prompt < 0:
            raise ValueError(f"{prompt} prompt queries do not fit before position {run[0]}")
        out.append((list(range(run[0] - prompt, run[0])), run))
    return out


def capture_positions(contexts: list[int], steps: int = 32, runs: int = 2, prompt: int = 64) -> list[int]:
    """Sorted query positions a capture keeps to serve every context of ``contexts`` (attention is causal: one
    capture of the longest serves the shorter)."""
    return sorted({p for c in contexts for pq, run in calibration_runs(c, steps, runs, prompt) for p in pq + run})


def _scanned(seq_lens: torch.Tensor, cfg: LocksConfig, c: int, coarse: float) -> torch.Tensor:
    """fp32 `[T]` page summaries a two-level step scans over the flat scan's (``superpages.two_level_scanned`` per
    row)."""
    page, sp = cfg.page_size, SUPERPAGE_PAGES
    complete = seq_lens.long() // page
    whole = complete // sp
    last_complete = seq_lens.long() == whole * sp * page
    chosen = torch.minimum(whole, superpage_config(cfg, c).budget_pages - 1 + last_complete.long())
    return (chosen * sp + complete - whole * sp + whole * coarse).float() / complete.clamp_min(1).float()


def head_cache(keys: torch.Tensor, page_size: int = 16) -> tuple:
    """``selection_cost.paged_summaries`` of one KV head's keys `[N, D]` (every page and superpage summarized; a
    shorter context reads the first columns of its block table)."""
    pages = keys.shape[0] // page_size
    k_pages = keys[: pages * page_size].float().view(pages, page_size, 1, -1)
    return paged_summaries(SimpleNamespace(pages=pages, page_size=page_size, k_pages=k_pages))


def measure_head(steps: DecodeSteps, prompt: int, budgets: list[LocksConfig], prompt_counts: tuple[int, ...],
                 cache: tuple, choices: tuple[int, ...] = CALIBRATION_CHOICES) -> dict:
    """One run of one layer and KV head: ``steps`` holds the prompt's last ``prompt`` queries, then the decode steps;
    ``cache`` is :func:`head_cache` of keys that extend at least as far.

    Returns:
        dict by budget (tokens): ``prompt_recall`` and ``prompt_recall_min`` {queries: `[C]`} (the last ``n``
        prompt queries' mean and least recall, for each ``n`` of ``prompt_counts``), ``decode_recall`` `[C]`, ``mass_flat`` and ``mass`` `[C]` (mean over
        decode steps of the group's true mass over the oracle's), ``mass_flat_min`` and ``mass_min`` `[C]` (worst
        step), ``scanned`` `[C]` (summaries scanned over the flat scan's).
    """
    store, superpages, table = cache
    rows = len(steps.seq_lens)
    table = table[:, : steps.pages]
    block_table, seq_lens = table.expand(rows, -1), steps.seq_lens.int()
    page = steps.page_size
    scores = score_pages(steps.q, store, block_table, seq_lens, page, page, steps.scale)  # [T, G, P]
    coarse = superpage_scores(steps.q, superpages, block_table, seq_lens, page, page, steps.scale)
    shares = group_mass_shares(scores, 1)
    decode = torch.arange(prompt, rows)
    frac = coarse_fraction(LocksConfig(), steps.keys.shape[-1])
    out = {}
    for cfg in budgets:
        forced = forced_page_mask(seq_lens, scores.shape[-1], cfg)
        oracle = steps.mass_kept(steps.oracle_mask(cfg)[decode], decode).mean(-1)  # [E]

        def measure(selected):
            mask = torch.zeros(rows, steps.pages + 1, dtype=torch.bool)
            mask.scatter_(1, torch.where(selected[:, 0] < 0, steps.pages, selected[:, 0]), True)
            kept = steps.mass_kept(mask[decode, : steps.pages], decode).mean(-1)
            ratio = torch.where(oracle > 0, kept / oracle.clamp_min(1e-30), torch.ones_like(kept))
            return selected_shares(shares, selected, forced)[:, 0], ratio

        flat_est, flat_ratio = measure(select_pages(scores, seq_lens, 1, cfg))
        recall, ratios = [], []
        for c in choices:
            est, ratio = measure(two_level_from_scores(scores, coarse, seq_lens, 1, cfg, c))
            recall.append(torch.where(flat_est > 0, est / flat_est.clamp_min(1e-30), torch.ones_like(est)).clamp(0, 1))
            ratios.append(ratio)
        recall = torch.stack(recall)  # [C, T]
        out[cfg.budget] = {
            "prompt_recall": {n: recall[:, prompt - n : prompt].mean(1).tolist() for n in prompt_counts},
            "prompt_recall_min": {n: recall[:, prompt - n : prompt].amin(1).tolist() for n in prompt_counts},
            "decode_recall": recall[:, prompt:].mean(1).tolist(),
            "mass_flat": flat_ratio.mean().item(), "mass_flat_min": flat_ratio.min().item(),
            "mass": [r.mean().item() for r in ratios], "mass_min": [r.min().item() for r in ratios],
            "scanned": [_scanned(seq_lens[decode], cfg, c, frac).mean().item() for c in choices],
        }
    return out


def rule_table(recs: dict, layers: int, heads: int, queries: int, threshold: float,
               choices: tuple[int, ...] = CALIBRATION_CHOICES, measured: tuple[int, ...] | None = None,
               least: bool = False, margin: int = 0) -> list[int]:
    """The table ``pick_candidates`` finds from the prompt recall of one run and budget: ``recs[(layer, head)]``
    holds ``measure_head``'s entry for that budget, measured at ``measured`` (default ``choices``); the rule
    chooses among ``choices``, a subset of them (a lower capacity than was measured). ``least``: each head's
    least recall over the queries (the engine's rule, ``pick_candidates`` over every query), else their mean;
    ``margin``: that many steps of ``choices`` above the pick (``with_margin``, the engine's
    ``CALIBRATION_MARGIN``).

    Raises:
        ValueError: a choice was not measured.
    """
    measured = tuple(measured or choices)
    if not set(choices) <= set(measured):
        raise ValueError(f"rule_table: choices {choices} not all among the measured {measured}")
    rows = [measured.index(c) for c in choices]
    out = []
    for layer in range(layers):
        key = "prompt_recall_min" if least else "prompt_recall"
        recall = torch.tensor([[recs[layer, h][key][queries][i] for i in rows] for h in range(heads)]).T  # [C, H]
        out.append(with_margin(pick_candidates(recall.unsqueeze(1), choices, threshold), choices, margin))
    return out


def evaluate_table(recs: dict, table: list[int], layers: int, heads: int,
                   choices: tuple[int, ...] = CALIBRATION_CHOICES) -> dict:
    """Decode-step mass and summaries scanned of a per-layer table (0 = flat) on one run and budget: per-layer means
    over KV heads, their mean, the worst layer, and the worst step."""
    mass, worst, scanned = [], [], []
    for layer, c in enumerate(table):
        entries = [recs[layer, h] for h in range(heads)]
        if c == 0:
            mass.append(sum(e["mass_flat"] for e in entries) / heads)
            worst.append(min(e["mass_flat_min"] for e in entries))
            scanned.append(1.0)
        else:
            i = choices.index(c)
            mass.append(sum(e["mass"][i] for e in entries) / heads)
            worst.append(min(e["mass_min"][i] for e in entries))
            scanned.append(sum(e["scanned"][i] for e in entries) / heads)
    low = min(range(layers), key=lambda layer: mass[layer])
    return {"table": list(table), "mass_mean": sum(mass) / layers, "worst_layer": low,
            "worst_layer_mass": mass[low], "worst_step": min(worst), "scanned_share": sum(scanned) / layers,
            "layer_mass": [round(m, 4) for m in mass]}
