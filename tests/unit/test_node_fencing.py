"""--at-most-once in the pure NodeState (node/fencing.py): a runner starts a fenced
task only under a lease from its home and renews it while the task runs; the home
grants it only to the current holder, and places the task again only once the last
lease it granted has surely lapsed; a fenced run goes back to the home at once;
failover never runs such a task on another node."""

from __future__ import annotations

import math

import pytest

from swarm import codec, wire
from swarm import model as m
from swarm.cluster import handoff as h
from swarm.node import events as ev
from swarm.node.fencing import (
    ASK_AGAIN,
    FENCE_DRIFT,
    FENCE_MARGIN,
    START_LEFT,
    fenced,
)
from swarm.node.state import Settings
from swarm.request_checks import submit_spec

from .node_harness import FakeNet, FakeNode

S = m.TaskState
DEAD, ALIVE = m.MemberState.DEAD, m.MemberState.ALIVE
TTL = 10.0
GRACE = 5.0
HOLD = TTL * (1 + FENCE_DRIFT) + FENCE_MARGIN


def _nodes(*names: str) -> tuple[FakeNode, ...]:
    return tuple(
        FakeNode(n, settings=Settings(home_grace=GRACE, fence_ttl=TTL, replicas=1)) for n in names
    )


def _answer(home: FakeNode, runner: FakeNode, now: float) -> list[bool]:
    """Deliver `runner`'s lease questions to `home`, and its answers back at `now`."""
    out = []
    while runner.asks:
        a = runner.asks.pop(0)
        assert a.dest == home.name
        granted, why = home.state.on_lease_request(runner.name, a.task_id, a.epoch, now)
        ans = ev.LeaseAnswer(now, 1000.0 + now, "x", a.task_id, a.epoch, a.asked_at, granted, why)
        runner.run(runner.state.handle(ans))
        out.append(granted)
    return out


def _committed_at_b(
    at_most_once: bool = True, no_retry: bool = False
) -> tuple[FakeNode, FakeNode, FakeNode, FakeNet]:
    a, b, c = _nodes("A", "B", "C")
    net = FakeNet(a, b, c)
    spec = m.TaskSpec(id="t1", argv=("sleep", "60"), at_most_once=at_most_once, no_retry=no_retry)
    a.submit(spec)
    why, instrs = a.state.offer("t1", "B", 0.0, 0.0)
    assert why is None
    a.run(instrs)
    net.settle()
    assert b.state.guest.may_run("t1") and "t1" in b.queue
    for n in (a, b, c):
        n.state.members_seen(tuple((x, ALIVE) for x in ("A", "B", "C")), 0.0)
    return a, b, c, net


def _tick(n: FakeNode, now: float) -> None:
    n.state.failover_at = 0.0
    n.run(n.state.tick(now, 1000.0 + now))


def _started_at_b(now: float = 1.0) -> tuple[FakeNode, FakeNode, FakeNode, FakeNet]:
    a, b, c, net = _committed_at_b()
    assert b.try_start("t1", now=now) is not None  # waits for its lease
    assert _answer(a, b, now) == [True]
    assert b.try_start("t1", now=now) is None
    return a, b, c, net


def test_a_fenced_task_starts_only_under_a_lease_from_its_home() -> None:
    a, b, _, _ = _committed_at_b()
    why = b.try_start("t1", now=1.0)
    assert why == "waiting for its lease from A (--at-most-once)"
    assert [(x.dest, x.task_id, x.asked_at) for x in b.asks] == [("A", "t1", 1.0)]
    epoch = b.asks[0].epoch
    assert epoch == b.state.guest.entries["t1"].epoch
    # asked again only after ASK_AGAIN without an answer
    b.try_start("t1", now=1.0 + ASK_AGAIN / 2)
    assert len(b.asks) == 1
    b.try_start("t1", now=1.0 + ASK_AGAIN)
    assert len(b.asks) == 2
    b.asks.pop()
    assert _answer(a, b, now=2.5) == [True]
    # the lease runs from when the question left, on the runner's clock
    assert b.state.fence_deadline("t1") == 1.0 + TTL
    assert b.try_start("t1", now=2.6) is None and "t1" in b.running
    assert a.state.fence_granted["t1"] == 2.5


def test_a_start_needs_half_a_lease_left() -> None:
    a, b, _, _ = _committed_at_b()
    b.try_start("t1", now=1.0)
    _answer(a, b, now=1.0)
    late = 1.0 + TTL * (1 - START_LEFT) + 0.01
    assert b.try_start("t1", now=late) is not None
    assert b.asks and b.asks[0].asked_at == late


def test_a_task_run_by_its_home_needs_no_lease() -> None:
    (a,) = _nodes("A")
    a.submit(m.TaskSpec(id="t1", argv=("x",), at_most_once=True))
    a.run_here("t1")
    assert a.try_start("t1", now=1.0) is None and not a.asks


