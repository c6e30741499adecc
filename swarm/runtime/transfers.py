"""Work transfer's I/O: the round timer, probes and steals over peer RPCs, and pushing
a queued task to a peer (policy/transfer.py decides all of it; the moves themselves
go through the handoff protocol, via the driver)."""

from __future__ import annotations

from typing import Any, Protocol

from .. import model as m
from .. import wire
from ..cluster import handoff as h
from ..logs import EventLog
from ..node.state import NodeState
from ..policy import transfer as tr
from .clock import Clock
from .net import TransportError
from .peers import ClusterNode, RemoteError
from .runner import LocalRunner
from .tasks import TaskTable


class Driver(Protocol):
    """What transfer uses of the driver (runtime/driver.py)."""

    node: m.NodeId
    cluster: ClusterNode | None
    clock: Clock
    state: NodeState
    runner: LocalRunner
    table: TaskTable
    log: EventLog
    rpc_timeout: float
    io_counters: dict[str, int]

    def local_report(self) -> m.LoadReport: ...
    def queue_view(self) -> list[tr.QueuedTask]: ...
    def _spawn(self, fn: Any, *args: Any) -> None: ...
    async def offer_home_task(self, tid: m.TaskId, target: m.NodeId) -> tuple[bool, str]: ...
    async def apply(self, outs: list[h.Output], *task_ids: m.TaskId) -> None: ...


S = m.TaskState


class TransferIO:
    def __init__(self, driver: Driver, config: tr.TransferConfig | None) -> None:
        self.driver = driver
        self.policy = tr.TransferPolicy(driver.node, config)

    def round(self) -> None:
        """One transfer round (the node's timers say when): what to probe, push, steal."""
        d = self.driver
        if d.cluster is None:
            return
        actions = self.policy.step(
            d.clock.now(), d.local_report(), d.queue_view(), d.state.view, d.state.rng
        )
        for a in actions:
            d._spawn(self.action, a)

    async def action(self, a: tr.Action) -> None:
        d = self.driver
        assert d.cluster is not None
        if isinstance(a, tr.ProbeFor):
            try:
                raw = await d.cluster.request(
                    a.peer,
                    {"op": "probe", "req": tr.probe_request_to_wire(a.request)},
                    self.policy.cfg.probe_timeout * 2,
                )
                reply = tr.probe_reply_from_wire(raw.get("reply"))
            except (TransportError, RemoteError, wire.WireError):
                return
            more = self.policy.on_probe_reply(
                d.clock.now(), reply, d.local_report(), d.queue_view()
            )
            for b in more:
                await self.action(b)
        elif isinstance(a, tr.PushTask):
            await self.push(a.task_id, a.peer)
        elif isinstance(a, tr.StealFrom):
            try:
                await d.cluster.request(
                    a.peer,
                    {"op": "steal", "req": tr.probe_request_to_wire(a.request)},
                    d.rpc_timeout,
                )
            except (TransportError, RemoteError, wire.WireError):
                return

    async def push(self, tid: m.TaskId, peer: m.NodeId) -> bool:
        """Move a queued, not started task of the local run queue to `peer`."""
        d = self.driver
        t = d.table.active.get(tid)
        if t is None or t.state is not S.QUEUED or tid in d.runner.running:
            return False
        try:
            d.runner.queue.remove(tid)
        except ValueError:
            return False
        d.io_counters["transfers_pushed"] += 1
        d.log.info("transfer.push", task=tid, to=peer)
        if t.spec.home == d.node:
            ok, _ = await d.offer_home_task(tid, peer)
            return ok
        outs = d.state.guest.request_move(tid, peer, d.clock.now())
        if not outs:
            d.runner.requeue_front(tid)
            return False
        await d.apply(outs, tid)
        return True

    async def rpc_probe(self, req: dict[str, Any], sender: m.NodeId, stream: Any) -> dict[str, Any]:
        d = self.driver
        request = tr.probe_request_from_wire(req.get("req"))
        reply = self.policy.on_probe(d.clock.now(), request, d.local_report(), d.queue_view())
        return {"reply": tr.probe_reply_to_wire(reply)}

    async def rpc_steal(self, req: dict[str, Any], sender: m.NodeId, stream: Any) -> dict[str, Any]:
        d = self.driver
        request = tr.probe_request_from_wire(req.get("req"))
        tid = self.policy.on_steal(d.clock.now(), request, d.local_report(), d.queue_view())
        if tid is None:
            return {"task": None}
        d.io_counters["transfers_stolen"] += 1
        d._spawn(self.push, tid, request.origin)
        return {"task": tid}
