"""``locks_engine.stats``: the ring file that carries per-step LOCKS statistics out of the engine."""

from __future__ import annotations

import numpy as np
import pytest

from locks_engine.stats import MAX_BINS, StatsRing, require_locks


def test_records_come_back_newest_last_across_wraparound(tmp_path):
    ring = StatsRing.create(tmp_path / "s.bin", max_pages=100, page_size=16, capacity=4)
    for step in range(1, 7):
        ring.append({"step": step, "pages_read": 10 * step, "row_seq_len": [step] + [0] * 7})
    reader = StatsRing(tmp_path / "s.bin")
    got = reader.latest(10)
    assert [r["step"] for r in got] == [3, 4, 5, 6]
    assert got[-1]["pages_read"] == 60 and got[-1]["row_seq_len"][0] == 6
    assert reader.latest()[0]["seq"] == 6


def test_torn_record_is_dropped(tmp_path):
    ring = StatsRing.create(tmp_path / "s.bin", max_pages=10, page_size=16, capacity=4)
    ring.append({"step": 1})
    ring.append({"step": 2})
    ring.records[1]["seq"] = 0  # a writer is in the middle of record 2
    assert [r["step"] for r in StatsRing(tmp_path / "s.bin").latest(2)] == [1]


def test_histogram_bins_group_pages_past_the_limit(tmp_path):
    ring = StatsRing.create(tmp_path / "s.bin", max_pages=3 * MAX_BINS, page_size=16)
    assert int(ring.header["pages_per_bin"]) == 3 and int(ring.header["hist_bins"]) == MAX_BINS
    ring = StatsRing.create(tmp_path / "t.bin", max_pages=512, page_size=16)
    assert int(ring.header["pages_per_bin"]) == 1 and ring.records.dtype["row_hist"].shape == (8, 512)


def test_new_engine_file_is_noticed(tmp_path):
    StatsRing.create(tmp_path / "s.bin", max_pages=10, page_size=16)
    reader = StatsRing(tmp_path / "s.bin")
    assert not reader.replaced()
    StatsRing.create(tmp_path / "s.bin", max_pages=10, page_size=16)
    assert reader.replaced()


def test_require_locks(tmp_path):
    with pytest.raises(RuntimeError, match="did not start"):
        require_locks(tmp_path / "none.bin")
    ring = StatsRing.create(tmp_path / "s.bin", max_pages=10, page_size=16)
    ring.set_layers(30, 29)
    with pytest.raises(RuntimeError, match="only 29 of 30 attention layers"):
        require_locks(tmp_path / "s.bin")
    ring.set_layers(30, 30)
    assert int(require_locks(tmp_path / "s.bin").header["layers_total"]) == 30


def test_not_a_stats_file(tmp_path):
    (tmp_path / "x.bin").write_bytes(np.zeros(128, np.uint8).tobytes())
    with pytest.raises(ValueError, match="not a LOCKS stats file"):
        StatsRing(tmp_path / "x.bin")