def test_the_home_grants_only_to_the_current_holder_at_its_epoch() -> None:
    a, _b, _, _ = _committed_at_b()
    epoch = a.state.home.entries["t1"].epoch
    assert a.state.on_lease_request("C", "t1", epoch, 1.0)[0] is False
    granted, why = a.state.on_lease_request("B", "t1", epoch + 1, 1.0)
    assert not granted and why.startswith("not yours: epoch")
    assert a.state.on_lease_request("B", "nope", epoch, 1.0) == (False, "no such task here")
    assert "t1" not in a.state.fence_granted
    assert a.state.on_lease_request("B", "t1", epoch, 1.0) == (True, "")


def test_a_refusal_leaves_the_lease_to_lapse_and_never_starts() -> None:
    a, b, _, _ = _committed_at_b()
    b.try_start("t1", now=1.0)
    a.state.home.entries["t1"].epoch += 1  # the home moved on (a fence, say)
    assert _answer(a, b, now=1.0) == [False]
    assert "fence.not_granted" in b.logs
    assert b.try_start("t1", now=2.5) is not None and "t1" not in b.running


def test_a_running_task_renews_its_lease_every_third_of_a_ttl() -> None:
    a, b, _, _ = _started_at_b(now=1.0)
    _tick(b, 1.0 + TTL / 3 - 0.1)
    assert not b.asks
    _tick(b, 1.0 + TTL / 3)
    assert len(b.asks) == 1
    _answer(a, b, now=1.0 + TTL / 3 + 0.5)
    assert b.renewals == [ev.RenewLease("t1", 1.0 + TTL / 3 + TTL)]
    # a lost answer: asked again after ASK_AGAIN, while the lease still holds
    _tick(b, 1.0 + 2 * TTL / 3 + 0.01)
    b.asks.clear()
    _tick(b, 1.0 + 2 * TTL / 3 + 0.02 + ASK_AGAIN)
    assert len(b.asks) == 1


def test_a_lease_never_moves_back() -> None:
    a, b, _, _ = _started_at_b(now=1.0)
    _tick(b, 5.0)
    late = b.asks.pop()
    _tick(b, 6.5)
    newer = b.asks.pop()
    for q in (newer, late):  # the answers arrive out of order
        granted, why = a.state.on_lease_request("B", q.task_id, q.epoch, 7.0)
        b.run(
            b.state.handle(
                ev.LeaseAnswer(7.0, 0.0, "x", q.task_id, q.epoch, q.asked_at, granted, why)
            )
        )
    assert b.state.fence_deadline("t1") == 6.5 + TTL
    assert [r.until for r in b.renewals] == [6.5 + TTL]


def test_the_home_places_again_only_after_the_last_lease_has_surely_lapsed() -> None:
    a, _b, _c, net = _started_at_b(now=1.0)
    granted_at = a.state.fence_granted["t1"]
    net.kill("B", now=3.0, wall=1003.0)
    t = a.state.records.active["t1"]
    assert t.state is S.QUEUED and t.node == "A" and "t1" in a.placements
    out = a.state.place("t1", 3.0, 1003.0)
    assert not a.outbox
    wakes = [i for i in ev_flat(out) if isinstance(i, ev.WakeAt)]
    assert wakes and wakes[0].at == pytest.approx(granted_at + HOLD)
    assert "has surely lapsed" in a.state.explains["t1"][-1]["outcome"]
    a.run(a.state.wake(granted_at + HOLD - 0.01, 1000.0))
    assert a.state.records.active["t1"].node == "A" and "t1" not in a.queue
    a.run(a.state.wake(granted_at + HOLD, 1000.0))
    t = a.state.records.active["t1"]
    assert "t1" in a.queue or a.outbox  # placed: here or offered to C


def ev_flat(out: list[ev.Instruction]) -> list[ev.Instruction]:
    flat: list[ev.Instruction] = []
    for i in out:
        flat += ev_flat(list(i.instructions)) if isinstance(i, ev.Later) else [i]
    return flat


def test_a_fenced_run_goes_back_to_its_home_at_once() -> None:
    a, b, _c, net = _started_at_b(now=1.0)
    b.running.discard("t1")
    done = b.state.records.apply(
        "t1", S.LOST, 1015.0, fenced(b.state.records.active["t1"].spec), signal=9
    )
    b.run([ev.Record(done, durable=True)])
    b.run(b.state.on_ended(done, 15.0, 1015.0))
    [rep] = [s for s in b.outbox if isinstance(s.request, h.Report)]
    assert rep.request.state == "fenced"
    net.settle(now=15.0, wall=1015.0)
    t = a.state.records.active["t1"]
    assert t.state is S.QUEUED and t.node == "A"
    assert "B fenced its run (its lease lapsed): re-queued" in t.history[-1].cause
    assert "t1" not in a.state.fence_granted  # no copy runs: no hold
    assert a.state.fence_hold(t, 15.0) is None
    assert "t1" not in b.state.guest.entries and "t1" not in b.state.fence_leases


