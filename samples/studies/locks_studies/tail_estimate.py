"""Estimate the pages a step skips instead of dropping them, and size the budget by mass (issue 47, item 2).

On one layer and KV head of a capture (``DecodeSteps`` with values), every design is a selection mask `[T, P]` of
pages read exactly plus, optionally, a tail: the unread pages' estimated log masses `[T, G, P]` and their mean value
vectors (``locks_engine.ops.tail``), merged with the exact split by log-sum-exp. Measures per step and query head:

- ``err``: ``|o - o_dense| / |o_dense|`` of the attention output (the quantity the next token depends on);
- ``kept``: true attention mass on the pages read exactly (group mean);
- ``needle``: share of the needle's pages read exactly (KV head level); ``needle_mass``: their true mass;
- ``pages``: pages read exactly; ``tail_bias``: ``log(true tail mass / estimated tail mass)`` (0: unbiased).

Selections: ``fixed`` (today's top-k in LOCKS' read order: forced pages, then the largest estimated group share;
``mass_budget.read_order``), ``oracle`` (the exact-LSE oracle at the same budget) and ``mass`` (per KV head, pages in
read order until the estimated share reaches ``p``, at least ``floor`` and at most ``cap`` pages:
``mass_budget.pages_top_p``; Twilight's top-p on LOCKS' estimates). Tails: ``est-bf16`` / ``est-int8`` (LOCKS'
``s_j`` with ``vbar`` in bf16 / int8), ``centroid`` (``s_j = scale q.mu_j + log B``, the page centroid alone),
``super`` (superpages of 16 pages that hold no page read enter as one term, ``scale q.mu_u + log 256`` with the
superpage's mean value: what the two-level selection has for superpages it never expands), ``true`` (the exact page
masses with bf16 ``vbar``: the floor of the mean-value approximation), ``half`` (each page as two 8-token halves,
their log masses from the summary's approximate logits, ``logsumexp`` over the half's tokens of
``scale (q.mu + (V q).c_i)``, and int8 half-page means: twice the tail bytes), ``bc`` (``est-int8`` with a
per-layer factor ``exp(b_l)`` on the tail masses, ``b_l`` the median log ratio of true to estimated tail mass on
other steps: ``fit_bias``) and ``fit`` (the same factor, ``b_l`` chosen on other steps to minimize the output error:
a shrinkage of the tail).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from locks_engine.config import LocksConfig
from locks_engine.ops import build_page_summaries
from locks_engine.ops.tail import merge_splits, page_value_means, store_value_means, tail_split
from locks_studies.fidelity import DecodeSteps
from locks_studies.mass_budget import pages_top_p, read_order

#: tails measured (module docstring)
TAILS = ("none", "est-bf16", "est-int8", "centroid", "super", "true", "half", "bc", "fit")
#: tails whose log masses take a per-layer bias ``b_l`` fitted on other steps
FITTED = ("bc", "fit")
#: pages a superpage (``locks_engine.ops.superpages.SUPERPAGE_PAGES``)
SUPER = 16


def mask_first(order: Tensor, n: Tensor) -> Tensor:
    """bool `[T, P]`: the first ``n`` `[T]` pages of each step's read order ``order`` `[T, P]`."""
    rank = order.argsort(-1)
    return rank < n.unsqueeze(-1)


def mass_sized_pages(ordered: dict[str, Tensor], level: float, floor: int, cap: int) -> Tensor:
    """int64 `[T]`: pages a mass-sized budget reads: the fewest in read order whose estimated shares reach
    ``level``, at least ``floor`` (and the forced pages), at most ``cap`` and the step's pages.

    Raises:
        ValueError: when ``floor > cap``.
    """
    if floor > cap:
        raise ValueError(f"floor {floor} pages is above the cap {cap}")
    return pages_top_p(ordered, level, cap, floor)


