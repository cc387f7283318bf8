"""Follow-ups on real engines (vLLM with LOCKS, the built-in model): a follow-up on the same engine reuses the first
turn's KV blocks from vLLM's prefix cache and reports how many, LOCKS prefills only the rest, and the answer is the
one a new engine gives (about three minutes: three engine starts). Also the batch path the benchmarks take
(``LocksEngine.generate``)."""

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
        # the benchmarks' batch path on the same engine: two prompts decoded together, every step's records
        short, long = engine.tokenizer.encode(TEXT[:400]), engine.tokenizer.encode(TEXT)
        tokens, records = engine.generate([long, short], 6, ignore_eos=True)
    finally:
        engine.close()
    assert [len(t) for t in tokens] == [6, 6]
    decode = [r for r in records if r["num_decodes"]]
    assert sum(r["num_decodes"] for r in decode) == 2 * 5  # each sequence's tokens after its first
    # at a 256-token budget the long prompt's ~76 pages are not all read; the short one's 7 are
    assert all(0 < r["pages_read"] <= r["pages_total"] for r in decode)
    assert any(r["pages_read"] < r["pages_total"] for r in decode)
    assert first.cached_tokens == 0
    assert 0 < second.cached_tokens <= first.prompt_tokens
    # LOCKS' own step records count the prompt tokens prefilled: the rest came from the cache
    assert second.reading.prefill_tokens == second.prompt_tokens - second.cached_tokens
    assert first.reading.prefill_tokens == first.prompt_tokens


def test_a_follow_up_from_the_prefix_cache_answers_as_on_a_new_engine(model_dir):
    """LOCKS' page summaries follow vLLM's cached blocks: at a 64-token budget (4 of ~76 KV pages, so the
    summaries decide what is read) a follow-up served mostly from the cache gives the greedy tokens of the same
    prompt on a new engine (float32: bf16 rounding alone makes greedy tokens drift apart)."""
    import gc

    from vllm import LLM, SamplingParams

    def engine() -> LLM:
        return LLM(model=model_dir, dtype="float32", enforce_eager=True, max_model_len=4096,
                   kv_cache_memory_bytes=256 << 20, seed=0,
                   additional_config={"locks": LocksConfig(budget=64).to_dict()})

    def shut(llm: LLM) -> None:
        llm.llm_engine.engine_core.shutdown()
        gc.collect()

    story = ("The river ran past the old mill, where the miller kept his accounts in a ledger bound with green "
             "cloth. Every evening he wrote down the sacks of wheat, the sacks of barley and the coins he had been "
             "paid. ")
    params = SamplingParams(temperature=0.0, max_tokens=24)
    first_turn = [{"role": "user", "content": "Read this and answer. " + story * 24 + "How did he keep accounts?"}]
    llm = engine()
    try:
        first = llm.chat([first_turn], params, use_tqdm=False)[0]
        follow_up = first_turn + [{"role": "assistant", "content": first.outputs[0].text},
                                  {"role": "user", "content": "What colour was the ledger's cloth?"}]
        warm = llm.chat([follow_up], params, use_tqdm=False)[0]
    finally:
        shut(llm)
    llm = engine()
    try:
        cold = llm.chat([follow_up], params, use_tqdm=False)[0]
    finally:
        shut(llm)
    assert warm.num_cached_tokens > len(warm.prompt_token_ids) // 2 and cold.num_cached_tokens == 0
    assert list(warm.outputs[0].token_ids) == list(cold.outputs[0].token_ids)
