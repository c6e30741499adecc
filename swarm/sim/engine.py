"""Deterministic discrete-event simulator of a swarm cluster, driving the real policies.

What is simulated: nodes (shares, cores, task slots, speed) running tasks under
processor sharing (k running tasks each progress at speed * min(1, cores / k); at
most `slots` run, the rest wait FIFO, so slots = cores = 1 is the M/M/1 queue), task
arrivals from a workload, a one-way network delay for every message, and stale load
information in the view the placers read.

What is *not* re-implemented: every decision calls swarm's policy code.
`policy.placement.place` picks targets (d = 1 is uniform random, d = 0 keeps a task
at its origin), `policy.placement.admit` is the target's re-check, `ShareLedger` keeps
every node's books (load index, reservations), `TransferPolicy` runs on every node
with its probes, replies, pushes and steals carried as delayed messages, and
`policy.migration.plan_migrations` decides which running tasks move (the target
re-checks with `admit` and `recheck_at_target`). Only the two
reference baselines, least-loaded-of-the-view and the omniscient join-shortest-queue,
are computed here: they are yardsticks that swarm must never use, so there is no
agent code for them.

Staleness (what the view holds): `Fresh` (every change at once), `Board` (the
bulletin board of Mitzenmacher's "How useful is old information?": all loads posted
together every T), or `GossipAge` (each node re-publishes every `period` with a random
phase and peers see it `delay` later: the calibrated age model of gossip). All nodes
read one shared view, so every placer sees the same staleness; that is the worst case
for herding (real gossip views differ per node).

Determinism: one seeded rng for the policies and the engine, a separate one inside
the workload; heap ties are broken by insertion order. Same seed, same run.

Speed: events are plain tuples on a heapq, nodes and tasks are __slots__ objects,
reports are built only when a node changed since the last one was read, gossip
publishing is batched (phases quantised to period / 100), and the view is a
`LoadView` (O(1) sampling at 10,000 nodes). Once the last task has arrived and no
task is queued anywhere, transfer rounds are skipped (nothing can move; only long
running tasks remain), so a heavy-tailed drain stays cheap.
"""

from __future__ import annotations

import heapq
import math
import random
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import attrs

from swarm.model import LoadReport, MigrateMode, NodeId, TaskSpec
from swarm.policy import migration as mig
from swarm.policy.load import Capacity, FlexState, Usage, load_index, report_load
from swarm.policy.placement import Needs, PlacementRetry, RetryPolicy, admit, place, refusal
from swarm.policy.shares import LedgerError, ShareLedger
from swarm.policy.transfer import (
    ProbeFor,
    ProbeReply,
    ProbeRequest,
    PushTask,
    QueuedTask,
    StealFrom,
    TransferConfig,
    TransferPolicy,
    TransferStats,
)
from swarm.policy.view import LoadView, PeerEntry, PeerInfo, sample_peers

from .workloads import Job, NodeSpec

# ------------------------------------------------------------------ configuration


@attrs.frozen
class Fresh:
    """Every change is in the view at once: full, fresh information."""

    def label(self) -> str:
        return "fresh"


@attrs.frozen
class Board:
    """Mitzenmacher's bulletin board: every `period`, all loads are posted at once;
    between posts the board does not change. period 0 is `Fresh`."""

    period: float

    def label(self) -> str:
        return f"board T={self.period:g}"


@attrs.frozen
class GossipAge:
    """Calibrated age model of gossip: every node re-publishes its report every
    `period` (random phase), and the view receives it `delay` later. A report's age
    when read is then uniform in [delay, delay + period]."""

    period: float
    delay: float = 0.0
    buckets: int = 100  # phases are quantised to period / buckets

    def label(self) -> str:
        return f"gossip period={self.period:g} delay={self.delay:g}"


Staleness = Fresh | Board | GossipAge


@attrs.frozen
class PowerOfD:
    """swarm's placement: `place(..., d=d)`. d = 1 is uniform random, d = 0 keeps the
    task at its origin (when origin is a node)."""

    d: int = 2

    def label(self) -> str:
        return {0: "local", 1: "random"}.get(self.d, f"d={self.d}")


@attrs.frozen
class LeastLoaded:
    """Reference baseline: the least loaded node of the (stale) view, random ties."""

    def label(self) -> str:
        return "least-loaded"


@attrs.frozen
class Jsq:
    """Reference ideal: join the node with the lowest load index *now* (omniscient)."""

    def label(self) -> str:
        return "JSQ (fresh)"


Strategy = PowerOfD | LeastLoaded | Jsq


@attrs.frozen
class MigrationSpec:
    """Migration of running tasks via `policy.migration.plan_migrations`.

    Each node plans every `interval`; a moved task is stopped for
    `state_bytes / config.default_bandwidth + pause + warmup` (its downtime) and
    resumes with the work it had left (checkpoint mode).
    """

    config: mig.MigrationConfig
    interval: float = 0.5
    state_bytes: int = 0
    pause: float = 0.05
    warmup: float = 0.0

    @property
    def downtime(self) -> float:
        return self.state_bytes / self.config.default_bandwidth + self.pause + self.warmup


