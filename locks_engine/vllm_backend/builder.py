"""The builder of the LOCKS backend's per-step metadata (``metadata.py``), one per KV cache group, and its startup
checks.

The builder asks vLLM to put decode rows (one query token) first in the batch (``reorder_batch_threshold =
1``), so rows ``[0, num_decodes)`` are decodes and the rest attend densely (``prefill.py``). It also lists the
KV pages that this step completes, by physical page id, so that each layer summarizes exactly those pages once.

On a CUDA device the decode rows keep vLLM's persistent buffers (the full-width block table, ``seq_lens``) and
summarize their completed pages on the device (``cuda.py``), so that a full CUDA graph of a decode batch stays
valid from step to step; the listed pages are then the prefill rows' only. Rows without query tokens (the padding
of a CUDA-graph batch) are neither decodes nor prefills.
"""

from __future__ import annotations

import torch
from torch import Tensor
from vllm.v1.attention.backend import (
    AttentionCGSupport,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)

from locks_engine.config import LocksConfig
from locks_engine.ops.superpages import SUPERPAGE_PAGES, completed_superpages
from locks_engine.stats import StatsRing, run_id
from locks_engine.vllm_backend import compat, hooks
from locks_engine.vllm_backend.config_keys import STATS_PATH_KEY, locks_config
from locks_engine.vllm_backend.cuda import check_summary_format
from locks_engine.vllm_backend.calibration import CalibrationQueue
from locks_engine.vllm_backend.device_stats import DeviceStepStats
from locks_engine.vllm_backend.impl import LocksAttentionImpl
from locks_engine.vllm_backend.metadata import LocksMetadata
from locks_engine.vllm_backend.prefill import PrefillRows
from locks_engine.vllm_backend.step_stats import StepStats, scan_bytes


