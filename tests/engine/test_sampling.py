"""Sampling (``locks_engine.sampling``): the model's ``generation_config.json`` defaults, the user's values over
them, the checks, what reaches vLLM's ``SamplingParams``, and greedy as the engine's default."""

import itertools
import json
import threading
from types import SimpleNamespace

import pytest

from locks_engine.engine import LocksEngine
from locks_engine.sampling import GREEDY, Sampling, model_sampling

#: Qwen2.5-Instruct's generation_config.json (sampling keys as the hub's file gives them)
QWEN = {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
        "repetition_penalty": 1.1, "temperature": 0.7, "top_k": 20, "top_p": 0.8}
#: what ``save_pretrained`` writes for a model without sampling settings (the built-in model's converted directory)
NO_SAMPLING = {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


def model_dir(tmp_path, config) -> str:
    (tmp_path / "config.json").write_text("{}")
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (tmp_path / "generation_config.json").write_text(text)
    return str(tmp_path)


@pytest.mark.parametrize("config, expected", [
    (QWEN, Sampling(0.7, 0.8, 20, 1.1, source="model")),
    (NO_SAMPLING, GREEDY),
    (None, GREEDY),
    ("{not json", GREEDY),
    ([1, 2], GREEDY),
    ({**QWEN, "do_sample": False}, Sampling(repetition_penalty=1.1, top_p=0.8, top_k=20, source="model")),
    ({"temperature": 0.6, "top_p": 0.9}, Sampling(0.6, 0.9, source="model")),
    ({"temperature": "warm", "top_p": 0, "top_k": 1.5, "repetition_penalty": 1.05}, Sampling(repetition_penalty=1.05,
                                                                                             source="model")),
], ids=["qwen", "no-sampling-keys", "no-file", "not-json", "not-an-object", "do-sample-false", "no-do-sample",
        "bad-values-left-out"])
def test_generation_config_defaults(tmp_path, config, expected):
    assert Sampling.from_generation_config(model_dir(tmp_path, config)) == expected
    assert model_sampling(model_dir(tmp_path, config)) == expected


def test_a_hub_id_reads_the_local_cache_only(tmp_path, monkeypatch):
    import huggingface_hub.constants

    snapshot = tmp_path / "models--org--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "generation_config.json").write_text(json.dumps(QWEN))
    (tmp_path / "models--org--cached" / "refs").mkdir()
    (tmp_path / "models--org--cached" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert model_sampling("org/cached").source == "model"
    assert model_sampling("org/never-downloaded") == GREEDY
    assert model_sampling(None) == GREEDY


@pytest.mark.parametrize("overrides, expected", [
    ({"temperature": 0.2}, Sampling(0.2, 0.8, 20, 1.1, source="user")),
    ({"temperature": 0}, Sampling(0, 0.8, 20, 1.1, source="user")),
    ({"seed": 7}, Sampling(0.7, 0.8, 20, 1.1, seed=7, source="model")),
    ({"top_p": None, "repetition_penalty": 1.0}, Sampling(0.7, 0.8, 20, 1.0, source="user")),
    ({}, Sampling(0.7, 0.8, 20, 1.1, source="model")),
], ids=["temperature", "greedy", "seed-only", "penalty-off", "nothing"])
def test_the_users_values_win(overrides, expected):
    model = Sampling(0.7, 0.8, 20, 1.1, source="model")
    assert model.merged(**overrides) == expected


def test_greedy_is_the_temperature_zero():
    assert GREEDY.greedy and GREEDY.merged(temperature=0).greedy and not GREEDY.merged(temperature=0.1).greedy


@pytest.mark.parametrize("field, value", [
    ("temperature", -0.1), ("temperature", 2.5), ("temperature", float("nan")), ("top_p", 0.0), ("top_p", 1.5),
    ("top_k", -1), ("top_k", 2.0), ("repetition_penalty", 0.0), ("seed", -1), ("seed", True), ("source", "mine"),
])
def test_values_outside_the_ranges_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=rf"Sampling\.{field} = .* is not allowed \("):
        Sampling(**{field: value})


def test_an_unknown_override_is_refused():
    with pytest.raises(ValueError, match="unknown setting"):
        GREEDY.merged(temprature=0.5)
    with pytest.raises(ValueError, match="source"):
        GREEDY.merged(source="user")


def test_vllm_takes_the_params():
    vllm = pytest.importorskip("vllm")
    sampled = vllm.SamplingParams(max_tokens=4, **Sampling(0.7, 0.8, 20, 1.1, seed=3).to_params())
    assert (sampled.temperature, sampled.top_p, sampled.top_k, sampled.repetition_penalty, sampled.seed) == (
        0.7, 0.8, 20, 1.1, 3)
    greedy = vllm.SamplingParams(max_tokens=4, **GREEDY.to_params())
    assert greedy.temperature == 0.0 and greedy.seed is None and greedy.repetition_penalty == 1.0


class RecordingLLM:
    """``LLMEngine``'s request surface: one request that finishes at its first step; its params are kept."""

    def add_request(self, rid, prompt, params):
        self.rid, self.params = rid, params

    def step(self):
        completion = SimpleNamespace(text="x", token_ids=[1], finish_reason="stop")
        return [SimpleNamespace(request_id=self.rid, outputs=[completion], finished=True)]

    def has_unfinished_requests(self):
        return False


def recording_engine() -> tuple[LocksEngine, RecordingLLM]:
    pytest.importorskip("vllm", reason="LocksEngine.stream builds vLLM's SamplingParams")
    llm = RecordingLLM()
    engine = object.__new__(LocksEngine)
    engine.llm, engine._lock, engine._ids, engine._seen = llm, threading.Lock(), itertools.count(), 0
    engine.ring, engine.on_cuda, engine.dense_baseline = None, False, False
    return engine, llm


def test_the_engine_is_greedy_unless_given_sampling():
    engine, llm = recording_engine()
    list(engine.stream([1, 2, 3], 4))
    assert llm.params.temperature == 0.0 and llm.params.seed is None
    list(engine.stream([1, 2, 3], 4, sampling=Sampling(0.7, 0.8, 20, 1.1, seed=5, source="model")))
    assert (llm.params.temperature, llm.params.top_p, llm.params.top_k, llm.params.seed) == (0.7, 0.8, 20, 5)
    assert llm.params.repetition_penalty == 1.1 and llm.params.max_tokens == 4
