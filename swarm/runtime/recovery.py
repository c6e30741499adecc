"""The node's restart and forgetting rules, over its parts' state.

`recover` brings the journal's view back to a consistent, runnable state before
anything starts; `still_needed` and `forget_task_state` are retention's two
questions (may a finished task be forgotten yet; what goes with it).
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import psutil

from .. import model as m
from ..logs import EventLog
from ..node.restart import restart_plan
from ..policy.shares import ShareLedger
from . import shim
from .autoscaler import Autoscaler
from .driver import Driver
from .executor import ProcessResult, kill_group, kill_orphan
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
    outlived: dict[m.TaskId, shim.Shim | ProcessResult] = {}
    for tid, (pid, ct) in rec.procs.items():
        sup = rec.shims.get(tid)
        if sup is not None:
            found = shim.Shim(pid, ct, sup[0], Path(sup[1]))
            end = _supervised(found, log, tid)
            if end is not None:
                outlived[tid] = end
                if isinstance(end, shim.Shim):
                    continue  # still running: its process record stays
        elif kill_orphan(pid, ct):
            log.warning("agent.orphan_killed", task=tid, pid=pid)
        journal.enqueue([DelProc(tid)])
    ops.restore(rec.kv)
    table.load(rec.active)
    for t in rec.owed:  # ended, and still owed to its home or to its copies
        table.records.store(t)
    coord.restore(rec.kv)
    migrator.restore(rec.kv)
    if scaler is not None:
        scaler.restore(rec.kv)  # elastic pools: the last action, the nodes draining
    plan = restart_plan(node, rec.active, coord.guest.entries, outlived)
    for tid in plan.forget:
        table.forget(tid)  # it moved on while we were down
    for tid in plan.watch:
        # it outlived the agent under its supervisor: still running, or its end is
        # known; never run again (runner._adopt_all watches it or records the end)
        ledger.add(table.active[tid].spec)
        runner.adopting[tid] = outlived[tid]
    for tid in plan.fail:
        table.change(tid, m.TaskState.FAILED, "agent restarted while task was running (--no-retry)")
    for tid in plan.requeue:
        table.change(tid, m.TaskState.QUEUED, "agent restarted: will run again", node=node)
    for tid in plan.enqueue:
        ledger.add(table.active[tid].spec)
        runner.enqueue(tid)
    # the pool's directories (statusdirs.py) a crash left that no row names
    runner.status_dirs.sweep(Path(sup[1]) for sup in rec.shims.values())
    for tid, what in outlived.items():
        if tid not in runner.adopting:
            # not RUNNING here by its record: nobody would watch it, so it must not run
            if isinstance(what, shim.Shim):
                kill_group(what.task_pid, signal.SIGKILL)
                log.warning("agent.orphan_killed", task=tid, pid=what.task_pid)
            journal.enqueue([DelProc(tid)])
    if rec.active:
        log.info(
            "agent.recovered",
            tasks=len(rec.active),
            requeued=len(plan.requeue),
            reattached=sum(isinstance(w, shim.Shim) for w in runner.adopting.values()),
            ended_while_down=sum(isinstance(w, ProcessResult) for w in runner.adopting.values()),
        )


def _supervised(found: shim.Shim, log: EventLog, tid: m.TaskId) -> shim.Shim | ProcessResult | None:
    """A task a previous run started under its supervisor: the shim itself when it
    still runs it; its end from the exit file when it ended while the agent was down;
    None (it runs again, as before issue 19) when the shim is gone without one (it was
    killed, or the host rebooted): its task's group, if still there, is killed."""
    if found.alive():
        return found
    try:
        end = shim.read_exit(found.status_dir)
    except shim.ExitFileError as e:
        log.warning("agent.bad_exit_file", task=tid, error=str(e))
        end = None
    if end is None:
        if _still_its_group(found):
            kill_group(found.task_pid, signal.SIGKILL)
            log.warning("agent.orphan_killed", task=tid, pid=found.task_pid)
        return None
    log.info("task.ended_while_down", task=tid, exit=end.exit_code, signal=end.signal)
    if end.error is not None:
        why = f"cannot start process: {os.strerror(end.error)}"
        return ProcessResult(None, None, spawn_error=why, pid=end.pid)
    return ProcessResult(end.exit_code, end.signal, pid=end.pid)


def _still_its_group(found: shim.Shim) -> bool:
    """Is the task's process group still the one its shim started (not a recycled
    pid): a process of that group, born after the shim."""
    try:
        p = psutil.Process(found.task_pid)
        return os.getpgid(found.task_pid) == found.task_pid and (
            p.create_time() >= found.create_time - 0.5
        )
    except (psutil.Error, OSError):
        return False


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
    after the final report, for late revokes), its cached decisions and its
    supervisor's status directory go too."""
    coord.explains.pop(tid, None)
    if coord.home.forget(tid):
        journal.enqueue([DelKV("home:" + tid)])
    if coord.state.adopted.pop(tid, None) is not None:
        journal.enqueue([DelKV("adopt:" + tid)])
    # its supervisor's status directory, as agents before the pool named it
    # (statusdirs.py): the exit file served once the end was journaled
    shutil.rmtree(coord.runner.shim_root / tid, ignore_errors=True)
