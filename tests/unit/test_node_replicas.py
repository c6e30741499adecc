"""Replicas in the pure NodeState (node/replicas.py): a copy of each submission at
another node, kept current by its home (where it runs, released when it ends), and
adopted by that node when the home is gone for good while the task was still queued
there (issue 19)."""

from __future__ import annotations

import attrs
import pytest

from swarm import model as m
from swarm import wire
from swarm.node import events as ev
from swarm.node.recovery import ADOPT, REPLICA, REPLICAS, STRAYS
from swarm.node.replicas import (
    HOLD,
    RELEASE,
    RUNNER,
    ReplicaMsg,
    replica_msg_from_wire,
    replica_msg_to_wire,
    restore_replicas,
)
from swarm.node.state import Settings

from .node_harness import FakeNet, FakeNode

S = m.TaskState
DEAD, ALIVE = m.MemberState.DEAD, m.MemberState.ALIVE
GRACE = 5.0


def _nodes(*names: str) -> tuple[FakeNode, ...]:
    return tuple(FakeNode(n, settings=Settings(home_grace=GRACE)) for n in names)


def _tick(n: FakeNode, now: float) -> None:
    n.state.failover_at = 0.0
    n.run(n.state.tick(now, 1000.0 + now))


def _deliver(src: FakeNode, nodes: dict[str, FakeNode]) -> int:
    """Deliver `src`'s replica messages; the answers go back to it."""
    sent = 0
    while src.replica_out:
        i = src.replica_out.pop(0)
        why, instrs = nodes[i.dest].state.on_replica(src.name, i.msg)
        nodes[i.dest].run(instrs)
        assert why is None, why
        src.run(src.state.replica_acked(i.dest, i.msg))
        sent += 1
    return sent


def _cluster() -> tuple[FakeNode, FakeNode, FakeNode, FakeNet]:
    """H, B and C, each seeing the three alive."""
    h, b, c = _nodes("H", "B", "C")
    for n in (h, b, c):
        n.state.members_seen(tuple((x, ALIVE) for x in ("H", "B", "C")), 0.0)
    return h, b, c, FakeNet(h, b, c)


def _submitted() -> tuple[FakeNode, FakeNode, FakeNode, FakeNet, m.TaskSpec, str]:
    """A task submitted at H (queued there), its copy at the replica R chosen."""
    h, b, c, net = _cluster()
    spec = h.submit(m.TaskSpec(id="t1", argv=("sleep", "1")))
    k, order = h.state.choose_replicas("t1", ["H", "B", "C"])
    assert k == 1 and len(order) == 2 and "H" not in order
    r = order[0]
    nodes = {"H": h, "B": b, "C": c}
    why, instrs = nodes[r].state.on_replica("H", h.state.hold_msg(spec, (r,)))
    assert why is None
    nodes[r].run(instrs)
    h.run(h.state.replicas_chosen("t1", (r,)))
    assert h.kv[REPLICAS + "t1"] == [r] and REPLICA + "t1" in nodes[r].kv
    return h, b, c, net, spec, r


def test_replicas_by_cluster_size_and_configured() -> None:
    (h,) = _nodes("H")
    assert h.state.choose_replicas("t", ["H", "B"])[0] == 0  # 2 nodes: 1 copy, ours
    assert h.state.choose_replicas("t", ["H", "B", "C"])[0] == 1
    (one,) = (FakeNode("H", settings=Settings(replicas=1)),)
    assert one.state.choose_replicas("t", ["H", "B", "C", "D"]) == (0, ())
    (three,) = (FakeNode("H", settings=Settings(replicas=3)),)
    k, order = three.state.choose_replicas("t", ["H", "B", "C", "D", "E"])
    assert k == 2 and len(order) == 4


def test_copies_follow_the_known_cluster_a_member_down_included() -> None:
    """Stop 53: by the live members' count, a task submitted on three nodes while one
    was down got no copy at the third, and none when the node came back."""
    (h,) = _nodes("H")
    h.state.members_seen((("H", ALIVE), ("B", ALIVE), ("C", DEAD)), 0.0)
    k, order = h.state.choose_replicas("t", ["H", "B"])
    assert k == 1 and order == ("B",)
    h.state.members_seen((("B", DEAD),), 1.0)
    assert h.state.choose_replicas("t", ["H"]) == (0, ())  # nobody live to ask
    h.state.members_seen((("B", m.MemberState.LEFT), ("C", m.MemberState.LEFT)), 2.0)
    h.state.members_seen((("D", ALIVE),), 2.0)
    assert h.state.choose_replicas("t", ["H", "D"])[0] == 0  # two nodes now


