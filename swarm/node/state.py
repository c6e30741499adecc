"""NodeState: the node's own state and the rules that change it, without I/O.

It holds the task records, both handoff sides (with their tombstones), the share
ledger, the GPU allocations, the load view and the bookkeeping of placements waiting
on offers. `handle(*stimuli)` applies each stimulus and returns the instructions
(events.py) that the runtime carries out in order. Rules that used to live in async
code are here, e.g. "the holder died while the task ran with --no-retry: LOST", and
"an offer failed and no placement waits for it: place the task again".

The run queue and the running set still belong to the runtime's runner; the state
reads them through the two live collections it is given (`queued`, `running`).
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Collection
from typing import Any

import attrs

from .. import model as m
from ..cluster import gang as gangp
from ..cluster import handoff as h
from ..cluster.succession import Succession
from ..policy import fairness as fair
from ..policy import gpu as gpupol
from ..policy import load as loadpol
from ..policy import shares as sh
from ..policy import transfer as tr
from ..policy.charges import Charges
from ..policy.hedge import HedgeConfig
from ..policy.latebind import LateBinding, LateConfig
from ..policy.sharing import Sharing
from ..policy.view import LoadView, charged
from . import events as ev
from . import gate
from .arrays import Arrays
from .backups import Backups
from .copyasks import CopyAsks
from .depends import Depends
from .doubt import RestartDoubt
from .failover import Failover
from .fencing import FENCE_TTL, Fencing, RunnerLease
from .gangs import Gangs
from .loadstate import LoadState, unmeasured
from .location import Location, end_report
from .placing import Job, Placing
from .records import TaskRecords
from .recovery import Handoffs
from .replicas import Held, Replicas
from .runqueue import RunQueue
from .shares import ShareChanges
from .timers import Timers
from .topup import CopiesTopUp

S = m.TaskState


@attrs.frozen
class Settings:
    """How this node decides (the agent's options that the decisions read)."""

    placement_d: int = 2
    placement_rule: str = "two-choice"
    gpu_policy: str = "binpack"
    psi_target: float = 50.0
    slots: int = 1
    default_shares: int = 1024  # the configured shares: an undrain's default
    report_interval: float = 1.0
    transfer_interval: float | None = None  # None: no work transfer
    migration_period: float | None = None  # None: no migration side
    breaks: frozenset[str] = frozenset()  # TEST-ONLY chaos switches (testbreak.py)
    sharing: Sharing = attrs.field(factory=Sharing)  # priorities, groups, quotas, fair share
    # issue 21: where tasks may run
    report_max_age: float | None = None  # older peer reports are not placement candidates
    data_delay: float = 3.0  # delay scheduling: a data task waits this long for a holder
    labels: tuple[tuple[str, str], ...] = ()  # this node's labels (static + discovered)
    data_digest: bytes = b""  # Bloom digest of the data keys held here
    # issue 19: a task held here is adopted once its home has been SWIM-dead this long
    home_grace: float = 30.0
    replicas: int | None = None  # copies of a queued task's record (None: by cluster size)
    fence_ttl: float = FENCE_TTL  # --at-most-once: the runner's lease (fencing.py)
    gang_timers: gangp.Timers = attrs.field(
        factory=gangp.Timers
    )  # issue 22: holds, run leases (gangs.py)
    late: LateConfig | None = None  # issue 24: late binding (None: off; placing.py)
    hedge: HedgeConfig | None = None  # issue 24: backups of late --idempotent runs (backups.py)


class NodeState(
    Location,
    Failover,
    Fencing,
    Gangs,
    Arrays,
    Backups,
    Depends,
    Replicas,
    CopyAsks,
    CopiesTopUp,
    RestartDoubt,
    LoadState,
    Placing,
    Timers,
    RunQueue,
):
    def __init__(
        self,
        node: m.NodeId,
        *,
        ledger: sh.ShareLedger,
        records: TaskRecords | None = None,
        settings: Settings = Settings(),
        gpu_devices: tuple[gpupol.GpuDevice, ...] = (),
        queued: Collection[m.TaskId] = (),
        running: Collection[m.TaskId] = (),
        rng: random.Random | None = None,
        admission_hook: Callable[[m.TaskSpec], str | None] | None = None,
        isolation: str = "none",
        criu: bool = False,
        wall: float = 0.0,
    ) -> None:
        self.node = node
        self.records = records if records is not None else TaskRecords()
        self.ledger = ledger
        self.handoffs = Handoffs(node)
        self.succession = Succession(node, settings.home_grace, settings.replicas)
        self.adopted: dict[m.TaskId, tuple[m.NodeId, int]] = {}  # failover.py
        self.failover_at = 0.0
        self.prune_at = 0.0  # finished replica copies: next look (replicas.py)
        self.replicas_wanted = settings.replicas
        self.mine: dict[m.TaskId, tuple[m.NodeId, ...]] = {}  # replicas.py
        self.sent: dict[tuple[m.TaskId, m.NodeId], tuple[str, m.NodeId | None]] = {}
        self.strays: dict[m.TaskId, frozenset[m.NodeId]] = {}  # replicas.py
        self.copies_owed: set[m.TaskId] = set()  # replicas.py: to look at next tick
        self.copying: set[m.TaskId] = set()  # replicas.py: a submission's copies asked
        self.copies_ticks = 0  # replicas.py: failover ticks, for the periodic sweep
        self.ended_unheld: dict[m.TaskId, float] = {}  # replicas.py
        self.held: dict[m.TaskId, Held] = {}
        self.copies_to_ask: dict[m.TaskId, int] = {}  # copyasks.py
        self.homes_back: set[m.NodeId] = set()  # copyasks.py
        self.topup_due = True  # topup.py: a restart looks once a member is alive
        self.copies_seen_at: dict[m.TaskId, float] = {}  # copyasks.py
        self.recheck_at = 0.0  # copyasks.py: the next look for copies long unheard of
        self.alive_written = 0.0  # doubt.py: the last heartbeat (wall)
        self.doubt_until = 0.0  # doubt.py: a restart's doubt ends (trio time)
        self.doubted: set[m.TaskId] = set()  # doubt.py
        self.deferred: set[m.TaskId] = set()  # doubt.py: placements waiting for it
        self.heard: set[m.NodeId] = set()
        self.fence_ttl = settings.fence_ttl
        self.init_gangs(settings.gang_timers)
        self.init_arrays()
        self.init_backups(settings.hedge)
        self.init_depends()
        self.fence_leases: dict[m.TaskId, RunnerLease] = {}
        self.fence_granted: dict[m.TaskId, float] = {}  # home side: last grant (our now)
        self.fence_since: float | None = None  # our first tick (fencing.fence_hold)
        self.peer_since: float | None = None
        self.gpus = gpupol.GpuAllocator(gpu_devices)
        self.gpu_policy = settings.gpu_policy
        self.view = LoadView()
        self.charges = Charges()  # offers the view counts on top of peers' reports
        self.globals = sh.GlobalTasks()
        self.queued = queued
        self.running = running
        self.breaks = settings.breaks
        self.rng = rng if rng is not None else random.Random()
        self.d = settings.placement_d
        self.late = LateBinding(node, settings.late) if settings.late is not None else None
        self.placement_rule = settings.placement_rule
        self.slots = settings.slots
        self.report_max_age = settings.report_max_age
        self.data_delay = settings.data_delay
        self.labels = settings.labels
        self.label_map = dict(settings.labels)
        self.data_digest = settings.data_digest
        self.share_changes = ShareChanges(ledger, settings.default_shares)
        self.report_interval = settings.report_interval
        self.transfer_interval = settings.transfer_interval
        self.migration_period = settings.migration_period
        self.due: dict[str, float] = {}  # next run of each periodic mechanism (timers.py)
        # why a task may not run on this node at all (its user does not exist here,
        # root tasks are off): the runtime knows the host's users
        self.admission_hook = admission_hook
        self.state_here: set[m.TaskId] = set()  # queued tasks whose state dir is here
        self.isolation = isolation
        self.criu = criu
        self.sample: loadpol.HostSample = unmeasured()
        self.flex_cfg = loadpol.FlexConfig(
            psi_cpu_target=settings.psi_target, psi_mem_target=settings.psi_target
        )
        self.flex = loadpol.FlexState.initial(self.flex_cfg)
        self.peak = loadpol.PeakEstimator()
        self.version = int(wall * 1000)
        self.queue_views: dict[m.TaskId, tuple[m.Task, tr.QueuedTask]] = {}  # loadstate
        self.jobs: dict[m.TaskId, Job] = {}
        self.explains: OrderedDict[m.TaskId, list[dict[str, Any]]] = OrderedDict()
        self.pending_cancel: set[m.TaskId] = set()  # cancel once the offer is decided
        self.awaiting_offer: set[m.TaskId] = set()  # someone waits for the offer's outcome
        self.decided: list[tuple[m.TaskId, bool, str]] = []  # offers decided, for jobs
        self.depth = 0  # nesting of apply(): decided offers go on after the outermost
        self.arrived: dict[m.TaskId, float] = {}  # when a queued task arrived (trio time)
        self.sharing = settings.sharing
        self.used: dict[str, fair.Decayed] = {}
        self.used_at = 0.0
        self.preempted_at: deque[float] = deque()
        self.preempting: dict[m.TaskId, m.TaskId] = {}
        self.share_cache: tuple[float, dict[str, Any]] | None = None
        self.work_cache: tuple[float, dict[str, float | int]] | None = None
        self.quota_epoch = 0
        self.quota_memo: dict[str, tuple[int, str]] = {}
        self.demand_log: dict[str, deque[tuple[float, int]]] = {}
        self.counters: dict[str, int] = {
            "placements": 0,
            "placed_local": 0,
            "placed_remote": 0,
            "offers_refused": 0,
            "offers_failed": 0,
            "requeued_dead": 0,
            "lost": 0,
            "preempted": 0,
            "late_held": 0,  # placed by late binding: held here, reservations out
            "backups": 0,  # backup copies started (backups.py)
            "backups_won": 0,  # ... that finished first: the original was stopped
            "backups_lost": 0,  # ... stopped because the original ended first
        }

    # ------------------------------------------------------------- stimuli

    def handle(self, *stimuli: ev.Event) -> list[ev.Instruction]:
        """Apply each stimulus in turn; the instructions of all of them, in order.
        (Questions that need an answer now, not instructions, are methods: the start
        gate `can_start`, a peer's request `on_request`, an offer's `offer`.)"""
        out: list[ev.Instruction] = []
        for s in stimuli:
            now, wall = s.now, s.wall
            if isinstance(s, ev.PlaceTask):
                out += self.place(s.task_id, now, wall)
            elif isinstance(s, ev.HandoffReply):
                out += self.on_reply(s.dest, s.request, s.reply, now, wall)
            elif isinstance(s, ev.HandoffOutputs):
                out += self.apply(s.outputs, s.task_ids, now, wall)
            elif isinstance(s, ev.TaskStarted):
                out += self.on_started(s.task, now, wall)
            elif isinstance(s, ev.TaskEnded):
                out += self.on_ended(s.task, now, wall)
            elif isinstance(s, ev.Wake):
                out += self.wake_all(now, wall)
            elif isinstance(s, ev.JobsKicked):
                out += self.wake(now, wall)
            elif isinstance(s, ev.PeerReport):
                out += self.on_peer_report(s.report, s.at, now, wall)
            elif isinstance(s, ev.NodeDead):
                out += self.on_node_dead(s.node, now, wall)
            elif isinstance(s, ev.MembersSeen):
                self.members_seen(s.states, now)
            elif isinstance(s, ev.NoticesUndelivered):
                self.notices_undelivered(s.notices)
            elif isinstance(s, ev.CancelRemote):
                out += self.cancel_remote(s.task_id, now, wall)
            elif isinstance(s, ev.LeaseAnswer):
                out += self.on_lease_answer(s.task_id, s.epoch, s.asked_at, s.granted, s.why, now)
            elif isinstance(s, ev.Sampled):
                self.on_sample(s.sample, now)
            elif isinstance(s, ev.GangMessage):
                out += self.on_gang_message(s.src, s.msg, now, wall, s.commitment, s.port)
            elif isinstance(s, ev.GangSubmitted):
                out += self.gang_submitted(s.task_id, now, wall)
            elif isinstance(s, ev.GangCancel):
                out += self.gang_cancel(s.task_id, s.why, now, wall)
            elif isinstance(s, ev.ArraySubmitted):
                out += self.array_submitted(s.task_id, now, wall)
            elif isinstance(s, ev.DepsSubmitted):
                out += self.deps_submitted(s.task_id, now, wall)
            elif isinstance(s, ev.ParentsSeen):
                out += self.parents_seen(dict(s.states), now, wall)
        return out

    # ------------------------------------------------------------ helpers

    def count_in_view(self, node: m.NodeId, spec: m.TaskSpec, now: float) -> None:
        """We offered (or just handed) `spec` to `node`: until a report of its made after
        it took the task arrives, count it in our (stale) view of that node, so that our
        next placements do not pile onto a node whose report predates the work we sent
        it (policy/charges.py). Charged once per task, at its offer."""
        entry = self.view.get(node)
        if entry is None or not self.charges.add(node, spec.id, spec.weight, now):
            return
        self.view.put(node, charged(entry, spec.weight))

    def can_start(
        self, task: m.Task, wall: float | None = None, now: float | None = None
    ) -> tuple[str | None, list[ev.Instruction]]:
        if task.spec.group and (why := self.quota_refusal(task.spec, wall)) is not None:
            return why, []
        if task.spec.at_most_once:  # no clock given: no lease is ever fresh enough
            why, asks = self.fence_gate(task, now if now is not None else -math.inf)
            if why is not None:
                return why, asks
        return gate.can_start(
            task, self.node, self.guest, self.ledger, self.gpus, self.gpu_policy, self.breaks
        )

    def release_gpu(self, tid: m.TaskId) -> list[ev.Instruction]:
        return gate.release_gpu(tid, self.gpus)

    # ------------------------------------------------------- local runs

    def on_started(self, task: m.Task, now: float, wall: float) -> list[ev.Instruction]:
        if not self.used_at:  # the first start: usage counts from here
            self.accrue(wall)  # (after it, accrue counts a task from its started_at)
        self.quota_epoch += 1
        self.capped_changed(task.spec)
        out: list[ev.Instruction] = []
        lt = self.ledger.get(task.id)
        if lt is not None and not lt.running:  # normally taken by the gate already
            try:
                self.ledger.start(task.id)
            except sh.LedgerError as e:
                out.append(ev.log("warning", "ledger.start", task=task.id, error=str(e)))
        self.arrived.pop(task.id, None)
        out.append(ev.MoveHook("started", task.id, task))
        if self.late is not None:
            self.late.arrived(task.id)  # a task this node pulled has come
            cancels = self.late.forget(task.id)  # one held here starts here
            if cancels:
                rec = {"outcome": "started here before a reserved peer pulled it (late binding)"}
                out += [self.explain(task.id, rec, wall), ev.SendLate(tuple(cancels))]
        if task.spec.home != self.node and not task.spec.is_global:
            # The "running" report waits for the first retry tick (~0.5 s): a short task's
            # final report makes it unnecessary, which saves an RPC per short task.
            outs = [
                o
                for o in self.guest.started(task.id, now)
                if not (isinstance(o, h.Send) and isinstance(o.request, h.Report))
            ]
            out.append(ev.Later(tuple(self.apply(outs, [task.id], now, wall))))
        return out

    def on_ended(self, task: m.Task, now: float, wall: float) -> list[ev.Instruction]:
        """A local run ended: terminal, back to the queue (shutdown, preempted), or
        stopped to move."""
        self.accrue(wall)
        self.quota_epoch += 1
        self.capped_changed(task.spec)
        self.preempt_ended(task.id)
        if task.state is S.MIGRATING:
            lt = self.ledger.get(task.id)
            if lt is not None and lt.running:
                self.ledger.stop(task.id)  # stays here (queued weight) until it has moved
            self.guest.requeued(task.id)
            return [ev.MoveHook("stopped", task.id, task)]
        if task.state is S.QUEUED:
            lt = self.ledger.get(task.id)
            if lt is not None and lt.running:
                self.ledger.stop(task.id)
            self.guest.requeued(task.id)
            return []
        self.ledger.remove(task.id)
        out = self.release_gpu(task.id)
        out += [ev.LoadChanged(), ev.MoveHook("ended", task.id, task)]
        out += self.gang_member_ended(task, now, wall)
        out += self.array_element_ended(task, now, wall)
        out += self.replica_update(task.id)  # ended at its home: its copies go at once
        if (
            task.state is S.SUCCEEDED
            and task.spec.home == self.node
            and task.started_at is not None
        ):
            self.hedge_ran(task, (task.finished_at or wall) - task.started_at)
        self.fence_leases.pop(task.id, None)
        if task.spec.home != self.node and not task.spec.is_global:
            outs = self.guest.finished(end_report(task, wall), now)
            out.append(ev.Later(tuple(self.apply(outs, [task.id], now, wall))))
        return out

    # ------------------------------------------------------ home requests

    def cancel_remote(self, tid: m.TaskId, now: float, wall: float) -> list[ev.Instruction]:
        """Cancel a task whose home is here and which lives elsewhere (or is in flight):
        while its offer is out, the cancel waits for the outcome."""
        if tid not in self.records.active:
            return []
        e = self.home.entries.get(tid)
        if e is not None and e.phase is h.HomePhase.OFFERING:
            self.pending_cancel.add(tid)
            return []
        return self.apply(self.home.cancel(tid, now), [tid], now, wall)

    def on_node_dead(self, node: m.NodeId, now: float, wall: float) -> list[ev.Instruction]:
        self.view.remove(node)
        self.charges.forget(node)
        outs = self.home.on_node_dead(node, now)
        gangs = self.gang_node_dead(node, now, wall) if self.gang_coords else []
        if not outs:
            return gangs
        note = ev.log("info", "handoff.node_dead", peer=node, tasks=len(outs))
        return [note, ev.Later(tuple(self.apply(outs, [], now, wall))), *gangs]

    def tick(self, now: float, wall: float) -> list[ev.Instruction]:
        out: list[ev.Instruction] = []
        outs = self.home.tick(now) + self.guest.tick(now)
        if outs:
            out += self.apply(outs, [], now, wall)
        out += self.fence_tick(now)
        if now >= self.failover_at:  # at most once a second: it looks at every entry
            self.failover_at = now + 1.0
            out += self.failover_tick(now, wall)
        ops = self.handoffs.expire_tombstones(wall)
        if ops:
            out.append(ev.Persist(tuple(ops)))
        return out

    def holds_at(self, node: m.NodeId) -> bool:
        """Does `node` hold (run, queue, or be offered) a task whose home is here?"""
        return any(
            e.where == node or e.target == node
            for e in self.home.entries.values()
            if e.phase in (h.HomePhase.REMOTE, h.HomePhase.OFFERING)
        )

    def handoff_busy(self) -> bool:
        """Retries are due only while something is in flight: idle nodes wake rarely."""
        return bool(self.guest.entries) or self.home.pending
