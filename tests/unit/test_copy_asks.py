"""A copy's holder asks the task's home what became of it (node/copyasks.py): a node
back after its home gave up on it, or restarted, learns the end, or drops a copy its
home no longer has."""

from __future__ import annotations

import pytest

from swarm import codec, wire
from swarm import model as m
from swarm.node import copyasks
from swarm.node.copyasks import ASK_TRIES
from swarm.node.replicas import (
    ASK,
    HOLD,
    RELEASE,
    Final,
    ReplicaMsg,
    replica_msg_from_wire,
    replica_msg_to_wire,
    restore_replicas,
)

from .node_harness import FakeNode

ALIVE, DEAD = m.MemberState.ALIVE, m.MemberState.DEAD
S = m.TaskState


def _nodes() -> dict[str, FakeNode]:
    nodes = {n: FakeNode(n) for n in ("A", "B", "C")}
    for node in nodes.values():
        node.state.members_seen(tuple((x, ALIVE) for x in nodes), 0.0)
    return nodes


def _tick(node: FakeNode, now: float) -> None:
    node.state.failover_at = 0.0
    node.run(node.state.tick(now, 1000.0 + now))


def _deliver(nodes: dict[str, FakeNode], src: str) -> list[tuple[ReplicaMsg, str | None]]:
    """Every replica message `src` has to send, answered as the driver does."""
    node = nodes[src]
    out = []
    while node.replica_out:
        i = node.replica_out.pop(0)
        dest = nodes[i.dest]
        why, instrs = dest.state.on_replica(src, i.msg)
        dest.run(instrs)
        if why is None:
            node.run(node.state.replica_acked(i.dest, i.msg))
        out.append((i.msg, why))
    return out


def _started_at_a() -> tuple[dict[str, FakeNode], FakeNode, FakeNode, m.TaskId]:
    """A task of A started there, with a copy at B that A does not know of."""
    nodes = _nodes()
    a, b = nodes["A"], nodes["B"]
    tid = _copy_at_b(nodes)
    a.run_here(tid)
    assert a.try_start(tid) is None
    return nodes, a, b, tid


def _copy_at_b(nodes: dict[str, FakeNode]) -> m.TaskId:
    """A task of A, with a copy at B that A does not know of (a stray A gave up on)."""
    spec = nodes["A"].submit(m.TaskSpec(id="t1", argv=("x",)))
    hold = ReplicaMsg(HOLD, spec.id, "A", None, ("B",), spec)
    why, instrs = nodes["B"].state.on_replica("A", hold)
    assert why is None
    nodes["B"].run(instrs)
    return spec.id


def _home_answers(nodes: dict[str, FakeNode], holder: FakeNode, tid: m.TaskId, now: float) -> str:
    """The holder's asks delivered, then the home's tick and its news: the state the
    holder's copy ended in ("" while not ended)."""
    _deliver(nodes, holder.name)
    _tick(nodes["A"], now)
    _deliver(nodes, "A")
    copy = holder.state.held[tid]
    return "" if copy.final is None else copy.final.state


def _away_and_back(node: FakeNode, other: str, now: float) -> None:
    node.state.members_seen(((other, DEAD),), now)
    node.state.members_seen(((other, ALIVE),), now + 1.0)


def test_a_holder_back_learns_the_end_its_home_gave_up_sending() -> None:
    nodes, a, b, tid = _started_at_a()
    a.finish(tid, code=3, wall=1005.0)
    _tick(a, 1.0)
    assert a.replica_out == []  # A does not know B holds one
    _away_and_back(b, "A", 2.0)
    _tick(b, 4.0)
    sent = _deliver(nodes, "B")
    assert [(msg.kind, msg.task_id, why) for msg, why in sent] == [(ASK, tid, None)]
    assert a.state.strays[tid] == frozenset({"B"})
    assert a.kv["strays:" + tid] == ["B"]  # owed across A's restart too
    _tick(a, 5.0)
    (release, why), *_ = _deliver(nodes, "A")
    assert release.kind == RELEASE and why is None
    copy = b.state.held[tid]
    assert copy.final is not None and copy.final.state == "failed" and copy.final.exit_code == 3
    assert tid not in a.state.strays  # answered: sent no more
    _tick(b, 6.0)
    assert b.replica_out == []  # asked once: answered


def test_a_copy_its_home_no_longer_has_is_dropped() -> None:
    nodes = _nodes()
    a, b = nodes["A"], nodes["B"]
    tid = _copy_at_b(nodes)
    a.state.records.forget(tid)  # retention forgot it at its home
    _away_and_back(b, "A", 2.0)
    _tick(b, 4.0)
    _deliver(nodes, "B")
    _tick(a, 5.0)
    (release, _), *_ = _deliver(nodes, "A")
    assert release.kind == RELEASE and release.final is None
    assert tid not in b.state.held
    assert "replica:" + tid not in b.kv


def test_a_running_task_keeps_its_copy_until_it_ends() -> None:
    nodes, a, b, tid = _started_at_a()
    _away_and_back(b, "A", 2.0)
    _tick(b, 4.0)
    assert _home_answers(nodes, b, tid, 5.0) == ""  # still running: nothing to release
    a.finish(tid, wall=1010.0)
    _tick(a, 6.0)
    _deliver(nodes, "A")
    copy = b.state.held[tid]
    assert copy.final is not None and copy.final.state == "succeeded"


