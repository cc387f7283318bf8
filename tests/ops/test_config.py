"""LocksConfig validation: every bad value names the field, the value and what is allowed."""

import dataclasses

import pytest

from locks_engine import LocksConfig


def test_defaults_follow_the_paper():
    cfg = LocksConfig()
    assert (cfg.page_size, cfg.rank, cfg.budget) == (16, 8, 2048)
    assert cfg.budget_pages == 128 and cfg.quantized and not cfg.dense
    assert cfg.summary_format == "colwise8"


@pytest.mark.parametrize("fmt", ["float", "paper", "colwise", "chanlog", "colwise8"])
def test_every_summary_format_is_accepted(fmt):
    assert LocksConfig(summary_format=fmt).summary_format == fmt
    assert LocksConfig.from_dict({"summary_format": fmt}).quantized == (fmt != "float")


BAD = {
    "zero_page_size": ({"page_size": 0}, r"page_size=0.*integer >= 1"),
    "rank_over_page": ({"rank": 17}, r"rank=17.*1\.\.16"),
    "float_rank": ({"rank": 2.5}, r"rank=2\.5"),
    "bool_budget": ({"budget": True}, r"budget=True"),
    "negative_sink": ({"sink_pages": -1}, r"sink_pages=-1.*>= 0"),
    "format": ({"summary_format": "int2"}, r"summary_format='int2'.*float, paper, colwise, chanlog, colwise8"),
    "dense_str": ({"dense": "yes"}, r"dense='yes'"),
    "budget_below_forced": ({"budget": 32}, r"budget=32.*allowed budget >= 48"),
    # past any context: the backend's int32 superpage counts overflowed inside a running engine (vllm serve too)
    "budget_past_any_context": ({"budget": 10**23}, r"budget=100000000000000000000000: allowed an integer <= 16777216"),
}


@pytest.mark.parametrize("kwargs,message", BAD.values(), ids=BAD.keys())
def test_bad_values_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LocksConfig(**kwargs)


def test_frozen_and_round_trips_through_a_dict():
    cfg = LocksConfig(budget=512, rank=4, summary_format="paper")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.budget = 1  # type: ignore[misc]
    assert LocksConfig.from_dict(cfg.to_dict()) == cfg


def test_unknown_key_is_named():
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['bugdet'\]"):
        LocksConfig.from_dict({"bugdet": 10})
