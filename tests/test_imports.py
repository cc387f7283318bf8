"""Import hygiene: the engine core pulls in neither triton nor vllm; transformers never imports our kernels."""

import subprocess
import sys

import pytest


def _modules_after(statement: str) -> set[str]:
    """Modules loaded by ``statement`` in a fresh interpreter started outside the checkout (as an installed
    package is used: from the checkout's root, the ``kernels/`` folder itself would be importable)."""
    code = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    return set(out.stdout.split())


def test_locks_engine_imports_neither_triton_nor_vllm():
    loaded = _modules_after("import locks_engine, locks_engine.ops")
    assert "locks_engine.ops" in loaded
    assert not {m for m in loaded if m.split(".")[0] in {"triton", "vllm", "transformers"}}


def test_the_engine_driver_imports_no_vllm_until_an_engine_starts():
    loaded = _modules_after("import locks_engine.engine, locks_engine.models")
    assert "locks_engine.engine" in loaded
    assert not {m for m in loaded if m.split(".")[0] in {"triton", "vllm", "transformers", "locks_chat"}}


def test_locks_chat_does_not_start_an_engine():
    loaded = _modules_after("import locks_chat")
    assert not {m for m in loaded if m.split(".")[0] in {"vllm", "triton"}}


def test_kernels_are_installed_as_locks_kernels_only():
    loaded = _modules_after("import locks_kernels")
    assert "locks_kernels" in loaded
    code = "import importlib.util; print(importlib.util.find_spec('kernels') is None)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "True", "an importable 'kernels' would be probed by transformers"


def test_transformers_does_not_import_our_kernels():
    pytest.importorskip("transformers")
    loaded = _modules_after("import transformers, transformers.modeling_utils")
    assert "transformers.modeling_utils" in loaded
    assert "locks_kernels" not in loaded and "kernels" not in loaded
