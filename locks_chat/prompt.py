"""The prompt: the document with a page marker before each page, then the question; and the map from prompt
tokens back to document pages, through character offsets.

A KV page is ``LocksConfig.page_size`` consecutive prompt tokens (what LOCKS selects); a document page is a page
of the book. The marker ``[p. LABEL]`` before each page's text lets the model cite pages the way users look them
up, and the token offsets of the pages let the statistics say which book pages the model is reading.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from locks_chat.ingest import DocPage, Document

SYSTEM = (
    "You are a careful reader. Answer the user's question about the document using only the document, in one "
    "or two sentences. Cite the page of each fact as (p. N), where N is the number in the [p. N] marker that "
    "starts that page."
)


@dataclass(frozen=True)
class Prompt:
    """A tokenized prompt and where each document page's tokens lie in it."""

    token_ids: list[int]
    """Prompt tokens, chat template applied."""
    pages: tuple[DocPage, ...]
    """Document pages with text, in prompt order."""
    page_token_starts: tuple[int, ...]
    """Index of each page's first prompt token (its marker), ascending, one per entry of ``pages``."""
    document_token_range: tuple[int, int]
    """``[first, end)`` prompt tokens of the document (markers included)."""

    @property
    def document_tokens(self) -> int:
        return self.document_token_range[1] - self.document_token_range[0]

    @property
    def page_tokens(self) -> list[int]:
        """Tokens of each entry of ``pages`` (its marker included), in prompt order."""
        ends = (*self.page_token_starts[1:], self.document_token_range[1])
        return [end - start for start, end in zip(self.page_token_starts, ends)]

    def pages_in_tokens(self, start: int, end: int) -> list[DocPage]:
        """Document pages whose tokens overlap prompt tokens ``[start, end)``."""
        lo, hi = max(start, self.document_token_range[0]), min(end, self.document_token_range[1])
        if lo >= hi or not self.pages:
            return []
        first = max(0, bisect.bisect_right(self.page_token_starts, lo) - 1)
        last = max(0, bisect.bisect_right(self.page_token_starts, hi - 1) - 1)
        return list(self.pages[first : last + 1])


def document_block(document: Document) -> tuple[str, list[tuple[DocPage, int]]]:
    """The document as prompt text, and each page with text with the offset of its marker in that text."""
    parts, offsets, cursor = [], [], 0
    for page in document.pages:
        if not page.text:
            continue
        chunk = f"[p. {page.label}]\n{page.text}\n\n"
        offsets.append((page, cursor))
        parts.append(chunk)
        cursor += len(chunk)
    return "".join(parts), offsets


def build_prompt(tokenizer: Any, document: Document, questions: list[str], answers: list[str] = ()) -> Prompt:
    """Render the chat prompt and tokenize it with character offsets.

    The first user turn holds the document and the first question, so the document stays a fixed prefix
    of every later turn (prefix caching reuses its KV cache).

    Args:
        tokenizer: a Hugging Face fast tokenizer with a chat template (``return_offsets_mapping`` support).
        questions (list[str]): the user's questions, the last one to be answered now.
        answers (list[str]): the answers to the earlier questions (``len(questions) - 1`` of them).
    Returns:
        Prompt: token ids and the page-to-token map.
    """
    block, offsets = document_block(document)
    header = f"Document: {document.title}\n\n"
    assert len(answers) == len(questions) - 1, "one answer per earlier question"
    messages = [{"role": "system", "content": SYSTEM}]
    for turn, question in enumerate(questions):
        content = f"{header}{block}Question: {question}" if turn == 0 else question
        messages.append({"role": "user", "content": content})
        if turn < len(answers):
            messages.append({"role": "assistant", "content": answers[turn]})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    base = text.index(header + block) + len(header)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    token_ids, spans = list(encoded["input_ids"]), [start for start, _ in encoded["offset_mapping"]]
    starts = [max(0, bisect.bisect_right(spans, base + offset) - 1) for _, offset in offsets]
    doc_end = bisect.bisect_left(spans, base + len(block))
    first = starts[0] if starts else doc_end
    return Prompt(token_ids, tuple(page for page, _ in offsets), tuple(starts), (first, doc_end))
