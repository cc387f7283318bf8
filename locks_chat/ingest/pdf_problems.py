"""What went wrong reading a PDF, said with its true cause and its page (``locks_chat.ingest.pdf``).

pypdf logs what it repairs or gives up on instead of raising. Its messages are collected with the page being read
when they came (:class:`PdfProblems`): those of the file's structure (while opening it) become one warning "damaged
PDF structure repaired by the reader"; those of a page name the page. A page that pypdf stopped drawing because it
invokes more form XObjects than pypdf's limit (``xform_maximum_invocations_per_extraction``, 5,000 in pypdf 7:
``pypdf/_page.py``) is expensive to draw (thousands of small images or shapes), not damaged: its warning says so.

A truncated PDF read from the objects that remain can keep a page's content stream, whose text-showing operators
hold the text, and lose the fonts (or the whole ``/Resources``) it names: pypdf then extracts nothing from it.
:func:`text_without_fonts` finds such pages, so the message says the fonts were lost, not the text.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from locks_chat.errors import shorten_reason

_FORM_LIMIT = re.compile(r"Exceeded (\d+) form XObject invocations")
_SHOWS_TEXT = re.compile(rb"(?:\)|>|\])\s*(?:Tj|TJ|'|\")")
"""a text-showing operator after its string or array operand (PDF 32000-1, 9.4.3)"""


class Problem(NamedTuple):
    """One of pypdf's log messages and the page being read when it came."""

    page: int | None
    """0-based page index; ``None``: while opening the file (its structure)"""
    message: str


KEPT_PROBLEMS = 100
"""distinct messages kept (a hostile file makes pypdf log 100,000 of them; the warnings show three of each kind)"""


class PdfProblems:
    """pypdf's log messages, each once per page, with :attr:`page` set by the caller while it reads a page; the
    first :data:`KEPT_PROBLEMS` distinct ones are kept, in constant time per message."""

    def __init__(self) -> None:
        self.page: int | None = None
        self.items: list[Problem] = []
        self._seen: set[Problem] = set()

    def add(self, message: str) -> None:
        problem = Problem(self.page, message)
        if len(self.items) < KEPT_PROBLEMS and problem not in self._seen:
            self._seen.add(problem)
            self.items.append(problem)

    @contextlib.contextmanager
    def reading(self, index: int) -> Iterator[None]:
        """Messages logged in this block are page ``index``'s."""
        self.page = index
        try:
            yield
        finally:
            self.page = None

    def warnings(self, name_pages) -> list[str]:
        """One line per cause: pages expensive to draw, pages whose content was repaired, the file's structure
        repaired; ``name_pages`` names a list of 0-based page indices (``"page 2"``, ``"pages 2-5"``)."""
        expensive: dict[int, int] = {}
        per_page: dict[int, list[str]] = {}
        structure: list[str] = []
        for page, message in self.items:
            limit = _FORM_LIMIT.search(message)
            if page is not None and limit:
                expensive[page] = int(limit.group(1))
            elif page is not None:
                per_page.setdefault(page, []).append(message)
            else:
                structure.append(message)
        lines = []
        for limit in sorted(set(expensive.values())):
            pages = sorted(p for p, n in expensive.items() if n == limit)
            lines.append(f"{name_pages(pages)}: expensive to draw (more than {limit:,} form XObjects, such as many "
                         "small images), read up to that many; text drawn after them is missing")
        for page, messages in per_page.items():
            lines.append(f"{name_pages([page])}: damaged content repaired by the reader: {_shown(messages)}")
        if structure:
            lines.insert(0, f"damaged PDF structure repaired by the reader: {_shown(structure)}")
        return lines


def _shown(messages: Sequence[str]) -> str:
    shown = "; ".join(plain_problem(p) for p in messages[:3])
    return shown + (f" (+{len(messages) - 3} more)" if len(messages) > 3 else "")


def plain_problem(message: str) -> str:
    """One of pypdf's log messages for a warning: an exception's repr (``PdfReadError("...")``) unwrapped to its
    text, the raw bytes and stream offsets it quotes cut off, at most 80 characters (cut at a word boundary)."""
    wrapped = re.fullmatch(r"\w+(?:Error|Exception|Warning)\(([\x22'])(.*)\1\)", message)
    text = wrapped.group(2) if wrapped else message
    plain = re.split(r"\s(?:b[\x22']|@\d)", text, maxsplit=1)[0].rstrip(" :,")  # no raw bytes or offsets
    return shorten_reason(plain if plain == text else plain + "...", 80)


@contextlib.contextmanager
def pypdf_log(problems: PdfProblems) -> Iterator[None]:
    """Collect pypdf's log messages into ``problems`` instead of printing them."""

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            problems.add(" ".join(record.getMessage().split()))

    logger = logging.getLogger("pypdf")
    handler = Collect(logging.WARNING)
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def text_without_fonts(reader, index: int) -> bool:
    """Whether page ``index`` shows text (its content stream has text-showing operators) but has no font to read
    it with (its ``/Resources`` or their ``/Font`` are missing: lost from a truncated file)."""
    from pypdf.generic import DictionaryObject

    try:
        page = reader.pages[index]
        contents = page.get_contents()
        data = contents.get_data() if contents is not None else b""
        if not _SHOWS_TEXT.search(data):
            return False
        resources = page.get("/Resources")
        resources = resources.get_object() if resources is not None else None
        fonts = resources.get("/Font") if isinstance(resources, DictionaryObject) else None
        fonts = fonts.get_object() if fonts is not None else None
        return not isinstance(fonts, DictionaryObject) or not any(
            isinstance(font.get_object(), DictionaryObject) for font in fonts.values())
    except Exception:  # noqa: BLE001 - a page too damaged to tell is not said to have lost its fonts
        return False