FRONTEND = "frontend"
NODE = "node"


@attrs.frozen
class SimConfig:
    """One simulation run. Times are in the workload's unit (mean service time)."""

    nodes: tuple[NodeSpec, ...]
    placement: Strategy = PowerOfD(2)
    staleness: Staleness = Fresh()
    # "frontend": tasks come from a submitter that runs nothing (place sees a drained
    # local node, so exactly d peers compete); "node": each task arrives at a uniformly
    # random node, which places it with itself as a candidate (the agent's behaviour).
    origin: str = FRONTEND
    net_delay: float = 0.0  # one-way delay of every message and handoff
    transfer: TransferConfig | None = None
    transfer_cost: float = 0.0  # extra time a queued task is in flight when it moves
    probe_cpu: float = 0.0  # CPU time a node spends sending or answering one probe
    tick: float | None = None  # transfer step period per node (default: round_interval)
    migration: MigrationSpec | None = None
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    max_rounds: int = 100  # a task with no eligible node after this many backoffs: SimError
    warmup: float = 0.0  # statistics ignore tasks that arrive before this time
    levels: bool = False  # collect the time-average fraction of nodes with >= i tasks
    node_stats: bool = False  # collect per-node time-average load and reservations
    max_levels: int = 64
    scan_below: int = 64  # passed to place(): views up to this size are scanned
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("a simulation needs at least one node")
        if self.origin not in (FRONTEND, NODE):
            raise ValueError(f"origin must be {FRONTEND!r} or {NODE!r}")
        if self.net_delay < 0 or self.transfer_cost < 0 or self.probe_cpu < 0:
            raise ValueError("delays must be >= 0")


class SimError(Exception):
    """The engine found a broken invariant (a task finished twice, or never)."""


# ------------------------------------------------------------------ run state

_FREE_FLEX = FlexState(p=1.0)
_NO_USAGE = Usage()
_NO_CAPACITY = Capacity()
_FRONT_ID = "frontend"
_FRONT_REPORT = LoadReport(_FRONT_ID, 1, shares=0)  # drained: never a candidate


class SimTask:
    __slots__ = (
        "arrival",
        "arrived_at",
        "finish_vt",
        "first_start",
        "idx",
        "last_move",
        "moves",
        "needs",
        "node",
        "origin",
        "qt",
        "reserved",
        "retry",
        "spec",
        "started",
        "waited",
        "work_left",
    )

    def __init__(self, idx: int, spec: TaskSpec, arrival: float, work: float) -> None:
        self.idx = idx
        self.spec = spec
        self.arrival = arrival
        self.work_left = work
        self.arrived_at = arrival
        self.finish_vt = 0.0
        self.first_start = -1.0
        self.started = False
        self.moves = 0
        self.last_move: float | None = None
        self.needs: Needs | None = None
        self.qt: QueuedTask | None = None
        self.node: SimNode | None = None
        self.origin: SimNode | None = None
        self.retry: PlacementRetry | None = None
        self.waited = False
        self.reserved = spec.reserve_shares > 0


class SimNode:
    __slots__ = (
        "area",
        "area_at",
        "bucket",
        "busy",
        "cores",
        "hold_until",
        "id",
        "idx",
        "ledger",
        "mig_here",
        "queue",
        "rate",
        "rep",
        "repv",
        "res_area",
        "running",
        "shares",
        "slots",
        "speed",
        "touched",
        "tp",
        "ver",
        "vt",
        "vt_at",
    )

    def __init__(self, idx: int, spec: NodeSpec) -> None:
        self.idx = idx
        self.id: NodeId = f"n{idx:05d}"
        self.shares = spec.shares
        self.cores = float(spec.cores)
        self.slots = int(spec.slots)
        self.speed = float(spec.speed)
        self.ledger = ShareLedger(spec.shares)
        self.queue: deque[SimTask] = deque()
        self.running: list[SimTask] = []
        self.vt = 0.0  # work done by each running task since the epoch (virtual time)
        self.vt_at = 0.0
        self.hold_until = 0.0  # the CPU runs protocol overhead (probes) until then
        self.rate = 0.0  # per-task progress rate now
        self.ver = 0  # bumps on every reschedule; stale completion events are dropped
        self.rep: LoadReport | None = None
        self.repv = 0
        self.touched = False
        self.tp: TransferPolicy | None = None
        self.bucket: mig.TokenBucket | None = None
        self.mig_here = 0  # migrations in flight from or to this node
        self.area = 0.0  # integral of weight_sum over time (statistics)
        self.res_area = 0.0  # integral of reserved shares over time
        self.area_at = 0.0
        self.busy = 0.0  # integral of the busy fraction of its cores

    def report(self) -> LoadReport:
        """This node's fresh LoadReport (rebuilt only after a change)."""
        r = self.rep
        if r is None:
            led = self.ledger
            k = len(self.running)
            self.repv += 1
            per_core = k / self.cores
            r = LoadReport(
                self.id,
                self.repv,
                shares=led.shares,
                reserved_shares=led.reserved,
                weight_sum=led.weight_sum,
                queued=led.queued,
                running=k,
                slots=self.slots,
                cpus=self.cores,
                cpu_util=per_core if per_core < 1.0 else 1.0,
                load_per_core=per_core,
            )
            self.rep = r
        return r


