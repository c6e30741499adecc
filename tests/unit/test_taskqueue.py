"""The runner's TaskQueue: a deque whose membership answers match its contents after
any sequence of the operations the agent uses (issue 23: O(1) `in`)."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarm.runtime.taskqueue import TaskQueue

IDS = st.sampled_from(["a", "b", "c", "d"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), IDS),
        st.tuples(st.just("appendleft"), IDS),
        st.tuples(st.just("extend"), st.lists(IDS, max_size=3)),
        st.tuples(st.just("extendleft"), st.lists(IDS, max_size=3)),
        st.tuples(st.just("popleft"), st.none()),
        st.tuples(st.just("pop"), st.none()),
        st.tuples(st.just("remove"), IDS),
        st.tuples(st.just("clear"), st.none()),
    ),
    max_size=40,
)


@given(OPS)
def test_membership_and_order_match_a_plain_deque(ops: list[tuple[str, object]]) -> None:
    q, ref = TaskQueue(), deque[str]()
    for name, arg in ops:
        results = []
        for target in (q, ref):
            try:
                fn = getattr(target, name)
                results.append(("ok", fn() if arg is None else fn(arg)))
            except (IndexError, ValueError) as e:
                results.append(("err", type(e)))
        assert results[0] == results[1]
        assert list(q) == list(ref)
        for tid in "abcde":
            assert (tid in q) == (tid in ref)


def test_operations_that_would_bypass_the_count_are_refused() -> None:
    q = TaskQueue(["a", "b"])
    with pytest.raises(TypeError):
        q[0] = "c"
    with pytest.raises(TypeError):
        q.insert(0, "c")
    with pytest.raises(TypeError):
        del q[0]
    assert list(q) == ["a", "b"] and "a" in q and "c" not in q
