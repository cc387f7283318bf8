"""Ingestion: PDF, EPUB, plain text and Markdown into pages of normalized text.

``load_document(path, password=None, pages=None, progress=None)`` returns a
:class:`Document` whose pages keep their printed label and physical number, with
character offsets into the document's full text so token offsets map back to pages.
"""

from locks_chat.ingest.document import DocPage, Document, PageKind
from locks_chat.ingest.load import load_document, load_document_bytes
from locks_chat.ingest.pagerange import parse_page_range
from locks_chat.ingest.progress import ProgressCallback, rich_progress

__all__ = [
    "DocPage", "Document", "PageKind", "ProgressCallback", "load_document", "load_document_bytes", "rich_progress",
    "parse_page_range",
]
