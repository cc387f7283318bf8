"""What ingestion accepts: the largest document, the size of one read, and the warning for a password not needed.

A leaf module: ``load`` and the format readers (``pdf``, ``epub``) read these at call time, so tests can lower them.
"""

from __future__ import annotations

MAX_DOCUMENT_BYTES = 1 << 30
"""largest document read, in bytes (1 GiB): the longest books and scanned PDFs are a few hundred MB at most"""
READ_CHUNK_BYTES = 4 << 20
"""bytes asked of the operating system per read (4 MiB); signals are handled between two reads"""


def format_bytes(count: int) -> str:
    """``"1 GiB"``, ``"64 KiB"``, ``"1000 bytes"``: a byte count (bytes) for messages, in the largest exact unit."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size and count % size == 0:
            return f"{count // size} {unit}"
    return f"{count} bytes"


def unused_password_warning(source: str) -> str:
    """The warning for a ``--password`` given with a file that needs none."""
    return f"--password given but {source} is not encrypted; ignored"