def _handed_off() -> tuple[FakeNode, dict[str, FakeNode], FakeNet, str, str]:
    """t1 submitted at H with its copy at the replica r, then handed off to the other
    node (its runner)."""
    h, b, c, net, _, r = _submitted()
    nodes = {"H": h, "B": b, "C": c}
    runner = "C" if r == "B" else "B"
    why, instrs = h.state.offer("t1", runner, 0.0, 0.0)
    assert why is None
    h.run(instrs)
    net.settle()
    return h, nodes, net, r, runner


def test_the_home_keeps_its_replica_current_then_releases_it() -> None:
    h, nodes, net, r, runner = _handed_off()
    # the commit does not tell the replica: the next failover tick does (a task that
    # ends before it costs no runner message)
    assert h.replica_out == []
    _tick(h, 1.0)
    assert [(i.dest, i.msg.kind, i.msg.runner) for i in h.replica_out] == [(r, RUNNER, runner)]
    assert _deliver(h, nodes) == 1
    assert nodes[r].state.held["t1"].runner == runner
    _tick(h, 2.0)
    assert h.replica_out == []  # acknowledged: nothing owed
    # it ends at the runner; its result reaches the home: the copy is released
    nodes[runner].try_start("t1")
    nodes[runner].finish("t1", 0)
    net.settle()
    assert h.state.records.finished["t1"].state is S.SUCCEEDED
    # the release goes with the result, not at the next tick (a home that died in
    # between would leave a replica that runs the finished task again)
    assert [(i.dest, i.msg.kind) for i in h.replica_out] == [(r, RELEASE)]
    _deliver(h, nodes)
    # the replica keeps how it ended (an answer if the home is lost), nothing to adopt
    assert nodes[r].state.held["t1"].final is not None
    assert nodes[r].kv[REPLICA + "t1"]["final"]["state"] == "succeeded"
    assert "t1" not in h.state.mine and REPLICAS + "t1" not in h.kv


def test_a_task_that_ends_before_the_tick_costs_its_copy_the_release_alone() -> None:
    """Issue 23: of a copy's three messages (hold, runner, release), a short remote
    task skips the runner: the home tells its replica the runner at the next failover
    tick, and by then the task has ended, so the release (with how) is all it owes."""
    h, nodes, net, r, runner = _handed_off()
    nodes[runner].try_start("t1")
    nodes[runner].finish("t1", 0)
    net.settle()
    assert h.state.records.finished["t1"].state is S.SUCCEEDED
    assert [(i.dest, i.msg.kind) for i in h.replica_out] == [(r, RELEASE)]
    assert _deliver(h, nodes) == 1
    _tick(h, 1.0)
    assert h.replica_out == []  # nothing else owed: no runner message at all
    assert nodes[r].state.held["t1"].final is not None
    assert "t1" not in h.state.mine and REPLICAS + "t1" not in h.kv


def test_a_submission_names_its_replicas_with_its_record_and_writes_them_once() -> None:
    """Issue 23: the nodes asked for copies are journaled with the task's own record
    (`replicas_planned`); when they are the ones that answer, no second write; when a
    stand-in answered instead, the entry is rewritten; when none did, it goes."""
    (h,) = _nodes("H")
    put = h.state.replicas_planned("t1", ("B",))
    assert put is not None and (put.key, put.value) == (REPLICAS + "t1", ["B"])
    assert h.state.replicas_planned("t1", ()) is None
    assert h.state.replicas_chosen("t1", ("B",), ("B",), planned=("B",)) == []
    assert h.state.mine["t1"] == ("B",)
    [p] = h.state.replicas_chosen("t2", ("C",), ("B",), planned=("B",))
    assert isinstance(p, ev.Persist) and p.durable
    assert p.ops == (ev.Put(REPLICAS + "t2", ["C"]),)
    [p] = h.state.replicas_chosen("t3", (), ("B",), planned=("B",))
    assert isinstance(p, ev.Persist) and p.ops == (ev.Delete(REPLICAS + "t3"),)
    assert "t3" not in h.state.mine


def test_a_replica_adopts_a_task_queued_at_its_dead_home_and_places_it() -> None:
    h, b, c, _, _, r = _submitted()
    rep = {"B": b, "C": c}[r]
    rep.state.members_seen((("H", DEAD),), 10.0)
    _tick(rep, 19.9)  # a replica waits two graces: a runner it has not heard of first
    assert "t1" in rep.state.held and "t1" not in rep.state.records.active
    _tick(rep, 20.0)
    t = rep.state.records.active["t1"]
    assert (t.spec.home, t.state, t.node) == (r, S.QUEUED, r)
    assert "adopted from H" in t.history[0].cause
    assert "adopted as its replica" in rep.state.explains["t1"][0]["outcome"]
    assert rep.placements == ["t1"]  # placed again, by its new home
    assert REPLICA + "t1" not in rep.kv and rep.kv[ADOPT + "t1"] == ["H", 2]
    # its handoff epochs start above anything the old home used
    assert rep.state.home.entries["t1"].next_epoch > 2**32
    # H comes back with its disk: told, it lets go of the task it still had queued
    rep.notices_out.clear()
    rep.state.members_seen((("H", ALIVE),), 30.0)
    _tick(rep, 31.0)
    (send,) = [s for s in rep.notices_out if s.dest == "H"]
    h.run(h.state.on_notices(r, send.notices, 31.0, 1031.0)[1])
    assert "t1" not in h.state.records.active and "t1" not in h.state.mine
    assert REPLICAS + "t1" not in h.kv


