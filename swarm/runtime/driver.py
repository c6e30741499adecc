"""The node's driver: the one async owner of the node's state machine (swarm/node/).

It feeds stimuli (a submission to place, a peer's request or reply, a membership
event, a local run that started or ended, a timer) into `NodeState` and carries out
the instructions it returns, in list order: a durable journal write is awaited before
the next instruction, so "journal the decision, then send the message" is the order of
a list. Instructions that need no await run inline, in the caller's own turn, so the
submit-to-start path (place here, admit, queue, gate, start) makes no trip through
trio's scheduler. Timers of the placement machine come back as `WakeAt` deadlines,
served by one deadline loop.

Every rule lives in swarm/node/ (and the pure layers below it); what is here is I/O:
the journal, peer RPCs, the runner, the migration side, gossip, logs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import attrs
import trio

from .. import model as m
from ..cluster import handoff as h
from ..cluster.membership import AppMessage, AppState, Event, EventKind, LoadUpdated, MemberEvent
from ..logs import EventLog
from ..node import events as ev
from ..node import recovery
from ..node.loadstate import changed_meaningfully
from ..node.restart import restore_journal
from ..node.state import NodeState, Settings
from ..policy import gpu as gpupol
from ..policy import shares as sh
from ..policy import transfer as tr
from .clock import Clock
from .effects import Effects, MoveHooks
from .failoverio import FailoverIO
from .fencingio import FencingIO
from .gangio import GangIO
from .globaltasks import GlobalTaskIO
from .groupio import GroupIO
from .handoffbatch import HandoffOutbox, serve_batch
from .journal import Journal
from .latebindio import LateIO
from .peerreads import PeerReads
from .peers import ClusterNode
from .replicabatch import ReplicaOutbox
from .replicabatch import serve_batch as serve_replica_batch
from .runner import LocalRunner
from .sampler import Sampler
from .tasks import TaskTable
from .transfers import TransferIO

S = m.TaskState
GLOBALS_KEY = recovery.GLOBALS_KEY


class Driver(Effects, FailoverIO, FencingIO, GangIO, GroupIO):
    def __init__(
        self,
        *,
        node: m.NodeId,
        table: TaskTable,
        journal: Journal,
        runner: LocalRunner,
        cluster: ClusterNode | None,
        ledger: sh.ShareLedger,
        log: EventLog,
        clock: Clock,
        settings: Settings = Settings(),
        report_interval: float = 1.0,
        rpc_timeout: float = 5.0,
        transfer_config: tr.TransferConfig | None = None,
        transfer: bool = True,
        gpu_devices: tuple[gpupol.GpuDevice, ...] = (),
        mps: bool = False,
        rng: random.Random | None = None,
        admission_hook: Callable[[m.TaskSpec], str | None] | None = None,
        moves: Callable[[Driver], MoveHooks] | None = None,
        migration_period: float = 5.0,
    ) -> None:
        self.node = node
        self.table = table
        self.clock = clock
        self.journal = journal
        self.runner = runner
        self.cluster = cluster
        self.log = log
        self.report_interval = report_interval
        self.rpc_timeout = rpc_timeout
        self.mps = mps
        self.sampler = Sampler()
        transfer_config = transfer_config or tr.TransferConfig()
        on = transfer and cluster is not None
        settings = attrs.evolve(
            settings,
            report_interval=report_interval,
            transfer_interval=transfer_config.round_interval if on else None,
            migration_period=migration_period if moves is not None else None,
        )
        self.state = NodeState(
            node,
            ledger=ledger,
            records=table.records,
            settings=settings,
            gpu_devices=gpu_devices,
            queued=runner.queue,
            running=runner.running,
            rng=rng,
            admission_hook=admission_hook,
        )
        # measured now; peak usage and Flex follow from the report loop's samples on
        self.state.sample = self.sampler.sample()
        # the migration side and the driver call each other: the driver builds it
        self.migrator: MoveHooks | None = moves(self) if moves is not None else None
        self.transfers = TransferIO(self, transfer_config)
        self.late_io = LateIO(self)
        self.outbox = HandoffOutbox(self)  # handoff requests, batched per peer
        self.replica_outbox = ReplicaOutbox(self)  # replica messages, batched per peer
        self.globals_io = GlobalTaskIO(self)
        self.reads = PeerReads(table, runner, self.copy_of)
        runner.reserved = self.state.gang_held  # slots held for gangs: not for others
        self.parent_reader = None  # the local API's (localops.py): remote parents' states
        self._nursery: trio.Nursery | None = None
        self._offer_waiters: dict[m.TaskId, tuple[trio.Event, list[tuple[bool, str]]]] = {}
        self._inflight: set[tuple[m.NodeId, h.Request]] = set()
        self._replica_inflight: set[tuple[m.NodeId, m.TaskId, str, m.NodeId | None]] = set()
        self._seq = 0  # stimuli fed to the state
        self._alive_at: float | None = None  # the journal's last heartbeat (doubt.py)
        self._wake_at = math.inf
        self._wake_kick = trio.Event()
        self._published_at = 0.0
        self._last_published: m.LoadReport | None = None
        self._publish_pending = False
        self.min_publish_gap = min(0.25, report_interval)
        self.io_counters: dict[str, int] = {
            "handoff_rpcs": 0,
            "handoff_rpc_failures": 0,
            "transfers_pushed": 0,
            "transfers_stolen": 0,
        }

    # ------------------------------------------------ the state, as others read it

    @property
    def home(self) -> h.HomeSide:
        return self.state.home

    @property
    def guest(self) -> h.GuestSide:
        return self.state.guest

    @property
    def gpus(self) -> gpupol.GpuAllocator:
        return self.state.gpus

    @property
    def view(self) -> Any:
        return self.state.view

    @property
    def tomb_at(self) -> dict[m.TaskId, float]:
        return self.state.handoffs.tomb_at

    @property
    def explains(self) -> Any:
        return self.state.explains

    @property
    def sample(self) -> Any:
        return self.state.sample

    @property
    def rng(self) -> random.Random:
        return self.state.rng

    @property
    def transfer(self) -> tr.TransferPolicy:
        return self.transfers.policy

    @property
    def counters(self) -> dict[str, int]:
        return {**self.state.counters, **self.io_counters}

    def host_facts(self, *, isolation: str, criu: bool) -> None:
        """What the start-up checks found (they are async: after construction); the
        load reports carry them."""
        self.state.isolation = isolation
        self.state.criu = criu

    def _look_for_state(self, t: m.Task) -> None:
        """Tell the state whether a task's state directory is here (a disk read, made
        when a task comes to be queued here, never inside a decision)."""
        if self.migrator is not None:
            self.state.note_state(t.id, self.migrator.holds_state(t))

    def _time(self) -> tuple[float, float]:
        return self.clock.now(), self.clock.wall()

    def _next_id(self) -> str:
        """A stimulus's id: this node and a sequence number (unique per agent run)."""
        self._seq += 1
        return f"{self.node}/{self._seq}"

    # ------------------------------------------------------------------ run

    def restore(self, kv: dict[str, Any]) -> None:
        """The state's parts from the journal's keys (node/restart.py)."""
        self._alive_at, instrs = restore_journal(self.state, kv, self.clock.wall())
        for i in instrs:
            self._do(i)  # log lines and journal deletes: nothing here awaits

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self._run(task_status)
        finally:
            # stopped: a task that ends while the agent stops (the runner's nursery
            # outlives this one) starts nothing here any more (its record is in the
            # journal; the restart does the rest). Before stop 52 its end's load
            # publication raised "Nursery is closed" (chaos agent-restart)
            self._nursery = None

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.cluster is not None:
                self.cluster.subscribe(self.on_event)
                # its peer routes are in runtime/routes.py, installed by the agent
            nursery.start_soon(self.globals_io.loop)
            nursery.start_soon(self.deps_loop)
            self.run_inline(self.state.start_timers(self.clock.now()))
            nursery.start_soon(self._wake_loop)
            # where a task's state is (checkpoints written before the restart)
            for t in list(self.table.active.values()):
                self._look_for_state(t)
            # resume what the journal says was in flight
            for tid in recovery.interrupted_offers(self.table.active, self.state.handoffs):
                self.table.change(tid, S.QUEUED, "offer interrupted by restart", node=self.node)
            # down for the grace or more: our tasks a peer may have adopted wait
            now, wall = self._time()
            self.run_inline(self.state.restarted_after(now, wall, self._alive_at))
            for t in list(self.table.active.values()):
                mine = t.spec.home == self.node and t.node == self.node and not t.spec.is_global
                if self.resume_group(t, mine):
                    continue  # a waiting task, a gang, an array, or a gang's member
                if mine and t.state is S.QUEUED and t.id not in self.state.ledger:
                    self.place_soon(t.id)
            # tasks that outlived the previous run under their supervisor (issue 19)
            self.runner.adopt_outlived()
            task_status.started()
            await trio.sleep_forever()

    async def _wake_loop(self) -> None:
        """The node's one deadline loop: handoff retries, reports, transfer rounds,
        global-task syncs and placement back-offs all come due here (node/timers.py)."""
        while True:
            with trio.move_on_at(self._wake_at):
                await self._wake_kick.wait()
            self._wake_kick = trio.Event()
            now, wall = self._time()
            if now >= self._wake_at:
                self._wake_at = math.inf
                self.run_inline(self.state.handle(ev.Wake(now, wall, self._next_id())))

    # ---------------------------------------------------------- local state

    def local_report(self) -> m.LoadReport:
        return self.state.local_report(self.clock.wall())

    def queue_view(self) -> list[tr.QueuedTask]:
        return self.state.queue_view(self.clock.now())

    def sample_now(self) -> None:
        """Measure the host, let the state follow, publish if the report changed."""
        # the one place the agent's wall clock follows the system's (an NTP step)
        moved = self.clock.resync()
        if abs(moved) >= 1.0:
            self.log.warning("clock.stepped", seconds=round(moved, 3))
        now, wall = self._time()
        self.state.handle(ev.Sampled(now, wall, self._next_id(), self.sampler.sample()))
        report = self.local_report()
        if self._last_published is None or changed_meaningfully(self._last_published, report):
            self.publish_load(report)
        self.late_io.room()
        # else: the membership core re-gossips the last report on its own refresh timer

    def publish_load(self, report: m.LoadReport | None = None) -> None:
        if self.cluster is not None:
            self._published_at = self.clock.now()
            report = report if report is not None else self.local_report()
            self._last_published = report
            self.cluster.set_local_load(report)

    def shares_changed(self) -> None:
        """This node's shares changed (drain, undrain, `swarm shares`): publish, and let
        global tasks that a cluster without shares held back start now, not at the timer."""
        self.run_inline(self.state.shares_changed())

    def load_changed(self) -> None:
        """Our queue changed: publish soon (rate-limited), so peers' views stay fresh."""
        if self._publish_pending or self._nursery is None:
            return
        self._publish_pending = True
        self._nursery.start_soon(self._publish_later)

    async def _publish_later(self) -> None:
        await trio.sleep(max(0.0, self._published_at + self.min_publish_gap - self.clock.now()))
        self._publish_pending = False
        self.publish_load()

    # ----------------------------------------------------------- placement

    def place_soon(self, tid: m.TaskId) -> None:
        """Place a queued task whose home is here; the common case (here, admitted) is
        in the run queue before this returns."""
        if self._nursery is None:
            return
        now, wall = self._time()
        self.run_inline(self.state.handle(ev.PlaceTask(now, wall, self._next_id(), tid)))

    async def explain(self, tid: m.TaskId) -> list[dict[str, Any]]:
        cached = self.state.explains.get(tid)
        if cached is not None:
            return list(cached)
        return await self.journal.events_for(tid, "decision")

    def record_explain(self, tid: m.TaskId, rec: dict[str, Any]) -> None:
        self._do(self.state.explain(tid, rec, self.clock.wall()))

    def admission_refusal(self, spec: m.TaskSpec) -> str | None:
        return self.state.admission_refusal(spec)

    # -------------------------------------------------------------- handoff

    async def offer_home_task(self, tid: m.TaskId, target: m.NodeId) -> tuple[bool, str]:
        """Offer a task whose home is here (held here) to `target`; wait for the outcome."""
        now, wall = self._time()
        why, instrs = self.state.offer(tid, target, now, wall)
        if why is not None:
            return False, why
        done = trio.Event()
        result: list[tuple[bool, str]] = []
        self._offer_waiters[tid] = (done, result)
        await self.execute(instrs)
        await done.wait()
        return result[0] if result else (False, "no outcome")

    async def apply(self, outs: list[h.Output], *task_ids: m.TaskId) -> None:
        """Apply handoff outputs: decisions first (journaled), then the sends."""
        now, wall = self._time()
        stimulus = ev.HandoffOutputs(now, wall, self._next_id(), tuple(outs), task_ids)
        await self.execute(self.state.handle(stimulus))

    async def rpc_handoff(
        self, req: dict[str, Any], sender: m.NodeId, stream: Any
    ) -> dict[str, Any]:
        r = h.request_from_wire(req.get("req"))
        now, wall = self._time()
        refusal = self.state.admission_refusal(r.spec) if isinstance(r, h.Offer) else None
        reply, instrs = self.state.on_request(sender, r, now, wall, refusal)
        await self.execute(instrs)
        return {"reply": h.reply_to_wire(reply)}

    async def rpc_handoff_batch(
        self, req: dict[str, Any], sender: m.NodeId, stream: Any
    ) -> dict[str, Any]:
        return await serve_batch(self, req, sender)

    async def rpc_replica_batch(
        self, req: dict[str, Any], sender: m.NodeId, stream: Any
    ) -> dict[str, Any]:
        """Many replica messages at once (runtime/replicabatch.py)."""
        return await serve_replica_batch(self, req, sender)

    async def cancel_remote(self, tid: m.TaskId) -> None:
        """Cancel a task whose home is here and which lives elsewhere (or is in flight)."""
        now, wall = self._time()
        await self.execute(self.state.handle(ev.CancelRemote(now, wall, self._next_id(), tid)))

    # ------------------------------------------------------- runner hooks

    def can_start(self, task: m.Task) -> str | None:
        """Why a queued local task must not start now (None: go, and its shares are taken:
        the runner starts every task this gate lets through)."""
        now, wall = self._time()
        why, instrs = self.state.can_start(task, wall, now)
        self.run_inline(instrs)
        return why

    def release_gpu(self, tid: m.TaskId) -> None:
        self.run_inline(self.state.release_gpu(tid))

    def gpu_env(self, task: m.Task) -> dict[str, str]:
        """CUDA_VISIBLE_DEVICES and friends for a task that holds a GPU allocation."""
        a = self.state.gpus.get(task.id)
        if a is None:
            return {}
        return gpupol.env_for(a, self.state.gpus.devices, self.mps)

    def on_started(self, task: m.Task) -> None:
        now, wall = self._time()
        self.state.queue_views.pop(task.id, None)
        self.run_inline(self.state.handle(ev.TaskStarted(now, wall, self._next_id(), task)))

    def on_finished(self, task: m.Task) -> None:
        """A local run ended: terminal, back to the queue (shutdown), or stopped to move."""
        if task.state in (S.QUEUED, S.MIGRATING):
            self._look_for_state(task)  # it may have written a checkpoint while it ran
        else:
            self.state.note_state(task.id, False)
        now, wall = self._time()
        self.run_inline(self.state.handle(ev.TaskEnded(now, wall, self._next_id(), task)))
        self.late_io.room()

    # ------------------------------------------------------------ membership

    def on_event(self, e: Event) -> None:
        if isinstance(e, LoadUpdated):
            if e.report.node != self.node and self._nursery is not None:
                now, wall = self._time()
                report = ev.PeerReport(now, wall, self._next_id(), e.report, e.at)
                self.run_inline(self.state.handle(report))
            elif e.report.node != self.node:
                self.state.view.upsert(e.report, e.at)
        elif isinstance(e, MemberEvent):
            node = e.member.node
            self._members_seen(e)
            if node == self.node:
                return
            if e.kind in (EventKind.DEAD, EventKind.LEFT):
                now, wall = self._time()
                self.run_inline(self.state.handle(ev.NodeDead(now, wall, self._next_id(), node)))
            elif e.kind is EventKind.JOINED:
                self._wake_jobs()
                self.globals_io.kick()
        elif isinstance(e, AppMessage) and e.key == GLOBALS_KEY:
            self.globals_io.merge(e.payload)
        elif isinstance(e, AppState):
            g = e.state.get(GLOBALS_KEY) if isinstance(e.state, dict) else None
            if g is not None:
                self.globals_io.merge(g)

    def _wake_jobs(self) -> None:
        """A peer's report or join: placements waiting on a back-off look again."""
        if self.state.jobs and self._nursery is not None:
            now, wall = self._time()
            self.run_inline(self.state.handle(ev.JobsKicked(now, wall, self._next_id())))
