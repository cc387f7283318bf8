"""A budget that follows the mass: fixed top-K pages against top-p pages at the same mean pages (issue 28's reading).

RULER's failures at 16K-32K are the budget's, not the summaries' (``ruler_failure.py``: LOCKS keeps the exact
oracle's mass at the same ``K``, but a few layers spread theirs over 30-50% of the pages). This measures, offline,
the alternative a kernel could run under CUDA graphs with a static ``K_max``: per step, layer and KV head, read
pages in LOCKS' order (forced pages first, then by the estimated share of the group's mass, as ``select_pages``
ranks them) until the estimated shares add up to ``p``, at most ``K_max``; ``p`` is set so that the mean pages read
over every step, layer and KV head equal the fixed budget's ``K`` (the same K+V bytes on average). Top-p over
estimated masses is the rule of Twilight (Lin et al., 2025, "adaptive attention sparsity with hierarchical top-p
pruning"), here on LOCKS' page estimates.
"""

from __future__ import annotations

import torch
from torch import Tensor

from locks_engine.config import LocksConfig
from locks_studies.fidelity import DecodeSteps
from locks_engine.ops.select import forced_page_mask


def read_order(steps: DecodeSteps, scores: Tensor, cfg: LocksConfig) -> dict[str, Tensor]:
    """The pages of each step in the order a selector reads them, with estimated and true masses.

    Args:
        steps (DecodeSteps): one KV head's captured steps (``T`` steps, ``P`` pages).
        scores (Tensor): `[T, G, P]` estimated log masses (``steps.scores``), ``-inf`` where not scored.
        cfg (LocksConfig): sink and recent pages (forced, read first).
    Returns:
        dict: ``est_cum`` `[T, P]` estimated group-mean share, cumulated in read order (each query head's shares
        normalized over its scored pages); ``true_cum`` `[T, P]` true group-mean mass, cumulated in that order;
        ``order`` `[T, P]` page ids in that order; ``forced`` `[T]` forced pages; ``valid`` `[T]` pages the step
        can read (its partial last page included).
    """
    pages = scores.shape[-1]
    est = torch.softmax(scores.float(), -1).nan_to_num(0.0).mean(1)  # [T, P]
    true = torch.exp(steps.page_lse - steps.lse.unsqueeze(-1)).mean(1)  # [T, P]
    forced = forced_page_mask(steps.seq_lens, pages, cfg)  # [T, P]
    page_ids = torch.arange(pages)
    valid = page_ids < ((steps.seq_lens.long() + cfg.page_size - 1) // cfg.page_size).unsqueeze(1)
    priority = torch.where(forced, 2.0, est).masked_fill(~valid, -1.0)
    order = priority.sort(dim=-1, descending=True, stable=True).indices
    return {"est_cum": est.gather(-1, order).cumsum(-1), "true_cum": true.gather(-1, order).cumsum(-1),
            "order": order, "forced": forced.sum(-1), "valid": valid.sum(-1)}


def pages_fixed(ordered: dict[str, Tensor], k: int) -> Tensor:
    """int64 `[T]`: pages a fixed budget of ``k`` pages reads (every page when the step has fewer)."""
    return ordered["valid"].clamp(max=max(k, 1)).maximum(ordered["forced"])


def pages_top_p(ordered: dict[str, Tensor], level: float, k_max: int, k_min: int = 0) -> Tensor:
    """int64 `[T]`: the fewest pages in read order whose estimated shares reach ``level``, at least ``k_min`` and
    the forced pages, at most ``k_max`` and the step's pages."""
    n = (ordered["est_cum"] < level).sum(-1) + 1
    return n.clamp(min=k_min, max=k_max).minimum(ordered["valid"]).maximum(ordered["forced"])


def kept(ordered: dict[str, Tensor], n: Tensor) -> Tensor:
    """fp32 `[T]`: true group-mean mass on the first ``n`` `[T]` pages of the read order."""
    return ordered["true_cum"].gather(-1, (n - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1)


def reads(ordered: dict[str, Tensor], n: Tensor, page_list: list[int]) -> Tensor:
    """fp32 `[T]`: share of ``page_list`` among the first ``n`` `[T]` pages of the read order (NaN if empty)."""
    if not page_list:
        return torch.full(n.shape, float("nan"))
    rank = ordered["order"].argsort(-1)  # [T, P]: position of each page in the read order
    return (rank[:, page_list] < n.unsqueeze(-1)).float().mean(-1)


def level_for_mean_pages(orders: list[dict[str, Tensor]], target: float, k_max: int, k_min: int = 0,
                         iters: int = 40) -> float:
    """The ``p`` in ``[0, 1]`` whose top-p (within ``k_min .. k_max`` pages) reads ``target`` pages on average over
    ``orders`` (bisection; the mean rises with ``p``). Raises ValueError when even ``p = 1`` reads fewer, or
    ``p = 0`` (``k_min`` pages) more."""
    def mean_pages(level: float) -> float:
        return torch.cat([pages_top_p(o, level, k_max, k_min).float() for o in orders]).mean().item()

    if mean_pages(0.0) > target:
        raise ValueError(f"top-p reads at least {mean_pages(0.0):.1f} pages on average (k_min = {k_min}), "
                         f"above the target {target:.1f}")
    if mean_pages(1.0) < target:
        raise ValueError(f"top-p reads at most {mean_pages(1.0):.1f} pages on average (k_max = {k_max}), "
                         f"below the target {target:.1f}")
    lo, hi = 0.0, 1.0
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_pages(mid) < target else (lo, mid)
    return hi


def compare(orders: list[list[dict[str, Tensor]]], k: int, k_max: int,
            word_page_lists: dict[str, list[int]], steps_of_word: dict[str, list[int]], k_min: int = 0) -> dict:
    """Fixed top-``k`` against top-p at the same mean pages, over a capture's layers and KV heads.

    Args:
        orders (list): ``orders[layer][kv_head]``, ``read_order``'s output (``T`` steps each).
        k (int): the fixed budget (pages); k_max, k_min (int): top-p's bounds (pages; ``k_max`` is static under
            CUDA graphs; ``k_min`` a floor every layer keeps).
        word_page_lists (dict): word -> pages holding it; steps_of_word (dict): word -> steps that write it.
    Returns:
        dict: ``level`` (p), and per policy (``fixed``, ``top_p``): ``kept_mean``, ``kept_per_layer`` (mean over
        KV heads and steps), ``kept_worst_layer`` (its index and value), ``pages_per_layer`` (mean pages read),
        ``word_read`` (word -> share of its pages read at its steps, mean over layers and KV heads),
        ``word_read_all_steps`` (the same over every step).
    """
    flat = [o for layer in orders for o in layer]
    target = float(torch.cat([pages_fixed(o, k).float() for o in flat]).mean())
    level = level_for_mean_pages(flat, target, k_max, k_min)
    out = {"k": k, "k_max": k_max, "k_min": k_min, "level": round(level, 4)}
    for name, pick in (("fixed", lambda o: pages_fixed(o, k)),
                       ("top_p", lambda o: pages_top_p(o, level, k_max, k_min))):
        kept_l, pages_l, words = [], [], {w: [] for w in word_page_lists}
        words_all = {w: [] for w in word_page_lists}
        for layer in orders:
            ns = [pick(o) for o in layer]
            kept_l.append(torch.stack([kept(o, n) for o, n in zip(layer, ns)]).mean().item())
            pages_l.append(torch.stack([n.float() for n in ns]).mean().item())
            for w, pl in word_page_lists.items():
                read = torch.stack([reads(o, n, pl) for o, n in zip(layer, ns)])  # [H, T]
                words_all[w].append(read.mean().item())
                if steps_of_word.get(w):
                    words[w].append(read[:, steps_of_word[w]].mean().item())
        worst = min(range(len(kept_l)), key=kept_l.__getitem__)
        out[name] = {"kept_mean": round(sum(kept_l) / len(kept_l), 4),
                     "kept_per_layer": [round(x, 3) for x in kept_l],
                     "kept_worst_layer": [worst, round(kept_l[worst], 3)],
                     "pages_per_layer": [round(x, 1) for x in pages_l],
                     "word_read": {w: round(sum(v) / len(v), 3) for w, v in words.items() if v},
                     "word_read_all_steps": {w: round(sum(v) / len(v), 3) for w, v in words_all.items() if v}}
    return out
