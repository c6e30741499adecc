"""Late binding's pure core (policy/latebind.py): stimulus tests for each rule, and a
hypothesis run of several nodes over a lossy, reordering network checking that a
held task ends exactly once (given to one reserved peer, or started at home)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.model import LoadReport, TaskSpec
from swarm.policy.latebind import (
    Cancel,
    Give,
    LateBinding,
    LateConfig,
    Pull,
    Reserve,
    StartHere,
    has_room,
)
from swarm.policy.placement import Needs
from swarm.policy.view import LoadView, PeerEntry

NEEDS = Needs.of(TaskSpec(id="t", argv=("true",)))


def _report(node: str, running: int, *, slots: int = 2, cpus: float = 1.0, queued: int = 0):
    return LoadReport(
        node,
        1,
        weight_sum=float(running + queued),
        running=running,
        queued=queued,
        slots=slots,
        cpus=cpus,
    )


def _view(loads: dict[str, int]) -> LoadView:
    v = LoadView()
    for node, running in loads.items():
        v.put(node, PeerEntry(_report(node, running), 0.0))
    return v


BUSY = _report("h", 1)
FREE = _report("h", 0)


def test_has_room_needs_a_free_slot_an_idle_core_and_an_empty_queue() -> None:
    assert has_room(_report("a", 0))
    assert not has_room(_report("a", 1))  # one core, busy: a second task would share it
    assert has_room(_report("a", 1, cpus=2.0))
    assert not has_room(_report("a", 2, slots=2, cpus=4.0))  # slots full
    assert not has_room(_report("a", 0, queued=1))
    assert has_room(_report("a", 3, slots=8, cpus=0.0))  # no CPU count: slots decide


def test_home_with_room_holds_nothing() -> None:
    lb = LateBinding("h")
    assert lb.hold(0.0, "t1", NEEDS, FREE, _view({"a": 0, "b": 0}), random.Random(1)) == []
    assert lb.held == ()


def test_busy_home_reserves_the_d_least_loaded_of_its_sample() -> None:
    lb = LateBinding("h", LateConfig(d=2, sample=4))
    view = _view({"a": 3, "b": 0, "c": 1, "d": 5, "h": 1})
    acts = lb.hold(0.0, "t1", NEEDS, BUSY, view, random.Random(1))
    assert sorted(acts, key=lambda a: a.peer) == [Reserve("b", "t1"), Reserve("c", "t1")]
    assert lb.held == ("t1",) and lb.next_deadline() == 3.0


def test_first_pull_wins_and_the_others_are_cancelled() -> None:
    lb = LateBinding("h", LateConfig(d=3, sample=3))
    lb.hold(0.0, "t1", NEEDS, BUSY, _view({"a": 0, "b": 0, "c": 0}), random.Random(1))
    acts = lb.on_pull(0.1, "b", "t1")
    assert acts[0] == Give("b", "t1")
    assert sorted(a.peer for a in acts[1:] if isinstance(a, Cancel)) == ["a", "c"]
    assert lb.on_pull(0.2, "a", "t1") == []  # gone
    assert lb.stats.given == 1 and lb.stats.pulls_refused == 1 and lb.held == ()


def test_pull_from_a_node_without_a_reservation_is_refused() -> None:
    lb = LateBinding("h", LateConfig(d=1, sample=1))
    lb.hold(0.0, "t1", NEEDS, BUSY, _view({"a": 0, "b": 0}), random.Random(1))
    (peer,) = [p for p in ("a", "b") if p not in lb._held["t1"].peers]
    assert lb.on_pull(0.1, peer, "t1") == []
    assert lb.is_held("t1")


def test_home_room_starts_its_oldest_held_task_first() -> None:
    lb = LateBinding("h", LateConfig(d=1, sample=1))
    view = _view({"a": 1})
    lb.hold(0.0, "t1", NEEDS, BUSY, view, random.Random(1))
    lb.hold(0.5, "t2", NEEDS, BUSY, view, random.Random(1))
    assert lb.room_here(1.0, BUSY) == []
    assert lb.room_here(1.0, FREE) == [StartHere("t1"), Cancel("a", "t1")]
    assert lb.held == ("t2",)


def test_hold_runs_out_into_the_home_queue() -> None:
    lb = LateBinding("h", LateConfig(d=1, sample=1, hold=2.0))
    lb.hold(0.0, "t1", NEEDS, BUSY, _view({"a": 1}), random.Random(1))
    assert lb.expire(1.9) == []
    assert lb.expire(2.0) == [StartHere("t1"), Cancel("a", "t1")]
    assert lb.stats.released == 1 and lb.next_deadline() is None


def test_no_eligible_peer_means_place_as_usual() -> None:
    lb = LateBinding("h")
    full = LoadView()
    full.put("a", PeerEntry(LoadReport("a", 1, shares=0), 0.0))  # drained
    assert lb.hold(0.0, "t1", NEEDS, BUSY, full, random.Random(1)) == []
    assert lb.held == ()


def test_max_held_bounds_the_book() -> None:
    lb = LateBinding("h", LateConfig(max_held=2))
    view = _view({"a": 0})
    for i in range(3):
        lb.hold(0.0, f"t{i}", NEEDS, BUSY, view, random.Random(1))
    assert lb.held == ("t0", "t1")


def test_reserver_pulls_oldest_one_at_a_time_and_skips_expired() -> None:
    lb = LateBinding("p", LateConfig(hold=1.0, pull_timeout=0.5))
    lb.on_reserve(0.0, "h1", "old")
    lb.on_reserve(0.5, "h2", "t2")
    lb.on_reserve(0.6, "h3", "t3")
    idle = _report("p", 0)
    assert lb.want_pull(1.2, _report("p", 1)) is None  # no room
    assert lb.want_pull(1.2, idle) == Pull("h2", "t2")  # "old" expired at 1.0
    assert lb.want_pull(1.2, idle) is None  # one pull at a time
    lb.on_pull_answer(1.21, "h2", "t2", granted=False)
    assert lb.want_pull(1.21, idle) == Pull("h3", "t3")
    lb.on_pull_answer(1.22, "h3", "t3", granted=True)
    assert lb.want_pull(1.3, idle) is None  # waiting for the task it was given
    lb.arrived("t3")
    assert lb.want_pull(1.3, idle) is None and lb.reservations == 0


def test_granted_pull_whose_task_never_comes_times_out() -> None:
    lb = LateBinding("p", LateConfig(pull_timeout=0.5))
    lb.on_reserve(0.0, "h", "t1")
    lb.on_reserve(0.0, "h", "t2")
    idle = _report("p", 0)
    assert lb.want_pull(0.0, idle) == Pull("h", "t1")
    lb.on_pull_answer(0.01, "h", "t1", granted=True)
    assert lb.want_pull(0.4, idle) is None
    assert lb.want_pull(0.6, idle) == Pull("h", "t2")


def test_cancel_and_duplicate_reservations() -> None:
    lb = LateBinding("p", LateConfig(max_reservations=2))
    lb.on_reserve(0.0, "h", "t1")
    lb.on_reserve(0.1, "h", "t1")  # duplicate: one entry
    assert lb.reservations == 1
    lb.on_cancel("h", "t1")
    lb.on_cancel("h", "t1")
    assert lb.reservations == 0
    lb.on_reserve(0.0, "p", "mine")  # my own: ignored
    for i in range(3):
        lb.on_reserve(0.0, "h", f"t{i}")
    assert lb.reservations == 2
    assert lb.want_pull(0.0, _report("p", 0)) == Pull("h", "t1")  # t0 was dropped


def test_answers_for_another_pull_are_ignored() -> None:
    lb = LateBinding("p")
    lb.on_reserve(0.0, "h", "t1")
    assert lb.want_pull(0.0, _report("p", 0)) == Pull("h", "t1")
    lb.on_pull_answer(0.0, "h", "other", granted=False)
    assert lb.want_pull(0.0, _report("p", 0)) is None


def test_config_validation() -> None:
    for bad in ({"d": 0}, {"hold": 0.0}, {"pull_timeout": -1.0}, {"max_held": 0}):
        with pytest.raises(ValueError):
            LateConfig(**bad)  # type: ignore[arg-type]


# ------------------------------------------------------------ several nodes


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    loss=st.floats(0.0, 0.4),
    steps=st.integers(20, 200),
    stage=st.sampled_from([0.0, 0.05]),
)
def test_a_held_task_ends_exactly_once_over_a_lossy_network(
    seed: int, loss: float, steps: int, stage: float
) -> None:
    """Nodes hold tasks, reserve, pull, give and expire over a network that loses,
    delays and reorders messages. Every held task ends exactly once (given to a peer
    that held a reservation for it, or started at home); none stays held past its hold."""
    rng = random.Random(seed)
    cfg = LateConfig(d=2, sample=3, hold=2.0, pull_timeout=0.3, stage=stage)
    names = ["a", "b", "c", "d"]
    nodes = {n: LateBinding(n, cfg) for n in names}
    running = {n: rng.randint(0, 1) for n in names}
    reserved: dict[str, set[str]] = {}
    ended: dict[str, str] = {}
    net: list[tuple[float, str, object]] = []  # (deliver at, to, message)
    now = 0.0

    def report(n: str) -> LoadReport:
        return _report(n, running[n])

    def send(frm: str, acts: list[object]) -> None:
        for a in acts:
            if isinstance(a, Reserve):
                reserved.setdefault(a.task_id, set()).add(a.peer)
                to, msg = a.peer, ("reserve", frm, a.task_id)
            elif isinstance(a, Cancel):
                to, msg = a.peer, ("cancel", frm, a.task_id)
            elif isinstance(a, Pull):
                to, msg = a.holder, ("pull", frm, a.task_id)
            elif isinstance(a, Give):
                assert a.task_id not in ended, "ended twice"
                assert a.peer in reserved[a.task_id], "given to a node it never reserved"
                ended[a.task_id] = a.peer
                continue
            else:
                assert isinstance(a, StartHere)
                assert a.task_id not in ended, "ended twice"
                ended[a.task_id] = frm
                continue
            if rng.random() >= loss:
                net.append((now + rng.uniform(0.001, 0.2), to, msg))

    for i in range(steps):
        now += rng.uniform(0.0, 0.1)
        for n in names:
            send(n, nodes[n].expire(now))
        due = sorted([m for m in net if m[0] <= now], key=lambda m: m[0])
        net[:] = [m for m in net if m[0] > now]
        for _, to, (kind, frm, tid) in due:  # type: ignore[misc]
            lb = nodes[to]
            if kind == "reserve":
                lb.on_reserve(now, frm, tid)
            elif kind == "cancel":
                lb.on_cancel(frm, tid)
            elif kind == "pull":
                acts = lb.on_pull(now, frm, tid)
                send(to, acts)
                granted = any(isinstance(a, Give) for a in acts)
                if rng.random() >= loss:
                    net.append((now + 0.01, frm, ("answer", to, (tid, granted))))
            else:
                t, granted = tid
                lb.on_pull_answer(now, frm, t, granted)
                if granted:
                    lb.arrived(t)
        n = rng.choice(names)
        r = rng.random()
        if r < 0.4:
            view = LoadView()
            for p in names:
                view.put(p, PeerEntry(report(p), now))
            send(n, nodes[n].hold(now, f"t{i}", NEEDS, report(n), view, rng))
        elif r < 0.7:
            running[n] = 1 - running[n]
        else:
            send(n, nodes[n].room_here(now, report(n)))
            p = nodes[n].want_pull(now, report(n))
            if p is not None:
                send(n, [p])
    now += cfg.hold + 1.0
    for n in names:
        send(n, nodes[n].expire(now))
        assert nodes[n].held == ()
    assert set(ended) == set(reserved)


def test_staged_reservations_reach_the_peers_that_looked_busy_only_if_still_held() -> None:
    """With `stage`, the peers whose report says they have room are reserved first;
    the others `stage` later, if the task is still held then."""
    lb = LateBinding("h", LateConfig(d=3, sample=3, stage=0.02))
    view = _view({"a": 0, "b": 1, "c": 1})
    assert lb.hold(0.0, "t1", NEEDS, BUSY, view, random.Random(1)) == [Reserve("a", "t1")]
    assert lb.next_deadline() == 0.02
    assert lb.expire(0.01) == []
    assert sorted(lb.expire(0.02), key=lambda a: a.peer) == [Reserve("b", "t1"), Reserve("c", "t1")]
    assert lb.stats.reserves == 3
    # pulled by the first wave in time: no second wave, one cancel fewer
    lb.hold(1.0, "t2", NEEDS, BUSY, view, random.Random(1))
    assert lb.on_pull(1.01, "a", "t2") == [Give("a", "t2")]
    assert lb.expire(1.05) == [] and lb.stats.reserves == 4
    # nobody looks free: all at once
    busy_view = _view({"a": 1, "b": 1})
    assert len(lb.hold(2.0, "t3", NEEDS, BUSY, busy_view, random.Random(1))) == 2
