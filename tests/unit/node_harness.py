"""A fake runtime for NodeState: carries out instructions in memory, and a fake
network that delivers handoff requests between several NodeStates.

What a real driver does with I/O (journal, processes, RPCs) is reduced to lists and
dicts, so a test states an incident as a list of stimuli and reads the outcome.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from swarm import model as m
from swarm.cluster import handoff as h
from swarm.node import events as ev
from swarm.node.state import NodeState, Settings
from swarm.policy import gpu as gpupol
from swarm.policy import shares as sh

S = m.TaskState


class FakeNode:
    def __init__(
        self,
        name: str,
        shares: int = 1024,
        gpu_devices: tuple[gpupol.GpuDevice, ...] = (),
        breaks: tuple[str, ...] = (),
        settings: Settings | None = None,
    ) -> None:
        self.name = name
        self.queue: deque[m.TaskId] = deque()
        self.running: set[m.TaskId] = set()
        self.ledger = sh.ShareLedger(shares)
        self.state = NodeState(
            name,
            ledger=self.ledger,
            settings=settings or Settings(breaks=frozenset(breaks)),
            gpu_devices=gpu_devices,
            queued=self.queue,
            running=self.running,
        )
        self.kv: dict[str, Any] = {}
        self.outbox: deque[h.Send] = deque()
        self.placements: list[m.TaskId] = []
        self.outcomes: list[tuple[m.TaskId, bool, str]] = []
        self.finals: dict[m.TaskId, int] = {}  # terminal records journaled, per task
        self.stopped: list[m.TaskId] = []
        self.preempted: list[ev.Preempt] = []
        self.logs: list[str] = []
        self.retry_failed_offers = False
        self.notices_out: list[ev.SendNotices] = []
        self.replica_out: list[ev.SendReplica] = []
        self.forgotten: list[m.TaskId] = []
        self.asks: list[ev.AskLease] = []
        self.renewals: list[ev.RenewLease] = []

    # ------------------------------------------------------------ driver

    def run(self, instrs: list[ev.Instruction]) -> None:
        for i in instrs:
            if isinstance(i, ev.Record):
                if i.task.state.terminal:
                    self.finals[i.task.id] = self.finals.get(i.task.id, 0) + 1
            elif isinstance(i, ev.Persist):
                for op in i.ops:
                    if isinstance(op, ev.Put):
                        self.kv[op.key] = op.value
                    else:
                        self.kv.pop(op.key, None)
            elif isinstance(i, ev.Enqueue):
                if i.front:
                    self.queue.appendleft(i.task_id)
                else:
                    self.queue.append(i.task_id)
            elif isinstance(i, ev.Requeue):
                self.queue.appendleft(i.task_id)
            elif isinstance(i, ev.Dequeue):
                if i.task_id in self.queue:
                    self.queue.remove(i.task_id)
            elif isinstance(i, ev.StopRun):
                self.stopped.append(i.task_id)
            elif isinstance(i, ev.Preempt):
                self.preempted.append(i)
            elif isinstance(i, ev.SendHandoff):
                self.outbox.append(i.send)
            elif isinstance(i, ev.Place):
                self.placements.append(i.task_id)
            elif isinstance(i, ev.PlaceMany):
                self.placements.extend(i.task_ids)
            elif isinstance(i, ev.OfferOutcome):
                self.outcomes.append((i.task_id, i.ok, i.reason))
                if not i.ok and self.retry_failed_offers:
                    self.placements.append(i.task_id)  # the waiting placement retries
            elif isinstance(i, ev.Log):
                self.logs.append(i.event)
            elif isinstance(i, ev.SendNotices):
                self.notices_out.append(i)
            elif isinstance(i, ev.SendReplica):
                self.replica_out.append(i)
            elif isinstance(i, ev.Forget):
                self.forgotten.append(i.task_id)
            elif isinstance(i, ev.AskLease):
                self.asks.append(i)
            elif isinstance(i, ev.RenewLease):
                self.renewals.append(i)
            elif isinstance(i, ev.Later):
                self.run(list(i.instructions))

    # ------------------------------------------------------- what a runner does

    def submit(self, spec: m.TaskSpec, wall: float = 0.0) -> m.TaskSpec:
        spec = m.TaskSpec(**{**_fields(spec), "home": self.name})
        self.state.records.store(m.new_task(spec, wall, self.name))
        return spec

    def run_here(self, tid: m.TaskId, now: float = 0.0) -> None:
        t = self.state.records.active[tid]
        self.run(self.state.enqueue_local(t, now))

    def try_start(self, tid: m.TaskId, now: float = 0.0, wall: float = 0.0) -> str | None:
        """The runner's dispatch of one queued task: gate, then start."""
        t = self.state.records.active[tid]
        why, instrs = self.state.can_start(t, None, now)
        self.run(instrs)
        if why is not None:
            return why
        self.queue.remove(tid)
        self.running.add(tid)
        started = self.state.records.apply(tid, S.RUNNING, wall, "started", node=self.name)
        self.run(self.state.on_started(started, now, wall))
        return None

    def finish(self, tid: m.TaskId, code: int = 0, now: float = 0.0, wall: float = 0.0) -> None:
        self.running.discard(tid)
        dst = S.SUCCEEDED if code == 0 else S.FAILED
        done = self.state.records.apply(tid, dst, wall, f"exit {code}", exit_code=code)
        self.run([ev.Record(done, durable=True)])
        self.run(self.state.on_ended(done, now, wall))


