"""The run queue's order, local preemption and the quota gate (node/runqueue.py), and
what a node gossips for them (bands, groups, usage in its load report)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarm import codec, wire
from swarm import model as m
from swarm.node import events as ev
from swarm.node import runqueue as rq
from swarm.node.state import Settings
from swarm.policy import fairness as fair
from swarm.policy import placement as pl
from swarm.policy import quota as qu
from swarm.policy.sharing import parse

from .node_harness import FakeNode

S = m.TaskState


def spec(
    tid: str, *, user: str = "alice", priority: int = 50, group: str = "", **kw: object
) -> m.TaskSpec:
    return m.TaskSpec(
        id=tid, argv=("true",), user=user, uid=1000, priority=priority, group=group, **kw
    )  # type: ignore[arg-type]


def view(usage: dict[str, float], slots: float = 10.0) -> rq.QueueView:
    return rq.QueueView(
        {p: fair.Resources(slots=v) for p, v in usage.items()}, fair.Resources(slots=slots), 0.0
    )


# ------------------------------------------------------------------ order


def test_higher_priority_first_then_smallest_share_then_arrival() -> None:
    specs = [
        spec("a1", user="alice"),
        spec("a2", user="alice"),
        spec("b1", user="bob"),
        spec("h1", user="alice", priority=100),
        spec("b2", user="bob"),
    ]
    # alice used 5 of 10 slots, bob 1: bob's tasks go first within `normal`
    assert rq.order(specs, view({"alice": 5.0, "bob": 1.0})) == ["h1", "b1", "b2", "a1", "a2"]


def test_weights_scale_the_share() -> None:
    specs = [spec("a", user="alice"), spec("b", user="bob")]
    qv = view({"alice": 4.0, "bob": 2.0})
    assert rq.order(specs, qv) == ["b", "a"]
    assert rq.order(specs, qv, {"alice": 4.0}) == ["a", "b"]  # 4/4 < 2/1


users = st.sampled_from(["u1", "u2", "u3", "u4"])
prios = st.sampled_from([10, 50, 100])


@given(
    st.lists(st.tuples(users, prios), max_size=40),
    st.dictionaries(users, st.floats(0, 100, allow_nan=False)),
)
def test_order_is_a_permutation_by_class_share_arrival(
    tasks: list[tuple[str, int]], usage: dict[str, float]
) -> None:
    specs = [spec(f"t{i}", user=u, priority=p) for i, (u, p) in enumerate(tasks)]
    qv = view(usage, slots=100.0)
    out = rq.order(specs, qv)
    assert sorted(out) == sorted(s.id for s in specs)
    by = {s.id: s for s in specs}
    keys = [
        (
            -by[t].priority,
            fair.dominant_share(qv.usage.get(by[t].user or "", fair.NOTHING), qv.capacity),
            int(t[1:]),
        )
        for t in out
    ]
    assert keys == sorted(keys)  # class, then share, then arrival: never out of order


# ------------------------------------------------------------- preemption


def node_with(slots: int = 2, **sharing: object) -> FakeNode:
    return FakeNode("n1", settings=Settings(slots=slots, sharing=parse(None, None, **sharing)))  # type: ignore[arg-type]


def start(n: FakeNode, s: m.TaskSpec, wall: float) -> None:
    n.submit(s, wall)
    n.run_here(s.id)
    assert n.try_start(s.id, wall=wall) is None


def test_a_high_task_preempts_the_newest_low_one() -> None:
    n = node_with(slots=2)
    start(n, spec("low-old", priority=10), wall=1.0)
    start(n, spec("low-new", priority=10), wall=5.0)
    n.submit(spec("urgent", priority=100), 6.0)
    n.run_here("urgent")
    out = n.state.preempt_for("urgent", now=6.0, wall=6.0)
    n.run(out)
    assert [p.task_id for p in n.preempted] == ["low-new"]  # least work lost: newest
    assert "preempted by urgent (priority high > low)" in n.preempted[0].cause
    assert n.state.explains["low-new"][-1]["outcome"] == "preempted"
    # asked again while the victim is still stopping: nothing more is stopped
    assert n.state.preempt_for("urgent", now=6.1, wall=6.1) == []


def test_no_preemption_within_a_class_or_under_the_gap() -> None:
    n = node_with(slots=1, preempt_min_gap=60)
    start(n, spec("normal", priority=50), wall=1.0)
    n.submit(spec("high", priority=100), 2.0)
    n.run_here("high")
    assert n.state.preempt_for("high", now=2.0, wall=2.0) == []  # gap 50 < 60
    m2 = node_with(slots=1)
    start(m2, spec("n1", priority=50), wall=1.0)
    m2.submit(spec("n2", priority=50), 2.0)
    m2.run_here("n2")
    assert m2.state.preempt_for("n2", now=2.0, wall=2.0) == []


def test_preemption_is_rate_limited_and_can_be_off() -> None:
    n = node_with(slots=3, preempt_per_minute=2)
    for i in range(3):
        start(n, spec(f"low{i}", priority=10), wall=float(i))
    for i in range(3):
        n.submit(spec(f"hi{i}", priority=100), 10.0)
        n.run_here(f"hi{i}")
        n.run(n.state.preempt_for(f"hi{i}", now=10.0, wall=10.0 + i))
    assert len(n.preempted) == 2
    n.run(n.state.preempt_for("hi2", now=80.0, wall=80.0))  # a minute later: allowed again
    assert len(n.preempted) == 3
    off = node_with(slots=1, preempt=False)
    start(off, spec("low", priority=10), wall=1.0)
    off.submit(spec("hi", priority=100), 2.0)
    off.run_here("hi")
    assert off.state.preempt_for("hi", now=2.0, wall=2.0) == []


def test_a_checkpointing_victim_is_asked_to_checkpoint() -> None:
    n = node_with(slots=1)
    start(n, spec("ck", priority=10, migrate=m.MigrateMode.CHECKPOINT), wall=1.0)
    n.submit(spec("hi", priority=100), 2.0)
    n.run_here("hi")
    n.run(n.state.preempt_for("hi", now=2.0, wall=2.0))
    assert n.preempted == [ev.Preempt("ck", n.preempted[0].cause, checkpoint=True)]


def test_a_preempted_task_back_in_the_queue_is_no_longer_stopping() -> None:
    n = node_with(slots=1)
    start(n, spec("low", priority=10), wall=1.0)
    n.submit(spec("hi", priority=100), 2.0)
    n.run_here("hi")
    n.run(n.state.preempt_for("hi", now=2.0, wall=2.0))
    n.running.discard("low")
    back = n.state.records.apply("low", S.QUEUED, 3.0, n.preempted[0].cause)
    n.run(n.state.on_ended(back, 3.0, 3.0))
    assert "low" not in n.state.preempting
    assert back.history[-1].cause.startswith("preempted by hi")


# ------------------------------------------------------------------ quota


def capped(cap: float, floor: float = 0.0) -> FakeNode:
    sharing = parse(None, {"ml": {"quota-max": cap}}, quota_floor=floor)
    return FakeNode("n1", settings=Settings(slots=8, sharing=sharing))


def test_a_group_at_its_cap_starts_nothing_more_here() -> None:
    n = capped(2)
    for i in range(3):
        n.submit(spec(f"g{i}", group="ml"), 1.0)
        n.run_here(f"g{i}")
    assert n.try_start("g0") is None and n.try_start("g1") is None
    why = n.try_start("g2")
    assert why is not None and why.startswith("group ml at its quota")
    n.submit(spec("free"), 1.0)  # another group (none) is not held back
    n.run_here("free")
    assert n.try_start("free") is None


def test_the_cap_is_split_by_gossiped_demand() -> None:
    sharing = parse(None, {"ml": {"quota-max": 4}})
    peers = {"p1": (("ml", 3, 0),), "p2": (("ml", 3, 0),)}
    # nothing runs: 4 slots split by queued demand 2 : 3 : 3, this node gets one
    assert rq.quota_refusal(sharing, spec("x", group="ml"), "n1", peers, 0, 2) is None
    # two run here: the 2 slots left go to the peers' larger demand
    why = rq.quota_refusal(sharing, spec("x", group="ml"), "n1", peers, 2, 1)
    assert why is not None and why.startswith("group ml at its quota: 2 of 4 slots run")
    # what runs elsewhere counts against the cap as well
    busy = {"p1": (("ml", 0, 4),)}
    assert rq.quota_refusal(sharing, spec("x", group="ml"), "n1", busy, 0, 1) is not None
    # the configured floor lets a node start one it has demand for (a bounded overshoot)
    floored = parse(None, {"ml": {"quota-max": 4}}, quota_floor=1)
    assert rq.quota_refusal(floored, spec("x", group="ml"), "n1", busy, 0, 1) is None


def test_three_nodes_sharing_a_cap_of_two_start_two_in_all() -> None:
    sharing = parse(None, {"ml": {"quota-max": 2}})
    rows = {"a": (("ml", 2, 0),), "b": (("ml", 2, 0),), "c": (("ml", 2, 0),)}
    allowed = [
        rq.quota_refusal(
            sharing, spec("x", group="ml"), n, {k: v for k, v in rows.items() if k != n}, 0, 2
        )
        is None
        for n in rows
    ]
    assert allowed == [True, True, False]  # largest remainder, ties by name


# ---------------------------------------------------------- what is gossiped


def test_the_report_carries_bands_groups_and_usage() -> None:
    n = capped(8)
    start(n, spec("a", user="alice", priority=10, group="ml"), wall=100.0)
    n.submit(spec("b", user="bob", priority=100), 100.0)
    n.run_here("b")
    r = n.state.local_report(160.0)
    assert dict(r.bands) == {10: 1.0, 100: 1.0}
    assert r.groups == (("ml", 0, 1),)
    usage = {u[0]: u[1:] for u in r.usage}
    assert usage["alice"][0] == pytest.approx(60.0, rel=1e-3)  # one slot for 60 s
    assert usage["group:ml"][0] == pytest.approx(60.0, rel=1e-3)
    assert "bob" not in usage  # queued, nothing used yet
    again = codec.load_report_from_wire(wire.unpack(wire.pack(codec.load_report_to_wire(r))))
    assert again == r


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("bands", [[1, 2, 3]]),
        ("bands", [["x", 1.0]]),
        ("groups", [["../x", 1, 1]]),
        ("groups", [["ml", -1, 1]]),
        ("usage", [["alice", 1.0, 1.0, 1.0]]),
        ("usage", [["alice", -1.0, 0, 0, 0]]),
        ("usage", [["", 1.0, 0, 0, 0]]),
        ("bands", [[i, 1.0] for i in range(17)]),
    ],
)
def test_a_bad_report_field_is_refused_by_name(field: str, value: object) -> None:
    obj = codec.load_report_to_wire(m.LoadReport("p", 1))
    obj[field] = value
    with pytest.raises(wire.SchemaError) as e:
        codec.load_report_from_wire(obj)
    assert field in str(e.value)


def test_urgent_work_is_not_repelled_by_preemptible_work() -> None:
    full_of_low = m.LoadReport("busy", 1, weight_sum=8.0, bands=((10, 8.0),))
    half_busy = m.LoadReport("other", 1, weight_sum=2.0, bands=((100, 2.0),))
    hi = pl.Needs.of(spec("u", priority=100))
    lo = pl.Needs.of(spec("l", priority=10))
    assert pl.needs_projected(full_of_low, hi) < pl.needs_projected(half_busy, hi)
    assert pl.needs_projected(full_of_low, lo) > pl.needs_projected(half_busy, lo)
    # a report without bands (an older agent) counts all of its weight
    assert pl.needs_projected(attrs.evolve(full_of_low, bands=()), hi) > pl.needs_projected(
        half_busy, hi
    )


def test_task_spec_carries_priority_and_group_and_refuses_a_bad_group() -> None:
    s = spec("t", priority=100, group="ml")
    assert codec.task_spec_from_wire(codec.task_spec_to_wire(s)) == s
    bad = codec.task_spec_to_wire(s) | {"group": "a/b"}
    with pytest.raises(wire.SchemaError, match="group"):
        codec.task_spec_from_wire(bad)


def test_a_report_full_of_users_groups_and_bands_still_fits_its_datagram_share() -> None:
    from swarm.cluster.membership_config import MembershipConfig
    from swarm.cluster.messages import load_to_compact

    n = FakeNode("node-with-a-long-name-0001", settings=Settings(slots=64))
    for i in range(40):
        s = spec(
            f"t{i}",
            user=f"user-with-a-long-name-{i:03d}",
            priority=i,
            group=f"group-with-a-long-name-{i % 20:03d}",
            cpu=1.5,
            mem=1 << 30,
        )
        start(n, s, wall=float(i))
    r = attrs.evolve(
        n.state.local_report(86_400.0),
        gpus=tuple(m.GpuDeviceFree(i, 100, 80 << 30, 80 << 30) for i in range(8)),
        cpus=64.0,
        mem_total=1 << 40,
        mem_available=1 << 39,
        isolation="cgroup2",
        criu=True,
    )
    assert r.usage and r.groups and r.bands
    # each slot-second counts for its user and for its group; none is dropped
    assert sum(u[1] for u in r.usage) == pytest.approx(
        2 * sum(86_400.0 - i for i in range(40)),
        rel=1e-3,  # the first seconds decay
    )
    c = MembershipConfig()
    assert len(wire.pack(load_to_compact(r))) <= c.udp_budget * c.load_packet_share


def test_transfer_gives_away_urgent_work_and_the_least_served_users_first() -> None:
    from swarm.policy.transfer import movable_tasks

    n = node_with(slots=1)
    for s in (
        spec("alice-old", user="alice", submitted_at=1.0),
        spec("bob-new", user="bob", submitted_at=2.0),
        spec("urgent", user="alice", priority=100, submitted_at=3.0),
        spec("alice-new", user="alice", submitted_at=4.0),
    ):
        n.submit(s, 0.0)
        n.run_here(s.id)
    # the runner keeps its queue in start order: bob (below his share) before alice
    order = rq.order(
        [n.state.records.active[t].spec for t in n.queue], view({"alice": 5.0, "bob": 0.0})
    )
    n.queue.clear()
    n.queue.extend(order)
    moved = [t.id for t in movable_tasks(n.state.queue_view(1000.0), 1000.0, 0.2)]
    assert moved == ["urgent", "bob-new", "alice-old", "alice-new"]


def test_a_group_below_its_min_reclaims_borrowed_slots_whatever_their_class() -> None:
    sharing = parse(
        None,
        {"ml": {"quota-min": 2}, "web": {"quota-min": 1}},
    )
    n = FakeNode("n1", settings=Settings(slots=3, sharing=sharing))
    for i in range(3):  # web borrowed all three slots, at a high class
        start(n, spec(f"web{i}", group="web", priority=100), wall=float(i))
    n.submit(spec("ml0", group="ml"), 5.0)
    n.run_here("ml0")
    n.run(n.state.preempt_for("ml0", now=5.0, wall=5.0))
    assert [p.task_id for p in n.preempted] == ["web2"]
    assert "reclaims its quota-min from group web" in n.preempted[0].cause
    # a group at its min reclaims nothing; nor does work without a min
    n2 = FakeNode("n2", settings=Settings(slots=1, sharing=sharing))
    start(n2, spec("web", group="web", priority=100), wall=0.0)
    n2.submit(spec("plain"), 1.0)
    n2.run_here("plain")
    assert n2.state.preempt_for("plain", now=1.0, wall=1.0) == []
    n3 = FakeNode("n3", settings=Settings(slots=1, sharing=sharing))
    start(n3, spec("web", group="web", priority=100), wall=0.0)  # web at its min (1)
    n3.submit(spec("ml", group="ml"), 1.0)
    n3.run_here("ml")
    assert n3.state.preempt_for("ml", now=1.0, wall=1.0) == []


def test_a_groups_weight_scales_its_members_share() -> None:
    specs = [spec("a", user="alice", group="big"), spec("b", user="bob", group="small")]
    qv = view({"alice": 4.0, "bob": 2.0})
    assert rq.order(specs, qv) == ["b", "a"]
    assert rq.order(specs, qv, parse(None, {"big": {"weight": 4}}).weights()) == ["a", "b"]


def test_usage_is_journaled_and_restored_after_a_restart() -> None:
    n = node_with(slots=1)
    start(n, spec("a", user="alice"), wall=100.0)
    rec = n.state.usage_record(160.0)
    (put,) = rec.ops
    assert isinstance(put, ev.Put) and put.key == "usage"
    again = node_with(slots=1)
    again.state.restore_usage(wire.unpack(wire.pack(put.value)))
    assert again.state.used["alice"].at_time(160.0, 86_400.0).slots == pytest.approx(60.0)
    # the timers write it once a minute
    n.state.start_timers(0.0)
    out = n.state.wake_all(61.0, 161.0)
    assert any(isinstance(i, ev.Persist) and i.ops[0].key == "usage" for i in out)


def test_a_quota_refusal_is_looked_up_once_until_what_it_read_changes() -> None:
    n = capped(1)
    for i in range(3):
        n.submit(spec(f"g{i}", group="ml"), 1.0)
        n.run_here(f"g{i}")
    assert n.try_start("g0") is None
    calls = []
    real = n.state._quota_refusal

    def counting(s: m.TaskSpec, wall: float | None = None) -> str | None:
        calls.append(s.id)
        return real(s, wall)

    n.state._quota_refusal = counting  # type: ignore[method-assign]
    assert n.try_start("g1") is not None and n.try_start("g2") is not None
    assert calls == ["g1"]  # the second look used the first's answer
    peer = m.LoadReport("p1", 1, groups=(("ml", 1, 0),))
    n.run(n.state.on_peer_report(peer, 2.0, 2.0, 2.0))
    assert n.try_start("g2") is not None and calls == ["g1", "g2"]  # looked again
    n.finish("g0")
    assert n.try_start("g1") is None  # the slot of the group freed: it starts


def test_a_node_counts_its_own_demand_as_the_others_see_it() -> None:
    assert qu.lagged_demand([], 10.0, 2.0, 3) == 0  # nothing reported yet
    log = [(1.0, 1), (5.0, 4), (9.5, 6)]
    assert qu.lagged_demand(log, 10.0, 2.0, 6) == 4  # as reported 2 s ago
    assert qu.lagged_demand(log, 10.0, 2.0, 2) == 2  # never more than now
    assert qu.lagged_demand(log, 10.0, 0.0, 6) == 6  # no lag: fresh
    # in a node: new demand of a capped group starts once its report is old enough
    n = capped(4)
    n.submit(spec("g0", group="ml"), 0.0)
    n.run_here("g0")
    t = n.state.records.active["g0"]
    n.state.local_report(100.0)  # a report says: 1 queued
    why, _ = n.state.can_start(t, 100.5)
    assert why is not None and "at its quota" in why
    n.state.quota_memo.clear()  # the report tick retries (timers.wake_all)
    why, _ = n.state.can_start(t, 102.5)
    assert why is None


def test_the_report_tick_lets_a_lapsed_quota_refusal_be_asked_again() -> None:
    n = capped(4)
    n.state.start_timers(0.0)
    n.state.quota_memo["ml"] = (n.state.quota_epoch, "group ml at its quota")
    out = n.state.wake_all(1.0, 101.0)
    assert any(isinstance(i, ev.KickRunner) for i in out) and not n.state.quota_memo


def test_a_change_of_group_rows_or_bands_is_news_but_a_little_more_usage_is_not() -> None:
    from swarm.node.loadstate import changed_meaningfully

    base = m.LoadReport("n", 1, groups=(("ml", 1, 1),), usage=(("alice", 100.0, 0, 0, 0),))
    assert changed_meaningfully(base, attrs.evolve(base, groups=(("ml", 0, 1),)))
    assert changed_meaningfully(base, attrs.evolve(base, bands=((10, 1.0),)))
    assert not changed_meaningfully(base, attrs.evolve(base, usage=(("alice", 105.0, 0, 0, 0),)))
    assert changed_meaningfully(base, attrs.evolve(base, usage=(("alice", 120.0, 0, 0, 0),)))
    assert changed_meaningfully(base, attrs.evolve(base, usage=(("bob", 100.0, 0, 0, 0),)))


def test_the_reports_group_rows_follow_a_start_at_once() -> None:
    n = capped(4)
    n.submit(spec("g0", group="ml"), 0.0)
    n.run_here("g0")
    assert n.state.local_report(100.0).groups == (("ml", 1, 0),)
    assert n.try_start("g0", wall=100.1) is None
    assert n.state.local_report(100.1).groups == (("ml", 0, 1),)  # not the cached row


def test_cluster_usage_is_the_usage_maps_total_with_each_report_decayed_from_its_date() -> None:
    fresh = m.LoadReport("a", 100_000, usage=(("alice", 10.0, 0, 0, 0),))
    old = m.LoadReport("b", 100_000 - 86_400_000, usage=(("alice", 8.0, 0, 0, 0),))
    got = rq.usage_totals([fresh, old], now=100.0, half_life=86_400.0)
    assert got["alice"].slots == pytest.approx(10.0 + 4.0)  # a day old: half


# ------------------------------------------------------- transfer's queue view


def _fresh_queue_view(n: FakeNode, now: float) -> list[tuple[object, ...]]:
    """queue_view's answer worked out from scratch (no entry kept between calls)."""
    from swarm.node.moves import keeps_state

    st_ = n.state
    users: dict[tuple[object, ...], int] = {}
    out = []
    for tid in n.queue:
        t = st_.records.active.get(tid)
        if t is None or t.state is not S.QUEUED:
            continue
        user = users.setdefault((t.spec.priority, t.spec.user, t.spec.uid), len(users))
        pinned = (
            t.spec.is_global
            or (t.spec.home != st_.node and not st_.guest.may_run(tid))
            or (keeps_state(t.spec) and tid in st_.state_here)
        )
        arrived = st_.arrived.get(tid, now)
        rank = (-t.spec.priority, user)
        out.append((tid, pl.Needs.of(t.spec), t.spec.submitted_at, arrived, pinned, rank))
    return out


