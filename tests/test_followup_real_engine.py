"""A follow-up on one real engine (vLLM with LOCKS, the built-in model) reuses the first turn's KV blocks from
vLLM's prefix cache, reports how many, and LOCKS prefills only the rest (about a minute: one engine start)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")

from locks_chat.ask import ask  # noqa: E402
from locks_chat.ingest import load_document  # noqa: E402
from locks_engine.config import LocksConfig  # noqa: E402
from locks_engine.engine import EngineOptions, LocksEngine  # noqa: E402

TEXT = (
    "The lighthouse on Gull Rock was automated in 1987, and no keeper has lived there since. "
    + "The supply boat called at the harbour wall every Thursday, weather permitting. " * 30
)


def test_a_follow_up_reports_a_prefix_cache_hit(tmp_path, model_dir):
    path = tmp_path / "harbour.txt"
    path.write_text(TEXT, encoding="utf-8")
    document = load_document(path)
    engine = LocksEngine(EngineOptions(model=model_dir, locks=LocksConfig(budget=256), max_model_len=4096))
    try:
        first = ask(engine, document, ["When was the lighthouse automated?"], max_tokens=8)
        second = ask(engine, document, ["When was the lighthouse automated?", "Who lives there?"], [first.answer],
                     max_tokens=8)
    finally:
        engine.close()
    assert first.cached_tokens == 0
    assert 0 < second.cached_tokens <= first.prompt_tokens
    # LOCKS' own step records count the prompt tokens prefilled: the rest came from the cache
    assert second.reading.prefill_tokens == second.prompt_tokens - second.cached_tokens
    assert first.reading.prefill_tokens == first.prompt_tokens
