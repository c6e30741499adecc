"""`swarm explain`: the decisions of a task's home and of the node that holds it, asked
across the cluster; a part of LocalOps (localops.py), which holds the fields below."""

from __future__ import annotations

from typing import Any

from .. import codec, request_checks, wire
from .. import model as m
from .api import PeerCred
from .clock import Clock
from .driver import Driver
from .net import TransportError
from .peers import ClusterNode, RemoteError
from .queueops import QueueOps
from .runner import LocalRunner
from .taskaccess import TaskAccess, unreachable
from .tasks import TaskTable, UnknownTask


class ExplainOps:
    node: m.NodeId
    table: TaskTable
    runner: LocalRunner
    cluster: ClusterNode
    coord: Driver
    clock: Clock
    access: TaskAccess
    queue_ops: QueueOps

    async def op_explain(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        t = await self.access.task(f, cred)
        f.done()
        self.access.authorize(t, cred)
        if t.spec.home not in ("", self.node) and not t.spec.is_global:
            try:
                r = await self.cluster.request(
                    t.spec.home, {"op": "explain", "id": t.id}, timeout=5.0
                )
            except TransportError as e:
                raise unreachable(t, "explain it", e) from None
            return {"task": codec.task_to_wire(t), "decisions": r.get("decisions", [])}
        return {"task": codec.task_to_wire(t), "decisions": await self._explain_all(t)}

    async def _explain_all(self, t: m.Task) -> list[dict[str, Any]]:
        """The home's decisions, plus why the executing node has not started it yet."""
        out = await self._explain(t.id)
        if t.node not in ("", self.node):
            # the executing node's own decisions (why it waits there, a preemption);
            # for a finished task only if that node answers at once
            try:
                r = await self.cluster.request(
                    t.node,
                    {"op": "explain", "id": t.id, "local": True},
                    timeout=1.0 if t.state.terminal else 3.0,
                )
                out += [{**d, "node": t.node} for d in r.get("decisions", [])]
            except (TransportError, RemoteError) as e:
                if not t.state.terminal:
                    out.append({"at": self.clock.wall(), "outcome": f"cannot ask {t.node}: {e}"})
        return out

    async def _explain(self, tid: m.TaskId) -> list[dict[str, Any]]:
        out = await self.coord.explain(tid)
        blocked = self.runner.blocked.get(tid)
        if blocked:
            out.append({"at": self.clock.wall(), "outcome": "queued here, not started: " + blocked})
        out += self.queue_ops.explain(tid)
        st = self.coord.state
        why = (
            st.gang_explain(tid)
            or st.array_explain(tid)
            or (f"--after: {st.deps_why[tid]}" if tid in st.deps_why else None)
        )
        if why is not None:
            out.append({"at": self.clock.wall(), "outcome": why})
        return out

    async def rpc_explain(
        self, req: dict[str, Any], sender: m.NodeId, stream: Any
    ) -> dict[str, Any]:
        tid = request_checks.check_task_id(req.get("id"))
        if req.get("local"):
            return {"decisions": await self._explain(tid)}
        try:
            t = await self.table.get(tid)
        except UnknownTask:
            return {"decisions": await self._explain(tid)}
        return {"decisions": await self._explain_all(t)}
