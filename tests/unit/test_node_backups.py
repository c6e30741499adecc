"""Speculative backups in NodeState (issue 24, node/backups.py): a late run of an
--idempotent task gets one backup elsewhere; the first copy to finish wins, the other
is stopped, and the original's record holds the one result."""

from __future__ import annotations

import attrs

from swarm import model as m
from swarm.node import events as ev
from swarm.node.backups import won_by
from swarm.node.state import NodeState, Settings
from swarm.policy.hedge import HedgeConfig
from swarm.policy.placement import OTHER_COPY

from .node_harness import FakeNet, FakeNode, busy, gossip

S = m.TaskState
HEDGE = Settings(hedge=HedgeConfig(min_history=3, budget=1.0))


def _history(a: FakeNode, n: int = 3, seconds: float = 1.0) -> None:
    """`n` runs of program `x` at A, each `seconds` long (the class's history)."""
    for i in range(n):
        spec = a.submit(m.TaskSpec(id=f"h{i}", argv=("x",), idempotent=True))
        a.run(a.state.place(spec.id, 0.0, 0.0))
        assert a.try_start(spec.id, wall=0.0) is None
        a.finish(spec.id, wall=seconds)


def _cluster() -> tuple[FakeNode, FakeNode, FakeNode, FakeNet]:
    a, b, c = (FakeNode(n, settings=HEDGE) for n in ("A", "B", "C"))
    net = FakeNet(a, b, c)
    _history(a)
    return a, b, c, net


def _late_original(a: FakeNode, b: FakeNode, c: FakeNode, tid: str = "t9") -> m.TaskId:
    """An idempotent task running at A since wall 10; B and C idle in A's view."""
    spec = a.submit(m.TaskSpec(id=tid, argv=("x", "--slow"), idempotent=True))
    _start_here(a, spec, 10.0)
    gossip(a, b, c, at=10.0)
    return spec.id


def _start_here(a: FakeNode, spec: m.TaskSpec, wall: float) -> None:
    a.run(a.state.backup_watch(a.state.records.active[spec.id], 0.0))
    a.run_here(spec.id)
    assert a.try_start(spec.id, wall=wall) is None


def _backup_of(node: FakeNode, tid: m.TaskId) -> m.Task:
    (b,) = [t for t in node.state.records.active.values() if t.spec.backup_of == tid]
    return b


def _backup_running() -> tuple[FakeNode, m.TaskId, m.Task, FakeNode, FakeNet]:
    """A's late task t9 (running at A) and its backup, started on B or C (the runner)."""
    a, b, c, net = _cluster()
    tid = _late_original(a, b, c)
    a.run(a.state.backup_tick(2.0, 12.0))
    bk = _backup_of(a, tid)
    net.settle()
    runner = {"B": b, "C": c}[a.state.records.active[bk.id].node]
    assert runner.try_start(bk.id, wall=12.1) is None
    return a, tid, bk, runner, net


def test_not_late_yet_no_backup_then_one_backup_elsewhere_never_where_the_original_runs() -> None:
    a, b, c, net = _cluster()
    tid = _late_original(a, b, c)
    a.run(a.state.backup_tick(1.0, 11.1))  # ran 1.1 s: within 1.2 x the 1 s p90
    assert not [t for t in a.state.records.active.values() if t.spec.backup_of]
    a.run(a.state.backup_tick(2.0, 12.0))  # ran 2 s: late
    bk = _backup_of(a, tid)
    assert bk.spec.argv == ("x", "--slow") and bk.spec.uid == a.state.records.active[tid].spec.uid
    assert a.state.records.active[bk.id].state is S.TRANSFERRING  # offered to B or C, not A
    net.settle()
    where = a.state.records.active[bk.id].node
    assert where in ("B", "C")
    assert a.state.explains[tid][-1]["outcome"].startswith(f"backup {bk.id} started: ran 2.0 s")
    # its placement names why A was no candidate: the original runs there
    placed = next(r for r in a.state.explains[bk.id] if "candidates" in r)
    (at_a,) = [c for c in placed["candidates"] if c["node"] == "A"]
    assert at_a["why_not"] == OTHER_COPY
    a.run(a.state.backup_tick(3.0, 13.0))  # one backup per task, never a second
    assert len([t for t in a.state.records.active.values() if t.spec.backup_of]) == 1
    assert a.state.counters["backups"] == 1


def test_the_backup_finishes_first_the_original_takes_its_result_and_is_stopped() -> None:
    a, tid, bk, runner, net = _backup_running()
    runner.finish(bk.id, wall=13.0)
    net.settle()
    assert a.state.records.get_cached(bk.id).state is S.SUCCEEDED
    a.run(a.state.backup_tick(3.0, 13.1))
    o = a.state.records.get_cached(tid)
    assert o.state is S.SUCCEEDED and o.exit_code == 0
    assert o.history[-1].cause.startswith(f"backup {bk.id} finished first on {runner.name}")
    assert won_by(o) == bk.id and won_by(a.state.records.get_cached(bk.id)) is None
    assert tid in a.stopped  # the straggler is killed
    assert a.finals[tid] == 1  # one result journaled
    assert a.state.counters["backups_won"] == 1
    assert a.state.hedger is not None and a.state.hedger.stats.won == 1
    a.run(a.state.on_ended(o, 3.2, 13.2))  # the killed run's end changes nothing
    assert a.finals[tid] == 1 and a.state.records.get_cached(tid).state is S.SUCCEEDED
    # the straggler's time never joins the history; the backup's 0.9 s does
    assert a.state.hedger.history("program x of uid None") == 4


