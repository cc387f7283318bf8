"""Where the model looked: the footer and ``--json`` name the five most-read document pages with their shares of
the KV read in the document, not every page some step touched (``locks_chat.reading``)."""

import json

import pytest
from typer.testing import CliRunner

import locks_chat.engine_client
from locks_chat.cli import app
from locks_chat.ingest.document import PageKind, RawPage, build_document
from locks_chat.prompt import build_prompt
from locks_chat.reading import MOST_READ, ReadingLog, most_read_text
from tests.support.fakes import FakeEngine, WordTokenizer, step_record

runner = CliRunner()
TEXTS = [" ".join([f"w{n}"] * 60) for n in range(10)]
"""ten pages of 60 one-token words: each page's tokens are a few whole 16-token KV pages"""


def prompt_of(texts=TEXTS):
    raw = [RawPage(i + 1, str(i + 1), text) for i, text in enumerate(texts)]
    document = build_document("book.txt", "text", PageKind.FORM_FEED, "Book", raw, len(raw))
    return build_prompt(WordTokenizer(), document, ["q"])


def bins_of(prompt, number):
    """The 16-token KV pages wholly inside document page ``number``."""
    index = number - 1
    start = prompt.page_token_starts[index]
    end = prompt.page_token_starts[index + 1] if index + 1 < len(prompt.pages) else prompt.document_token_range[1]
    return list(range(-(-start // 16), end // 16))


def steps_reading(prompt, plan):
    """A log of one step per entry of ``plan``: each a list of pages read (every KV page inside them)."""
    log = ReadingLog()
    for pages in plan:
        log.add(step_record(2000, [b for n in pages for b in bins_of(prompt, n)], bins=256), prompt)
    return log


def test_the_most_read_pages_are_named_with_their_shares():
    prompt = prompt_of()
    # page 7 in every step, page 2 in half of them, each of the others once: ten pages touched
    plan = [[7, 2, 1], [7, 2, 3], [7, 4], [7, 5], [7, 2, 6], [7, 8], [7, 2, 9], [7, 10]]
    summary = steps_reading(prompt, plan).summary()
    named = summary["document_pages_read"]
    assert len(named) == MOST_READ == 5 and summary["document_pages_touched"] == 10
    assert [p["page"] for p in named[:2]] == ["7", "2"] and [p["steps"] for p in named[:2]] == [8, 4]
    sizes = {n: len(bins_of(prompt, n)) for n in range(1, 11)}
    total = sum(sizes[n] for pages in plan for n in pages)
    assert named[0]["share"] == pytest.approx(8 * sizes[7] / total, abs=1e-3)
    assert named[0]["share"] > named[1]["share"] > named[2]["share"] >= named[4]["share"]
    assert sum(p["share"] for p in named) + summary["document_pages_rest_share"] == pytest.approx(1, abs=2e-3)
    text = most_read_text(summary)
    assert text.startswith(f"p. 7 {named[0]['share']:.0%}, p. 2 {named[1]['share']:.0%}, ")
    assert text.endswith(f"(+5 more pages, {summary['document_pages_rest_share']:.0%})")


def test_a_bin_across_a_page_break_is_split_by_tokens():
    prompt = prompt_of(TEXTS[:2])
    start = prompt.page_token_starts[1]
    shared = start // 16  # the KV page holding the end of page 1 and the start of page 2
    log = ReadingLog()
    log.add(step_record(2000, [shared], bins=256), prompt)
    [first, second] = sorted(log.summary()["document_pages_read"], key=lambda p: p["physical"])
    assert first["share"] == pytest.approx((start - shared * 16) / 16, abs=1e-3)
    assert first["share"] + second["share"] == pytest.approx(1, abs=1e-3)


def test_saved_summaries_without_shares_still_read():
    assert most_read_text({"document_pages_read": [{"page": "3", "steps": 2}]}) == "p. 3"
    assert most_read_text({"document_pages_read": []}) == "-"


def test_the_footer_and_json_name_the_top_pages(tmp_path, monkeypatch):
    book = tmp_path / "book.txt"
    book.write_text("\f".join(TEXTS), encoding="utf-8")
    prompt = prompt_of()
    plan = [[7, 2, 1], [7, 2, 3], [7, 4], [7, 5], [7, 2, 6], [7, 8], [7, 2, 9], [7, 10]]
    engine = FakeEngine(answer="a b c d e f g h",
                        bins_per_step=[[b for n in pages for b in bins_of(prompt, n)] for pages in plan])
    monkeypatch.setattr(locks_chat.engine_client, "open_tokenizer", lambda *args, **kwargs: None)
    monkeypatch.setattr(locks_chat.engine_client, "open_engine", lambda *args, **kwargs: engine)
    monkeypatch.setattr("tests.support.fakes.step_record",
                        lambda seq_len, bins, **kw: step_record(seq_len, bins, bins=256))
    result = runner.invoke(app, ["ask", str(book), "q"])
    assert result.exit_code == 0, result.output
    assert "most-read document pages: p. 7 " in result.stderr and "(+5 more pages, " in result.stderr
    assert "p. 10" not in result.stderr.split("most-read document pages:")[1].split("·")[0]
    stats = json.loads(runner.invoke(app, ["ask", str(book), "q", "--json"]).stdout)["stats"]
    assert [p["page"] for p in stats["document_pages_read"]][:2] == ["7", "2"]
    assert len(stats["document_pages_read"]) == 5 and stats["document_pages_touched"] == 10
