"""The selection-cost study's measurement (issue 27, part 1): every candidate of ``selection_cost`` at every
context, budget, layer and KV head of a capture, against the exact-LSE oracle.

Decode steps are runs of consecutive positions (``capture.decode_runs``); each candidate is measured at the steps
with at least 7 steps of their run before them (so that every rescoring lag up to 8 is measured on the same
steps), and its selection is read at each such step for each lag ``0 .. k-1``. Mass kept is the true softmax mass
on the pages read over the oracle's at the same budget, as ``bench_fidelity`` reports it: the KV group's mean over
its query heads (GQA) divided by the oracle's (``DecodeSteps.evaluate``'s ``group_ratio``), per step and lag.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from locks_studies import selection_cost as sc
from locks_engine.config import LocksConfig
from locks_studies.fidelity import DecodeSteps
from locks_engine.ops.select import forced_page_mask

#: reference dims for bytes: the measured model's (D = 64) and the H200 targets' (Llama-3.1-8B, GLM-4-9B: 128)
DIMS = (64, 128)
#: steps of a run before a measured step: the largest rescoring interval is LAGS + 1
LAGS = 7


@dataclass(frozen=True)
class Candidate:
    name: str
    family: str
    """``reference``, ``baseline``, ``fused``, ``lean``, ``two-level``, ``reuse-steps``, ``reuse-layers``, ``combo``."""
    summary: str = "colwise8"
    """Page summary: a ``LocksConfig.summary_format``, ``superpage-basis``, ``oracle`` (reads keys) or ``window``."""
    rank: int = 8
    coarse: str | None = None
    """Coarse kind (``selection_cost.COARSE_KINDS``) of a two-level scan, None for a flat scan."""
    superpage: int = 16
    """SP pages a superpage (two levels, superpage basis)."""
    candidate_pages: int = 8
    """Two levels: the M superpages read hold ``candidate_pages * K`` pages, ``M = ceil(c K / SP)``."""
    interval: int = 1
    """k: rescoring interval in decode steps."""
    anchors: int | None = None
    """Anchor layers (reuse across layers), None: every layer scores."""
    fused: bool = True
    """False: the scores' round trip is counted in the bytes (today's kernels)."""


def candidates() -> list[Candidate]:
    """Every candidate of issue 27 and the combinations measured."""
    out = [Candidate("oracle", "reference", "oracle", 0), Candidate("window", "reference", "window", 0),
           Candidate("flat r8 (today)", "baseline", fused=False), Candidate("flat r8 fused (e)", "fused")]
    out += [Candidate(f"flat r{r}", "lean", rank=r) for r in (4, 2)]
    out += [Candidate("flat int4 r8", "lean", "colwise"), Candidate("flat int4 r4", "lean", "colwise", 4)]
    out += [Candidate(f"superpage basis r{r}", "lean", "superpage-basis", r) for r in (8, 4)]
    for kind in sc.COARSE_KINDS:
        out += [Candidate(f"2L {kind} c{c}", "two-level", coarse=kind, candidate_pages=c) for c in (4, 8, 16, 32)]
    for kind in ("minmax", "pagecent"):
        out += [Candidate(f"2L {kind} SP8 c{c}", "two-level", coarse=kind, superpage=8, candidate_pages=c)
                for c in (4, 8)]
    out += [Candidate(f"reuse k{k}", "reuse-steps", interval=k) for k in (2, 4, 8)]
    out += [Candidate(f"layers {n}/24", "reuse-layers", anchors=n) for n in (12, 8, 6, 4)]
    out += [
        Candidate("2L pagecent c8 + k4", "combo", coarse="pagecent", interval=4),
        Candidate("2L minmax c8 + k4", "combo", coarse="minmax", interval=4),
        Candidate("k4 + layers 8/24", "combo", interval=4, anchors=8),
        Candidate("2L pagecent c8 + layers 8/24", "combo", coarse="pagecent", anchors=8),
        Candidate("2L pagecent c8 + k4 + layers 8/24", "combo", coarse="pagecent", interval=4, anchors=8),
        Candidate("r4 2L pagecent c8 + k4", "combo", rank=4, coarse="pagecent", interval=4),
        Candidate("2L pagecent c16 + k2", "combo", coarse="pagecent", candidate_pages=16, interval=2),
        Candidate("2L centroid c4 + k4", "combo", coarse="centroid", candidate_pages=4, interval=4),
        Candidate("2L centroid c4 + k8", "combo", coarse="centroid", candidate_pages=4, interval=8),
    ]
    return out


def measured_steps(positions: Tensor) -> Tensor:
    """int64 `[E]`: indices of the steps with ``LAGS`` consecutive decode steps before them."""
    idx = torch.arange(LAGS, len(positions))
    return idx[positions[idx] - positions[idx - LAGS] == LAGS]


class HeadStudy:
    """Selections of every candidate on the decode steps of one layer and KV head (scores cached)."""

    def __init__(self, steps: DecodeSteps):
        self.steps, self.at = steps, measured_steps(steps.positions)
        self._scores: dict[tuple, Tensor] = {}

    def page_scores(self, cand: Candidate) -> Tensor:
        key = (cand.summary, cand.rank, cand.superpage)
        if key not in self._scores:
            cfg = LocksConfig(rank=max(cand.rank, 1), summary_format="colwise8", budget=48)
            if cand.summary in ("oracle", "window"):
                self._scores[key] = self.steps.scores(cand.summary, cfg)
            elif cand.summary == "superpage-basis":
                local = self.page_scores(Candidate("", "", rank=8))
                self._scores[key] = sc.superpage_basis_scores(self.steps, cand.rank, cand.superpage, local)
            else:
                cfg = LocksConfig(rank=cand.rank, summary_format=cand.summary, budget=48)
                self._scores[key] = self.steps.scores("locks", cfg)
        return self._scores[key]

    def coarse(self, cand: Candidate) -> Tensor:
        key = ("coarse", cand.coarse, cand.superpage)
        if key not in self._scores:
            self._scores[key] = sc.coarse_scores(self.steps, cand.coarse, cand.superpage)
        return self._scores[key]

    def select(self, cand: Candidate, cfg: LocksConfig) -> tuple[Tensor, float, float]:
        """(bool `[k, E, P]` pages read at the measured steps for each lag, mean page summaries read, mean coarse
        summaries read) of a candidate before any reuse across layers."""
        scores, steps = self.page_scores(cand), self.steps
        if cand.coarse is None:
            mask = steps.selected_mask(scores, cfg)
            scored = sc.complete_pages(steps.seq_lens, steps.page_size).float()
            coarse = torch.zeros_like(scored)
        else:
            spp = math.ceil(cand.candidate_pages * cfg.budget_pages / cand.superpage)
            mask, scored, coarse = sc.two_level_mask(steps, scores, self.coarse(cand), cand.superpage, spp, cfg)
        if cand.summary == "window":
            scored = torch.zeros_like(scored)
        masks = sc.reuse_masks(mask, steps.seq_lens, self.at, cand.interval, cfg)
        return masks, scored[self.at].float().mean().item(), coarse[self.at].float().mean().item()

    def ratio(self, masks: Tensor, oracle_kept: Tensor) -> Tensor:
        """`[k, E]` the KV group's mean mass kept over the oracle's (``DecodeSteps.evaluate``'s ``group_ratio``:
        the oracle maximizes the group mean, so at most 1 for a selection of at most K pages; 0/0 -> 1)."""
        kept, oracle = self.steps.mass_kept(masks, self.at).mean(-1), oracle_kept.mean(-1)
        return torch.where(oracle > 0, kept / oracle.clamp_min(1e-30), torch.ones_like(kept))


def bytes_row(cand: Candidate, scored: float, coarse: float, read: float, pages: float, groups: int,
              layers: int, page_size: int = 16) -> dict:
    """Bytes per step as % of dense K+V at each reference dim (``selection_cost.step_bytes``)."""
    share = min(cand.anchors or layers, layers) / layers
    out = {}
    for dim in DIMS:
        kv_page = 2 * page_size * dim * 2
        if cand.summary == "oracle":  # it reads every key of the scored pages (bf16)
            summary = page_size * dim * 2
        elif cand.summary == "window":
            summary = 0
        else:
            summary = sc.page_bytes(cand.summary, cand.rank, dim, page_size, cand.superpage)
        coarse_b = sc.coarse_bytes(cand.coarse, dim, cand.superpage, page_size) if cand.coarse else 0
        total = sc.step_bytes(scored, coarse, read, summary, coarse_b, kv_page, cand.interval, share)
        traffic = sc.score_traffic(scored, coarse, groups, cand.interval, share) if cand.summary != "window" else 0
        if not cand.fused:
            total += traffic
        out[f"bytes_pct_d{dim}"] = round(100 * total / (pages * kv_page), 3)
        out[f"score_traffic_pct_d{dim}"] = round(100 * traffic / (pages * kv_page), 3)
        out[f"summary_bytes_d{dim}"], out[f"coarse_bytes_d{dim}"] = summary, coarse_b
    return out


def layer_overlap(flat: dict[tuple[int, int], Tensor], forced: Tensor, layers: int, heads: int
                  ) -> tuple[Tensor, Tensor]:
    """From the flat scan's selections `[E, P]` by (layer, head): the layer overlap `[L, L]` (mean over the
    later layer's heads of the best-matching head's ``selection_overlap``) and that best head `[L, L, H]`."""
    ov = torch.zeros(layers, heads, layers, heads)
    for (l1, h1), first in flat.items():
        for (l2, h2), second in flat.items():
            ov[l1, h1, l2, h2] = sc.selection_overlap(first, second, forced).mean()
    best, head = ov.max(dim=1)  # [L, L, H]
    return best.mean(-1), head


def oracle_spread(steps: DecodeSteps, at: Tensor, cfg: LocksConfig, superpage: int = 16) -> float:
    """Mean over steps ``at`` of the distinct superpages holding the oracle's chosen pages (beyond the forced
    ones) per chosen page: 1/SP when they sit in one superpage, 1 when each is in its own."""
    free = steps.oracle_mask(cfg)[at] & ~forced_page_mask(steps.seq_lens[at], steps.pages, cfg)
    whole = steps.pages // superpage * superpage
    spanned = free[:, :whole].reshape(len(at), -1, superpage).any(-1).sum(-1) + free[:, whole:].any(-1)
    return (spanned / free.sum(-1).clamp_min(1)).mean().item()


def study_context(data: dict, context: int, positions: list[int], args, log) -> tuple[list[dict], dict]:
    """Measure every candidate at one context. Returns (per-layer records, the layer overlap by budget)."""
    meta = data["meta"]["model_config"]
    layers_n, heads = meta["num_hidden_layers"], meta["num_key_value_heads"]
    groups = meta["num_attention_heads"] // heads
    index = {p: i for i, p in enumerate(data["positions"].tolist())}
    take = torch.tensor([index[p] for p in positions])
    cands, layers = candidates(), args.layers or list(range(layers_n))
    recs, stash, studies, flat, oracle, spread = [], {}, {}, {}, {}, {}
    start = time.perf_counter()
    for layer in layers:
        for head in range(heads):
            q = data["q"][layer, head * groups:(head + 1) * groups][:, take].transpose(0, 1)  # [T, G, D]
            steps = DecodeSteps(data["k"][layer, head, :context], q, torch.tensor(positions))
            hs = studies[layer, head] = HeadStudy(steps)
            for frac in args.budgets:
                cfg = LocksConfig(budget=steps.budget(frac))
                oracle[layer, head, frac] = steps.mass_kept(steps.oracle_mask(cfg)[hs.at], hs.at)
                spread.setdefault((frac, layer), []).append(oracle_spread(steps, hs.at, cfg))
                for cand in cands:
                    masks, scored, coarse = hs.select(cand, cfg)
                    if cand.name == "flat r8 fused (e)":
                        flat[frac, layer, head] = masks[0]
                    if cand.anchors:
                        stash[cand.name, frac, layer, head] = (masks, scored, coarse)
                        continue
                    recs.append({"cand": cand, "frac": frac, "layer": layer, "k": cfg.budget_pages,
                                 "ratio": hs.ratio(masks, oracle[layer, head, frac]).flatten(),
                                 "read": masks.sum(-1).float().mean().item(), "scored": scored, "coarse": coarse})
        log(f"{context}: layer {layer} done ({time.perf_counter() - start:.0f} s)")
    steps0 = studies[layers[0], 0].steps
    forced = forced_page_mask(steps0.seq_lens[studies[layers[0], 0].at], steps0.pages, LocksConfig())
    overlaps = {frac: layer_overlap({(i, h): flat[frac, l, h] for i, l in enumerate(layers) for h in range(heads)},
                                    forced, len(layers), heads) for frac in args.budgets}
    spread = {frac: [round(sum(spread[frac, l]) / len(spread[frac, l]), 3) for l in layers] for frac in args.budgets}
    return recs, {"stash": stash, "studies": studies, "oracle": oracle, "overlap": overlaps, "groups": groups,
                  "spread": spread,
                  "layers": layers, "heads": heads, "pages": steps0.seq_lens[studies[layers[0], 0].at]}


def layer_reuse(recs: list[dict], ctx: dict, calib: dict, args) -> None:
    """Append the records of the anchor candidates: anchors and head mapping from ``calib`` (the calibration
    context's overlap at the same budget), selections read from the anchors' stash."""
    layers, heads = ctx["layers"], ctx["heads"]
    for cand in [c for c in candidates() if c.anchors]:
        for frac in args.budgets:
            overlap, best_head = calib["overlap"][frac]
            anchors = sc.choose_anchors(overlap, min(cand.anchors, len(layers)))
            source = sc.follower_of(anchors, len(layers))
            for i, layer in enumerate(layers):
                for head in range(heads):
                    a = source[i]
                    h = head if a == i else int(best_head[a, i, head])
                    masks, scored, coarse = ctx["stash"][cand.name, frac, layers[a], h]
                    hs = ctx["studies"][layer, head]
                    recs.append({"cand": cand, "frac": frac, "layer": layer, "k": None, "anchors": anchors,
                                 "ratio": hs.ratio(masks, ctx["oracle"][layer, head, frac]).flatten(),
                                 "read": masks.sum(-1).float().mean().item(), "scored": scored, "coarse": coarse})


def summarize(recs: list[dict], ctx: dict, context: int, page_size: int = 16) -> list[dict]:
    """One row per (candidate, budget): mass kept / oracle (median, mean, per-layer mean and its minimum),
    pages read and bytes."""
    rows, groups = [], {}
    for rec in recs:
        groups.setdefault((rec["cand"].name, rec["frac"]), []).append(rec)
    pages = ((ctx["pages"].float() + page_size - 1) // page_size).mean().item()
    for (name, frac), members in groups.items():
        cand = members[0]["cand"]
        ratio = torch.cat([m["ratio"] for m in members])
        by_layer = {}
        for m in members:
            by_layer.setdefault(m["layer"], []).append(m["ratio"])
        layer_mean = {layer: torch.cat(v).mean().item() for layer, v in by_layer.items()}
        worst = min(layer_mean, key=layer_mean.get)
        mean = lambda key: sum(m[key] for m in members) / len(members)  # noqa: E731
        per_member = [bytes_row(m.get("source", cand), m["scored"], m["coarse"], m["read"], pages, ctx["groups"],
                                len(ctx["layers"]), page_size) for m in members]
        row = {"context": context, "budget_frac": frac, "candidate": name, **asdict(cand),
               "budget_pages": next((m["k"] for m in members if m["k"]), None),
               "pages": round(pages, 1), "pages_read": round(mean("read"), 2),
               "summaries_read": round(mean("scored"), 1), "coarse_read": round(mean("coarse"), 1),
               **{k: round(sum(b[k] for b in per_member) / len(per_member), 3) for k in per_member[0]},
               "mass_median": round(ratio.median().item(), 4), "mass_mean": round(ratio.mean().item(), 4),
               "mass_worst_layer_mean": round(layer_mean[worst], 4), "worst_layer": worst,
               "mass_layer_means": {k: round(layer_mean[k], 4) for k in sorted(layer_mean)},
               "samples": ratio.numel()}
        if "anchors" in members[0]:
            row["anchor_layers"] = members[0]["anchors"]
        if "source" in members[0]:
            row["layer_choice"] = {m["layer"]: m["source"].name for m in members}
        rows.append(row)
    return rows
