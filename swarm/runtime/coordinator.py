"""Where tasks live: placement, handoff, transfer and global tasks, on the real node.

This module applies the pure decisions (policy.placement, policy.transfer,
policy.shares, cluster.handoff) to the node's real state: the task table and its
journal, the local run queue, the share ledger, and the peers (ClusterNode RPCs).
Every rule lives in those pure modules; what is here is bookkeeping and ordering:
decisions are journaled before the messages that depend on them are sent.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import attrs
import trio

from .. import codec, testbreak, wire
from .. import model as m
from ..cluster import handoff as h
from ..cluster.membership import AppMessage, AppState, Event, EventKind, LoadUpdated, MemberEvent
from ..logs import EventLog
from ..policy import gpu as gpupol
from ..policy import load as loadpol
from ..policy import placement as pl
from ..policy import shares as sh
from ..policy import transfer as tr
from ..policy.view import LoadView
from .clock import Clock
from .journal import DelKV, Journal, PutKV
from .journal import Event as JEvent
from .logread import read_log
from .net import TransportError
from .peers import ClusterNode, RemoteError
from .runner import LocalRunner
from .sampler import HostSample, Sampler
from .tasks import TaskTable, UnknownTask


class MoveHooks(Protocol):
    """What the coordinator asks of the migration side (runtime/migrator.Migrator),
    named here so the two modules do not import each other."""

    def holds_state(self, t: m.Task) -> bool: ...
    def on_started(self, task: m.Task) -> None: ...
    def on_stopped(self, task: m.Task) -> None: ...
    def on_ended(self, task: m.Task) -> None: ...
    def on_left(self, tid: m.TaskId) -> None: ...
    async def cancel(self, tid: m.TaskId, cause: str) -> None: ...


S = m.TaskState
GLOBALS_KEY = "globals"
TOMB_TTL = 600.0  # seconds a guest tombstone is kept
EXPLAIN_CACHE = 10_000  # tasks whose decisions stay in memory


class Coordinator:
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
        placement_d: int = 2,
        psi_target: float = 50.0,
        report_interval: float = 1.0,
        rpc_timeout: float = 5.0,
        transfer_config: tr.TransferConfig | None = None,
        placement_rule: str = "two-choice",
        transfer: bool = True,
        gpu_devices: tuple[gpupol.GpuDevice, ...] = (),
        gpu_policy: str = "binpack",
        mps: bool = False,
        rng: random.Random | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.node = node
        self.table = table
        self.clock = clock or table.clock
        self.journal = journal
        self.runner = runner
        self.cluster = cluster
        self.ledger = ledger
        self.log = log
        self.d = placement_d
        self.placement_rule = placement_rule
        self.transfer_on = transfer
        self.rng = rng or random.Random()
        self.report_interval = report_interval
        self.rpc_timeout = rpc_timeout
        self.home = h.HomeSide(node)
        self.guest = h.GuestSide(node)
        self.tomb_at: dict[m.TaskId, float] = {}
        # tasks with a guest:<id> key in the journal: only those need a delete when
        # their guest entry goes (a home-only task would write a useless one per change)
        self._guest_keys: set[m.TaskId] = set()
        self.view = LoadView()
        self.sampler = Sampler()
        self.sample: HostSample = self.sampler.sample()
        self.flex_cfg = loadpol.FlexConfig(psi_cpu_target=psi_target, psi_mem_target=psi_target)
        self.flex = loadpol.FlexState.initial(self.flex_cfg)
        self.peak = loadpol.PeakEstimator()
        self.transfer = tr.TransferPolicy(node, transfer_config)
        self.gpus = gpupol.GpuAllocator(gpu_devices)
        self.gpu_policy = gpu_policy
        self.mps = mps
        self.globals = sh.GlobalTasks()
        self.explains: OrderedDict[m.TaskId, list[dict[str, Any]]] = OrderedDict()
        self.placing: set[m.TaskId] = set()
        self.arrived: dict[m.TaskId, float] = {}  # when a queued task arrived here (trio time)
        self.pending_cancel: set[m.TaskId] = set()
        # set by the agent: why a task may not run on this node at all (its user does
        # not exist here, root tasks are off), and the node's isolation for reports
        self.admission_hook: Callable[[m.TaskSpec], str | None] | None = None
        self.isolation = "none"
        self.criu = False  # a working CRIU here (set by the agent at start-up)
        self.migrator: MoveHooks | None = None  # set by the agent
        # load report versions: wall-clock milliseconds (a restarted node's reports
        # supersede its previous life's), taken at the first report (in trio.run)
        self._version = 0
        self._nursery: trio.Nursery | None = None
        self._kick_place = trio.Event()
        self._offer_waiters: dict[m.TaskId, tuple[trio.Event, list[tuple[bool, str]]]] = {}
        self._inflight: set[tuple[m.NodeId, h.Request]] = set()
        self._needs: dict[m.TaskId, pl.Needs] = {}  # per task, for queue_view
        self._published_at = 0.0
        self._last_published: m.LoadReport | None = None
        self._publish_pending = False
        self.min_publish_gap = min(0.25, report_interval)
        self._globals_kick = trio.Event()
        self.counters: dict[str, int] = {
            "placements": 0,
            "placed_local": 0,
            "placed_remote": 0,
            "offers_refused": 0,
            "offers_failed": 0,
            "handoff_rpcs": 0,
            "handoff_rpc_failures": 0,
            "transfers_pushed": 0,
            "transfers_stolen": 0,
            "requeued_dead": 0,
            "lost": 0,
        }

    # ----------------------------------------------------------- persistence

    def restore(self, kv: dict[str, Any]) -> None:
        now = self.clock.wall()
        gpu_records: list[tuple[m.TaskId, Any]] = []
        for key, value in kv.items():
            try:
                if key.startswith("home:"):
                    self.home.restore(h.home_entry_from_wire(value))
                elif key.startswith("guest:"):
                    self._guest_keys.add(key[6:])
                    self.guest.restore(h.guest_entry_from_wire(value))
                elif key.startswith("tomb:"):
                    epoch, at = int(value[0]), float(value[1])
                    if now - at < TOMB_TTL:
                        self.guest.tombstones[key[5:]] = epoch
                        self.tomb_at[key[5:]] = at
                elif key == GLOBALS_KEY:
                    self.globals = sh.GlobalTasks.from_wire(value)
                elif key.startswith("gpu:"):
                    gpu_records.append((key[4:], value))
            except (wire.WireError, TypeError, ValueError, IndexError) as e:
                self.log.error("coordinator.bad_state", key=key, error=str(e))
        self._restore_gpus(gpu_records)

    def _restore_gpus(self, records: list[tuple[m.TaskId, Any]]) -> None:
        """Journaled GPU allocations of tasks still active come back (a re-queued task
        restarts on the same devices); those of finished tasks are released."""
        allocs = []
        for tid, rec in records:
            t = self.table.active.get(tid)
            try:
                a = gpupol.Allocation.from_record(rec)
            except (gpupol.GpuAllocationError, TypeError, ValueError) as e:
                self.log.error("gpu.bad_record", task=tid, error=str(e))
                self.journal.enqueue([DelKV("gpu:" + tid)])
                continue
            if t is None:
                self.journal.enqueue([DelKV("gpu:" + tid)])
                continue
            allocs.append(a)
        for tid, why in self.gpus.restore(allocs):
            self.log.warning("gpu.restore_refused", task=tid, reason=why)
            self.journal.enqueue([DelKV("gpu:" + tid)])

    def _persist_ops(self, task_ids: Iterable[m.TaskId]) -> list[Any]:
        ops: list[Any] = []
        now = self.clock.wall()
        for tid in set(task_ids):
            he = self.home.entries.get(tid)
            if he is not None:
                ops.append(PutKV("home:" + tid, h.home_entry_to_wire(he)))
            ge = self.guest.entries.get(tid)
            if ge is not None:
                ops.append(PutKV("guest:" + tid, h.guest_entry_to_wire(ge)))
                self._guest_keys.add(tid)
            else:
                if tid in self._guest_keys:
                    ops.append(DelKV("guest:" + tid))
                    self._guest_keys.discard(tid)
                if tid in self.guest.tombstones:
                    self.tomb_at.setdefault(tid, now)
                    ops.append(
                        PutKV("tomb:" + tid, [self.guest.tombstones[tid], self.tomb_at[tid]])
                    )
        return ops

    async def _persist(self, task_ids: Iterable[m.TaskId]) -> None:
        ops = self._persist_ops(task_ids)
        if ops:
            await self.journal.commit(ops, must_land=True)

    # ------------------------------------------------------------------ run

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.cluster is not None:
                self.cluster.on_event = self.on_event
                # its peer routes are in runtime/routes.py, installed by the agent
            nursery.start_soon(self._report_loop)
            nursery.start_soon(self._handoff_tick_loop)
            if self.cluster is not None and self.transfer_on:
                nursery.start_soon(self._transfer_loop)
            nursery.start_soon(self._globals_loop)
            # resume what the journal says was in flight
            for t in list(self.table.active.values()):
                e = self.home.entries.get(t.id)
                if t.state is S.TRANSFERRING and (e is None or e.phase is h.HomePhase.LOCAL):
                    why = "offer interrupted by restart"
                    self.table.change(t.id, S.QUEUED, why, node=self.node)
            for t in list(self.table.active.values()):
                mine = t.spec.home == self.node and t.node == self.node and not t.spec.is_global
                if mine and t.state is S.QUEUED and t.id not in self.ledger:
                    self.place_soon(t.id)
            task_status.started()
            await trio.sleep_forever()

    # ---------------------------------------------------------- local state

    def local_report(self) -> m.LoadReport:
        snap = self.ledger.snapshot()
        s = self.sample
        self._version = max(self._version + 1, int(self.clock.wall() * 1000))
        return m.LoadReport(
            node=self.node,
            version=self._version,
            shares=snap.shares,
            reserved_shares=snap.reserved_shares,
            weight_sum=snap.weight_sum,
            queued=snap.queued,
            running=snap.running,
            slots=self.runner.slots,
            cpu_util=s.cpu_util,
            load_per_core=s.load_per_core,
            mem_available=s.mem_available,
            mem_total=s.mem_total,
            psi_cpu=s.psi_cpu,
            psi_mem=s.psi_mem,
            cpus=s.cpus,
            isolation=self.isolation,
            criu=self.criu,
            gpus=self.gpus.summary(),
        )

    def _usage(self) -> tuple[loadpol.Usage, loadpol.Capacity]:
        s = self.sample
        return self.peak.estimate, loadpol.Capacity(cpu=s.cpus, mem=s.mem_total)

    async def _report_loop(self) -> None:
        while True:
            # the one place the agent's wall clock follows the system's (an NTP step)
            moved = self.clock.resync()
            if abs(moved) >= 1.0:
                self.log.warning("clock.stepped", seconds=round(moved, 3))
            now = self.clock.now()
            self.sample = self.sampler.sample()
            self.peak = self.peak.update(
                now, loadpol.Usage(cpu=self.sample.cpu_used_cores, mem=self.sample.mem_used)
            )
            ok = loadpol.qos_holds(self.sample.psi_cpu, self.sample.psi_mem, self.flex_cfg)
            self.flex = loadpol.flex_update(self.flex, self.flex_cfg, ok)
            report = self.local_report()
            if self._last_published is None or changed_meaningfully(self._last_published, report):
                self.publish_load(report)
            # else: the membership core re-gossips the last report on its own refresh timer
            await trio.sleep(self.report_interval)

    def publish_load(self, report: m.LoadReport | None = None) -> None:
        if self.cluster is not None:
            self._published_at = self.clock.now()
            report = report if report is not None else self.local_report()
            self._last_published = report
            self.cluster.set_local_load(report)

    def shares_changed(self) -> None:
        """This node's shares changed (drain, undrain, `swarm shares`): publish, and let
        global tasks that a cluster without shares held back start now, not at the timer."""
        self.publish_load()
        self._globals_kick.set()

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

    def _count_in_view(self, node: m.NodeId, spec: m.TaskSpec) -> None:
        """We just handed `spec` to `node`: until its next report arrives, count it in
        our (stale) view of that node, so that our next placements do not pile onto a
        node whose report predates the work we sent it."""
        entry = self.view.get(node)
        if entry is None:
            return
        r = entry.report
        self.view.upsert(
            attrs.evolve(r, weight_sum=r.weight_sum + spec.weight, queued=r.queued + 1),
            entry.received_at,
        )

    def queue_view(self) -> list[tr.QueuedTask]:
        """Queued (not started) tasks in the local run queue, as transfer sees them."""
        out = []
        now = self.clock.now()
        for tid in self.runner.queue:
            t = self.table.active.get(tid)
            if t is None or t.state is not S.QUEUED:
                continue
            pinned = t.spec.is_global or (t.spec.home != self.node and not self.guest.may_run(tid))
            if not pinned and self.migrator is not None:
                pinned = self.migrator.holds_state(t)  # its checkpoint is here, not there
            needs = self._needs.get(tid)
            if needs is None or len(self._needs) > 100_000:
                if len(self._needs) > 100_000:
                    self._needs.clear()
                needs = self._needs[tid] = pl.Needs.of(t.spec)
            arrived = self.arrived.get(tid, now)
            out.append(tr.QueuedTask(tid, needs, t.spec.submitted_at, arrived, pinned))
        return out

    # ----------------------------------------------------------- placement

    def place_soon(self, tid: m.TaskId) -> None:
        """Place a queued task whose home is here. The common case, this node chosen
        and admission agreeing, is done at once, without trips through the scheduler:
        the task is in the run queue before the submit reply goes out (submit-to-start
        latency is a target of its own). Anything else goes the whole way through
        _place_task."""
        if tid in self.placing or self._nursery is None:
            return
        first: pl.Placement | None = None  # a remote choice, for _place_task to carry out
        t = self.table.active.get(tid)
        if t is not None and self._placeable(t):
            first = self._choose_node(t.spec, self.local_report(), self.clock.now())
            if first.target == self.node:
                adm = self._admit_here(t)
                if adm.ok:
                    self.counters["placements"] += 1
                    self._run_here(t, first, adm)
                    return
                first = None  # refused: _place_task records it and retries around it
        self.placing.add(tid)
        self._nursery.start_soon(self._place_task, tid, first)

    def _placeable(self, t: m.Task) -> bool:
        """Is a task ready to be placed by two choices (rather than kept here, or no
        longer ours to place)?"""
        return not (
            t.state is not S.QUEUED
            or t.node != self.node
            or t.id in self.ledger
            or self.gpus.get(t.id) is not None
            or (self.migrator is not None and self.migrator.holds_state(t))
            or (t.spec.reserve_shares and testbreak.broken("oversubscribe"))
        )

    def _choose_node(
        self,
        spec: m.TaskSpec,
        local: m.LoadReport,
        now: float,
        exclude: frozenset[m.NodeId] = frozenset(),
    ) -> pl.Placement:
        if self.placement_rule == "random":  # the benchmarks' baseline
            return self._place_random(spec, local, now, exclude)
        return pl.place(spec, local, self.view, self.rng, now, d=self.d, exclude=exclude)

    def _admit_here(self, t: m.Task) -> pl.Admission:
        """Admission with this node's fresh state (placement used gossip-age data)."""
        usage, cap = self._usage()
        return pl.admit(t.spec, self.ledger, self.flex, usage, cap, gpus=self.gpus.summary())

    def _run_here(self, t: m.Task, p: pl.Placement, adm: pl.Admission) -> None:
        rec = p.explain()
        rec["outcome"] = ("runs here: " if adm.ok else "refused here: ") + adm.reason
        self._record_explain(t.id, rec)
        if adm.ok:
            self.counters["placed_local"] += 1
            self._enqueue_local(t)

    def _record_explain(self, tid: m.TaskId, rec: dict[str, Any]) -> None:
        """Keep a decision for `swarm explain`: in memory for recent tasks, and as an
        append-only journal event (read back for older tasks and after a restart)."""
        rec = {"at": self.clock.wall(), **rec}
        lst = self.explains.get(tid)
        if lst is None:
            lst = self.explains[tid] = []
            while len(self.explains) > EXPLAIN_CACHE:
                self.explains.popitem(last=False)
        lst.append(rec)
        del lst[:-20]
        self.journal.enqueue([JEvent(rec["at"], "decision", tid, self.node, rec)])

    async def explain(self, tid: m.TaskId) -> list[dict[str, Any]]:
        cached = self.explains.get(tid)
        if cached is not None:
            return list(cached)
        return await self.journal.events_for(tid, "decision")

    def _enqueue_local(self, task: m.Task, front: bool = False) -> None:
        if task.id not in self.ledger:
            self.ledger.add(task.spec)
        self.arrived.setdefault(task.id, self.clock.now())
        if front:
            self.runner.queue.appendleft(task.id)
            self.runner.kick()
        else:
            self.runner.enqueue(task.id)
        self.load_changed()

    async def _place_task(self, tid: m.TaskId, first: pl.Placement | None = None) -> None:
        """Find a home for a queued task whose home is here: two choices, re-check, retry.
        `first`: the decision to start with (taken moments ago by place_soon)."""
        retry = pl.PlacementRetry()
        policy = pl.RetryPolicy(base=0.5, max_backoff=10.0)
        try:
            while True:
                t = self.table.active.get(tid)
                if (
                    t is None
                    or t.state is not S.QUEUED
                    or t.node != self.node
                    or tid in self.ledger
                ):
                    return
                if t.spec.reserve_shares and testbreak.broken("oversubscribe"):
                    self._enqueue_local(t)  # TEST-ONLY: chaos self-test (testbreak.py)
                    return
                if self.gpus.get(tid) is not None:
                    # it holds a GPU slice here from before a restart: run it here again
                    self._record_explain(tid, {"outcome": "runs here: holds its GPU slice"})
                    self._enqueue_local(t)
                    return
                he = self.home.entries.get(tid)
                if (
                    self.migrator is not None
                    and (he is None or he.phase is h.HomePhase.LOCAL)
                    and self.migrator.holds_state(t)
                ):
                    # its checkpoint is here (it ran here, or its move failed): placing it
                    # elsewhere would restart it from scratch
                    self._record_explain(tid, {"outcome": "runs here: its checkpoint is here"})
                    self._enqueue_local(t)
                    return
                now = self.clock.now()
                if not retry.ready(now):
                    with trio.move_on_after(retry.not_before - now):
                        await self._kick_place.wait()
                    continue
                if first is not None:
                    p, first = first, None
                else:
                    p = self._choose_node(t.spec, self.local_report(), now, retry.exclude)
                self.counters["placements"] += 1
                if p.target is None:
                    rec = p.explain()
                    rec["outcome"] = "waiting: " + p.summary
                    self._record_explain(tid, rec)
                    retry = retry.on_no_target(now, policy, self.rng)
                    continue
                if p.target == self.node:
                    adm = self._admit_here(t)
                    self._run_here(t, p, adm)
                    if adm.ok:
                        return
                    retry = retry.on_refusal(self.node, now, policy, self.rng)
                    continue
                ok, reason = await self.offer_home_task(tid, p.target)
                rec = p.explain()
                rec["outcome"] = f"handed to {p.target}" if ok else f"{p.target} refused: {reason}"
                self._record_explain(tid, rec)
                if ok:
                    self.counters["placed_remote"] += 1
                    # not `return`: while we waited for the outcome the holder may already
                    # have been declared dead and the task re-queued here (place_soon is a
                    # no-op while this loop runs); the loop's top check decides
                    retry = pl.PlacementRetry()
                    continue
                retry = retry.on_refusal(p.target, self.clock.now(), policy, self.rng)
        finally:
            self.placing.discard(tid)

    def _place_random(
        self, spec: m.TaskSpec, local: m.LoadReport, now: float, exclude: frozenset[m.NodeId]
    ) -> pl.Placement:
        """Baseline for benchmarks: a uniformly random eligible node (this one included)."""
        needs = pl.Needs.of(spec)
        nodes = [n for n in self.view if n != self.node]
        for _ in range(16):
            i = self.rng.randrange(len(nodes) + 1)
            node = self.node if i == len(nodes) else nodes[i]
            report = local if node == self.node else self.view[node].report
            if node not in exclude and pl.refusal(report, needs) is None:
                return pl.Placement(
                    spec.id, node, node == self.node, (), "random", 1, len(nodes), False
                )
        return pl.Placement(
            spec.id, None, False, (), "random: no eligible node drawn", 16, len(nodes), False
        )

    # -------------------------------------------------------------- handoff

    async def offer_home_task(self, tid: m.TaskId, target: m.NodeId) -> tuple[bool, str]:
        """Offer a task whose home is here (held here) to `target`; wait for the outcome."""
        t = self.table.active.get(tid)
        if t is None or t.state not in (S.QUEUED, S.MIGRATING) or t.node != self.node:
            return False, "not queued here"
        e = self.home.entries.get(tid)
        if e is not None and e.phase is not h.HomePhase.LOCAL:
            return False, f"handoff busy ({e.phase.value})"
        if t.state is S.QUEUED:  # a MIGRATING task stays so until committed or failed
            self.table.change(tid, S.TRANSFERRING, f"offering to {target}", node=self.node)
        outs = self.home.offer(t.spec, target, self.clock.now())
        done = trio.Event()
        result: list[tuple[bool, str]] = []
        self._offer_waiters[tid] = (done, result)
        await self.apply(outs, tid)
        await done.wait()
        return result[0] if result else (False, "no outcome")

    def _offer_outcome(self, tid: m.TaskId, ok: bool, reason: str) -> None:
        w = self._offer_waiters.pop(tid, None)
        if w is not None:
            w[1].append((ok, reason))
            w[0].set()

    async def apply(self, outs: list[h.Output], *task_ids: m.TaskId) -> None:
        """Apply handoff outputs: decisions first (journaled), then the sends."""
        sends: list[h.Send] = []
        touched: set[m.TaskId] = set(task_ids)
        for o in outs:
            if isinstance(o, h.Send):
                sends.append(o)
                touched.add(o.request.task_id)
            else:
                touched.add(o.task_id)
                await self._decide(o)
        await self._persist(touched)
        for s in sends:
            key = (s.dest, s.request)
            if key in self._inflight:
                # the same question is still on its way: a retry now would only add load
                self.counters["handoff_dedup"] = self.counters.get("handoff_dedup", 0) + 1
                continue
            self._inflight.add(key)
            self._spawn(self._deliver, s)

    def _spawn(self, fn: Any, *args: Any) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    async def _decide(self, o: h.Output) -> None:
        if isinstance(o, h.Send):
            return
        tid = o.task_id
        if isinstance(o, h.Committed):
            await self._on_committed(o)
        elif isinstance(o, h.OfferFailed):
            await self._on_offer_failed(o)
        elif isinstance(o, h.HolderLost):
            await self._on_holder_lost(o)
        elif isinstance(o, h.Reported):
            await self._on_reported(o)
        elif isinstance(o, h.RunNow):
            self._on_run_now(tid)
        elif isinstance(o, h.Drop):
            await self._on_drop(o)
        elif isinstance(o, h.Kill):
            await self._on_kill(tid)
        elif isinstance(o, h.MoveDone):
            self.log.info("transfer.move_answer", task=tid, ok=o.ok, reason=o.reason)

    async def _on_committed(self, o: h.Committed) -> None:
        t = self.table.active.get(o.task_id)
        if t is None:
            return
        if o.node == self.node:
            # the task came back home
            if t.state is S.QUEUED:
                self.table.change(t.id, S.TRANSFERRING, "moving back home", node=t.node)
            self.table.change(t.id, S.QUEUED, "back home", node=self.node)
            self._enqueue_local(self.table.active[t.id])
            return
        if t.state in (S.TRANSFERRING, S.MIGRATING):
            how = "migrated to" if t.state is S.MIGRATING else "handed off to"
            self.table.change(t.id, S.QUEUED, f"{how} {o.node}", node=o.node)
            self._count_in_view(o.node, t.spec)
            self.ledger.remove(t.id)
            self.release_gpu(t.id)
            self.load_changed()
            self.arrived.pop(t.id, None)
            self._offer_outcome(t.id, True, "")
            if t.id in self.pending_cancel:
                self.pending_cancel.discard(t.id)
                await self.apply(self.home.cancel(t.id, self.clock.now()), t.id)
        # else: a fence (same holder, new epoch); nothing changes in the record

    async def _on_offer_failed(self, o: h.OfferFailed) -> None:
        t = self.table.active.get(o.task_id)
        self.counters["offers_refused" if o.refused else "offers_failed"] += 1
        if t is None:
            return
        e = self.home.entries.get(o.task_id)
        where = e.where if e is not None else self.node
        if t.state in (S.TRANSFERRING, S.MIGRATING):
            # a migrating task restarts where it was, from the checkpoint it kept there
            self.table.change(t.id, S.QUEUED, f"offer to {o.node} failed: {o.reason}", node=where)
        if where == self.node:
            if t.id in self.pending_cancel:
                self.pending_cancel.discard(t.id)
                await self.table.change_durably(t.id, S.CANCELLED, "cancelled")
            elif t.id in self.ledger:  # it was in the local queue (a push): put it back
                self.runner.queue.appendleft(t.id)
                self.runner.kick()
            elif t.id not in self._offer_waiters:
                # No placement waits for this offer (it was resumed after a restart, or a
                # holder that asked for a move died): place the task again, or it would
                # sit queued at its home forever.
                self.place_soon(t.id)
        self._offer_outcome(t.id, False, o.reason)

    async def _on_holder_lost(self, o: h.HolderLost) -> None:
        t = self.table.active.get(o.task_id)
        if t is None:
            return
        if t.state is S.RUNNING and t.spec.no_retry:
            self.counters["lost"] += 1
            await self.table.change_durably(
                t.id, S.LOST, f"{o.node} died while running it (--no-retry)"
            )
            return
        if t.state in (S.RUNNING, S.MIGRATING):
            self.table.change(t.id, S.QUEUED, f"{o.node} died: re-queued", node=self.node)
        elif t.state is S.QUEUED:
            self.table.change(t.id, S.TRANSFERRING, f"{o.node} died", node=t.node)
            self.table.change(t.id, S.QUEUED, f"{o.node} died: re-queued", node=self.node)
        elif t.state is S.TRANSFERRING:
            self.table.change(t.id, S.QUEUED, f"{o.node} died: re-queued", node=self.node)
        self.counters["requeued_dead"] += 1
        self.place_soon(t.id)

    async def _on_reported(self, o: h.Reported) -> None:
        t = self.table.active.get(o.task_id)
        if t is None:
            return
        r = o.report
        if t.state in (S.QUEUED, S.TRANSFERRING) and (r.state == "running" or r.final):
            self.table.change(t.id, S.RUNNING, f"started on {o.node}", node=o.node)
        if not r.final:
            return
        dst = {"succeeded": S.SUCCEEDED, "failed": S.FAILED, "cancelled": S.CANCELLED}[r.state]
        self.pending_cancel.discard(t.id)
        await self.table.change_durably(
            t.id, dst, r.reason or r.state, node=o.node, exit_code=r.exit_code, signal=r.signal
        )

    def _on_run_now(self, tid: m.TaskId) -> None:
        e = self.guest.entries.get(tid)
        if e is None:
            return
        t = self.table.active.get(tid)
        if t is not None and t.state is S.MIGRATING:
            # the home did not carry out our move: run it here again, from its checkpoint
            t = self.table.change(tid, S.QUEUED, "move not carried out: runs here again")
        if t is None or t.state is not S.QUEUED:
            task = m.new_task(e.spec, self.clock.wall(), self.node, cause=f"accepted from {e.home}")
            self.table.replace(task)
            t = task
        if tid not in self.runner.queue and tid not in self.runner.running:
            self._enqueue_local(t)

    async def _on_drop(self, o: h.Drop) -> None:
        tid = o.task_id
        t = self.table.active.get(tid)
        if tid in self.runner.running:
            if o.kill:
                await self.runner.cancel(tid, reason=o.reason)
            return
        try:
            self.runner.queue.remove(tid)
        except ValueError:
            pass
        self.ledger.remove(tid)
        self.release_gpu(tid)
        self.arrived.pop(tid, None)
        if t is not None and t.spec.home != self.node:
            self.table.forget(tid)
        if self.migrator is not None:
            self.migrator.on_left(tid)  # its state dir, if any, is not needed here now

    async def _on_kill(self, tid: m.TaskId) -> None:
        if tid in self.runner.running:
            await self.runner.cancel(tid)
            return
        t = self.table.active.get(tid)
        if t is not None and t.state is S.MIGRATING and self.migrator is not None:
            await self.migrator.cancel(tid, "cancelled by home")
            return
        if t is not None and t.state is S.QUEUED:
            try:
                self.runner.queue.remove(tid)
            except ValueError:
                pass
            self.ledger.remove(tid)
            t = await self.table.change_durably(tid, S.CANCELLED, "cancelled by home")
            await self.apply(
                self.guest.finished(
                    h.Report(tid, 0, "cancelled", reason="cancelled", at=self.clock.wall()),
                    self.clock.now(),
                ),
                tid,
            )

    async def _deliver(self, s: h.Send) -> None:
        """Send one handoff request and feed the reply (or its absence) back."""
        req = s.request
        reply: h.Reply | None = None
        self.counters["handoff_rpcs"] += 1
        kind = "handoff_sent_" + type(req).__name__.lower()
        self.counters[kind] = self.counters.get(kind, 0) + 1
        try:
            if self.cluster is not None:
                raw = await self.cluster.request(
                    s.dest, {"op": "handoff", "req": h.request_to_wire(req)}, self.rpc_timeout
                )
                reply = h.reply_from_wire(raw.get("reply"))
        except (TransportError, RemoteError, wire.WireError) as e:
            self.counters["handoff_rpc_failures"] += 1
            self.log.debug("handoff.rpc_failed", dest=s.dest, kind=type(req).__name__, error=str(e))
        finally:
            self._inflight.discard((s.dest, req))
        now = self.clock.now()
        if isinstance(req, (h.Offer, h.Commit, h.Abort, h.Revoke, h.Cancel)):
            outs = self.home.on_reply(s.dest, req, reply, now)
        else:
            outs = self.guest.on_reply(s.dest, req, reply, now)
        await self.apply(outs, req.task_id)

    async def _handoff_tick_loop(self) -> None:
        while True:
            # retries are due only while something is in flight: idle nodes wake rarely
            busy = self.guest.entries or any(True for _ in self.home.busy())
            await trio.sleep(0.2 if busy else 1.0)
            now = self.clock.now()
            outs = self.home.tick(now) + self.guest.tick(now)
            if outs:
                await self.apply(outs)
            # forget tombstones after a while
            cutoff = self.clock.wall() - TOMB_TTL
            for tid in [t for t, at in self.tomb_at.items() if at < cutoff]:
                self.tomb_at.pop(tid, None)
                self.guest.tombstones.pop(tid, None)
                self.journal.enqueue([DelKV("tomb:" + tid)])

    # ----------------------------------------------------------- RPC: handoff

    async def rpc_handoff(
        self, req: dict[str, Any], sender: m.NodeId, stream: Any
    ) -> dict[str, Any]:
        r = h.request_from_wire(req.get("req"))
        now = self.clock.now()
        outs: list[h.Output] = []
        if isinstance(r, h.Offer):
            refusal = self._admission_refusal(r.spec)
            reply, entry = self.guest.on_offer(sender, r, now, refusal)
            if entry is not None:
                if r.task_id not in self.ledger:
                    self.ledger.add(r.spec)
                await self._persist([r.task_id])  # journaled before we say yes
            elif not reply.ok:
                self.log.info("handoff.refused", task=r.task_id, home=sender, reason=reply.reason)
            return {"reply": h.reply_to_wire(reply)}
        if isinstance(r, h.Commit):
            reply, outs = self.guest.on_commit(r, now)
        elif isinstance(r, h.Abort):
            reply, outs = self.guest.on_abort(r)
        elif isinstance(r, h.Revoke):
            reply, outs = self.guest.on_revoke(r)
        elif isinstance(r, h.Cancel):
            reply, outs = self.guest.on_cancel(r)
        elif isinstance(r, h.Query):
            reply, outs = self.home.on_query(sender, r)
        elif isinstance(r, h.MoveRequest):
            reply, outs = self.home.on_move_request(sender, r, now)
            t = self.table.active.get(r.task_id)
            if reply.ok and t is not None and t.state is S.QUEUED and r.target != self.node:
                self.table.change(
                    t.id, S.TRANSFERRING, f"moving from {sender} to {r.target}", node=sender
                )
            elif reply.ok and t is not None and t.state is S.RUNNING:
                # a running task's holder stopped it to move it (checkpoint, restart, CRIU)
                self.table.change(
                    t.id, S.MIGRATING, f"migrating from {sender} to {r.target}", node=sender
                )
        elif isinstance(r, h.Report):
            reply, outs = self.home.on_report(sender, r)
        else:  # pragma: no cover - request_from_wire returns only the types above
            raise wire.SchemaError("unexpected handoff request")
        await self.apply(outs, r.task_id)
        return {"reply": h.reply_to_wire(reply)}

    def _admission_refusal(self, spec: m.TaskSpec) -> str | None:
        if self.admission_hook is not None and (why := self.admission_hook(spec)):
            return why
        if spec.id in self.ledger:
            return None
        usage, cap = self._usage()
        adm = pl.admit(spec, self.ledger, self.flex, usage, cap, gpus=self.gpus.summary())
        return None if adm.ok else adm.reason

    # ------------------------------------------------------- runner hooks

    def can_start(self, task: m.Task) -> str | None:
        """Why a queued local task must not start now (None: go, and its shares are taken:
        the runner starts every task this gate lets through)."""
        if (
            task.spec.home != self.node
            and not task.spec.is_global
            and not self.guest.may_run(task.id)
        ):
            return "handoff not settled"
        if task.id not in self.ledger:
            self.ledger.add(task.spec)
        why = self.ledger.refuse_start(task.id)
        if why is None and task.spec.gpu is not None:
            why = self._allocate_gpu(task)
        if why is None:
            # Take the shares at the gate, not in on_started: one dispatch pass lets
            # several queued tasks through before any of them runs, and each must see
            # the reservations of those let through before it.
            self.ledger.start(task.id)
        elif (  # TEST-ONLY: chaos self-test (swarm/testbreak.py)
            testbreak.broken("ignore-drain" if self.ledger.draining else "oversubscribe")
        ):
            return None
        return why

    def _allocate_gpu(self, task: m.Task) -> str | None:
        assert task.spec.gpu is not None
        if self.gpus.get(task.id) is not None:
            return None
        try:
            if self.gpu_policy == "spread":
                a = self.gpus.allocate(task.id, task.spec.gpu, "spread")
            else:
                a = self.gpus.allocate(task.id, task.spec.gpu, "binpack")
        except (gpupol.GpuRequestError, gpupol.GpuAllocationError) as e:
            return f"gpu request cannot be met here: {e}"
        if a is None:
            core, mem = gpupol.largest_free_slice(self.gpus.summary())
            return f"waiting for a GPU slice (largest free {core}% core, {mem} bytes)"
        self.journal.enqueue([PutKV("gpu:" + task.id, a.to_record())])
        self.log.info("gpu.allocated", task=task.id, devices=",".join(map(str, a.indices)))
        self.load_changed()
        return None

    def release_gpu(self, tid: m.TaskId) -> None:
        if self.gpus.release(tid) is not None:
            self.journal.enqueue([DelKV("gpu:" + tid)])
            self.log.info("gpu.released", task=tid)

    def gpu_env(self, task: m.Task) -> dict[str, str]:
        """CUDA_VISIBLE_DEVICES and friends for a task that holds a GPU allocation."""
        a = self.gpus.get(task.id)
        if a is None:
            return {}
        return gpupol.env_for(a, self.gpus.devices, self.mps)

    def on_started(self, task: m.Task) -> None:
        lt = self.ledger.get(task.id)
        if lt is not None and not lt.running:  # normally taken by can_start already
            try:
                self.ledger.start(task.id)
            except sh.LedgerError as e:
                self.log.warning("ledger.start", task=task.id, error=str(e))
        self.arrived.pop(task.id, None)
        self._needs.pop(task.id, None)
        if self.migrator is not None:
            self.migrator.on_started(task)
        if task.spec.home != self.node and not task.spec.is_global:
            # The "running" report waits for the first retry tick (~0.5 s): a short task's
            # final report makes it unnecessary, which saves an RPC per short task.
            outs = [
                o
                for o in self.guest.started(task.id, self.clock.now())
                if not (isinstance(o, h.Send) and isinstance(o.request, h.Report))
            ]
            self._spawn(self._apply_now, outs, task.id)

    def on_finished(self, task: m.Task) -> None:
        """A local run ended: terminal, back to the queue (shutdown), or stopped to move."""
        if task.state is S.MIGRATING:
            lt = self.ledger.get(task.id)
            if lt is not None and lt.running:
                self.ledger.stop(task.id)  # stays here (queued weight) until it has moved
            self.guest.requeued(task.id)
            if self.migrator is not None:
                self.migrator.on_stopped(task)
            return
        if task.state is S.QUEUED:
            if (
                task.id in self.ledger
                and (lt := self.ledger.get(task.id)) is not None
                and lt.running
            ):
                self.ledger.stop(task.id)
            self.guest.requeued(task.id)
            return
        self.ledger.remove(task.id)
        self.release_gpu(task.id)
        self.load_changed()
        if self.migrator is not None:
            self.migrator.on_ended(task)
        if task.spec.home != self.node and not task.spec.is_global:
            rep = h.Report(
                task.id,
                0,
                task.state.value,
                exit_code=task.exit_code,
                signal=task.signal,
                reason=task.reason,
                at=self.clock.wall(),
            )
            self._spawn(self._apply_now, self.guest.finished(rep, self.clock.now()), task.id)

    async def _apply_now(self, outs: list[h.Output], tid: m.TaskId) -> None:
        await self.apply(outs, tid)

    # ------------------------------------------------------------- cancel

    async def cancel_remote(self, tid: m.TaskId) -> None:
        """Cancel a task whose home is here and which lives elsewhere (or is in flight)."""
        e = self.home.entries.get(tid)
        t = self.table.active.get(tid)
        if t is None:
            return
        if e is not None and e.phase is h.HomePhase.OFFERING:
            self.pending_cancel.add(tid)
            return
        await self.apply(self.home.cancel(tid, self.clock.now()), tid)

    # ------------------------------------------------------------ membership

    def on_event(self, ev: Event) -> None:
        if isinstance(ev, LoadUpdated):
            if ev.report.node != self.node:
                prev = self.view.get(ev.report.node)
                self.view.upsert(ev.report, ev.at)
                if ev.report.shares > 0 and prev is not None and prev.report.shares <= 0:
                    self._globals_kick.set()  # a peer undrained: held global tasks may start
                self._kick_place.set()
                self._kick_place = trio.Event()
        elif isinstance(ev, MemberEvent):
            node = ev.member.node
            if node == self.node:
                return
            if ev.kind in (EventKind.DEAD, EventKind.LEFT):
                self.view.remove(node)
                outs = self.home.on_node_dead(node, self.clock.now())
                if outs:
                    self.log.info("handoff.node_dead", peer=node, tasks=len(outs))
                    self._spawn(self._apply_now, outs, "")
            elif ev.kind is EventKind.JOINED:
                self._kick_place.set()
                self._kick_place = trio.Event()
                self._globals_kick.set()
        elif isinstance(ev, AppMessage) and ev.key == GLOBALS_KEY:
            self._merge_globals(ev.payload)
        elif isinstance(ev, AppState):
            g = ev.state.get(GLOBALS_KEY) if isinstance(ev.state, dict) else None
            if g is not None:
                self._merge_globals(g)

    # --------------------------------------------------------------- transfer

    async def _transfer_loop(self) -> None:
        while True:
            await trio.sleep(self.transfer.cfg.round_interval)
            if self.cluster is None:
                continue
            now = self.clock.now()
            actions = self.transfer.step(
                now, self.local_report(), self.queue_view(), self.view, self.rng
            )
            for a in actions:
                self._spawn(self._transfer_action, a)

    async def _transfer_action(self, a: tr.Action) -> None:
        assert self.cluster is not None
        if isinstance(a, tr.ProbeFor):
            try:
                raw = await self.cluster.request(
                    a.peer,
                    {"op": "probe", "req": _probe_to_wire(a.request)},
                    self.transfer.cfg.probe_timeout * 2,
                )
                reply = _probe_reply_from_wire(raw.get("reply"))
            except (TransportError, RemoteError, wire.WireError):
                return
            more = self.transfer.on_probe_reply(
                self.clock.now(), reply, self.local_report(), self.queue_view()
            )
            for b in more:
                await self._transfer_action(b)
        elif isinstance(a, tr.PushTask):
            await self.push(a.task_id, a.peer)
        elif isinstance(a, tr.StealFrom):
            try:
                await self.cluster.request(
                    a.peer, {"op": "steal", "req": _probe_to_wire(a.request)}, self.rpc_timeout
                )
            except (TransportError, RemoteError, wire.WireError):
                return

    async def push(self, tid: m.TaskId, peer: m.NodeId) -> bool:
        """Move a queued, not started task of the local run queue to `peer`."""
        t = self.table.active.get(tid)
        if t is None or t.state is not S.QUEUED or tid in self.runner.running:
            return False
        try:
            self.runner.queue.remove(tid)
        except ValueError:
            return False
        self.counters["transfers_pushed"] += 1
        self.log.info("transfer.push", task=tid, to=peer)
        if t.spec.home == self.node:
            ok, _ = await self.offer_home_task(tid, peer)
            return ok
        outs = self.guest.request_move(tid, peer, self.clock.now())
        if not outs:
            self.runner.queue.appendleft(tid)
            return False
        await self.apply(outs, tid)
        return True

    async def rpc_probe(self, req: dict[str, Any], sender: m.NodeId, stream: Any) -> dict[str, Any]:
        request = _probe_from_wire(req.get("req"))
        reply = self.transfer.on_probe(
            self.clock.now(), request, self.local_report(), self.queue_view()
        )
        return {"reply": _probe_reply_to_wire(reply)}

    async def rpc_steal(self, req: dict[str, Any], sender: m.NodeId, stream: Any) -> dict[str, Any]:
        request = _probe_from_wire(req.get("req"))
        tid = self.transfer.on_steal(
            self.clock.now(), request, self.local_report(), self.queue_view()
        )
        if tid is None:
            return {"task": None}
        self.counters["transfers_stolen"] += 1
        self._spawn(self.push, tid, request.origin)
        return {"task": tid}

    # ------------------------------------------------------------ global tasks

    async def add_global(self, spec: m.TaskSpec) -> None:
        """Journaled (the caller acknowledges after this), then gossiped."""
        new = self.globals.add(spec)
        await self.journal.commit([PutKV(GLOBALS_KEY, new.to_wire())])
        self.globals = new
        self._globals_changed()

    async def remove_global(self, tid: m.TaskId) -> None:
        new = self.globals.remove(tid)
        await self.journal.commit([PutKV(GLOBALS_KEY, new.to_wire())])
        self.globals = new
        self._globals_changed()

    def _globals_changed(self) -> None:
        wire_form = self.globals.to_wire()
        if self.cluster is not None:
            try:
                self.cluster.broadcast_app(GLOBALS_KEY, wire_form)
            except ValueError as e:
                self.log.warning("globals.too_large_for_gossip", error=str(e))
            self.cluster.set_app_state({GLOBALS_KEY: wire_form})
        self._globals_kick.set()

    def _merge_globals(self, obj: Any) -> None:
        try:
            other = sh.GlobalTasks.from_wire(obj)
        except wire.WireError as e:
            self.log.warning("globals.bad_gossip", error=str(e))
            return
        merged = self.globals.merge(other)
        if merged != self.globals:
            self.globals = merged
            self.journal.enqueue([PutKV(GLOBALS_KEY, merged.to_wire())])
            if self.cluster is not None:
                self.cluster.set_app_state({GLOBALS_KEY: merged.to_wire()})
            self._globals_kick.set()

    async def _globals_loop(self) -> None:
        if self.cluster is not None:
            self.cluster.set_app_state({GLOBALS_KEY: self.globals.to_wire()})
        while True:
            # gossip and local changes kick this; the timer catches joins of the view
            with trio.move_on_after(10.0 if self.globals.members else 30.0):
                await self._globals_kick.wait()
            self._globals_kick = trio.Event()
            await self._sync_globals()

    async def _sync_globals(self) -> None:
        active = {t.id for t in self.table.active.values() if t.spec.is_global}
        finished = {t.id for t in self.table.finished.values() if t.spec.is_global}
        for tid in self.globals.members:
            if tid not in active and tid not in finished:
                cached = self.table.get_cached(tid)
                if cached is None:
                    try:
                        old = await self.table.journal.get_task(tid)
                    except Exception:
                        old = None
                    if old is not None and old.state.terminal:
                        finished.add(tid)
        has_shares = sh.cluster_has_shares(self.local_report(), self.view)
        delta = sh.global_delta(self.globals, active, finished, has_shares=has_shares)
        for spec in delta.start:
            task = m.new_task(spec, self.clock.wall(), self.node, cause="global task")
            try:
                # queued to run once written (a failed fsync after that leaves it
                # running: the global set, not this record, says it should run here)
                await self.table.add(task, on_written=self._enqueue_local)
            except Exception as e:
                self.log.error("globals.journal_failed", task=spec.id, error=str(e))
        for tid in delta.stop:
            t = self.table.active.get(tid)
            if t is None:
                continue
            if tid in self.runner.running:
                await self.runner.cancel(tid)
            elif t.state is S.QUEUED:
                try:
                    self.runner.queue.remove(tid)
                except ValueError:
                    pass
                self.ledger.remove(tid)
                await self.table.change_durably(tid, S.CANCELLED, "global task cancelled")

    # ------------------------------------------------------------ RPC: misc

    async def rpc_task(self, req: dict[str, Any], sender: m.NodeId, stream: Any) -> dict[str, Any]:
        """Look up a task record here (for `swarm status` from another agent)."""
        tid = req.get("id")
        if not m.valid_task_id(tid):
            raise wire.SchemaError("task: missing or invalid id")
        assert isinstance(tid, str)
        try:
            t = await self.table.get(tid)
        except UnknownTask:
            return {"task": None}
        return {"task": codec.task_to_wire(t)}

    async def rpc_logs(self, req: dict[str, Any], sender: m.NodeId, stream: Any) -> None:
        """Stream a local task's log to a peer (the task's home proxies it to its client)."""
        f = wire.Fields(req, "logs rpc", ignore=("v", "op", "from"))
        tid = f.task_id("id", required=True)
        which = f.str("stream", "stdout")
        follow = f.bool("follow", False)
        offset = f.int("offset", 0, lo=0)
        f.done()
        out, err = self.runner.log_paths(tid)
        path = out if which == "stdout" else err

        async def current() -> m.Task | None:
            try:
                return await self.table.get(tid)
            except UnknownTask:
                return None

        stream.timeout = math.inf
        async for part in read_log(path, offset, follow, current, self.table):
            await stream.send(part, timeout=30.0)
        return None