@attrs.frozen
class SimResult:
    """What a run measured. Response time = completion - arrival (time units)."""

    arrivals: int
    completions: int
    measured: int  # tasks arriving after warmup (the statistics are over these)
    mean: float
    p50: float
    p99: float
    horizon: float  # simulated time at the end
    events: int
    placements: int
    refusals: int
    transfers: int
    migrations: int
    transfer_stats: TransferStats
    reserved_tasks: int
    reserved_waited: int  # reserved tasks that had to wait for shares (see _waited)
    mean_reserved: float  # mean response time of reserved tasks (nan if none)
    mean_plain: float  # ... and of the others
    node_load: tuple[float, ...]  # time-average weight_sum per node (node_stats only)
    node_reserved: tuple[float, ...]  # time-average reserved shares (node_stats only)
    node_busy: tuple[float, ...]  # time-average busy fraction per node
    levels: tuple[float, ...]  # time-average fraction of nodes with >= i tasks

    @property
    def p99_ratio(self) -> float:
        return self.p99 / self.mean if self.mean else math.nan


def quantile(xs: Sequence[float], q: float) -> float:
    """The q-quantile of sorted `xs` (nearest rank); nan when empty."""
    if not xs:
        return math.nan
    i = min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))
    return xs[i]


def _any_peer(_node: NodeId, _entry: PeerInfo) -> str | None:
    return None


def _no_acc(_n: SimNode) -> None:
    """Stands in for ClusterSim._acc when per-node statistics are off."""


# Event kinds (indices into the handler table).
(
    _ARRIVE,
    _DONE,
    _PUBLISH,
    _VIEWPUT,
    _BOARD,
    _HANDOFF,
    _REFUSED,
    _RETRY,
    _STEP,
    _PROBE,
    _REPLY,
    _STEAL,
    _MOVE,
    _MIGTICK,
    _MIGARRIVE,
    _RESET,
) = range(16)