def _as_rows(q: list[object]) -> list[tuple[object, ...]]:
    return [(x.id, x.needs, x.queued_at, x.arrived_at, x.pinned, x.rank) for x in q]  # type: ignore[attr-defined]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["submit", "start", "reorder", "state", "arrive", "view"]),
            st.integers(0, 7),
            users,
            prios,
        ),
        max_size=40,
    )
)
def test_queue_view_keeps_entries_only_while_their_inputs_hold(
    steps: list[tuple[str, int, str, int]],
) -> None:
    """The transfer policy's view of the queue reuses each task's entry between calls
    (issue 23: with thousands queued it ran several times a second); whatever changes
    in between (records, order, users' ranks, checkpoints held here, arrivals), it
    answers as if worked out afresh, and hands back the same entry when nothing did."""
    n = node_with(slots=2)
    now = 0.0
    for op, k, user, prio in steps:
        now += 1.0
        tid = f"t{k}"
        if op == "submit" and tid not in n.state.records.active:
            migrate = m.MigrateMode.CHECKPOINT if k % 2 else m.MigrateMode.RESTART
            n.submit(spec(tid, user=user, priority=prio, submitted_at=now, migrate=migrate), now)
            n.run_here(tid, now)
        elif op == "start" and tid in n.queue:
            n.try_start(tid, now=now, wall=now)
        elif op == "reorder" and len(n.queue) > 1:
            n.queue.rotate(k)
        elif op == "state" and tid in n.queue:
            n.state.note_state(tid, tid not in n.state.state_here)
        elif op == "arrive" and tid in n.queue:
            n.state.arrived[tid] = now
        before = n.state.queue_view(now)
        again = n.state.queue_view(now)
        assert _as_rows(before) == _fresh_queue_view(n, now)
        assert all(a is b for a, b in zip(before, again, strict=True))  # kept, not rebuilt
