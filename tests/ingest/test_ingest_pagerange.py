"""The --pages selector over physical numbers and printed labels."""

from __future__ import annotations

import pytest

from locks_chat.errors import PageRangeError
from locks_chat.ingest.pagerange import describe_pages, parse_page_range

PLAIN = [str(n) for n in range(1, 11)]
MANUAL = ["T-1", "T-2", "i", "ii", "iii", "iv"] + [str(n) for n in range(1, 8)]
TWO_PARTS = ["1", "2", "3", "1", "2", "3"]


def labels_of(spec, labels):
    return [labels[i] for i in parse_page_range(spec, labels)]


@pytest.mark.parametrize(
    "spec, expected",
    [
        (None, PLAIN),
        ("", PLAIN),
        ("3", ["3"]),
        ("2-4", ["2", "3", "4"]),
        ("2\u20134", ["2", "3", "4"]),
        ("8-", ["8", "9", "10"]),
        ("-2", ["1", "2"]),
        ("1-2, 9-10", ["1", "2", "9", "10"]),
        ("3-5,4-6", ["3", "4", "5", "6"]),
        ("#10", ["10"]),
    ],
)
def test_physical(spec, expected):
    assert labels_of(spec, PLAIN) == expected


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("ii-iv", ["ii", "iii", "iv"]),
        ("II-IV", ["ii", "iii", "iv"]),
        ("1-3", ["1", "2", "3"]),
        ("iv-2", ["iv", "1", "2"]),
        ("T-1", ["T-1"]),
        ("T-1-T-2", ["T-1", "T-2"]),
        ("T-2-i", ["T-2", "i"]),
        ("6-", ["6", "7"]),
        ("#1-3", ["T-1", "T-2", "i"]),
    ],
)
def test_printed_labels_come_first(spec, expected):
    assert labels_of(spec, MANUAL) == expected


def test_repeated_labels_use_first_occurrence_and_end_after_start():
    assert parse_page_range("2-3", TWO_PARTS) == [1, 2]
    assert parse_page_range("3-1", TWO_PARTS) == [2, 3]
    assert parse_page_range("#4-6", TWO_PARTS) == [3, 4, 5]


@pytest.mark.parametrize(
    "spec, labels, reason",
    [
        ("11", PLAIN, "out of range"),
        ("0-3", PLAIN, "out of range"),
        ("5-2", PLAIN, "empty range"),
        ("x", PLAIN, "neither page numbers"),
        ("1,,2", PLAIN, "empty part"),
        ("6-9", MANUAL, "no page is printed '9'"),
        ("iv-x", MANUAL, "no page is printed 'x'"),
        ("2-iv", MANUAL, "empty range"),
        ("#14", MANUAL, "out of range"),
        ("1--3", MANUAL, "neither page numbers"),
    ],
)
def test_errors_give_the_valid_range(spec, labels, reason):
    with pytest.raises(PageRangeError) as info:
        parse_page_range(spec, labels)
    message = str(info.value)
    assert reason in message
    assert message.endswith(describe_pages(labels))
    assert "\n" not in message


def test_describe_pages():
    assert describe_pages(PLAIN) == "physical 1-10"
    assert describe_pages(MANUAL) == "physical 1-13 (printed T-1 to T-2, i to iv, 1 to 7)"
    assert describe_pages(["i", "ii", "1", "2", "A", "3"]) == "physical 1-6 (printed i-ii, 1-2, A, 3)"


@pytest.mark.parametrize(
    "spec, reason",
    [
        ("8", "no page is printed '8' (pass '#8' to mean physical page 8)"),
        ("8-", "no page is printed '8' (pass '#8-' to mean physical pages 8-13)"),
        ("-9", "no page is printed '9' (pass '#-9' to mean physical pages 1-9)"),
        ("1,8-9", "no page is printed '8' (pass '#8-9' to mean physical pages 8-9)"),
        ("20", "no page is printed '20'; valid"),
        ("iv-20", "no page is printed '20'; valid"),
    ],
)
def test_number_that_is_no_printed_label_is_not_read_as_a_physical_page(spec, reason):
    # MANUAL has 13 physical pages but none printed "8": "8" must not silently mean the 8th page (printed "ii")
    with pytest.raises(PageRangeError) as info:
        parse_page_range(spec, MANUAL)
    assert reason in str(info.value)
    assert str(info.value).endswith(describe_pages(MANUAL)) and "\n" not in str(info.value)
    physical = spec.split(",")[-1]
    if "#" in reason:
        assert parse_page_range("#" + physical, MANUAL) == parse_page_range(physical, [str(n) for n in range(1, 14)])


def test_plain_numbering_reads_numbers_as_pages():
    plain = [str(n) for n in range(1, 114)]
    assert parse_page_range("108", plain) == [107]
    assert parse_page_range("105-108", plain) == [104, 105, 106, 107]
    assert parse_page_range("#108", plain) == [107]
    with pytest.raises(PageRangeError, match="'114' is out of range"):
        parse_page_range("114", plain)


@pytest.mark.parametrize("spec", ["²", "¹-3", "2-³"])
def test_superscript_digits_are_no_page_numbers(spec):
    """``str.isdigit`` takes superscripts, which ``int`` refuses: they are malformed, not a crash."""
    with pytest.raises(PageRangeError, match="valid pages"):
        parse_page_range(spec, [str(i) for i in range(1, 11)])


def test_other_scripts_decimal_digits_are_numbers():
    assert parse_page_range("٣", [str(i) for i in range(1, 11)]) == [2]