def test_a_replica_leaves_a_running_task_to_its_runner_and_drops_its_copy() -> None:
    h, b, c, net, _, r = _submitted()
    nodes = {"H": h, "B": b, "C": c}
    runner = "C" if r == "B" else "B"
    h.run(h.state.offer("t1", runner, 0.0, 0.0)[1])
    net.settle()
    _tick(h, 1.0)
    _deliver(h, nodes)
    nodes[runner].try_start("t1")
    for n in (nodes[r], nodes[runner]):
        n.state.members_seen((("H", DEAD),), 10.0)
        _tick(n, 16.0)
    assert nodes[runner].state.records.active["t1"].spec.home == runner
    assert "t1" not in nodes[r].state.records.active  # the runner is alive: not the replica
    sends = [s for s in nodes[runner].notices_out if s.dest == r]
    nodes[r].run(nodes[r].state.on_notices(runner, sends[0].notices, 16.0, 1016.0)[1])
    assert "t1" not in nodes[r].state.held and REPLICA + "t1" not in nodes[r].kv


def test_copies_come_only_from_the_tasks_home() -> None:
    _, b, _, _, _, _ = _submitted()
    forged = ReplicaMsg(HOLD, "t9", "H", None, (), m.TaskSpec(id="t9", argv=("x",), home="H"))
    why, instrs = b.state.on_replica("C", forged)
    assert why is not None and "not by its home" in why and instrs == []
    # news of a task we keep no copy of: nothing to do (idempotent after a release)
    assert b.state.on_replica("H", ReplicaMsg(RELEASE, "t8", "H")) == (None, [])


def test_replica_messages_decode_strictly() -> None:
    spec = m.TaskSpec(id="t1", argv=("x",), home="H")
    msg = ReplicaMsg(HOLD, "t1", "H", None, ("B",), spec)
    assert replica_msg_from_wire(replica_msg_to_wire(msg)) == msg
    assert "epoch" not in replica_msg_to_wire(msg)  # older agents refuse unknown fields
    adopted = ReplicaMsg(HOLD, "t1", "H", None, ("B",), spec, epoch=3)
    assert replica_msg_from_wire(replica_msg_to_wire(adopted)) == adopted
    good = replica_msg_to_wire(msg)
    for field, value, says in [
        ("kind", "steal", "field 'kind'"),
        ("id", "../x", "field 'id'"),
        ("home", "", "field 'home'"),
        ("home", "C", "field 'spec'"),
        ("replicas", [""], "field 'home' or 'replicas'"),
        ("more", 1, "unknown field(s) 'more'"),
        ("epoch", 0, "field 'epoch'"),
        ("epoch", "2", "field 'epoch'"),
    ]:
        with pytest.raises(wire.SchemaError) as e:
            replica_msg_from_wire({**good, field: value})
        assert says in str(e.value), (field, str(e.value))


def test_restore_replicas_reads_both_tables_and_skips_bad_entries() -> None:
    _, b, c, _, _, r = _submitted()
    rep = {"B": b, "C": c}[r]
    got = restore_replicas(
        {
            **rep.kv,
            REPLICA + "bad": {"spec": 5},
            REPLICAS + "t2": ["B"],
            STRAYS + "t2": ["C", 7],
            STRAYS + "t3": 5,
        }
    )
    assert got.mine == {"t2": ("B",)} and got.held["t1"].spec.id == "t1"
    assert "bad" not in got.held and got.strays == {"t2": frozenset({"C"})}


def test_the_adopters_own_runner_follows_its_notice_and_keeps_the_task() -> None:
    """Chaos home-loss (seed 1018): a replica adopted a task and handed it to n4; its
    adoption notice, naming no runner yet, reached n4, which took it for another
    node's claim and dropped the task; the adopter waited on n4 for ever."""
    _, b, c, _, _, r = _submitted()
    rep = {"B": b, "C": c}[r]
    other = c if rep is b else b
    rep.state.members_seen((("H", DEAD),), 10.0)
    _tick(rep, 20.0)
    why, instrs = rep.state.offer("t1", other.name, 20.0, 1020.0)
    assert why is None
    rep.run(instrs)
    FakeNet(rep, other).settle()
    assert other.state.guest.may_run("t1")
    (send,) = [s for s in rep.notices_out if s.dest == other.name]
    answers, instrs = other.state.on_notices(rep.name, send.notices, 21.0, 1021.0)
    other.run(instrs)
    assert answers == [] and other.state.guest.may_run("t1")
    assert "failover.yielded" not in other.logs


