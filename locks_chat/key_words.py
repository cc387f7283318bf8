"""The key words of an answer, and the words of a page, normalized the same way so one can be looked up in the
other (the citation check of :mod:`locks_chat.citations`).

Normalization, on both sides: Unicode NFKC, case folded, curly apostrophes made straight, thousands separators
dropped from numbers (``1,200`` -> ``1200``), and a light suffix strip instead of a dictionary stemmer
(``storms`` -> ``storm``, ``keeper's`` -> ``keeper``, ``guarded`` -> ``guard``, ``sailing`` -> ``sail``), so an
answer that paraphrases a page's inflection still matches it.

A key item is what the check looks for on a page, with a weight (:data:`NUMBER`, :data:`NAME`, :data:`WORD`,
:data:`QUOTE`): a number, a proper name (capitalized inside a sentence, or all capitals), any other word that is
not a stop word (articles, pronouns, auxiliaries, and the words answers use to talk about the document: "page",
"according", "mentions"...), and a quoted span (``"..."`` or ``“...”``, two words or more), matched as a run of
normalized words.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import NamedTuple

NUMBER, NAME, WORD, QUOTE = 3.0, 2.0, 1.0, 3.0
"""weights of the key items: numbers and quoted spans count most, proper names next, other words least"""

STOP_WORDS = frozenset(
    """a about above after again against all also am an and any are as at be because been before being below
    between both but by can could did do does doing down during each either else ever few for from further had
    has have having he her here hers herself him himself his how however i if in into is it its itself just
    let me more most my myself neither no nor not now of off on once one only or other our ours ourselves out
    over own same she should so some such than that the their theirs them themselves then there these they
    this those through to too under until up upon very via was we were what when where which while who whom
    whose why will with would yes yet you your yours yourself yourselves
    according answer book cite cited citing document mention mentioned mentions p page pages pp passage
    question quote quoted refer refers say says section state stated states text""".split()
)
"""English function words, and the words answers use to point at the document rather than state a fact"""

_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+(?:'[^\W\d_]+)*")
_QUOTED = re.compile(r"\"([^\"\n]{3,}?)\"|“([^”\n]{3,}?)”")
_SUFFIXES = ("'s", "ing", "ed", "es", "s")
_ENDS_SENTENCE = ".!?:;\n"
_CONTRACTIONS = ("n't", "'re", "'ll", "'ve", "'m", "'d")
_NUMBER_WORDS = {
    word: str(value) for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen twenty".split()
    )
}
_NUMBER_WORDS |= {word: str(value) for value, word in zip(range(30, 100, 10), "thirty forty fifty sixty seventy "
                                                                           "eighty ninety".split())}


class KeyItem(NamedTuple):
    """One thing to look for on a page."""

    text: str
    """a normalized word, or for a quote its normalized words joined by single spaces"""
    weight: float
    """how much it counts (see :data:`NUMBER` and the other weights)"""
    quote: bool
    """a quoted span (matched as a run of words), not one word"""


@functools.lru_cache(maxsize=1 << 16)  # a book repeats its words: stem each once
def stem(word: str) -> str:
    """A case-folded word with one inflectional suffix cut (``'s``, ``ing``, ``ed``, ``es``, ``s``) when at least
    three letters remain; ``ss`` endings (``glass``) are kept, numbers lose their thousands separators and the
    number words up to twenty, and the tens, become digits (``twelve`` -> ``12``)."""
    word = word.casefold()
    if word[0].isdigit():
        return word.replace(",", "")
    if word in _NUMBER_WORDS:
        return _NUMBER_WORDS[word]
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            return word[: -len(suffix)]
    return word


def _clean(text: str) -> str:
    return unicodedata.normalize("NFKC", text).replace("’", "'").replace("‘", "'")


def words(text: str) -> list[str]:
    """The normalized words of ``text`` in order (what a page is searched as)."""
    return [stem(token) for token in _TOKEN.findall(_clean(text))]


def _starts_sentence(text: str, start: int) -> bool:
    """Whether the token at ``start`` opens the text or a sentence (only punctuation and spaces since a ``.``,
    ``!``, ``?``, ``:``, ``;`` or line break)."""
    i = start
    while i > 0 and not text[i - 1].isalnum() and text[i - 1] not in _ENDS_SENTENCE:
        i -= 1
    return i == 0 or text[i - 1] in _ENDS_SENTENCE


def _weight(text: str, match: re.Match) -> float | None:
    """The weight of one answer token, ``None`` for a stop word."""
    token = match.group()
    if stem(token)[0].isdigit():
        return NUMBER
    folded = token.casefold()
    if folded.split("'")[0] in STOP_WORDS or folded.endswith(_CONTRACTIONS) or len(token) < 2:
        return None
    capital = token[0].isupper() and not _starts_sentence(text, match.start())
    return NAME if capital or token.isupper() else WORD


def key_items(text: str) -> list[KeyItem]:
    """The key items of an answer (or a part of one), each once, the heaviest weight kept for a repeated word.

    Args:
        text (str): answer text, with citation markers already blanked out.
    Returns:
        list[KeyItem]: quoted spans first, then words in order of first appearance; empty when the text holds
        only stop words.
    """
    text = _clean(text)
    items: dict[tuple[str, bool], float] = {}
    for match in _QUOTED.finditer(text):
        quoted = " ".join(words(match.group(1) or match.group(2)))
        if " " in quoted:
            items[(quoted, True)] = QUOTE
    for match in _TOKEN.finditer(text):
        weight = _weight(text, match)
        if weight is not None:
            key = (stem(match.group()), False)
            items[key] = max(weight, items.get(key, 0.0))
    return [KeyItem(text, weight, quote) for (text, quote), weight in items.items()]
