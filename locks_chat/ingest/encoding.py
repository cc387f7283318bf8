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
        mostly = _mostly_utf8(data, source)
        if mostly is not None:
            return mostly
    from charset_normalizer import from_bytes

    matches = list(from_bytes(data))
    if not matches:
        raise DocumentError(f"{source}: not a text file in any known encoding; pass a PDF, EPUB, text or Markdown file")
    encoding = _prefer_cp1252(matches)
    text = _checked(data.decode(encoding, errors="replace"), source)
    return text, [f"not UTF-8; decoded as {encoding}, check accented characters"]


def _mostly_utf8(data: bytes, source: str) -> tuple[str, list[str]] | None:
    """UTF-8 with its few bad bytes replaced (U+FFFD) and a warning counting them, when the valid multi-byte
    characters outnumber the bad bytes at least twice (a UTF-8 book with a stray Latin-1 byte stays UTF-8, where a
    legacy code page would garble every accented letter); None when the bytes are better read in another encoding."""
    text = data.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") - data.count("\ufffd".encode())
    wide = sum(1 for ch in text if ord(ch) > 0x7F) - text.count("\ufffd")
    if bad <= 0 or wide < 2 * bad or _looks_binary(text):
        return None
    try:
        data.decode("utf-8")
        first = 0
    except UnicodeDecodeError as err:
        first = err.start
    line = data.count(b"\n", 0, first) + 1
    return _checked(text, source), [f"{bad} byte{'s' if bad > 1 else ''} not UTF-8 (the first on line {line}), "
                                    "shown as \ufffd; the rest read as UTF-8"]


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
