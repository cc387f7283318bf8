"""LOCKS' keys of vLLM's ``additional_config``: checked before vLLM builds its configuration, each wrong one named
in one line (``vllm serve``: logged, exit status 1; ``LLM``/``LLMEngine``: a ``ValueError``)."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")

from vllm import EngineArgs  # noqa: E402
from vllm.usage.usage_lib import UsageContext  # noqa: E402

from locks_engine.config import LocksConfig  # noqa: E402
from locks_engine.vllm_backend import plugin  # noqa: E402
from locks_engine.vllm_backend.config_keys import check_settings  # noqa: E402

GOOD = {
    "empty": {},
    "defaults": {"locks": LocksConfig().to_dict()},
    "some_settings": {"locks": {"budget": 512, "summary_format": "float"}, "locks_stats_path": "run/stats.bin"},
    "hooks": {"locks_hooks": ["package.module:Hook"]},
    "two_level": {"locks": {"selection": "two-level", "candidates": [4, 0, 8]}},
    "oracle": {"locks": {"selection": "oracle", "budget": 2048}},
    "vllm_keys_left_alone": {"gdn_prefill_backend": "auto", "anything": [1, 2]},
}

BAD = {
    "unknown_setting": ({"locks": {"bugdet": 512}}, r'^additional_config\["locks"\]: .*\'bugdet\'.*allowed .*budget'),
    "bad_value": ({"locks": {"budget": 0}}, r'^additional_config\["locks"\]: LocksConfig\.budget=0: .*>= 1'),
    "float_rank": ({"locks": {"rank": 4.0}}, r'^additional_config\["locks"\]: LocksConfig\.rank=4\.0'),
    "dense_string": ({"locks": {"dense": "true"}}, r"LocksConfig\.dense='true': allowed True or False"),
    "format": ({"locks": {"summary_format": "int2"}}, r"summary_format='int2': allowed float, paper"),
    "selection": ({"locks": {"selection": "tree"}}, r"selection='tree': allowed flat, two-level, oracle"),
    "candidates": ({"locks": {"selection": "two-level", "candidates": [4, -1]}},
                   r"LocksConfig\.candidates=\(4, -1\): allowed \"auto\" or a non-empty list of integers >= 0"),
    "not_an_object": ({"locks": 512}, r'^additional_config\["locks"\]=512: allowed a JSON object .*budget'),
    "misspelt_key": ({"locks_stat_path": "s.bin"}, r'^additional_config\["locks_stat_path"\]: unknown LOCKS key'),
    "stats_path_type": ({"locks_stats_path": 3}, r'^additional_config\["locks_stats_path"\]=3: allowed a file path'),
    "hooks_type": ({"locks_hooks": "m:Hook"}, r'^additional_config\["locks_hooks"\]=\'m:Hook\': allowed a list'),
}


@pytest.mark.parametrize("extra", GOOD.values(), ids=GOOD.keys())
def test_good_settings_pass(extra):
    check_settings(extra)


@pytest.mark.parametrize("extra,message", BAD.values(), ids=BAD.keys())
def test_each_wrong_setting_is_named_in_one_line(extra, message):
    with pytest.raises(ValueError, match=message) as err:
        check_settings(extra)
    assert "\n" not in str(err.value)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def vllm_errors():
    """ERROR lines of vLLM's logger (which does not propagate to the root logger)."""
    handler = Lines()
    logger = logging.getLogger("vllm")
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


def test_python_users_get_the_error_before_anything_is_built(vllm_errors):
    plugin.check_settings_first()
    plugin.check_settings_first()
    args = EngineArgs(model="unused", additional_config={"locks": {"budget": 0}})
    for usage in (UsageContext.LLM_CLASS, UsageContext.ENGINE_CONTEXT):
        with pytest.raises(ValueError, match=r"LocksConfig\.budget=0"):
            args.create_engine_config(usage)
    assert vllm_errors == []


def test_the_server_logs_one_line_and_exits_with_1(vllm_errors):
    plugin.check_settings_first()
    args = EngineArgs(model="unused", additional_config={"locks": {"rank": 99}})
    with pytest.raises(SystemExit) as exit_:
        args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    assert exit_.value.code == 1
    assert vllm_errors == [f'LOCKS: additional_config["locks"]: {LocksConfig.__name__}.rank=99 is larger than '
                           "page_size=16: allowed 1..16 (a page of B keys has at most B directions)"]


def test_good_settings_reach_vllm(model_dir):
    plugin.check_settings_first()
    extra = {"locks": {"budget": 256}, "other": 1}
    config = EngineArgs(model=model_dir, max_model_len=512, additional_config=extra).create_engine_config(
        usage_context=UsageContext.OPENAI_API_SERVER
    )
    assert config.additional_config == extra
