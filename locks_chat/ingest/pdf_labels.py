"""A PDF's printed page labels (``/PageLabels``), and the names its pages are given in messages
(``locks_chat.ingest.pdf``)."""

from __future__ import annotations

from collections.abc import Sequence

from locks_chat.errors import NoTextError
from locks_chat.ingest.normalize import one_line


def page_labels(reader, source: str) -> list[str]:
    """Each page's printed label; its physical number (1-based) where it has none or the labels cannot be read.

    Raises:
        NoTextError: the PDF has no pages.
    """
    count = len(reader.pages)
    try:
        # an empty printed label (a /PageLabels range with neither style nor prefix) is cited by its physical number
        labels = [one_line(str(label)) or str(i + 1) for i, label in enumerate(reader.page_labels)]
    except Exception:
        labels = []
    if len(labels) != count:
        labels = [str(i + 1) for i in range(count)]
    if count == 0:
        raise NoTextError(f"{source}: the PDF has no pages; pass another file")
    return labels


def page_name(index: int, labels: Sequence[str]) -> str:
    """``"page 3"`` for 0-based ``index`` 2, or ``"page 3 (printed iv)"`` where its label is not its number."""
    label = labels[index]
    return f"page {index + 1}" if label == str(index + 1) else f"page {index + 1} (printed {label})"


def pages_name(indices: Sequence[int], labels: Sequence[str]) -> str:
    """``"page 2"``, or ``"pages 2-5, 9"`` (physical numbers) for several."""
    if len(indices) == 1:
        return page_name(indices[0], labels)
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return "pages " + ", ".join(f"{r[0] + 1}" if len(r) == 1 else f"{r[0] + 1}-{r[-1] + 1}" for r in runs)
