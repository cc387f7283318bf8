"""The ``vllm.general_plugins`` entry point: registers the LOCKS backend in every vLLM process.

vLLM calls ``register()`` in the API process, the engine core and every worker, possibly more than once, and
before any configuration exists: it must be idempotent, cheap and driven by the environment alone.

- Always: ``AttentionBackendEnum.CUSTOM`` -> LOCKS (select it with ``attention_backend="CUSTOM"`` on GPU).
- On vLLM's CPU platform, which ignores the selection and always takes ``CPU_ATTN``: ``CPU_ATTN`` -> LOCKS too,
  unless ``LOCKS_OVERRIDE_CPU_ATTN=0`` (then vLLM's own CPU backend runs: the reference in tests).
"""

from __future__ import annotations

import os

BACKEND_PATH = "locks_engine.vllm_backend.backend.LocksAttentionBackend"
#: Environment switch for the CPU_ATTN override ("0" turns it off).
OVERRIDE_ENV = "LOCKS_OVERRIDE_CPU_ATTN"


def override_cpu_attn() -> bool:
    """Whether LOCKS should replace vLLM's CPU backend in this process (``$LOCKS_OVERRIDE_CPU_ATTN`` != 0)."""
    return os.environ.get(OVERRIDE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def register() -> None:
    """Register LOCKS over ``CUSTOM`` and, on CPU, over ``CPU_ATTN`` (idempotent; imports no model code)."""
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CUSTOM, BACKEND_PATH)
    if current_platform.is_cpu():
        if override_cpu_attn():
            register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND_PATH)
        elif AttentionBackendEnum.CPU_ATTN.get_path() == BACKEND_PATH:
            AttentionBackendEnum.CPU_ATTN.clear_override()
