"""The loop guard (``locks_chat.loop_guard``) on its own: loops of several periods fire at the word that completes
them and not before, however the text is split or its lines broken; near-loops, prose and lists with repeated
structure never fire; it agrees with a brute-force search on random sequences; the kept answer ends after the
loop's first occurrence."""

import random
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from locks_chat.loop_guard import AnswerGuard, LoopGuard
from tests.support.fakes import LOOP_FIRST, LOOP_SPAN
from tests.support.paths import REPO


def streamed(text: str, seed: int = 0) -> AnswerGuard:
    """``text`` fed to an :class:`AnswerGuard` in pieces of 1 to 8 characters, as an engine streams it."""
    guard, rng, at = AnswerGuard(), random.Random(seed), 0
    while at < len(text) and guard.loop is None:
        step = rng.randint(1, 8)
        guard.feed(text[at:at + step])
        at += step
    return guard


def first_fire(seq, **limits) -> tuple[int, int] | None:
    """``(pieces pushed, period)`` when the guard first fires on ``seq``, else ``None``."""
    guard = LoopGuard(**limits)
    for n, piece in enumerate(seq, 1):
        if (loop := guard.push(piece)) is not None:
            return n, loop.period
    return None


def brute_force(seq, max_period: int, min_repeats: int, min_cover: int) -> tuple[int, int] | None:
    """The same question answered from the definition: the first prefix whose end is a stretch of period ``p``
    covering at least ``max(min_repeats * p, min_cover)`` pieces (the smallest such ``p``)."""
    for n in range(1, len(seq) + 1):
        for p in range(1, min(max_period, n - 1) + 1):
            length = p
            while length < n and seq[n - 1 - length] == seq[n - 1 - length + p]:
                length += 1
            if length >= max(min_repeats * p, min_cover):
                return n, p
    return None


def unique(count: int, start: int) -> list[int]:
    return list(range(start, start + count))


@pytest.mark.parametrize("period", [1, 2, 5, 8, 11, 16, 40, 48], ids=lambda p: f"period{p}")
def test_a_loop_fires_when_it_covers_three_periods_and_the_cover(period):
    prefix, unit = unique(30, 10_000), unique(period, 0)
    seq = prefix + unit * 80
    expected = len(prefix) + max(3 * period, 32)
    assert first_fire(seq) == (expected, period)
    assert first_fire(seq[: expected - 1]) is None


def test_a_loop_found_keeps_being_reported():
    guard = LoopGuard()
    loops = [guard.push(piece) for piece in [7] * 60]
    assert loops[:31] == [None] * 31 and all(loop is loops[31] for loop in loops[31:])
    assert loops[31].start == 0 and loops[31].end == 32 and loops[31].repeats == 32


@pytest.mark.parametrize("text", [
    " ".join(f"The light was automated in {year}." for year in range(1900, 1960)),
    "\n".join(f"{n}. Chapter {n}: the keeper's log, page {n * 3}" for n in range(1, 60)),
    "\n".join(f"- p. {n}: the keeper writes in the log at {n % 12 + 1} o'clock" for n in range(1, 60)),
    "| page | cited | verified |\n|---|---|---|\n" + "\n".join(f"| {n} | p. {n} | yes |" for n in range(40)),
    " ".join(["all work and no play makes Jack a dull boy"] * 2) + " and that is all.",
], ids=["counting-sentences", "numbered-list", "bullet-list", "table", "twice"])
def test_near_loops_and_lists_with_repeated_structure_do_not_fire(text):
    assert streamed(text).loop is None


@pytest.mark.parametrize("name", ["samples/lighthouse.md", "README.md", "samples/BENCHMARKS.md"])
def test_prose_and_tables_do_not_fire(name):
    assert streamed((REPO / name).read_text(encoding="utf-8")).loop is None


@pytest.mark.parametrize("period, repeats, fires", [(8, 3, False), (8, 4, True), (49, 4, False), (48, 3, True)],
                         ids=["8x3", "8x4", "49x4", "48x3"])
def test_the_limits(period, repeats, fires):
    """Short spans need the cover (32 words), long ones three occurrences, and no span is longer than 48."""
    seq = unique(20, 10_000) + unique(period, 0) * repeats + unique(20, 20_000)
    assert (first_fire(seq) is not None) == fires


@given(st.lists(st.integers(0, 2), max_size=120), st.integers(1, 6), st.integers(2, 4), st.integers(1, 16))
def test_the_guard_agrees_with_a_brute_force_search(seq, max_period, min_repeats, min_cover):
    """Sequences over three symbols are full of near-loops and short loops: every limit, every position."""
    limits = dict(max_period=max_period, min_repeats=min_repeats, min_cover=min_cover)
    assert first_fire(seq, **limits) == brute_force(seq, **limits)


def test_random_text_never_fires():
    rng = random.Random(0)
    assert first_fire([rng.randrange(50_000) for _ in range(20_000)]) is None


@pytest.mark.parametrize("width", [0, 40, 57, 80], ids=lambda w: f"wrapped{w}" if w else "one-line")
@pytest.mark.parametrize("seed", [0, 1])
def test_a_loop_fires_however_its_lines_are_broken_and_its_text_split(width, seed):
    """A model copying a hard-wrapped document breaks the repeated sentence at a different word each time: the
    same words all the same."""
    text = " ".join([LOOP_FIRST] + [LOOP_SPAN] * 12)
    guard = streamed(textwrap.fill(text, width) if width else text, seed)
    assert guard.loop is not None and guard.loop.period == 10
    assert guard.loop.start == 5 and guard.loop.end == 5 + 32  # "was automated in 1987." ends both sentences
    assert " ".join(guard.kept().split()) == f"{LOOP_FIRST} {LOOP_SPAN}"


def test_the_kept_answer_ends_after_the_first_occurrence_of_the_loop():
    """The stretch starts inside the first sentence (it ends as the span does): the kept answer runs on to the end
    of the span's first sentence, not to where the stretch's first period ends."""
    guard = streamed(" ".join([LOOP_FIRST] + [LOOP_SPAN] * 10))
    assert guard.kept() == f"{LOOP_FIRST} {LOOP_SPAN}"


def test_a_loop_without_a_sentence_end_is_kept_through_one_period():
    guard = streamed("Intro: " + "alpha beta gamma delta " * 20)
    assert guard.kept() == "Intro: alpha beta gamma delta"


def test_without_a_loop_the_whole_answer_is_kept():
    guard = streamed("It is BLUE (p. 1).")
    assert guard.loop is None and guard.kept() == "It is BLUE (p. 1)."


@pytest.mark.parametrize("limits", [dict(max_period=0), dict(min_repeats=1), dict(min_cover=0)])
def test_bad_limits_are_refused(limits):
    with pytest.raises(ValueError, match="LoopGuard"):
        LoopGuard(**limits)


def test_a_list_that_loops_is_kept_through_its_first_occurrence():
    guard = streamed("Pages:\n- the keeper\n- the log\n" + "- the lamp room\n- the gallery\n" * 10)
    assert guard.kept() == "Pages:\n- the keeper\n- the log\n- the lamp room\n- the gallery"
