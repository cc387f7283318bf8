"""``locks_bench.doc_questions``: the generated documents of ``samples/bench_builtin_models.py`` hold each needle
once, as a paragraph at its depth, on a page the app's paging finds; answers are scored on the value."""

from __future__ import annotations

import pytest

from locks_bench.doc_questions import Needle, build_docs, insert_needles, is_right, make_needle, needle_page
from locks_chat.ingest import load_document_bytes

SMALL_PLAN = {1500: ((0.1, "code"), (0.5, "followup"), (0.9, "name")), 900: ((0.3, "cite"),)}


@pytest.fixture
def book(tmp_path):
    """A book of numbered paragraphs (so a position in the text names its paragraph)."""
    path = tmp_path / "book.txt"
    path.write_text("\n\n".join(f"Paragraph {i} tells of the weather and the sea." * 3 for i in range(2000)))
    return path


def test_documents_hold_each_needle_once_in_depth_order(book):
    docs = build_docs([book], SMALL_PLAN, seed=3)
    assert [d.tokens for d in docs] == [1500, 900] and build_docs([book], SMALL_PLAN, seed=3) == docs
    for doc in docs:
        at = [doc.text.index(n.fact) for n in doc.needles]
        assert all(doc.text.count(n.fact) == 1 for n in doc.needles) and at == sorted(at)
        for n, pos in zip(doc.needles, at):
            assert abs(pos / len(doc.text) - n.depth) < 0.05
            assert doc.text[pos - 2:pos] == "\n\n" and doc.text[pos + len(n.fact)] == "\n"
    places = [n.fact.split(" is ")[0] for d in docs for n in d.needles]
    assert len(set(places)) == len(places)


def test_needle_page_is_the_page_the_app_puts_it_on(book):
    doc = build_docs([book], {4000: ((0.2, "code"), (0.8, "name"))}, seed=1)[0]
    document = load_document_bytes(doc.text.encode(), "doc.txt")
    pages = [needle_page(document, n) for n in doc.needles]
    assert None not in pages and pages[0] != pages[1]
    for n, label in zip(doc.needles, pages):
        page = next(p for p in document.pages if p.label == label)
        assert n.value in page.text
    assert needle_page(document, Needle(0.5, "code", "Not in the text.", "?", "0000-000")) is None


def test_a_verse_text_takes_a_line_break_when_no_paragraph_is_near():
    verse = "\n".join(f"line {i} of the poem" for i in range(400))
    needle = Needle(0.5, "code", "The code is 1234-567.", "?", "1234-567")
    text = insert_needles(verse, [needle])
    at = text.index(needle.fact)
    assert abs(at / len(text) - 0.5) < 0.02 and text[at - 2:at] == "\n\n"


@pytest.mark.parametrize(
    "answer, value, right",
    [("The combination is 7314-582 (p. 3).", "7314-582", True), ("It is 7314 582.", "7314-582", True),
     ("It is 7314-58.", "7314-582", False), ("It is 17314-5829.", "7314-582", False),
     ("The keeper was Ysolde MARRICK.", "Marrick", True), ("The Marricks kept it.", "Marrick", False)],
    ids=["code", "code_spaced", "code_short", "code_inside_longer", "name_case", "name_not_a_word"],
)
def test_is_right(answer, value, right):
    assert is_right(answer, value) is right


def test_followup_needle_asks_for_the_chooser():
    import random

    n = make_needle(0.7, "followup", "Tamsel chapel", "Oswin", "Ormerod", random.Random(0))
    assert n.value in n.fact and n.follow_value == "Ormerod" and n.follow_up == "Who chose that code?"
    assert make_needle(0.1, "founder", "Tamsel chapel", "Oswin", "Ormerod", random.Random(0)).value == "Ormerod"


def test_no_two_facts_of_a_document_are_alike():
    from locks_bench.doc_questions import PLAN

    for needles in PLAN.values():
        kinds = [kind for _, kind in needles]
        assert len(set(kinds)) == len(kinds)
