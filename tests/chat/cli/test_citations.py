"""The citation check against documents the tests build: right, wrong and missing citations, facts across a page
break, quotes, and printed labels against physical pages (a real PDF with ``/PageLabels``)."""

import pytest

from locks_chat.citations import BREAK_WORDS, VERIFY_SHARE, check_citations
from locks_chat.ingest import load_document
from locks_chat.ingest.document import PageKind, RawPage, build_document
from locks_chat.key_words import NAME, NUMBER, QUOTE, WORD, key_items, words
from tests.support.ingest_samples import text_pdf, with_page_labels, write

PAGES = [
    "The harbour of Vellmar holds twelve fishing boats and a small customs house.",
    "The pier broke in the winter storms, and the harbour log reads: storms broke the pier.",
    "The lighthouse keeper is Ann Marsh. She keeps the lamp burning through the night.",
    "The library keeps the old charts of the coast. In 1887 the survey ship Heron mapped",
    "the northern reefs and lost her anchor near Bergen. The charts were redrawn afterwards.",
]
"""five pages; the survey fact runs from the end of page 4 onto page 5"""


def make_doc(texts=PAGES, labels=None):
    labels = labels or [str(i + 1) for i in range(len(texts))]
    raw = [RawPage(i + 1, labels[i], text) for i, text in enumerate(texts)]
    return build_document("book.txt", "text", PageKind.FORM_FEED, "Book", raw, len(raw))


def only(check):
    [citation] = check.citations
    return citation


def test_right_citation_is_verified():
    check = check_citations("The lighthouse keeper is **Ann Marsh** (p. 3).", make_doc())
    assert only(check) == {"page": "3", "physical": 3, "verified": True, "found_on": None, "score": 1.0}
    assert check.proposed is None and check.text == "p. 3 verified"


def test_wrong_citation_names_the_page_that_holds_the_text():
    check = check_citations("Vellmar's harbour holds 12 fishing boats (p. 3).", make_doc())
    citation = only(check)
    assert citation["verified"] is False and citation["score"] < VERIFY_SHARE
    assert citation["found_on"] == {"page": "1", "physical": 1}
    assert check.text == "p. 3 cited; the text is on p. 1"


def test_a_citation_no_page_bears_out_is_said_plainly():
    check = check_citations("The moon is made of green cheese (p. 2).", make_doc())
    assert only(check)["verified"] is False and only(check)["found_on"] is None
    assert check.text == "p. 2 cited; no page holds the answer's key words"


def test_a_page_the_document_does_not_have():
    check = check_citations("The keeper is Ann Marsh (p. 9).", make_doc())
    assert only(check) == {"page": "9", "physical": None, "verified": False,
                           "found_on": {"page": "3", "physical": 3}, "score": 0.0}
    assert check.text == "p. 9 cited; the document has 5 pages; the text is on p. 3"


def test_no_citation_gets_the_best_page_found_by_the_app():
    check = check_citations("The keeper of the lighthouse is Ann Marsh.", make_doc())
    assert check.citations == []
    assert check.proposed == {"page": "3", "physical": 3, "found_by": "app", "score": 1.0}
    assert check.text == "no page cited; the app found the text on p. 3"


def test_no_citation_and_no_page_holds_it():
    check = check_citations("Nobody knows who painted the Mona Lisa.", make_doc())
    assert check.proposed is None and check.nowhere
    assert check.text == "no page cited, and no page holds the answer's key words"


def test_an_answer_of_stop_words_is_not_checked():
    assert check_citations("It is.", make_doc()).text == ""
    check = check_citations("Yes (p. 2).", make_doc())
    assert only(check)["verified"] is None and check.text == "p. 2 not checked (no key words before it)"


@pytest.mark.parametrize("cited", ["4", "5"])
def test_a_fact_across_a_page_break_verifies_either_page(cited):
    answer = f"In 1887 the ship Heron lost her anchor near Bergen (p. {cited})."
    doc = make_doc()
    check = check_citations(answer, doc)
    assert only(check)["verified"] is True
    # neither page holds it alone: the break is what verifies it
    for page in ("4", "5"):
        other = check_citations(answer, make_doc([p if i + 1 == int(page) else "" for i, p in enumerate(PAGES)]))
        assert only(other)["verified"] is not True
    assert check_citations(answer.replace(f" (p. {cited})", ""), doc).proposed == {
        "page": "4", "physical": 4, "through": "5", "found_by": "app", "score": 1.0,
    }
    assert check_citations(answer.replace(f"p. {cited}", "p. 2"), doc).text == "p. 2 cited; the text is on pp. 4-5"