def test_a_released_copy_keeps_how_the_task_ended_and_is_never_adopted() -> None:
    """Chaos home-loss: a task that finished at its home, which was then lost, was
    known to no survivor (the release dropped the copies). The release now says how
    it ended; the replica keeps that, answers with it, and never adopts it."""
    from swarm.node.replicas import Final

    h, b, c, _, _, r = _submitted()
    nodes = {"B": b, "C": c}
    h.run_here("t1")
    assert h.try_start("t1", now=1.0) is None
    h.finish("t1", 0, now=2.0, wall=1002.0)
    out = h.state.replica_update("t1")
    [msg] = [i.msg for i in out if isinstance(i, ev.SendReplica) and i.dest == r]
    assert msg.kind == "release" and msg.final is not None and msg.final.state == "succeeded"
    assert replica_msg_from_wire(replica_msg_to_wire(msg)) == msg
    rep = nodes[r]
    why, instrs = rep.state.on_replica("H", msg)
    assert why is None
    rep.run(instrs)
    held = rep.state.held["t1"]
    assert held.final == Final("succeeded", 0, None, "exit 0", 1002.0)
    assert rep.kv[REPLICA + "t1"]["final"]["state"] == "succeeded"
    restored = restore_replicas(dict(rep.kv)).held
    assert restored["t1"].final == held.final
    # H is lost: the finished copy is not adopted, however long H stays dead
    rep.state.members_seen((("H", DEAD),), 3.0)
    _tick(rep, 3.0 + 3 * GRACE)
    assert "t1" not in rep.state.records.active and "t1" in rep.state.held
    # kept for a week (keep-finished's default), then dropped
    rep.run(rep.state.prune_finished_copies(1002.0 + 6 * 86400))
    assert "t1" in rep.state.held
    rep.run(rep.state.prune_finished_copies(1002.0 + 8 * 86400))
    assert "t1" not in rep.state.held and REPLICA + "t1" not in rep.kv


def test_a_final_comes_with_a_release_only() -> None:
    bad = {
        "kind": "runner",
        "id": "t1",
        "home": "H",
        "replicas": [],
        "final": {"state": "succeeded"},
    }
    with pytest.raises(wire.SchemaError, match="final"):
        replica_msg_from_wire(bad)
    with pytest.raises(wire.SchemaError, match="not a final state"):
        replica_msg_from_wire({**bad, "kind": "release", "final": {"state": "running"}})


def test_copies_held_by_a_stand_in_learn_the_real_replicas() -> None:
    """Chaos home-loss: the first replica in order (C) did not answer, B stood in; B's
    copy named C, so B waited for C to adopt, and nobody did once the home was lost."""
    h, b, c = _nodes("H", "B", "C")
    for n in (h, b, c):
        n.state.members_seen(tuple((x, ALIVE) for x in ("H", "B", "C")), 0.0)
    spec = h.submit(m.TaskSpec(id="t1", argv=("sleep", "1")))
    why, instrs = b.state.on_replica("H", h.state.hold_msg(spec, ("C",)))  # told: C
    assert why is None
    b.run(instrs)
    h.run(h.state.replicas_chosen("t1", ("B",), told=("C",)))
    [msg] = [i.msg for i in h.state.replica_updates() if i.dest == "B"]
    assert msg.kind == RUNNER and msg.replicas == ("B",)
    why, instrs = b.state.on_replica("H", msg)
    b.run(instrs)
    h.run(h.state.replica_acked("B", msg))
    assert b.state.held["t1"].replicas == ("B",) and not h.state.replica_updates()
    h.run_here("t1")
    assert h.try_start("t1", now=1.0) is None  # running at its home, which is lost
    b.state.members_seen((("H", DEAD),), 2.0)
    _tick(b, 2.0 + 2 * GRACE + 0.1)
    assert b.state.records.active["t1"].spec.home == "B"