def gossip(*nodes: FakeNode, at: float = 0.0) -> None:
    """Every node learns every other node's current report."""
    for n in nodes:
        for other in nodes:
            if other is not n:
                n.state.view.upsert(other.state.local_report(at), at)


def busy(node: FakeNode, count: int) -> None:
    """`count` tasks queued at `node` (its load rises by as many)."""
    for i in range(count):
        spec = node.submit(m.TaskSpec(id=f"{node.name}-busy{i}", argv=("x",)))
        node.run_here(spec.id)


def _fields(spec: m.TaskSpec) -> dict[str, Any]:
    import attrs

    return attrs.asdict(spec, recurse=False)


class FakeNet:
    """Delivers each node's handoff sends to their destination, one at a time."""

    def __init__(self, *nodes: FakeNode) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.dead: set[str] = set()

    def pending(self) -> list[tuple[str, h.Send]]:
        return [(n.name, s) for n in self.nodes.values() for s in n.outbox]

    def deliver(self, src: str, lose: bool = False, now: float = 0.0, wall: float = 0.0) -> bool:
        """Deliver the oldest send of `src` (lost, or to a dead node: no reply)."""
        node = self.nodes[src]
        if not node.outbox or src in self.dead:
            return False
        s = node.outbox.popleft()
        reply: h.Reply | None = None
        if not lose and s.dest not in self.dead and s.dest in self.nodes:
            dest = self.nodes[s.dest]
            # as the driver does: an offer is admitted on the target's fresh state
            r = s.request
            refusal = dest.state.admission_refusal(r.spec) if isinstance(r, h.Offer) else None
            reply, instrs = dest.state.on_request(src, r, now, wall, refusal=refusal)
            dest.run(instrs)
        node.run(node.state.on_reply(s.dest, s.request, reply, now, wall))
        return True

    def settle(self, now: float = 0.0, wall: float = 0.0, limit: int = 200) -> None:
        """Deliver everything (and what that causes) until quiet."""
        for _ in range(limit):
            moved = False
            for name in list(self.nodes):
                while self.deliver(name, now=now, wall=wall):
                    moved = True
            if not moved:
                return

    def kill(self, name: str, now: float = 0.0, wall: float = 0.0) -> None:
        """A node is gone for good: every other node's membership declares it dead."""
        self.dead.add(name)
        for other in self.nodes.values():
            if other.name not in self.dead:
                other.run(other.state.on_node_dead(name, now, wall))
