"""The CPU decode benchmark's arguments (``samples/bench_cpu_decode.py``, ``locks_bench.cpu``); the benchmark
itself starts engines."""

from __future__ import annotations

import pytest

from locks_bench import cpu


@pytest.mark.parametrize("argv,message", [
    (["--n1", "64", "--n2", "64"], "need 1 <= --n1 < --n2"),
    (["--n1", "0"], "need 1 <= --n1 < --n2"),
    (["--modes", "locks,flash"], "unknown mode(s) flash"),
])
def test_bad_arguments_are_refused_in_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        cpu.parse("", ["--book", "book.txt", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_defaults_run_the_flat_modes_and_two_level_is_asked_for():
    args = cpu.parse("", ["--book", "book.txt"])
    assert args.modes.split(",") == ["cpu_attn", "locks", "locks_dense"]
    assert (args.n1, args.n2, args.context) == (16, 80, 7000)
    two = cpu.parse("", ["--book", "book.txt", "--modes", "locks,locks_2l", "--candidates", "4,8"])
    assert two.modes == "locks,locks_2l" and two.candidates == "4,8"
