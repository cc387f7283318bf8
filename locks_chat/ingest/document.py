"""A loaded document: its full text and its pages, with offsets between the two.

Token offsets in the prompt map to character offsets in :attr:`Document.text`, and
:meth:`Document.page_at` maps those to the document page a user can look up (a KV
page of 16 tokens is a cache unit; a document page is a page of the book).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

PAGE_SEPARATOR = "\n\n"
"""what :attr:`Document.text` puts between two pages that have text"""


class PageKind(StrEnum):
    """What one :class:`DocPage` of a document is, so a cited "page" means something."""

    PDF = "pdf page"
    """a PDF page, cited by its printed label (``/PageLabels``) or else its physical number"""
    FORM_FEED = "form-feed page"
    """a plain-text page delimited by form feeds (``\\f``), numbered from 1"""
    TEXT_BLOCK = "text page"
    """about 3,000 characters of plain text or Markdown, broken at paragraphs, numbered from 1"""
    CHAPTER = "epub chapter"
    """one EPUB spine item (a chapter or section file) that has text, numbered in reading order"""

    @property
    def description(self) -> str:
        """One sentence for users saying what a cited page of this kind is."""
        return {
            PageKind.PDF: "pages are PDF pages, cited by their printed page labels",
            PageKind.FORM_FEED: "pages are the form-feed separated pages of the text file, numbered from 1",
            PageKind.TEXT_BLOCK: (
                "the text has no pages: a page is a block of about 3,000 characters "
                "ending at a paragraph break, numbered from 1"
            ),
            PageKind.CHAPTER: "pages are the EPUB's chapter files in reading order, numbered from 1",
        }[self]


class RawPage(NamedTuple):
    """One page as a reader extracted it, before offsets are assigned."""

    number: int
    label: str
    text: str


@dataclass(frozen=True)
class DocPage:
    """One document page and where its text sits in :attr:`Document.text`."""

    number: int
    """physical page number, 1-based, counted over the whole source file"""
    label: str
    """printed page label users see ("iv", "12"); equals ``str(number)`` when the file has none"""
    text: str
    """normalized text of the page; empty for a blank or image-only page"""
    start: int
    """offset (characters) of the page's first character in :attr:`Document.text`"""
    end: int
    """offset (characters) one past the page's last character; ``end == start`` for an empty page"""

    @property
    def citation(self) -> str:
        """How an answer cites this page: ``"p. iv"``."""
        return f"p. {self.label}"


@dataclass(frozen=True)
class Document:
    """A document loaded for questioning: full text, pages and what went wrong on the way."""

    source: str
    """the path the document was loaded from, as given"""
    format: str
    """``"pdf"``, ``"text"``, ``"markdown"`` or ``"epub"``"""
    page_kind: PageKind
    """what a page (and a cited "p. N") of this document is"""
    title: str
    """title from the file's metadata, else the file name without suffix"""
    pages: tuple[DocPage, ...]
    """the selected pages in document order, empty ones included"""
    text: str
    """the text of the pages that have text, joined by :data:`PAGE_SEPARATOR`"""
    page_count: int
    """number of pages in the whole source, before any ``pages=`` selection"""
    warnings: tuple[str, ...] = ()
    """one line each: pages skipped or without a text layer, encoding guesses, repairs"""
    _ends: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ends", tuple(page.end for page in self.pages))

    def page_at(self, offset: int) -> DocPage:
        """The page holding character ``offset`` of :attr:`text`.

        A separator between two pages belongs to the next page with text; offsets at or
        past the end belong to the last page with text.

        Args:
            offset (int): character offset into :attr:`text`.
        """
        index = bisect.bisect_right(self._ends, offset)
        if index >= len(self.pages):
            index = max(i for i, page in enumerate(self.pages) if page.end > page.start)
        return self.pages[index]

    def pages_between(self, start: int, end: int) -> tuple[DocPage, ...]:
        """The pages with text that overlap the characters ``[start, end)`` of :attr:`text`."""
        first = self.page_at(start).number
        last = self.page_at(max(start, end - 1)).number
        return tuple(p for p in self.pages if first <= p.number <= last and p.end > p.start)


def build_document(
    source: str,
    format: str,
    page_kind: PageKind,
    title: str,
    raw_pages: Iterable[RawPage],
    page_count: int,
    warnings: Iterable[str] = (),
) -> Document:
    """Assemble a :class:`Document`, joining page texts and recording their offsets."""
    parts: list[str] = []
    pages: list[DocPage] = []
    cursor = 0
    for raw in raw_pages:
        if raw.text and parts:
            parts.append(PAGE_SEPARATOR)
            cursor += len(PAGE_SEPARATOR)
        start = cursor
        if raw.text:
            parts.append(raw.text)
            cursor += len(raw.text)
        pages.append(DocPage(raw.number, raw.label, raw.text, start, cursor))
    return Document(
        source=source,
        format=format,
        page_kind=page_kind,
        title=title,
        pages=tuple(pages),
        text="".join(parts),
        page_count=page_count,
        warnings=tuple(warnings),
    )
