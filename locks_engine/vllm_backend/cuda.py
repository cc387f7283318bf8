"""The CUDA path of the LOCKS backend (vLLM 0.26 on the GPU machine): vLLM's own cache writer and the Triton
stages of ``locks_kernels``, which implement the default summary format ``colwise8`` only (the builder rejects
another on CUDA). ``locks_kernels`` (and triton) load on first use, so CPU machines never import them.

Decode launches fixed grids and never waits for the host, so a full CUDA graph captures it: the page that a
decode token completes is summarized on the device (``build_completed_page_summaries`` checks
``seq_len % B == 0`` there), the block table is the runner's persistent full-width buffer, and whether every
page is read is decided from ``Pmax``, the pages that buffer spans (static from step to step).

The ``oracle`` selection is the exception: its exact page scores are plain torch over every key
(``ops.baselines.oracle_scores_by_row``: groups of rows, the lengths read on the host), so the builder
declares no CUDA-graph support for it and vLLM runs attention eagerly (``builder.get_cudagraph_support``); Triton's
``select_pages`` and ``sparse_paged_attention`` then run as for LOCKS, on scores of the same shape.

A tail estimate (``LocksConfig.tail``) runs in Triton and inside CUDA graphs like the rest of the step: the
selection scores every complete page (``score_pages``, the flat scan) and keeps those scores, and the attention is
``locks_kernels.tail_paged_attention`` (the selected pages exactly, every other complete page as its estimated mass
times its mean value, merged by log-sum-exp). The mean values live in a store by physical page id beside the
summaries (``value_means``: int8 with an fp16 scale, or bf16; reserved in the KV sizing, ``memory.py``), written
for the pages a prefill completes (``ops.tail.encode_value_means``, the ops twin of ``build_cache_value_means``)
and on the device for the page a decode token completes (``build_completed_value_means``). With the ``oracle``
selection the step stays eager, as above. The share of the estimated mass the tail carried goes to the statistics
(``device_stats``): ``ops.tail.tail_mass_share`` in torch on the device (~40 launches, ~100 us a layer at 128K, one
H100, ``samples/results/2026-12-07_gpu_0f96b88_default/``), or with ``locks_kernels.tail.SHARE_IN_KERNEL`` each
query head's share from the tail kernels' own passes (``share=``, no extra launch), averaged over its group.
"""

from __future__ import annotations

import torch
from torch import Tensor

from locks_engine.config import LocksConfig
from locks_engine.ops.baselines import oracle_scores_by_row
from locks_engine.ops.select import reads_every_page, summary_fraction
from locks_engine.ops.summaries import PageSummaries
from locks_engine.ops.superpages import coarse_fraction
from locks_engine.ops.tail import encode_value_means, page_value_means, tail_mass_share
from locks_engine.vllm_backend import compat
from locks_engine.vllm_backend.metadata import LocksMetadata
from locks_engine.vllm_backend.prefill import PrefillRows, attend_prefill
from locks_engine.vllm_backend.selection import Selection

#: The summary formats the CUDA kernels implement (``LocksConfig.summary_format``).
CUDA_SUMMARY_FORMATS = ("colwise8",)


def check_summary_format(cfg: LocksConfig) -> None:
    """Raises:
        ValueError: ``cfg.summary_format`` is not one the CUDA kernels implement (the other formats are CPU
            references, for the fidelity study).
    """
    if cfg.summary_format not in CUDA_SUMMARY_FORMATS:
        raise ValueError(
            f"LocksConfig.summary_format={cfg.summary_format!r}: allowed on CUDA {', '.join(CUDA_SUMMARY_FORMATS)} "
            "(the other formats run on the CPU path only)"
        )


