"""Page citations in an answer: ``(p. 12)``, ``p. iv``, ``pp. 3-4``, ``page 7`` matched to the document's labels."""

from __future__ import annotations

import re

from locks_chat.ingest import Document

_CITATION = re.compile(r"\b(?:pp?\.|pages?)\s*([0-9ivxlcdm]+(?:\s*[-–]\s*[0-9ivxlcdm]+)?)", re.IGNORECASE)


def find_citations(answer: str, document: Document) -> list[dict[str, object]]:
    """Pages an answer cites, in order of first mention, each as ``{"page": label, "physical": n}``;
    ``physical`` is ``None`` for a label the document (or the selected range) does not have."""
    by_label = {page.label.lower(): page for page in document.pages}
    found: dict[str, dict[str, object]] = {}
    for match in _CITATION.finditer(answer):
        for label in re.split(r"\s*[-–]\s*", match.group(1)):
            page = by_label.get(label.lower())
            key = page.label if page else label
            found.setdefault(key, {"page": key, "physical": page.number if page else None})
    return list(found.values())
