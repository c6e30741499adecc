"""Fair share's pure maths (issue 20): decayed usage, the usage map's merge (a CRDT),
dominant shares and the DRF order."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.policy.fairness import (
    OTHERS,
    Decayed,
    OriginUsage,
    Resources,
    UsageMap,
    Waiting,
    decay_factor,
    dominant_share,
    drf_schedule,
    jain_index,
)

HL = 100.0


def test_usage_halves_every_half_life_and_adds_after_decaying() -> None:
    d = Decayed(Resources(slots=8.0, cpu=4.0), at=0.0)
    assert d.at_time(100.0, HL) == Resources(slots=4.0, cpu=2.0)
    assert d.at_time(-5.0, HL) == d.value  # never grows backwards
    d2 = d.plus(Resources(slots=1.0), 200.0, HL)
    assert d2 == Decayed(Resources(slots=3.0, cpu=1.0), 200.0)
    assert math.isclose(decay_factor(50.0, HL), 2**-0.5)


def test_dominant_share_is_the_largest_share_of_what_the_cluster_has() -> None:
    cap = Resources(slots=10, cpu=20, mem=100, gpu=0)
    assert dominant_share(Resources(slots=1, cpu=10, mem=5, gpu=300), cap) == 0.5  # no GPUs
    assert dominant_share(Resources(), cap) == 0.0
    assert dominant_share(Resources(cpu=1), Resources()) == 0.0


def test_drf_from_the_paper_three_and_two() -> None:
    """Ghodsi et al.'s example: 9 CPUs, 18 GB; A's tasks need <1 CPU, 4 GB>, B's
    <3 CPUs, 1 GB>. DRF gives A three tasks and B two (both dominant shares 2/3)."""
    cap = Resources(cpu=9, mem=18)
    waiting = [Waiting(f"a{i}", "A", i) for i in range(10)]
    waiting += [Waiting(f"b{i}", "B", 10 + i) for i in range(10)]
    demand = {t.task_id: Resources(cpu=1, mem=4) for t in waiting if t.principal == "A"}
    demand |= {t.task_id: Resources(cpu=3, mem=1) for t in waiting if t.principal == "B"}
    started = drf_schedule(waiting, demand, {}, cap, cap)
    assert sorted(started) == ["a0", "a1", "a2", "b0", "b1"]


def test_a_newcomer_starts_before_a_heavy_users_backlog() -> None:
    """Issue 20's scenario in pure form, through the order every node uses
    (node/runqueue.order): one user with 2,000 queued tasks and most of the usage,
    another who arrives later: the newcomer's tasks come first."""
    from swarm import model as m
    from swarm.node.runqueue import QueueView, order

    def spec(tid: str, user: str) -> m.TaskSpec:
        return m.TaskSpec(id=tid, argv=("true",), user=user)

    backlog = [spec(f"h{i}", "heavy") for i in range(2000)]
    late = [spec(f"n{i}", "new") for i in range(50)]
    view = QueueView({"heavy": Resources(slots=72)}, Resources(slots=72), 0.0)
    ids = order(backlog + late, view)
    assert ids[:50] == [f"n{i}" for i in range(50)]
    assert ids[50:] == [f"h{i}" for i in range(2000)]  # then the backlog in arrival order


def test_jain_index_bounds() -> None:
    assert jain_index([1, 1, 1, 1]) == 1.0
    assert math.isclose(jain_index([1, 0, 0, 0]), 0.25)
    assert jain_index([]) == 1.0 and jain_index([0, 0]) == 1.0


# ---------------------------------------------------------------- the usage map

principals = st.sampled_from(["alice", "bob", "carol", "group:ml"])
amounts = st.builds(
    Resources,
    slots=st.floats(0, 1e4),
    cpu=st.floats(0, 1e4),
    mem=st.floats(0, 1e12),
    gpu=st.floats(0, 800),
)
entries = st.builds(
    lambda v, us: OriginUsage(v, tuple(sorted(us.items()))),
    st.integers(1, 5),
    st.dictionaries(principals, st.builds(Decayed, amounts, st.floats(0, 1e6)), max_size=4),
)
maps = st.builds(
    lambda es: UsageMap(tuple(sorted(es.items()))),
    st.dictionaries(st.sampled_from(["n1", "n2", "n3"]), entries, max_size=3),
)


@settings(max_examples=300)
@given(maps, maps, maps)
def test_merge_is_commutative_associative_and_idempotent(
    a: UsageMap, b: UsageMap, c: UsageMap
) -> None:
    assert a.merge(b) == b.merge(a)
    assert a.merge(b).merge(c) == a.merge(b.merge(c))
    assert a.merge(a) == a
    assert a.merge(b).merge(b) == a.merge(b)


def test_the_newest_entry_of_each_origin_wins_and_totals_sum_origins() -> None:
    m = UsageMap().with_local("n1", {"alice": Decayed(Resources(slots=10), 0.0)}, HL, 0.0)
    m2 = m.with_local("n1", {"alice": Decayed(Resources(slots=4), 0.0)}, HL, 0.0)
    other = UsageMap().with_local("n2", {"alice": Decayed(Resources(slots=2), 0.0)}, HL, 0.0)
    merged = m.merge(other).merge(m2)  # m2 arrives last; m (older) again changes nothing
    assert merged.merge(m) == merged
    assert merged.totals(0.0, HL) == {"alice": Resources(slots=6)}
    assert merged.totals(100.0, HL) == {"alice": Resources(slots=3)}


def test_an_origins_entry_is_bounded_and_loses_no_usage() -> None:
    usage = {f"u{i}": Decayed(Resources(slots=float(i)), 0.0) for i in range(1, 11)}
    m = UsageMap().with_local("n1", usage, HL, 0.0, max_principals=4)
    entry = m.entry("n1")
    assert entry is not None and len(entry.usage) == 4
    kept = entry.as_dict()
    assert {"u10", "u9", "u8", OTHERS} == set(kept)
    assert kept[OTHERS].value.slots == sum(range(1, 8))  # u1..u7 summed, none dropped
