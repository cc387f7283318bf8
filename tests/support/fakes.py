"""A scripted engine and a tiny tokenizer for app tests (no vLLM, no model)."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

import numpy as np


class WordTokenizer:
    """One token per word or punctuation mark or whitespace run, with character offsets."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
        return text + ("<|assistant|>\n" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        spans = [(m.start(), m.end()) for m in re.finditer(r"\w+|\s+|[^\w\s]", text)]
        return {"input_ids": [hash(text[a:b]) % 50000 for a, b in spans], "offset_mapping": spans}


def step_record(seq_len: int, read_bins: list[int], page_size: int = 16, pages_per_bin: int = 1, bins: int = 64):
    """A LOCKS step record (``locks_engine.stats``) for one decode row reading ``read_bins``."""
    hist = np.zeros((8, bins), dtype=np.uint16)
    hist[0, read_bins] = 3
    total = -(-seq_len // page_size) * 6
    return {
        "num_decodes": 1, "num_prefill_tokens": 0, "row_seq_len": [seq_len] + [0] * 7,
        "row_pages_read": [len(read_bins) * 3] + [0] * 7, "row_pages_total": [total] + [0] * 7,
        "row_hist": hist, "bytes_read": len(read_bins) * 3 * 4096, "bytes_dense": total * 4096,
        "pages_per_bin": pages_per_bin, "page_size": page_size,
    }


@dataclass
class Event:
    text: str
    num_tokens: int
    finished: bool
    finish_reason: str | None
    elapsed_s: float
    stats: list = field(default_factory=list)
    cached_tokens: int | None = None


class GenerationCancelled(Exception):
    """Same name as the real engine's, which the app recognizes."""


def cached_prefix(prompt: list[int], earlier: list[list[int]], block: int) -> int:
    """What vLLM's prefix cache serves of ``prompt``: the longest prefix shared with an earlier prompt, in whole
    blocks of ``block`` tokens, leaving at least the last token to compute."""
    best = 0
    for other in earlier:
        n = 0
        for a, b in zip(prompt, other):
            if a != b:
                break
            n += 1
        best = max(best, n)
    return min(best, len(prompt) - 1) // block * block


class FakeEngine:
    """Streams ``answer`` word by word; each step reads KV pages ``bins_per_step[i]``. With ``prefix_block``,
    events report the prompt tokens a prefix cache of that block size would serve from this engine's earlier
    prompts (``cached_tokens``); without it they report none (``None``), as an engine that does not say.
    ``model_sampling`` is the model's sampling defaults it reports (``None``: no such attribute, as an engine that
    does not say); the sampling each request was given is kept in ``samplings``. With ``tail`` (a tail estimate's
    format, as ``LocksConfig.tail``) each step's record says that the pages not read carried ``tail_shares[i]`` of
    the estimated mass (2 layers of 3 KV heads)."""

    def __init__(self, answer="It is BLUE (p. 2).", max_context=100_000, bins_per_step=None, fail=None,
                 prefix_block=None, model_sampling=None, tail="none", tail_shares=(0.25,)):
        self.tokenizer = WordTokenizer()
        self.max_context = max_context
        self.answer = answer
        self.bins_per_step = bins_per_step or [[0, 1, 2]]
        self.fail = fail
        self.prefix_block = prefix_block
        self.tail, self.tail_shares = tail, list(tail_shares)
        self.prompts: list[list[int]] = []
        self.aborted = 0
        self.closed = False
        self.samplings: list = []
        self.streamed: list[int] = []
        """the words each request streamed before it ended or was aborted"""
        if model_sampling is not None:
            self.model_sampling = model_sampling

    def stream(self, prompt_ids, max_tokens, cancel: threading.Event | None = None, sampling=None):
        self.samplings.append(sampling)
        self.streamed.append(0)
        cached = None if self.prefix_block is None else cached_prefix(prompt_ids, self.prompts, self.prefix_block)
        self.prompts.append(list(prompt_ids))
        words = re.findall(r"\S+\s*", self.answer)[:max_tokens]
        try:
            for i, word in enumerate(words):
                if cancel is not None and cancel.is_set():
                    raise GenerationCancelled("cancelled")
                if self.fail is not None and i == 1:
                    raise self.fail
                bins = self.bins_per_step[i % len(self.bins_per_step)]
                record = step_record(len(prompt_ids) + i, bins)
                if self.tail != "none":
                    share = self.tail_shares[i % len(self.tail_shares)]
                    record |= {"tail": self.tail, "num_layers": 2, "num_kv_heads": 3,
                               "row_tail_mass": [share * 6] + [0.0] * 7}
                done = i == len(words) - 1
                self.streamed[-1] = i + 1
                yield Event(word, i + 1, done, "stop" if done else None, 0.5 + 0.01 * i, [record], cached)
        except BaseException:
            self.aborted += 1
            raise

    def close(self):
        self.closed = True


LOOP_FIRST = "The light on Gull Rock was automated in 1987."
LOOP_SPAN = "The light on the two chimneys was automated in 1987."


def looping_engine(times: int = 60, **kwargs) -> FakeEngine:
    """A :class:`FakeEngine` whose answer falls into a loop, as the built-in model did on the lighthouse question:
    :data:`LOOP_FIRST` (9 words), then :data:`LOOP_SPAN` (10) ``times`` times, longer than any ``max_tokens`` the
    tests give; the two sentences end alike (" was automated in 1987.", the first's last 4 words)."""
    return FakeEngine(answer=" ".join([LOOP_FIRST] + [LOOP_SPAN] * times), **kwargs)
