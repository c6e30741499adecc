"""Incidents of the history (the `Fix:` commits), replayed as stimulus lists against
the pure NodeState: each is a few calls and assertions, no processes, no sockets.

Each test names the commit whose bug it replays. Bugs that lived in parts that are not
in `swarm/node/` yet (the runner's spawn window, the placement loop's rule switch,
global-task wake-ups, share changes) keep their integration tests.
"""

from __future__ import annotations

from swarm import model as m
from swarm.cluster import handoff as h
from swarm.node import events as ev
from swarm.node import recovery
from swarm.node.state import NodeState
from swarm.policy import gpu as gpupol
from swarm.policy import shares as sh

from .node_harness import FakeNet, FakeNode

S = m.TaskState


def _spec(tid: str, **kw: object) -> m.TaskSpec:
    return m.TaskSpec(id=tid, argv=("true",), **kw)  # type: ignore[arg-type]


def _offer(net: FakeNet, home: FakeNode, tid: str, target: str, now: float = 0.0) -> None:
    why, instrs = home.state.offer(tid, target, now, now)
    assert why is None
    home.run(instrs)


def test_da3b2aa_holder_dead_while_placement_awaited_commit_requeues_and_places() -> None:
    """The holder was declared dead after it accepted the offer and before the commit
    reached it: the task must be queued at home again *and* placed again."""
    a, b = FakeNode("A"), FakeNode("B")
    net = FakeNet(a, b)
    spec = a.submit(_spec("t1"))
    _offer(net, a, spec.id, "B")
    assert a.state.records.active["t1"].state is S.TRANSFERRING
    net.deliver("A")  # the offer: B accepts, A commits (the Commit is still queued)
    assert a.outcomes == [("t1", True, "")]
    assert a.state.records.active["t1"].node == "B"
    net.kill("B")
    t = a.state.records.active["t1"]
    assert (t.state, t.node) == (S.QUEUED, "A")
    assert a.placements == ["t1"]  # placed again, not left to a placement loop that ended


def test_e5bcad0_offer_resumed_across_restart_fails_then_task_is_placed_again() -> None:
    """An offer journaled before a restart, resumed after it, fails: with no placement
    waiting for it, the task must be placed again (it stayed queued forever)."""
    a, b = FakeNode("A"), FakeNode("B")
    spec = a.submit(_spec("t2"))
    _offer(FakeNet(a, b), a, spec.id, "B")
    # restart of A: a new state from A's records and journal keys
    a2 = FakeNode("A")
    a2.state.records.store(a.state.records.active["t2"])
    _, instrs = recovery.restore(
        a.kv, 0.0, a2.state.handoffs, a2.state.records.active, a2.state.gpus
    )
    a2.run(instrs)
    assert a2.state.home.entries["t2"].phase is h.HomePhase.OFFERING
    net2 = FakeNet(a2, b)
    net2.dead.add("B")  # B never answers
    now = 0.0
    for _ in range(h.OFFER_TRIES + 2):
        now += 20.0
        a2.run(a2.state.tick(now, now))
        while net2.deliver("A", now=now, wall=now):
            pass
    t = a2.state.records.active["t2"]
    assert (t.state, t.node) == (S.QUEUED, "A")
    assert a2.placements == ["t2"]
    assert a2.outcomes and a2.outcomes[-1][1] is False


def test_offer_failure_with_a_waiting_placement_reports_instead_of_placing_twice() -> None:
    a, b = FakeNode("A"), FakeNode("B", shares=0)
    net = FakeNet(a, b)
    a.submit(_spec("t3"))
    _offer(net, a, "t3", "B")
    # B refuses (its runtime's admission says why)
    send = a.outbox.popleft()
    reply, instrs = b.state.on_request("A", send.request, 0.0, 0.0, refusal="node is draining")
    b.run(instrs)
    a.run(a.state.on_reply("B", send.request, reply, 0.0, 0.0))
    assert a.outcomes == [("t3", False, "node is draining")]
    assert a.placements == []  # the waiting placement retries; no second placer
    assert a.state.records.active["t3"].state is S.QUEUED


def test_22ee423_nothing_starts_after_the_drain() -> None:
    a = FakeNode("A")
    a.submit(_spec("t4"))
    a.run_here("t4")
    a.ledger.set_shares(0)  # drain journaled
    assert a.try_start("t4") == "node is draining (shares 0)"
    assert a.running == set()


