"""Plain text and Markdown: the file's own pages if it has them, else fixed-size text pages.

Text files have no printed pages, so a cited "page" is defined here and kept stable:
- a file containing form feeds (``\\f``, as ``pr``, ``pdftotext`` and old e-texts write
  them) is split at them: page N is the text after the (N-1)th form feed
  (:attr:`PageKind.FORM_FEED`);
- otherwise the normalized text is cut into pages of at most :data:`TEXT_PAGE_CHARS`
  characters, each ending at the last paragraph break (blank line) in its second half,
  else the last line break, else the last space (:attr:`PageKind.TEXT_BLOCK`).
Pages are labelled "1", "2", ... and the label equals the physical number. Markdown is
paged the same way (headings are kept in the text, not used as pages). The same file
always gives the same pages.
"""

from __future__ import annotations

from pathlib import Path

from locks_chat.errors import NoTextError
from locks_chat.ingest.document import Document, PageKind, RawPage, build_document
from locks_chat.ingest.encoding import decode_text
from locks_chat.ingest.normalize import normalize_text, one_line
from locks_chat.ingest.pagerange import parse_page_range

TEXT_PAGE_CHARS = 3000
"""largest fixed-size text page, in characters; pages are at least half of it, but the last"""


def read_text(data: bytes, source: str, *, markdown: bool = False, pages: str | None = None) -> Document:
    """Decode, normalize and page a plain text or Markdown file.

    Args:
        data (bytes): the file's content, in any encoding (non-UTF-8 gives a warning).
        source (str): the file name, for messages and the title.
        markdown (bool): the file is Markdown (recorded in :attr:`Document.format`).
        pages (str | None): a ``--pages`` selector (:mod:`.pagerange`); ``None`` for all.

    Raises:
        DocumentError: the bytes are not text.
        NoTextError: the file (or the selection) is empty.
        PageRangeError: ``pages`` is malformed or out of range.
    """
    text, warnings = decode_text(data, source)
    if "\f" in text:
        texts = [normalize_text(part) for part in text.split("\f")]
        if len(texts) > 1 and not texts[-1]:
            texts.pop()
        kind = PageKind.FORM_FEED
    else:
        texts = split_text_pages(normalize_text(text))
        kind = PageKind.TEXT_BLOCK
    if not any(texts):
        raise NoTextError(f"{source}: the file has no text; pass another file")
    labels = [str(i + 1) for i in range(len(texts))]
    selected = parse_page_range(pages, labels)
    raw = [RawPage(i + 1, labels[i], texts[i]) for i in selected]
    if not any(page.text for page in raw):
        raise NoTextError(f"pages {pages!r} of {source}: these pages are empty; choose other --pages")
    title = _title(texts, source, markdown)
    return build_document(source, "markdown" if markdown else "text", kind, title, raw, len(texts), warnings)


def split_text_pages(text: str, size: int = TEXT_PAGE_CHARS) -> list[str]:
    """Cut normalized text into pages of at most ``size`` characters at natural breaks.

    Args:
        text (str): normalized text (paragraphs separated by one blank line).
        size (int): the largest page, in characters.
    """
    pages: list[str] = []
    start, n = 0, len(text)
    while start < n:
        if n - start <= size:
            cut = n
        else:
            low, high = start + size // 2, start + size
            cut = max(text.rfind("\n\n", low, high), -1)
            for sep in ("\n", " "):
                if cut < 0:
                    cut = text.rfind(sep, low, high)
            if cut < 0:
                cut = high
        page = text[start:cut].strip()
        if page:
            pages.append(page)
        start = cut
        while start < n and text[start].isspace():
            start += 1
    return pages


def _title(texts: list[str], source: str, markdown: bool) -> str:
    if markdown:
        for line in next((t for t in texts if t), "").splitlines():
            if line.startswith("# "):
                return line[2:].strip()
    return one_line(Path(source).stem)
