"""Benchmark probes that run inside vLLM's worker process (sent with ``LLM.apply_model``, by reference, so this
module must import there): eager decode calls of the attention backends (a silent fallback from CUDA graphs
shows as calls after capture), host time of their metadata builders per step and the bytes of LOCKS' page
summaries; and torch's profiler around chosen decode steps. The pages LOCKS reads are counted by the backend's
statistics ring (``locks_engine.vllm_backend.device_stats`` on CUDA), which the benchmarks read as the app does. Used by ``samples/bench_e2e.py``; importable without vLLM (its imports are inside the functions).
"""

from __future__ import annotations

import torch
from torch import Tensor

def install_probes(model) -> int:
    """In the worker: count eager decode calls of each attention impl and time the metadata builders (host).

    Patches the classes, so it reaches every layer; counters live on the classes (``_probe``)."""
    import functools
    import time as _time

    classes = []
    try:
        from locks_engine.vllm_backend.impl import LocksAttentionImpl
        from locks_engine.vllm_backend.builder import LocksMetadataBuilder

        classes.append((LocksAttentionImpl, LocksMetadataBuilder, lambda m: m.num_decodes > 0 and m.prefill is None))
    except ImportError:
        pass
    try:
        from vllm.v1.attention.backends.flash_attn import (
            FlashAttentionImpl,
            FlashAttentionMetadataBuilder,
        )

        classes.append((FlashAttentionImpl, FlashAttentionMetadataBuilder, lambda m: m.max_query_len == 1))
    except ImportError:
        pass
    for impl_cls, builder_cls, is_decode in classes:
        if getattr(impl_cls, "_probe", None) is not None:
            continue
        probe = {"eager_decode_calls": 0, "build_calls": 0, "build_s": 0.0}
        impl_cls._probe = builder_cls._probe = probe
        forward, build = impl_cls.forward, builder_cls.build

        @functools.wraps(forward)
        def counted_forward(self, layer, query, key, value, kv_cache, attn_metadata, *args,
                            _f=forward, _p=probe, _d=is_decode, **kwargs):
            if attn_metadata is not None and _d(attn_metadata):
                _p["eager_decode_calls"] += 1
            return _f(self, layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs)

        @functools.wraps(build)
        def timed_build(self, *args, _b=build, _p=probe, **kwargs):
            t0 = _time.perf_counter()
            out = _b(self, *args, **kwargs)
            _p["build_s"] += _time.perf_counter() - t0
            _p["build_calls"] += 1
            return out

        impl_cls.forward, builder_cls.build = counted_forward, timed_build
    return len(classes)


def read_probes(model, reset: bool = True) -> dict:
    """In the worker: probe counters and summary bytes; reset after reading."""
    out = {"eager_decode_calls": 0, "build_calls": 0, "build_s": 0.0, "summary_bytes": 0, "attention_layers": 0}
    seen = set()
    for module in model.modules():
        impl = getattr(module, "impl", None)
        if impl is None or not hasattr(impl, "forward"):
            continue
        out["attention_layers"] += 1
        probe = getattr(type(impl), "_probe", None)
        if probe is not None and id(probe) not in seen:
            seen.add(id(probe))
            for k in ("eager_decode_calls", "build_calls", "build_s"):
                out[k] += probe[k]
                if reset:
                    probe[k] = 0 if k != "build_s" else 0.0
        store = getattr(impl, "_store", None)
        if store is not None:
            out["summary_bytes"] += int(store.nbytes)
    return out


def kv_cache_bytes(model) -> int:
    """In the worker: bytes of the KV cache tensors the attention layers hold (each storage counted once)."""
    storages = {}
    for module in model.modules():
        caches = getattr(module, "kv_cache", None)
        for cache in [caches] if isinstance(caches, Tensor) else caches or []:  # 0.26: a list per virtual engine
            if isinstance(cache, Tensor) and cache.numel():
                storages[cache.untyped_storage().data_ptr()] = cache.untyped_storage().nbytes()
    return sum(storages.values())


def reset_probes(model) -> int:
    """In the worker: zero every probe and counter (returns 0)."""
    read_probes(model, reset=True)
    return 0


_PROFILER = None


def start_profile(model) -> int:
    """In the worker: start torch's profiler (CPU ops, and CUDA kernels on a GPU: CUPTI reports the kernels that a
    CUDA-graph replay launches one by one, so a captured decode step is broken down too). Returns 0."""
    global _PROFILER
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    _PROFILER = torch.profiler.profile(activities=activities)
    _PROFILER.start()
    return 0


def stop_profile(model, top: int = 60) -> list[dict]:
    """In the worker: stop the profiler of :func:`start_profile` and return its ``top`` entries by self device
    time (self CPU time where no device time was recorded): ``name``, ``calls``, ``self_device_us``,
    ``device_us``, ``self_cpu_us``, ``cpu_us`` (microseconds, totals over the profiled steps). ``[]`` when no
    profiler runs."""
    summary = stop_profile_summary(model, top)
    return summary["by_device"] if summary else []


def stop_profile_summary(model, top: int = 60) -> dict:
    """In the worker: stop the profiler of :func:`start_profile`; returns ``{}`` when none runs, else
    ``by_device`` (the rows of :func:`stop_profile`), ``by_cpu`` (the ``top`` entries by inclusive CPU time:
    vLLM's ``record_function`` ranges of a step show where the host time goes), ``device_us_total`` (the sum of
    self device time over every entry, microseconds), ``kernel_us_total`` (the same over device-side entries only,
    those with no CPU time: kernels, copies; an eager op or a launch call also carries its kernels' device time,
    so ``device_us_total`` counts those kernels twice) and ``cpu_us_total``."""
    global _PROFILER
    prof, _PROFILER = _PROFILER, None
    if prof is None:
        return {}
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    prof.stop()
    rows = []
    for event in prof.key_averages():
        rows.append({
            "name": event.key[:200], "calls": int(event.count),
            "self_device_us": round(float(getattr(event, "self_device_time_total", 0.0)), 1),
            "device_us": round(float(getattr(event, "device_time_total", 0.0)), 1),
            "self_cpu_us": round(float(event.self_cpu_time_total), 1),
            "cpu_us": round(float(event.cpu_time_total), 1),
        })
    key = "self_device_us" if any(r["self_device_us"] > 0 for r in rows) else "self_cpu_us"
    by_device = sorted(rows, key=lambda r: -r[key])[:top]
    by_cpu = sorted(rows, key=lambda r: -r["cpu_us"])[:top]
    return {
        "by_device": by_device, "by_cpu": by_cpu,
        "device_us_total": round(sum(r["self_device_us"] for r in rows), 1),
        "kernel_us_total": round(sum(r["self_device_us"] for r in rows if r["self_cpu_us"] == 0), 1),
        "cpu_us_total": round(sum(r["self_cpu_us"] for r in rows), 1),
    }
