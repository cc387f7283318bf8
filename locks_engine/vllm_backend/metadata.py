"""Per-step metadata of the LOCKS backend: what the builder (``builder.py``) hands the ``forward`` of every layer of
one KV cache group (``impl.py``) and, through it, the device paths (``cpu.py``, ``cuda.py``). Kept apart from the
builder so that those modules name it without importing the builder, which imports them."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from locks_engine.config import LocksConfig
from locks_engine.vllm_backend.calibration import CalibrationQueue
from locks_engine.vllm_backend.device_stats import DeviceStepStats
from locks_engine.vllm_backend.prefill import PrefillRows
from locks_engine.vllm_backend.step_stats import StepStats


@dataclass
class LocksMetadata:
    """One step of one KV cache group, shared by its layers."""

    cfg: LocksConfig
    num_actual_tokens: int
    num_decodes: int
    """Rows `[0, num_decodes)` have one query token each (token ``i`` of the batch is row ``i``'s)."""
    query_start_loc: Tensor
    """`[R+1]` int32 query token offsets of the rows."""
    seq_lens: Tensor
    """`[R]` int32 tokens of each sequence after this step."""
    block_table: Tensor
    """`[R, W]` int32 physical block ids, ``W`` blocks cover the longest row."""
    slot_mapping: Tensor
    """`[T]` int64 cache slot (``block * block_size + offset``) of each token, ``-1`` for padding."""
    new_page_ids: Tensor
    """`[Pn]` int64 physical page ids of the pages this step completes."""
    new_page_slots: Tensor
    """`[Pn, B]` int64 cache slots of those pages' tokens."""
    new_superpages: Tensor
    """`[Ns, 16]` int64 physical page ids of the pages of each superpage this step completes (``two-level``
    selection only; empty otherwise), for the same rows as ``new_page_ids``."""
    prefill: PrefillRows | None
    """The rows after the decodes, or None."""
    stats: StepStats | DeviceStepStats | None
    """Counters closed by the last layer (``last_layer_name``): on the host (CPU path) or on the device (CUDA
    path, inside CUDA graphs); None when no stats path is set."""
    last_layer_name: str
    """The model's last LOCKS layer (of this group): it flushes ``stats``, and hooks are told."""
    calibration: CalibrationQueue | None = None
    """``candidates="auto"``: where prefill rows stash the prompt's last queries (``calibration.py``)."""
