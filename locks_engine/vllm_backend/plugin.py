"""The ``vllm.general_plugins`` entry point: registers the LOCKS backend in every vLLM process.

vLLM calls ``register()`` in the API process, the engine core and every worker, possibly more than once, and
before any configuration exists: it must be idempotent, cheap and driven by the environment alone.

- Always: ``AttentionBackendEnum.CUSTOM`` -> LOCKS (select it with ``attention_backend="CUSTOM"`` on GPU).
- Always: LOCKS' keys of ``additional_config`` are checked before vLLM builds its configuration
  (``check_settings_first``): a wrong setting stops ``vllm serve`` with one logged line naming it, before the model
  loads, and raises a ``ValueError`` in ``LLM``/``LLMEngine`` users.
- On CUDA: vLLM's KV cache share leaves room for the page summaries of an engine that runs LOCKS
  (``memory.reserve_summaries``).
- On vLLM's CPU platform, which ignores the selection and always takes ``CPU_ATTN``: ``CPU_ATTN`` -> LOCKS too,
  unless ``LOCKS_OVERRIDE_CPU_ATTN=0`` (then vLLM's own CPU backend runs: the reference in tests).
- In vLLM's child processes of an engine whose ``EngineOptions.processes`` has ``app_children`` (the engine sets
  ``LOCKS_APP_OWNS_SIGINT=1`` in their environment): ``locks_engine.processes.leave_sigint_to_the_app`` (SIGINT
  ignored, the process ends when the app's is gone, no garbage collection at exit). vLLM installs its own SIGINT
  handlers before it loads plugins, so this comes after them. ``vllm serve`` and other users of the plugin keep
  vLLM's behaviour.
"""

from __future__ import annotations

import functools
import logging
import os

from locks_engine.processes import leave_sigint_to_the_app

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
    check_settings_first()
    leave_sigint_to_the_app()
    if current_platform.is_cuda():
        from locks_engine.vllm_backend.memory import reserve_summaries

        reserve_summaries()
    if current_platform.is_cpu():
        if override_cpu_attn():
            register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND_PATH)
        elif AttentionBackendEnum.CPU_ATTN.get_path() == BACKEND_PATH:
            AttentionBackendEnum.CPU_ATTN.clear_override()


def check_settings_first() -> None:
    """Wrap ``EngineArgs.create_engine_config`` (idempotent) so that it checks LOCKS' keys of
    ``additional_config`` (``config_keys.check_settings``) before it builds anything. For the OpenAI server
    (``UsageContext.OPENAI_API_SERVER``: ``vllm serve``, ``python -m vllm.entrypoints.openai.api_server``) a
    wrong setting is logged as one line and the server exits with status 1, where vLLM would have printed three
    processes' tracebacks after loading the model; other callers get the ``ValueError``."""
    from vllm.engine.arg_utils import EngineArgs

    create = EngineArgs.create_engine_config
    if getattr(create, "_locks_checked", False):
        return

    @functools.wraps(create)
    def create_checked(self, *args, **kwargs):
        from locks_engine.vllm_backend.config_keys import check_settings

        try:
            check_settings(self.additional_config)
        except ValueError as err:
            usage = kwargs.get("usage_context", args[0] if args else None)
            if getattr(usage, "name", None) != "OPENAI_API_SERVER":
                raise
            logging.getLogger("vllm").error("LOCKS: %s", err)
            raise SystemExit(1) from None
        return create(self, *args, **kwargs)

    create_checked._locks_checked = True
    EngineArgs.create_engine_config = create_checked