def test_a_node_whose_answer_was_lost_gets_the_release_of_its_stray_copy() -> None:
    """Chaos shim: C journaled the copy but its answer was lost, so B stood in. C's
    copy was then kept current by nobody: still `queued` after the task succeeded
    (what `swarm status` answered there when the home was slow), and one C would adopt,
    and run again, if the home were lost. C now gets the release, with how it ended."""
    h, b, c = _nodes("H", "B", "C")
    nodes = {"B": b, "C": c}
    for n in (h, b, c):
        n.state.members_seen(tuple((x, ALIVE) for x in ("H", "B", "C")), 0.0)
    spec = h.submit(m.TaskSpec(id="t1", argv=("sleep", "1")))
    hold = h.state.hold_msg(spec, ("C",))
    for n in (c, b):  # C's answer is lost; B stands in
        why, instrs = n.state.on_replica("H", hold)
        assert why is None
        n.run(instrs)
    h.run(h.state.replicas_chosen("t1", ("B",), told=("C",), unanswered=("C",)))
    assert h.state.strays == {"t1": frozenset({"C"})} and h.kv[STRAYS + "t1"] == ["C"]
    # while the task is not over, C is told nothing (B learns it is the replica)
    assert [i.dest for i in h.state.replica_updates()] == ["B"]
    h.run_here("t1")
    assert h.try_start("t1", now=1.0) is None
    h.finish("t1", 0, now=2.0, wall=1002.0)
    out = [i for i in h.state.replica_updates() if isinstance(i, ev.SendReplica)]
    assert sorted(i.dest for i in out) == ["B", "C"]
    for i in out:
        assert i.msg.kind == RELEASE and i.msg.final is not None
        why, instrs = nodes[i.dest].state.on_replica("H", i.msg)
        assert why is None
        nodes[i.dest].run(instrs)
        h.run(h.state.replica_acked(i.dest, i.msg))
    assert c.state.held["t1"].final is not None and c.kv[REPLICA + "t1"]["final"]
    assert h.state.strays == {} and "t1" not in h.state.mine and not h.state.replica_updates()
    assert STRAYS + "t1" not in h.kv
    # a late copy of the start (the lost request, delivered after all) changes nothing
    why, instrs = c.state.on_replica("H", hold)
    assert why is None and instrs == [] and c.state.held["t1"].final is not None
    # the finished copy is never adopted, however long H stays dead
    c.state.members_seen((("H", DEAD),), 3.0)
    _tick(c, 3.0 + 3 * GRACE)
    assert "t1" not in c.state.records.active


def test_a_copy_that_arrives_after_the_release_of_its_end_is_not_kept() -> None:
    """Chaos double-kill: C was cut off when asked for the copy; the home gave up on
    its answer, the task ended, and the release (sent when C was back) reached C before
    the copy itself, delivered late on the first connection. C kept a copy `queued`."""
    from swarm.node.replicas import ENDED_UNHELD_KEEP

    h, _b, c = _nodes("H", "B", "C")
    for n in (h, c):
        n.state.members_seen(tuple((x, ALIVE) for x in ("H", "B", "C")), 0.0)
    spec = h.submit(m.TaskSpec(id="t1", argv=("sleep", "1")))
    hold = h.state.hold_msg(spec, ("C",))
    h.run(h.state.replicas_chosen("t1", (), told=("C",), unanswered=("C",)))
    h.run_here("t1")
    assert h.try_start("t1", now=1.0) is None
    h.finish("t1", 0, now=2.0, wall=1002.0)
    [release] = [i.msg for i in h.state.replica_updates() if i.dest == "C"]
    for msg in (release, hold):  # the release overtakes the copy
        why, instrs = c.state.on_replica("H", msg)
        assert why is None and instrs == []
    h.run(h.state.replica_acked("C", release))
    assert "t1" not in c.state.held and h.state.strays == {}
    # remembered for ENDED_UNHELD_KEEP only
    c.run(c.state.prune_finished_copies(1002.0 + ENDED_UNHELD_KEEP + 1))
    assert "t1" not in c.state.ended_unheld


def test_a_stray_copy_is_released_when_its_node_is_back_and_given_up_after_an_hour() -> None:
    """A node that may hold a stray copy is sent its release only while it is live in
    the home's view: one that died is asked again once back, and one gone for
    STRAY_GIVE_UP is given up."""
    from swarm.node.copyasks import STRAY_GIVE_UP

    h, b, c = _nodes("H", "B", "C")
    for n in (h, b, c):
        n.state.members_seen(tuple((x, ALIVE) for x in ("H", "B", "C")), 0.0)
    h.submit(m.TaskSpec(id="t1", argv=("sleep", "1")))
    h.submit(m.TaskSpec(id="t2", argv=("sleep", "1")))
    for tid in ("t1", "t2"):
        h.run(h.state.replicas_chosen(tid, ("B",), told=("B",), unanswered=("C",)))
        h.run_here(tid)
        assert h.try_start(tid, now=1.0) is None
        h.finish(tid, 0, now=2.0, wall=1002.0)
    assert [i.dest for i in h.state.replica_updates()].count("C") == 2
    h.state.members_seen((("C", DEAD),), 3.0)
    assert "C" not in [i.dest for i in h.state.replica_updates()]  # not while it is gone
    # back before the hour: its releases go
    h.state.members_seen((("C", ALIVE),), 100.0)
    h.replica_out.clear()
    _tick(h, 101.0)
    to_c = [i.msg for i in h.replica_out if i.dest == "C"]
    assert sorted(x.task_id for x in to_c) == ["t1", "t2"] and all(x.final for x in to_c)
    h.run(h.state.replica_acked("C", to_c[0]))
    assert h.state.strays == {to_c[1].task_id: frozenset({"C"})}
    # gone again, for longer than the hour: given up, its journal entry goes
    h.state.members_seen((("C", DEAD),), 200.0)
    _tick(h, 200.0 + STRAY_GIVE_UP / 2)
    assert h.state.strays
    _tick(h, 200.0 + STRAY_GIVE_UP + 1)
    assert h.state.strays == {} and not any(k.startswith(STRAYS) for k in h.kv)


