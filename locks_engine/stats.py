"""Per-step LOCKS statistics carried out of the vLLM engine through memory-mapped ring files.

vLLM runs attention in worker processes (CPU: ``MainProcess -> EngineCore -> Worker``), so the numbers the app
shows (pages read per sequence, bytes read vs dense) must cross two process boundaries. The backend appends one
record per forward step to a fixed-size ring file; any process maps the same file read-only and polls it. No
locks, no sockets, no vLLM API: a seqlock per record (``seq`` is zeroed while a record is written and set to its
1-based sequence number last) lets a reader drop a record torn by a concurrent write.

The path travels in vLLM's own configuration: ``additional_config={"locks": cfg.to_dict(),
"locks_stats_path": "/some/dir/stats.bin"}``; without ``locks_stats_path`` nothing is written. The engine
creates the file afresh at start (written to a temporary name, then renamed), so a reader of an older engine's
file sees a new inode and reopens it.

Tensor parallelism: each rank holds its own KV heads and writes its own ring, ``rank_path(path, r)`` (``path``
itself for rank 0, ``path.rank1``, ``path.rank2``, ... for the others), with the rank, the world size and a run id
in the header. :class:`StatsReader` (what ``require_locks`` returns) reads them as one ring of merged records;
a rank file of another run (a stale file of an earlier engine) is refused, and ranks at or past rank 0's world
size are never opened. With one rank the merged records are rank 0's records.

File layout (little endian): a 128-byte header (``HEADER``), then ``capacity`` records (``record_dtype``).
Units: pages are KV pages of ``page_size`` tokens, counted once per layer and KV head (a page read by 30 layers
and 3 KV heads counts 90); bytes are K+V bytes plus the summary bytes scanned. ``row_tail_mass`` (a tail
estimate, ``LocksConfig.tail``) is the share, 0-1, of a row's estimated attention mass that the pages not read
carried (``ops.tail.tail_mass_share``), summed over layers and KV heads like the pages: divided by
``num_layers * num_kv_heads`` it is the mean share; 0 without a tail estimate. This module imports numpy only.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"LOCKSST1"
VERSION = 3
HEADER_BYTES = 128
#: Decode rows recorded per step (further rows are counted in the totals only).
MAX_ROWS = 8
#: Histogram bins per row: pages are grouped ``pages_per_bin`` to a bin beyond this many pages.
MAX_BINS = 4096

HEADER = np.dtype(
    [
        ("magic", "S8"),
        ("version", "<u4"),
        ("capacity", "<u4"),
        ("max_rows", "<u4"),
        ("hist_bins", "<u4"),
        ("pages_per_bin", "<u4"),
        ("page_size", "<u4"),
        ("layers_total", "<u4"),  # attention layers in the model
        ("layers_locks", "<u4"),  # of which run the LOCKS backend (startup check)
        ("pid", "<u4"),
        ("rank", "<u4"),  # tensor-parallel rank of the writer
        ("written", "<u8"),  # records written so far
        ("world_size", "<u4"),  # tensor-parallel ranks, each writing its own ring
        ("num_kv_heads", "<u4"),  # KV heads of this rank (0: not recorded)
        ("run_id", "<u8"),  # the same in every rank's ring of one engine run (``run_id``)
    ]
)
assert HEADER.itemsize <= HEADER_BYTES
#: Header fields every rank's ring of one run has in common.
SHARED_FIELDS = ("world_size", "run_id", "capacity", "max_rows", "hist_bins", "pages_per_bin", "page_size")


def record_dtype(max_rows: int, hist_bins: int) -> np.dtype:
    """One step's record. ``row_*`` fields hold the first ``max_rows`` decode rows of the batch."""
    return np.dtype(
        [
            ("seq", "<u8"),  # 1-based record number; 0 while being written
            ("time_ns", "<u8"),  # time.time_ns() when the step's last layer finished
            ("step", "<u8"),  # forward steps of this engine, prefill-only steps included
            ("num_decodes", "<u4"),  # decode rows in the step
            ("num_prefill_tokens", "<u4"),  # tokens of prefill rows (attended densely)
            ("num_layers", "<u4"),  # layers that reported in this step
            ("num_kv_heads", "<u4"),
            ("pages_read", "<u8"),  # KV pages read by decode rows, summed over layers and KV heads
            ("pages_total", "<u8"),  # pages a dense decode would have read, same units
            ("summaries_read", "<u8"),  # page summaries scanned, same units
            ("bytes_read", "<u8"),  # K+V bytes of pages read plus summary bytes scanned
            ("bytes_dense", "<u8"),  # K+V bytes a dense decode would have read
            ("row_seq_len", "<u4", (max_rows,)),  # tokens in each decode row's sequence
            ("row_pages_read", "<u4", (max_rows,)),  # as pages_read, per row
            ("row_pages_total", "<u4", (max_rows,)),
            ("row_hist", "<u2", (max_rows, hist_bins)),  # per page bin: (layer, KV head) pairs that read it
            ("row_tail_mass", "<f4", (max_rows,)),  # share of the estimated mass in the tail, summed over (layer, KV head)
        ]
    )


