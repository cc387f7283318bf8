"""Page citations in an answer: ``(p. 12)``, ``p. iv``, ``pp. 3-4``, ``pages iv-x``, ``page 7`` matched to the
document's labels.

A label is a number or a roman numeral (i to cccxcix, all lower or all upper case) standing as a whole word, so the
word after "page" in "this page contains", "page mentions" or "pages mix" is no label, nor is the pronoun in
"the pages I read".
"""

from __future__ import annotations

import re

from locks_chat.ingest import Document

_ROMAN = r"c{0,3}(?:xc|xl|l?x{0,3})(?:ix|iv|v?i{0,3})"
"""a roman numeral from i to cccxcix (front matter never runs to d or m); it also matches the empty string"""
_LABEL = rf"(?:\d+|(?=[ivxlc]){_ROMAN}|(?=[IVXLC])(?!I\s){_ROMAN.upper()})(?!\w)"
_CITATION = re.compile(rf"\b(?i:pp?\.|pages?)\s*({_LABEL}(?:\s*[-–]\s*{_LABEL})?)")


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
