"""Issue 21 in the node's placement machine, as stimulus lists: constraints re-checked
at the target, delay scheduling for a data task, a working directory no node has,
spread and anti-affinity from the home's own records, stale reports."""

from __future__ import annotations

from swarm import model as m
from swarm.node.state import Settings
from swarm.policy import datakeys

from .node_harness import FakeNet, FakeNode, busy, gossip

S = m.TaskState


def _node(name: str, labels: dict[str, str] | None = None, **kw: object) -> FakeNode:
    settings = Settings(
        labels=tuple(sorted((labels or {}).items())),
        **kw,  # type: ignore[arg-type]
    )
    return FakeNode(name, settings=settings)


def test_a_constrained_task_goes_only_to_a_matching_node_even_from_a_busy_home() -> None:
    a, b, c = _node("A", {"pool": "x"}), _node("B", {"pool": "y"}), _node("C", {"pool": "y"})
    net = FakeNet(a, b, c)
    busy(a, 8)
    gossip(a, b, c)
    a.submit(m.TaskSpec(id="t1", argv=("x",), constraints=("pool=x",)))
    a.run(a.state.place("t1", 0.0, 0.0))
    # the idle peers do not match: it stays at its busy home, the only match
    assert "t1" in a.queue and not a.outbox
    net.deliver("A")
    rec = a.state.explains["t1"][-1]
    by = {c["node"]: c["why_not"] for c in rec["candidates"]}
    assert by["B"].startswith("constraint pool=x: pool=y")


def test_the_target_refuses_an_offer_its_own_labels_do_not_satisfy() -> None:
    """The placer read B's gossiped labels (pool=x); B has since been relabelled."""
    b = _node("B", {"pool": "y"})
    spec = m.TaskSpec(id="t2", argv=("x",), constraints=("pool=x",), home="A")
    assert b.state.admission_refusal(spec) == "constraint pool=x: pool=y"
    ok = m.TaskSpec(id="t3", argv=("x",), constraints=("pool=y",), home="A")
    assert b.state.admission_refusal(ok) is None


def test_a_data_task_waits_for_a_holder_then_goes_anywhere_after_the_delay() -> None:
    a = _node("A", data_delay=3.0)
    holder = FakeNode(
        "H", settings=Settings(data_digest=datakeys.digest(["imagenet"]), data_delay=3.0)
    )
    busy(holder, 1)  # its one slot is taken: no free slot at the holder
    gossip(a, holder)
    a.submit(m.TaskSpec(id="d1", argv=("x",), data=("imagenet",), submitted_at=100.0), 100.0)
    a.run(a.state.place("d1", 0.0, 100.0))
    assert "d1" in a.state.jobs and "d1" not in a.queue
    assert "waiting for a slot on a node holding imagenet" in a.state.explains["d1"][-1]["outcome"]
    # still within the delay: still waiting
    a.run(a.state.wake(1.0, 101.0))
    assert "d1" not in a.queue
    # past the delay: any node, here the idle home itself
    a.run(a.state.wake(3.5, 103.5))
    assert "d1" in a.queue and "d1" not in a.state.jobs


def test_a_data_task_goes_at_once_to_a_holder_with_a_free_slot() -> None:
    a = _node("A")
    holder = FakeNode("H", settings=Settings(data_digest=datakeys.digest(["imagenet"]), slots=4))
    FakeNet(a, holder)
    gossip(a, holder)
    a.submit(m.TaskSpec(id="d2", argv=("x",), data=("imagenet",), submitted_at=0.0))
    a.run(a.state.place("d2", 0.0, 0.0))
    assert a.outbox and a.outbox[0].dest == "H"


def test_a_working_directory_no_node_has_fails_the_task_with_the_reason() -> None:
    def no_cwd(spec: m.TaskSpec) -> str | None:
        return f"working directory {spec.cwd} does not exist on node A" if spec.cwd else None

    a = _node("A")
    a.state.admission_hook = no_cwd
    a.submit(m.TaskSpec(id="c1", argv=("x",), cwd="/nowhere"))
    a.run(a.state.place("c1", 0.0, 0.0))
    t = a.state.records.get_cached("c1")
    assert t is not None and t.state is S.FAILED
    assert "does not exist on any node" in t.reason
    assert a.finals["c1"] == 1