def test_5eac7b0_one_dispatch_pass_cannot_oversubscribe_reservations() -> None:
    a = FakeNode("A", shares=1024)
    for tid in ("r1", "r2"):
        a.submit(_spec(tid, reserve_shares=600))
        a.run_here(tid)
    assert a.try_start("r1") is None
    why = a.try_start("r2")  # same pass: r1's process has not started yet
    assert why is not None and "reservation of 600" in why
    assert a.ledger.reserved == 600


def test_holder_lost_while_running_with_no_retry_is_lost_once_and_not_placed() -> None:
    a, b = FakeNode("A"), FakeNode("B")
    net = FakeNet(a, b)
    a.submit(_spec("t5", no_retry=True))
    _offer(net, a, "t5", "B")
    net.settle()
    assert b.try_start("t5") is None
    b.run(b.state.tick(5.0, 5.0))  # the "running" report goes out on B's retry tick
    net.settle(now=5.0, wall=5.0)
    assert a.state.records.active["t5"].state is S.RUNNING
    net.kill("B")
    rec = a.state.records.finished["t5"]
    assert rec.state is S.LOST and "no-retry" in rec.reason
    assert a.finals == {"t5": 1} and a.placements == []


def test_remote_run_reports_one_final_result_even_when_reports_are_retried() -> None:
    a, b = FakeNode("A"), FakeNode("B")
    net = FakeNet(a, b)
    a.submit(_spec("t6"))
    _offer(net, a, "t6", "B")
    net.settle()
    assert b.try_start("t6") is None
    b.finish("t6", code=3)
    send = b.outbox[0]
    # the final report is delivered twice (a lost reply, then the retry)
    a.run(a.state.on_request("B", send.request, 1.0, 1.0)[1])
    net.settle(now=1.0, wall=1.0)
    rec = a.state.records.finished["t6"]
    assert (rec.state, rec.exit_code) == (S.FAILED, 3)
    assert a.finals == {"t6": 1}
    assert "t6" not in b.state.records.active  # the guest forgot it once reported


def test_gpu_slice_is_never_given_twice_and_comes_back_when_the_task_ends() -> None:
    dev = gpupol.GpuDevice(index=0, uuid="GPU-0", minor=0, memory_bytes=16 << 30)
    a = FakeNode("A", gpu_devices=(dev,))
    for tid in ("g1", "g2"):
        a.submit(_spec(tid, gpu=m.GpuRequest(core=100, memory_ratio=100)))
        a.run_here(tid)
    assert a.try_start("g1") is None
    assert "gpu:g1" in a.kv
    why = a.try_start("g2")
    assert why is not None and why.startswith("waiting for a GPU slice")
    a.finish("g1")
    assert "gpu:g1" not in a.kv
    assert a.try_start("g2") is None


def test_the_chaos_switch_acts_only_in_the_gate_and_only_when_given() -> None:
    plain, broken = FakeNode("A"), FakeNode("B", breaks=("ignore-drain",))
    for n in (plain, broken):
        n.submit(_spec("d1"))
        n.run_here("d1")
        n.ledger.set_shares(0)
    assert plain.try_start("d1") is not None
    assert broken.try_start("d1") is None


def test_journal_keys_round_trip_through_restore() -> None:
    a, b = FakeNode("A"), FakeNode("B")
    net = FakeNet(a, b)
    a.submit(_spec("k1"))
    _offer(net, a, "k1", "B")
    net.settle()
    fresh = NodeState("B", ledger=sh.ShareLedger())
    _, instrs = recovery.restore(b.kv, 0.0, fresh.handoffs, {}, fresh.gpus)
    assert not [i for i in instrs if isinstance(i, ev.Log)]
    assert fresh.guest.entries.keys() == b.state.guest.entries.keys()
    assert fresh.guest.entries["k1"].epoch == b.state.guest.entries["k1"].epoch


def _ended_at_b() -> FakeNode:
    """k2 of A's, run at B, ended (wall 100) and its report taken: B's guest entry
    gone, tombstoned."""
    a, b = FakeNode("A"), FakeNode("B")
    net = FakeNet(a, b)
    a.submit(_spec("k2"))
    _offer(net, a, "k2", "B")
    net.settle()
    b.try_start("k2")
    b.finish("k2", wall=100.0)
    net.settle(now=1.0, wall=100.0)
    assert "tomb:k2" in b.kv and "k2" not in b.state.guest.entries
    return b


