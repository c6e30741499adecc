"""Gangs and arrays at the local API (issues 22 and 23): the submit check that a gang
could ever fit, an array's elements counted in a listing, and the cancel of a whole
gang or array at its home. A part of LocalOps (localops.py), which holds the fields
below."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import trio

from .. import codec
from .. import model as m
from ..node.arrays import element_id
from ..policy import arrays as ap
from ..policy import depends as dp
from ..policy import gangfit
from ..policy.arrays import parse_array
from ..policy.constraints import parse_constraint
from .api import PeerCred, RequestError
from .driver import Driver
from .peers import ClusterNode
from .taskaccess import TaskAccess, user_name
from .tasks import TaskTable


class GroupOps:
    node: m.NodeId
    table: TaskTable
    cluster: ClusterNode
    coord: Driver
    access: TaskAccess

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

    async def resolve_after(self, spec: m.TaskSpec, cred: PeerCred) -> m.TaskSpec:
        """`--after` with every parent resolved to a task id that exists and that the
        submitter may see: one's own chosen id as the owner's, `ID[INDEX]` as the
        element's id (the index must be in the array; the element may not exist yet).
        RequestError naming the field otherwise."""
        if not spec.after:
            return spec
        clauses = dp.parse_after(spec.after)
        out = []
        for clause in clauses:
            ids = []
            for p in clause.parents:
                t = await self._parent(p.task_id, cred)
                if p.index is None:
                    ids.append(t.id)
                    continue
                if not t.spec.array or p.index not in parse_array(t.spec.array, ap.MAX_INDEX + 1):
                    raise RequestError(
                        "invalid", f"submit: after: {p.text()} is not an element of an array"
                    )
                ids.append(element_id(t.id, p.index))
            out.append(f"{clause.cond.value}:" + ",".join(ids))
        resolved = attrs.evolve(spec, after=tuple(out))
        if any(
            pid == spec.id
            for c in dp.parse_after(resolved.after)
            for pid in (p.task_id for p in c.parents)
        ):
            raise RequestError("invalid", f"submit: after: {spec.id} cannot wait for itself")
        return resolved

    async def _parent(self, text: str, cred: PeerCred) -> m.Task:
        candidates = [text]
        if (
            "~" not in text
            and m.valid_client_task_id(text)
            and not m.GENERATED_TASK_ID.fullmatch(text)
        ):
            candidates.insert(0, m.owned_task_id(text, cred.uid, user_name(cred.uid)))
        for tid in candidates:
            try:
                t = await self.access.find(tid)
            except RequestError:
                continue
            if not (self.access.operator(cred) or self.access.owns(t, cred, user_name(cred.uid))):
                raise RequestError("invalid", f"submit: after: task {tid} belongs to another user")
            return t
        raise RequestError("invalid", f"submit: after: no task {text}")

    async def read_parents(self, ids: list[m.TaskId]) -> dict[m.TaskId, str]:
        """The final states of remote parents that have ended (for node/depends.py)."""
        out: dict[m.TaskId, str] = {}

        async def one(tid: m.TaskId) -> None:
            try:
                t = await self.access.find(tid)
            except RequestError:
                return
            if t.state.terminal:
                out[tid] = t.state.value

        async with trio.open_nursery() as n:
            for tid in ids[:64]:
                n.start_soon(one, tid)
        return out

    async def cancel_group(self, t: m.Task, cause: str) -> m.Task:
        """Cancel a gang or an array homed here: a gang's coordinator aborts its round;
        an array creates nothing more and its unfinished elements are cancelled; one
        still waiting for its parents (--after) is simply cancelled."""
        st = self.coord.state
        if t.state is m.TaskState.QUEUED and t.id not in st.arrays and t.id not in st.gang_coords:
            return await self.table.change_durably(t.id, m.TaskState.CANCELLED, cause)
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