def test_a_stray_copy_at_a_node_the_view_never_names_is_given_up() -> None:
    """After a restart the view may not list a node long gone: a stray there is not
    asked (nothing to ask); the view takes it as gone once among peers for
    UNHEARD_AFTER (as for handoffs), and it is given up an hour after that."""
    from swarm.node.copyasks import STRAY_GIVE_UP
    from swarm.node.failover import UNHEARD_AFTER

    h, _b, _c = _nodes("H", "B", "C")
    h.state.members_seen((("H", ALIVE), ("B", ALIVE)), 10.0)
    h.submit(m.TaskSpec(id="t1", argv=("sleep", "1")))
    h.run(h.state.replicas_chosen("t1", ("B",), told=("B",), unanswered=("Z",)))
    h.run_here("t1")
    assert h.try_start("t1", now=11.0) is None
    h.finish("t1", 0, now=12.0, wall=1012.0)
    assert "Z" not in [i.dest for i in h.state.replica_updates()]
    _tick(h, 10.0 + UNHEARD_AFTER + 1)  # taken as gone (left) from now
    _tick(h, 10.0 + UNHEARD_AFTER + 1 + STRAY_GIVE_UP / 2)
    assert h.state.strays == {"t1": frozenset({"Z"})}
    _tick(h, 10.0 + UNHEARD_AFTER + 2 + STRAY_GIVE_UP)
    assert h.state.strays == {}


def test_a_replaced_replica_is_sent_the_release_if_it_comes_back() -> None:
    """A replica gone for a grace is replaced (succession), but it keeps its copy: back
    later, it learns how the task ended instead of keeping it queued for ever."""
    h, b, c = _nodes("H", "B", "C")
    for n in (h, b, c):
        n.state.members_seen(tuple((x, ALIVE) for x in ("H", "B", "C")), 0.0)
    h.submit(m.TaskSpec(id="t1", argv=("sleep", "1")))
    h.run(h.state.replicas_chosen("t1", ("C",)))
    h.run(h.state.rereplicated("t1", ("B",)))
    assert h.state.mine["t1"] == ("B",) and h.state.strays == {"t1": frozenset({"C"})}
    assert [i.dest for i in h.state.replica_updates()] == ["B"]  # B gets the copy
    h.run_here("t1")
    assert h.try_start("t1", now=1.0) is None
    h.finish("t1", 0, now=2.0, wall=1002.0)
    assert sorted(i.dest for i in h.state.replica_updates()) == ["B", "C"]


def test_stand_ins_are_journaled_as_strays_before_they_are_asked() -> None:
    """Chaos late-binding: the home was killed 6 s into a copy round (the first node
    paused, the stand-ins cut off), before it learnt who answered: a stand-in kept a
    copy that no one released. Each stand-in is now written down (durably) before it is
    asked, and dropped from the strays once it answered."""
    h, _b, _c = _nodes("H", "B", "C")
    h.state.members_seen(tuple((x, ALIVE) for x in ("H", "B", "C")), 0.0)
    h.submit(m.TaskSpec(id="t1", argv=("sleep", "1")))
    [p] = h.state.stand_in_asked("t1", frozenset({"C", "B"}))  # C did not answer
    assert isinstance(p, ev.Persist) and p.durable
    h.run([p])
    assert h.kv[STRAYS + "t1"] == ["B", "C"]
    assert h.state.stand_in_asked("t1", frozenset({"B"})) == []  # known already
    # a restart here: both are released once the task ended
    assert restore_replicas(dict(h.kv)).strays == {"t1": frozenset({"B", "C"})}
    # B answered: only C stays a stray
    h.run(h.state.replicas_chosen("t1", ("B",), told=("C",), planned=("C",), unanswered=("C",)))
    assert h.state.strays == {"t1": frozenset({"C"})} and h.kv[STRAYS + "t1"] == ["C"]


