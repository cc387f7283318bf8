"""Decoding text files: UTF-8 silently, anything else with a warning, never a crash."""

from __future__ import annotations

import codecs

from locks_chat.errors import DocumentError

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
# share of control characters (other than whitespace) above which bytes are not text
_MAX_CONTROL_SHARE = 0.01
# how much more "chaos" (charset-normalizer's mess ratio) cp1252 may show and still win
_CP1252_MARGIN = 0.2


def decode_text(data: bytes, source: str) -> tuple[str, list[str]]:
    """Decode the bytes of a text file.

    Order: a byte-order mark (UTF-8/16/32) decides; else strict UTF-8; else the encoding
    charset-normalizer finds most likely (cp1252 preferred among near-ties, see
    :func:`_prefer_cp1252`; BOM-less UTF-16, cp1251, ...), with a warning naming it.

    Args:
        data (bytes): the file's content.
        source (str): the file name, for messages.

    Returns:
        the text and the warnings (one line each).

    Raises:
        DocumentError: the bytes are not text in any encoding (a binary file).
    """
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            text = _checked(data.decode(encoding, errors="replace"), source)
            warnings = _replacement_warning(text, encoding)
            if encoding.startswith("utf-16") or encoding.startswith("utf-32"):
                warnings.insert(0, f"not UTF-8; decoded as {encoding.upper()} (byte-order mark)")
            return text, warnings
    try:
        text = data.decode("utf-8")
        if not _looks_binary(text):
            return text, []
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    matches = list(from_bytes(data))
    if not matches:
        raise DocumentError(f"{source}: not a text file in any known encoding; pass a PDF, EPUB, text or Markdown file")
    encoding = _prefer_cp1252(matches)
    text = _checked(data.decode(encoding, errors="replace"), source)
    return text, [f"not UTF-8; decoded as {encoding}, check accented characters"]


def _prefer_cp1252(matches) -> str:
    """The detector's best encoding, unless cp1252 is nearly as plausible.

    Single-byte Latin encodings decode most bytes alike and charset-normalizer often ranks
    a Baltic or Central European code page first for short French or English text; books
    in a legacy encoding are mostly cp1252 (a superset of latin-1's printable characters),
    so cp1252 wins when its mess ("chaos") is within :data:`_CP1252_MARGIN` of the best.
    """
    best = matches[0]
    for match in matches:
        if match.chaos > best.chaos + _CP1252_MARGIN:
            break
        if "cp1252" in match.could_be_from_charset:
            return "cp1252"
    return best.encoding


def _looks_binary(text: str) -> bool:
    sample = text[:65536]
    controls = sum(1 for ch in sample if ord(ch) < 32 and ch not in "\n\r\t\f")
    return bool(sample) and controls / len(sample) > _MAX_CONTROL_SHARE


def _checked(text: str, source: str) -> str:
    if _looks_binary(text):
        raise DocumentError(f"{source}: binary data, not text; pass a PDF, EPUB, text or Markdown file")
    return text


def _replacement_warning(text: str, encoding: str) -> list[str]:
    bad = text.count("\ufffd")
    return [f"{bad} undecodable bytes replaced while decoding as {encoding}"] if bad else []