def changed_meaningfully(old: m.LoadReport, new: m.LoadReport) -> bool:
    """Worth a new gossip version now? Task counts, shares and GPU room always are;
    measured usage only when it moved noticeably (sampling noise is not news, and at
    rest every agent would otherwise gossip a new report every second)."""
    if (
        old.shares != new.shares
        or old.reserved_shares != new.reserved_shares
        or old.weight_sum != new.weight_sum
        or old.queued != new.queued
        or old.running != new.running
        or old.slots != new.slots
        or old.gpus != new.gpus
        or old.isolation != new.isolation
        or old.criu != new.criu
    ):
        return True
    if abs(old.cpu_util - new.cpu_util) > 0.1 or abs(old.load_per_core - new.load_per_core) > 0.1:
        return True
    if abs(old.psi_cpu - new.psi_cpu) > 5.0 or abs(old.psi_mem - new.psi_mem) > 5.0:
        return True
    total = max(new.mem_total, 1)
    return abs(old.mem_available - new.mem_available) / total > 0.05


# --------------------------------------------------------- probe wire forms


def _probe_to_wire(r: tr.ProbeRequest) -> dict[str, Any]:
    return {
        "round": r.round,
        "kind": r.kind,
        "report": codec.load_report_to_wire(r.report),
        "task_id": r.task_id,
        "needs": None if r.needs is None else tr.needs_to_wire(r.needs),
    }


def _probe_from_wire(obj: Any) -> tr.ProbeRequest:
    f = wire.Fields(obj, "probe")
    r = tr.ProbeRequest(
        round=f.int("round", required=True, lo=0),
        kind=f.str("kind", required=True, max_len=8),
        report=wire.decode_with(codec.load_report_from_wire, f.map("report", required=True)),
        task_id=f.task_id("task_id", ""),
        needs=f.nested("needs", tr.needs_from_wire),
    )
    f.done()
    return r


def _probe_reply_to_wire(r: tr.ProbeReply) -> dict[str, Any]:
    return attrs.asdict(r)


def _probe_reply_from_wire(obj: Any) -> tr.ProbeReply:
    f = wire.Fields(obj, "probe reply")
    r = tr.ProbeReply(
        round=f.int("round", required=True, lo=0),
        kind=f.str("kind", required=True, max_len=8),
        peer=f.str("peer", required=True, max_len=256),
        ok=f.bool("ok", required=True),
        reason=f.str("reason", "", max_len=4096),
        load=f.float("load", 0.0) if not _is_inf(obj, "load") else math.inf,
    )
    f.done()
    return r


def _is_inf(obj: Any, key: str) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get(key), float) and math.isinf(obj[key])