def test_a_fenced_no_retry_task_is_lost() -> None:
    a, b, _, net = _committed_at_b(no_retry=True)
    b.try_start("t1", now=1.0)
    _answer(a, b, 1.0)
    assert b.try_start("t1", now=1.0) is None
    net.settle(now=1.5)  # its running report
    b.running.discard("t1")
    done = b.state.records.apply(
        "t1", S.LOST, 1015.0, fenced(b.state.records.active["t1"].spec), signal=9
    )
    b.run(b.state.on_ended(done, 15.0, 1015.0))
    net.settle(now=15.0)
    t = a.state.records.finished["t1"]
    assert t.state is S.LOST and "fenced its run" in t.reason


def test_wire_report_state_fenced_round_trips() -> None:
    r = h.Report("t1", 3, "fenced", signal=9, reason="fenced: x")
    assert h.request_from_wire(h.request_to_wire(r)) == r
    with pytest.raises(wire.SchemaError):
        h.request_from_wire({**h.request_to_wire(r), "state": "zombie"})


def test_a_restarted_home_holds_what_it_placed_out_for_a_full_lease() -> None:
    a, _b, _, net = _started_at_b(now=1.0)
    a.state.fence_granted.clear()  # as after a restart: its grants are unknown
    a.state.fence_since = None
    _tick(a, 100.0)
    assert a.state.fence_since == 100.0
    net.kill("B", now=101.0, wall=1101.0)
    t = a.state.records.active["t1"]
    assert a.state.fence_hold(t, 101.0) == pytest.approx(100.0 + HOLD)
    assert a.state.fence_hold(t, 100.0 + HOLD) is None


def test_failover_never_runs_a_fenced_task_on_another_node() -> None:
    # queued at B (committed, not started): B adopts it as lost, never runs it
    _, b, _, _ = _committed_at_b()
    b.state.members_seen((("A", DEAD),), 1.0)
    _tick(b, 1.0 + GRACE + 0.1)
    t = b.state.records.finished["t1"]
    assert t.state is S.LOST and t.spec.home == "B"
    assert "not run again: its home A is gone" in t.reason
    assert "t1" not in b.queue and "t1" not in b.ledger


def test_failover_lets_a_running_fenced_task_run_out_its_lease() -> None:
    _a, b, _, _ = _started_at_b(now=1.0)
    b.state.members_seen((("A", DEAD),), 2.0)
    _tick(b, 2.0 + GRACE + 0.1)
    t = b.state.records.active["t1"]
    assert t.state is S.RUNNING and t.spec.home == "B"
    # the lease is still A's to renew; nobody else may: it lapses at 1 + TTL
    _tick(b, 9.0)
    assert b.asks and {x.dest for x in b.asks} == {"A"}
    assert b.state.fence_deadline("t1") == 1.0 + TTL


def test_a_replica_adopts_a_fenced_task_as_lost() -> None:
    a, b, c = _nodes("A", "B", "C")
    for n in (a, b, c):
        n.state.members_seen(tuple((x, ALIVE) for x in ("A", "B", "C")), 0.0)
    spec = a.submit(m.TaskSpec(id="t1", argv=("x",), at_most_once=True))
    why, instrs = b.state.on_replica("A", a.state.hold_msg(spec, ("B",)))
    assert why is None
    b.run(instrs)
    b.state.members_seen((("A", DEAD),), 1.0)
    _tick(b, 1.0 + 2 * GRACE + 0.1)
    t = b.state.records.finished["t1"]
    assert t.state is S.LOST and "not run again" in t.reason and "t1" not in b.placements


def test_codec_and_submit_checks_carry_at_most_once() -> None:
    s = m.TaskSpec(id="t1", argv=("x",), at_most_once=True)
    assert codec.task_spec_from_wire(codec.task_spec_to_wire(s)) == s
    plain = codec.task_spec_to_wire(m.TaskSpec(id="t2", argv=("x",)))
    assert "at_most_once" not in plain  # an agent that predates it reads every other task
    req = {"argv": ["x"], "at_most_once": True}
    assert submit_spec(
        wire.Fields(req, "submit"), uid=0, user="root", home="A", now=0.0
    ).at_most_once
    with pytest.raises(wire.SchemaError, match="at_most_once does not apply to a global"):
        submit_spec(
            wire.Fields({**req, "is_global": True}, "submit"), uid=0, user="root", home="A", now=0.0
        )
    assert not math.isnan(HOLD)


def test_a_start_waiting_for_an_unanswered_lease_asks_again_on_the_tick() -> None:
    a, b, _, _ = _committed_at_b()
    b.try_start("t1", now=1.0)
    q = b.asks.pop()
    b.run(b.state.handle(ev.LeaseAnswer(1.5, 0.0, "x", q.task_id, q.epoch, q.asked_at, False, "")))
    _tick(b, 1.5)
    assert not b.asks  # asked less than ASK_AGAIN ago
    _tick(b, 1.0 + ASK_AGAIN + 0.01)
    assert len(b.asks) == 1
    assert _answer(a, b, now=2.2) == [True]
    assert b.try_start("t1", now=2.3) is None
