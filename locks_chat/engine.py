"""The engine as the app sees it: a protocol (so tests can script a fake) and the factory for the real one.

``import locks_chat`` starts nothing and imports no vLLM: :func:`open_engine` does, when called.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any, Protocol

from locks_chat.errors import EngineError


class ChatEngine(Protocol):
    """What the CLI and the TUI need from an engine (``locks_engine.vllm_backend.runner.LocksEngine``)."""

    tokenizer: Any
    max_context: int

    def stream(
        self, prompt_ids: list[int], max_tokens: int, cancel: threading.Event | None = None
    ) -> Iterator[Any]:
        """Yield ``StreamEvent``-like objects (``text``, ``num_tokens``, ``finished``, ``elapsed_s``,
        ``stats``); raise ``GenerationCancelled``-named exceptions when ``cancel`` is set."""

    def close(self) -> None: ...


def quiet_vllm_logging() -> None:
    """Keep vLLM's logs off stdout (answers and ``--json`` go there) unless the user set them."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    # engine processes inherit this: their import-time FutureWarnings are not the user's business
    os.environ.setdefault("PYTHONWARNINGS", "ignore")


def open_engine(model: str | None, locks: Any, max_model_len: int | None = None) -> ChatEngine:
    """Start vLLM with the LOCKS backend (15-75 s on 2 CPU cores).

    Raises:
        EngineError: vLLM is not installed, the model cannot be found or converted, or the engine fails.
    """
    quiet_vllm_logging()
    try:
        from locks_engine.models import ModelError
        from locks_engine.vllm_backend.runner import EngineOptions, EngineStartError, LocksEngine
    except ImportError as err:
        raise EngineError(f"the engine is not installed ({err.name} missing): run the install command from the README") from err
    try:
        return LocksEngine(EngineOptions(model=model, locks=locks, max_model_len=max_model_len))
    except (ModelError, EngineStartError) as err:
        raise EngineError(str(err)) from err
