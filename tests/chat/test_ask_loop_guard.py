"""``locks_chat.ask.ask`` stops an answer that loops through the engine's own abort path: the loop guard sets the
request's cancel event, and ``LocksEngine.stream`` (driving a scripted ``LLMEngine``) aborts the request."""

import itertools
import threading
from types import SimpleNamespace

import pytest

from locks_chat.ask import ask
from locks_chat.ingest import load_document
from locks_engine.engine import LocksEngine
from tests.support.fakes import WordTokenizer
from tests.support.tui_support import write_book


class LoopingLLM:
    """``LLMEngine``'s request surface: a request that writes ``" the end."`` over and over and never finishes
    by itself (three tokens, two words a period)."""

    def __init__(self) -> None:
        self.steps, self.aborted, self.unfinished = 0, [], False

    def add_request(self, rid, prompt, params):
        self.rid, self.unfinished = rid, True

    def step(self):
        if self.aborted:
            self.unfinished = False
            return []
        text = [" the", " end", "."][self.steps % 3]
        self.steps += 1
        completion = SimpleNamespace(text=text, token_ids=[self.steps % 3], finish_reason=None)
        return [SimpleNamespace(request_id=self.rid, outputs=[completion], finished=False)]

    def abort_request(self, rids):
        self.aborted.extend(rids)

    def has_unfinished_requests(self):
        return self.unfinished


def test_the_guard_aborts_the_request_in_the_engine(tmp_path):
    pytest.importorskip("vllm", reason="LocksEngine.stream builds vLLM's SamplingParams")
    llm = LoopingLLM()
    engine = object.__new__(LocksEngine)
    engine.llm, engine._lock, engine._ids, engine._seen = llm, threading.Lock(), itertools.count(), 0
    engine.ring, engine.on_cuda, engine.dense_baseline = None, False, False
    engine.tokenizer, engine.max_context = WordTokenizer(), 100_000
    cancel = threading.Event()
    result = ask(engine, load_document(write_book(tmp_path)), ["How does it end?"], max_tokens=500, cancel=cancel)
    assert llm.aborted == [llm.rid] and not llm.unfinished and cancel.is_set()
    # 32 words ("the end." 16 times, 48 tokens), the last one complete when the next token's space comes; then
    # not one step more
    assert llm.steps == 49
    assert result.answer == " the end." and result.stopped == "the answer repeated itself"
    assert result.finish_reason == "repetition" and result.generated_tokens == 49
