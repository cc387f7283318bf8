"""The LOCKS backend under vLLM tensor parallelism (vllm-cpu, two ranks on one machine).

A tiny random Llama checkpoint (2 layers, 4 query / 2 KV heads, D 64, fp32) written with transformers, so that
vLLM shards the same weights for one and for two ranks; each rank holds one KV head, summarizes and selects its
pages alone, and writes its own statistics ring. Greedy tokens of two ranks must equal one rank's, and the
merged statistics must count both ranks' KV heads. About a minute on 2 cores (two engine starts). The top two
logprobs of every greedy step are at least 0.1 nats apart, far above the rounding that sharding changes.

vllm-cpu binds each rank's threads to a NUMA node unless told otherwise and refuses two ranks on a single-node
machine ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers"): the test splits the allowed
CPUs between the ranks with ``VLLM_CPU_OMP_THREADS_BIND`` (``"0|1"`` on 2 cores).
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")
pytest.importorskip("transformers", reason="transformers writes the test checkpoint")

from locks_engine.config import LocksConfig  # noqa: E402
from locks_engine.stats import require_locks  # noqa: E402

VOCAB, PROMPT_TOKENS, GEN_TOKENS = 512, 300, 8
#: Decode-record counters that do not depend on which pages a head picks (only on how many there are).
COUNTERS = ("num_layers", "num_kv_heads", "pages_read", "pages_total", "summaries_read", "bytes_read", "bytes_dense")


def cpu_bind(ranks: int) -> str | None:
    """``VLLM_CPU_OMP_THREADS_BIND`` giving each rank its share of the allowed CPUs; None when too few."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < ranks:
        return None
    share = len(cpus) // ranks
    return "|".join(",".join(map(str, cpus[r * share : (r + 1) * share])) for r in range(ranks))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, vocab_size=VOCAB, max_position_embeddings=2048, initializer_range=0.08,
        tie_word_embeddings=False, torch_dtype="float32", bos_token_id=1, eos_token_id=2,
    )
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return str(path)


def generate(model_dir: str, ranks: int, stats_path) -> tuple[list[int], object, list[dict]]:
    """Greedy tokens of one seeded prompt with LOCKS (budget 4 pages) on ``ranks`` tensor-parallel ranks;
    the statistics reader and its decode records."""
    from vllm import LLM, SamplingParams

    llm = None
    try:
        llm = LLM(
            model=model_dir,
            skip_tokenizer_init=True,
            dtype="float32",
            enforce_eager=True,
            max_model_len=1024,
            tensor_parallel_size=ranks,
            kv_cache_memory_bytes=64 << 20,
            seed=0,
            additional_config={"locks": LocksConfig(budget=64).to_dict(), "locks_stats_path": str(stats_path)},
        )
        reader = require_locks(stats_path, timeout_s=10.0)
        prompt = np.random.default_rng(0).integers(3, VOCAB, PROMPT_TOKENS).tolist()
        params = SamplingParams(temperature=0.0, max_tokens=GEN_TOKENS, ignore_eos=True, detokenize=False)
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0]
        records = [r for r in reader.latest(reader.written()) if r["num_decodes"]]
        return list(out.token_ids), reader, records
    finally:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


@pytest.fixture(scope="module")
def one_rank(model_dir, tmp_path_factory):
    return generate(model_dir, 1, tmp_path_factory.mktemp("tp1") / "stats.bin")


@pytest.fixture(scope="module")
def two_ranks(model_dir, tmp_path_factory):
    bind = cpu_bind(2)
    if bind is None:
        pytest.skip("two tensor-parallel ranks need at least 2 CPUs")
    previous = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
    try:
        return generate(model_dir, 2, tmp_path_factory.mktemp("tp2") / "stats.bin")
    finally:
        if previous is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = previous


def test_two_ranks_generate_one_ranks_tokens(one_rank, two_ranks):
    assert len(one_rank[0]) == GEN_TOKENS
    assert two_ranks[0] == one_rank[0]


def test_merged_statistics_count_both_ranks_kv_heads(one_rank, two_ranks):
    (_, single, single_records), (_, merged, merged_records) = one_rank, two_ranks
    assert merged.world_size == 2 and [int(r.header["num_kv_heads"]) for r in merged.rings] == [1, 1]
    assert merged.rings[1].path.name == "stats.bin.rank1"
    assert single.world_size == 1 and single.num_kv_heads() == merged.num_kv_heads() == 2
    assert len(merged_records) == len(single_records) == GEN_TOKENS - 1
    for one, two in zip(single_records, merged_records):
        assert two["num_kv_heads"] == 2 and 0 < two["pages_read"] < two["pages_total"]
        assert {k: two[k] for k in COUNTERS} == {k: one[k] for k in COUNTERS}
        assert int(two["row_hist"].sum()) == int(one["row_hist"].sum()) == two["row_pages_read"][0]
