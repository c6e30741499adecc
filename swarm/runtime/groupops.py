"""Gangs and arrays at the local API (issues 22 and 23): the submit check that a gang
could ever fit, an array's elements counted in a listing, and the cancel of a whole
gang or array at its home. A part of LocalOps (localops.py), which holds the fields
below."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from .. import codec
from .. import model as m
from ..policy import gangfit
from ..policy.constraints import parse_constraint
from .driver import Driver
from .peers import ClusterNode
from .tasks import TaskTable


class GroupOps:
    node: m.NodeId
    table: TaskTable
    cluster: ClusterNode
    coord: Driver

    if TYPE_CHECKING:  # provided by LocalOps

        async def cancel_task(self, t: m.Task, cause: str) -> m.Task: ...

    def _gang_never_fits(self, spec: m.TaskSpec) -> str | None:
        """A gang whose members could never run together on the gossiped capacity."""
        ms = self.cluster.membership
        if spec.gang is None or ms is None or (self.cluster.seed_addrs and ms.num_live <= 1):
            return None
        reports = [self.coord.local_report()]
        for mb in ms.alive_members():
            e = self.coord.view.get(mb.node) if mb.node != self.node else None
            if e is not None:
                reports.append(e.report)
        cons_ = [parse_constraint(c) for c in spec.constraints]
        why = gangfit.never_fits(
            reports,
            spec.gang.size,
            cpu=spec.cpu or 0.0,
            mem=spec.mem or 0,
            gpu=spec.gpu,
            constraints=cons_,
        )
        return why or None

    def _listed(self, tasks: list[m.Task], expand: bool) -> list[dict[str, Any]]:
        """Each task's record; an array's with its elements counted by state, and its
        elements left out unless `expand` (a million lines say less than one)."""
        arrays = {t.id for t in tasks if t.spec.array}
        out = []
        for t in tasks:
            el = t.spec.element
            if el is not None and el.array in arrays and not expand:
                continue
            rec = codec.task_to_wire(t)
            if t.spec.array:
                rec["elements"] = self.coord.state.array_counts(t.id) or {}
            out.append(rec)
        return out

    async def cancel_group(self, t: m.Task, cause: str) -> m.Task:
        """Cancel a gang or an array homed here: a gang's coordinator aborts its round;
        an array creates nothing more and its unfinished elements are cancelled."""
        if t.spec.array:
            ids = self.coord.array_cancel(t.id, cause)
            async with trio.open_nursery() as n:
                for eid in ids:
                    e = self.table.get_cached(eid)
                    if e is not None and not e.state.terminal:
                        n.start_soon(self.cancel_task, e, cause)
        else:
            self.coord.gang_cancel(t.id, cause)
        with trio.move_on_after(30):
            return await self.table.wait_terminal(t.id)
        return await self.table.get(t.id)
