"""The two-level selection's ``c`` per layer, found from the prompt's own last queries (issue 48; why this rule:
``kernels/NOTES.md``, two-level selection; measured: ``samples/studies/CALIBRATION.md``).

At the end of a prefill the page summaries and superpage centroids of the whole prompt exist. For the last
:data:`CALIBRATION_QUERIES` queries of the prompt (each over the pages before it, as a decode step would see
them) this module scores every complete page once (``score_pages``, paper Eq. 2), takes the flat scan's
selection (``select_pages``) and, for each ``c`` of :data:`CALIBRATION_CHOICES`, the two-level selection
(``ops.superpages``: superpage centroids, then the pages of the chosen superpages, their scores taken from the
same flat scores). The *recall* of ``c`` is the estimated mass (group-mean share of ``exp(score - lse)``, as
``select_pages`` ranks pages) on the two-level selection's pages over that on the flat scan's, forced pages left
out of both (every scan reads them). A layer takes the smallest ``c`` whose recall is at least the threshold for
every query in every KV head (the least of them, not their mean: a RULER many-key needle at 4K lost 2 of 25 samples
more than the flat scan with the mean, ``samples/results/2026-12-06_cpu_d840912/``), else the largest ``c``. No
keys are read: the rule needs only what decode already keeps.
"""

from __future__ import annotations

import torch
from torch import Tensor

from locks_engine.config import LocksConfig
from locks_engine.ops.score import score_pages
from locks_engine.ops.select import forced_page_mask, group_mass_shares, select_candidate_pages, select_pages
from locks_engine.ops.summaries import PageSummaries
from locks_engine.ops.superpages import candidate_pages, superpage_config, superpage_scores

#: the ``c`` a layer may take, ascending; the largest is the kernels' capacity (``locks_kernels.superpages``). At a
#: budget of a few percent of the context, 64 lists every superpage: that layer is scanned flat (``CALIBRATION.md``)
CALIBRATION_CHOICES = (4, 8, 16, 32, 64)
#: least recall of the flat scan's estimated mass a layer's ``c`` must reach (``samples/studies/CALIBRATION.md``)
CALIBRATION_THRESHOLD = 0.99
#: the prompt's last queries the recall is measured on
CALIBRATION_QUERIES = 16
#: steps of ``c`` the engine takes above the rule's pick (:func:`with_margin`): the prompt's queries do not see a
#: decode step copying a value whose page the pick leaves out (RULER 4K at 5%: the pick itself lost one many-key
#: needle sample of 50 that the flat scan keeps, one step above it none; ``samples/results/2026-12-06_cpu_d840912/``)
CALIBRATION_MARGIN = 1


def selected_shares(shares: Tensor, selected: Tensor, forced: Tensor) -> Tensor:
    """Estimated mass on a selection, forced pages left out.

    Args:
        shares (Tensor): fp32 `[S, H, Pmax]` group-mean mass shares (``group_mass_shares``).
        selected (Tensor): int64 `[S, H, K]` logical pages, ``-1`` in unused slots.
        forced (Tensor): bool `[S, Pmax]` (``forced_page_mask``).
    Returns:
        Tensor: fp32 `[S, H]`.
    """
    free = shares.masked_fill(forced.unsqueeze(1), 0.0)
    taken = torch.gather(free, -1, selected.clamp_min(0))
    return taken.masked_fill(selected < 0, 0.0).sum(-1)


def two_level_from_scores(scores: Tensor, coarse: Tensor, seq_lens: Tensor, num_kv_heads: int, cfg: LocksConfig,
                          candidates: int) -> Tensor:
    """``ops.superpages.select_two_level`` from scores already computed for every page: the superpages chosen from
    ``coarse``, then the top ``K`` of their pages by the same page scores (``score_candidate_pages`` of a page is
    its ``score_pages`` entry).

    Args:
        scores (Tensor): fp32 `[S, HQ, Pmax]` (``score_pages``). coarse (Tensor): fp32 `[S, HQ, NSmax]`
            (``superpage_scores``). seq_lens (Tensor): `[S]` tokens. num_kv_heads (int): H.
        cfg (LocksConfig): budget, forced pages. candidates (int): ``c >= 1``.
    Returns:
        Tensor: int64 `[S, H, K']` logical pages ascending, ``-1`` in unused slots, as ``select_two_level``.
    """
    chosen = select_pages(coarse, seq_lens, num_kv_heads, superpage_config(cfg, candidates))
    pages = candidate_pages(chosen, seq_lens, cfg.page_size)  # [S, H, C]
    groups = scores.shape[1] // num_kv_heads
    index = pages.clamp_min(0).repeat_interleave(groups, dim=1)
    picked = torch.gather(scores, -1, index).masked_fill(pages.repeat_interleave(groups, dim=1) < 0, float("-inf"))
    return select_candidate_pages(picked, pages, seq_lens, num_kv_heads, cfg)


def candidate_recall(
    q: Tensor,
    store: PageSummaries,
    superpages: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    num_kv_heads: int,
    cfg: LocksConfig,
    block_size: int,
    choices: tuple[int, ...] = CALIBRATION_CHOICES,
    scale: float | None = None,
) -> Tensor:
    """Recall of the flat scan's estimated mass by the two-level selection at each ``c`` (module doc).

    Args:
        q (Tensor): `[T, HQ, D]` queries, one a row (e.g. the prompt's last ``T``, each its own row).
        store (PageSummaries): page summaries by physical page id. superpages (Tensor): fp16 `[P, H, D]`.
        block_table (Tensor): `[T, max_blocks]` (the prompt's row repeated). seq_lens (Tensor): `[T]` tokens each
            query sees (its position + 1). num_kv_heads (int): H. cfg (LocksConfig): budget, forced pages.
        block_size (int): tokens a block. choices (tuple): the ``c`` measured. scale (float | None): softmax scale.
    Returns:
        Tensor: fp32 `[len(choices), T, H]` in ``[0, 1]``; 1 where the flat scan selects no free mass.
    """
    scores = score_pages(q, store, block_table, seq_lens, cfg.page_size, block_size, scale)  # [T, HQ, Pmax]
    coarse = superpage_scores(q, superpages, block_table, seq_lens, cfg.page_size, block_size, scale)
    return recall_from_scores(scores, coarse, seq_lens, num_kv_heads, cfg, choices)