class ClusterSim:
    """One run: build with a config and a job iterator, then `run()`.

    Useful attributes after the run: `finished` (bytearray, one count per arrival:
    every entry must be 1), `times` (response times of measured tasks).
    """

    def __init__(self, cfg: SimConfig, jobs: Iterable[Job]) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed * 7919 + 17)
        self.now = 0.0
        self.nodes = [SimNode(i, s) for i, s in enumerate(cfg.nodes)]
        self.by_id: dict[NodeId, SimNode] = {n.id: n for n in self.nodes}
        self.view = LoadView()
        self._heap: list[tuple[float, int, int, Any, Any]] = []
        self._seq = 0
        self._jobs: Iterator[Job] = iter(jobs)
        self._jobs_left = True
        self._outstanding = 0
        self._queued = 0  # tasks waiting in node queues, cluster-wide
        self._placing = 0  # tasks arrived but not yet accepted by a node
        self.finished = bytearray()
        self.times = array("d")
        self._res_flags = array("b")
        self.events = 0
        self.placements = 0
        self.refusals = 0
        self.transfers = 0
        self.migrations = 0
        self.reserved_tasks = 0
        self.reserved_waited = 0
        self._mig_cluster = 0
        self._touched: list[SimNode] = []
        self._stat_t0 = 0.0
        self._measure_from = cfg.warmup
        self._from_nodes = cfg.origin == NODE
        self._n_nodes = len(self.nodes)
        if not cfg.node_stats:
            self._acc = _no_acc  # type: ignore[method-assign,assignment]
        self._frozen_load: tuple[float, ...] = ()
        self._frozen_reserved: tuple[float, ...] = ()
        self._frozen_busy: tuple[float, ...] = ()
        self._frozen_levels: tuple[float, ...] = ()
        strat = cfg.placement
        self._d = strat.d if isinstance(strat, PowerOfD) else -1
        self._fresh = isinstance(cfg.staleness, Fresh) or (
            isinstance(cfg.staleness, Board) and cfg.staleness.period <= 0
        )
        # Supermarket statistics: ge[i] = nodes with >= i tasks, area[i] its integral.
        self._levels = cfg.levels
        nl = cfg.max_levels + 2
        self._ge = [0] * nl
        self._ge[0] = len(self.nodes)
        self._ge_area = [0.0] * nl
        self._ge_at = [0.0] * nl
        self._handlers: list[Callable[[Any, Any], None]] = [
            self._on_arrive,
            self._on_done,
            self._on_publish,
            self._on_viewput,
            self._on_board,
            self._on_handoff,
            self._on_refused,
            self._on_retry,
            self._on_step,
            self._on_probe,
            self._on_reply,
            self._on_steal,
            self._on_move,
            self._on_migtick,
            self._on_migarrive,
            self._on_reset,
        ]
        self._setup()

    # ------------------------------------------------------------------ setup

    def _push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a, b))

    def _setup(self) -> None:
        cfg = self.cfg
        rng = self.rng
        for n in self.nodes:
            self.view.put(n.id, PeerEntry(n.report(), 0.0))
        st = cfg.staleness
        if isinstance(st, Board) and st.period > 0:
            self._push(st.period, _BOARD)
        elif isinstance(st, GossipAge):
            if st.period <= 0:
                raise ValueError("gossip period must be > 0")
            # Phases are quantised to period / buckets: one event publishes a bucket,
            # so 10,000 nodes cost 100 heap entries per period instead of 10,000.
            nb = max(1, min(len(self.nodes), st.buckets))
            self._wheel: list[list[SimNode]] = [[] for _ in range(nb)]
            for n in self.nodes:
                self._wheel[rng.randrange(nb)].append(n)
            self._push(rng.random() * st.period / nb, _PUBLISH, 0)
        if cfg.transfer is not None:
            tick = cfg.tick if cfg.tick is not None else cfg.transfer.round_interval
            if tick <= 0:
                raise ValueError("transfer tick must be > 0")
            for n in self.nodes:
                n.tp = TransferPolicy(n.id, cfg.transfer)
                self._push(rng.random() * tick, _STEP, n, tick)
        if cfg.migration is not None:
            ms = cfg.migration
            for n in self.nodes:
                n.bucket = ms.config.new_bucket(0.0)
                self._push(rng.random() * ms.interval, _MIGTICK, n)
        if cfg.warmup > 0:
            self._push(cfg.warmup, _RESET)
        self._next_arrival()

    def _next_arrival(self) -> None:
        job = next(self._jobs, None)
        if job is None:
            self._jobs_left = False
            self._freeze()
            return
        self._push(max(job.t, self.now), _ARRIVE, job)

    # ------------------------------------------------------------------ running

    def run(self, until: float = math.inf) -> SimResult:
        """Run until every task has finished (or simulated time `until`)."""
        heap = self._heap
        pop = heapq.heappop
        handlers = self._handlers
        touched = self._touched
        while heap:
            if not self._jobs_left and self._outstanding == 0:
                break
            if heap[0][0] > until:
                break
            t, _, kind, a, b = pop(heap)
            self.now = t
            self.events += 1
            handlers[kind](a, b)
            if touched:
                self._flush()
        if until == math.inf and (self._jobs_left or self._outstanding):
            raise SimError(f"run ended with {self._outstanding} tasks unfinished")
        return self._result()

    def _flush(self) -> None:
        """End of an event in Fresh mode: post the reports of the nodes it changed."""
        now = self.now
        view = self.view
        for n in self._touched:
            n.touched = False
            view.put(n.id, PeerEntry(n.report(), now))
        self._touched.clear()

    def _touch(self, n: SimNode) -> None:
        n.rep = None
        if self._fresh and not n.touched:
            n.touched = True
            self._touched.append(n)

    # ------------------------------------------------------------------ staleness

    def _view_unread(self) -> bool:
        """True once nothing can read the view any more: every task has arrived and
        been placed, nothing is queued for transfer to move, and migration is off.
        Publishing then changes no decision, so a long drain skips it."""
        return (
            not self._jobs_left
            and self._placing == 0
            and self.cfg.migration is None
            and (self.cfg.transfer is None or self._queued == 0)
        )

    def _on_publish(self, b: int, _: Any) -> None:
        st = self.cfg.staleness
        assert isinstance(st, GossipAge)
        wheel = self._wheel
        now = self.now
        if self._view_unread():
            pass
        elif st.delay > 0:
            batch = [(n.id, n.report()) for n in wheel[b]]
            self._push(now + st.delay, _VIEWPUT, batch)
        else:
            put = self.view.put
            for n in wheel[b]:
                put(n.id, PeerEntry(n.report(), now))
        self._push(now + st.period / len(wheel), _PUBLISH, (b + 1) % len(wheel))

    def _on_viewput(self, batch: list[tuple[NodeId, LoadReport]], _: Any) -> None:
        put = self.view.put
        now = self.now
        for nid, r in batch:
            put(nid, PeerEntry(r, now))

    def _on_board(self, _a: Any, _b: Any) -> None:
        st = self.cfg.staleness
        assert isinstance(st, Board)
        now = self.now
        view = self.view
        for n in self.nodes:
            view.put(n.id, PeerEntry(n.report(), now))
        self._push(now + st.period, _BOARD)

    # ------------------------------------------------------------------ arrivals

    def _on_arrive(self, job: Job, _: Any) -> None:
        now = self.now
        self._next_arrival()
        idx = len(self.finished)
        self.finished.append(0)
        self._outstanding += 1
        spec = TaskSpec(
            id=f"t{idx}",
            argv=(),
            weight=job.weight,
            reserve_shares=job.reserve,
            submitted_at=now,
        )
        task = SimTask(idx, spec, now, job.work)
        self._placing += 1
        if task.reserved and now >= self._measure_from:
            self.reserved_tasks += 1
        if self._from_nodes:
            task.origin = self.nodes[self.rng.randrange(self._n_nodes)]
        self._place(task)

    def _place(self, task: SimTask) -> None:
        now = self.now
        self.placements += 1
        origin = task.origin
        exclude = task.retry.exclude if task.retry is not None else frozenset()
        target: SimNode | None
        d = self._d
        if d >= 0:
            local = origin.report() if origin is not None else _FRONT_REPORT
            p = place(
                task.spec,
                local,
                self.view,
                self.rng,
                now,
                d=d,
                exclude=exclude,
                scan_below=self.cfg.scan_below,
            )
            target = None if p.target is None else self.by_id[p.target]
        elif isinstance(self.cfg.placement, LeastLoaded):
            target = self._least_loaded(task, exclude)
        else:
            target = self._jsq(task, exclude)
        if target is None:
            retry = task.retry or PlacementRetry()
            if retry.rounds >= self.cfg.max_rounds:
                raise SimError(
                    f"task {task.spec.id} found no eligible node in {retry.rounds} rounds"
                )
            task.retry = retry.on_no_target(now, self.cfg.retry, self.rng)
            self._waited(task)
            self._push(task.retry.not_before, _RETRY, task)
            return
        if target is origin or self.cfg.net_delay <= 0:
            self._on_handoff(task, target)
        else:
            self._push(now + self.cfg.net_delay, _HANDOFF, task, target)

    def _least_loaded(self, task: SimTask, exclude: frozenset[NodeId]) -> SimNode | None:
        needs = task.needs or Needs.of(task.spec)
        task.needs = needs
        best = math.inf
        ties: list[NodeId] = []
        view = self.view
        for nid in view:
            if nid in exclude:
                continue
            r = view[nid].report
            if refusal(r, needs) is not None:
                continue
            x = report_load(r)
            if x < best:
                best = x
                ties = [nid]
            elif x == best:
                ties.append(nid)
        if not ties:
            return None
        return self.by_id[ties[0] if len(ties) == 1 else self.rng.choice(ties)]

    def _jsq(self, task: SimTask, exclude: frozenset[NodeId]) -> SimNode | None:
        best = math.inf
        ties: list[SimNode] = []
        spec = task.spec
        for n in self.nodes:
            led = n.ledger
            if n.id in exclude or led.refuse_new(spec) is not None:
                continue
            x = load_index(led.weight_sum, led.shares, led.reserved)
            if x < best:
                best = x
                ties = [n]
            elif x == best:
                ties.append(n)
        if not ties:
            return None
        return ties[0] if len(ties) == 1 else self.rng.choice(ties)

    def _on_handoff(self, task: SimTask, target: SimNode) -> None:
        """The placed task reaches its target, which re-checks on fresh state."""
        adm = admit(task.spec, target.ledger, _FREE_FLEX, _NO_USAGE, _NO_CAPACITY)
        if adm.ok:
            task.retry = None
            self._placing -= 1
            self._enqueue(target, task)
            return
        self.refusals += 1
        self._waited(task)
        delay = self.cfg.net_delay if target is not task.origin else 0.0
        if delay > 0:
            self._push(self.now + delay, _REFUSED, task, target)
        else:
            self._on_refused(task, target)

    def _on_refused(self, task: SimTask, target: SimNode) -> None:
        retry = task.retry or PlacementRetry()
        task.retry = retry.on_refusal(target.id, self.now, self.cfg.retry, self.rng)
        if task.retry.ready(self.now):
            self._place(task)
        else:
            self._push(task.retry.not_before, _RETRY, task)

    def _on_retry(self, task: SimTask, _: Any) -> None:
        self._place(task)

    def _waited(self, t: SimTask) -> None:
        """A reserved task had to wait for shares: no node had room, its target refused
        it, or it was passed over at start with a slot free. Counted once per task."""
        if t.reserved and not t.waited:
            t.waited = True
            if t.arrival >= self._measure_from:
                self.reserved_waited += 1

    # ------------------------------------------------------------------ node books

    def _acc(self, n: SimNode) -> None:
        now = self.now
        dt = now - n.area_at
        if dt > 0:
            n.area += n.ledger.weight_sum * dt
            n.res_area += n.ledger.reserved * dt
        n.area_at = now

    def _level(self, n: SimNode, before: int, after: int) -> None:
        lvl = max(before, after)
        if lvl >= len(self._ge):
            return
        now = self.now
        self._ge_area[lvl] += self._ge[lvl] * (now - self._ge_at[lvl])
        self._ge_at[lvl] = now
        self._ge[lvl] += 1 if after > before else -1

    def _enqueue(
        self, n: SimNode, task: SimTask, *, front: bool = False, in_ledger: bool = False
    ) -> None:
        if not in_ledger:
            self._acc(n)
            n.ledger.add(task.spec)
            if self._levels:
                k = len(n.ledger)
                self._level(n, k - 1, k)
        task.node = n
        task.arrived_at = self.now
        task.qt = None
        self._queued += 1
        if front:
            n.queue.appendleft(task)
        else:
            n.queue.append(task)
        self._touch(n)
        self._try_start(n)

    def _unqueue(self, n: SimNode, task: SimTask) -> None:
        """Take a queued task off node n (it moves away)."""
        n.queue.remove(task)
        self._queued -= 1
        self._acc(n)
        n.ledger.remove(task.spec.id)
        if self._levels:
            k = len(n.ledger)
            self._level(n, k + 1, k)
        task.node = None
        self._touch(n)

    def _advance(self, n: SimNode) -> None:
        now = self.now
        # Tasks make no progress while the CPU is held by protocol overhead.
        dt = now - (n.vt_at if n.vt_at >= n.hold_until else n.hold_until)
        if dt > 0 and n.running:
            n.vt += dt * n.rate
            k = len(n.running)
            n.busy += dt * (k / n.cores if k < n.cores else 1.0)
        n.vt_at = now

    def _reschedule(self, n: SimNode) -> None:
        n.ver += 1
        running = n.running
        k = len(running)
        if k == 0:
            n.rate = 0.0
            return
        rate = n.speed if k <= n.cores else n.speed * n.cores / k
        n.rate = rate
        fmin = min(t.finish_vt for t in running)
        dt = (fmin - n.vt) / rate
        start = self.now if self.now >= n.hold_until else n.hold_until
        self._push(start + (dt if dt > 0 else 0.0), _DONE, n, n.ver)

    def _try_start(self, n: SimNode, changed: bool = False) -> None:
        """Start queued tasks while slots are free: FIFO, but a task whose reservation
        does not fit the free shares now is passed over (and counted as waiting)."""
        queue = n.queue
        running = n.running
        led = n.ledger
        if queue and len(running) < n.slots:
            self._acc(n)  # a start may change the reserved shares
        while queue and len(running) < n.slots:
            pick: SimTask | None = None
            for t in queue:
                try:
                    led.start(t.spec.id)  # the ledger's own rule (refuse_start)
                except LedgerError:
                    self._waited(t)
                    continue
                pick = t
                break
            if pick is None:
                break
            if queue[0] is pick:
                queue.popleft()
            else:
                queue.remove(pick)
            self._queued -= 1
            if not changed:
                self._advance(n)
                changed = True
            pick.finish_vt = n.vt + pick.work_left
            if not pick.started:
                pick.started = True
                pick.first_start = self.now
            running.append(pick)
        if changed:
            self._touch(n)
            self._reschedule(n)

    def _on_done(self, n: SimNode, ver: int) -> None:
        if ver != n.ver:
            return
        self._advance(n)
        vt = n.vt + 1e-9 * (1.0 + abs(n.vt))
        running = n.running
        done = [t for t in running if t.finish_vt <= vt]
        if not done:  # rounding: not quite there yet
            self._reschedule(n)
            return
        self._acc(n)
        led = n.ledger
        now = self.now
        for t in done:
            running.remove(t)
            led.remove(t.spec.id)
            if self._levels:
                k = len(led)
                self._level(n, k + 1, k)
            self._finish(t, now)
        self._touch(n)
        self._try_start(n, changed=True)

    def _finish(self, t: SimTask, now: float) -> None:
        i = t.idx
        if self.finished[i]:
            raise SimError(f"task {t.spec.id} finished twice")
        self.finished[i] = 1
        self._outstanding -= 1
        t.node = None
        if t.arrival >= self._measure_from:
            self.times.append(now - t.arrival)
            self._res_flags.append(1 if t.reserved else 0)

    def _on_reset(self, _a: Any, _b: Any) -> None:
        """End of warm-up: restart the time-average statistics."""
        now = self.now
        for n in self.nodes:
            self._advance(n)
            n.area = 0.0
            n.res_area = 0.0
            n.area_at = now
            n.busy = 0.0
        for i in range(len(self._ge)):
            self._ge_area[i] = 0.0
            self._ge_at[i] = now
        self._stat_t0 = now

    # ------------------------------------------------------------------ transfer

    def _qts(self, n: SimNode) -> list[QueuedTask]:
        out = []
        for t in n.queue:
            q = t.qt
            if q is None:
                needs = t.needs
                if needs is None:
                    needs = t.needs = Needs.of(t.spec)
                q = t.qt = QueuedTask(t.spec.id, needs, t.arrival, t.arrived_at)
            out.append(q)
        return out

    def _on_step(self, n: SimNode, tick: float) -> None:
        tp = n.tp
        assert tp is not None
        now = self.now
        if not self._jobs_left and self._queued == 0:
            # Drain: no arrivals are left and nothing is queued anywhere, so there is
            # nothing to move; only long running tasks remain. Skipping the rounds
            # keeps a heavy-tailed drain from costing more than the run itself.
            self._push(now + tick, _STEP, n, tick)
            return
        acts = tp.step(now, n.report(), self._qts(n), self.view, self.rng)
        for a in acts:
            self._act(n, a)
        self._push(now + tick, _STEP, n, tick)

    def _charge(self, n: SimNode) -> None:
        """Protocol overhead: the node's CPU runs a probe for `probe_cpu` first."""
        cost = self.cfg.probe_cpu
        if cost <= 0:
            return
        self._advance(n)
        n.hold_until = (self.now if self.now >= n.hold_until else n.hold_until) + cost
        if n.running:
            self._reschedule(n)

    def _act(self, n: SimNode, a: ProbeFor | PushTask | StealFrom) -> None:
        delay = self.cfg.net_delay
        now = self.now
        if isinstance(a, ProbeFor):
            self._charge(n)
            self._push(now + delay, _PROBE, (n, a.request), self.by_id[a.peer])
        elif isinstance(a, PushTask):
            task = self._find_queued(n, a.task_id)
            if task is None:
                return  # it started meanwhile: nothing to move
            self._unqueue(n, task)
            self._push(now + delay + self.cfg.transfer_cost, _MOVE, task, (n, self.by_id[a.peer]))
        else:
            self._push(now + delay, _STEAL, (n, a.request), self.by_id[a.peer])

    @staticmethod
    def _find_queued(n: SimNode, task_id: str) -> SimTask | None:
        for t in n.queue:
            if t.spec.id == task_id:
                return t
        return None

    def _on_probe(self, msg: tuple[SimNode, ProbeRequest], peer: SimNode) -> None:
        src, req = msg
        tp = peer.tp
        assert tp is not None
        self._charge(peer)
        reply = tp.on_probe(self.now, req, peer.report(), self._qts(peer))
        self._push(self.now + self.cfg.net_delay, _REPLY, src, reply)

    def _on_reply(self, src: SimNode, reply: ProbeReply) -> None:
        tp = src.tp
        assert tp is not None
        for a in tp.on_probe_reply(self.now, reply, src.report(), self._qts(src)):
            self._act(src, a)

    def _on_steal(self, msg: tuple[SimNode, ProbeRequest], peer: SimNode) -> None:
        thief, req = msg
        tp = peer.tp
        assert tp is not None
        self._charge(peer)
        tid = tp.on_steal(self.now, req, peer.report(), self._qts(peer))
        if tid is None:
            return
        task = self._find_queued(peer, tid)
        if task is None:
            return
        self._unqueue(peer, task)
        self._push(
            self.now + self.cfg.net_delay + self.cfg.transfer_cost, _MOVE, task, (peer, thief)
        )

    def _on_move(self, task: SimTask, ends: tuple[SimNode, SimNode]) -> None:
        giver, taker = ends
        adm = admit(task.spec, taker.ledger, _FREE_FLEX, _NO_USAGE, _NO_CAPACITY)
        if adm.ok:
            self.transfers += 1
            self._enqueue(taker, task)
        else:  # the handoff aborts: the task stays with the giver
            self.refusals += 1
            self._enqueue(giver, task)

    # ------------------------------------------------------------------ migration

    def _on_migtick(self, n: SimNode, _: Any) -> None:
        ms = self.cfg.migration
        assert ms is not None and n.bucket is not None
        now = self.now
        self._push(now + ms.interval, _MIGTICK, n)
        if not n.running:
            return
        cfg = ms.config
        local = n.report()
        # Exact shortcut: gain = remaining * (slowdown here - slowdown there) and the
        # target's slowdown is >= 1, so nothing can be worth moving from a node whose
        # own slowdown (computed by the policy's function) is 1.
        if cfg.slowdown(local, 0) <= 1.0:
            return
        tasks = [
            mig.RunningTask(
                t.spec.id,
                MigrateMode.CHECKPOINT,
                age=now - t.first_start,
                state_bytes=ms.state_bytes,
                pause=ms.pause,
                warmup=ms.warmup,
                moves=t.moves,
                last_move_at=t.last_move,
            )
            for t in n.running
        ]
        view = self.view
        sample = sample_peers(view, 2, self.rng, _any_peer, skip=n.id)
        cands = []
        by_node = {}
        for p in sample.chosen:
            e = view[p]
            cands.append(mig.Candidate(p, e.report, now - e.received_at))
            by_node[p] = self.by_id[p].mig_here
        plan = mig.plan_migrations(
            tasks,
            local,
            cands,
            now=now,
            bucket=n.bucket,
            config=cfg,
            in_flight=mig.InFlight(here=n.mig_here, cluster=self._mig_cluster, by_node=by_node),
        )
        n.bucket = plan.bucket
        by_id = {rt.task_id: rt for rt in tasks}
        for dec in plan.start:
            if dec.target is not None:
                self._migrate(n, by_id[dec.task_id], self.by_id[dec.target], ms)

    def _migrate(self, src: SimNode, rt: mig.RunningTask, dst: SimNode, ms: MigrationSpec) -> None:
        """The target re-checks on its fresh state, as the agent's migrator does:
        `admit` (shares) then `recheck_at_target` (still worth it, in-flight limit).
        A refusal leaves the task running where it is."""
        task_id = rt.task_id
        task = next((t for t in src.running if t.spec.id == task_id), None)
        if task is None:
            return
        cfg = ms.config
        refused = not admit(task.spec, dst.ledger, _FREE_FLEX, _NO_USAGE, _NO_CAPACITY).ok or (
            mig.recheck_at_target(
                rt,
                src.report(),
                dst.report(),
                config=cfg,
                bandwidth=cfg.default_bandwidth,
                incoming=dst.mig_here,
            )
            is not None
        )
        if refused:
            self.refusals += 1
            return
        self._advance(src)
        task.work_left = max(0.0, task.finish_vt - src.vt)
        src.running.remove(task)
        self._acc(src)
        src.ledger.remove(task_id)
        if self._levels:
            k = len(src.ledger)
            self._level(src, k + 1, k)
        self._touch(src)
        self._try_start(src, changed=True)
        self._acc(dst)
        dst.ledger.add(task.spec)  # held for it while it is in flight
        if self._levels:
            k = len(dst.ledger)
            self._level(dst, k - 1, k)
        self._touch(dst)
        task.node = dst
        task.moves += 1
        src.mig_here += 1
        dst.mig_here += 1
        self._mig_cluster += 1
        self.migrations += 1
        self._push(self.now + ms.downtime, _MIGARRIVE, task, src)

    def _on_migarrive(self, task: SimTask, src: SimNode) -> None:
        dst = task.node
        assert dst is not None
        src.mig_here -= 1
        dst.mig_here -= 1
        self._mig_cluster -= 1
        task.last_move = self.now
        self._enqueue(dst, task, front=True, in_ledger=True)

    # ------------------------------------------------------------------ results

    def _freeze(self) -> None:
        """The last task has arrived: close the time averages here, so that the
        drain (arrivals stopped, queues emptying) does not dilute them. Response
        times still count every measured task, whenever it finishes."""
        now = self.now
        for n in self.nodes:
            self._advance(n)
            self._acc(n)
        span = max(now - self._stat_t0, 1e-12)
        self._frozen_load = tuple(n.area / span for n in self.nodes)
        self._frozen_reserved = tuple(n.res_area / span for n in self.nodes)
        self._frozen_busy = tuple(n.busy / span for n in self.nodes)
        levels: list[float] = []
        if self._levels:
            nn = len(self.nodes)
            for i in range(len(self._ge)):
                area = self._ge_area[i] + self._ge[i] * (now - self._ge_at[i])
                levels.append(area / span / nn)
            while len(levels) > 1 and levels[-1] == 0.0:
                levels.pop()
        self._frozen_levels = tuple(levels)

    def _result(self) -> SimResult:
        if self._jobs_left:  # stopped early (`until`): close the averages now
            self._freeze()
        times = sorted(self.times)
        flags = self._res_flags
        res = [x for x, f in zip(self.times, flags, strict=True) if f]
        plain = [x for x, f in zip(self.times, flags, strict=True) if not f]
        stats = TransferStats()
        for n in self.nodes:
            if n.tp is not None:
                s = n.tp.stats
                stats = TransferStats(
                    rounds=stats.rounds + s.rounds,
                    probes=stats.probes + s.probes,
                    pushes=stats.pushes + s.pushes,
                    steals=stats.steals + s.steals,
                    refused_probes=stats.refused_probes + s.refused_probes,
                    timeouts=stats.timeouts + s.timeouts,
                )
        return SimResult(
            arrivals=len(self.finished),
            completions=sum(self.finished),
            measured=len(times),
            mean=sum(times) / len(times) if times else math.nan,
            p50=quantile(times, 0.5),
            p99=quantile(times, 0.99),
            horizon=self.now,
            events=self.events,
            placements=self.placements,
            refusals=self.refusals,
            transfers=self.transfers,
            migrations=self.migrations,
            transfer_stats=stats,
            reserved_tasks=self.reserved_tasks,
            reserved_waited=self.reserved_waited,
            mean_reserved=sum(res) / len(res) if res else math.nan,
            mean_plain=sum(plain) / len(plain) if plain else math.nan,
            node_load=self._frozen_load,
            node_reserved=self._frozen_reserved,
            node_busy=self._frozen_busy,
            levels=self._frozen_levels,
        )


def simulate(cfg: SimConfig, jobs: Iterable[Job], *, until: float = math.inf) -> SimResult:
    """Build a `ClusterSim` for `cfg` and run it to the end."""
    return ClusterSim(cfg, jobs).run(until)
