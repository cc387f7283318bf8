"""Decode hooks: code that looks at (or changes, and then restores) each decode step's selection, configured
per engine and kept out of the attention path.

``additional_config["locks_hooks"] = ["module.path:ClassName", ...]``: every LOCKS layer imports each class and
makes one instance with no arguments (``LocksAttentionImpl.hooks``). After selection and before attention of
every decode it calls ``hook.on_decode(...)`` (``DecodeHook``); a callable returned there is called after
attention, to undo what the hook did. Hooks run in vLLM's worker processes: their modules must be importable
there (installed, or on ``PYTHONPATH``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import ClassVar, Protocol

from torch import Tensor

from locks_engine.vllm_backend.config_keys import HOOKS_KEY


class DecodeHook(Protocol):
    """What a hook class provides (class attributes and ``on_decode``)."""

    cuda_graphs: ClassVar[bool]
    """Safe inside a CUDA graph (no host work that a replay would skip); False: the builder declares no
    CUDA-graph support, so vLLM runs attention eagerly."""
    needs_cache_views: ClassVar[bool]
    """The hook reads or writes the cache through ``k_cache``/``v_cache``: the CPU path then keeps the cache
    off vLLM's ``amx`` layout, which no view describes."""

    def on_decode(
        self, *, layer_name: str, last_layer: bool, k_cache: Tensor | None, v_cache: Tensor | None,
        block_table: Tensor, seq_lens: Tensor, selected: Tensor, page_size: int, num_kv_heads: int,
    ) -> Callable[[], None] | None:
        """One layer's decode rows, between selection and attention.

        Args:
            layer_name (str): the layer; last_layer (bool): the model's last LOCKS layer.
            k_cache, v_cache (Tensor | None): `[num_blocks, block_size, H, D]` views of the cache, None for the
                ``amx`` layout.
            block_table (Tensor): `[S, W]` int32 physical block ids; seq_lens (Tensor): `[S]` int32 tokens.
            selected (Tensor): int64 `[S, H, K]` logical pages read, ascending, ``-1`` in unused slots.
            page_size (int): B; num_kv_heads (int): H.
        Returns:
            Callable[[], None] | None: called after attention (undo), or None.
        """


def hook_classes(additional_config: object) -> list[type]:
    """The hook classes named by ``additional_config["locks_hooks"]`` (none without that key).

    Raises:
        ValueError: a name is not ``"module.path:ClassName"``, or its module or class cannot be imported.
    """
    names = additional_config.get(HOOKS_KEY) if isinstance(additional_config, dict) else None
    classes = []
    for name in names or ():
        module, _, attr = str(name).partition(":")
        try:
            classes.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError, ValueError) as err:
            raise ValueError(
                f'additional_config["{HOOKS_KEY}"]: {name!r} is not an importable "module.path:ClassName" ({err})'
            ) from err
    return classes


def graph_safe(classes: list[type]) -> bool:
    """Whether every hook class may run inside a CUDA graph (``cuda_graphs``, False when unset)."""
    return all(getattr(cls, "cuda_graphs", False) for cls in classes)


def needs_cache_views(classes: list[type]) -> bool:
    """Whether some hook class reads the cache through views (``needs_cache_views``, True when unset)."""
    return any(getattr(cls, "needs_cache_views", True) for cls in classes)


def configured_hook_classes() -> list[type]:
    """The hook classes of the vLLM config being built (none outside one, e.g. in engine-free tests)."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    return hook_classes(getattr(config, "additional_config", None) if config is not None else None)
