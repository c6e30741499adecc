"""The node's restart and forgetting rules, over its parts' state.

`recover` brings the journal's view back to a consistent, runnable state before
anything starts; `still_needed` and `forget_task_state` are retention's two
questions (may a finished task be forgotten yet; what goes with it).
"""

from __future__ import annotations

from .. import model as m
from ..logs import EventLog
from ..policy.shares import ShareLedger
from .autoscaler import Autoscaler
from .driver import Driver
from .executor import kill_orphan
from .journal import DelKV, DelProc, Journal
from .localops import LocalOps
from .moving import Migrator
from .runner import LocalRunner
from .tasks import TaskTable


def recover(
    *,
    node: m.NodeId,
    journal: Journal,
    table: TaskTable,
    ledger: ShareLedger,
    runner: LocalRunner,
    coord: Driver,
    migrator: Migrator,
    ops: LocalOps,
    log: EventLog,
    scaler: Autoscaler | None = None,
) -> None:
    """Kill the processes a previous run left (their tasks run again), restore the
    parts' journaled state (the shares before the records they admit), then: a
    guest record whose task moved on while we were down is forgotten; a task that was
    running here runs again (a --no-retry one at its home fails instead); a queued
    guest or global task goes back into the run queue."""
    rec = journal.recover()
    for tid, (pid, ct) in rec.procs.items():
        if kill_orphan(pid, ct):
            log.warning("agent.orphan_killed", task=tid, pid=pid)
        journal.enqueue([DelProc(tid)])
    ops.restore(rec.kv)
    table.load(rec.active)
    coord.restore(rec.kv)
    migrator.restore(rec.kv)
    if scaler is not None:
        scaler.restore(rec.kv)  # elastic pools: the last action, the nodes draining
    requeued = 0
    S = m.TaskState
    for t in rec.active:
        guest = t.spec.home != node and not t.spec.is_global
        if guest and t.id not in coord.guest.entries:
            table.forget(t.id)  # it moved on while we were down
            continue
        if t.node != node:
            continue  # a home record of a task that lives elsewhere
        if t.state in (S.RUNNING, S.MIGRATING):
            if t.spec.no_retry and not guest:
                table.change(t.id, S.FAILED, "agent restarted while task was running (--no-retry)")
                continue
            table.change(t.id, S.QUEUED, "agent restarted: will run again", node=node)
            requeued += 1
        t = table.active[t.id]
        if t.state is S.QUEUED and (guest or t.spec.is_global):
            ledger.add(t.spec)
            runner.enqueue(t.id)
    if rec.active:
        log.info("agent.recovered", tasks=len(rec.active), requeued=requeued)


def still_needed(coord: Driver, migrator: Migrator, runner: LocalRunner, tid: m.TaskId) -> bool:
    """May retention not forget this finished task yet? Its result is still owed to
    its home or awaited from a guest, it is moving, or it is a global task, which
    must stay known as done here or it would start again."""
    c, mig = coord, migrator
    return (
        not c.home.settled(tid)
        or tid in c.guest.entries
        or tid in c.state.globals.members
        or tid in runner.running
        or tid in mig.outgoing
        or tid in mig.incoming
        or tid in mig.retained
        or tid in mig.arrivals
    )


def forget_task_state(coord: Driver, journal: Journal, tid: m.TaskId) -> None:
    """Retention forgot a task: its settled handoff state (the home's entry stays
    after the final report, for late revokes) and its cached decisions go too."""
    coord.explains.pop(tid, None)
    if coord.home.forget(tid):
        journal.enqueue([DelKV("home:" + tid)])
