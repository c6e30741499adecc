"""Share ledger rules and the global task set CRDT."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm import codec, wire
from swarm.model import LoadReport, TaskSpec
from swarm.policy.shares import (
    GlobalTasks,
    LedgerError,
    ShareLedger,
    cluster_has_shares,
    global_delta,
)
from swarm.policy.view import PeerEntry


def spec(i: int | str, *, w: float = 1.0, r: int = 0, g: bool = False) -> TaskSpec:
    return TaskSpec(id=f"t{i}", argv=("true",), weight=w, reserve_shares=r, is_global=g)


# ------------------------------------------------------------------- ledger


def test_reservation_consumed_only_while_running() -> None:
    led = ShareLedger(1024)
    led.add(spec(1, r=600))
    assert led.reserved == 0 and led.weight_sum == 1.0 and led.queued == 1
    led.start("t1")
    assert led.reserved == 600 and led.free == 424 and led.running == 1
    led.stop("t1")
    assert led.reserved == 0 and led.queued == 1
    led.start("t1")
    led.remove("t1")
    assert led.reserved == 0 and led.weight_sum == 0.0 and len(led) == 0


def test_reservation_that_does_not_fit_waits() -> None:
    led = ShareLedger(1024)
    led.add(spec(1, r=600))
    led.add(spec(2, r=600))
    led.start("t1")
    assert led.refuse_start("t2") == "reservation of 600 shares exceeds the 424 free here"
    with pytest.raises(LedgerError):
        led.start("t2")
    led.remove("t1")
    led.start("t2")


def test_drained_node_takes_no_new_non_global_task_but_globals_run() -> None:
    led = ShareLedger(0)
    assert led.refuse_new(spec(1)) == "node is draining (shares 0)"
    assert led.refuse_new(spec(2, g=True, r=100)) is None
    led.add(spec(2, g=True, r=100))
    led.start("t2")  # global: may push the free shares below zero
    assert led.free == -100
    led.add(spec(3))
    assert led.refuse_start("t3") is not None


def test_global_task_may_push_shares_below_zero_and_blocks_ordinary_work() -> None:
    led = ShareLedger(100)
    led.add(spec("g", g=True, r=300))
    led.start("tg")
    assert led.free == -200 and led.load() == float("inf")
    assert led.refuse_new(spec(1)) is not None


def test_set_shares_below_reserved_kills_nothing_and_blocks_reserving_starts() -> None:
    led = ShareLedger(1024)
    led.add(spec(1, r=800))
    led.start("t1")
    led.set_shares(500)
    assert led.running == 1 and led.free == -300
    led.add(spec(2, r=1))
    assert led.refuse_start("t2") is not None


def test_bad_shares_and_duplicates_are_typed_errors() -> None:
    led = ShareLedger()
    with pytest.raises(LedgerError):
        led.set_shares(-1)
    with pytest.raises(LedgerError):
        led.set_shares(True)
    led.add(spec(1))
    with pytest.raises(LedgerError):
        led.add(spec(1))
    with pytest.raises(LedgerError):
        led.stop("t1")
    assert led.remove("nope") is None


OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.integers(0, 12),
            st.sampled_from([0, 0, 100, 300, 512, 700, 1024, 2000]),
            st.booleans(),
            st.sampled_from([0.5, 1.0, 2.0]),
        ),
        st.tuples(st.just("start"), st.integers(0, 12)),
        st.tuples(st.just("stop"), st.integers(0, 12)),
        st.tuples(st.just("remove"), st.integers(0, 12)),
        st.tuples(st.just("shares"), st.sampled_from([0, 256, 512, 1024, 2048])),
    ),
    max_size=80,
)


@settings(max_examples=250, deadline=None)
@given(OPS, st.sampled_from([0, 512, 1024, 2048]))
def test_reserved_shares_never_oversubscribed(ops: list[tuple[Any, ...]], shares: int) -> None:
    led = ShareLedger(shares)
    for op in ops:
        kind = op[0]
        tid = f"t{op[1]}"
        try:
            if kind == "add":
                _, i, r, g, w = op
                led.add(spec(i, w=w, r=r, g=g and i % 4 == 0))
            elif kind == "start":
                before_free = led.free
                t = led.get(tid)
                drained = led.draining
                led.start(tid)
                assert t is not None
                if not t.is_global:
                    # an ordinary start never takes more than was free, nor on a drained node
                    assert not drained
                    assert t.reserve_shares <= before_free
                    assert led.free >= 0
            elif kind == "stop":
                led.stop(tid)
            elif kind == "remove":
                led.remove(tid)
            else:
                led.set_shares(op[1])
        except LedgerError:
            pass
        # aggregates always match the task book
        tasks = led.tasks()
        assert led.reserved == sum(t.reserve_shares for t in tasks if t.running)
        assert led.running == sum(1 for t in tasks if t.running)
        assert led.queued == len(tasks) - led.running
        assert abs(led.weight_sum - sum(t.weight for t in tasks)) < 1e-9
        # ordinary running reservations fit the shares unless shares were lowered later
        snap = led.snapshot()
        assert snap.reserved_shares == led.reserved and snap.shares == led.shares


# ------------------------------------------------------------------ CRDT


@st.composite
def replica_histories(draw: st.DrawFn) -> list[list[tuple[str, str]]]:
    """Per-replica op lists. Adds are unique per id (the home node adds it once);
    removes only name ids that replica added or may have heard of."""
    n = draw(st.integers(1, 4))
    ids = [f"g{i}" for i in range(draw(st.integers(1, 8)))]
    owner = {i: draw(st.integers(0, n - 1)) for i in ids}
    hist: list[list[tuple[str, str]]] = [[] for _ in range(n)]
    for i in ids:
        hist[owner[i]].append(("add", i))
    for _ in range(draw(st.integers(0, 8))):
        hist[draw(st.integers(0, n - 1))].append(("remove", draw(st.sampled_from(ids))))
    return hist


def gspec(i: str) -> TaskSpec:
    return TaskSpec(id=i, argv=("run", i), is_global=True)


def apply(h: list[tuple[str, str]], base: GlobalTasks | None = None) -> GlobalTasks:
    s = base or GlobalTasks()
    for op, i in h:
        s = s.add(gspec(i)) if op == "add" else s.remove(i)
    return s


def same(a: GlobalTasks, b: GlobalTasks) -> bool:
    return dict(a.adds) == dict(b.adds) and a.removed == b.removed


@settings(max_examples=150, deadline=None)
@given(replica_histories(), st.randoms(use_true_random=False))
def test_gossip_in_any_order_converges(
    hist: list[list[tuple[str, str]]], rnd: random.Random
) -> None:
    states = [apply(h) for h in hist]
    n = len(states)
    # random pairwise gossip until everyone heard everyone (push-pull merges)
    for _ in range(6 * n * n):
        a, b = rnd.randrange(n), rnd.randrange(n)
        merged = states[a].merge(states[b])
        states[a] = merged
        if rnd.random() < 0.5:
            states[b] = states[b].merge(merged)
    for i in range(n):  # one full sweep so every replica has everything
        for j in range(n):
            states[j] = states[j].merge(states[i])
    final = states[0]
    assert all(same(s, final) for s in states)
    # every node would start exactly the surviving members
    for s in states:
        delta = global_delta(s, (), (), has_shares=True)
        assert [t.id for t in delta.start] == sorted(final.members)


@settings(max_examples=150, deadline=None)
@given(replica_histories(), replica_histories(), replica_histories())
def test_merge_is_commutative_associative_idempotent(
    h1: list[list[tuple[str, str]]],
    h2: list[list[tuple[str, str]]],
    h3: list[list[tuple[str, str]]],
) -> None:
    a, b, c = apply(h1[0]), apply(h2[0]), apply(h3[0])
    assert same(a.merge(b), b.merge(a))
    assert same(a.merge(b).merge(c), a.merge(b.merge(c)))
    assert same(a.merge(a), a)
    assert same(a.merge(b).merge(b), a.merge(b))


def test_removal_wins_over_the_add_it_observed() -> None:
    a = GlobalTasks().add(gspec("g1"))
    b = a.remove("g1")  # b observed the add and removed it
    late = GlobalTasks().add(gspec("g1"))  # the same add arriving late from elsewhere
    assert "g1" not in b
    assert "g1" not in a.merge(b)
    assert "g1" not in late.merge(b).merge(a)
    assert "g1" in a.merge(late)


def test_wire_round_trip_and_strictness() -> None:
    s = GlobalTasks().add(gspec("g1")).add(gspec("g2")).remove("g2")
    obj = wire.unpack(wire.pack(s.to_wire()))
    assert same(GlobalTasks.from_wire(obj), s)
    with pytest.raises(wire.SchemaError):
        GlobalTasks.from_wire({**s.to_wire(), "extra": 1})
    bad = s.to_wire()
    bad["adds"] = [codec.task_spec_to_wire(TaskSpec(id="x", argv=("a",)))]
    with pytest.raises(wire.SchemaError):
        GlobalTasks.from_wire(bad)
    with pytest.raises(wire.VersionMismatch):
        GlobalTasks.from_wire({"v": 99})
    with pytest.raises(ValueError):
        GlobalTasks().add(TaskSpec(id="x", argv=("a",)))


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.floats(),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=12,
    )
)
def test_from_wire_never_crashes_on_garbage(obj: Any) -> None:
    for candidate in (obj, {"adds": obj}, {"removed": obj}, {"adds": [obj]}):
        try:
            GlobalTasks.from_wire(candidate)
        except wire.WireError:
            pass


def test_conflicting_specs_under_one_id_resolve_the_same_everywhere() -> None:
    x = TaskSpec(id="g", argv=("a",), is_global=True)
    y = TaskSpec(id="g", argv=("b",), is_global=True)
    a, b = GlobalTasks().add(x), GlobalTasks().add(y)
    assert a.merge(b).adds["g"] == b.merge(a).adds["g"]


def test_global_delta_start_stop_and_all_drained() -> None:
    s = GlobalTasks().add(gspec("a")).add(gspec("b")).add(gspec("c")).remove("c")
    d = global_delta(s, active={"b", "c", "ordinary"}, finished={"x"}, has_shares=True)
    assert [t.id for t in d.start] == ["a"]
    assert d.stop == ("c",)
    d2 = global_delta(s, active={"c"}, finished=(), has_shares=False)
    assert d2.start == () and d2.stop == ("c",)
    assert global_delta(s, (), {"a", "b"}, has_shares=True).start == ()


def test_cluster_has_shares() -> None:
    drained = LoadReport("me", 1, shares=0)
    view = {f"n{i}": PeerEntry(LoadReport(f"n{i}", 1, shares=0), 0.0) for i in range(3)}
    assert not cluster_has_shares(drained, view)
    view["n9"] = PeerEntry(LoadReport("n9", 1, shares=10), 0.0)
    assert cluster_has_shares(drained, view)
    assert cluster_has_shares(LoadReport("me", 1), {})
