"""An answer that ``--max-tokens`` cut mid-word is checked without its cut word: ``The siege of Vicksb`` was
"Not supported by the document" although the page holds the siege of Vicksburg."""

import pytest

from locks_chat.ask import ask, whole_words
from locks_chat.ingest import load_document
from tests.support.fakes import Event, FakeEngine
from tests.support.tui_support import write_book

PAGE = "Diary, June 1863. The siege of Vicksburg went on; shells fell on the town every night."


class CutEngine(FakeEngine):
    """Streams :attr:`answer` word by word and ends it as ``max_tokens`` would: finish reason ``length``."""

    def stream(self, prompt_ids, max_tokens, cancel=None, sampling=None):
        words = self.answer.split(" ")
        for i, word in enumerate(words):
            last = i == len(words) - 1
            yield Event(word + ("" if last else " "), i + 1, last, "length" if last else None, 0.5 + 0.01 * i)


@pytest.mark.parametrize("answer, reason, supported", [
    ("The siege of Vicksb", "length", True),
    ("The siege of Vicksb", "stop", False),  # the model ended it so: the word is the answer's
    ("General Grant won at Gettysb", "length", False),  # nothing else of it is on the page
], ids=["cut_mid_word", "ended_by_the_model", "cut_and_unsupported"])
def test_the_word_max_tokens_cut_is_not_checked(tmp_path, answer, reason, supported):
    document = load_document(write_book(tmp_path, text=PAGE))
    engine = CutEngine(answer=answer)
    if reason == "stop":
        engine = FakeEngine(answer=answer)
    result = ask(engine, document, ["What happened in 1863?"], max_tokens=4)
    assert result.answer == answer and result.finish_reason == reason
    assert result.check.supported is supported


@pytest.mark.parametrize("answer, reason, checked", [
    ("The siege of Vicksb", "length", "The siege of "),
    ("It is on (p. 12", "length", "It is on (p. 12"),
    ("Vicksb", "length", "Vicksb"),
    ("The siege of Vicksb", None, "The siege of Vicksb"),
], ids=["word", "citation_kept", "nothing_left", "not_cut"])
def test_whole_words(answer, reason, checked):
    assert whole_words(answer, reason) == checked
