"""Global tasks' I/O: the journaled and gossiped set (a CRDT, policy/shares.py), and
the loop that starts here the members that should run here and stops the others."""

from __future__ import annotations

from typing import Any, Protocol

import trio

from .. import model as m
from .. import wire
from ..logs import EventLog
from ..node.recovery import GLOBALS_KEY
from ..node.state import NodeState
from ..policy import shares as sh
from .clock import Clock
from .journal import Journal, PutKV
from .peers import ClusterNode
from .runner import LocalRunner
from .tasks import TaskTable


class Driver(Protocol):
    """What global tasks use of the driver (runtime/driver.py)."""

    node: m.NodeId
    cluster: ClusterNode | None
    clock: Clock
    state: NodeState
    runner: LocalRunner
    table: TaskTable
    journal: Journal
    log: EventLog

    def local_report(self) -> m.LoadReport: ...
    def run_inline(self, instrs: list[Any]) -> None: ...


S = m.TaskState


class GlobalTaskIO:
    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self._kick = trio.Event()

    def kick(self) -> None:
        self._kick.set()

    async def add(self, spec: m.TaskSpec) -> None:
        """Journaled (the caller acknowledges after this), then gossiped."""
        d = self.driver
        new = d.state.globals.add(spec)
        await d.journal.commit([PutKV(GLOBALS_KEY, new.to_wire())])
        d.state.globals = new
        self._changed()

    async def remove(self, tid: m.TaskId) -> None:
        d = self.driver
        new = d.state.globals.remove(tid)
        await d.journal.commit([PutKV(GLOBALS_KEY, new.to_wire())])
        d.state.globals = new
        self._changed()

    def _changed(self) -> None:
        d = self.driver
        wire_form = d.state.globals.to_wire()
        if d.cluster is not None:
            try:
                d.cluster.broadcast_app(GLOBALS_KEY, wire_form)
            except ValueError as e:
                d.log.warning("globals.too_large_for_gossip", error=str(e))
            d.cluster.set_app_state_part(GLOBALS_KEY, wire_form)
        self._kick.set()

    def merge(self, obj: Any) -> None:
        d = self.driver
        try:
            other = sh.GlobalTasks.from_wire(obj)
        except wire.WireError as e:
            d.log.warning("globals.bad_gossip", error=str(e))
            return
        merged = d.state.globals.merge(other)
        if merged != d.state.globals:
            d.state.globals = merged
            d.journal.enqueue([PutKV(GLOBALS_KEY, merged.to_wire())])
            if d.cluster is not None:
                d.cluster.set_app_state_part(GLOBALS_KEY, merged.to_wire())
            self._kick.set()

    async def loop(self) -> None:
        d = self.driver
        if d.cluster is not None:
            d.cluster.set_app_state_part(GLOBALS_KEY, d.state.globals.to_wire())
        while True:
            # gossip, local changes and the node's timer (node/timers.py) kick this;
            # one sync at a time
            await self._kick.wait()
            self._kick = trio.Event()
            await self.sync()

    async def sync(self) -> None:
        d = self.driver
        table = d.table
        active = {t.id for t in table.active.values() if t.spec.is_global}
        finished = {t.id for t in table.finished.values() if t.spec.is_global}
        for tid in d.state.globals.members:
            if tid not in active and tid not in finished:
                cached = table.get_cached(tid)
                if cached is None:
                    try:
                        old = await table.journal.get_task(tid)
                    except Exception:
                        old = None
                    if old is not None and old.state.terminal:
                        finished.add(tid)
        has_shares = sh.cluster_has_shares(d.local_report(), d.state.view)
        delta = sh.global_delta(d.state.globals, active, finished, has_shares=has_shares)
        for spec in delta.start:
            task = m.new_task(spec, d.clock.wall(), d.node, cause="global task")
            try:
                # queued to run once written (a failed fsync after that leaves it
                # running: the global set, not this record, says it should run here)
                await table.add(task, on_written=self._run_here)
            except Exception as e:
                d.log.error("globals.journal_failed", task=spec.id, error=str(e))
        for tid in delta.stop:
            t = table.active.get(tid)
            if t is None:
                continue
            if tid in d.runner.running:
                await d.runner.cancel(tid)
            elif t.state is S.QUEUED:
                try:
                    d.runner.queue.remove(tid)
                except ValueError:
                    pass
                d.state.ledger.remove(tid)
                await table.change_durably(tid, S.CANCELLED, "global task cancelled")

    def _run_here(self, task: m.Task) -> None:
        d = self.driver
        d.run_inline(d.state.enqueue_local(task, d.clock.now()))
