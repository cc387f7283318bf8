"""The ``--pages`` selector: physical page numbers or printed page labels.

Syntax: comma-separated parts, each a page (``12``, ``iv``) or a range (``40-80``,
``iv-x``, ``40-`` to the end, ``-12`` from the start); an en dash works like ``-``.

How a part is read:
1. If the document has printed labels that differ from the physical numbers (a PDF
   with ``/PageLabels``, e.g. roman front matter), the part is first read as printed
   labels: ``12-20`` means the pages printed "12" to "20". A label is matched exactly,
   else case-insensitively; a label that occurs more than once (two sections each
   starting at "1") means its first occurrence, and a range's end the first occurrence
   at or after its start. Labels containing ``-`` (``T-1``) work: every split point is
   tried.
2. In a document without such labels (plain numbering: text, EPUB, most PDFs), the part
   is physical page numbers, 1-based, counting every page of the file.
3. A leading ``#`` forces physical numbers: ``#1-8`` is the first eight pages of the
   file whatever they are labelled.
4. In a document with printed labels, a part naming a printed label that does not exist
   (``108`` when the last page is printed "107", though the file has 113 pages), or mixing
   a label with a number that only makes sense physically, is an error rather than a
   silent reinterpretation as physical numbers; the message suggests the ``#`` form.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NoReturn

from locks_chat.errors import PageRangeError

_DASHES = ("-", "\u2013")
_ROMAN = re.compile(r"^(m{0,3})(cm|cd|d?c{0,3})(xc|xl|l?x{0,3})(ix|iv|v?i{0,3})$")
_ROMAN_VALUES = {"i": 1, "v": 5, "x": 10, "l": 50, "c": 100, "d": 500, "m": 1000}


def parse_page_range(spec: str | None, labels: Sequence[str]) -> list[int]:
    """Resolve a ``--pages`` selector to 0-based page indices, in document order.

    Args:
        spec (str | None): the selector (see the module docstring); ``None`` or ``""``
            selects every page.
        labels (Sequence[str]): printed label of each physical page, in file order.

    Raises:
        PageRangeError: malformed, empty or out of range; the message gives the valid range.
    """
    if spec is None or not spec.strip():
        return list(range(len(labels)))
    chosen: set[int] = set()
    for part in spec.split(","):
        first, last = _resolve_part(part.strip(), spec, labels)
        chosen.update(range(first, last + 1))
    return sorted(chosen)


def describe_pages(labels: Sequence[str]) -> str:
    """The valid pages of a document for messages: ``"physical 1-113 (printed T-1 to T-2, i to iv, 1 to 107)"``."""
    text = f"physical 1-{len(labels)}" if labels else "no pages"
    if _has_printed_labels(labels):
        runs = _label_runs(labels)
        shown = ", ".join(runs[:6]) + (", ..." if len(runs) > 6 else "")
        text += f" (printed {shown})"
    return text


def _resolve_part(part: str, spec: str, labels: Sequence[str]) -> tuple[int, int]:
    if not part or part == "#":
        _fail(spec, "empty part", labels)
    physical = part.startswith("#")
    body = part[1:].strip() if physical else part
    numbers = _as_numbers(body, len(labels))
    in_range = numbers is not None and all(1 <= n <= len(labels) for n in numbers)
    if not physical and _has_printed_labels(labels):
        found = _by_labels(body, labels)
        if found is not None:
            return _ordered(found, part, spec, labels)
        tokens = _tokens(body)
        missing = [t for t in tokens if _find_label(t, labels, 0) is None]
        if missing and (numbers is not None or len(missing) < len(tokens)):
            # never fall back to physical numbers silently: "108" is not the page printed "102"
            _fail(spec, f"no page is printed {missing[0]!r}{_physical_hint(body, numbers, in_range)}", labels)
    if numbers is None:
        _fail(spec, f"{part!r} is neither page numbers nor printed page labels", labels)
    if not in_range:
        _fail(spec, f"{part!r} is out of range", labels)
    return _ordered((numbers[0] - 1, numbers[1] - 1), part, spec, labels)


def _physical_hint(body: str, numbers: tuple[int, int] | None, in_range: bool) -> str:
    """`` (pass '#108' to mean physical page 108)`` when that reading exists, else ``""``."""
    if numbers is None or not in_range:
        return ""
    what = f"page {numbers[0]}" if numbers[0] == numbers[1] else f"pages {numbers[0]}-{numbers[1]}"
    return f" (pass '#{body}' to mean physical {what})"


def _as_numbers(body: str, count: int) -> tuple[int, int] | None:
    """``body`` read as physical page numbers: 1-based (first, last), not range-checked; ``None`` if not numbers."""
    for first, last in _splits(body):
        if _is_number(first) and _is_number(last):
            return int(first) if first else 1, int(last) if last else count
    return None


def _by_labels(body: str, labels: Sequence[str]) -> tuple[int, int] | None:
    for first, last in _splits(body):
        start = _find_label(first, labels, 0) if first else 0
        if start is None:
            continue
        end = _find_label(last, labels, start) if last else len(labels) - 1
        if end is None and last:
            end = _find_label(last, labels, 0)
        if end is not None:
            return start, end
    return None


def _splits(body: str) -> list[tuple[str, str]]:
    """Every way to read ``body`` as one page or as ``first-last``, whole page first."""
    out = [(body, body)]
    for i, ch in enumerate(body):
        if ch in _DASHES:
            out.append((body[:i].strip(), body[i + 1 :].strip()))
    return out


def _tokens(body: str) -> list[str]:
    return [t.strip() for t in re.split("[-\u2013]", body) if t.strip()]


def _find_label(token: str, labels: Sequence[str], start: int) -> int | None:
    for exact in (True, False):
        for i in range(start, len(labels)):
            if labels[i] == token if exact else labels[i].lower() == token.lower():
                return i
    return None


def _ordered(span: tuple[int, int], part: str, spec: str, labels: Sequence[str]) -> tuple[int, int]:
    if span[0] > span[1]:
        _fail(spec, f"{part!r} is an empty range (its start comes after its end)", labels)
    return span


def _is_number(token: str) -> bool:
    return token == "" or token.isdecimal()  # isdigit() also takes "²", which int() refuses


def _has_printed_labels(labels: Sequence[str]) -> bool:
    return any(label != str(i + 1) for i, label in enumerate(labels))


def _label_runs(labels: Sequence[str]) -> list[str]:
    runs: list[list[str]] = []
    previous = None
    for label in labels:
        key = _label_key(label)
        if runs and previous is not None and key is not None and key == (previous[0], previous[1] + 1):
            runs[-1].append(label)
        else:
            runs.append([label])
        previous = key
    dash = " to " if any("-" in label for label in labels) else "-"
    return [run[0] if len(run) == 1 else f"{run[0]}{dash}{run[-1]}" for run in runs]


def _label_key(label: str) -> tuple[str, int] | None:
    """(style, value) of a label, for finding runs: ("A-", 3) for "A-3", ("roman", 4) for "iv"."""
    match = re.fullmatch(r"(.*?)(\d+)", label)
    if match:
        return match.group(1), int(match.group(2))
    lower = label.lower()
    if lower and _ROMAN.match(lower):
        value = 0
        for ch, nxt in zip(lower, lower[1:] + " ", strict=True):
            v = _ROMAN_VALUES[ch]
            value += -v if nxt != " " and _ROMAN_VALUES[nxt] > v else v
        return ("roman" + ("-upper" if label.isupper() else ""), value)
    return None


def _fail(spec: str, why: str, labels: Sequence[str]) -> NoReturn:
    raise PageRangeError(f"--pages {spec!r}: {why}; valid pages: {describe_pages(labels)}")
