"""Page citations in an answer: ``(p. 12)``, ``p. iv``, ``pp. 3-4``, ``pages iv-x``, ``page 7`` matched to the
document's labels, and checked against the text of the pages they name (:func:`check_citations`).

A label is a number or a roman numeral (i to cccxcix, all lower or all upper case) standing as a whole word, so the
word after "page" in "this page contains", "page mentions" or "pages mix" is no label, nor is the pronoun in
"the pages I read".

The check, kept simple so a reader can redo it by hand: each citation vouches for the words before it in its
sentence; their key items (numbers and quoted spans weigh 3, proper names 2, other words 1; stop words none; see
:mod:`locks_chat.key_words`) are looked up on the cited page. The page holds the claim when it holds every quoted
span and at least :data:`VERIFY_SHARE` (60%) of the weight. The end of a page and the start of the next are also
searched together, for a fact printed across the break. A citation with nothing before it but stop words (an answer
that is only ``[p. 16]``) vouches for the question's key words instead. A label the document does not have is
flagged, with the document's page count when the label lies past its end.

An answer is *supported* (:attr:`CitationCheck.supported`) when every claim it makes is held by some page, and
unsupported when one is held by none: the reader is told the answer may be the model's invention.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from locks_chat.ingest import DocPage, Document
from locks_chat.key_words import KeyItem, key_items, words

_ROMAN = r"c{0,3}(?:xc|xl|l?x{0,3})(?:ix|iv|v?i{0,3})"
"""a roman numeral from i to cccxcix (front matter never runs to d or m); it also matches the empty string"""
_LABEL = rf"(?:\d+|(?=[ivxlc]){_ROMAN}|(?=[IVXLC])(?!I\s){_ROMAN.upper()})(?!\w)"
_CITATION = re.compile(rf"\b(?i:pp?\.|pages?)\s*({_LABEL}(?:\s*[-–]\s*{_LABEL})?)")


def _markers(answer: str, document: Document) -> Iterator[tuple[int, int, list[tuple[str, DocPage | None]]]]:
    """Each citation marker's ``[start, end)`` characters in ``answer`` and the pages it names, as (label,
    page) pairs; the page is ``None`` for a label the document (or the selected range) does not have."""
    by_label = {page.label.lower(): page for page in document.pages}
    for match in _CITATION.finditer(answer):
        cited = []
        for label in re.split(r"\s*[-–]\s*", match.group(1)):
            page = by_label.get(label.lower())
            cited.append((page.label if page else label, page))
        yield match.start(), match.end(), cited


def find_citations(answer: str, document: Document) -> list[dict[str, object]]:
    """Pages an answer cites, in order of first mention, each as ``{"page": label, "physical": n}``;
    ``physical`` is ``None`` for a label the document (or the selected range) does not have."""
    found: dict[str, dict[str, object]] = {}
    for _, _, cited in _markers(answer, document):
        for key, page in cited:
            found.setdefault(key, {"page": key, "physical": page.number if page else None})
    return list(found.values())


VERIFY_SHARE = 0.6
"""a page holds a claim when it holds at least this share of the weight of the claim's key items
(:mod:`locks_chat.key_words`)"""
BREAK_WORDS = 80
"""words taken from each side of a page break when looking for a fact that runs across it"""

_SENTENCE_END = re.compile(r"[.!?;]+[\"”')\]*_]*\s+|\n+")


@dataclass(frozen=True)
class CitationCheck:
    """What the citation check found for one answer."""

    citations: list[dict[str, object]] = field(default_factory=list)
    """the cited pages, as :func:`find_citations` gives them, each with ``verified`` (``True``: the page holds
    the words the answer gives it; ``False``: it does not; ``None``: the words before the citation are only stop
    words, nothing to check), ``found_on`` (where those words are when the cited page does not hold them:
    ``{"page": label, "physical": n}``, plus ``"through": label`` for a fact that runs onto the next page;
    ``None`` when no page holds them) and ``score`` (the share of key-item weight on the cited page, 0-1); a
    citation checked with the question's key words (nothing but stop words before it) adds ``"checked_with":
    "question"``"""
    proposed: dict[str, object] | None = None
    """for an answer that cites no page: the best page holding its key words, ``{"page", "physical",
    "found_by": "app", "score"}`` (``"through"`` as in ``found_on``); ``None`` otherwise"""
    nowhere: bool = False
    """the answer cites no page and no page holds its key words"""
    page_count: int | None = None
    """pages in the whole source document (``Document.page_count``), to say how far a cited label is past its end"""

    @property
    def supported(self) -> bool | None:
        """``False`` when some claim of the answer is held by no page (:attr:`nowhere`, or a citation whose words
        no page holds), ``True`` when every claim is held by a page, ``None`` when there was nothing to check."""
        if self.nowhere or any(c["verified"] is False and c["found_on"] is None for c in self.citations):
            return False
        if self.proposed is not None or any(c["verified"] is not None for c in self.citations):
            return True
        return None

    @property
    def text(self) -> str:
        """One line for people: ``p. 1 verified · p. 11 cited; the text is on p. 52``; empty when there is
        nothing to say (no citation and no key word)."""
        parts = [_verdict(c, self.page_count) for c in self.citations]
        if self.proposed is not None:
            parts.append(f"no page cited; the app found the text on {_where(self.proposed)}")
        elif self.nowhere:
            parts.append("no page cited, and no page holds the answer's key words")
        return " · ".join(parts)


def report_check(console: Any, check: CitationCheck) -> None:
    """Print the check's line (``citations: p. 1 verified``) on a rich ``console``: green when every cited
    page is verified, yellow otherwise; nothing when there is nothing to say."""
    from rich.markup import escape

    if check.text:
        ok = check.citations and all(c["verified"] for c in check.citations)
        style = "green" if ok else "yellow"
        console.print(f"[{style}]citations:[/] {escape(check.text)}", highlight=False, soft_wrap=True)


def _where(place: dict[str, object]) -> str:
    """``p. 52``, ``pp. 11-12`` across a break, and the physical number when it differs from the label."""
    where = f"pp. {place['page']}-{place['through']}" if place.get("through") else f"p. {place['page']}"
    return where if place["page"] == str(place["physical"]) else f"{where} (page {place['physical']} of the file)"


UNSUPPORTED_TEXT = ("Not supported by the document: no page holds the answer's key words, so it may be the model's "
                    "invention; check it before relying on it.")
"""what the reader is told right under an unsupported answer (:attr:`CitationCheck.supported` ``False``)"""


def _outside(label: str, page_count: int | None) -> bool:
    """Whether a label the selected pages lack names a page past the end of the whole document."""
    return page_count is not None and label.isdigit() and int(label) > page_count


def _verdict(citation: dict[str, object], page_count: int | None = None) -> str:
    cited = f"p. {citation['page']}"
    by_question = citation.get("checked_with") == "question"
    if citation["verified"]:
        return f"{cited} holds the question's key words" if by_question else f"{cited} verified"
    if citation["verified"] is None:
        return f"{cited} not checked (no key words before it)"
    if citation["physical"] is not None:
        cited += " cited"
    elif _outside(str(citation["page"]), page_count):
        cited += f" cited; the document has {page_count} pages"
    else:
        cited += " cited (not in the selected pages)"
    words_of = "the question's key words" if by_question else "the text"
    if citation["found_on"] is not None:
        return f"{cited}; {words_of} {'are' if by_question else 'is'} on {_where(citation['found_on'])}"
    return f"{cited}; no page holds {'the question' if by_question else 'the answer'}'s key words"


class _PageIndex:
    """The normalized words of each page with text, and of each page break (the end of one page with the start
    of the next)."""

    def __init__(self, document: Document) -> None:
        self.pages = [page for page in document.pages if page.text]
        self.position = {page.number: i for i, page in enumerate(self.pages)}
        texts = [words(page.text) for page in self.pages]
        self.sets = [set(w) for w in texts]
        self.runs = [f" {' '.join(w)} " for w in texts]
        sides = [(w[-BREAK_WORDS:], w[:BREAK_WORDS]) for w in texts]
        self.breaks = [  # (word set, run) of both sides together, of the tail of page i, of the head of page i + 1
            tuple((set(run), f" {' '.join(run)} ") for run in (sides[i][0] + sides[i + 1][1], sides[i][0],
                                                                sides[i + 1][1]))
            for i in range(len(texts) - 1)
        ]

    def share(self, items: list[KeyItem], i: int) -> float:
        """The share of the items' weight that page ``i`` (an index into :attr:`pages`) holds."""
        return _share(items, self.sets[i], self.runs[i])

    def break_share(self, items: list[KeyItem], i: int) -> float:
        """The share held across the break after page ``i``: 0 unless the two sides together hold more than
        either alone and neither alone holds :data:`VERIFY_SHARE` (a fact wholly on one side is that page's)."""
        if not 0 <= i < len(self.breaks):
            return 0.0
        both, *sides = (_share(items, word_set, run) for word_set, run in self.breaks[i])
        return both if max(sides) < min(both, VERIFY_SHARE) else 0.0

    def place(self, i: int, through: bool = False) -> dict[str, object]:
        page = self.pages[i]
        place: dict[str, object] = {"page": page.label, "physical": page.number}
        if through:
            place["through"] = self.pages[i + 1].label
        return place

    def best(self, items: list[KeyItem]) -> tuple[dict[str, object] | None, float]:
        """The page (or break) holding the most of the items' weight, if it holds :data:`VERIFY_SHARE`; a page
        wins a tie with a break, an earlier page a tie with a later one."""
        scores = [(self.share(items, i), 1, -i) for i in range(len(self.pages))]
        scores += [(self.break_share(items, i), 0, -i) for i in range(len(self.breaks))]
        if not scores:
            return None, 0.0
        score, single, i = max(scores)
        return (self.place(-i, through=not single) if score >= VERIFY_SHARE else None), score