def test_a_replica_the_home_keeps_current_asks_for_nothing_more() -> None:
    nodes = _nodes()
    a, b = nodes["A"], nodes["B"]
    tid = _copy_at_b(nodes)
    a.state.mine[tid] = ("B",)
    _away_and_back(b, "A", 2.0)
    _tick(b, 4.0)
    assert [why for _, why in _deliver(nodes, "B")] == [None]
    assert tid not in a.state.strays and tid not in a.state.copies_owed


def test_asks_wait_for_their_home_and_stop_after_a_few_unanswered_ticks() -> None:
    nodes = _nodes()
    b = nodes["B"]
    tid = _copy_at_b(nodes)
    b.state.members_seen((("A", DEAD),), 1.0)
    _tick(b, 2.0)
    assert b.replica_out == []  # its home is gone: nothing asked
    b.state.members_seen((("A", ALIVE),), 3.0)
    b.state.members_seen((("A", m.MemberState.SUSPECT),), 3.5)
    _tick(b, 3.6)
    assert b.replica_out == []  # suspect: it waits, keeping its tries
    b.state.members_seen((("A", ALIVE),), 3.7)
    for k in range(ASK_TRIES + 2):
        _tick(b, 4.0 + k)
    asks = [i for i in b.replica_out if i.msg.kind == ASK]
    assert len(asks) == ASK_TRIES  # never answered (an older home): given up
    assert all(i.dest == "A" and i.msg.task_id == tid for i in asks)


def test_a_restarted_holder_asks_about_each_copy_not_known_to_have_ended() -> None:
    nodes, a, b, tid = _started_at_a()
    a.finish(tid, wall=1005.0)
    fresh = FakeNode("B")  # B restarted: its copies from its journal
    fresh.kv = dict(b.kv)
    fresh.state.held = restore_replicas(fresh.kv).held
    nodes["B"] = fresh
    fresh.state.members_seen(tuple((x, ALIVE) for x in nodes), 10.0)  # heard anew
    _tick(fresh, 11.0)
    assert [i.msg.kind for i in fresh.replica_out] == [ASK]
    assert _home_answers(nodes, fresh, tid, 12.0) == "succeeded"


def test_an_ask_about_another_homes_task_is_refused() -> None:
    nodes = _nodes()
    why, instrs = nodes["C"].state.on_replica("B", ReplicaMsg(ASK, "t9", "A"))
    assert why is not None and "its home is A" in why and instrs == []
    assert "t9" not in nodes["C"].state.strays


def test_the_ask_on_the_wire() -> None:
    msg = ReplicaMsg(ASK, "t1", "A")
    assert replica_msg_from_wire(replica_msg_to_wire(msg)) == msg
    spec = m.TaskSpec(id="t1", argv=("x",), home="A")
    with pytest.raises(wire.SchemaError, match="'spec' does not come with an ask"):
        replica_msg_from_wire({**replica_msg_to_wire(msg), "spec": codec.task_spec_to_wire(spec)})
    with pytest.raises(wire.SchemaError, match="hold, runner, release or ask"):
        replica_msg_from_wire({**replica_msg_to_wire(msg), "kind": "tell"})


def test_asks_are_bounded_per_tick() -> None:
    nodes = _nodes()
    b = nodes["B"]
    for i in range(5):
        spec = m.TaskSpec(id=f"t{i}", argv=("x",), home="A")
        b.run(b.state.on_replica("A", ReplicaMsg(HOLD, spec.id, "A", None, ("B",), spec))[1])
    old = copyasks.ASKS_PER_TICK
    copyasks.ASKS_PER_TICK = 2
    try:
        _away_and_back(b, "A", 1.0)
        _tick(b, 3.0)
        first = [i.msg.task_id for i in b.replica_out]
        b.replica_out.clear()
        _tick(b, 4.0)
        second = [i.msg.task_id for i in b.replica_out]
    finally:
        copyasks.ASKS_PER_TICK = old
    # the ones not answered yet go to the back: the others are asked next
    assert len(first) == 2 and len(second) == 2 and not set(first) & set(second)


def test_a_copy_long_without_news_is_asked_about_once_an_hour() -> None:
    """A release that overtook its copy (acknowledged, the late copy then kept queued):
    the home has forgotten the holder, and neither went away. The hourly look asks."""
    nodes, a, b, tid = _started_at_a()
    b.state.homes_back.clear()  # B heard A before it took the copy: no ask for that
    a.finish(tid, wall=1005.0)
    ended = ReplicaMsg(
        HOLD, "t-ended", "A", None, ("B",), m.TaskSpec(id="t-ended", argv=("x",), home="A")
    )
    b.run(b.state.on_replica("A", ended)[1])
    b.state.held["t-ended"].final = Final("succeeded", 0)  # known to have ended: not asked
    _tick(b, 1.0)  # the first look: seen
    _tick(b, 1.0 + copyasks.RECHECK_AFTER - 1.0)
    assert b.replica_out == []  # not an hour yet
    _tick(b, 1.0 + copyasks.RECHECK_AFTER + copyasks.RECHECK_SWEEP)
    assert [(i.dest, i.msg.kind, i.msg.task_id) for i in b.replica_out] == [("A", ASK, tid)]
    assert _home_answers(nodes, b, tid, 5000.0) == "succeeded"
    _tick(b, 1.0 + 3 * copyasks.RECHECK_AFTER)
    assert b.replica_out == []  # answered, and ended: asked no more
