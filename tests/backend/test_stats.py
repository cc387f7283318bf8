"""``locks_engine.stats``: the ring file that carries per-step LOCKS statistics out of the engine."""

from __future__ import annotations

import numpy as np
import pytest

from locks_engine.stats import MAX_BINS, StatsReader, StatsRing, rank_path, require_locks


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


def rank_rings(path, world: int, run: int = 7, heads: int = 2) -> list[StatsRing]:
    """One ring per simulated tensor-parallel rank, ``heads`` KV heads each, as the engine's ranks create them."""
    rings = []
    for rank in range(world):
        ring = StatsRing.create(
            path, max_pages=64, page_size=16, capacity=4, rank=rank, world_size=world, run=run, num_kv_heads=heads
        )
        ring.set_layers(30, 30)
        rings.append(ring)
    return rings


def rank_record(step: int, rank: int, read_pages: list[int]) -> dict:
    """A decode step of one row of 100 tokens (7 pages) on one layer and two KV heads of one rank."""
    hist = np.zeros((8, 64), np.uint16)
    hist[0, read_pages] = 2
    return {
        "step": step, "time_ns": 1000 * step + rank, "num_decodes": 1, "num_layers": 1, "num_kv_heads": 2,
        "pages_read": 2 * len(read_pages), "pages_total": 14, "summaries_read": 12,
        "bytes_read": 4096 * 2 * len(read_pages) + 400 * 12, "bytes_dense": 4096 * 14,
        "row_seq_len": [100] + [0] * 7, "row_pages_read": [2 * len(read_pages)] + [0] * 7,
        "row_pages_total": [14] + [0] * 7, "row_hist": hist,
    }


def test_rank_files_are_named_after_the_configured_path(tmp_path):
    assert rank_path(tmp_path / "s.bin", 0) == tmp_path / "s.bin"
    assert rank_path(tmp_path / "s.bin", 3) == tmp_path / "s.bin.rank3"
    rank_rings(tmp_path / "s.bin", 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.bin", "s.bin.rank1"]


def test_two_ranks_merge_into_one_record_per_step(tmp_path):
    rank0, rank1 = rank_rings(tmp_path / "s.bin", 2)
    rank0.append(rank_record(1, 0, [0, 6]))
    rank1.append(rank_record(1, 1, [0, 3]))
    rank0.append(rank_record(2, 0, [0, 6]))  # rank 1 has not finished step 2 yet
    reader = StatsReader(tmp_path / "s.bin")
    assert reader.world_size == 2 and reader.num_kv_heads() == 4 and reader.written() == 1
    (got,) = reader.latest(5)
    assert got["step"] == 1 and got["time_ns"] == 1001
    assert got["num_kv_heads"] == 4 and got["num_layers"] == 1 and got["num_decodes"] == 1
    assert got["pages_read"] == 8 and got["pages_total"] == 28 and got["summaries_read"] == 24
    assert got["bytes_read"] == 4096 * 8 + 400 * 24 and got["bytes_dense"] == 4096 * 28
    assert got["row_seq_len"][0] == 100 and got["row_pages_read"][0] == 8 and got["row_pages_total"][0] == 28
    # page 0 read by all 4 KV heads, pages 3 and 6 by the 2 heads of one rank: shares 1, 1/2, 1/2
    shares = got["row_hist"][0, :7] / (got["num_layers"] * got["num_kv_heads"])
    assert shares.tolist() == [1.0, 0, 0, 0.5, 0, 0, 0.5]
    assert got["row_hist"].dtype == np.uint16
    rank1.append(rank_record(2, 1, [1]))
    assert [r["step"] for r in reader.latest(5)] == [1, 2] and reader.latest()[0]["pages_read"] == 6


def test_one_rank_reads_as_before(tmp_path):
    (ring,) = rank_rings(tmp_path / "s.bin", 1)
    for step in range(1, 7):
        ring.append(rank_record(step, 0, [step % 7]))
    plain, merged = StatsRing(tmp_path / "s.bin").latest(10), StatsReader(tmp_path / "s.bin").latest(10)
    assert [r["step"] for r in merged] == [3, 4, 5, 6]
    for a, b in zip(plain, merged, strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert not (tmp_path / "s.bin.rank1").exists()


def test_stale_rank_files_are_not_merged(tmp_path):
    rank_rings(tmp_path / "s.bin", 4, run=1)  # an earlier engine with 4 ranks
    rank0, _ = rank_rings(tmp_path / "s.bin", 2, run=2)
    rank0.append(rank_record(1, 0, [0]))
    assert StatsReader(tmp_path / "s.bin").world_size == 2  # rank 2 and 3 files of run 1 are never opened
    StatsRing.create(tmp_path / "s.bin", max_pages=64, page_size=16, capacity=4, world_size=2, run=3)
    with pytest.raises(ValueError, match="from another engine run"):
        StatsReader(tmp_path / "s.bin")  # a new run's rank 0 beside the old run's rank 1
    with pytest.raises(RuntimeError, match="did not start on every tensor-parallel rank.*rank1"):
        require_locks(tmp_path / "s.bin")


def test_require_locks_waits_for_every_rank(tmp_path):
    rank_rings(tmp_path / "s.bin", 2)
    (tmp_path / "s.bin.rank1").unlink()
    with pytest.raises(RuntimeError, match="rank 1 of 2 has no statistics file"):
        require_locks(tmp_path / "s.bin", timeout_s=0.2)
    rank_rings(tmp_path / "s.bin", 2)[1].set_layers(30, 28)
    with pytest.raises(RuntimeError, match="only 28 of 30 attention layers run the LOCKS backend on tensor-parallel"):
        require_locks(tmp_path / "s.bin")
