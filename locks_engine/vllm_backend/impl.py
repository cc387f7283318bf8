"""``forward`` of the LOCKS backend: write K/V, summarize completed pages, dense prefill, sparse decode.

The impl only dispatches. A KV cache on a CUDA device takes the CUDA path (``cuda.py``: vLLM's cache writer,
the Triton kernels); any other the CPU path (``cpu.py``: the plain-torch ops of ``locks_engine.ops``, the
reference). The path is picked once, from the device of the first cache the layer sees. Between selection and
attention of each decode the configured hooks run (``hooks.py``); the statistics ring, when a path is set,
counts after attention (``step_stats.py`` on the host; on CUDA ``device_stats.py``, on the device, inside CUDA
graphs).
"""

from __future__ import annotations

import re

import torch
from torch import Tensor
from vllm.v1.attention.backend import AttentionImpl, AttentionType

from locks_engine.config import LocksConfig
from locks_engine.ops import allocate_page_summaries
from locks_engine.ops.summaries import PageSummaries
from locks_engine.ops.superpages import allocate_superpages, write_superpage_centroids
from locks_engine.vllm_backend import cpu, cuda, hooks
from locks_engine.vllm_backend.calibration import LayerCalibration
from locks_engine.vllm_backend.device_stats import DeviceStepStats
from locks_engine.vllm_backend.metadata import LocksMetadata
from locks_engine.vllm_backend.selection import Selection


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
        self.hooks = [cls() for cls in hooks.configured_hook_classes()]
        """The decode hooks (``hooks.py``), one instance per configured class; engine-free tests may append."""
        # hooks that write through views of the cache keep it off the ``amx`` layout, which has none
        self.allow_amx = not hooks.needs_cache_views([type(hook) for hook in self.hooks])
        self.path: cpu.CpuPath | cuda.CudaPath | None = None
        """The device path, picked from the first cache the layer sees (``path_for``)."""
        self._store: PageSummaries | None = None
        self._superpages: Tensor | None = None
        """fp16 `[P, H, D]` superpage centroids (``two-level`` selection only, ``ops.superpages``)."""
        self._store_key = None
        self._candidates: dict[LocksConfig, int] = {}
        self.calibration: LayerCalibration | None = None
        """The layer's calibrated ``c`` (``candidates="auto"``), made with the summary store."""

    def cpu_isa(self, kv_cache: Tensor) -> str:
        """The vLLM CPU kernel ISA whose layout this layer's cache `[num_blocks, H, block_size, 2*D]` has."""
        return cpu.cache_isa(kv_cache, self.head_size, self.allow_amx)

    def path_for(self, kv_cache: Tensor) -> cpu.CpuPath | cuda.CudaPath:
        """The layer's device path: ``cuda.CudaPath`` for a cache on a CUDA device, else ``cpu.CpuPath``."""
        if self.path is None:
            if kv_cache.is_cuda:
                self.path = cuda.CudaPath(self.head_size, self.num_kv_heads, self.scale, self.kv_cache_dtype)
            else:
                self.path = cpu.CpuPath(self.head_size, self.num_kv_heads, self.scale, self.allow_amx)
        return self.path

    def do_kv_cache_update(self, layer, key: Tensor, value: Tensor, kv_cache: Tensor, slot_mapping: Tensor) -> None:
        """Write this step's K/V `[T, H, D]` at ``slot_mapping`` `[T']` (``T' <= T``; ``-1`` = padding)."""
        self.path_for(kv_cache).write_kv(layer, key, value, kv_cache, slot_mapping)

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
        Raises:
            UnsupportedAttentionError: vLLM asks for fused output quantization.
        """
        if output_scale is not None or output_block_scale is not None:
            raise UnsupportedAttentionError("the LOCKS backend does not fuse output quantization")
        if attn_metadata is None:
            return output
        meta, path = attn_metadata, self.path_for(kv_cache)
        nd, end = meta.num_decodes, meta.num_actual_tokens
        store = self._summaries(path, kv_cache, meta) if meta.cfg.summarized else None
        if meta.cfg.tail != "none":
            path.update_value_means(kv_cache, meta)
        if meta.prefill is not None:
            path.attend_prefill(meta.prefill, query[nd:end], kv_cache, output[nd:end])
            if self.calibration is not None and meta.calibration is not None:
                self.calibration.stash(query[nd:end], meta.prefill, store, self._superpages, self.num_kv_heads,
                                       kv_cache.shape[2], self.scale, kv_cache.is_cuda, meta.calibration)
        layer_name = getattr(layer, "layer_name", meta.last_layer_name)
        selected = every = scanned = tail_share = None
        if nd:
            selection = self._selection(store, meta.cfg, layer_name, kv_cache.is_cuda)
            selected, block_table, every, scanned = path.select(query[:nd], kv_cache, selection, meta)
            undo = self._run_hooks(path, kv_cache, meta, layer_name, selected, block_table)
            tail_share = path.attend(query[:nd], kv_cache, selected, block_table, meta.seq_lens[:nd], meta,
                                     output[:nd])
            for restore in reversed(undo):
                restore()
        if isinstance(meta.stats, DeviceStepStats):
            qsl = meta.query_start_loc
            meta.stats.count(layer_name, selected, every, meta.seq_lens[:nd], qsl[-1] - qsl[nd], scanned,
                             tail_share)
        elif meta.stats is not None:
            self._count(meta, selected, scanned, layer_name == meta.last_layer_name, tail_share)
        return output

    def _selection(self, store: PageSummaries | None, cfg: LocksConfig, layer_name: str, cuda: bool) -> Selection:
        """What this layer's decode scans: a calibrated ``c`` on the host (CPU path) or as data at the capacity
        (CUDA path, ``calibration.py``), else the configured one."""
        if self.calibration is None:
            return Selection(store, self._superpages, self.candidates(cfg, layer_name))
        if cuda:
            return Selection(store, self._superpages, self.calibration.capacity, self.calibration.live)
        return Selection(store, self._superpages, self.calibration.c)

    def candidates(self, cfg: LocksConfig, layer_name: str) -> int:
        """``c`` of this layer (``LocksConfig.layer_candidates``; the layer's index is the first number of its
        vLLM name, ``model.layers.N.self_attn.attn``): 0 for a flat scan.

        Raises:
            ValueError: a per-layer ``candidates`` table without an entry for this layer.
        """
        if cfg not in self._candidates:
            number = re.search(r"\.(\d+)\.", f".{layer_name}.")
            self._candidates[cfg] = cfg.layer_candidates(int(number.group(1)) if number else None)
        return self._candidates[cfg]

    def _run_hooks(self, path, kv_cache: Tensor, meta: LocksMetadata, layer_name: str, selected: Tensor,
                   block_table: Tensor) -> list:
        """Call every hook's ``on_decode``; returns the undo callables they gave back, in call order."""
        if not self.hooks:
            return []
        k_cache, v_cache = path.views(kv_cache)
        undo = []
        for hook in self.hooks:
            restore = hook.on_decode(
                layer_name=layer_name,
                last_layer=layer_name == meta.last_layer_name,
                k_cache=k_cache,
                v_cache=v_cache,
                block_table=block_table,
                seq_lens=meta.seq_lens[: meta.num_decodes],
                selected=selected,
                page_size=meta.cfg.page_size,
                num_kv_heads=self.num_kv_heads,
            )
            if restore is not None:
                undo.append(restore)
        return undo

    def _count(self, meta: LocksMetadata, selected: Tensor | None, scanned: Tensor | None, last_layer: bool,
               tail_share: Tensor | None = None) -> None:
        """Add this layer's decode reads to the step's host statistics (CPU path; host syncs);
        the last layer flushes the step to the ring. Summaries scanned: ``scanned``, the path's count;
        ``tail_share`` `[S, H]`: the tail estimate's share of the estimated mass (None: no tail)."""
        num_pages, scored = None, 0.0
        if selected is not None:
            seq_lens, page_size = meta.seq_lens[: meta.num_decodes].long(), meta.cfg.page_size
            num_pages = (seq_lens + page_size - 1) // page_size
            scored = float(scanned)
        meta.stats.add_layer(selected, num_pages, scored, self.num_kv_heads, tail_share)
        if last_layer:
            meta.stats.flush()

    def _summaries(self, path, kv_cache: Tensor, meta: LocksMetadata) -> PageSummaries:
        """This layer's summary store (allocated beside the cache on first use), updated with the pages
        completed this step. Allocated memory is not seen by vLLM's profiler: leave headroom for it.

        Raises:
            RuntimeError: the store would be allocated inside CUDA graph capture.
        """
        num_blocks, _, block_size, _ = kv_cache.shape
        key = (kv_cache.data_ptr(), num_blocks, meta.cfg)
        if self._store_key != key:
            if kv_cache.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    "LOCKS backend: the summary store would be allocated inside CUDA graph capture; "
                    "vLLM should run an eager warm-up step first"
                )
            num_pages = num_blocks * (block_size // meta.cfg.page_size)
            self._store = allocate_page_summaries(
                num_pages, self.num_kv_heads, self.head_size, meta.cfg, kv_cache.device
            )
            self._superpages = None
            if meta.cfg.selection == "two-level":
                self._superpages = allocate_superpages(num_pages, self.num_kv_heads, self.head_size, kv_cache.device)
            self.calibration = LayerCalibration(meta.cfg, kv_cache.device) if meta.cfg.calibrated else None
            self._store_key = key
        path.summarize(self._store, kv_cache, meta)
        if self._superpages is not None:
            write_superpage_centroids(self._superpages, self._store, meta.new_superpages)
        return self._store
