"""A loop guard: notice when a streamed answer has started to repeat the same span over and over.

Small models decoding greedily fall into loops ("The light was automated in 1987." until the token limit). The
guard watches the answer's words as the engine streams them (:class:`AnswerGuard`; words, not tokens, so that a
loop stays a loop when the model breaks its lines at different places, as it does copying a hard-wrapped
document). :class:`LoopGuard` fires when the latest words are a span of ``p`` words (``1 <= p <= max_period``)
repeated back to back ``min_repeats`` times or more and covering ``min_cover`` words or more. The cover keeps
short periods from firing on structure (a row of equal table cells): a span of 11 or more words fires on its third
occurrence, one of 4 on its eighth, a single word after 32 in a row. With these limits the guard fires on none of
the 1.04M words of four books (the KJV Bible, Paradise Lost, Hamlet, an encyclopedia article), the repository's
Markdown and the app's source.

For each period ``p`` the guard keeps the run of words equal to the word ``p`` before them; the latest ``r + p``
words repeat with period ``p`` exactly when that run is ``r``. A word costs ``O(max_period)`` (a few microseconds
in CPython), memory is ``O(max_period)``.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

#: a word with the whitespace after it: a word is complete once whitespace follows it
_WORD = re.compile(r"(\S+)(\s+)")
#: where the kept answer may end, best first: a word that ends a sentence (a closing quote, bracket or emphasis
#: allowed), then one that ends a line
_ENDS = (re.compile(r"[.!?][\"')\]*_]*\s*$"), re.compile(r"\n"))

STOPPED_TEXT = "the answer repeated itself"
"""what the app says under an answer the guard stopped (``stopped: ...``)"""
FINISH_REASON = "repetition"
"""the ``finish_reason`` of such an answer (``--json``, a turn's statistics)"""


@dataclass(frozen=True)
class Loop:
    """A loop at the end of the pieces pushed so far."""

    period: int
    """pieces in the repeated span (the smallest period that fired)"""
    start: int
    """index of the first piece of the repeating stretch (its first occurrence begins here)"""
    end: int
    """pieces pushed when it fired (the stretch is ``start`` to ``end``)"""

    @property
    def repeats(self) -> float:
        """how many times the span occurs in the stretch (a last partial occurrence counted in part)"""
        return (self.end - self.start) / self.period


class LoopGuard:
    """Watches a stream of pieces (words) for a loop at its end.

    Args:
        max_period (int): longest repeated span looked for, in pieces (48 words: about 64 tokens).
        min_repeats (int): occurrences back to back that make a loop (at least 2).
        min_cover (int): pieces the repeating stretch must cover at least, whatever the period.
    Raises:
        ValueError: a limit below 1 (``min_repeats`` below 2).
    """

    def __init__(self, max_period: int = 48, min_repeats: int = 3, min_cover: int = 32) -> None:
        if max_period < 1 or min_repeats < 2 or min_cover < 1:
            raise ValueError(f"LoopGuard: max_period {max_period} (>= 1), min_repeats {min_repeats} (>= 2), "
                             f"min_cover {min_cover} (>= 1)")
        self.max_period, self.min_repeats, self.min_cover = max_period, min_repeats, min_cover
        self._last: list[Hashable] = []  # the latest pieces, at most 2 * max_period (trimmed by half)
        self._runs = [0] * (max_period + 1)  # [p]: latest pieces each equal to the piece p before it
        self.pushed = 0
        """pieces pushed so far"""
        self.loop: Loop | None = None
        """the loop found (the first), else ``None``"""

    def push(self, piece: Hashable) -> Loop | None:
        """Add the next piece; returns the loop it completes (the same :class:`Loop` once found), else ``None``."""
        if self.loop is not None:
            return self.loop
        last, runs, repeats, cover = self._last, self._runs, self.min_repeats - 1, self.min_cover
        found = None
        for period in range(1, min(len(last), self.max_period) + 1):
            if last[-period] == piece:
                run = runs[period] = runs[period] + 1
                if found is None and run >= repeats * period and run + period >= cover:
                    found = period
            else:
                runs[period] = 0
        last.append(piece)
        if len(last) >= 2 * self.max_period:
            del last[: self.max_period]
        self.pushed += 1
        if found is not None:
            self.loop = Loop(found, self.pushed - runs[found] - found, self.pushed)
        return self.loop


def kept_pieces(pieces: Sequence[str], loop: Loop) -> int:
    """How many of ``pieces`` to keep of an answer that ended in ``loop``: through its first occurrence.

    The stretch may begin inside a sentence (the text before it can end the way the span ends), so the first
    occurrence is followed to the end of its sentence, else of its line (a line break may only be the model's
    wrapping), at most one period further; without either there, it ends where the span first ends.
    """
    first_end = loop.start + loop.period
    window = range(first_end - 1, min(first_end - 1 + loop.period, len(pieces)))
    for end in _ENDS:
        for index in window:
            if end.search(pieces[index]):
                return index + 1
    return first_end


class AnswerGuard:
    """A :class:`LoopGuard` over the words of an answer as it streams (any split into pieces: the same words).

    Args:
        guard (LoopGuard | None): the limits; ``None``: the defaults.
    """

    def __init__(self, guard: LoopGuard | None = None) -> None:
        self.guard = guard or LoopGuard()
        self.text = ""
        """the answer so far"""
        self._words: list[str] = []  # each complete word with the whitespace after it
        self._ends: list[int] = []  # where each of them ends in :attr:`text`
        self._next = 0  # where the first word not yet complete may start

    @property
    def loop(self) -> Loop | None:
        """The loop found (in words), else ``None``."""
        return self.guard.loop

    def feed(self, delta: str) -> Loop | None:
        """Add the next piece of the answer; returns the loop found so far (in words), else ``None``."""
        self.text += delta
        for match in _WORD.finditer(self.text, self._next):
            if self.guard.loop is not None:
                break
            self._words.append(match.group(0))
            self._ends.append(match.end())
            self._next = match.end()
            self.guard.push(match.group(1))
        return self.guard.loop

    def kept(self) -> str:
        """The answer through the loop's first occurrence (:func:`kept_pieces`), trailing whitespace dropped; the
        whole answer when there is no loop."""
        if self.guard.loop is None:
            return self.text
        return self.text[: self._ends[kept_pieces(self._words, self.guard.loop) - 1]].rstrip()
