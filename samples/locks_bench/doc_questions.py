"""Generated questions about documents made from book text, for ``samples/bench_builtin_models.py``: made-up
facts (needles: a code number or a name, each stated once) put as their own paragraph at a depth of the text,
questions that ask for them, some that ask to cite the page, and a follow-up that needs the first turn.

A document is a plain-text file the app reads as it reads any (pages of about 3,000 characters ending at a
paragraph), sized in characters for a nominal number of tokens (:data:`CHARS_PER_TOKEN`, measured on the team's
public-domain books with Qwen2.5's tokenizer; SmolLM2's counts 5-10% more): each model's real prompt tokens are
in the results. Everything is seeded: the same arguments give the same documents and questions.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from locks_bench.results import read_prose

#: characters a token of the books stands for (Qwen2.5's tokenizer, 40,000-character windows: Hamlet and
#: Paradise Lost 3.6-3.75, the King James Bible 4.0-4.25; the Britannica article swings from 2.0 to 4.1: not used)
CHARS_PER_TOKEN = 3.9
#: the question plan: nominal document tokens -> (depth, kind) of its needles, each kind once a document so that
#: no two facts of a document are alike (:data:`TEMPLATES`)
PLAN = {
    6000: ((0.1, "code"), (0.3, "cite"), (0.5, "name"), (0.7, "followup"), (0.9, "barge")),
    12000: ((0.1, "name"), (0.5, "code"), (0.9, "founder")),
    20000: ((0.1, "code"), (0.5, "founder"), (0.7, "cite"), (0.9, "barge")),
}
#: kind -> (fact, question, what a right answer holds: ``code`` or ``last`` name); ``cite`` asks to cite the page;
#: ``followup`` is followed, in the same conversation, by :data:`FOLLOW_UP`, answered by the chooser's last name
TEMPLATES = {
    "code": ("The combination of the strongbox at the {place} is {code}.",
             "What is the combination of the strongbox at the {place}?", "code"),
    "barge": ("The registration number painted on the {place} barge is {code}.",
              "What registration number is painted on the {place} barge?", "code"),
    "cite": ("The ferry ticket for the {place} crossing bears the number {code}.",
             "What number does the ferry ticket for the {place} crossing bear? Cite the page.", "code"),
    "name": ("The keeper of the {place} in those years was {first} {last}.",
             "Who was the keeper of the {place} in those years?", "last"),
    "founder": ("The {place} was founded by a merchant named {first} {last}.", "Who founded the {place}?", "last"),
    "followup": ("The door code of the {place} is {code}; it was chosen by {first} {last}.",
                 "What is the door code of the {place}?", "code"),
}
FOLLOW_UP = "Who chose that code?"
PLACES = ["Varrowmere lighthouse", "Quillon archive", "Oskerby granary", "Tamsel chapel", "Brenholt mill",
          "Hadleigh observatory", "Corvane toll-house", "Ashgrove infirmary", "Pellow ferry station",
          "Dunmarrow signal tower", "Ivel counting-house", "Saltreach customs post", "Wenlow glassworks",
          "Thornaby school", "Galloway rope-walk", "Merrin boathouse", "Fallowby library", "Cresswick foundry"]
FIRST = ["Ysolde", "Tobiah", "Marguerite", "Oswin", "Perpetua", "Ansel", "Clemency", "Barnaby", "Isaura", "Leofric",
         "Hesper", "Corwin", "Rosalind", "Thaddeus", "Winifred", "Evander", "Jessamy", "Ambrose"]
LAST = ["Marrick", "Quennell", "Ashdown", "Fairweather", "Tregarthen", "Holloway", "Penhallow", "Blackwood",
        "Everleigh", "Castellan", "Dunstable", "Wetherby", "Rooksby", "Stannard", "Kilbride", "Ormerod",
        "Lockyer", "Ravensworth"]


@dataclass(frozen=True)
class Needle:
    """One made-up fact and the questions about it."""

    depth: float
    """where its paragraph goes, as a share of the document's characters (snapped to the next paragraph)"""
    kind: str
    """a key of :data:`TEMPLATES`"""
    fact: str
    """the sentence put in the document"""
    question: str
    value: str
    """what a right answer holds (a code's digits are compared without separators; a name's surname, any case)"""
    follow_up: str | None = None
    """the second turn's question (``followup``), asked in the same conversation"""
    follow_value: str | None = None


