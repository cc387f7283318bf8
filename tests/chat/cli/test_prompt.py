"""Prompt building: page markers, the token-to-page map, context accounting, citations, reading stats."""

import pytest

from locks_chat.ask import ask, check_fits
from locks_chat.ingest.pagerange import parse_page_range
from locks_chat.citations import find_citations
from locks_chat.errors import Cancelled, ContextError
from locks_chat.ingest.document import PageKind, RawPage, build_document
from locks_chat.prompt import build_prompt
from tests.support.fakes import FakeEngine, WordTokenizer


def make_doc(texts, labels=None):
    labels = labels or [str(i + 1) for i in range(len(texts))]
    raw = [RawPage(i + 1, labels[i], t) for i, t in enumerate(texts)]
    return build_document("book.pdf", "pdf", PageKind.PDF, "Book", raw, len(raw))


def test_each_page_maps_back_from_its_tokens():
    doc = make_doc(["alpha beta gamma", "", "delta epsilon", "zeta eta theta iota"], ["i", "ii", "1", "2"])
    tok = WordTokenizer()
    prompt = build_prompt(tok, doc, ["Where is delta?"])
    assert [p.label for p in prompt.pages] == ["i", "1", "2"]  # the empty page has no tokens
    for page, start in zip(prompt.pages, prompt.page_token_starts):
        assert [p.label for p in prompt.pages_in_tokens(start, start + 1)] == [page.label]
    first, end = prompt.document_token_range
    assert prompt.pages_in_tokens(0, first) == []
    assert prompt.pages_in_tokens(end, len(prompt.token_ids)) == []
    assert [p.label for p in prompt.pages_in_tokens(first, end)] == ["i", "1", "2"]


def test_later_turns_keep_the_document_prefix():
    doc = make_doc(["alpha beta", "gamma delta"])
    one = build_prompt(WordTokenizer(), doc, ["q1"])
    two = build_prompt(WordTokenizer(), doc, ["q1", "q2"], ["a1"])
    assert two.token_ids[: one.document_token_range[1]] == one.token_ids[: one.document_token_range[1]]
    assert two.page_token_starts == one.page_token_starts


def test_a_document_too_long_is_refused_with_numbers_and_ways_out():
    doc = make_doc([" ".join(["word"] * 200)] * 10)
    prompt = build_prompt(WordTokenizer(), doc, ["q"])
    check_fits(prompt, doc, len(prompt.token_ids) + 256, 256)
    with pytest.raises(ContextError) as err:
        check_fits(prompt, doc, 2048, 256)
    message = str(err.value)
    assert "2,048-token context" in message and "--pages" in message and "--model" in message
    assert "--pages 1-" in message


def test_range_advice_uses_physical_numbers_for_hyphenated_labels():
    """A label with a hyphen cannot be written in a range: the advice names the file's first pages as ``#1-N``,
    which the page grammar reads as physical pages (a bare ``1-N`` would be the pages printed 1 to N)."""
    labels = ["T-1", "T-2", "i", "ii", "1", "2", "3", "4", "5", "6"]
    doc = make_doc([" ".join(["word"] * 200)] * 10, labels)
    prompt = build_prompt(WordTokenizer(), doc, ["q"])
    with pytest.raises(ContextError, match=r"--pages #1-\d\b") as err:
        check_fits(prompt, doc, 2048, 256)
    fit = int(err.value.message.split("--pages with about ")[1].split(" pages")[0])
    advice = err.value.message.split("e.g. --pages ")[1].split(")")[0]
    assert parse_page_range(advice, labels) == list(range(fit)), "the advice selects the first pages of the file"


@pytest.mark.parametrize("labels, advice", [(["1", "2", "3"], "--pages 1"), (["T-1", "T-2", "1"], "--pages #1")],
                         ids=["label", "hyphenated-label"])
def test_advice_for_one_page_names_that_page(labels, advice):
    """Not ``about 1 pages (e.g. --pages 1-1)``: one page, and a --pages value that selects it."""
    doc = make_doc([" ".join(["word"] * 300)] * 3, labels)
    prompt = build_prompt(WordTokenizer(), doc, ["q"])
    with pytest.raises(ContextError) as err:
        check_fits(prompt, doc, 1100, 256)
    assert f"pass --pages with about 1 page (e.g. {advice})," in err.value.message
    assert parse_page_range(advice.removeprefix("--pages "), labels) == [0]


def test_advice_counts_each_pages_tokens_not_the_average():
    """A long first page and short later ones: no prefix fits, the shorter pages do, and the advice says so
    (naming the shortest); when not even the shortest page fits, the largest --max-tokens that leaves room for
    it is given, and with it that page alone fits."""
    doc = make_doc([" ".join(["word"] * 900), " ".join(["word"] * 40), " ".join(["word"] * 60)])
    prompt = build_prompt(WordTokenizer(), doc, ["q"])
    with pytest.raises(ContextError, match=r"--pages with shorter pages than the first \(p\. 2 holds \d+ tokens"):
        check_fits(prompt, doc, 700, 256)
    with pytest.raises(ContextError, match=r"smaller --max-tokens and --pages with fewer pages \(at most \d+ tokens "
                                           r"of answer leave room for the shortest page, p\. 2\)") as err:
        check_fits(prompt, doc, 700, 600)
    most = int(err.value.message.split("at most ")[1].split(" ")[0])
    alone = make_doc([" ".join(["word"] * 40)])
    check_fits(build_prompt(WordTokenizer(), alone, ["q"]), alone, 700, most)
    assert "--pages with about" not in err.value.message, "no prefix of pages fits: none is proposed"


