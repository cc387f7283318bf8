"""Why LOCKS loses a RULER sample, read with the model's own queries (issue 28; ``samples/studies/ruler_failure.py``).

The sample's prompt is rebuilt as ``samples/bench_ruler.py`` built it (lm-eval's task with the same metadata and
seed, the chat template with RULER's answer prefix after it); dense's answer is teacher-forced after it, and the
queries that generate each answer token (positions ``prompt_len - 1 .. prompt_len + A - 2``) are captured with
keys of every token (``locks_bench.capture.capture_ids``). Per layer, KV head and answer step,
``locks_studies.fidelity.DecodeSteps`` gives the exact attention mass per page (softmax over the causal prefix),
LOCKS' flat selection at the run's budget (``colwise8`` summaries, sink and recent pages forced: ``select_pages``;
for a ``:quest``/``:quest2``/``:quest4`` setting the Quest baseline's, under the same keys; for a two-level ``cfg``
the shipped two-level selection at each layer's ``c``) and the exact-LSE oracle's selection of as many pages. The expected words are located in the prompt (token
offsets -> 16-token pages); at each step that begins an expected word, the share of that word's pages each
selection reads says whether the pages holding the answer were read.
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from locks_studies.mass_budget import read_order
from locks_studies.selection_cost import paged_summaries, shipped_two_level_mask
from locks_bench.ruler import OFFLINE_ENV, TASKS, RulerError, nltk_data_env, task_metadata
from locks_engine.config import QUEST_FORMATS, LocksConfig
from locks_studies.fidelity import DecodeSteps
from locks_engine.ops.select import forced_page_mask


def task_predictions(results: list[dict], task: str, context: int, setting: str) -> dict[int, dict]:
    """``doc_id -> prediction`` (``expected``, ``answer``, ``score``, ``length``) of ``setting`` on ``task`` at
    ``context`` tokens, from ``bench_ruler`` result files (``runs -> tasks -> predictions``); later files win.

    Raises:
        RulerError: no result file holds that task, length and setting.
    """
    out: dict[int, dict] = {}
    for result in results:
        for run in result.get("runs", []):
            if run.get("setting") != setting or run.get("context") != context:
                continue
            for row in run.get("tasks", []):
                if row.get("task") == task:
                    out.update({int(p["doc_id"]): p for p in row.get("predictions", [])})
    if not out:
        raise RulerError(f"no predictions of {setting} on {task} at {context} tokens in the result files")
    return out


def worst_doc(dense: dict[int, dict], sparse: dict[int, dict]) -> int:
    """The doc_id where ``sparse`` scores lowest against ``dense`` (largest ``dense - sparse``; ties: the lowest
    doc_id).

    Raises:
        RulerError: the two share no doc_id, or no doc scores lower under ``sparse``.
    """
    drops = {d: dense[d]["score"] - sparse[d]["score"] for d in sorted(set(dense) & set(sparse))}
    if not drops or max(drops.values()) <= 0:
        raise RulerError("no sample scores lower with LOCKS than dense")
    return max(drops, key=lambda d: (drops[d], -d))


def rebuild_prompt(model_dir: str | Path, task: str, context: int, doc_id: int, seed: int,
                   nltk_dir: str | Path) -> tuple[str, dict, int]:
    """(prompt text, lm-eval doc, the task's ``max_gen_toks``) of sample ``doc_id`` of ``task`` at ``context``
    tokens, offline, as ``bench_ruler`` built it: ``TaskManager(metadata=task_metadata(...))``, Python's and
    numpy's generators seeded with ``seed`` before the task is loaded, ``build_all_requests`` with the model's chat
    template (lm-eval's ``VLLM.apply_chat_template``: the gen prefix continues the assistant turn).

    Raises:
        RulerError: an unknown task, or ``doc_id`` past the task's samples.
    """
    if task not in TASKS:
        raise RulerError(f"task {task!r}: allowed {', '.join(TASKS)}")
    os.environ.update({**OFFLINE_ENV, "NLTK_DATA": nltk_data_env(nltk_dir, os.environ.get("NLTK_DATA"))})
    import numpy as np
    from lm_eval.tasks import TaskManager
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)

    def chat_template(history: list[dict], add_generation_prompt: bool = True) -> str:
        return tok.apply_chat_template(history, tokenize=False, add_generation_prompt=add_generation_prompt,
                                       continue_final_message=not add_generation_prompt, chat_template=None,
                                       enable_thinking=None)

    manager = TaskManager(metadata=task_metadata(str(model_dir), context))
    random.seed(seed)
    np.random.seed(seed)
    task_obj = manager.load([task])["tasks"][task]
    task_obj.build_all_requests(limit=doc_id + 1, apply_chat_template=True, fewshot_as_multiturn=True,
                                chat_template=chat_template)
    for inst in task_obj.instances:
        if inst.doc_id == doc_id:
            return inst.args[0], inst.doc, task_obj.config.generation_kwargs["max_gen_toks"]
    raise RulerError(f"doc_id {doc_id}: {task} at {context} built only {len(task_obj.instances)} samples")


def word_pattern(word: str) -> re.Pattern:
    """``word`` as a whole word (no letter or digit just before or after it)."""
    return re.compile(r"(?<![A-Za-z0-9])" + re.escape(word) + r"(?![A-Za-z0-9])")


def word_tokens(text: str, words: list[str], offsets: list[tuple[int, int]]) -> dict[str, list[int]]:
    """Token positions holding each occurrence of each word of ``words`` in ``text``.

    Args:
        offsets: `(start, end)` character span of each token of ``text`` (a fast tokenizer's offset mapping);
            a token belongs to an occurrence when their character spans overlap.
    Returns:
        dict: word -> sorted token positions (empty when the word does not occur).
    """
    starts = torch.tensor([s for s, _ in offsets])
    ends = torch.tensor([e for _, e in offsets])
    out = {}
    for word in words:
        hits: set[int] = set()
        for m in word_pattern(word).finditer(text):
            hits.update(torch.nonzero((starts < m.end()) & (ends > m.start())).flatten().tolist())
        out[word] = sorted(hits)
    return out


def word_pages(text: str, words: list[str], offsets: list[tuple[int, int]], page_size: int) -> dict[str, list[int]]:
    """Pages (token position // ``page_size``) holding each word's occurrences (:func:`word_tokens`)."""
    return {w: sorted({t // page_size for t in ts}) for w, ts in word_tokens(text, words, offsets).items()}


def word_starts(answer: str, words: list[str], offsets: list[tuple[int, int]]) -> dict[int, str]:
    """Answer token index -> expected word, for each token where an occurrence of an expected word begins in
    ``answer`` (the token holding its first character; that step decides the word)."""
    out = {}
    for word in words:
        for m in word_pattern(word).finditer(answer):
            first = next((i for i, (s, e) in enumerate(offsets) if s <= m.start() < e), None)
            if first is not None:
                out[first] = word
    return dict(sorted(out.items()))


def share_selected(mask: Tensor, pages: list[int]) -> Tensor:
    """Share of ``pages`` that a selection reads.

    Args:
        mask (Tensor): bool `[..., P]` selected pages; pages (list[int]): page indices (< P).
    Returns:
        Tensor: fp32 `[...]` in ``[0, 1]``; NaN when ``pages`` is empty.
    """
    if not pages:
        return torch.full(mask.shape[:-1], float("nan"))
    return mask[..., torch.tensor(pages)].float().mean(-1)


def pages_needed(shares: Tensor, level: float) -> Tensor:
    """Fewest pages, largest first, whose mass shares add up to ``level`` of the whole.

    Args:
        shares (Tensor): `[..., P]` non-negative mass per page (summing to 1, or less: the level is of the sum).
    Returns:
        Tensor: int64 `[...]` in ``1 .. P``.
    """
    ranked = shares.sort(-1, descending=True).values.cumsum(-1)  # [..., P]
    return (ranked < level * ranked[..., -1:]).sum(-1).clamp_max(shares.shape[-1] - 1) + 1


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where two token lists differ (or where the shorter ends); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def measure(data: dict, seq_len: int, cfg: LocksConfig, word_page_lists: dict[str, list[int]],
            orders: list | None = None) -> dict[str, Tensor]:
    """LOCKS' and the oracle's selections at ``cfg``'s budget on every layer and KV head of a capture (Quest's in
    LOCKS' place when ``cfg.summary_format`` is a Quest format: ``DecodeSteps.scores("quest")``).

    Args:
        data (dict): ``capture_ids``' output: ``k`` `[L, H, N, D]`, ``q`` `[L, HQ, T, D]`, ``positions`` `[T]`.
        seq_len (int): tokens the keys cover (N); padded to whole pages here (masked: past every position).
        word_page_lists (dict): word -> pages holding it (W words).
        orders (list | None): when given, ``mass_budget.read_order`` of every layer's KV heads is appended to it
            (``orders[layer][kv_head]``), for :func:`locks_studies.mass_budget.compare`.
    Returns:
        dict: ``kept``, ``oracle_kept`` `[L, H, T]` true mass on the pages read, mean over the group's query heads;
        ``word_mass`` `[L, H, T, W]` true mass on each word's pages; ``locks_share``, ``oracle_share``
        `[L, H, T, W]` share of each word's pages read; ``pages_read`` `[L, H, T]`; ``forced_kept`` `[L, H, T]` true
        mass on the pages always read (sink, recent, last); ``pages_for_90`` `[L, H, T]` the fewest pages holding
        90% of the group's mean mass (what an oracle budget would need).
    """
    n_layers, n_kv = data["k"].shape[:2]
    groups = data["q"].shape[1] // n_kv
    selector = "quest" if cfg.summary_format in QUEST_FORMATS else "locks"
    pad = -seq_len % cfg.page_size
    pages = (seq_len + pad) // cfg.page_size
    words = list(word_page_lists)
    word_masks = torch.zeros(len(words), pages, dtype=torch.bool)
    for i, w in enumerate(words):
        word_masks[i, word_page_lists[w]] = True
    out: dict[str, list] = {k: [] for k in ("kept", "oracle_kept", "word_mass", "locks_share", "oracle_share",
                                            "pages_read", "forced_kept", "pages_for_90")}
    for layer in range(n_layers):
        for head in range(n_kv):
            keys = torch.nn.functional.pad(data["k"][layer, head, :seq_len].float(), (0, 0, 0, pad))  # [N, D]
            q = data["q"][layer, head * groups:(head + 1) * groups].transpose(0, 1)  # [T, G, D]
            steps = DecodeSteps(keys, q, data["positions"], page_size=cfg.page_size)
            candidates = cfg.layer_candidates(layer)
            if candidates:
                # the two-level selection as shipped (ops.superpages.select_two_level) at this layer's c
                everywhere = torch.arange(len(data["positions"]))
                mask = shipped_two_level_mask(steps, everywhere, cfg, candidates, paged_summaries(steps))[0]
            else:
                scores = steps.scores(selector, cfg)
                mask = steps.selected_mask(scores, cfg)  # [T, P]
            if orders is not None:
                if head == 0:
                    orders.append([])
                orders[-1].append(read_order(steps, scores, cfg))
            oracle = steps.oracle_mask(cfg)
            t = len(data["positions"])
            out["kept"].append(steps.mass_kept(mask).mean(-1))
            out["oracle_kept"].append(steps.mass_kept(oracle).mean(-1))
            out["word_mass"].append(steps.mass_kept(word_masks[:, None].expand(-1, t, -1)).mean(-1).T)
            out["locks_share"].append(torch.stack([share_selected(mask, word_page_lists[w]) for w in words], -1))
            out["oracle_share"].append(torch.stack([share_selected(oracle, word_page_lists[w]) for w in words], -1))
            out["pages_read"].append(mask.sum(-1))
            out["forced_kept"].append(steps.mass_kept(forced_page_mask(steps.seq_lens, pages, cfg)).mean(-1))
            shares = torch.exp(steps.page_lse - steps.lse.unsqueeze(-1)).mean(1)  # [T, P]
            out["pages_for_90"].append(pages_needed(shares, 0.9))
    return {k: torch.stack(v).view(n_layers, n_kv, *v[0].shape) for k, v in out.items()}


def mean_worst(x: Tensor) -> tuple[float, float, int]:
    """(mean, minimum, index of the minimum) of ``x`` `[L]`, rounded to 3 places."""
    return round(x.mean().item(), 3), round(x.min().item(), 3), int(x.argmin())


def summarize(m: dict[str, Tensor], words: list[str], pages: dict[str, list[int]], starts: dict[int, str],
              tokens: list[str]) -> dict[str, Any]:
    """JSON-sized summary of :func:`measure`: per answer step (token, mass kept mean / worst layer, the word it
    begins with its pages and the share of them read) and per expected word; layers are means over KV heads."""
    per_layer = {k: v.float().mean(1) for k, v in m.items()}  # [L, T(, W)]
    steps = []
    for t, token in enumerate(tokens):
        kept, worst, worst_layer = mean_worst(per_layer["kept"][:, t])
        row = {"step": t, "token": token, "kept_mean": kept, "kept_worst": worst, "kept_worst_layer": worst_layer,
               "oracle_kept_mean": round(per_layer["oracle_kept"][:, t].mean().item(), 3)}
        if t in starts:
            w = words.index(starts[t])
            share, share_worst, share_layer = mean_worst(per_layer["locks_share"][:, t, w])
            row.update(word=starts[t], word_pages=len(pages[starts[t]]), locks_share_mean=share,
                       locks_share_worst=share_worst, locks_share_worst_layer=share_layer,
                       oracle_share_mean=round(per_layer["oracle_share"][:, t, w].mean().item(), 3),
                       word_mass_mean=round(per_layer["word_mass"][:, t, w].mean().item(), 3))
        steps.append(row)
    per_word = {}
    for w, word in enumerate(words):
        at = [t for t, s in starts.items() if s == word]
        per_word[word] = {
            "pages": pages[word], "answer_steps": at,
            "locks_share_all_steps": round(per_layer["locks_share"][:, :, w].mean().item(), 3),
            "oracle_share_all_steps": round(per_layer["oracle_share"][:, :, w].mean().item(), 3),
            "word_mass_all_steps": round(per_layer["word_mass"][:, :, w].mean().item(), 3),
            "locks_share_per_layer_at_steps":
                [round(x, 3) for x in per_layer["locks_share"][:, at, w].mean(1).tolist()] if at else None,
        }
    kept = per_layer["kept"]
    totals = {"kept_mean": round(kept.mean().item(), 3),
              "kept_worst_layer_mean": round(kept.min(0).values.mean().item(), 3),
              "oracle_kept_mean": round(per_layer["oracle_kept"].mean().item(), 3),
              "kept_per_layer": [round(x, 3) for x in kept.mean(1).tolist()],
              "oracle_kept_per_layer": [round(x, 3) for x in per_layer["oracle_kept"].mean(1).tolist()],
              "pages_read_mean": round(per_layer["pages_read"].mean().item(), 1),
              "forced_kept_mean": round(per_layer["forced_kept"].mean().item(), 3),
              "pages_for_90_mean": round(per_layer["pages_for_90"].mean().item(), 1),
              "pages_for_90_per_layer": [round(x, 1) for x in per_layer["pages_for_90"].mean(1).tolist()]}
    return {"steps": steps, "words": per_word, "totals": totals}


def table(summary: dict[str, Any]) -> list[str]:
    """The printed table: one line per answer step."""
    lines = [f"{'step':>4} {'token':<14} {'kept':>5} {'worst(L)':>10} {'oracle':>6}  {'word':<14} {'pages':>5} "
             f"{'LOCKS':>5} {'worst(L)':>10} {'oracle':>6} {'mass':>5}"]
    for r in summary["steps"]:
        line = (f"{r['step']:>4} {json.dumps(r['token'])[:14]:<14} {r['kept_mean']:>5.3f} "
                f"{r['kept_worst']:>5.3f}({r['kept_worst_layer']:>2}) {r['oracle_kept_mean']:>6.3f}")
        if "word" in r:
            line += (f"  {r['word']:<14} {r['word_pages']:>5} {r['locks_share_mean']:>5.2f} "
                     f"{r['locks_share_worst']:>5.2f}({r['locks_share_worst_layer']:>2}) "
                     f"{r['oracle_share_mean']:>6.2f} {r['word_mass_mean']:>5.2f}")
        lines.append(line)
    return lines