def dense_step_record(seq_len: int, num_layers: int, num_kv_heads: int, page_size: int, page_bytes: int,
                      max_pages: int) -> dict[str, Any]:
    """The record of one decode step of one sequence that reads every page (vLLM's own dense backend, which
    writes no ring), in the units of ``record_dtype`` plus the ring's ``pages_per_bin`` and ``page_size``.

    Args:
        seq_len (int): tokens the step attends to. num_layers (int), num_kv_heads (int): L and H.
        page_size (int): B. page_bytes (int): K+V bytes of one page of one KV head. max_pages (int): the
            context in pages (the histogram's extent, binned as ``StatsRing.create`` bins it).
    """
    pages_per_bin = max(1, -(-max_pages // MAX_BINS))
    bins = max(1, -(-max_pages // pages_per_bin))
    pages, pairs = -(-seq_len // page_size), num_layers * num_kv_heads
    row = np.zeros(MAX_ROWS, dtype=np.int64)
    hist = np.zeros((MAX_ROWS, bins), dtype=np.int64)
    hist[0] = np.bincount(np.arange(pages) // pages_per_bin, minlength=bins)[:bins] * pairs
    return {
        "step": 0, "num_decodes": 1, "num_prefill_tokens": 0, "num_layers": num_layers,
        "num_kv_heads": num_kv_heads, "pages_read": pages * pairs, "pages_total": pages * pairs,
        "summaries_read": 0, "bytes_read": pages * pairs * page_bytes, "bytes_dense": pages * pairs * page_bytes,
        "row_seq_len": np.where(np.arange(MAX_ROWS) == 0, seq_len, row),
        "row_pages_read": np.where(np.arange(MAX_ROWS) == 0, pages * pairs, row),
        "row_pages_total": np.where(np.arange(MAX_ROWS) == 0, pages * pairs, row),
        "row_hist": hist.clip(0, 65535), "pages_per_bin": pages_per_bin, "page_size": page_size,
    }


def rank_path(path: str | Path, rank: int) -> Path:
    """The ring file of tensor-parallel rank ``rank``: ``path`` for rank 0, ``path.rank<r>`` for the others."""
    path = Path(path)
    return path if rank == 0 else path.with_name(f"{path.name}.rank{rank}")


def run_id(text: str) -> int:
    """A 64-bit id of one engine run from a string every rank shares (vLLM's ``instance_id``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class StatsRing:
    """A ring of step records in a memory-mapped file; one writer (an engine rank), any number of readers.

    Args:
        path (str | Path): the ring file.
        writable (bool): open for writing (the engine's side); readers leave it False.

    Raises:
        FileNotFoundError: no such file; ValueError: the file is not a LOCKS stats ring of this version.
    """

    def __init__(self, path: str | Path, writable: bool = False) -> None:
        self.path = Path(path)
        mode = "r+" if writable else "r"
        self._inode = os.stat(self.path).st_ino
        if self.path.stat().st_size < HEADER_BYTES:
            raise ValueError(f"{self.path} is not a LOCKS stats file of version {VERSION}")
        self._map = np.memmap(self.path, dtype=np.uint8, mode=mode)
        self.header = np.ndarray((), dtype=HEADER, buffer=self._map, offset=0)
        if bytes(self.header["magic"]) != MAGIC or int(self.header["version"]) != VERSION:
            raise ValueError(f"{self.path} is not a LOCKS stats file of version {VERSION}")
        self.capacity = int(self.header["capacity"])
        self.dtype = record_dtype(int(self.header["max_rows"]), int(self.header["hist_bins"]))
        self.records = np.ndarray((self.capacity,), dtype=self.dtype, buffer=self._map, offset=HEADER_BYTES)

    @classmethod
    def create(
        cls, path: str | Path, *, max_pages: int, page_size: int, capacity: int = 256, max_rows: int = MAX_ROWS,
        rank: int = 0, world_size: int = 1, run: int = 0, num_kv_heads: int = 0,
    ) -> "StatsRing":
        """Create (atomically replace) rank ``rank``'s ring file sized for sequences of up to ``max_pages`` pages.

        Args:
            path (str | Path): the configured stats path; the file is ``rank_path(path, rank)``.
            max_pages (int): longest sequence in KV pages. page_size (int): tokens per KV page.
            capacity (int): records kept. max_rows (int): decode rows recorded per step.
            rank (int), world_size (int): this writer's tensor-parallel rank and the number of ranks.
            run (int): the engine run (``run_id``), the same in every rank.
            num_kv_heads (int): KV heads this rank holds.
        """
        path = rank_path(path, rank)
        pages_per_bin = max(1, -(-max_pages // MAX_BINS))
        hist_bins = max(1, -(-max_pages // pages_per_bin))
        size = HEADER_BYTES + capacity * record_dtype(max_rows, hist_bins).itemsize
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        header = np.zeros((), dtype=HEADER)
        header["magic"], header["version"], header["capacity"] = MAGIC, VERSION, capacity
        header["max_rows"], header["hist_bins"], header["pages_per_bin"] = max_rows, hist_bins, pages_per_bin
        header["page_size"], header["pid"] = page_size, os.getpid()
        header["rank"], header["world_size"], header["run_id"] = rank, world_size, run
        header["num_kv_heads"] = num_kv_heads
        with open(tmp, "wb") as f:
            f.write(header.tobytes().ljust(HEADER_BYTES, b"\0"))
            f.truncate(size)
        os.replace(tmp, path)
        return cls(path, writable=True)

    def set_layers(self, total: int, locks: int) -> None:
        """Record how many attention layers the model has and how many run LOCKS (read by ``require_locks``)."""
        self.header["layers_total"], self.header["layers_locks"] = total, locks

    def append(self, values: dict[str, Any]) -> None:
        """Write one record (fields of ``record_dtype``; missing ones are zero) and publish it."""
        written = int(self.header["written"])
        rec = self.records[written % self.capacity]
        rec["seq"] = 0
        for name in self.dtype.names:
            if name != "seq":
                rec[name] = values.get(name, 0)
        rec["seq"] = written + 1
        self.header["written"] = written + 1

    def written(self) -> int:
        """Records written so far."""
        return int(self.header["written"])

    def record(self, number: int) -> dict[str, Any] | None:
        """Record ``number`` (1-based) as a dict of Python ints and numpy arrays; None when it is being written
        or has been overwritten."""
        rec = self.records[(number - 1) % self.capacity].copy()
        if int(rec["seq"]) != number or int(self.records[(number - 1) % self.capacity]["seq"]) != number:
            return None
        return {name: rec[name].item() if rec[name].ndim == 0 else rec[name] for name in self.dtype.names}

    def latest(self, count: int = 1) -> list[dict[str, Any]]:
        """The newest ``count`` complete records, oldest first, as dicts of Python ints and numpy arrays."""
        written = self.written()
        records = (self.record(number) for number in range(max(1, written - count + 1), written + 1))
        return [rec for rec in records if rec is not None]

    def replaced(self) -> bool:
        """Whether the file at ``path`` is now another file (a new engine started): reopen then."""
        try:
            return os.stat(self.path).st_ino != self._inode
        except FileNotFoundError:
            return True


class RankStatsError(ValueError):
    """A tensor-parallel rank other than 0 has no ring file of this run (not written yet, or a stale file)."""


#: Record fields that add up over tensor-parallel ranks (each rank counts its own KV heads).
SUMMED = (
    "num_kv_heads", "pages_read", "pages_total", "summaries_read", "bytes_read", "bytes_dense",
    "row_pages_read", "row_pages_total", "row_hist", "row_tail_mass",
)


def merge_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One step's records of every tensor-parallel rank as one record over all KV heads of all ranks.

    The ``SUMMED`` counters add up (arrays are clamped to their dtype's maximum, as the writer clamps the
    histogram), so a histogram bin over ``num_layers * num_kv_heads`` stays the share of all (layer, KV head)
    pairs that read it; ``time_ns`` is the last rank's; the rest (step, rows, sequence lengths, layers) is the
    same in every rank and taken from rank 0. One record comes back unchanged. With more ranks than KV heads
    vLLM replicates KV heads; each replica counts, as each rank reads its own.
    """
    if len(records) == 1:
        return records[0]
    out = dict(records[0])
    out["time_ns"] = max(int(r["time_ns"]) for r in records)
    for name in SUMMED:
        first = records[0][name]
        if isinstance(first, np.ndarray) and first.dtype.kind == "f":
            out[name] = np.sum([r[name] for r in records], axis=0).astype(first.dtype)
        elif isinstance(first, np.ndarray):
            total = np.sum([r[name].astype(np.int64) for r in records], axis=0)
            out[name] = np.minimum(total, np.iinfo(first.dtype).max).astype(first.dtype)
        else:
            out[name] = sum(int(r[name]) for r in records)
    return out


class StatsReader:
    """The rings of all tensor-parallel ranks of one engine, read as one ring of merged step records.

    Ranks write in lockstep (one record per forward step each), so record ``n`` of every ring is the same step;
    a step is returned once every rank has published it.

    Args:
        path (str | Path): the configured ``locks_stats_path`` (rank 0's file, whose header names the world size).

    Raises:
        FileNotFoundError: no file at ``path``; ValueError: it is not a LOCKS stats ring of this version.
        RankStatsError: another rank's file is missing or belongs to another run (a stale file of an earlier
            engine whose rank has not replaced it yet).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        first = StatsRing(self.path)
        self.rings = [first]
        world = max(1, int(first.header["world_size"]))
        for rank in range(1, world):
            try:
                ring = StatsRing(rank_path(self.path, rank))
            except (FileNotFoundError, ValueError) as err:
                raise RankStatsError(f"rank {rank} of {world} has no statistics file: {err}") from None
            other = [name for name in SHARED_FIELDS if int(ring.header[name]) != int(first.header[name])]
            if other or int(ring.header["rank"]) != rank:
                raise RankStatsError(f"{ring.path} is from another engine run than {self.path}")
            self.rings.append(ring)
        self.header = first.header
        """Rank 0's header (shape of the records, layers); use ``written()``, not its ``written``."""
        self.capacity = first.capacity
        self.world_size = world

    def written(self) -> int:
        """Steps every rank has written."""
        return min(ring.written() for ring in self.rings)

    def num_kv_heads(self) -> int:
        """KV heads over all ranks (0 when the writers did not record them)."""
        return sum(int(ring.header["num_kv_heads"]) for ring in self.rings)

    def latest(self, count: int = 1) -> list[dict[str, Any]]:
        """The newest ``count`` steps that every rank has published whole, oldest first, merged
        (``merge_records``); with one rank, exactly ``StatsRing.latest``."""
        written = self.written()
        out = []
        for number in range(max(1, written - count + 1), written + 1):
            parts = [ring.record(number) for ring in self.rings]
            if all(p is not None for p in parts) and len({p["step"] for p in parts}) == 1:
                out.append(merge_records(parts))
        return out

    def replaced(self) -> bool:
        """Whether some rank's file is now another file (a new engine started): reopen then."""
        return any(ring.replaced() for ring in self.rings)


def require_locks(path: str | Path, timeout_s: float = 0.0) -> StatsReader:
    """Fail loudly unless the engine that owns ``path`` runs LOCKS on every attention layer of every rank.

    Args:
        path (str | Path): the ``locks_stats_path`` given to the engine.
        timeout_s (float): how long to wait for every rank to write its header (seconds).

    Returns:
        StatsReader: all ranks' rings, open.

    Raises:
        RuntimeError: no stats file (the LOCKS backend never started: the plugin was not loaded, or vLLM chose
            another backend), a tensor-parallel rank wrote none for this run, or some attention layers run
            another backend.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        reader, missing = None, None
        try:
            reader = StatsReader(path)
            if all(int(ring.header["layers_total"]) > 0 for ring in reader.rings):
                break
        except RankStatsError as err:
            missing = err
        except (FileNotFoundError, ValueError):
            pass
        if time.monotonic() >= deadline:
            if missing is not None:
                raise RuntimeError(f"the LOCKS backend did not start on every tensor-parallel rank: {missing}")
            raise RuntimeError(
                f"the LOCKS backend did not start (no stats in {path}): is the vllm.general_plugins entry point of "
                "locks-chat installed, and LOCKS_OVERRIDE_CPU_ATTN not 0?"
            )
        time.sleep(0.1)
    for rank, ring in enumerate(reader.rings):
        total, locks = int(ring.header["layers_total"]), int(ring.header["layers_locks"])
        if locks != total:
            where = f" on tensor-parallel rank {rank}" if rank else ""
            raise RuntimeError(f"only {locks} of {total} attention layers run the LOCKS backend{where}")
    return reader