def test_citations_match_labels():
    doc = make_doc(["a", "b", "c"], ["iv", "1", "2"])
    found = find_citations("It says so (p. 1), also on p. iv and pp. 1-2; see page 9.", doc)
    assert found == [
        {"page": "1", "physical": 2}, {"page": "iv", "physical": 1}, {"page": "2", "physical": 3},
        {"page": "9", "physical": None},
    ]


@pytest.mark.parametrize(
    "answer",
    ["This page contains the preface.", "The page mentions Ann.", "Both pages mix prose and verse.",
     "The pages I read say so.", "The pageviews grew.", "See the pages (all of them).", "At 5 p.m. Ann left."],
    ids=["contains", "mentions", "mix", "pronoun-I", "pageviews", "no-label", "p.m."],
)
def test_a_word_after_page_is_no_citation(answer):
    doc = make_doc(["a", "b", "c", "d"], ["c", "m", "mix", "i"])
    assert find_citations(answer, doc) == []


def test_real_citations_next_to_words_that_look_like_roman_numerals():
    doc = make_doc(["a", "b", "c", "d", "e", "f"], ["iv", "v", "x", "1", "2", "12"])
    answer = ("This page contains the map (p. 12); the pages mix maps (pages iv-x) and the page mentions Ann on "
              "page 1, pp. 2–3, p. V and (p.12).")
    assert find_citations(answer, doc) == [
        {"page": "12", "physical": 6}, {"page": "iv", "physical": 1}, {"page": "x", "physical": 3},
        {"page": "1", "physical": 4}, {"page": "2", "physical": 5}, {"page": "3", "physical": None},
        {"page": "v", "physical": 2},
    ]


def test_ask_streams_and_maps_kv_pages_to_document_pages():
    doc = make_doc([" ".join(["word"] * 40), " ".join(["other"] * 40), " ".join(["third"] * 40)])
    prompt = build_prompt(WordTokenizer(), doc, ["q"])
    page2_bin = prompt.page_token_starts[1] // 16 + 1
    engine = FakeEngine(answer="It is BLUE (p. 2).", bins_per_step=[[0, page2_bin]])
    seen, steps = [], []
    result = ask(engine, doc, ["q"], on_text=seen.append, on_step=steps.append)
    assert "".join(seen) == result.answer == "It is BLUE (p. 2)."
    assert result.citations == [{"page": "2", "physical": 2, "verified": False, "found_on": None, "score": 0.0}]
    assert result.check.text == "p. 2 cited; no page holds the answer's key words"  # no page says BLUE
    assert result.generated_tokens == 5 and result.ttft_ms == pytest.approx(500)
    assert result.tpot_ms == pytest.approx(10)
    assert all([p.label for p in s.doc_pages] == ["2"] for s in steps)
    summary = result.reading.summary()
    assert summary["decode_steps"] == 5 and 0 < summary["kv_pages_read_fraction"] < 1
    assert summary["document_pages_read"] == [{"page": "2", "physical": 2, "share": 1.0, "steps": 5}]


def test_cancel_aborts_the_request():
    import threading

    doc = make_doc(["alpha"])
    engine = FakeEngine(answer="one two three")
    cancel = threading.Event()
    with pytest.raises(Cancelled):
        ask(engine, doc, ["q"], on_text=lambda _: cancel.set(), cancel=cancel)
    assert engine.aborted == 1


class _CountingTokenizer(WordTokenizer):
    """WordTokenizer that remembers the length of every text it tokenizes."""

    def __init__(self):
        self.lengths = []

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        self.lengths.append(len(text))
        return super().__call__(text, add_special_tokens, return_offsets_mapping)


class _Engine:
    def __init__(self, max_context):
        self.tokenizer, self.max_context = _CountingTokenizer(), max_context


def test_a_text_far_too_long_is_refused_from_a_prefix_without_tokenizing_it_all():
    from locks_chat.ask import MAX_CHARS_PER_TOKEN, fitting_prompt

    doc = make_doc([" ".join(["word"] * 400)] * 500)  # 1M characters, ~400K tokens
    engine = _Engine(max_context=2048)
    with pytest.raises(ContextError) as err:
        fitting_prompt(engine, doc, ["q"], max_tokens=256)
    assert engine.tokenizer.lengths and max(engine.tokenizer.lengths) <= 2048 * MAX_CHARS_PER_TOKEN
    message = str(err.value)
    assert "estimated from its first 65,536 of" in message and "2,048-token context" in message
    estimate = int(message.split("about ")[1].split(" document tokens")[0].replace(",", ""))
    assert abs(estimate - 500 * 799) / (500 * 799) < 0.01  # 400 words and 399 spaces a page
    fit = int(message.split("--pages with about ")[1].split(" pages")[0])
    assert f"--pages 1-{fit}" in message
    # the suggested pages fit (no ContextError)
    assert fitting_prompt(_Engine(2048), make_doc([" ".join(["word"] * 400)] * fit), ["q"], max_tokens=256).pages


def test_a_long_but_dense_text_is_counted_exactly():
    """Past the prefix length but few tokens (whitespace runs are one token here): no refusal from the prefix;
    the exact count decides."""
    from locks_chat.ask import MAX_CHARS_PER_TOKEN, fitting_prompt

    doc = make_doc(["a" + " " * 999] * 100)  # 100K characters, ~900 tokens with the page markers
    assert sum(len(p.text) for p in doc.pages) > 2048 * MAX_CHARS_PER_TOKEN
    engine = _Engine(max_context=2048)
    prompt = fitting_prompt(engine, doc, ["q"], max_tokens=16)
    assert prompt.document_tokens < 2048 and max(engine.tokenizer.lengths) > 2048 * MAX_CHARS_PER_TOKEN