class CudaPath:
    """K/V writes, summaries, prefill and decode of one layer on a CUDA device.

    Args:
        head_size (int): D. num_kv_heads (int): H. scale (float): softmax scale.
        kv_cache_dtype (str): vLLM's cache dtype setting (``"auto"``, ``"float16"``, ``"bfloat16"``).
    """

    def __init__(self, head_size: int, num_kv_heads: int, scale: float, kv_cache_dtype: str) -> None:
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self.scale = scale
        self.kv_cache_dtype = kv_cache_dtype
        # the scores `[S, HQ, Pmax]` the last select ranked by, for the tail estimate of the attend that follows it
        self._tail_scores: Tensor | None = None
        self._means: tuple[Tensor, Tensor | None] | None = None
        """The tail estimate's value-mean store ``(means, scale)`` by physical page id (``update_value_means``)."""
        self._means_key = None

    def views(self, kv_cache: Tensor) -> tuple[Tensor, Tensor]:
        """`[num_blocks, block_size, H, D]` views of K and V of the packed cache."""
        return compat.split_kv_cache(kv_cache, self.head_size, "packed")

    def write_kv(self, layer, key: Tensor, value: Tensor, kv_cache: Tensor, slot_mapping: Tensor) -> None:
        """Write K/V `[T, H, D]` at ``slot_mapping`` `[T']` (``-1`` = padding) with vLLM's FLASH_ATTN writer
        (the layer's scales are unused for the unquantized caches LOCKS takes)."""
        from vllm._custom_ops import reshape_and_cache_flash

        k_scale = getattr(layer, "_k_scale", None)
        if k_scale is None:  # engine-free tests pass no layer
            k_scale = torch.ones((), dtype=torch.float32, device=kv_cache.device)
        v_scale = getattr(layer, "_v_scale", k_scale)
        key_cache, value_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
        reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, self.kv_cache_dtype, k_scale, v_scale)

    def summarize(self, store: PageSummaries, kv_cache: Tensor, meta: LocksMetadata) -> None:
        """Summarize the pages completed by prefill rows (``meta.new_page_ids``) into ``store`` at their physical
        ids; decode rows' pages are summarized in ``select``."""
        if not meta.new_page_ids.numel():
            return
        from locks_kernels import build_page_summaries

        k_cache = self.views(kv_cache)[0]
        block_size = k_cache.shape[1]
        slots = meta.new_page_slots
        keys = k_cache[slots // block_size, slots % block_size]  # [Pn, B, H, D]
        for stored, new in zip(store.colwise8(), build_page_summaries(keys, meta.cfg.rank)):
            stored[meta.new_page_ids] = new

    def update_value_means(self, kv_cache: Tensor, meta: LocksMetadata) -> None:
        """The tail estimate's value-mean store (``LocksConfig.tail``): allocated beside the cache on first use
        (``locks_kernels.allocate_value_means``: int8 `[P, H, D]` with fp16 `[P, H]`, or bf16 `[P, H, D]`, ``P``
        physical pages), then the mean value of every page this step completes written at its physical id: a
        prefill row's pages with the ops twin (``ops.tail.page_value_means``, ``encode_value_means``), the page a
        decode token completes on the device (``build_completed_value_means``: fixed grid, CUDA-graph safe).
        Call after the step's K/V are written, before ``select``.

        Raises:
            RuntimeError: the store would be allocated inside CUDA graph capture.
        """
        from locks_kernels import allocate_value_means, build_completed_value_means

        cfg = meta.cfg
        v_cache = self.views(kv_cache)[1]
        num_blocks, block_size = v_cache.shape[:2]
        key = (kv_cache.data_ptr(), num_blocks, cfg.tail, cfg.page_size)
        if self._means_key != key:
            if kv_cache.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    "LOCKS backend: the value-mean store would be allocated inside CUDA graph capture; "
                    "vLLM should run an eager warm-up step first"
                )
            num_pages = num_blocks * (block_size // cfg.page_size)
            self._means = allocate_value_means(num_pages, self.num_kv_heads, self.head_size, cfg.tail, kv_cache.device)
            self._means_key = key
        if meta.new_page_ids.numel():
            slots = meta.new_page_slots
            values = v_cache[slots // block_size, slots % block_size]  # [Pn, B, H, D]
            means, scale = encode_value_means(page_value_means(values.transpose(1, 2), cfg.page_size)[:, :, 0],
                                              cfg.tail)
            self._means[0][meta.new_page_ids] = means
            if scale is not None:
                self._means[1][meta.new_page_ids] = scale
        if meta.num_decodes:
            rows = meta.num_decodes
            build_completed_value_means(v_cache, meta.block_table[:rows], meta.seq_lens[:rows], self._means,
                                        cfg.page_size)

    def attend_prefill(self, rows: PrefillRows, query: Tensor, kv_cache: Tensor, out: Tensor) -> None:
        """Dense causal attention of the prefill rows (``prefill.py``: FlashAttention for fp16/bf16)."""
        attend_prefill(rows, query, kv_cache, self.head_size, self.scale, out)

    def select(self, q: Tensor, kv_cache: Tensor, selection: Selection, meta: LocksMetadata
               ) -> tuple[Tensor, Tensor, bool, Tensor | None]:
        """The first half of ``locks_kernels``' decode step (``select_step``): summarize the page (and superpage)
        each decode token completed, score every page or, two-level, the chosen superpages' pages, select (paper
        Sections 3.1-3.3); every page unscored where ``reads_every_page`` says so for ``Pmax`` pages. The
        ``oracle`` selection (eager only) scores every complete page from its keys instead (``_oracle_select``).

        Args:
            q (Tensor): `[S, HQ, D]` the decode rows' queries (rows ``[0, S)`` of the step).
            selection (Selection): the layer's summaries (updated in place; None without ``cfg.summarized``) and
                scan.
        Returns:
            tuple: ``selected`` int64 `[S, H, K]` (pages ascending, ``-1`` in unused slots), the block table
            `[S, W]` it indexes, whether every page is read unscored, and for a two-level scan
            ``(superpages chosen, coarse_fraction)`` (what the statistics count it by, ``DeviceStepStats.count``),
            else None.
        """
        from locks_kernels import select_step

        cfg, rows = meta.cfg, q.shape[0]
        seq_lens, block_table = meta.seq_lens[:rows], meta.block_table[:rows]
        pmax = block_table.shape[1] * (kv_cache.shape[2] // cfg.page_size)
        every = reads_every_page(cfg, pmax, summary_fraction(cfg, self.head_size, kv_cache.dtype))
        self._tail_scores = None
        if cfg.tail != "none" and not every:
            return self._tail_select(q, kv_cache, selection, block_table, seq_lens, cfg), block_table, every, None
        if cfg.selection == "oracle" and not every:
            return self._oracle_select(q, kv_cache, block_table, seq_lens, cfg), block_table, every, None
        selected, chosen = select_step(
            q, self.views(kv_cache)[0], block_table, seq_lens,
            None if selection.store is None else selection.store.colwise8(),
            cfg.page_size, cfg.budget_pages, cfg.sink_pages, cfg.recent_pages, self.scale,
            superpages=selection.superpages, candidates=selection.candidates, every=every, live=selection.live,
        )
        scanned = None  # the flat scan
        if chosen is not None:
            slots = chosen.shape[-1] if selection.live is None else selection.live
            scanned = (slots, coarse_fraction(cfg, self.head_size))
        return selected, block_table, every, scanned

    def _oracle_select(self, q: Tensor, kv_cache: Tensor, block_table: Tensor, seq_lens: Tensor, cfg: LocksConfig
                       ) -> Tensor:
        """The ``oracle`` selection: the exact log mass `[S, HQ, Pmax]` of every complete page from its keys
        (plain torch, host syncs: eager only), then Triton's ``select_pages`` as for LOCKS' estimates.
        Returns ``selected`` int64 `[S, H, min(K, Pmax)]`."""
        from locks_kernels import select_pages

        k_cache = self.views(kv_cache)[0]
        scores = oracle_scores_by_row(q, k_cache, block_table, seq_lens, cfg.page_size, self.scale)
        return select_pages(scores, seq_lens, self.num_kv_heads, cfg.budget_pages, cfg.page_size, cfg.sink_pages,
                            cfg.recent_pages)

    def _tail_select(self, q: Tensor, kv_cache: Tensor, selection: Selection, block_table: Tensor, seq_lens: Tensor,
                     cfg: LocksConfig) -> Tensor:
        """The flat scan (or the oracle) keeping its scores for the tail estimate: the page this
        step completed is summarized as in ``select_step``, every complete page scored (Triton's ``score_pages``,
        or the oracle's exact log mass), the top pages selected. Returns ``selected`` int64 `[S, H, min(K, Pmax)]`."""
        from locks_kernels import score_pages, select_pages, select_step

        k_cache = self.views(kv_cache)[0]
        if cfg.selection == "oracle":
            scores = oracle_scores_by_row(q, k_cache, block_table, seq_lens, cfg.page_size, self.scale)
        else:
            store = selection.store.colwise8()
            # summarizes the completed page; its every-page answer is not used
            select_step(q, k_cache, block_table, seq_lens, store, cfg.page_size, cfg.budget_pages, cfg.sink_pages,
                        cfg.recent_pages, self.scale, every=True)
            scores = score_pages(q, store, block_table, seq_lens, cfg.page_size, k_cache.shape[1], self.scale)
        self._tail_scores = scores
        return select_pages(scores, seq_lens, self.num_kv_heads, cfg.budget_pages, cfg.page_size, cfg.sink_pages,
                            cfg.recent_pages)

    def attend(self, q: Tensor, kv_cache: Tensor, selected: Tensor, block_table: Tensor, seq_lens: Tensor,
               meta: LocksMetadata, out: Tensor) -> Tensor | None:
        """The second half of ``locks_kernels``' decode step (``decode_step`` after ``select_step``): exact
        softmax attention over the selected pages only (paper Section 3.4), written into ``out`` `[S, HQ, D]`;
        with a tail estimate, every other complete page's estimate too (``locks_kernels.tail_paged_attention``).

        Returns:
            Tensor | None: fp32 `[S, H]` share of each KV head's estimated mass that the tail estimate carried
            (``ops.tail.tail_mass_share``, or ``tail_paged_attention(share=)``, on the device), None without a
            tail estimate this step.
        """
        from locks_kernels import sparse_paged_attention

        k_cache, v_cache = self.views(kv_cache)
        tail, self._tail_scores = self._tail_scores, None
        if tail is not None:
            from locks_kernels import tail_paged_attention

            from locks_kernels import tail as tail_kernels

            if not tail_kernels.SHARE_IN_KERNEL:
                tail_paged_attention(q, k_cache, v_cache, block_table, seq_lens, selected, tail, self._means,
                                     meta.cfg.page_size, self.scale, out=out)
                return tail_mass_share(tail, selected, seq_lens, meta.cfg.page_size)
            share = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)  # [S, HQ]
            tail_paged_attention(q, k_cache, v_cache, block_table, seq_lens, selected, tail, self._means,
                                 meta.cfg.page_size, self.scale, out=out, share=share)
            return share.view(q.shape[0], selected.shape[1], -1).mean(-1)
        sparse_paged_attention(
            q, k_cache, v_cache, block_table, seq_lens, selected, meta.cfg.page_size, self.scale, out=out
        )
        return None
