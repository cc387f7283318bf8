"""``locks-chat ask`` with the citation check: the line after the answer, the ``--json`` fields (``verified``,
``found_on``, ``proposed_page``, ``citation_check``) and the ingestion ``warnings``, through CliRunner with a
scripted engine."""

import json

import pytest
from typer.testing import CliRunner

import locks_chat.engine_client
from locks_chat.citations import UNSUPPORTED_TEXT
from locks_chat.cli import app
from tests.support.fakes import FakeEngine
from tests.support.ingest_samples import text_pdf, with_page_labels, write

runner = CliRunner()

BOOK = "\f".join([
    "The keeper's password is BLUE. The lighthouse stands on the northern cape.",
    "The harbour holds twelve boats. " * 10,
    "The winter storms came in November. " * 10,
])
"""three form-feed pages"""


@pytest.fixture
def book(tmp_path):
    return write(tmp_path, "book.txt", BOOK.encode())


@pytest.fixture
def engine(monkeypatch):
    fake = FakeEngine()
    monkeypatch.setattr(locks_chat.engine_client, "open_tokenizer", lambda *args, **kwargs: None)
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", lambda *args, **kwargs: fake)
    return fake


def ask_json(path, engine, answer: str) -> dict:
    engine.answer = answer
    result = runner.invoke(app, ["ask", str(path), "What is the password?", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    "answer,line",
    [
        ("The password is BLUE (p. 1).", "citations: p. 1 verified"),
        ("The password is BLUE (p. 2).", "citations: p. 2 cited; the text is on p. 1"),
        ("The password is BLUE.", "citations: no page cited; the app found the text on p. 1"),
        ("The password is CRIMSON (p. 3).", "citations: p. 3 cited; no page holds the answer's key words"),
    ],
    ids=["right", "wrong", "none", "nowhere"],
)
def test_the_check_is_a_line_after_the_answer(book, engine, answer, line):
    engine.answer = answer
    result = runner.invoke(app, ["ask", str(book), "What is the password?"])
    assert result.exit_code == 0, result.output
    expected = answer if "no page holds" not in line else f"{answer}\n{UNSUPPORTED_TEXT}"
    assert result.stdout.strip() == expected, \
        "stdout keeps the answer, and says right under it when no page bears it out"
    lines = result.stderr.splitlines()
    assert line in lines and lines.index(line) < next(i for i, s in enumerate(lines) if "TPOT" in s)


def test_json_right_citation(book, engine):
    data = ask_json(book, engine, "The password is BLUE (p. 1).")
    assert data["citations"] == [{"page": "1", "physical": 1, "verified": True, "found_on": None, "score": 1.0}]
    assert data["proposed_page"] is None and data["citation_check"] == "p. 1 verified" and data["supported"] is True


def test_json_wrong_citation(book, engine):
    data = ask_json(book, engine, "The password is BLUE (p. 2).")
    [citation] = data["citations"]
    assert citation["verified"] is False and citation["found_on"] == {"page": "1", "physical": 1}
    assert data["citation_check"] == "p. 2 cited; the text is on p. 1"


def test_json_no_citation_proposes_a_page(book, engine):
    data = ask_json(book, engine, "It came in November with the winter storms.")
    assert data["citations"] == []
    assert data["proposed_page"] == {"page": "3", "physical": 3, "found_by": "app", "score": 1.0}


def test_json_printed_labels_and_warnings(tmp_path, engine):
    pages = ["Title", "Preface", "The password is BLUE.", None, "The storms came in November.", "scan"]
    data = with_page_labels(text_pdf(pages, image_pages=[5]), [(0, 1, "/r", 1), (2, 5, "/D", 1)])
    path = write(tmp_path, "book.pdf", data)
    out = ask_json(path, engine, "The password is BLUE (p. 3); the storms came in November (p. i).")
    assert out["warnings"] == ["page 6 (printed 4): no text layer, OCR needed"]
    assert [(c["page"], c["physical"], c["verified"], c["found_on"]) for c in out["citations"]] == [
        ("3", 5, False, {"page": "1", "physical": 3}), ("i", 1, False, {"page": "3", "physical": 5}),
    ]
    assert out["citation_check"] == ("p. 3 cited; the text is on p. 1 (page 3 of the file) · p. i cited; the text "
                                     "is on p. 3 (page 5 of the file)")


@pytest.mark.parametrize(
    "answer,supported",
    [("The password is CRIMSON, kept by Olaf Berg (p. 3).", False), ("The password is CRIMSON, kept by Olaf Berg.", False),
     ("The password is BLUE (p. 2).", True), ("Yes.", None)],
    ids=["cited_nowhere", "uncited_nowhere", "found_elsewhere", "nothing_to_check"],
)
def test_json_says_whether_the_answer_is_supported(book, engine, answer, supported):
    data = ask_json(book, engine, answer)
    assert data["supported"] is supported
    assert UNSUPPORTED_TEXT not in data["answer"], "the answer field stays the model's own text"


def test_a_marker_only_answer_is_checked_with_the_question(book, engine):
    engine.answer = "[p. 3]"
    result = runner.invoke(app, ["ask", str(book), "Which page gives the keeper's password? Cite it."])
    assert result.exit_code == 0, result.output
    assert "citations: p. 3 cited; the question's key words are on p. 1" in result.stderr.splitlines()
    data = ask_json(book, engine, "[p. 7]")
    assert data["citation_check"] == "p. 7 cited; the document has 3 pages; the question's key words are on p. 1"
