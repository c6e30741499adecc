"""Late binding's I/O (policy/latebind.py decides all of it): reservations and
cancels sent to peers, a pull when this node has room, and a home's answer to a pull,
which hands the task over with the transfer push (the handoff protocol).

A held task waits in its home's run queue, so the home starts it itself if a slot
frees there first (the state then cancels the reservations). A pull is answered yes
only while the task is still queued here and not started; the handoff that follows
keeps the exactly-one-place guarantee whatever the answer's fate.

Who can do what: peer requests are authenticated (a key holder); the puller is the
authenticated sender, so a peer can pull only a task it holds a reservation for. A
key holder could pull tasks it was offered and then refuse them (they come back and
are placed again), as it could refuse a handoff today. Nothing here is a path.
"""

from __future__ import annotations

from typing import Any, Protocol

import trio

from .. import model as m
from .. import wire
from ..node.state import NodeState
from ..policy import latebind as lb
from .clock import Clock
from .net import TransportError
from .peers import ClusterNode, RemoteError
from .runner import LocalRunner
from .tasks import TaskTable
from .transfers import TransferIO

S = m.TaskState


class Driver(Protocol):
    """What late binding uses of the driver (runtime/driver.py)."""

    node: m.NodeId
    cluster: ClusterNode | None
    clock: Clock
    state: NodeState
    runner: LocalRunner
    table: TaskTable
    rpc_timeout: float
    transfers: TransferIO
    io_counters: dict[str, int]

    def local_report(self) -> m.LoadReport: ...
    def record_explain(self, tid: m.TaskId, rec: dict[str, Any]) -> None: ...
    def _spawn(self, fn: Any, *args: Any) -> None: ...


class LateIO:
    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self._wave_timer = False  # a sleeper waits for the next second wave

    @property
    def late(self) -> lb.LateBinding | None:
        return self.driver.state.late

    def send(self, msgs: tuple[Any, ...]) -> None:
        """Reservations and cancels, each its own request; nobody waits on them."""
        d = self.driver
        if d.cluster is None:
            return
        for x in msgs:
            if isinstance(x, lb.Reserve):
                d._spawn(self._tell, x.peer, lb.RESERVE, x.task_id)
            elif isinstance(x, lb.Cancel):
                d._spawn(self._tell, x.peer, lb.CANCEL, x.task_id)
        late = self.late
        if late is not None and late.next_wave() is not None and not self._wave_timer:
            self._wave_timer = True
            d._spawn(self._second_waves)

    async def _second_waves(self) -> None:
        """The peers that did not look free are reserved `stage` after the first wave,
        for tasks still held then (`LateBinding.expire`, through `room`): one sleeper
        while any second wave is pending."""
        try:
            while (late := self.late) is not None and (at := late.next_wave()) is not None:
                await trio.sleep_until(at)
                self.room()
        finally:
            self._wave_timer = False

    async def _tell(self, peer: m.NodeId, kind: str, tid: m.TaskId) -> None:
        d = self.driver
        assert d.cluster is not None
        try:
            await d.cluster.request(
                peer, {"op": "late", "req": lb.msg_to_wire(kind, tid)}, d.rpc_timeout
            )
        except (TransportError, RemoteError, wire.WireError):
            d.io_counters["late_send_failures"] = d.io_counters.get("late_send_failures", 0) + 1

    def room(self) -> None:
        """Room may have appeared here (a run ended, a reservation came, the sample
        tick): let holds that ran out go, and pull behind the oldest reservation."""
        late = self.late
        d = self.driver
        if late is None or d.cluster is None:
            return
        now = d.clock.now()
        self.send(tuple(late.expire(now)))  # its StartHere: the task is queued here already
        p = late.want_pull(now, d.local_report())
        if p is not None:
            d._spawn(self._pull, p)

    async def _pull(self, p: lb.Pull) -> None:
        d = self.driver
        assert d.cluster is not None and self.late is not None
        try:
            raw = await d.cluster.request(
                p.holder, {"op": "late", "req": lb.msg_to_wire(lb.PULL, p.task_id)}, d.rpc_timeout
            )
            granted = raw.get("granted") is True
        except (TransportError, RemoteError, wire.WireError):
            granted = False
        self.late.on_pull_answer(d.clock.now(), p.holder, p.task_id, granted)
        if not granted:
            self.room()

    def _queued_here(self, tid: m.TaskId) -> bool:
        d = self.driver
        t = d.table.active.get(tid)
        return (
            t is not None
            and t.state is S.QUEUED
            and t.spec.home == d.node
            and tid in d.runner.queue
            and tid not in d.runner.running
        )

    async def rpc(self, req: dict[str, Any], sender: m.NodeId, stream: Any) -> dict[str, Any]:
        kind, tid = lb.msg_from_wire(req.get("req"))
        d = self.driver
        late = self.late
        if late is None:
            return {"granted": False}
        now = d.clock.now()
        if kind == lb.RESERVE:
            late.on_reserve(now, sender, tid)
            self.room()
            return {}
        if kind == lb.CANCEL:
            late.on_cancel(sender, tid)
            return {}
        acts = late.on_pull(now, sender, tid)
        self.send(tuple(a for a in acts if isinstance(a, lb.Cancel)))
        if not any(isinstance(a, lb.Give) for a in acts) or not self._queued_here(tid):
            return {"granted": False}
        d.io_counters["late_pulled"] = d.io_counters.get("late_pulled", 0) + 1
        d.record_explain(tid, {"outcome": f"pulled by {sender} (late binding): it had room"})
        d._spawn(d.transfers.push, tid, sender)
        return {"granted": True}
