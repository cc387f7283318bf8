"""Text normalization applied to every extracted page.

What changes:
- Unicode NFC (composed accents, as PDFs often emit ``e`` + combining acute);
- NFKC only for compatibility characters that never carry meaning in prose: the Latin
  ligatures (U+FB00-FB06: ``ﬁ ﬂ ﬀ ﬃ ﬄ ﬅ ﬆ``), full-width ASCII (U+FF01-FF5E) and the
  odd-width spaces (no-break, thin, ideographic...). Whole-text NFKC is not applied: it
  would turn ``x²`` into ``x2`` and ``½`` into ``1⁄2``;
- soft hyphens (U+00AD) removed, joining the word when one ends a line;
- words hyphenated at a line end joined (``dan-\\ngerous`` -> ``dangerous``) when both
  halves are lower-case letters; the line break moves after the joined word. Without a
  dictionary a compound broken at its own hyphen is joined too (``camera-\\nready`` ->
  ``cameraready``): rarer in print than hyphenation, and harmless to a reader model;
- zero-width characters, byte-order marks and control characters other than newline and
  tab dropped; ``\\r\\n`` and ``\\r`` become ``\\n``;
- trailing spaces on each line dropped, runs of blank lines cut to one, outer whitespace
  stripped; with ``collapse_spaces`` (PDF and EPUB, where spacing is layout, not content)
  runs of spaces inside a line become one space, indentation kept.
"""

from __future__ import annotations

import re
import unicodedata

_NFKC_RANGES = (
    range(0xFB00, 0xFB07),
    range(0xFF01, 0xFF5F),
    range(0x2000, 0x200B),
    (0x00A0, 0x202F, 0x205F, 0x3000),
)
_DROPPED = [0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF]
_DROPPED += [c for c in range(0x20) if chr(c) not in "\n\t"]
_DROPPED += list(range(0x7F, 0xA0))

_TABLE: dict[int, str | None] = {cp: unicodedata.normalize("NFKC", chr(cp)) for r in _NFKC_RANGES for cp in r}
_TABLE.update({cp: None for cp in _DROPPED})

_SOFT_HYPHEN_BREAK = re.compile(r"\u00ad[ \t]*\n[ \t]*")
_HYPHEN_BREAK = re.compile(r"(?<![\w-])(\w*[a-zß-öø-ÿ])-[ \t]*\n[ \t]*([a-zß-öø-ÿ]\S*)[ \t]*\n?")
_TRAILING_SPACE = re.compile(r"[ \t]+$", re.MULTILINE)
_INNER_SPACES = re.compile(r"(?<=\S)[ \t]{2,}(?=\S)")
_BLANK_LINES = re.compile(r"\n{3,}")


def normalize_text(text: str, *, collapse_spaces: bool = False) -> str:
    """Normalize one page of extracted text (see the module docstring for the rules).

    Args:
        text (str): raw page text.
        collapse_spaces (bool): turn runs of spaces inside a line into one space.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = unicodedata.normalize("NFC", text)
    text = _SOFT_HYPHEN_BREAK.sub("", text)
    text = text.replace("\u00ad", "").translate(_TABLE)
    text = _HYPHEN_BREAK.sub(r"\1\2\n", text)
    text = _TRAILING_SPACE.sub("", text)
    if collapse_spaces:
        text = _INNER_SPACES.sub(" ", text)
    text = _BLANK_LINES.sub("\n\n", text)
    return text.strip()


def one_line(text: str) -> str:
    """``text`` from a document for one line of a message, a page label or a title: normalized
    (:func:`normalize_text`, control characters dropped), line breaks and runs of whitespace made one space.
    A damaged or crafted file's page label ``"A\\nB"`` would otherwise split an error message in two."""
    return " ".join(normalize_text(text).split())