def _share(items: list[KeyItem], word_set: set[str], run: str) -> float:
    """The share of the items' weight found in a text given as its word set and its words joined by spaces; 0
    when a quoted span is missing (a quote is held word for word or not at all)."""
    found = 0.0
    for item in items:
        if f" {item.text} " in run if item.quote else item.text in word_set:
            found += item.weight
        elif item.quote:
            return 0.0
    return found / sum(item.weight for item in items)


def _claims(answer: str, spans: list[tuple[int, int]]) -> list[str]:
    """The text each citation marker vouches for: the words before it in its sentence (since the previous
    marker); a marker after only stop words shares the previous marker's claim in the same sentence, else
    takes the rest of its sentence, else the sentence before (``It is BLUE. (p. 1)``)."""
    masked = list(answer)
    for start, end in spans:
        masked[start:end] = " " * (end - start)
    text = "".join(masked)
    ends = [(m.start(), m.end()) for m in _SENTENCE_END.finditer(text)]
    starts = [0] + [e for _, e in ends]

    def sentence(at: int) -> tuple[int, int]:
        first = max(s for s in starts if s <= at)
        return first, min((s for s, _ in ends if s >= at), default=len(text))

    claims: list[str] = []
    for k, (start, end) in enumerate(spans):
        first, last = sentence(start)
        previous = spans[k - 1][1] if k else 0
        own = text[max(first, previous):start]
        if key_items(own):
            claims.append(own)
        elif k and previous >= first:
            claims.append(claims[-1])
        elif key_items(text[end:last]):
            claims.append(text[end:last])
        else:
            before = max((s for s in starts if s < first), default=0)
            claims.append(text[max(before, previous):first])
    return claims


