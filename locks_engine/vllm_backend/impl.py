"""``forward`` of the LOCKS backend: write K/V, summarize completed pages, dense prefill, sparse decode.

A KV cache on a CUDA device takes the CUDA path (``gpu.py``: vLLM's cache writer, Triton kernels); any other
runs the plain-torch ops of ``locks_engine.ops`` (the CPU path and the reference).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor
from vllm.v1.attention.backend import AttentionImpl, AttentionType

from locks_engine.ops import (
    allocate_page_summaries,
    attend_selected_pages,
    build_page_summaries,
    score_pages,
    select_pages,
    sparse_paged_attention,
    summary_bytes,
    write_page_summaries,
)
from locks_engine.ops.paging import selected_blocks
from locks_engine.vllm_backend import compat, gpu
from locks_engine.vllm_backend.counters import COUNTERS_KEY, DeviceCounters
from locks_engine.vllm_backend.debug import POISON_KEY, poison_unselected
from locks_engine.vllm_backend.metadata import LocksMetadata
from locks_engine.vllm_backend.prefill import attend_prefill


class UnsupportedAttentionError(ValueError):
    """A model feature LOCKS does not handle (by design: it targets plain decoder self-attention)."""


class LocksAttentionImpl(AttentionImpl):
    """One attention layer. Holds the layer's page summaries, indexed by physical page id
    (``block_id * block_size // B + page_in_block``) so they follow vLLM's block reuse and prefix caching:
    a page is summarized when the step that writes its last token runs, never again while its block keeps
    its contents, and a reused block's pages are summarized anew when their new tokens complete them.

    Raises:
        UnsupportedAttentionError: ALiBi, sliding window, logits soft cap, attention sinks, a quantized KV cache,
            or a non-decoder attention type (LOCKS targets plain decoder self-attention).
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: Tensor | None = None,
        **unused,
    ) -> None:
        unsupported = {
            "alibi_slopes": alibi_slopes is not None,
            "sliding_window": sliding_window is not None,
            "logits_soft_cap": bool(logits_soft_cap),
            "sinks": sinks is not None,
            f"kv_cache_dtype={kv_cache_dtype}": kv_cache_dtype not in ("auto", "float16", "bfloat16"),
            f"attn_type={attn_type}": attn_type != AttentionType.DECODER,
        }
        bad = [name for name, flag in unsupported.items() if flag]
        if bad:
            raise UnsupportedAttentionError(f"the LOCKS backend does not support {', '.join(bad)}")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.layout = compat.kv_layout_name()
        self._store = None
        self._store_key = None
        self.counters = DeviceCounters() if _config_flag(COUNTERS_KEY) else None
        # the poisoning debug switch writes NaN through views of the cache, which ``amx`` has none of
        self.allow_amx = not _config_flag(POISON_KEY)

    def cpu_isa(self, kv_cache: Tensor) -> str:
        """The vLLM CPU kernel ISA whose layout this layer's cache `[num_blocks, H, block_size, 2*D]` has."""
        return compat.cpu_isa(self.head_size, kv_cache.dtype, kv_cache.shape[2], self.allow_amx)

    def _on_amx(self, kv_cache: Tensor) -> bool:
        return self.layout == "cpu_attn" and self.cpu_isa(kv_cache) == "amx"

    def do_kv_cache_update(self, layer, key: Tensor, value: Tensor, kv_cache: Tensor, slot_mapping: Tensor) -> None:
        """Write this step's K/V `[T, H, D]` at ``slot_mapping`` `[T']` (``T' <= T``; ``-1`` = padding)."""
        if kv_cache.is_cuda:
            k_scale = getattr(layer, "_k_scale", None)
            if k_scale is None:  # engine-free tests pass no layer
                k_scale = torch.ones((), dtype=torch.float32, device=kv_cache.device)
            v_scale = getattr(layer, "_v_scale", k_scale)
            gpu.write_kv(key, value, kv_cache, slot_mapping, self.head_size, self.kv_cache_dtype, k_scale, v_scale)
            return
        if self._on_amx(kv_cache):
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

    def forward(
        self,
        layer,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        kv_cache: Tensor,
        attn_metadata: LocksMetadata | None,
        output: Tensor,
        output_scale: Tensor | None = None,
        output_block_scale: Tensor | None = None,
        **unused,
    ) -> Tensor:
        """Attention for one layer and step.

        Args:
            query (Tensor): `[T, HQ, D]`; key, value (Tensor): `[T, H, D]` (already in the cache).
            kv_cache (Tensor): `[num_blocks, H, block_size, 2*D]` (layout: ``compat``).
            attn_metadata (LocksMetadata | None): None during vLLM's warm-up and profiling runs.
            output (Tensor): `[T, HQ, D]`, written for the first ``num_actual_tokens`` tokens.
        Returns:
            Tensor: ``output``.
        """
        if output_scale is not None or output_block_scale is not None:
            raise UnsupportedAttentionError("the LOCKS backend does not fuse output quantization")
        if attn_metadata is None:
            return output
        meta = attn_metadata
        nd = meta.num_decodes
        k_cache, v_cache = compat.split_kv_cache(kv_cache, self.head_size, self.layout)
        amx = self._on_amx(kv_cache)
        # no strided view reads the amx layout: its K/V pages are read with compat.read_cpu_pages
        reader = None
        if amx:
            reader = lambda blocks, heads, pages: compat.read_cpu_pages(  # noqa: E731
                kv_cache, self.head_size, "amx", blocks, heads, pages, meta.cfg.page_size)
        store = None if meta.cfg.dense else self._summaries(k_cache, meta, reader)
        if meta.prefill is not None:
            attend_prefill(
                meta.prefill, query[nd : meta.num_actual_tokens], kv_cache, self.head_size, self.scale,
                output[nd : meta.num_actual_tokens], "amx" if amx else None,
            )
        selected = num_pages = None
        scored = 0
        if nd:
            selected, num_pages, scored = self._decode(query[:nd], k_cache, v_cache, store, meta, output[:nd], reader)
        last_layer = getattr(layer, "layer_name", meta.last_layer_name) == meta.last_layer_name
        if self.counters is not None and nd and last_layer:
            self.counters.add(selected, meta.seq_lens[:nd], meta.cfg.page_size, self.num_kv_heads)
        if meta.stats is not None:
            meta.stats.add_layer(selected, num_pages, scored, self.num_kv_heads)
            if last_layer:
                meta.stats.flush()
        return output

    def _summaries(self, k_cache: Tensor, meta: LocksMetadata, reader=None):
        """This layer's summary store (allocated beside the cache on first use), updated with the pages
        completed this step. Allocated memory is not seen by vLLM's profiler: leave headroom for it."""
        page_size = meta.cfg.page_size
        key = (k_cache.data_ptr(), k_cache.shape[0], meta.cfg)
        if self._store_key != key:
            if k_cache.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    "LOCKS backend: the summary store would be allocated inside CUDA graph capture; "
                    "vLLM should run an eager warm-up step first"
                )
            num_pages = k_cache.shape[0] * (k_cache.shape[1] // page_size)
            self._store = allocate_page_summaries(
                num_pages, self.num_kv_heads, self.head_size, meta.cfg, k_cache.device
            )
            self._store_key = key
        if meta.new_page_ids.numel():
            slots = meta.new_page_slots
            if k_cache.is_cuda:
                gpu.summarize_pages(self._store, k_cache, meta.new_page_ids, slots, meta.cfg)
            else:
                if reader is None:
                    keys = k_cache[slots // k_cache.shape[1], slots % k_cache.shape[1]]  # [Pn, B, H, D]
                else:
                    ppb = k_cache.shape[1] // page_size
                    ids = meta.new_page_ids.long().unsqueeze(1)  # [Pn, 1]
                    heads = torch.arange(self.num_kv_heads).unsqueeze(0)
                    keys = reader(ids // ppb, heads, ids % ppb)[0].transpose(1, 2)  # [Pn, B, H, D]
                write_page_summaries(self._store, meta.new_page_ids, build_page_summaries(keys, meta.cfg))
        return self._store

    def _decode(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, store, meta: LocksMetadata, out: Tensor,
                reader=None):
        """Score, select and attend for the decode rows; returns ``(selected [S, H, K], num_pages [S],
        summaries scanned per KV head)``, the last two None unless statistics are kept (counting syncs with
        the host). ``reader(blocks, heads, offsets) -> (K, V)`` reads a cache that no view describes."""
        cfg, nd = meta.cfg, meta.num_decodes
        seq_lens, block_table = meta.seq_lens[:nd], meta.block_table[:nd]
        if not k_cache.is_cuda:
            block_table = used_blocks(block_table, seq_lens, k_cache.shape[1])
        if k_cache.is_cuda:
            selected = gpu.select(q, k_cache, block_table, seq_lens, store, cfg, self.scale, self.num_kv_heads)
        else:
            selected = self._select_torch(q, k_cache, store, block_table, seq_lens, cfg)
        restore = None
        if meta.poison_unselected:
            restore = poison_unselected(k_cache, v_cache, block_table, seq_lens, selected, cfg.page_size)
        if k_cache.is_cuda:
            gpu.attend(q, k_cache, v_cache, block_table, seq_lens, selected, cfg, self.scale, out)
        elif reader is not None:
            # -1 slots read page 0, masked in the attention
            blocks, in_block = selected_blocks(block_table, selected, k_cache.shape[1] // cfg.page_size)
            heads = torch.arange(self.num_kv_heads).view(1, -1, 1)
            keys, values = (t.flatten(2, 3) for t in reader(blocks, heads, in_block))  # [S, H, K*B, D]
            attn, _ = attend_selected_pages(q, keys, values, selected, seq_lens, cfg.page_size, self.scale)
            out.copy_(attn)
        else:
            attn, _ = sparse_paged_attention(
                q, k_cache, v_cache, block_table, seq_lens, selected, cfg.page_size, self.scale
            )
            out.copy_(attn)
        if restore is not None:
            restore()
        if meta.stats is None:
            return selected, None, None
        num_pages = (seq_lens.long() + cfg.page_size - 1) // cfg.page_size
        pmax = block_table.shape[1] * (k_cache.shape[1] // cfg.page_size)
        if k_cache.is_cuda:
            every_page = covers_all(cfg, pmax)
        else:
            every_page = reads_all(cfg, pmax, self._summary_fraction(cfg, k_cache.dtype),
                                   longest_pages(seq_lens, cfg.page_size))
        scored = 0 if every_page else int((seq_lens.long() // cfg.page_size).sum())
        return selected, num_pages, scored

    def _select_torch(self, q: Tensor, k_cache: Tensor, store, block_table: Tensor, seq_lens: Tensor, cfg):
        """``select_pages`` of the ops over their ``score_pages``, trimmed; every page, unscored, where that reads
        fewer bytes (``reads_all``)."""
        pmax = block_table.shape[1] * (k_cache.shape[1] // cfg.page_size)
        if reads_all(cfg, pmax, self._summary_fraction(cfg, k_cache.dtype), longest_pages(seq_lens, cfg.page_size)):
            scores = torch.zeros(q.shape[0], self.num_heads, pmax, device=q.device)  # looked at for its shape only
            every = dataclasses.replace(cfg, dense=True)
            return trim_selected(select_pages(scores, seq_lens, self.num_kv_heads, every))
        scores = score_pages(q, store, block_table, seq_lens, cfg.page_size, k_cache.shape[1], self.scale)
        return trim_selected(select_pages(scores, seq_lens, self.num_kv_heads, cfg))

    def _summary_fraction(self, cfg, kv_dtype: torch.dtype) -> float:
        """Bytes of a page's summary over the bytes of its K+V (one KV head; 0.176 for ``colwise8`` at r = 8,
        D = 128, bf16), computed once per (config, dtype)."""
        key = (cfg, kv_dtype)
        if getattr(self, "_fraction_key", None) != key:
            summary, kv = summary_bytes(cfg.page_size, cfg.rank, self.head_size, cfg.summary_format, kv_dtype)
            self._fraction_key, self._fraction = key, summary / kv
        return self._fraction


def covers_all(cfg, pmax: int) -> bool:
    """Whether every page of the step is read without ranking: the dense switch, or a budget of at least the
    ``pmax`` pages the block table spans (then no summary is scored: a budget past the context costs dense)."""
    return cfg.dense or cfg.budget_pages >= pmax


def reads_all(cfg, pmax: int, summary_fraction: float, num_pages: int | None = None) -> bool:
    """``covers_all``, or a budget so close to the ``n`` pages of the longest sequence that scoring would cost more
    memory traffic than reading every page: ``n * s + K * p >= n * p`` (summaries of every page plus ``K`` pages
    against every page's K+V, ``s / p = summary_fraction``), i.e. ``K >= n * (1 - summary_fraction)``. Exact
    attention then reads fewer bytes than LOCKS would, for that sequence and every shorter one. ``n`` is
    ``num_pages`` (pages of the longest sequence, its partial last page included) or, without it, the ``pmax``
    pages the block table spans, which may be a block's worth more. The CPU path only: on CUDA the grids are
    sized by ``max_model_len`` (CUDA graphs), and this test would need the sequence lengths on the host."""
    pages = pmax if num_pages is None else min(pmax, num_pages)
    return covers_all(cfg, pmax) or cfg.budget_pages >= pages * (1.0 - summary_fraction)


def longest_pages(seq_lens: Tensor, page_size: int) -> int:
    """Pages of the longest of ``seq_lens`` `[S]` (tokens), a partial last page counted; 0 for no sequence.
    Reads the lengths on the host (the CPU path)."""
    return -(-int(seq_lens.max()) // page_size) if seq_lens.numel() else 0


def _config_flag(key: str) -> bool:
    """``additional_config[key]`` of the vLLM config being built (False outside one)."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    extra = getattr(config, "additional_config", None) if config is not None else None
    return bool(extra.get(key)) if isinstance(extra, dict) else False


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
