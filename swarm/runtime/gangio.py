"""Gangs over the wire and into processes (issue 22): op `gang`, the rendezvous port,
the members' run lease. A part of the Driver (driver.py); node/gangs.py has the rules,
cluster/gang*.py the protocol.

Every protocol message travels as one authenticated peer request (`op: gang`) whose
answer carries nothing: the protocol answers with messages of its own, and a request
lost or refused is a message lost, which the protocol survives by design. A prepare
and a commit carry the gang's spec (the member side checks its room and starts the
members from it, as a handoff's receiver does from an offer); a commit also carries
rank 0's address, resolved here from membership at the home.
"""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .. import codec, wire
from .. import model as m
from ..cluster import gang as g
from ..cluster import gangwire
from ..logs import EventLog
from ..node import events as ev
from ..node.gangs import Commitment
from ..node.state import NodeState
from .executor import ProcessPlan
from .net import TransportError
from .peers import ClusterNode, RemoteError
from .tasks import TaskTable

if TYPE_CHECKING:
    from .runner import LocalRunner


class GangIO:
    node: m.NodeId
    state: NodeState
    cluster: ClusterNode | None
    runner: LocalRunner
    log: EventLog
    rpc_timeout: float
    table: TaskTable
    io_counters: dict[str, int]

    if TYPE_CHECKING:  # provided by Driver and Effects

        def _time(self) -> tuple[float, float]: ...
        def _next_id(self) -> str: ...
        def run_inline(self, instrs: list[ev.Instruction]) -> None: ...
        def _spawn(self, fn: Any, *args: Any) -> None: ...
        def on_finished(self, task: m.Task) -> None: ...

    # ------------------------------------------------------------------ receiving

    async def rpc_gang(self, req: dict[str, Any], sender: m.NodeId, stream: Any) -> dict[str, Any]:
        msg, commitment = gang_request_from_wire(req)
        port = reserve_port() if isinstance(msg, g.Prepare) else 0
        self._feed_gang(sender, msg, commitment, port)
        return {}

    def _feed_gang(
        self, src: m.NodeId, msg: g.Message, commitment: Commitment | None, port: int
    ) -> None:
        now, wall = self._time()
        s = ev.GangMessage(now, wall, self._next_id(), src, msg, commitment, port)
        self.run_inline(self.state.handle(s))

    def gang_submitted(self, tid: m.TaskId) -> None:
        now, wall = self._time()
        self.run_inline(self.state.handle(ev.GangSubmitted(now, wall, self._next_id(), tid)))

    def gang_cancel(self, tid: m.TaskId, why: str) -> None:
        now, wall = self._time()
        self.run_inline(self.state.handle(ev.GangCancel(now, wall, self._next_id(), tid, why)))

    # ------------------------------------------------------------------ sending

    def _send_gang(self, i: ev.SendGang) -> None:
        self.io_counters["gang_sent"] = self.io_counters.get("gang_sent", 0) + 1
        addr = self._node_addr(i.msg.master) if isinstance(i.msg, g.Commit) else ""
        if i.dest == self.node:  # our own share of the gang: no network
            c = Commitment(i.spec, i.run, addr) if i.spec is not None else None
            port = reserve_port() if isinstance(i.msg, g.Prepare) else 0
            self._feed_gang(self.node, i.msg, c, port)
            return
        req: dict[str, Any] = {"op": "gang", "msg": gangwire.to_wire(i.msg)}
        if i.spec is not None:
            req["spec"] = codec.task_spec_to_wire(i.spec)
            req["run"] = i.run
            req["master_addr"] = addr
        self._spawn(self._deliver_gang, i.dest, req)

    async def _deliver_gang(self, dest: m.NodeId, req: dict[str, Any]) -> None:
        try:
            if self.cluster is None:
                raise TransportError("no cluster")
            await self.cluster.request(dest, req, self.rpc_timeout)
        except (TransportError, RemoteError, wire.WireError) as e:
            self.io_counters["gang_failed"] = self.io_counters.get("gang_failed", 0) + 1
            self.log.debug("gang.send_failed", dest=dest, error=str(e))

    def _node_addr(self, node: m.NodeId) -> str:
        """A node's address as membership knows it (ours: the one we bound)."""
        if self.cluster is None:
            return "127.0.0.1"
        a = self.cluster.address_of(node)
        host = a[0] if a is not None else self.cluster.addr[0]
        return "127.0.0.1" if host in ("", "0.0.0.0") else host

    # ------------------------------------------------------------------ processes

    def _start_now(self, i: ev.StartNow) -> None:
        """A member starts at once; one the gate refuses fails (and so its round:
        never a member left waiting while the others run)."""
        t = self.table.active.get(i.task_id)
        if t is None or t.state is not m.TaskState.QUEUED or t.id in self.runner.running:
            return
        why = self.runner.start_now(t)
        if why is not None:
            # a wait answers this end once it is written, as any other (tasks.py)
            failed = self.table.end_now(
                t.id, m.TaskState.FAILED, f"cannot start: {why}", self._spawn
            )
            self.on_finished(failed)

    def gang_plan(self, task: m.Task, plan: ProcessPlan) -> ProcessPlan:
        """A member starts with its run lease for the supervisor (which kills it when
        the lease lapses, even while this agent is paused or down)."""
        if task.spec.member is None or self.runner.executor.shim is None:
            return plan
        until = self.state.gang_deadline(task.id)
        left = -1.0 if until is None else max(-1.0, until - trio.current_time())
        return attrs.evolve(plan, lease=time.monotonic() + left)


def gang_request_from_wire(req: Any) -> tuple[g.Message, Commitment | None]:
    """A `gang` request: the message, and what a prepare or commit carried besides;
    wire.WireError names a bad field."""
    f = wire.Fields(req, "gang", ignore=("op", "v", "from", "to"))
    msg = gangwire.from_wire(f.obj.get("msg"))
    f.nested("msg", lambda o: o)
    spec = f.nested("spec", codec.task_spec_from_wire)
    run = f.int("run", 0, lo=0, hi=1 << 31)
    addr = f.str("master_addr", "", max_len=256)
    f.done()
    if spec is not None and (spec.gang is None or spec.id != msg.gang):
        raise wire.SchemaError("gang: spec is not the gang's")
    return msg, Commitment(spec, run, addr) if spec is not None else None


def reserve_port() -> int:
    """A free TCP port for a rendezvous: bound and released at once, so another
    program may take it before rank 0 binds it (docs/gang.md says so)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])
