"""Cheaper page selection (issue 27, part 1): the candidates' selection rules and their bytes per decode step,
on the decode steps of one layer and KV head (``locks_studies.fidelity.DecodeSteps``).

The flat scan (today) reads and scores every complete page's summary at every step in every layer. The
candidates read less:

- **two levels**: a coarse summary per *superpage* of ``SP`` pages (``coarse_scores``: ``centroid``, ``minmax``
  or ``pagecent``) ranks the complete superpages; the full page summaries are read only inside the ``M`` best
  (``two_level_mask``) and in the incomplete last superpage, which has no coarse summary yet;
- **reuse across steps**: a selection made at step ``t - lag`` is read again at ``t``, with the pages forced at
  ``t`` (sink, recent, last) and the pages completed since (``reuse_masks``); rescoring every ``k`` steps
  means lags ``0 .. k-1`` equally often;
- **reuse across layers**: anchor layers score, every other layer reads the selection of the anchor before it,
  anchors chosen by measured top-K overlap (``selection_overlap``, ``choose_anchors``), as IndexCache and
  Kascade do;
- **leaner summaries**: a lower rank, or one basis per superpage instead of one per page
  (``superpage_basis_scores``);
- **fused scoring and top-K**: the same selection without the scores' round trip through memory (bytes only).

Bytes per decode step, one layer and KV head, as a fraction of dense K+V (``step_bytes``), with ``s`` the
bytes of a page summary, ``c`` of a coarse summary, ``p = 2 B D * 2`` of a page's bf16 K+V::

    bytes = (a / k) * (n_scored * s + n_coarse * c) + n_read * p        dense = n_pages * p

``n_scored`` page summaries and ``n_coarse`` coarse summaries read at a scoring step, ``n_read`` pages whose
K+V are read (budget, forced and reused pages; measured), ``k`` the rescoring interval, ``a`` the share of
layers that score. Kernels that write the scores and read them back (today's ``score_pages`` then
``select_pages``: one fp32 write and two reads per query head, ``kernels/NOTES.md``) add
``(a / k) * 12 G (n_scored + n_coarse)`` (``score_traffic``). Writing a completed page's summary is the same
for every candidate and is not counted.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from locks_engine.config import LocksConfig
from locks_studies.fidelity import DecodeSteps
from locks_engine.ops import build_cache_summaries, build_shared_basis_summaries, fit_shared_basis, summary_bytes
from locks_engine.ops.quant import dequantize, quantize_symmetric
from locks_engine.ops.select import forced_page_mask, group_mass_shares
from locks_engine.ops.superpages import (
    allocate_superpages, completed_superpages, select_two_level, write_superpage_centroids,
)

COARSE_KINDS = ("centroid", "minmax", "pagecent")


def complete_pages(seq_lens: Tensor, page_size: int) -> Tensor:
    """int64 `[T]`: pages with a summary (all ``B`` tokens written) at each step."""
    return seq_lens.long() // page_size


def superpage_keys(steps: DecodeSteps, superpage: int) -> Tensor:
    """fp32 `[NS, SP, B, D]`: the keys of every whole superpage of ``superpage`` pages in ``steps.keys``."""
    count = steps.pages // superpage
    return steps.k_pages[: count * superpage, :, 0].reshape(count, superpage, steps.page_size, -1)


def _coarse_summaries(keys: Tensor, kind: str, rank: int) -> dict[str, Tensor]:
    """The stored tensors of the coarse summaries of superpages `[NS, SP, B, D]`, as their bytes are counted."""
    if kind == "centroid":
        return {"centroid": keys.mean((1, 2)).half()}  # [NS, D]
    if kind == "minmax":  # Quest's bound over the superpage
        return {"key_min": keys.amin((1, 2)).half(), "key_max": keys.amax((1, 2)).half()}
    if kind != "pagecent":
        raise ValueError(f"coarse kind {kind!r}: allowed {', '.join(COARSE_KINDS)}")
    # page centroids in a rank-r basis of the superpage: mu_j ~ mu_S + a_j V_S
    centroids = keys.double().mean(2)  # [NS, SP, D]
    mean = centroids.mean(1, keepdim=True)
    spread = centroids - mean
    _, vecs = torch.linalg.eigh(spread.transpose(1, 2) @ spread)
    basis, basis_scale = quantize_symmetric(vecs.flip(-1)[..., :rank].transpose(1, 2), (-1,), 8)  # [NS, r, D]
    stored = dequantize(basis, basis_scale).double()
    gram = stored @ stored.transpose(1, 2)
    coeffs = spread @ stored.transpose(1, 2) @ torch.linalg.pinv(gram, hermitian=True)  # [NS, SP, r]
    coeffs, coeffs_scale = quantize_symmetric(coeffs, (-2,), 8)
    return {"centroid": mean[:, 0].half(), "basis": basis, "basis_scale": basis_scale, "coeffs": coeffs,
            "coeffs_scale": coeffs_scale}


@functools.cache
def coarse_bytes(kind: str, dim: int, superpage: int, page_size: int = 16, rank: int = 4) -> int:
    """Bytes of one superpage's coarse summary, one KV head, measured from allocated tensors.

    Raises:
        ValueError: on an unknown ``kind``.
    """
    keys = torch.randn(1, superpage, page_size, dim, generator=torch.Generator().manual_seed(0))
    return sum(t.numel() * t.element_size() for t in _coarse_summaries(keys, kind, rank).values())


def coarse_scores(steps: DecodeSteps, kind: str, superpage: int, rank: int = 4) -> Tensor:
    """Estimated log mass of every superpage from its coarse summary only.

    ``centroid``: ``scale * q.mu_S``; ``minmax``: Quest's bound ``scale * sum_d max(q_d min_d, q_d max_d)``
    (Tang et al. 2024, Section 3) over the superpage's keys; ``pagecent``: ``logsumexp_j scale * q.mu_j`` over the
    page centroids, each stored as ``mu_S + a_j V_S`` in a rank-``rank`` int8 basis of the superpage. A constant
    ``log(SP B)`` is left out (it does not change the ranking).

    Args:
        steps (DecodeSteps): decode steps `[T]` of one layer and KV head.
        kind (str): one of ``COARSE_KINDS``; superpage (int): SP pages; rank (int): r of ``pagecent``.
    Returns:
        Tensor: fp32 `[T, G, NS]`, ``NS = P // SP``; ``-inf`` for a superpage not complete at the step.
    Raises:
        ValueError: on an unknown ``kind``.
    """
    stored = _coarse_summaries(superpage_keys(steps, superpage), kind, rank)
    q = steps.q * steps.scale
    if kind == "centroid":
        scores = torch.einsum("tgd,sd->tgs", q, stored["centroid"].float())
    elif kind == "minmax":
        pos = q.clamp_min(0)
        scores = (torch.einsum("tgd,sd->tgs", pos, stored["key_max"].float())
                  + torch.einsum("tgd,sd->tgs", q - pos, stored["key_min"].float()))
    else:
        basis = dequantize(stored["basis"], stored["basis_scale"])  # [NS, r, D]
        coeffs = dequantize(stored["coeffs"], stored["coeffs_scale"])  # [NS, SP, r]
        q_mu = torch.einsum("tgd,sd->tgs", q, stored["centroid"].float())
        q_v = torch.einsum("tgd,srd->tgsr", q, basis)
        scores = q_mu + torch.einsum("tgsr,sjr->tgsj", q_v, coeffs).logsumexp(-1)
    done = complete_pages(steps.seq_lens, steps.page_size) // superpage  # [T]
    whole = torch.arange(scores.shape[-1]) < done.unsqueeze(1)  # [T, NS]
    return scores.masked_fill(~whole.unsqueeze(1), float("-inf"))


def two_level_mask(
    steps: DecodeSteps, page_scores: Tensor, coarse: Tensor, superpage: int, candidates: int, cfg: LocksConfig
) -> tuple[Tensor, Tensor, Tensor]:
    """Selection of a two-level scan: the ``candidates`` complete superpages of largest group-mean coarse share
    (GQA, as ``select_pages`` averages page shares), then ``select_pages`` over the pages of those superpages and
    of the incomplete last superpage, with the forced pages.

    Args:
        steps (DecodeSteps): `[T]` decode steps; page_scores (Tensor): `[T, G, P]` page scores (``-inf`` where
            incomplete); coarse (Tensor): `[T, G, NS]` from ``coarse_scores``; superpage (int): SP;
        candidates (int): M superpages whose page summaries are read; cfg (LocksConfig): budget, forced pages.
    Returns:
        tuple: ``(mask, n_scored, n_coarse)``: bool `[T, P]` pages read; int64 `[T]` page summaries read;
        int64 `[T]` coarse summaries read. With ``M >= NS`` the mask is the flat scan's selection.
    """
    seq_lens, pages = steps.seq_lens, steps.pages
    done = complete_pages(seq_lens, steps.page_size)  # [T]
    whole = done // superpage  # [T] complete superpages
    shares = group_mass_shares(coarse, 1)[:, 0]  # [T, NS], zeros where incomplete
    shares = shares.masked_fill(torch.arange(coarse.shape[-1]) >= whole.unsqueeze(1), -1.0)
    chosen = torch.zeros_like(shares, dtype=torch.bool)
    chosen.scatter_(1, shares.topk(min(candidates, shares.shape[1]), dim=1).indices, True)
    chosen &= shares >= 0
    page = torch.arange(pages)
    in_chosen = torch.zeros(len(seq_lens), pages, dtype=torch.bool)
    in_chosen[:, : chosen.shape[1] * superpage] = chosen.repeat_interleave(superpage, dim=1)
    tail = (page >= (whole * superpage).unsqueeze(1)) & (page < done.unsqueeze(1))
    scored = in_chosen | tail  # [T, P]
    selected = steps.selected_mask(page_scores.masked_fill(~scored.unsqueeze(1), float("-inf")), cfg)
    mask = selected & (scored | forced_page_mask(seq_lens, pages, cfg))
    return mask, scored.sum(1), whole


def reuse_masks(masks: Tensor, seq_lens: Tensor, at: Tensor, lags: int, cfg: LocksConfig) -> Tensor:
    """Selections read at steps ``at`` when the selection is rescored every ``lags`` steps: for lag
    ``l = 0 .. lags-1``, the selection of step ``at - l``, the pages forced at ``at`` and the pages completed
    since ``at - l`` (LServe's reuse, ``--selector-update-interval``).

    Args:
        masks (Tensor): bool `[T, P]` per-step selections of consecutive decode steps.
        seq_lens (Tensor): `[T]` tokens; at (Tensor): int64 `[E]` steps read, each with ``lags - 1`` steps of the
            same run before it; lags (int): k >= 1; cfg (LocksConfig): forced pages.
    Returns:
        Tensor: bool `[k, E, P]`; lag 0 is the per-step selection ``masks[at]``.
    Raises:
        ValueError: when a step ``at - l`` is not the decode step just ``l`` tokens before ``at``.
    """
    prior = at.unsqueeze(0) - torch.arange(lags).unsqueeze(1)  # [k, E]
    if (prior < 0).any() or not torch.equal(seq_lens[prior], seq_lens[at] - torch.arange(lags).unsqueeze(1)):
        raise ValueError("reuse_masks: every step read needs the lags - 1 consecutive decode steps before it")
    pages = masks.shape[1]
    page = torch.arange(pages)
    done_now = page < complete_pages(seq_lens[at], cfg.page_size).unsqueeze(1)  # [E, P]
    done_then = page < complete_pages(seq_lens[prior], cfg.page_size).unsqueeze(-1)  # [k, E, P]
    forced = forced_page_mask(seq_lens[at], pages, cfg)  # [E, P]
    return masks[prior] | forced | (done_now & ~done_then)


def selection_overlap(first: Tensor, second: Tensor, forced: Tensor) -> Tensor:
    """Share of ``second``'s chosen pages (beyond the forced ones) that ``first`` chooses too, per step.

    Args:
        first, second (Tensor): bool `[..., P]` selections; forced (Tensor): bool `[..., P]`.
    Returns:
        Tensor: fp32 `[...]` in ``[0, 1]`` (1 where ``second`` chooses nothing beyond the forced pages).
    """
    free = second & ~forced
    wanted = free.sum(-1)
    hits = (free & first).sum(-1)
    return torch.where(wanted > 0, hits / wanted.clamp_min(1), torch.ones_like(hits, dtype=torch.float32))


def choose_anchors(overlap: Tensor, count: int) -> list[int]:
    """The ``count`` anchor layers that maximize the summed overlap ``overlap[a(l), l]`` of every layer ``l``
    with its anchor ``a(l)``, the last anchor at or before it (layer 0 is an anchor; dynamic programming over
    the segments ``[a, next anchor)``).

    Args:
        overlap (Tensor): `[L, L]`, ``overlap[a, l]``: how much of layer ``l``'s selection layer ``a``'s covers.
        count (int): anchors, ``1 <= count <= L``.
    Returns:
        list[int]: ascending layer indices, ``[0, ...]``.
    Raises:
        ValueError: on a ``count`` outside ``1 .. L``.
    """
    layers = overlap.shape[0]
    if not 1 <= count <= layers:
        raise ValueError(f"choose_anchors: count={count}: allowed 1..{layers}")
    ov = overlap.double()
    # gain[a, b]: overlap of the followers a+1 .. b-1 of an anchor a whose segment ends before b
    gain = torch.zeros(layers + 1, layers + 1, dtype=torch.float64)
    for a in range(layers):
        gain[a, a + 1:] = torch.cat((ov.new_zeros(1), ov[a, a + 1:].cumsum(0)))
    best = torch.full((count + 1, layers + 1), -math.inf, dtype=torch.float64)  # best[n, b]: n anchors cover 0..b-1
    back = torch.zeros(count + 1, layers + 1, dtype=torch.long)
    for b in range(1, layers + 1):
        best[1, b] = gain[0, b]
    for n in range(2, count + 1):
        for b in range(n, layers + 1):
            options = torch.tensor([best[n - 1, a] + gain[a, b] for a in range(n - 1, b)])
            best[n, b], back[n, b] = options.max(), options.argmax() + n - 1
    anchors, b = [], layers
    for n in range(count, 1, -1):
        b = int(back[n, b])
        anchors.append(b)
    return [0] + anchors[::-1]


def follower_of(anchors: list[int], layers: int) -> list[int]:
    """`[L]`: the anchor each layer reads its selection from (itself for an anchor)."""
    return [max(a for a in anchors if a <= layer) for layer in range(layers)]


@functools.cache
def page_bytes(summary: str, rank: int, dim: int, page_size: int = 16, superpage: int = 16) -> int:
    """Bytes of one page's summary and KV head: ``summary_bytes`` for a page-local format (``colwise8``,
    ``colwise``, ...); for ``superpage-basis``, ``build_shared_basis_summaries``'s tensors of one page plus
    1/SP of the fp16 basis `[r, D]` its superpage shares."""
    if summary != "superpage-basis":
        return summary_bytes(page_size, rank, dim, summary)[0]
    keys = torch.zeros(superpage, page_size, 1, dim)
    store = build_shared_basis_summaries(keys, torch.zeros(1, rank, dim))
    return round(store.nbytes / superpage + rank * dim * 2 / superpage)


def superpage_basis_scores(steps: DecodeSteps, rank: int, superpage: int, local: Tensor) -> Tensor:
    """Paper Eq. 2 with one basis per superpage, shared by its pages (fp16 basis `[r, D]` fitted on the
    superpage's centered keys, ``fit_shared_basis``; per-page fp16 centroid and int8 coefficients,
    ``build_shared_basis_summaries``). Pages of the incomplete last superpage keep their page-local scores.

    Args:
        steps (DecodeSteps): `[T]` decode steps; rank (int): r; superpage (int): SP;
        local (Tensor): `[T, G, P]` page-local scores (``DecodeSteps.scores("locks", ...)``).
    Returns:
        Tensor: fp32 `[T, G, P]`, ``-inf`` where ``local`` is.
    """
    keys = superpage_keys(steps, superpage).transpose(0, 1).transpose(1, 2)  # [SP, B, NS, D]: superpage as "head"
    basis = fit_shared_basis(keys, rank).half().float()  # [NS, r, D]
    store = build_shared_basis_summaries(keys, basis)
    centroid = store.centroid.float()  # [SP, NS, D]
    coeffs = dequantize(store.coeffs, store.coeffs_scale)  # [SP, NS, B, r]
    q = steps.q * steps.scale
    q_mu = torch.einsum("tgd,jsd->tgsj", q, centroid)
    q_v = torch.einsum("tgd,srd->tgsr", q, basis)
    scores = (q_mu + torch.einsum("tgsr,jsbr->tgsjb", q_v, coeffs).logsumexp(-1)).flatten(2)  # [T, G, NS*SP]
    whole = complete_pages(steps.seq_lens, steps.page_size) // superpage * superpage  # [T]
    shared = torch.arange(local.shape[-1])[: scores.shape[-1]] < whole.unsqueeze(1)  # [T, NS*SP]
    out = local.clone()
    out[..., : scores.shape[-1]] = torch.where(shared.unsqueeze(1), scores, local[..., : scores.shape[-1]])
    return out.masked_fill(torch.isinf(local), float("-inf"))


def step_bytes(n_scored: float, n_coarse: float, n_read: float, summary: int, coarse: int, kv_page: int,
               interval: int = 1, scoring_share: float = 1.0) -> float:
    """Bytes one decode step reads in one layer and KV head (module docstring):
    ``(a / k) * (n_scored * s + n_coarse * c) + n_read * p``; counts may be means over steps.

    Raises:
        ValueError: on ``interval < 1`` or a ``scoring_share`` outside ``(0, 1]``.
    """
    if interval < 1 or not 0 < scoring_share <= 1:
        raise ValueError(f"step_bytes: interval={interval} (allowed >= 1), scoring_share={scoring_share} "
                         "(allowed (0, 1])")
    return scoring_share / interval * (n_scored * summary + n_coarse * coarse) + n_read * kv_page


def score_traffic(n_scored: float, n_coarse: float, groups: int, interval: int = 1,
                  scoring_share: float = 1.0) -> float:
    """Bytes of scores that unfused kernels write and read back per step, layer and KV head: one fp32 write and
    two reads per query head and scored unit, ``(a / k) * 12 G (n_scored + n_coarse)``."""
    return scoring_share / interval * 12 * groups * (n_scored + n_coarse)


def paged_summaries(steps: DecodeSteps) -> tuple:
    """``(store, superpages, block_table)`` of one KV head's keys as a paged cache of one page a block, every
    complete page and superpage summarized (a step masks what is not complete at its length)."""
    cfg = LocksConfig()
    pages, n = steps.pages, steps.pages * steps.page_size
    k_cache = steps.k_pages  # [P, B, 1, D]: block = page
    table = torch.arange(pages, dtype=torch.int32).view(1, -1)
    full = torch.tensor([n], dtype=torch.int32)
    store = build_cache_summaries(k_cache, table, full, cfg)
    superpages = allocate_superpages(pages, 1, k_cache.shape[-1], "cpu")
    write_superpage_centroids(superpages, store, completed_superpages(full, full, table, steps.page_size,
                                                                      steps.page_size))
    return store, superpages, table


def shipped_two_level_mask(steps: DecodeSteps, at: Tensor, cfg: LocksConfig, candidates: int, cache: tuple
                           ) -> tuple[Tensor, list[int]]:
    """bool `[E, P]` pages the shipped two-level selection (``locks_engine.ops.superpages.select_two_level``) reads
    at steps ``at`` `[E]`, on ``paged_summaries``' cache, and the page summaries it scored at each."""
    store, superpages, table = cache
    mask = torch.zeros(len(at), steps.pages + 1, dtype=torch.bool)
    scanned = []
    for i, t in enumerate(at.tolist()):
        seq = steps.seq_lens[t : t + 1].int()
        selected, pages = select_two_level(steps.q[t : t + 1], store, superpages, table, seq, 1, cfg, candidates,
                                           steps.page_size, steps.scale)
        mask[i].scatter_(0, torch.where(selected[0, 0] < 0, steps.pages, selected[0, 0]), True)
        scanned.append(int(((pages >= 0) & (pages < int(seq) // steps.page_size)).sum()))
    return mask[:, : steps.pages], scanned