@dataclass(frozen=True)
class DocSpec:
    """One generated document: its nominal size, its text and its needles."""

    tokens: int
    """nominal size, tokens (:data:`CHARS_PER_TOKEN`)"""
    book: str
    """the book's file name"""
    text: str
    needles: tuple[Needle, ...]


def _code(rng: random.Random) -> str:
    return f"{rng.randrange(1000, 10000)}-{rng.randrange(100, 1000)}"


def make_needle(depth: float, kind: str, place: str, first: str, last: str, rng: random.Random) -> Needle:
    """The fact and question(s) of one needle of ``kind`` (:data:`TEMPLATES`) about ``place``."""
    fact, question, answer = TEMPLATES[kind]
    values = {"place": place, "first": first, "last": last, "code": _code(rng)}
    follow = (FOLLOW_UP, last) if kind == "followup" else (None, None)
    return Needle(depth, kind, fact.format(**values), question.format(**values), values[answer], *follow)


def build_docs(books: list[Path], plan: dict[int, tuple] = PLAN, seed: int = 50) -> list[DocSpec]:
    """The documents of ``plan``, document ``i`` cut from ``books[i % len(books)]`` (its prose, Gutenberg header
    and footer removed) from a seeded paragraph on; places and names never repeat across documents.

    Raises:
        SystemExit: a book is too short for its document.
    """
    rng = random.Random(seed)
    places, firsts, lasts = rng.sample(PLACES, len(PLACES)), rng.sample(FIRST, len(FIRST)), rng.sample(LAST, len(LAST))
    count = sum(len(needles) for needles in plan.values())
    if count > len(places):
        raise SystemExit(f"the plan has {count} needles; only {len(places)} places to name")
    docs, n = [], 0
    for i, (tokens, needles) in enumerate(plan.items()):
        book = books[i % len(books)]
        prose = read_prose(book)
        chars = int(tokens * CHARS_PER_TOKEN)
        if len(prose) < chars + 1000:
            raise SystemExit(f"{book.name} has {len(prose):,} characters of prose; {chars:,} needed")
        start = prose.find("\n\n", rng.randrange(0, len(prose) - chars - 1000)) + 2
        text = prose[start:start + chars]
        made = []
        for depth, kind in needles:
            made.append(make_needle(depth, kind, places[n], firsts[n], lasts[n], rng))
            n += 1
        docs.append(DocSpec(tokens, book.name, insert_needles(text, made), tuple(made)))
    return docs


#: how far past its depth a needle goes to reach a paragraph break before it takes a line break (verse has few)
PARAGRAPH_REACH = 1500


def insert_needles(text: str, needles: list[Needle]) -> str:
    """``text`` with each needle's fact as a paragraph of its own at the first paragraph break at or after its
    depth (within :data:`PARAGRAPH_REACH` characters, else the first line break; the end when there is none)."""
    cuts = []
    for needle in needles:
        at = int(needle.depth * len(text))
        para = text.find("\n\n", at)
        cut = para if 0 <= para <= at + PARAGRAPH_REACH else text.find("\n", at)
        cuts.append((len(text) if cut < 0 else cut, needle.fact))
    out, last = [], 0
    for at, fact in sorted(cuts):
        out += [text[last:at], f"\n\n{fact}\n"]
        last = at
    return "".join(out) + text[last:]


def needle_page(document, needle: Needle) -> str | None:
    """The label of the document page that holds the needle's fact, as the app paged the text (a fact is a
    paragraph of its own, and the app ends pages at paragraphs)."""
    fact = " ".join(needle.fact.split())
    for page in document.pages:
        if fact in " ".join(page.text.split()):
            return page.label
    return None


def is_right(answer: str, value: str) -> bool:
    """Whether ``answer`` holds ``value``: a code's digits in order without separators (``7314-582``,
    ``7314 582``) and not inside a longer number, a name as a whole word in any case."""
    if re.fullmatch(r"[\d-]+", value):
        digits = value.replace("-", "")
        return re.search(rf"(?<!\d){digits}(?!\d)", re.sub(r"(?<=\d)[\s\-–]+(?=\d)", "", answer)) is not None
    return re.search(rf"\b{re.escape(value)}\b", answer, re.IGNORECASE) is not None
