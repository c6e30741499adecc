"""Task arrays' pure parts (issue 23): the `--array` grammar, lazy elements, `{index}`."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.policy import arrays as ar


@pytest.mark.parametrize(
    ("text", "indices", "cap"),
    [
        ("0-4", [0, 1, 2, 3, 4], 0),
        ("1,5,7-9", [1, 5, 7, 8, 9], 0),
        ("0-15:4", [0, 4, 8, 12], 0),
        ("0-14:4", [0, 4, 8, 12], 0),
        ("9,0-2%2", [0, 1, 2, 9], 2),
        (" 3 ", [3], 0),
        ("0-0:5", [0], 0),
    ],
)
def test_the_grammar(text: str, indices: list[int], cap: int) -> None:
    a = ar.parse_array(text)
    assert list(a) == indices and len(a) == len(indices) and a.cap == cap
    assert [a.nth(k) for k in range(len(a))] == indices
    assert ar.parse_array(a.text()) == a


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("5-3", "ends before it starts"),
        ("0-9%0", "%0 would run nothing"),
        ("0-9%x", "whole number"),
        ("a-b", "is not N, N-M or N-M:STEP"),
        ("-1", "is not N"),
        ("0-4:0", "step of 0"),
        ("1,1", "index 1 is given twice"),
        ("0-10,5-6", "index 5 is given twice"),
        ("0-9:3,3-3", "index 3 is given twice"),
        ("0-10:2,1-9:2", "interleave"),
        ("0-1000000", "1,000,001 elements"),
        ("9999999999", "above"),
    ],
)
def test_bad_arrays_are_refused_naming_the_field(text: str, says: str) -> None:
    with pytest.raises(ar.ArrayError, match=r"^array: ") as e:
        ar.parse_array(text)
    assert says in str(e.value)


def test_the_maximum_is_an_option() -> None:
    assert len(ar.parse_array("0-99", max_elements=100)) == 100
    with pytest.raises(ar.ArrayError, match="101 elements"):
        ar.parse_array("0-100", max_elements=100)


def test_a_million_elements_cost_no_list() -> None:
    a = ar.parse_array("0-999999%50")
    assert len(a) == 1_000_000 and a.nth(999_999) == 999_999 and 500_000 in a and a.cap == 50


def test_index_substitution_touches_only_index() -> None:
    argv = ("train", "--shard={index}", "{{index}}", "{idx}", "{}", "$(rm -rf /)")
    assert ar.element_argv(argv, 7) == (
        "train",
        "--shard=7",
        "{index}",
        "{idx}",
        "{}",
        "$(rm -rf /)",
    )
    assert ar.element_env("a1", 7) == {"SWARM_ARRAY_ID": "a1", "SWARM_ARRAY_INDEX": "7"}


runs = st.lists(
    st.tuples(st.integers(0, 300), st.integers(0, 40), st.integers(1, 7)), min_size=1, max_size=5
)


@settings(max_examples=300, deadline=None)
@given(runs, st.integers(0, 20))
def test_any_accepted_array_agrees_with_its_index_list(
    items: list[tuple[int, int, int]], cap: int
) -> None:
    text = ",".join(f"{s}-{s + n}:{k}" for s, n, k in items) + (f"%{cap}" if cap else "")
    want: list[int] = []
    for s, n, k in items:
        want += list(range(s, s + n + 1, k))
    spans = sorted((s, s + n // k * k) for s, n, k in items)
    if any(b[0] <= a[1] for a, b in itertools.pairwise(spans)):
        with pytest.raises(ar.ArrayError, match=r"given twice|interleave"):
            ar.parse_array(text)
        return
    a = ar.parse_array(text)
    assert list(a) == sorted(want) and len(a) == len(want)
    assert [a.nth(k) for k in range(len(a))] == sorted(want)
    assert all(i in a for i in want) and not any(i in a for i in range(0, 360) if i not in want)
    assert ar.parse_array(a.text()) == a and a.cap == cap


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_any_text_is_accepted_or_refused_with_one_line(text: str) -> None:
    try:
        ar.parse_array(text, max_elements=10_000)
    except ar.ArrayError as e:
        assert str(e).startswith("array: ") and "\n" not in str(e)