def test_tombstones_expire_by_wall_time_and_their_keys_go() -> None:
    b = _ended_at_b()
    b.run(b.state.tick(2.0, 100.0 + recovery.TOMB_TTL - 1))
    assert "tomb:k2" in b.kv
    b.run(b.state.tick(3.0, 100.0 + recovery.TOMB_TTL + 1))
    assert "tomb:k2" not in b.kv and "k2" not in b.state.guest.tombstones


def test_an_unchanged_tombstone_is_not_written_again() -> None:
    """Stop 54: each time a task's handoff keys were written again (a revoke resent
    to a node that is down, every backoff), its tombstone was rewritten, durably, as
    it was; once written, and read back after a restart, it is not."""
    b = _ended_at_b()
    assert b.state.handoffs.persist_ops(["k2"], 200.0) == []
    fresh = NodeState("B", ledger=sh.ShareLedger())
    recovery.restore(b.kv, 200.0, fresh.handoffs, {}, fresh.gpus)
    assert fresh.handoffs.persist_ops(["k2"], 201.0) == []
    fresh.guest.tombstones["k2"] += 1  # a later epoch dropped: written
    (put,) = fresh.handoffs.persist_ops(["k2"], 202.0)
    assert put == ev.Put("tomb:k2", [fresh.guest.tombstones["k2"], 100.0])


def test_83733a0_a_stop_for_a_dispatched_task_is_a_stop_not_a_dequeue() -> None:
    """A cancel (or a revoke that kills) arriving after the gate let a task through,
    before its process existed, must become a stop of the run: it found no process and
    the task ran on. The state's side of it: once dispatched, a task is in `running`,
    and a kill or a killing drop asks the runtime to stop it (the runtime's side, the
    spawn window, is tests/integration/test_executor_races.py)."""
    a, b = FakeNode("A"), FakeNode("B")
    net = FakeNet(a, b)
    a.submit(_spec("s1"))
    _offer(net, a, "s1", "B")
    net.settle()
    assert b.try_start("s1") is None  # dispatched: running, process not yet there
    out = b.state.on_kill("s1", 1.0, 1.0)
    assert out == [ev.StopRun("s1")]
    out = b.state.on_drop(h.Drop("s1", kill=True, reason="revoked"))
    assert out == [ev.StopRun("s1", "revoked")]
    # still queued (not dispatched): a kill cancels it in the queue, durably
    a.submit(_spec("s2"))
    a.run_here("s2")
    out = a.state.on_kill("s2", 1.0, 1.0)
    assert ev.Dequeue("s2") in out
    assert a.state.records.finished["s2"].state is S.CANCELLED


def test_a_reattached_guest_task_confirmed_by_its_home_is_not_queued_again() -> None:
    """Chaos agent-restart (issue 19): B restarted while running A's task; its
    supervisor kept the task running and the restarted B re-attached to it, but B's
    entry waits for A's "yours" (CONFIRM) after a restart, and that answer made B queue
    a new copy of the task (its record was RUNNING, not QUEUED): the task ran again
    right after the re-attached process ended."""
    a, b = FakeNode("A"), FakeNode("B")
    net = FakeNet(a, b)
    a.submit(_spec("t1"))
    _offer(net, a, "t1", "B")
    net.settle()
    assert b.try_start("t1", now=1.0) is None
    b.state.guest.restore(b.state.guest.entries.pop("t1"))  # B restarted, re-attached
    assert b.state.guest.entries["t1"].phase is h.GuestPhase.CONFIRM
    b.run(b.state.tick(2.0, 1002.0))  # asks A
    net.settle(now=2.0, wall=1002.0)
    assert b.state.guest.may_run("t1")  # A said yours
    assert "t1" not in b.queue and b.state.records.active["t1"].state is S.RUNNING
    assert b.state.records.active["t1"].history[-1].cause == "started"
    b.finish("t1", 0, now=3.0, wall=1003.0)
    net.settle(now=3.0, wall=1003.0)
    assert a.state.records.finished["t1"].state is S.SUCCEEDED and "t1" not in b.queue
