"""How long the slow phases took last time, for the next run's ETAs (``timings.json`` in the user data dir).

Not settings: nothing here changes behaviour, and a missing or unreadable file only means no ETA.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from locks_chat.paths import data_dir


@dataclass
class Timings:
    engine_start_s: float | None = None
    """seconds the last engine start took"""
    prefill_tokens_per_s: float | None = None
    """prompt tokens per second of the last prefill"""


def timings_path() -> Path:
    return data_dir() / "timings.json"


def load_timings() -> Timings:
    try:
        values = json.loads(timings_path().read_text(encoding="utf-8"))
        known = Timings.__dataclass_fields__
        return Timings(**{k: float(v) for k, v in values.items() if k in known and v is not None})
    except (OSError, ValueError, TypeError):
        return Timings()


def save_timings(timings: Timings) -> None:
    """Write atomically; a failure to write is ignored (ETAs are a convenience)."""
    path = timings_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(timings)), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
