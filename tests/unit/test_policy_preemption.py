"""Victim choice for preemption (issue 20): eligibility by class gap, the order
(lowest class, least work lost, newest), minimality, and all-or-nothing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.policy.fairness import Resources
from swarm.policy.preemption import Running, choose_victims, freed, preference

ONE = Resources(slots=1)


def _r(tid: str, prio: int, lost: float = 0.0, started: float = 0.0, slots: float = 1) -> Running:
    return Running(tid, prio, started, lost, Resources(slots=slots))


def test_nothing_is_stopped_when_the_task_fits_or_cannot_fit_anyway() -> None:
    running = [_r("a", 0), _r("b", 0)]
    assert choose_victims(running, ONE, ONE, priority=10) == []
    assert choose_victims(running, Resources(slots=3), Resources(), priority=10) is None


def test_only_classes_at_least_the_gap_below_are_victims() -> None:
    running = [_r("same", 5), _r("near", 4), _r("far", 2)]
    assert choose_victims(running, ONE, Resources(), priority=5, min_gap=2) == ["far"]
    assert choose_victims([_r("same", 5)], ONE, Resources(), priority=5) is None


def test_lowest_class_then_least_work_lost_then_newest() -> None:
    running = [
        _r("old-low", 0, lost=10, started=1),
        _r("new-low", 0, lost=10, started=5),
        _r("cheap-low", 0, lost=1, started=0),
        _r("mid", 1, lost=0, started=9),
    ]
    assert choose_victims(running, ONE, Resources(), priority=9) == ["cheap-low"]
    two = choose_victims(running, Resources(slots=2), Resources(), priority=9)
    assert two == ["cheap-low", "new-low"]


def test_the_set_is_minimal() -> None:
    running = [_r("small", 0, lost=0, slots=1), _r("big", 0, lost=5, slots=4)]
    # the walk takes `small` first, then needs `big`, which alone suffices
    assert choose_victims(running, Resources(slots=4), Resources(), priority=3) == ["big"]


tasks = st.lists(
    st.builds(
        Running,
        st.text("abcdefgh", min_size=1, max_size=3),
        st.integers(0, 5),
        st.floats(0, 100),
        st.floats(0, 100),
        st.builds(Resources, slots=st.integers(0, 4).map(float), cpu=st.integers(0, 4).map(float)),
    ),
    max_size=8,
    unique_by=lambda r: r.task_id,
)


@settings(max_examples=300)
@given(tasks, st.integers(0, 6), st.integers(0, 8), st.integers(0, 8))
def test_victims_free_enough_are_eligible_and_none_is_spare(
    running: list[Running], prio: int, need_slots: int, need_cpu: int
) -> None:
    need = Resources(slots=need_slots, cpu=need_cpu)
    free = Resources(slots=1, cpu=1)
    v = choose_victims(running, need, free, prio)
    if v is None:
        total = free + freed(
            [r for r in running if r.priority < prio], [r.task_id for r in running]
        )
        assert not (total.slots >= need.slots and total.cpu >= need.cpu)
        return
    by_id = {r.task_id: r for r in running}
    assert all(by_id[t].priority < prio for t in v)
    got = free + freed(running, v)
    assert got.slots >= need.slots and got.cpu >= need.cpu
    for t in v:  # minimal: without any one victim it no longer fits
        rest = free + freed(running, [x for x in v if x != t])
        assert not (rest.slots >= need.slots and rest.cpu >= need.cpu)
    assert v == sorted(v, key=lambda t: preference(by_id[t]))
