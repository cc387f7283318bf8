"""Text normalization rules, one case each."""

from __future__ import annotations

import pytest

from locks_chat.ingest.normalize import normalize_text

CASES = {
    "ligatures": ("\ufb01nd \ufb02ow \ufb00 \ufb03ce \ufb04e", "find flow ff ffice ffle"),
    "soft-hyphen-inside": ("hy\u00adphen\u00adated", "hyphenated"),
    "soft-hyphen-line-end": ("exam\u00ad\nple text", "example text"),
    "hyphen-line-end": ("a dan-\ngerous road", "a dangerous\nroad"),
    "hyphen-line-end-trailing-space": ("dan- \n  gerous, indeed", "dangerous,\nindeed"),
    "hyphen-last-word-of-line": ("some dan-\ngerous\nnext line", "some dangerous\nnext line"),
    "hyphen-before-capital-kept": ("Franco-\nPrussian war", "Franco-\nPrussian war"),
    "dash-kept": ("one --\ntwo", "one --\ntwo"),
    "superscript-kept": ("x\u00b2 and \u00bd", "x\u00b2 and \u00bd"),
    "fullwidth": ("\uff21\uff22\uff23\uff11", "ABC1"),
    "nbsp-and-thin-space": ("a\u00a0b\u2009c", "a b c"),
    "zero-width-and-bom": ("\ufeffa\u200bb", "ab"),
    "combining-accent": ("e\u0301t\u00e9", "\u00e9t\u00e9"),
    "crlf": ("one\r\ntwo\rthree", "one\ntwo\nthree"),
    "blank-lines": ("a\n\n\n\n\nb", "a\n\nb"),
    "trailing-spaces": ("line one   \n   indented  ", "line one\n   indented"),
    "control-chars": ("a\x00b\x07c\td", "abc\td"),
}


@pytest.mark.parametrize("raw, expected", CASES.values(), ids=CASES.keys())
def test_normalize(raw, expected):
    assert normalize_text(raw) == expected


def test_collapse_spaces_keeps_indentation():
    raw = "THE   SIEGE   OF  VICKSBURG.\n    indented   line"
    assert normalize_text(raw, collapse_spaces=True) == "THE SIEGE OF VICKSBURG.\n    indented line"
    assert normalize_text(raw) == raw


def test_normalize_is_idempotent():
    raw = "".join(raw for raw, _ in CASES.values())
    once = normalize_text(raw, collapse_spaces=True)
    assert normalize_text(once, collapse_spaces=True) == once
