"""Local allowances of an elastic quota's cap (issue 20): the split by demand, the
floor for unseen demand, and that the split never exceeds the cap when views agree."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from swarm.policy.quota import whole_slots


def test_the_cap_is_split_by_demand_in_whole_slots() -> None:
    demand = {"a": 30.0, "b": 10.0}
    assert whole_slots(100.0, "a", demand) == 30  # never above a node's demand
    assert whole_slots(20.0, "a", demand) == 15 and whole_slots(20.0, "b", demand) == 5
    assert whole_slots(100.0, "c", demand) == 0  # no demand here


def test_a_fraction_of_a_slot_each_still_starts_the_cap() -> None:
    demand = {"a": 2.0, "b": 2.0, "c": 2.0}
    assert [whole_slots(2.0, n, demand) for n in "abc"] == [1, 1, 0]  # ties: name first


@given(
    st.integers(0, 20),
    st.dictionaries(st.sampled_from("abcdefgh"), st.integers(0, 30), min_size=1),
)
def test_when_views_agree_whole_slots_give_out_exactly_the_cap_or_the_demand(
    cap: int, demand: dict[str, int]
) -> None:
    d = {k: float(v) for k, v in demand.items()}
    given_ = {n: whole_slots(float(cap), n, d) for n in d}
    assert sum(given_.values()) == min(cap, sum(demand.values()))
    assert all(0 <= given_[n] <= demand[n] for n in d)