def exact_split(steps: DecodeSteps, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Exact attention over the pages of ``mask`` bool `[T, P]`: (``out`` `[T, G, D]`, ``lse`` `[T, G]`, ``kept``
    `[T, G]` its share of the dense mass), from the captured per-page shares of the dense output."""
    kept = steps.mass_kept(mask)
    num = torch.bmm(mask.float().unsqueeze(1), steps.page_out).view_as(steps.out_dense)
    out = num / kept.clamp_min(1e-30).unsqueeze(-1)
    return out, steps.lse + torch.log(kept), kept


def relative_error(out: Tensor, ref: Tensor) -> Tensor:
    """`[...]` ``|out - ref| / |ref|`` over the last dim (0 where both are 0)."""
    return (out - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)


def superpage_tail(steps: DecodeSteps, mask: Tensor, page_scores: Tensor, page_means: Tensor,
                   values: Tensor) -> tuple[Tensor, Tensor]:
    """The ``super`` tail: log masses `[T, G, P']` and means `[P', D]` over ``P' = P + P / 16`` slots: the unread
    pages of superpages holding a read page (page level, ``page_scores``) and, for every complete superpage with no
    read page, one term ``scale q.mu_u + log(16 B)`` with the superpage's mean value (the other slots ``-inf``)."""
    pages, dim = steps.pages, steps.keys.shape[1]
    supers = pages // SUPER
    b = steps.page_size
    touched = mask[:, : supers * SUPER].view(-1, supers, SUPER).any(-1)  # [T, U]
    complete = (torch.arange(supers) + 1) * SUPER * b <= steps.seq_lens.unsqueeze(1)  # [T, U]
    whole = complete & ~touched
    mu = steps.keys.float()[: supers * SUPER * b].view(supers, SUPER * b, dim).mean(1)  # [U, D]
    s_super = steps.scale * torch.einsum("tgd,ud->tgu", steps.q, mu) + math.log(SUPER * b)
    s_super = s_super.masked_fill(~whole.unsqueeze(1), float("-inf"))
    in_whole = torch.zeros_like(mask)
    in_whole[:, : supers * SUPER] = whole.repeat_interleave(SUPER, dim=1)
    s_page = page_scores.masked_fill((mask | in_whole).unsqueeze(1), float("-inf"))
    v_super = store_value_means(page_value_means(values[: supers * SUPER * b], SUPER * b), "bf16")
    return torch.cat([s_page, s_super], -1), torch.cat([page_means, v_super], 0)


def fit_bias(true_tail: Tensor, est_tail: Tensor) -> float:
    """Per-layer correction ``b`` of the estimated tail mass: the median of ``log(true / est)`` over the entries
    `[...]` where both are positive (0.0 when none are)."""
    ok = (true_tail > 0) & (est_tail > 0)
    if not ok.any():
        return 0.0
    return float((true_tail[ok].log() - est_tail[ok].log()).median())


class HeadStudy:
    """Every design on one layer and KV head: ``run(selection_mask, tails)`` gives the measures of each tail."""

    def __init__(self, steps: DecodeSteps, values: Tensor, cfg: LocksConfig, needle_pages: list[int]):
        if steps.page_out is None:
            raise ValueError("DecodeSteps needs values for the output error")
        self.steps, self.cfg, self.values = steps, cfg, values.float()
        self.scores = steps.scores("locks", cfg)  # [T, G, P], -inf where the page is not complete
        centroid, basis, coeffs = build_page_summaries(steps.k_pages, cfg).dequantize()
        q_mu = torch.einsum("tgd,pd->tgp", steps.q, centroid[:, 0])
        q_v = torch.einsum("tgd,prd->tgpr", steps.q * steps.scale, basis[:, 0])
        tokens = steps.scale * q_mu.unsqueeze(-1) + torch.einsum("tgpr,pbr->tgpb", q_v, coeffs[:, 0])
        half = tokens.view(*tokens.shape[:3], 2, -1).logsumexp(-1)  # [T, G, P, 2]
        self.half_scores = half.masked_fill(~torch.isfinite(self.scores).unsqueeze(-1), float("-inf")).flatten(2)
        self.order = read_order(steps, self.scores, cfg)
        means = page_value_means(self.values, steps.page_size)
        self.means = {fmt: store_value_means(means, fmt) for fmt in ("bf16", "int8")}
        self.means["half"] = store_value_means(page_value_means(self.values, steps.page_size // 2), "int8")
        centroid = steps.keys.float().view(steps.pages, steps.page_size, -1).mean(1)  # [P, D]
        self.centroid_scores = steps.scale * torch.einsum("tgd,pd->tgp", steps.q, centroid) + math.log(
            steps.page_size)
        self.centroid_scores = self.centroid_scores.masked_fill(~torch.isfinite(self.scores), float("-inf"))
        self.needle = torch.tensor(needle_pages, dtype=torch.long)
        needle_mask = torch.zeros(steps.pages, dtype=torch.bool)
        needle_mask[self.needle] = True
        self.needle_mass = steps.mass_kept(needle_mask.expand(len(steps.seq_lens), -1)).mean(-1)  # [T]
        self._exact: tuple | None = None  # the last mask's exact split, reused by the tails and fits of one mask

    def fixed(self, pages: int) -> Tensor:
        """bool `[T, P]`: today's top-``pages`` (forced pages first, then by estimated group share)."""
        n = self.order["valid"].clamp(max=pages).maximum(self.order["forced"])
        return mask_first(self.order["order"], n)

    def mass(self, level: float, floor: int, cap: int) -> Tensor:
        """bool `[T, P]`: the mass-sized budget (``mass_sized_pages``)."""
        return mask_first(self.order["order"], mass_sized_pages(self.order, level, floor, cap))

    def oracle(self, pages: int) -> Tensor:
        """bool `[T, P]`: the exact-LSE oracle's ``pages`` pages."""
        return self.steps.oracle_mask(replace(self.cfg, budget=pages * self.cfg.page_size))

    def tail_terms(self, mask: Tensor, tail: str, bias: float = 0.0) -> tuple[Tensor, Tensor]:
        """(log masses `[T, G, P']` of the unread pages, ``-inf`` elsewhere; means `[P', D]`) of a tail."""
        unread = ~mask.unsqueeze(1)
        if tail == "super":
            return superpage_tail(self.steps, mask, self.scores, self.means["bf16"], self.values)
        if tail == "true":
            scores, means = self.steps.page_lse, self.means["bf16"]
        elif tail == "half":
            return self.half_scores.masked_fill(unread.repeat_interleave(2, -1).logical_not(), float("-inf")), \
                self.means["half"]
        elif tail == "centroid":
            scores, means = self.centroid_scores, self.means["bf16"]
        else:
            scores = self.scores + (bias if tail in FITTED else 0.0)
            means = self.means["bf16" if tail == "est-bf16" else "int8"]
        return scores.masked_fill(~unread, float("-inf")), means

    def run(self, mask: Tensor, tails: tuple[str, ...], bias: float = 0.0) -> dict[str, dict[str, Tensor]]:
        """Measures (module docstring) of the selection ``mask`` bool `[T, P]` with each of ``tails``: per tail,
        ``err`` `[T, G]`, ``kept`` `[T]`, ``needle`` `[T]` (NaN without needle pages), ``pages`` `[T]`,
        ``tail_bias`` `[T, G]` (NaN for ``none``), ``est_tail`` and ``true_tail`` `[T, G]` (shares of the
        dense mass)."""
        if self._exact is None or not torch.equal(self._exact[0], mask):
            self._exact = (mask, exact_split(self.steps, mask))
        out_x, lse_x, kept = self._exact[1]
        true_tail = (1 - kept).clamp_min(0)
        needle = (mask[:, self.needle].float().mean(-1) if len(self.needle)
                  else torch.full((mask.shape[0],), float("nan")))
        result = {}
        for tail in tails:
            row = {"kept": kept.mean(-1), "needle": needle, "needle_mass": self.needle_mass,
                   "pages": mask.sum(-1).float()}
            if tail == "none":
                row["err"] = relative_error(out_x, self.steps.out_dense)
                row["tail_bias"] = torch.full_like(kept, float("nan"))
                row["est_tail"] = torch.zeros_like(kept)
            else:
                scores, means = self.tail_terms(mask, tail, bias)
                out_t, lse_t = tail_split(scores, means)
                out, _ = merge_splits(out_x, lse_x, out_t, lse_t)
                est = torch.exp(lse_t - self.steps.lse)
                row["err"] = relative_error(out, self.steps.out_dense)
                row["tail_bias"] = torch.where((true_tail > 0) & (est > 0), true_tail.log() - est.log(),
                                               torch.full_like(est, float("nan")))
                row["est_tail"] = est
            row["true_tail"] = true_tail
            result[tail] = row
        return result


def head_steps(data: dict, layer: int, head: int, seq_len: int, page_size: int) -> tuple[DecodeSteps, Tensor]:
    """``DecodeSteps`` (with values) of one layer and KV head of a capture, keys and values padded to whole pages
    (the padding lies past every position, so it is never read), and the padded values `[N', D]`."""
    groups = data["q"].shape[1] // data["k"].shape[1]
    pad = -seq_len % page_size
    keys = torch.nn.functional.pad(data["k"][layer, head, :seq_len].float(), (0, 0, 0, pad))
    values = torch.nn.functional.pad(data["v"][layer, head, :seq_len].float(), (0, 0, 0, pad))
    q = data["q"][layer, head * groups:(head + 1) * groups].transpose(0, 1)  # [T, G, D]
    return DecodeSteps(keys, q, data["positions"], values=values, page_size=page_size), values
