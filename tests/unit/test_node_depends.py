"""Dependencies in the pure NodeState (node/depends.py): a task with --after waits at
its home, is placed once its parents ended as asked, fails when they never can, reads
parents homed elsewhere from the runtime's answers, and treats an array's record as
the whole array."""

from __future__ import annotations

from swarm import model as m
from swarm.node import events as ev
from swarm.node.state import Settings

from .node_harness import FakeNode

S = m.TaskState


def _node() -> FakeNode:
    n = FakeNode("A", settings=Settings(slots=4))
    n.run(n.state.start_timers(0.0))
    return n


def _child(n: FakeNode, *after: str, tid: str = "c") -> m.TaskSpec:
    spec = n.submit(m.TaskSpec(id=tid, argv=("x",), after=after))
    n.run(n.state.handle(ev.DepsSubmitted(0.0, 1000.0, "s", spec.id)))
    return spec


def _end(n: FakeNode, tid: str, dst: m.TaskState, now: float) -> None:
    if dst is not S.CANCELLED:
        n.state.records.apply(tid, S.RUNNING, 1000.0 + now, "started", node="A")
    done = n.state.records.apply(
        tid, dst, 1000.0 + now, "end", exit_code=0 if dst is S.SUCCEEDED else 1
    )
    n.run([ev.Record(done, durable=True)])
    n.run(n.state.handle(ev.Wake(now, 1000.0 + now, "w")))


def test_a_child_waits_for_its_parent_then_is_placed() -> None:
    n = _node()
    n.submit(m.TaskSpec(id="p", argv=("x",)))
    _child(n, "ok:p")
    assert n.placements == []
    assert "waiting for p (ok)" in n.state.deps_why["c"]
    _end(n, "p", S.SUCCEEDED, 1.0)
    assert n.placements == ["c"] and "c" not in n.state.deps


def test_a_parent_that_can_never_satisfy_fails_the_child_with_the_reason() -> None:
    n = _node()
    n.submit(m.TaskSpec(id="p", argv=("x",)))
    n.submit(m.TaskSpec(id="q", argv=("x",)))
    _child(n, "ok:p", tid="c1")
    _child(n, "notok:q", tid="c2")
    _child(n, "any:p,q", tid="c3")
    _end(n, "p", S.FAILED, 1.0)
    c1 = n.state.records.get_cached("c1")
    assert c1 is not None and c1.state is S.FAILED
    assert "p ended failed; --after ok:p needs it to succeed" in c1.reason
    _end(n, "q", S.SUCCEEDED, 2.0)
    c2 = n.state.records.get_cached("c2")
    assert c2 is not None and c2.state is S.FAILED and "needs it to fail" in c2.reason
    assert n.placements == ["c3"]  # any: both ended


def test_parents_homed_elsewhere_come_from_the_runtime() -> None:
    n = _node()
    _child(n, "ok:far~bob")
    assert n.state.deps_remote() == ["far~bob"]
    n.run(n.state.handle(ev.ParentsSeen(1.0, 1001.0, "r", {"far~bob": "running"})))
    assert n.placements == []  # not final: still waits
    n.run(n.state.handle(ev.ParentsSeen(2.0, 1002.0, "r", {"far~bob": "succeeded"})))
    assert n.placements == ["c"] and n.state.deps_remote() == []


def test_an_array_parent_is_its_record_and_an_array_child_creates_elements_when_ready() -> None:
    n = _node()
    n.submit(m.TaskSpec(id="arr", argv=("x",), array="0-1"))
    kid = n.submit(m.TaskSpec(id="kids", argv=("y",), array="0-2", after=("ok:arr",)))
    n.run(n.state.handle(ev.DepsSubmitted(0.0, 1000.0, "s", kid.id)))
    assert not [t for t in n.state.records.active.values() if t.spec.element]
    _end(n, "arr", S.SUCCEEDED, 1.0)  # the array's record ended: the whole array did
    els = sorted(t.id for t in n.state.records.active.values() if t.spec.element)
    assert els == ["kids_0", "kids_1", "kids_2"]


def test_elements_and_members_do_not_wait_again() -> None:
    n = _node()
    n.submit(m.TaskSpec(id="p", argv=("x",)))
    arr = n.submit(m.TaskSpec(id="kids", argv=("y",), array="0-1", after=("any:p",)))
    n.run(n.state.handle(ev.DepsSubmitted(0.0, 1000.0, "s", arr.id)))
    _end(n, "p", S.CANCELLED, 1.0)
    els = [t for t in n.state.records.active.values() if t.spec.element]
    assert len(els) == 2 and all(t.spec.after == () for t in els)
