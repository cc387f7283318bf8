"""Per-step LOCKS statistics carried out of the vLLM engine through a memory-mapped ring file.

vLLM runs attention in a worker process (CPU: ``MainProcess -> EngineCore -> Worker``), so the numbers the app
shows (pages read per sequence, bytes read vs dense) must cross two process boundaries. The backend appends one
record per forward step to a fixed-size ring file; any process maps the same file read-only and polls it. No
locks, no sockets, no vLLM API: a seqlock per record (``seq`` is zeroed while a record is written and set to its
1-based sequence number last) lets a reader drop a record torn by a concurrent write.

The path travels in vLLM's own configuration: ``additional_config={"locks": cfg.to_dict(),
"locks_stats_path": "/some/dir/stats.bin"}``; without ``locks_stats_path`` nothing is written. The engine
creates the file afresh at start (written to a temporary name, then renamed), so a reader of an older engine's
file sees a new inode and reopens it.

File layout (little endian): a 64-byte header (``HEADER``), then ``capacity`` records (``record_dtype``).
Units: pages are KV pages of ``page_size`` tokens, counted once per layer and KV head (a page read by 30 layers
and 3 KV heads counts 90); bytes are K+V bytes plus the summary bytes scanned. This module imports numpy only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"LOCKSST1"
VERSION = 1
HEADER_BYTES = 64
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
        ("_pad", "<u4"),
        ("written", "<u8"),  # records written so far
    ]
)
assert HEADER.itemsize <= HEADER_BYTES


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
        ]
    )


class StatsRing:
    """A ring of step records in a memory-mapped file; one writer (the engine), any number of readers.

    Args:
        path (str | Path): the ring file.
        writable (bool): open for writing (the engine's side); readers leave it False.

    Raises:
        FileNotFoundError: no such file; ValueError: the file is not a LOCKS stats ring of this version.
    """

    def __init__(self, path: str | Path, writable: bool = False) -> None:
        self.path = Path(path)
        mode = "r+" if writable else "r"
        self._map = np.memmap(self.path, dtype=np.uint8, mode=mode)
        self._inode = os.stat(self.path).st_ino
        self.header = np.ndarray((), dtype=HEADER, buffer=self._map, offset=0)
        if bytes(self.header["magic"]) != MAGIC or int(self.header["version"]) != VERSION:
            raise ValueError(f"{self.path} is not a LOCKS stats file of version {VERSION}")
        self.capacity = int(self.header["capacity"])
        self.dtype = record_dtype(int(self.header["max_rows"]), int(self.header["hist_bins"]))
        self.records = np.ndarray((self.capacity,), dtype=self.dtype, buffer=self._map, offset=HEADER_BYTES)

    @classmethod
    def create(
        cls, path: str | Path, *, max_pages: int, page_size: int, capacity: int = 256, max_rows: int = MAX_ROWS
    ) -> "StatsRing":
        """Create (atomically replace) a ring file sized for sequences of up to ``max_pages`` pages."""
        path = Path(path)
        pages_per_bin = max(1, -(-max_pages // MAX_BINS))
        hist_bins = max(1, -(-max_pages // pages_per_bin))
        size = HEADER_BYTES + capacity * record_dtype(max_rows, hist_bins).itemsize
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        header = np.zeros((), dtype=HEADER)
        header["magic"], header["version"], header["capacity"] = MAGIC, VERSION, capacity
        header["max_rows"], header["hist_bins"], header["pages_per_bin"] = max_rows, hist_bins, pages_per_bin
        header["page_size"], header["pid"] = page_size, os.getpid()
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

    def latest(self, count: int = 1) -> list[dict[str, Any]]:
        """The newest ``count`` complete records, oldest first, as dicts of Python ints and numpy arrays."""
        written = int(self.header["written"])
        out = []
        for number in range(max(1, written - count + 1), written + 1):
            rec = self.records[(number - 1) % self.capacity].copy()
            if int(rec["seq"]) == number and int(self.records[(number - 1) % self.capacity]["seq"]) == number:
                out.append({name: rec[name].item() if rec[name].ndim == 0 else rec[name] for name in self.dtype.names})
        return out

    def replaced(self) -> bool:
        """Whether the file at ``path`` is now another file (a new engine started): reopen then."""
        try:
            return os.stat(self.path).st_ino != self._inode
        except FileNotFoundError:
            return True


def require_locks(path: str | Path, timeout_s: float = 0.0) -> StatsRing:
    """Fail loudly unless the engine that owns ``path`` runs LOCKS on every attention layer.

    Args:
        path (str | Path): the ``locks_stats_path`` given to the engine.
        timeout_s (float): how long to wait for the engine to write its header (seconds).

    Returns:
        StatsRing: the open ring.

    Raises:
        RuntimeError: no stats file (the LOCKS backend never started: the plugin was not loaded, or vLLM chose
            another backend), or some attention layers run another backend.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ring = StatsRing(path)
            if int(ring.header["layers_total"]) > 0:
                break
        except (FileNotFoundError, ValueError):
            ring = None
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"the LOCKS backend did not start (no stats in {path}): is the vllm.general_plugins entry point of "
                "locks-chat installed, and LOCKS_OVERRIDE_CPU_ATTN not 0?"
            )
        time.sleep(0.1)
    total, locks = int(ring.header["layers_total"]), int(ring.header["layers_locks"])
    if locks != total:
        raise RuntimeError(f"only {locks} of {total} attention layers run the LOCKS backend")
    return ring
