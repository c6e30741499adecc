"""`--at-most-once` over the wire and on disk: lease questions to a task's home, its
answers, and the deadline in the supervisor's lease file (node/fencing.py has the
rules, runtime/swarm_shim.c enforces them). A part of the Driver (driver.py).

The node's clock is trio's; the supervisor's is CLOCK_MONOTONIC (time.monotonic):
a deadline crosses from one to the other as "this many seconds from now".
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .. import model as m
from .. import wire
from ..logs import EventLog
from ..node import events as ev
from ..node.state import NodeState
from .executor import ProcessPlan
from .net import TransportError
from .peers import ClusterNode, RemoteError

if TYPE_CHECKING:
    from .runner import LocalRunner


class FencingIO:
    node: m.NodeId
    state: NodeState
    cluster: ClusterNode | None
    runner: LocalRunner
    log: EventLog
    rpc_timeout: float

    if TYPE_CHECKING:  # provided by Driver and Effects

        def _time(self) -> tuple[float, float]: ...
        def _next_id(self) -> str: ...
        def run_inline(self, instrs: list[ev.Instruction]) -> None: ...

    async def rpc_lease(self, req: dict[str, Any], sender: m.NodeId, stream: Any) -> dict[str, Any]:
        """A runner asks for the lease of a task whose home is here."""
        tid, epoch = lease_request_from_wire(req)
        now, _ = self._time()
        granted, why = self.state.on_lease_request(sender, tid, epoch, now)
        return {"granted": granted, "why": why}

    async def _ask_lease(self, i: ev.AskLease) -> None:
        granted, why = False, ""
        try:
            if self.cluster is None:
                raise TransportError("no cluster")
            req = {"op": "lease", "task": i.task_id, "epoch": i.epoch}
            raw = await self.cluster.request(i.dest, req, self.rpc_timeout)
            granted, why = lease_reply_from_wire(raw)
        except (TransportError, RemoteError, wire.WireError) as e:
            why = f"{i.dest} did not answer: {e}"
        now, wall = self._time()
        answer = ev.LeaseAnswer(
            now, wall, self._next_id(), i.task_id, i.epoch, i.asked_at, granted, why
        )
        self.run_inline(self.state.handle(answer))

    def _renew_lease(self, i: ev.RenewLease) -> None:
        self.runner.executor.renew_lease(i.task_id, _monotonic(i.until))

    def fence_plan(self, task: m.Task, plan: ProcessPlan) -> ProcessPlan:
        """A fenced task's start carries its lease for the supervisor (an unknown one
        has lapsed already: the supervisor then starts nothing)."""
        if not self.state.fenced_here(task.spec):
            return plan
        until = self.state.fence_deadline(task.id)
        return attrs.evolve(plan, lease=_monotonic(until))


def lease_request_from_wire(req: Any) -> tuple[str, int]:
    """(task id, epoch) of a `lease` request; wire.WireError names a bad field."""
    f = wire.Fields(req, "lease", ignore=("op", "v", "from", "to"))
    tid = f.task_id("task", required=True)
    epoch = f.int("epoch", required=True, lo=0)
    f.done()
    return tid, epoch


def lease_reply_from_wire(raw: Any) -> tuple[bool, str]:
    f = wire.Fields(raw, "lease reply")
    granted = f.bool("granted", False)
    why = f.str("why", "", max_len=512)
    return granted, why


def _monotonic(until: float | None) -> float:
    """A deadline on trio's clock as a time.monotonic() deadline (none, or none
    yet: one that has lapsed)."""
    left = -1.0 if until is None else max(-1.0, until - trio.current_time())
    return time.monotonic() + left
