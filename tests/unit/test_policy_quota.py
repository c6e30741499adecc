"""Local allowances of an elastic quota's cap (issue 20): the split by demand, the
floor for unseen demand, and that the split never exceeds the cap when views agree."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from swarm.policy.quota import local_allowance, overshoot_bound


def test_the_cap_is_split_by_demand() -> None:
    demand = {"a": 30.0, "b": 10.0}
    assert local_allowance(100.0, "a", demand, 0.0).allowed == 75.0
    assert local_allowance(100.0, "b", demand, 0.0).allowed == 25.0
    assert local_allowance(100.0, "c", demand, 0.0).allowed == 0.0  # no demand here


def test_running_work_is_never_cut_and_new_demand_gets_the_floor() -> None:
    assert local_allowance(100.0, "a", {"a": 1.0, "b": 99.0}, 20.0).allowed == 20.0
    assert local_allowance(100.0, "a", {"a": 1.0, "b": 999.0}, 0.0, floor=5.0).allowed == 5.0
    assert overshoot_bound(100.0, 5.0, 3) == 15.0


@given(st.dictionaries(st.sampled_from("abcdef"), st.floats(0, 1e6), min_size=1), st.floats(0, 1e6))
def test_when_views_agree_the_allowances_sum_to_at_most_the_cap(
    demand: dict[str, float], cap: float
) -> None:
    total = sum(local_allowance(cap, n, demand, 0.0).allowed for n in demand)
    assert total <= cap * (1 + 1e-9) + 1e-6
    if sum(demand.values()) > 0:
        assert math.isclose(total, cap, rel_tol=1e-9, abs_tol=1e-6)