def recall_from_scores(scores: Tensor, coarse: Tensor, seq_lens: Tensor, num_kv_heads: int, cfg: LocksConfig,
                       choices: tuple[int, ...] = CALIBRATION_CHOICES) -> Tensor:
    """``candidate_recall`` from page and superpage scores computed elsewhere (the Triton kernels on CUDA).

    Args:
        scores (Tensor): fp32 `[T, HQ, Pmax]` (``score_pages``). coarse (Tensor): fp32 `[T, HQ, NSmax]`
            (``superpage_scores``). seq_lens (Tensor): `[T]` tokens. num_kv_heads (int): H.
        cfg (LocksConfig): budget, forced pages. choices (tuple): the ``c`` measured.
    Returns:
        Tensor: fp32 `[len(choices), T, H]`, as ``candidate_recall``.
    """
    shares = group_mass_shares(scores, num_kv_heads)
    forced = forced_page_mask(seq_lens, scores.shape[-1], cfg)
    flat = selected_shares(shares, select_pages(scores, seq_lens, num_kv_heads, cfg), forced)  # [T, H]
    out = []
    for c in choices:
        kept = selected_shares(shares, two_level_from_scores(scores, coarse, seq_lens, num_kv_heads, cfg, c), forced)
        out.append(torch.where(flat > 0, kept / flat.clamp_min(1e-30), torch.ones_like(flat)).clamp(0.0, 1.0))
    return torch.stack(out)


def pick_from_scores(scores: Tensor, coarse: Tensor, seq_lens: Tensor, num_kv_heads: int, cfg: LocksConfig,
                     threshold: float = CALIBRATION_THRESHOLD, choices: tuple[int, ...] = CALIBRATION_CHOICES) -> int:
    """``pick_candidates(recall_from_scores(...))`` measuring the ``c`` in ascending order and stopping at the
    first that passes: the engine's calibration, which most layers end at the smallest ``c`` (one host sync a
    ``c`` measured).

    Args:
        scores, coarse, seq_lens, num_kv_heads, cfg: as ``recall_from_scores``. threshold (float): in ``(0, 1]``.
        choices (tuple): ascending.
    Returns:
        int: ``c``, the largest of ``choices`` when none passes.
    """
    shares = group_mass_shares(scores, num_kv_heads)
    forced = forced_page_mask(seq_lens, scores.shape[-1], cfg)
    flat = selected_shares(shares, select_pages(scores, seq_lens, num_kv_heads, cfg), forced)  # [T, H]
    for c in choices[:-1]:
        kept = selected_shares(shares, two_level_from_scores(scores, coarse, seq_lens, num_kv_heads, cfg, c), forced)
        recall = torch.where(flat > 0, kept / flat.clamp_min(1e-30), torch.ones_like(flat)).clamp(0.0, 1.0)
        if float(recall.amin()) >= threshold:
            return c
    return choices[-1]


def pick_candidates(recall: Tensor, choices: tuple[int, ...] = CALIBRATION_CHOICES,
                    threshold: float = CALIBRATION_THRESHOLD) -> int:
    """The smallest ``c`` of ``choices`` whose recall reaches ``threshold`` for every query in every KV head; the
    largest ``c`` when none does.

    Args:
        recall (Tensor): `[len(choices), T, H]` (``candidate_recall``). choices (tuple): ascending.
        threshold (float): in ``(0, 1]``.
    Returns:
        int: ``c``.
    Raises:
        ValueError: ``recall``'s first dimension is not ``len(choices)``, or choices not ascending.
    """
    if recall.shape[0] != len(choices) or list(choices) != sorted(choices):
        raise ValueError(f"pick_candidates: recall of shape {tuple(recall.shape)} for choices {choices}: "
                         "one row per choice, choices ascending")
    worst = recall.float().flatten(1).amin(dim=1)  # [C]
    return next((c for c, r in zip(choices, worst.tolist()) if r >= threshold), choices[-1])


def with_margin(c: int, choices: tuple[int, ...] = CALIBRATION_CHOICES, margin: int = CALIBRATION_MARGIN) -> int:
    """The ``c`` ``margin`` steps above ``c`` in ``choices`` (ascending), the largest at most.

    Raises:
        ValueError: ``c`` is not one of ``choices``, or ``margin`` is negative.
    """
    if c not in choices or margin < 0:
        raise ValueError(f"with_margin: c={c} among {choices}, margin={margin} >= 0")
    return choices[min(choices.index(c) + margin, len(choices) - 1)]


def prompt_queries(query_len: int, seq_len: int, count: int = CALIBRATION_QUERIES) -> tuple[slice, Tensor]:
    """The last ``count`` query tokens of a prefill row and the tokens each sees.

    Args:
        query_len (int): the row's query tokens this step. seq_len (int): its tokens after the step.
        count (int): queries wanted.
    Returns:
        tuple: the slice of the row's query tokens and int32 `[T]` tokens each sees (``T = min(count,
        query_len)``).
    """
    take = min(count, query_len)
    return slice(query_len - take, query_len), torch.arange(seq_len - take + 1, seq_len + 1, dtype=torch.int32)