def test_a_copy_asked_of_the_node_that_runs_the_task_is_kept_there() -> None:
    """A hold that reaches the replica after the task's handoff to it: before stop 45
    the node, holding the task itself, kept no copy, yet acknowledged, and its home
    named it as the copy. Once the task left that node (moved back home, or on to
    another), the home was the only node that held it; its loss lost the task."""
    h, b, c, net = _cluster()
    spec = h.submit(m.TaskSpec(id="t1", argv=("sleep", "1")))
    _, order = h.state.choose_replicas("t1", ["H", "B", "C"])
    nodes = {"B": b, "C": c}
    r = nodes[order[0]]
    h.run(h.state.offer("t1", r.name, 0.0, 0.0)[1])
    net.settle()
    assert r.state.records.get_cached("t1") is not None  # it runs the task for H
    why, instrs = r.state.on_replica("H", h.state.hold_msg(spec, (r.name,)))
    assert why is None
    r.run(instrs)
    assert r.state.held["t1"].home == "H" and r.kv[REPLICA + "t1"]["home"] == "H"
    # its run there ends: the release tells that copy how (an answer, never adopted)
    r.try_start("t1")
    r.finish("t1", 0)
    h.run(h.state.replicas_chosen("t1", (r.name,)))
    net.settle()
    _deliver(h, {"B": b, "C": c})
    assert r.state.held["t1"].final is not None


def test_an_old_homes_copy_is_refused_where_an_adopter_holds_the_task() -> None:
    """Stop 53 (the copies walks with a second loss): an old home back from the dead
    sends its copies again; one taken over an adopter's copy was asked about at the
    old home (which had let the task go) and dropped: the task was lost."""
    h, b, c, _, spec, r = _submitted()
    rep = {"B": b, "C": c}[r]
    other = c if rep is b else b
    rep.state.members_seen((("H", DEAD),), 10.0)
    _tick(rep, 20.0)  # the replica adopted it, and copies it to the other node
    assert rep.state.records.active["t1"].spec.home == rep.name
    adopted = rep.state.hold_msg(rep.state.records.active["t1"].spec, (other.name,))
    assert adopted.epoch == 2
    why, instrs = other.state.on_replica(rep.name, adopted)
    assert why is None
    other.run(instrs)
    held = other.state.held["t1"]
    assert (held.home, held.epoch) == (rep.name, 2)
    assert other.kv[REPLICA + "t1"]["epoch"] == 2
    assert restore_replicas(other.kv).held["t1"].epoch == 2
    _tick(other, 21.0)  # held at the adopter's claim, not at 1
    rec = other.state.succession.record("t1")
    assert rec is not None and (rec.home, rec.epoch) == (rep.name, 2)
    why, instrs = other.state.on_replica("H", h.state.hold_msg(spec, (other.name,)))
    assert why is not None and "taken over by" in why and instrs == []
    assert other.state.held["t1"].home == rep.name


def test_records_follow_the_runner_after_new_replicas_were_named() -> None:
    """Stop 53 (the copies walks): once a home named a new replica (its record's
    version 1), its own record, and its runner's, were held at version 0, older, and
    refused: the runner never appeared in them, so the runner did not adopt the task
    when the home was lost (and a stray copy naming itself runner did)."""
    h, b, c, net, _, r = _submitted()
    nodes = {"H": h, "B": b, "C": c}
    other = "C" if r == "B" else "B"
    h.state.members_seen(((r, DEAD),), 1.0)
    _tick(h, 2.0 + GRACE)  # r gone for a grace: other is named in its place
    rec = h.state.succession.record("t1")
    assert rec is not None and rec.replicas == (other,) and rec.version == 1
    _deliver(h, nodes)
    h.run(h.state.offer("t1", other, 8.0, 1008.0)[1])
    net.settle(8.0, 1008.0)
    assert "t1" in nodes[other].state.guest.entries
    _tick(h, 9.0)
    rec = h.state.succession.record("t1")
    assert rec is not None and (rec.runner, rec.version) == (other, 1), rec


def test_a_task_run_for_an_adopter_is_held_at_the_adopters_claim() -> None:
    """A runner's guest entry knows no claim: after a restart (the succession core
    empty) its record was held at 1, and an old home's stale copy went over the
    adopter's (stop 53, the copies walks). Its copy of the task, from the adopter,
    says the claim."""
    from swarm.cluster import handoff as hs
    from swarm.node.replicas import Held

    (b,) = _nodes("B")
    spec = m.TaskSpec(id="t1", argv=("x",), home="C")
    b.state.held["t1"] = Held(spec, "C", "B", ("B",), None, 3)
    b.state.handoffs.guest.entries["t1"] = hs.GuestEntry("t1", "C", 5, spec)
    assert b.state._wanted("t1") == ("C", 3, "B", ())
    assert b.state._wants_all()["t1"] == ("C", 3, "B", ())
    old = attrs.evolve(spec, home="H")  # the first home's copy, back from the dead
    why, _ = b.state.on_replica("H", ReplicaMsg(HOLD, "t1", "H", None, ("B",), old))
    assert why is not None and "taken over by C (epoch 3)" in why