def _check(index: _PageIndex, items: list[KeyItem], page: DocPage | None) -> dict[str, object]:
    """``verified``, ``found_on`` and ``score`` of one claim cited to ``page`` (``None``: a label the document
    does not have)."""
    if not items:
        return {"verified": None, "found_on": None, "score": None}
    score = 0.0
    i = index.position.get(page.number) if page is not None else None
    if i is not None:
        score = max(index.share(items, i), index.break_share(items, i - 1), index.break_share(items, i))
    if score >= VERIFY_SHARE:
        return {"verified": True, "found_on": None, "score": round(score, 2)}
    return {"verified": False, "found_on": index.best(items)[0], "score": round(score, 2)}


def _rank(verdict: dict[str, object]) -> tuple[int, float]:
    return {False: 0, True: 1, None: 2}[verdict["verified"]], verdict["score"] or 0.0


def check_citations(answer: str, document: Document, question: str | None = None) -> CitationCheck:
    """Check each page an answer cites against the document's text (small models often cite a wrong page).

    Each citation marker vouches for the text before it (see :func:`_claims`); that text's key items
    (:func:`locks_chat.key_words.key_items`) are looked up on the cited page, and on the breaks before and after
    it (the last and first :data:`BREAK_WORDS` words of two neighbouring pages, each holding a part), so a fact
    that runs across a page break counts for either page. The cited page is ``verified`` when it holds every
    quoted span and :data:`VERIFY_SHARE` of the items' weight; else ``found_on`` names the page holding the
    most, if that reaches the share. A page cited for several claims is verified when it holds each of them. An answer that
    cites no page gets the best page holding its key items as ``proposed``. A citation with only stop words to
    vouch for (an answer that is just ``[p. 16]``) is checked with the ``question``'s key items instead, and says
    so (``"checked_with": "question"``).

    Args:
        answer (str): the answer text, citations included.
        document (Document): the document it answers; pages without text are never proposed.
        question (str | None): the question answered; ``None``: such citations stay unchecked.
    Returns:
        CitationCheck: the citations of :func:`find_citations` with ``verified``, ``found_on`` and ``score``.
    """
    index = _PageIndex(document)
    markers = list(_markers(answer, document))
    claims = _claims(answer, [(start, end) for start, end, _ in markers])
    entries: dict[str, dict[str, object]] = {}
    asked = key_items(question) if question else []
    for (_, _, cited), claim in zip(markers, claims):
        items, extra = key_items(claim), {}
        if not items and asked:
            items, extra = asked, {"checked_with": "question"}
        for key, page in cited:
            verdict = {**_check(index, items, page), **extra}
            entry = entries.setdefault(key, {"page": key, "physical": page.number if page else None, **verdict})
            if _rank(verdict) < _rank(entry):  # a page cited twice keeps its worse verdict
                entry.pop("checked_with", None)
                entry.update(verdict)
    if entries:
        return CitationCheck(list(entries.values()), page_count=document.page_count)
    items = key_items(answer)
    if not items:
        return CitationCheck(page_count=document.page_count)
    place, score = index.best(items)
    if place is None:
        return CitationCheck(nowhere=True, page_count=document.page_count)
    return CitationCheck(proposed={**place, "found_by": "app", "score": round(score, 2)},
                         page_count=document.page_count)