class LocksMetadataBuilder(AttentionMetadataBuilder[LocksMetadata]):
    """Builds ``LocksMetadata`` once per step from vLLM's ``CommonAttentionMetadata``.

    Raises (at construction):
        ValueError: bad ``additional_config["locks"]``, the page size does not divide the block size, a summary
            format the CUDA kernels lack on a CUDA device, or a hook (``additional_config["locks_hooks"]``)
            that cannot be imported.
        RuntimeError: some decoder attention layer of the model runs another backend (startup check).
    """

    # Full CUDA graphs for decode-only batches on the CUDA path (``get_cudagraph_support`` says when not).
    _cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    @classmethod
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec) -> AttentionCGSupport:
        """None on CPU (plain torch ops sync with the host), nor with a hook whose ``cuda_graphs`` is False, nor
        with the ``oracle`` selection (its exact scores are plain torch over every key, in groups of rows: a
        graph would hold every captured batch size's keys in fp32 outside vLLM's memory profile; as a quality
        reference it may run eagerly, with or without a tail estimate). vLLM then runs attention eagerly between
        its piecewise graphs. A tail estimate on the flat scan keeps the graphs (``cuda.py``), and so do
        statistics: on CUDA they are counted on the device (``device_stats``)."""
        extra = vllm_config.additional_config if isinstance(vllm_config.additional_config, dict) else {}
        cfg = locks_config(extra)
        eager = cfg.selection == "oracle" or not hooks.graph_safe(hooks.hook_classes(extra))
        if compat.on_cpu() or eager:
            return AttentionCGSupport.NEVER
        return cls._cudagraph_support

    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._init_reorder_batch_threshold(1)
        extra = vllm_config.additional_config if isinstance(vllm_config.additional_config, dict) else {}
        self.cfg = locks_config(extra)
        self.block_size = kv_cache_spec.block_size
        if self.block_size % self.cfg.page_size:
            raise ValueError(
                f"LocksConfig.page_size={self.cfg.page_size} must divide vLLM's KV cache block size "
                f"{self.block_size}: pick a page size that divides it, or set block_size"
            )
        self.ppb = self.block_size // self.cfg.page_size
        self._no_superpages: Tensor | None = None  # allocated by the first build (the device is checked first)
        self.on_cuda = torch.device(device).type == "cuda"
        if self.on_cuda:
            check_summary_format(self.cfg)
        hook_classes = hooks.hook_classes(extra)
        if compat.on_cpu():
            compat.check_cpu_layout(kv_cache_spec.head_size, kv_cache_spec.dtype, kv_cache_spec.num_kv_heads,
                                    self.block_size, allow_amx=not hooks.needs_cache_views(hook_classes))
        total, locks = check_layers(vllm_config)
        check_candidates(self.cfg, total)
        self.last_layer_name = layer_names[-1] if layer_names else ""
        self.stats = self._open_stats(extra.get(STATS_PATH_KEY), kv_cache_spec, vllm_config, total, locks,
                                      layer_names)
        self.calibration = CalibrationQueue() if self.cfg.calibrated else None
        """The layers' stashed prompt queries (``candidates="auto"``), settled at the start of each step."""

    def _open_stats(self, path, spec, vllm_config, total: int, locks: int, layer_names: list[str]
                    ) -> StepStats | DeviceStepStats | None:
        """This rank's statistics ring (``locks_engine.stats``): ``rank_path(path, rank)``, with the rank, the
        tensor-parallel world size, this rank's KV heads and the run (vLLM's ``instance_id``, the same in
        every worker) in its header; None without a path or on a worker that writes none."""
        where = compat.stats_rank()
        if not path or where is None:
            return None
        max_len = vllm_config.model_config.max_model_len if vllm_config.model_config else 1 << 17
        ring = StatsRing.create(
            path,
            max_pages=-(-max_len // self.cfg.page_size),
            page_size=self.cfg.page_size,
            rank=where[0],
            world_size=where[1],
            run=run_id(str(getattr(vllm_config, "instance_id", "") or "")),
            num_kv_heads=spec.num_kv_heads,
        )
        ring.set_layers(total, locks)
        cfg = self.cfg
        kv, summary = scan_bytes(cfg, spec.head_size, spec.dtype)
        if self.on_cuda:
            max_num_seqs = int(getattr(vllm_config.scheduler_config, "max_num_seqs", 0) or 256)
            return DeviceStepStats(ring, kv, summary, layer_names, spec.num_kv_heads, max_num_seqs, self.device)
        return StepStats(ring, page_bytes=kv, summary_page_bytes=summary)

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> LocksMetadata:
        cam = common_attn_metadata
        rows = cam.num_reqs
        starts = cam.query_start_loc_cpu[: rows + 1].tolist()
        query_lens = [starts[i + 1] - starts[i] for i in range(rows)]
        num_decodes = next((i for i, n in enumerate(query_lens) if n != 1), rows)
        if self.on_cuda:
            seq_lens_cpu = host_seq_lens(cam, rows)
            rows = max((i + 1 for i, n in enumerate(query_lens) if n), default=0)
            block_table = cam.block_table_tensor[:rows]
            paged = slice(num_decodes, rows)
        else:
            seq_lens_cpu = cam.seq_lens[:rows].cpu()
            width = -(-int(seq_lens_cpu.max()) // self.block_size) if rows else 0
            block_table = cam.block_table_tensor[:rows, :width]
            paged = slice(0, rows)
        if self.calibration is not None:
            self.calibration.settle(seq_lens_cpu[: len(query_lens)].tolist(), query_lens)
        ids, slots = self._new_pages(seq_lens_cpu[paged], torch.tensor(query_lens)[paged], block_table[paged])
        if self._no_superpages is None:
            self._no_superpages = torch.zeros(0, SUPERPAGE_PAGES, dtype=torch.long, device=self.device)
        superpages = self._no_superpages  # decode-only steps on CUDA: built on the device (``cuda.py``)
        if self.cfg.selection == "two-level" and self.cfg.summarized and ids.numel():
            superpages = completed_superpages(seq_lens_cpu[paged], torch.tensor(query_lens)[paged],
                                              block_table[paged], self.cfg.page_size, self.block_size)
            superpages = superpages.to(self.device, non_blocking=True)
        prefill = None
        if num_decodes < rows:
            base = starts[num_decodes]
            prefill = PrefillRows(
                query_start_loc=(cam.query_start_loc[num_decodes : rows + 1] - base).to(torch.int32),
                seq_lens=cam.seq_lens[num_decodes:rows],
                block_table=block_table[num_decodes:],
                query_start_loc_cpu=[s - base for s in starts[num_decodes : rows + 1]],
                seq_lens_cpu=seq_lens_cpu[num_decodes:rows].tolist(),
            )
        if isinstance(self.stats, DeviceStepStats):
            self.stats.collect()  # the steps the device finished since the last build
        elif self.stats is not None:
            self.stats.reset(seq_lens_cpu[:num_decodes].tolist(), starts[rows] - starts[num_decodes])
        return LocksMetadata(
            cfg=self.cfg,
            num_actual_tokens=cam.num_actual_tokens,
            num_decodes=num_decodes,
            query_start_loc=cam.query_start_loc[: rows + 1],
            seq_lens=cam.seq_lens[:rows],
            block_table=block_table,
            slot_mapping=cam.slot_mapping,
            new_page_ids=ids.to(self.device, non_blocking=True),
            new_page_slots=slots.to(self.device, non_blocking=True),
            new_superpages=superpages,
            prefill=prefill,
            stats=self.stats,
            last_layer_name=self.last_layer_name,
            calibration=self.calibration,
        )

    def _new_pages(self, seq_lens: Tensor, query_lens: Tensor, block_table: Tensor) -> tuple[Tensor, Tensor]:
        """Physical ids `[Pn]` and token slots `[Pn, B]` of the pages completed by this step's tokens
        (``block_table`` is read on the host only when some page completes).

        Page ``j`` of a row completes now when ``(seq_len - query_len) // B <= j < seq_len // B``.
        """
        page = self.cfg.page_size
        first = (seq_lens - query_lens) // page
        counts = (seq_lens // page - first).clamp_min(0)
        if int(counts.sum()) == 0:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, page, dtype=torch.long)
        row = torch.repeat_interleave(torch.arange(len(counts)), counts)
        offsets = torch.arange(int(counts.sum())) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        pages = first[row] + offsets  # logical page index
        blocks = block_table.cpu()[row, pages // self.ppb].long()
        ids = blocks * self.ppb + pages % self.ppb
        slots = (blocks * self.block_size + (pages % self.ppb) * page).unsqueeze(1) + torch.arange(page)
        return ids, slots


def host_seq_lens(cam: CommonAttentionMetadata, rows: int) -> Tensor:
    """`[rows]` tokens of each row on the host without waiting for the device where vLLM offers that
    (``seq_lens_cpu_upper_bound``: exact but for async speculative decoding, which LOCKS does not run)."""
    bound = getattr(cam, "seq_lens_cpu_upper_bound", None)
    return bound[:rows].clone() if bound is not None else cam.seq_lens[:rows].cpu()


def check_candidates(cfg: LocksConfig, layers: int) -> None:
    """Check at startup that a per-layer ``candidates`` table fits the model (``layers`` decoder attention layers;
    0 when no model is loaded, which checks nothing).

    Raises:
        ValueError: a table of more than one entry whose length is not the model's layer count (one line).
    """
    if cfg.selection == "two-level" and not cfg.calibrated and layers and len(cfg.candidates) not in (1, layers):
        raise ValueError(f"LocksConfig.candidates has {len(cfg.candidates)} entries for a model of {layers} "
                         "attention layers: give one value for every layer, or one per layer")


def check_layers(vllm_config) -> tuple[int, int]:
    """Count the model's decoder attention layers and those that run LOCKS.

    Returns:
        tuple[int, int]: ``(total, locks)``; ``(0, 0)`` when no model is loaded (engine-free tests).
    Raises:
        RuntimeError: some decoder attention layer runs another backend (vLLM fell back silently).
    """
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention import Attention

    layers = get_layers_from_vllm_config(vllm_config, Attention)
    decoders = {n: layer for n, layer in layers.items() if layer.attn_type == AttentionType.DECODER}
    others = sorted(n for n, layer in decoders.items() if not isinstance(layer.impl, LocksAttentionImpl))
    if others:
        impls = sorted({type(decoders[n].impl).__name__ for n in others})
        raise RuntimeError(
            f"LOCKS backend: {len(others)} of {len(decoders)} attention layers run {impls} instead "
            f"(first: {others[0]}); on CPU check that LOCKS_OVERRIDE_CPU_ATTN is not 0"
        )
    return len(decoders), len(decoders)
