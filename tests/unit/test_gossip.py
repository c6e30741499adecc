"""Broadcast queue (memberlist's transmit-limited queue, with tiers) and the merge rules."""

from __future__ import annotations

import math
import random
from collections.abc import Hashable

from hypothesis import given, settings
from hypothesis import strategies as st

from swarm import model as m
from swarm.cluster import gossip as g
from swarm.cluster.lifeguard import (
    Awareness,
    Suspicion,
    remaining_suspicion_time,
    suspicion_timeout,
)

S = m.MemberState

# ------------------------------------------------------------------ formulas


def test_retransmit_limit_matches_memberlist() -> None:
    assert g.retransmit_limit(4, 1) == 4
    assert g.retransmit_limit(4, 9) == 4
    assert g.retransmit_limit(4, 10) == 8
    assert g.retransmit_limit(4, 99) == 8
    assert g.retransmit_limit(4, 100) == 12
    assert g.retransmit_limit(4, 5000) == 16


def test_push_pull_scale_matches_memberlist() -> None:
    assert g.push_pull_scale(30.0, 32) == 30.0
    assert g.push_pull_scale(30.0, 33) == 60.0
    assert g.push_pull_scale(30.0, 64) == 60.0
    assert g.push_pull_scale(30.0, 65) == 90.0
    assert g.push_pull_scale(30.0, 5000) == 30.0 * (math.ceil(math.log2(5000) - 5) + 1)


def test_suspicion_timeout_matches_memberlist() -> None:
    assert suspicion_timeout(4, 1, 1.0) == 4.0
    assert suspicion_timeout(4, 10, 1.0) == 4.0
    assert math.isclose(suspicion_timeout(4, 100, 1.0), 8.0)
    assert math.isclose(suspicion_timeout(4, 1000, 0.5), 6.0)


def test_remaining_suspicion_time_shrinks_with_confirmations() -> None:
    lo, hi = 2.0, 12.0
    times = [remaining_suspicion_time(c, 3, 0.0, lo, hi) for c in range(4)]
    assert times[0] == hi
    assert times == sorted(times, reverse=True)
    assert times[-1] == lo
    assert remaining_suspicion_time(0, 0, 0.5, lo, hi) == lo - 0.5


def test_suspicion_counts_each_accuser_once() -> None:
    s = Suspicion.new(
        accuser="a", start=10.0, k=2, min_timeout=2.0, max_timeout=12.0, incarnation=1
    )
    assert s.deadline == 22.0
    assert not s.confirm("a")  # the first accuser is not a confirmation
    assert s.confirm("b")
    assert not s.confirm("b")
    assert s.confirm("c")
    assert s.deadline == 12.0
    assert not s.confirm("d")  # k reached


def test_awareness_is_bounded_and_scales() -> None:
    a = Awareness(8)
    a.apply(-3)
    assert a.score == 0
    a.apply(100)
    assert a.score == 7
    assert a.scale(0.5) == 4.0


# ------------------------------------------------------------------ the queue


def _q(*items: tuple[str, int, int]) -> g.BroadcastQueue:
    q = g.BroadcastQueue()
    for key, size, tier in items:
        q.enqueue(key, b"x" * size, kind="k", tier=tier, mult=1)
    return q


def test_take_prefers_fewest_transmits_then_newest() -> None:
    q = g.BroadcastQueue()
    q.enqueue("old", b"o" * 10, kind="k", tier=0, mult=4)
    q.take(100, n_nodes=10)  # "old" now has one transmit
    q.enqueue("new1", b"a" * 10, kind="k", tier=0, mult=4)
    q.enqueue("new2", b"b" * 10, kind="k", tier=0, mult=4)
    picked = [t[0] for t in q.take(2 * 13, n_nodes=10)]
    assert picked == ["new2", "new1"]  # untransmitted first, newest first
    picked = [t[0] for t in q.take(3 * 13, n_nodes=10)]
    assert picked == ["new2", "new1", "old"]  # all at one transmit: newest first