def test_a_fact_wholly_before_a_break_is_not_the_next_pages():
    # page 3 ends with the keeper; page 4 starts with words of the answer ("keeps", "the") but not the fact
    check = check_citations("Ann Marsh keeps the lamp burning through the night (p. 4).", make_doc())
    assert only(check)["found_on"] == {"page": "3", "physical": 3}


def test_the_break_window_is_bounded():
    far = ["Heron " + "filler words here " * BREAK_WORDS, "lost her anchor near Bergen"]
    check = check_citations("In 1887 Heron lost her anchor near Bergen (p. 1).", make_doc(far))
    assert only(check)["verified"] is False


def test_each_citation_vouches_for_its_own_clause():
    answer = ("The keeper is Ann Marsh (p. 3), the harbour holds twelve boats (p. 1), and the charts were redrawn "
              "(p. 1).")
    check = check_citations(answer, make_doc())
    assert [(c["page"], c["verified"]) for c in check.citations] == [("3", True), ("1", False)]
    assert check.citations[1]["found_on"] == {"page": "5", "physical": 5}  # a page cited twice keeps its worse verdict
    assert check.text == "p. 3 verified · p. 1 cited; the text is on p. 5"


@pytest.mark.parametrize(
    "answer",
    ["Ann Marsh is the keeper. (p. 3)", "On p. 3, the keeper is Ann Marsh.", "The keeper is Ann Marsh (pp. 3, p. 3).",
     "The keeper is Ann Marsh (p. 3; page 3)."],
    ids=["after_the_sentence", "before_the_claim", "two_markers", "two_markers_semicolon"],
)
def test_where_the_marker_stands(answer):
    assert [c["verified"] for c in check_citations(answer, make_doc()).citations] == [True]


def test_a_quote_must_be_on_the_page_word_for_word():
    # page 2 holds every word of both answers, the quoted run only in the first
    assert only(check_citations('The log reads "storms broke the pier" (p. 2).', make_doc()))["verified"] is True
    check = check_citations('The log reads "the pier storms broke" (p. 2).', make_doc())
    assert only(check)["verified"] is False and only(check)["found_on"] is None


@pytest.fixture
def labelled(tmp_path):
    """A PDF printed i-iii then 1-5: label "2" is the file's 5th page, label "5" its 8th."""
    front = ["Title page", "Preface by the editor Ann Marsh", "Contents"]
    body = [f"Chapter page {n}. The harbour count on this page is {n * 7} boats." for n in range(1, 6)]
    data = with_page_labels(text_pdf(front + body), [(0, 2, "/r", 1), (3, 7, "/D", 1)])
    return load_document(write(tmp_path, "book.pdf", data))


def test_printed_labels_are_checked_against_their_pages(labelled):
    check = check_citations("The harbour count is 14 boats (p. 2); the editor is Ann Marsh (p. ii).", labelled)
    assert [(c["page"], c["physical"], c["verified"]) for c in check.citations] == [("2", 5, True), ("ii", 2, True)]


def test_a_physical_number_cited_as_a_label_is_found_on_its_printed_page(labelled):
    # the model counted the file's pages: the 5th page of the file is printed "2"; label 5 is the 8th
    check = check_citations("The harbour count is 14 boats (p. 5).", labelled)
    assert only(check)["physical"] == 8 and only(check)["found_on"] == {"page": "2", "physical": 5}
    assert check.text == "p. 5 cited; the text is on p. 2 (page 5 of the file)"


def test_key_items_weigh_numbers_names_and_quotes():
    answer = 'In 1,887 the keeper\'s boats met "the Heron" in March. Ships sail.'
    items = {(i.text, i.weight) for i in key_items(answer)}
    assert items == {("1887", NUMBER), ("keeper", WORD), ("boat", WORD), ("met", WORD), ("the heron", QUOTE),
                     ("heron", NAME), ("march", NAME), ("ship", WORD), ("sail", WORD)}


def test_page_words_and_answer_words_normalize_alike():
    assert words("The Keepers’ ﬁshing-boats sailed; twelve of 1,200.") == [
        "the", "keeper", "fish", "boat", "sail", "12", "of", "1200"]
    assert [i.text for i in key_items("Twelve fishing boats sail")] == ["12", "fish", "boat", "sail"]
