"""The citation check where the answer gives it little to go on: an answer that is only page markers is checked
with the question's key words, a cited page past the document's end is flagged with its page count, and an answer
no page bears out is marked unsupported (:attr:`CitationCheck.supported`)."""

import pytest

from locks_chat.citations import check_citations
from locks_chat.ingest import load_document
from locks_chat.ingest.document import PageKind, RawPage, build_document
from tests.support.ingest_samples import text_pdf, write

PAGES = [
    "The harbour of Vellmar holds twelve fishing boats and a small customs house.",
    "The pier broke in the winter storms.",
    "The lighthouse keeper is Ann Marsh. She keeps the lamp burning through the night.",
]
QUESTION = "On which page is the lighthouse keeper Ann Marsh mentioned? Cite it."


def make_doc(texts=PAGES, first=1, page_count=None):
    raw = [RawPage(first + i, str(first + i), text) for i, text in enumerate(texts)]
    return build_document("book.txt", "text", PageKind.FORM_FEED, "Book", raw, page_count or len(raw))


@pytest.mark.parametrize("answer", ["[p. 1]", "p. 1", "(page 1)", "It is on page 1."], ids=str)
def test_a_marker_only_answer_is_checked_with_the_question(answer):
    check = check_citations(answer, make_doc(), QUESTION)
    [citation] = check.citations
    assert citation["verified"] is False and citation["checked_with"] == "question"
    assert citation["found_on"] == {"page": "3", "physical": 3}
    assert check.text == "p. 1 cited; the question's key words are on p. 3"
    assert check.supported is True, "the document holds what was asked, on another page"


def test_a_marker_only_answer_on_the_right_page_holds_the_question():
    check = check_citations("[p. 3]", make_doc(), QUESTION)
    assert check.citations[0]["verified"] is True and check.text == "p. 3 holds the question's key words"


def test_without_the_question_a_marker_only_answer_stays_unchecked():
    check = check_citations("[p. 1]", make_doc())
    assert check.citations[0]["verified"] is None and "checked_with" not in check.citations[0]
    assert check.text == "p. 1 not checked (no key words before it)" and check.supported is None


def test_an_answer_with_its_own_words_is_not_checked_with_the_question():
    check = check_citations("The harbour holds twelve boats (p. 1).", make_doc(), QUESTION)
    assert check.citations[0]["verified"] is True and "checked_with" not in check.citations[0]


def test_a_marker_only_answer_to_a_question_no_page_holds():
    check = check_citations("[p. 2]", make_doc(), "Which page names the queen of Bergen, Ingrid Falk?")
    assert check.citations[0]["found_on"] is None
    assert check.text == "p. 2 cited; no page holds the question's key words" and check.supported is False


def test_a_page_past_the_end_of_a_ten_page_pdf_is_flagged(tmp_path):
    pages = [f"Page {n} tells of the harbour." for n in range(1, 10)] + ["The keeper Ann Marsh lights the lamp."]
    document = load_document(write(tmp_path, "ten.pdf", text_pdf(pages)))
    check = check_citations("[p. 12]", document, "Where is the keeper Ann Marsh mentioned?")
    [citation] = check.citations
    assert citation["physical"] is None and citation["found_on"] == {"page": "10", "physical": 10}
    assert check.text == "p. 12 cited; the document has 10 pages; the question's key words are on p. 10"


def test_a_page_of_the_document_outside_the_selected_range_is_not_past_its_end():
    selected = make_doc(PAGES, first=1, page_count=10)  # pages 1-3 of a 10-page document
    assert check_citations("The keeper is Ann Marsh (p. 9).", selected).text == (
        "p. 9 cited (not in the selected pages); the text is on p. 3")
    assert check_citations("The keeper is Ann Marsh (p. 11).", selected).text == (
        "p. 11 cited; the document has 10 pages; the text is on p. 3")


@pytest.mark.parametrize(
    "answer,supported",
    [
        ("The keeper is Ann Marsh (p. 3).", True),
        ("The keeper is Ann Marsh (p. 1).", True),  # wrong page, but the text is in the document
        ("The keeper is Ann Marsh.", True),  # no citation: the app found the page
        ("The keeper is Ingrid Falk of Bergen (p. 3).", False),
        ("The keeper is Ingrid Falk of Bergen.", False),
        ("The keeper is Ann Marsh (p. 3). Her brother is Olaf Berg, a sailor (p. 3).", False),
        ("It is.", None),
    ],
    ids=["verified", "wrong_page", "proposed", "cited_nowhere", "uncited_nowhere", "one_claim_nowhere", "no_words"],
)
def test_supported_says_whether_every_claim_is_on_some_page(answer, supported):
    assert check_citations(answer, make_doc(), "Who is the keeper?").supported is supported


@pytest.mark.parametrize("supported", [False, True, None], ids=["unsupported", "supported", "unchecked"])
def test_the_transcript_marks_an_unsupported_answer(supported):
    from locks_chat.citations import UNSUPPORTED_TEXT
    from locks_chat.sessions import SessionInfo, Turn
    from locks_chat.transcript import render_transcript

    session = SessionInfo(1, "book.txt", "0" * 64, "Book", None, 0.0)
    turn = Turn(1, "Who is the keeper?", "Olaf Berg (p. 2).", "done", [], {"supported": supported})
    text = render_transcript(session, [turn])
    assert (f"Olaf Berg (p. 2).\n\n**{UNSUPPORTED_TEXT}**" in text) is (supported is False)
