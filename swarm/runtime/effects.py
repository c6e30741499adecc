"""Carrying out the node's instructions (swarm/node/events.py), in list order.

The driver's half that touches the world for the state machine: the journal (a
durable write is awaited before the next instruction), the run queue, the task
records' waiters, handoff sends (one in flight per question), explain events, the
migration side's hooks, and the placement machine's deadline. What needs no await
runs inline in the caller's turn; from the first instruction that does, the rest goes
on in a task of its own, still in order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import trio

from .. import model as m
from ..cluster import handoff as h
from ..logs import EventLog
from ..node import events as ev
from .globaltasks import GlobalTaskIO
from .journal import DelKV, DelTask, Journal, PutKV, PutTask
from .journal import Event as JEvent
from .latebindio import LateIO
from .runner import LocalRunner
from .tasks import TaskTable
from .transfers import TransferIO

if TYPE_CHECKING:
    from ..node.state import NodeState


class MoveHooks(Protocol):
    """What the driver asks of the migration side (runtime/moving.Migrator), named
    here so the two modules do not import each other."""

    def holds_state(self, t: m.Task) -> bool: ...
    def on_started(self, task: m.Task) -> None: ...
    def on_stopped(self, task: m.Task) -> None: ...
    def on_ended(self, task: m.Task) -> None: ...
    def on_left(self, tid: m.TaskId) -> None: ...
    def round_due(self) -> None: ...
    async def cancel(self, tid: m.TaskId, cause: str) -> None: ...


class Effects:
    """The instruction executor of Driver (driver.py), which holds the fields below."""

    node: m.NodeId
    table: TaskTable
    journal: Journal
    runner: LocalRunner
    log: EventLog
    migrator: MoveHooks | None
    io_counters: dict[str, int]
    _nursery: trio.Nursery | None
    _inflight: set[tuple[m.NodeId, h.Request]]
    _offer_waiters: dict[m.TaskId, tuple[trio.Event, list[tuple[bool, str]]]]
    _wake_at: float
    _wake_kick: trio.Event
    transfers: TransferIO
    late_io: LateIO
    globals_io: GlobalTaskIO

    if TYPE_CHECKING:  # provided by Driver
        outbox: Any  # handoffbatch.HandoffOutbox

        async def _send_notices(self, i: ev.SendNotices) -> None: ...
        def _send_replica(self, i: ev.SendReplica) -> None: ...
        async def _ask_lease(self, i: ev.AskLease) -> None: ...
        def _renew_lease(self, i: ev.RenewLease) -> None: ...
        def _send_gang(self, i: ev.SendGang) -> None: ...
        def _start_now(self, i: ev.StartNow) -> None: ...
        def sample_now(self) -> None: ...
        def publish_load(self, report: m.LoadReport | None = None) -> None: ...
        def load_changed(self) -> None: ...

        state: NodeState

        def place_soon(self, tid: m.TaskId) -> None: ...
        def _time(self) -> tuple[float, float]: ...
        def _next_id(self) -> str: ...

    def run_inline(self, instrs: list[ev.Instruction]) -> None:
        """Carry out what needs no await now, in the caller's turn; from the first
        instruction that does, the rest goes on in a task of its own, in order."""
        for n, i in enumerate(instrs):
            if ev.blocks(i):
                self._spawn(self.execute, instrs[n:])
                return
            self._do(i)

    def place_many(self, tids: tuple[m.TaskId, ...]) -> None:
        """Place many tasks at once (an array's chunk), each decided as place_soon does;
        the work each placement defers (its offer: journal writes, then the send) is
        carried out together, in one task with one journal commit (issue 23: a task and
        a commit per element were ~5 % of the home's loop in a burst)."""
        if self._nursery is None:
            return
        now, wall = self._time()
        stimuli = [ev.PlaceTask(now, wall, self._next_id(), tid) for tid in tids]
        instrs = self.state.handle(*stimuli)
        later = [x for i in instrs if isinstance(i, ev.Later) for x in i.instructions]
        self.run_inline([i for i in instrs if not isinstance(i, ev.Later)])
        if later:
            self._spawn(self.execute_batch, later)

    async def execute(self, instrs: list[ev.Instruction]) -> None:
        for i in instrs:
            if ev.blocks(i):
                await self._do_blocking(i)
            else:
                self._do(i)

    async def execute_batch(self, instrs: list[ev.Instruction]) -> None:
        """Many stimuli's instructions at once (a batch of handoff requests or replies):
        every journal write among them in one commit, awaited if any must be durable,
        then the rest in order. Writes keep their order among themselves; what else
        they preceded only comes later, which never breaks "journal, then send"."""
        ops: list[Any] = []
        durable = False
        lazy = True  # every write among them may wait for the next commit
        woken: list[m.TaskId] = []
        rest: list[ev.Instruction] = []
        for i in instrs:
            written = _ops_of(i, self.node)
            if written is None:
                rest.append(i)
                continue
            ops += written
            if isinstance(i, ev.Record):
                self.table.noted(i.task)
                woken.append(i.task.id)
            elif isinstance(i, ev.Forget):
                woken.append(i.task_id)
            durable = durable or (isinstance(i, (ev.Record, ev.Persist)) and i.durable)
            lazy = lazy and isinstance(i, ev.Persist) and i.lazy
        if durable:
            # the ends among them are answered to waits once on disk (tasks.py)
            ends = [i.task.id for i in instrs if isinstance(i, ev.Record) and i.task.state.terminal]
            with self.table.writing(ends):
                await self.journal.commit(ops, must_land=True)
        elif ops and lazy:
            self.journal.enqueue_lazy(ops)
        elif ops:
            self.journal.enqueue(ops)
        for tid in woken:
            self.table.wake(tid)
        await self.execute(rest)

    async def _do_blocking(self, i: ev.Instruction) -> None:
        if isinstance(i, ev.Record):
            self.table.noted(i.task)
            with self.table.writing([i.task.id] if i.task.state.terminal else []):
                await self.journal.commit([PutTask(i.task)], must_land=True)
            self.table.wake(i.task.id)
        elif isinstance(i, ev.Persist):
            await self.journal.commit(kv_ops(i.ops), must_land=True)
        elif isinstance(i, ev.StopRun):
            if i.reason is None:
                await self.runner.cancel(i.task_id)
            else:
                await self.runner.cancel(i.task_id, reason=i.reason)
        elif isinstance(i, ev.StopMove) and self.migrator is not None:
            await self.migrator.cancel(i.task_id, i.cause)

    def _do(self, i: ev.Instruction) -> None:
        if isinstance(i, ev.Record):
            self.table.noted(i.task)
            self.journal.enqueue([PutTask(i.task)])
            self.table.wake(i.task.id)
        elif isinstance(i, ev.Persist) and i.lazy:
            self.journal.enqueue_lazy(kv_ops(i.ops))
        elif isinstance(i, (ev.Persist, ev.Explain)):
            self.journal.enqueue(_ops_of(i, self.node) or [])
        elif isinstance(i, ev.Enqueue):
            if i.front:
                self.runner.requeue_front(i.task_id)
            else:
                self.runner.enqueue(i.task_id)
        elif isinstance(i, ev.Preempt):
            if self._nursery is not None:
                self._nursery.start_soon(self.runner.preempt, i.task_id, i.cause, i.checkpoint)
        elif isinstance(i, ev.Requeue):
            self.runner.requeue_front(i.task_id)
        elif isinstance(i, ev.Dequeue):
            try:
                self.runner.queue.remove(i.task_id)
            except ValueError:
                pass
        elif isinstance(i, ev.SendHandoff):
            key = (i.send.dest, i.send.request)
            if key in self._inflight:
                # the same question is still on its way: a retry now would only add load
                self.io_counters["handoff_dedup"] = self.io_counters.get("handoff_dedup", 0) + 1
                return
            self._inflight.add(key)
            self.outbox.put(i.send)
        elif isinstance(i, ev.LoadChanged):
            self.load_changed()
        elif isinstance(i, ev.Place):
            self.place_soon(i.task_id)
        elif isinstance(i, ev.PlaceMany):
            self.place_many(i.task_ids)
        elif isinstance(i, ev.OfferOutcome):
            w = self._offer_waiters.pop(i.task_id, None)
            if w is not None:
                w[1].append((i.ok, i.reason))
                w[0].set()
        elif isinstance(i, ev.MoveHook):
            self._move_hook(i)
        elif isinstance(i, ev.Forget):
            self.journal.enqueue([DelTask(i.task_id)])
            self.table.wake(i.task_id)
        elif isinstance(i, ev.WakeAt):
            if i.at < self._wake_at:
                self._wake_at = i.at
                self._wake_kick.set()
        elif isinstance(i, ev.Log):
            getattr(self.log, i.level)(i.event, **dict(i.fields))
        elif isinstance(i, ev.Sample):
            self.sample_now()
        elif isinstance(i, ev.PublishLoad):
            self.publish_load()
        elif isinstance(i, ev.TransferRound):
            self.transfers.round()
        elif isinstance(i, ev.MigrationRound):
            if self.migrator is not None:
                self.migrator.round_due()
        elif isinstance(i, ev.SyncGlobals):
            self.globals_io.kick()
        elif isinstance(i, ev.KickRunner):
            self.runner.kick()
        elif isinstance(i, ev.SendNotices):
            self._spawn(self._send_notices, i)
        elif isinstance(i, ev.SendReplica):
            self._send_replica(i)
        elif isinstance(i, ev.AskLease):
            # the runner's first dispatch may come before the driver runs: the next
            # tick asks again (fencing.fence_tick)
            if self._nursery is not None:
                self._spawn(self._ask_lease, i)
        elif isinstance(i, ev.RenewLease):
            self._renew_lease(i)
        elif isinstance(i, ev.SendGang):
            self._send_gang(i)
        elif isinstance(i, ev.StartNow):
            self._start_now(i)
        elif isinstance(i, ev.SendLate):
            self.late_io.send(i.msgs)
        elif isinstance(i, ev.Later):
            self._spawn(self.execute, list(i.instructions))

    def _move_hook(self, i: ev.MoveHook) -> None:
        mig = self.migrator
        if mig is None:
            return
        if i.what == "left":
            mig.on_left(i.task_id)
        elif i.task is not None:
            {"started": mig.on_started, "stopped": mig.on_stopped, "ended": mig.on_ended}[i.what](
                i.task
            )

    def _spawn(self, fn: Any, *args: Any) -> None:
        if self._nursery is not None:  # None: the driver stopped (the agent is stopping)
            self._nursery.start_soon(fn, *args)


def _ops_of(i: ev.Instruction, node: m.NodeId) -> list[Any] | None:
    """The journal writes an instruction is made of (None: it writes nothing)."""
    if isinstance(i, ev.Record):
        return [PutTask(i.task)]
    if isinstance(i, ev.Persist):
        return list(kv_ops(i.ops))
    if isinstance(i, ev.Explain):
        return [JEvent(i.record["at"], "decision", i.task_id, node, i.record)]
    if isinstance(i, ev.Forget):
        return [DelTask(i.task_id)]
    return None


def kv_ops(ops: tuple[ev.Put | ev.Delete, ...]) -> list[PutKV | DelKV]:
    """The journal operations of the state's key-value writes."""
    return [PutKV(o.key, o.value) if isinstance(o, ev.Put) else DelKV(o.key) for o in ops]