def test_the_original_finishes_first_the_backup_elsewhere_is_cancelled() -> None:
    a, tid, bk, runner, net = _backup_running()
    a.finish(tid, wall=12.5)
    a.run(a.state.backup_tick(3.0, 12.6))
    assert a.state.explains[bk.id][-1]["outcome"] == f"lost the race: {tid} ended first (succeeded)"
    net.settle()  # the cancel reaches the runner, which stops the backup
    assert bk.id in runner.stopped
    assert a.state.records.get_cached(tid).state is S.SUCCEEDED and a.finals[tid] == 1
    assert a.state.counters["backups_lost"] == 1


def test_a_failed_backup_leaves_the_original_running() -> None:
    a, tid, bk, runner, net = _backup_running()
    runner.finish(bk.id, code=3, wall=12.4)
    net.settle()
    a.run(a.state.backup_tick(3.0, 12.6))
    assert a.state.records.active[tid].state is S.RUNNING and tid not in a.stopped
    assert "ended failed" in a.state.explains[tid][-1]["outcome"]
    a.run(a.state.backup_tick(4.0, 20.0))  # still one backup only
    assert a.state.counters["backups"] == 1


def test_never_a_backup_without_idempotent_without_history_or_without_room() -> None:
    a, b, c, _ = _cluster()
    _start_here(a, a.submit(m.TaskSpec(id="plain", argv=("x",))), 10.0)  # not --idempotent
    gossip(a, b, c, at=10.0)
    a.run(a.state.backup_tick(5.0, 30.0))
    assert not [t for t in a.state.records.active.values() if t.spec.backup_of]
    # a class with too little history: program y
    a.finish("plain", wall=30.0)
    _start_here(a, a.submit(m.TaskSpec(id="y1", argv=("y",), idempotent=True)), 30.0)
    a.run(a.state.backup_tick(6.0, 90.0))
    assert not [t for t in a.state.records.active.values() if t.spec.backup_of]
    # history enough but no room anywhere (B and C report a queued task)
    a.finish("y1", wall=90.0)
    tid = _late_original(a, b, c, "t10")
    busy(b, 1)
    busy(c, 1)
    gossip(a, b, c, at=10.0)
    a.run(a.state.backup_tick(7.0, 20.0))
    assert not [t for t in a.state.records.active.values() if t.spec.backup_of == tid]


def test_after_a_restart_the_open_race_is_found_again_and_judged() -> None:
    a, b, c, net = _cluster()
    tid = _late_original(a, b, c)
    a.run(a.state.backup_tick(2.0, 12.0))
    bk = _backup_of(a, tid)
    net.settle()
    # A restarts: a new state over the same records (the journal's)
    a2 = NodeState(
        "A",
        ledger=a.ledger,
        records=a.state.records,
        settings=HEDGE,
        queued=a.queue,
        running=a.running,
    )
    out = a2.start_timers(0.0)
    assert ev.WakeAt(0.0) in out
    a2.backup_tick(0.0, 13.0)
    assert a2.backups == {tid: bk.id}
    a2.handoffs = a.state.handoffs
    a2.records.apply(bk.id, S.RUNNING, 13.0, "started on B", node="B")
    a2.records.apply(bk.id, S.SUCCEEDED, 14.0, "exited 0", exit_code=0)
    out = a2.backup_tick(1.0, 14.1)
    assert a2.records.get_cached(tid).state is S.SUCCEEDED
    assert tid in a.running and ev.StopRun(tid, f"its backup {bk.id} finished first") in out


def test_a_backup_made_before_is_paired_again_never_a_second_one() -> None:
    """A node that took over a home's role (failover) may hold an original and the
    backup that home made: a late original is paired with it, not backed up twice."""
    a, b, c, _ = _cluster()
    tid = _late_original(a, b, c)
    spec = attrs.evolve(a.state.records.active[tid].spec, id="tb", backup_of=tid)
    a.state.records.store(m.new_task(spec, 11.0, "A"))
    a.state.hedge_scanned = True  # as if adopted after this node's start-up scan
    a.run(a.state.backup_tick(2.0, 12.0))
    assert [t.id for t in a.state.records.active.values() if t.spec.backup_of] == ["tb"]
    assert a.state.backups == {tid: "tb"} and a.state.counters["backups"] == 0


def test_idempotent_travels_and_bad_combinations_are_refused_naming_the_flag() -> None:
    """Bad input (issue 24): --idempotent with --at-most-once, --global or --gang is one
    clear line; a client cannot set backup_of (only a home does); the codec carries
    both fields."""
    import pytest

    from swarm import codec, wire
    from swarm.request_checks import submit_spec

    s = m.TaskSpec(id="t1", argv=("x",), idempotent=True, backup_of="t0")
    assert codec.task_spec_from_wire(codec.task_spec_to_wire(s)) == s
    plain = codec.task_spec_to_wire(m.TaskSpec(id="t2", argv=("x",)))
    assert "idempotent" not in plain and "backup_of" not in plain

    def submit(**extra: object) -> m.TaskSpec:
        req = {"argv": ["x"], "idempotent": True, **extra}
        return submit_spec(wire.Fields(req, "submit"), uid=0, user="root", home="A", now=0.0)

    assert submit().idempotent
    for extra, flag in (
        ({"at_most_once": True}, "--at-most-once"),
        ({"is_global": True}, "--global"),
        ({"gang": {"size": 2}}, "--gang"),
    ):
        with pytest.raises(wire.SchemaError, match=f"does not combine with {flag}"):
            submit(**extra)
    with pytest.raises(wire.SchemaError, match="backup_of"):
        submit(backup_of="t0")