def test_a_working_directory_only_a_peer_has_sends_the_task_there() -> None:
    a, b = _node("A"), _node("B")
    net = FakeNet(a, b)
    a.state.admission_hook = lambda s: "working directory /only-b does not exist on node A"
    gossip(a, b)
    a.submit(m.TaskSpec(id="c2", argv=("x",), cwd="/only-b"))
    a.run(a.state.place("c2", 0.0, 0.0))
    net.deliver("A")
    assert a.state.records.active["c2"].node == "B"


def test_spread_puts_the_next_task_of_a_job_on_the_least_used_rack() -> None:
    a, b, c = _node("A", {"rack": "r1"}), _node("B", {"rack": "r1"}), _node("C", {"rack": "r2"})
    FakeNet(a, b, c)
    gossip(a, b, c)
    for i in range(2):  # two of the job's tasks already run on rack r1 (here)
        spec = a.submit(m.TaskSpec(id=f"j{i}", argv=("x",), job="j", spread="rack"))
        a.run_here(spec.id)
    where = a.state.where(
        m.TaskSpec(id="j9", argv=("x",), job="j", spread="rack"), a.state.local_report(0.0), 0.0
    )
    assert where.spread_to == frozenset({"r2"})
    a.submit(m.TaskSpec(id="j9", argv=("x",), job="j", spread="rack"))
    a.run(a.state.place("j9", 0.0, 0.0))
    assert a.outbox and a.outbox[-1].dest == "C"


def test_anti_affinity_marks_a_node_holding_the_limit_full() -> None:
    a, b = _node("A"), _node("B")
    FakeNet(a, b)
    gossip(a, b)
    spec = a.submit(m.TaskSpec(id="k0", argv=("x",), job="k", anti_affinity=1))
    a.run_here(spec.id)
    a.submit(m.TaskSpec(id="k1", argv=("x",), job="k", anti_affinity=1))
    a.run(a.state.place("k1", 0.0, 0.0))
    assert a.outbox and a.outbox[-1].dest == "B"
    # another user's job of the same name is not counted
    other = m.TaskSpec(id="k2", argv=("x",), job="k", anti_affinity=1, uid=4242)
    assert a.state.where(other, a.state.local_report(0.0), 0.0).full == frozenset()


def test_a_peer_whose_report_is_too_old_is_not_a_candidate() -> None:
    a, b = _node("A", report_max_age=15.0), _node("B")
    busy(a, 8)
    b_report = b.state.local_report(0.0)
    a.state.view.upsert(b_report, 0.0)  # received at t=0
    a.submit(m.TaskSpec(id="s1", argv=("x",)))
    a.run(a.state.place("s1", 20.0, 20.0))  # 20 s later
    assert "s1" in a.queue
    by = {c["node"]: c["why_not"] for c in a.state.explains["s1"][-1]["candidates"]}
    assert by["B"].startswith("report too old (age 20.0 s > 15 s)")


def test_a_constrained_task_whose_directory_no_eligible_node_has_fails_too() -> None:
    """Nodes its constraints rule out are never asked, so they never refuse it: the
    matching ones' refusals are enough to fail it."""
    a, b, c = _node("A", {"pool": "x"}), _node("B", {"pool": "x"}), _node("C", {"pool": "y"})
    net = FakeNet(a, b, c)
    for n in (a, b):
        n.state.admission_hook = lambda s, n=n: (
            f"working directory {s.cwd} does not exist on node {n.name}"
        )
    gossip(a, b, c)
    a.submit(m.TaskSpec(id="c3", argv=("x",), cwd="/nowhere", constraints=("pool=x",)))
    a.run(a.state.place("c3", 0.0, 0.0))
    for _ in range(10):
        if not net.deliver("A"):
            a.run(a.state.wake(100.0, 100.0))
    t = a.state.records.get_cached("c3")
    assert t is not None and t.state is S.FAILED, t
    assert "does not exist on any node" in t.reason