def test_a_late_copy_of_a_task_this_node_adopted_is_not_kept() -> None:
    """The other case the old rule covered: a node that took a task over (its home
    now) gets a copy of it from the old home, late: it keeps none."""
    h, b, c, _, spec, r = _submitted()
    rep = {"B": b, "C": c}[r]
    rep.state.members_seen((("H", DEAD),), 10.0)
    _tick(rep, 20.0)
    assert rep.state.records.active["t1"].spec.home == rep.name  # adopted
    assert "t1" not in rep.state.held
    why, instrs = rep.state.on_replica("H", h.state.hold_msg(spec, (rep.name,)))
    assert why is None and instrs == [] and "t1" not in rep.state.held


def test_a_task_short_of_copies_gets_them_once_a_member_is_back() -> None:
    """Stop 54 (topup.py): a task submitted while every peer was down, or on two nodes
    before a third joined, got no copy and none later: it died with its home's disk.
    Now a member coming into view alive makes the home name replicas for its own
    plain tasks short of them, and the copy goes at that tick; not for an array or a
    dependent task (never copied), nor one whose own copies are being asked for."""
    h, b, c = _nodes("H", "B", "C")
    nodes = {"H": h, "B": b, "C": c}
    h.state.members_seen((("H", ALIVE), ("B", ALIVE)), 0.0)  # two nodes: no copy
    for spec in (
        m.TaskSpec(id="t1", argv=("x",)),
        m.TaskSpec(id="a1", argv=("x",), array="0-3"),
        m.TaskSpec(id="d1", argv=("x",), after=("ok:t1",)),
        m.TaskSpec(id="t2", argv=("x",)),
    ):
        h.submit(spec)
    assert h.state.choose_replicas("t1", ["H", "B"])[0] == 0
    _tick(h, 1.0)
    assert h.replica_out == [] and "t1" not in h.state.mine
    # C joins: three nodes, one copy wanted; t2's own copies are being asked for
    assert h.state.replicas_planned("t2", ("C",)) is not None
    h.state.members_seen((("C", ALIVE),), 2.0)
    _tick(h, 3.0)
    (r,) = h.state.mine["t1"]
    assert h.kv[REPLICAS + "t1"] == [r] and "replica.topped_up" in h.logs
    assert {i.msg.task_id for i in h.replica_out} == {"t1"}
    assert _deliver(h, nodes) == 1 and REPLICA + "t1" in nodes[r].kv
    assert nodes[r].state.held["t1"].spec.home == "H"
    _tick(h, 4.0)
    assert h.replica_out == []  # looked at once per member back
    # every peer down at the submission, then one back
    h2, b2 = _nodes("H", "B")
    h2.state.members_seen((("H", ALIVE), ("B", DEAD), ("C", DEAD)), 0.0)
    h2.submit(m.TaskSpec(id="t3", argv=("x",)))
    assert h2.state.choose_replicas("t3", ["H"]) == (0, ())
    _tick(h2, 1.0)
    assert h2.replica_out == []
    h2.state.members_seen((("B", ALIVE),), 2.0)
    _tick(h2, 3.0)
    assert h2.state.mine["t3"] == ("B",)
    assert _deliver(h2, {"B": b2}) == 1 and "t3" in b2.state.held


def test_a_submission_accepted_short_of_copies_is_copied_at_the_next_tick() -> None:
    """Its peers live in the view, but neither the first asked nor the stand-in
    answered in time: accepted with no copy (`replica.short`), it was left so for
    good. The next tick asks again (topup.py); a node that did not answer is a
    replica now, no longer a stray."""
    h, b, c, _ = _cluster()
    nodes = {"H": h, "B": b, "C": c}
    _tick(h, 0.5)  # the start's look: nothing short
    spec = h.submit(m.TaskSpec(id="t1", argv=("x",)))
    k, order = h.state.choose_replicas("t1", ["H", "B", "C"])
    planned = h.state.replicas_planned("t1", order[:k])
    assert planned is not None
    h.run([ev.Persist((planned,), durable=True)])
    h.run(h.state.stand_in_asked("t1", frozenset(order)))
    msg = h.state.hold_msg(spec, order[:k])
    h.run(h.state.replicas_chosen("t1", (), msg.replicas, msg.replicas, order))
    assert "t1" not in h.state.mine and h.state.strays["t1"] == frozenset(order)
    _tick(h, 1.0)
    assert h.state.mine["t1"] == order[:1] and h.kv[REPLICAS + "t1"] == list(order[:1])
    assert h.state.strays["t1"] == frozenset(order[1:])
    assert _deliver(h, nodes) >= 1 and "t1" in nodes[order[0]].state.held


def test_a_submission_whose_write_failed_is_not_kept_as_being_copied() -> None:
    """Its copies were planned before its record's write, which failed: it never got
    to choose them, and is no task here (runtime/failoverio.py add_with_copies)."""
    h, _, _, _ = _cluster()
    assert h.state.replicas_planned("t9", ("B",)) is not None
    assert h.state.copying == {"t9"}
    h.state.copies_given_up("t9")
    assert h.state.copying == set()