def test_retransmit_limit_removes_items() -> None:
    q = g.BroadcastQueue()
    q.enqueue("a", b"a", kind="k", tier=0, mult=2)
    n = 50  # limit = 2 * ceil(log10(51)) = 4
    for _ in range(4):
        assert [t[0] for t in q.take(100, n_nodes=n)] == ["a"]
    assert q.take(100, n_nodes=n) == []
    assert len(q) == 0


def test_invalidation_replaces_and_resets_count() -> None:
    q = g.BroadcastQueue()
    q.enqueue(("m", "x"), b"v1", kind="k", tier=0, mult=4)
    q.take(100, n_nodes=3)
    assert q.transmits(("m", "x")) == 1
    q.enqueue(("m", "x"), b"v2", kind="k", tier=0, mult=4)
    assert len(q) == 1
    assert q.transmits(("m", "x")) == 0
    assert [t[2] for t in q.take(100, n_nodes=3)] == [b"v2"]


def test_membership_tier_goes_first_and_load_is_capped() -> None:
    q = _q(("load1", 100, g.LOAD_TIER), ("load2", 100, g.LOAD_TIER), ("mem", 100, g.MEMBER_TIER))
    q.enqueue("app", b"y" * 100, kind="k", tier=g.APP_TIER, mult=1)
    taken = q.take(1000, n_nodes=3, tier_caps={g.LOAD_TIER: 110})
    assert [t[0] for t in taken] == ["mem", "app", "load2"]
    # when membership news fills the packet, load waits
    q2 = _q(("mem", 200, g.MEMBER_TIER), ("load", 50, g.LOAD_TIER))
    assert [t[0] for t in q2.take(210, n_nodes=3)] == ["mem"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 30), st.integers(1, 300), st.integers(0, 2)), max_size=60),
    st.integers(20, 1400),
)
def test_take_never_exceeds_budget(items: list[tuple[int, int, int]], budget: int) -> None:
    q = g.BroadcastQueue()
    for key, size, tier in items:
        q.enqueue(key, b"z" * size, kind="k", tier=tier, mult=3)
    for _ in range(5):
        taken = q.take(budget, n_nodes=100, tier_caps={g.LOAD_TIER: budget // 2})
        assert sum(g.packed_size(t[2]) for t in taken) <= budget
        final_tier: dict[Hashable, int] = {k: tier for k, _, tier in items}  # last one wins
        load = [t for t in taken if final_tier[t[0]] == g.LOAD_TIER]
        assert sum(g.packed_size(t[2]) for t in load) <= budget // 2
        assert len({t[0] for t in taken}) == len(taken)


# --------------------------------------------------------------- merge rules

_nodes = st.sampled_from(["a", "b", "c"])
_records = st.builds(
    lambda node, state, inc, addr: m.Member(
        node=node, addr=addr, port=7946, state=state, incarnation=inc, cluster="c"
    ),
    _nodes,
    st.sampled_from(list(S)),
    st.integers(0, 3),
    st.sampled_from(["10.0.0.1", "10.0.0.2"]),
)
_reports = st.builds(
    lambda node, version, q: m.LoadReport(node=node, version=version, queued=q),
    _nodes,
    st.integers(0, 5),
    st.integers(0, 3),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_records, max_size=12), st.randoms(use_true_random=False), st.booleans())
def test_member_merge_is_order_independent_and_idempotent(
    recs: list[m.Member], rnd: random.Random, push_pull: bool
) -> None:
    a = g.merge_view({}, recs, push_pull=push_pull)
    shuffled = list(recs)
    rnd.shuffle(shuffled)
    b = g.merge_view({}, shuffled, push_pull=push_pull)
    assert a == b
    assert g.merge_view(a, recs, push_pull=push_pull) == a  # idempotent


@settings(max_examples=100, deadline=None)
@given(
    st.lists(_records, max_size=8), st.lists(_records, max_size=8), st.lists(_records, max_size=8)
)
def test_push_pull_state_merge_is_commutative_and_associative(
    x: list[m.Member], y: list[m.Member], z: list[m.Member]
) -> None:
    def pp(view: dict[str, m.Member], recs: list[m.Member]) -> dict[str, m.Member]:
        return g.merge_view(view, recs, push_pull=True)

    vx = pp({}, x)
    assert pp(pp(vx, y), z) == pp(pp(vx, z), y)
    assert pp(pp({}, y), x) == pp(pp({}, x), y)


def test_precedence_rules() -> None:
    alive = m.Member("a", "h", 1, S.ALIVE, 2)
    suspect = m.Member("a", "h", 1, S.SUSPECT, 2)
    dead = m.Member("a", "h", 1, S.DEAD, 2)
    left = m.Member("a", "h", 1, S.LEFT, 2)
    refuted = m.Member("a", "h", 1, S.ALIVE, 3)
    assert g.merge_member(alive, suspect) is suspect
    assert g.merge_member(suspect, alive) is suspect
    assert g.merge_member(dead, suspect) is dead
    assert g.merge_member(dead, left) is left
    assert g.merge_member(left, refuted) is refuted  # rejoin with a higher incarnation
    assert g.soften(dead) == suspect
    assert g.soften(left) is left


@settings(max_examples=150, deadline=None)
@given(st.lists(_reports, max_size=12), st.randoms(use_true_random=False))
def test_load_merge_newest_version_wins_in_any_order(
    reports: list[m.LoadReport], rnd: random.Random
) -> None:
    # distinct (node, version) pairs: a node never publishes two reports with one version
    uniq = {(r.node, r.version): r for r in reports}
    reps = list(uniq.values())
    a = g.merge_loads({}, reps)
    shuffled = list(reps)
    rnd.shuffle(shuffled)
    assert g.merge_loads({}, shuffled) == a
    assert g.merge_loads(a, reps) == a
    for node, r in a.items():
        assert r.version == max(x.version for x in reps if x.node == node)


def test_prune_drops_most_transmitted_first() -> None:
    q = g.BroadcastQueue()
    for i in range(6):
        q.enqueue(f"l{i}", b"l" * 10, kind="load", tier=g.LOAD_TIER, mult=10)
    taken = q.take(3 * 12, n_nodes=100)  # three fit: the newest go out once
    assert [t[0] for t in taken] == ["l5", "l4", "l3"]
    q.enqueue("m", b"m", kind="member", tier=g.MEMBER_TIER, mult=10)
    assert q.prune(g.LOAD_TIER, 4) == 2
    assert q.tier_len(g.LOAD_TIER) == 4
    # all three at one transmit; the oldest two of them go
    assert {k for k in ("l0", "l1", "l2", "l3", "l4", "l5") if k in q} == {"l0", "l1", "l2", "l5"}
    assert "m" in q  # other tiers untouched
    assert q.prune(g.LOAD_TIER, 10) == 0


def test_only_tier() -> None:
    q = g.BroadcastQueue()
    assert not q.only_tier(g.LOAD_TIER)
    q.enqueue("l", b"l", kind="load", tier=g.LOAD_TIER, mult=1)
    assert q.only_tier(g.LOAD_TIER)
    q.enqueue("m", b"m", kind="member", tier=g.MEMBER_TIER, mult=1)
    assert not q.only_tier(g.LOAD_TIER)
    q.remove("m")
    assert q.only_tier(g.LOAD_TIER)


def test_suspicions_yield_to_refutations() -> None:
    q = g.BroadcastQueue()
    q.enqueue(("m", "a"), b"s" * 40, kind="member", tier=g.SUSPECT_TIER, mult=4)
    q.enqueue(("m", "b"), b"r" * 40, kind="member", tier=g.MEMBER_TIER, mult=4)
    assert [t[0] for t in q.take(42, n_nodes=10)] == [("m", "b")]
    # the same key moves between tiers: a refutation replaces the queued suspicion
    q.enqueue(("m", "a"), b"r" * 40, kind="member", tier=g.MEMBER_TIER, mult=4)
    assert len(q) == 2 and q.tier_len(g.SUSPECT_TIER) == 0
