"""Fair share and elastic quotas without a leader, against a central DRF scheduler.

Issue 20's simulator experiment. Several users with skewed demand and diurnal arrivals
share a cluster of `nodes` nodes that each run `slots` tasks at once. The same trace
is run twice:

- *swarm* (distributed): a task is placed on the less loaded of two random nodes
  (queued + running, read fresh) and stays there. Each node orders its own queue with
  `node.runqueue.order` (priority, then the user's dominant share of decayed
  cluster-wide usage, then arrival) on a **stale** view of usage, and gates the tasks
  of a capped group with `node.runqueue.quota_refusal` on **stale** per-node group
  demand: the agent's own functions, called as the node calls them.
- *central* (the yardstick): one omniscient scheduler over one pool of all slots,
  fresh usage, the cap enforced exactly; each start is `policy.fairness.drf_schedule`
  over the head of every user's queue (the lowest weighted dominant share first).

Staleness. Every node publishes its report every `report_interval` (a random phase
per node, in `bins` phases) and the others see it `delay` later (the dissemination
time; `default_delay(n)` is what swarm's real SWIM core measured at the LAN timers,
see `DISSEMINATION`). The cluster usage a node orders by is the cluster total as of
the last report tick at or before `now - delay` (age uniform in [delay, delay +
report_interval], as `engine.GossipAge`); its own group demand is fresh, the others'
is what their last visible report said. `fresh=True` makes every view exact.

`quota_refusal` reads the others' group rows per node, as the agent hands them over
(a node holding none of the group's work has no row). A node whose queue is blocked
by the quota tries again at its next report tick (once per report interval) and
whenever a task finishes or arrives there; a retry whose inputs (the rows it sees,
its own counts) have not changed since the last refusal is skipped, since the
decision is a function of them.

Time is in units of the mean service time S = one minute (`SECOND` = 1/60); the day
is compressed to `day` units, and the fair-share half-life is one such day (the
agent's default is one day).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Sequence

import attrs

from swarm import model as m
from swarm.node import runqueue as rq
from swarm.policy import fairness as fair
from swarm.policy import quota as qu
from swarm.policy.sharing import Group, Sharing

SECOND = 1.0 / 60.0  # the time unit is the mean service time, one minute
GIB = 1 << 30

# Dissemination delay of a load report at the LAN timers (gossip every 0.2 s to 3
# peers, a report a second), in seconds: the mean age of a peer's report less half the
# report interval, measured on swarm's real membership core by
# `sim.calibrate.measure_load_age(n, seed=1, duration=20, warmup=8, observers=5)`
# (50 to 200 nodes: docs/experiments/gossip_age.csv). At 1,000 nodes 14 % of
# (observer, peer) pairs had no report yet after 20 s: the figure is a lower bound.
DISSEMINATION: tuple[tuple[int, float], ...] = (
    (50, 1.37),
    (100, 1.67),
    (200, 2.96),
    (300, 4.04),
    (1000, 7.98),
)


def default_delay(n: int) -> float:
    """The dissemination delay at the default timers for `n` nodes, in seconds:
    `DISSEMINATION` interpolated on log n (held flat outside the measured range)."""
    pts = DISSEMINATION
    if n <= pts[0][0]:
        return pts[0][1]
    for (n0, d0), (n1, d1) in itertools.pairwise(pts):
        if n <= n1:
            f = (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))
            return d0 + f * (d1 - d0)
    return pts[-1][1]


@attrs.frozen
class UserSpec:
    name: str
    group: str
    demand: float  # relative share of the offered load
    cpu: float  # cores per task
    mem_gib: float  # per task
    phase: float  # diurnal phase, in days


# Zipf-skewed demand (1, 1/2, ... 1/6); CPU-heavy, memory-heavy and small tasks, so
# that users' dominant resources differ; two time zones a quarter of a day apart.
USERS: tuple[UserSpec, ...] = (
    UserSpec("alice", "batch", 1.0, 1.0, 2.0, 0.0),
    UserSpec("bob", "research", 1 / 2, 3.0, 2.0, 0.25),
    UserSpec("carol", "research", 1 / 3, 1.0, 12.0, 0.0),
    UserSpec("dave", "research", 1 / 4, 1.0, 2.0, 0.25),
    UserSpec("erin", "research", 1 / 5, 3.0, 2.0, 0.0),
    UserSpec("frank", "research", 1 / 6, 1.0, 12.0, 0.25),
)


@attrs.frozen
class FairSimConfig:
    nodes: int = 100
    slots: int = 4
    cpus: float = 8.0  # per node (accounting only: a node runs `slots` tasks)
    mem_gib: float = 32.0
    users: tuple[UserSpec, ...] = USERS
    load: float = 0.85  # mean offered load / all slots
    amplitude: float = 0.6  # diurnal: rate x (1 + amplitude sin(2 pi (t/day - phase)))
    day: float = 24.0  # units of S
    warmup: float = 2.0  # not measured
    capped_group: str = "batch"
    cap_fraction: float | None = 0.3  # the capped group's quota-max / all slots; None: no cap
    quota_floor: float = 0.0  # the agent's default
    report_interval: float = SECOND  # the agent's default: a report a second
    delay: float = default_delay(100) * SECOND
    fresh: bool = False  # every view exact and instant (no gossip at all)
    bins: int = 8  # report phases per interval
    # the agent publishes a changed report at once, at most every `publish_gap`
    # (runtime/driver.py: min(0.25 s, report-interval)); False: only at its tick
    publish_on_change: bool = True
    publish_gap: float = 0.25 * SECOND
    quota_lag: float = 2.0 * SECOND  # the agent's default (quota-lag)
    sample_every: float = 0.1
    seed: int = 1

    @property
    def horizon(self) -> float:
        return self.warmup + self.day

    @property
    def cap(self) -> float:
        if self.cap_fraction is None:
            return math.inf
        return self.cap_fraction * self.nodes * self.slots

    def sharing(self) -> Sharing:
        names = sorted({u.group for u in self.users})
        groups = tuple(
            Group(
                g,
                quota_max=self.cap if g == self.capped_group and math.isfinite(self.cap) else None,
            )
            for g in names
        )
        return Sharing(
            groups=groups,
            half_life=self.day,
            quota_floor=self.quota_floor,
            quota_lag=self.quota_lag,
        )


@attrs.frozen
class Arrival:
    at: float
    user: int
    service: float


def trace(cfg: FairSimConfig) -> list[Arrival]:
    """The arrivals (non-homogeneous Poisson by thinning) and service times
    (exponential, mean 1): a function of the seed and the workload only, so both
    schedulers see the same trace."""
    rng = random.Random(cfg.seed * 7919 + 13)
    total = sum(u.demand for u in cfg.users)
    out: list[Arrival] = []
    for ui, u in enumerate(cfg.users):
        base = cfg.load * cfg.nodes * cfg.slots * u.demand / total
        peak = base * (1.0 + cfg.amplitude)
        t = 0.0
        while True:
            t += rng.expovariate(peak)
            if t >= cfg.horizon:
                break
            rate = base * (1.0 + cfg.amplitude * math.sin(2 * math.pi * (t / cfg.day - u.phase)))
            if rng.random() * peak < rate:
                out.append(Arrival(t, ui, rng.expovariate(1.0)))
    out.sort(key=lambda a: (a.at, a.user))
    return out


@attrs.frozen
class FairResult:
    scheduler: str
    jain: float  # time average over the measured window (of allocation / DRF share)
    jain_raw: float  # ... of the dominant shares themselves, not normalised
    series: tuple[tuple[float, float], ...]  # (time, Jain's index) samples
    mean_response: float  # tasks arriving in the window (all run to completion)
    tasks: int
    utilisation: float  # busy slot-time / slot-time, measured window
    cap: float
    overshoot_peak: float  # max (group running - cap) / cap at any start, >= 0
    overshoot_mean: float  # time-averaged max(0, running - cap) / cap (samples)
    cap_use: float  # time-averaged running / cap of the capped group (nan: no cap)
    share_by_user: tuple[float, ...]  # time-averaged dominant share of the allocation


def drf_allocation(
    wants: Sequence[int],
    per_task: Sequence[float],
    capped: Sequence[bool],
    slots: float,
    cap: float,
) -> list[float]:
    """What DRF (max-min fairness of dominant shares, by progressive filling) gives
    each user, in tasks (fractional), when user u wants `wants[u]` tasks of dominant
    share `per_task[u]` each, the cluster has `slots` slots and the users marked
    `capped` may run `cap` in all between them. Users who want nothing get 0."""

    def take(level: float, users: Sequence[int]) -> dict[int, float]:
        return {u: min(float(wants[u]), level / per_task[u]) for u in users}

    def level_for(users: Sequence[int], room: float) -> float:
        """The share level at which `users` hold `room` tasks (inf: they never do)."""
        if sum(wants[u] for u in users) <= room:
            return math.inf
        lo, hi = 0.0, max(wants[u] * per_task[u] for u in users)
        for _ in range(60):
            mid = (lo + hi) / 2
            if sum(take(mid, users).values()) < room:
                lo = mid
            else:
                hi = mid
        return hi

    active = [u for u, w in enumerate(wants) if w > 0 and per_task[u] > 0]
    group = [u for u in active if capped[u]]
    inner = level_for(group, cap) if group else math.inf  # where the group hits its cap

    def alloc(level: float) -> dict[int, float]:
        out = take(level, [u for u in active if not capped[u]])
        out.update(take(min(level, inner), group))
        return out

    if sum(alloc(math.inf).values()) <= slots:
        level = math.inf
    else:
        lo, hi = 0.0, max(wants[u] * per_task[u] for u in active)
        for _ in range(60):
            mid = (lo + hi) / 2
            if sum(alloc(mid).values()) < slots:
                lo = mid
            else:
                hi = mid
        level = hi
    got = alloc(level)
    return [got.get(u, 0.0) for u in range(len(wants))]


ARRIVE, FINISH, TICK, APPLY, SAMPLE, PUBLISH = range(6)


class _Common:
    """What both schedulers share: the trace, the specs, usage accounting, sampling."""

    def __init__(self, cfg: FairSimConfig, arrivals: Sequence[Arrival]) -> None:
        self.cfg = cfg
        self.arrivals = arrivals
        self.sharing = cfg.sharing()
        self.weights = self.sharing.weights()
        self.hl = self.sharing.half_life
        reports = [
            m.LoadReport(
                f"n{j}",
                1,
                slots=cfg.slots,
                cpus=cfg.cpus,
                mem_total=int(cfg.mem_gib * GIB),
            )
            for j in range(cfg.nodes)
        ]
        self.capacity = rq.capacity(reports)
        self.specs = [
            m.TaskSpec(
                id=f"t{i}",
                argv=("sim",),
                user=cfg.users[a.user].name,
                group=cfg.users[a.user].group,
                cpu=cfg.users[a.user].cpu,
                mem=int(cfg.users[a.user].mem_gib * GIB),
            )
            for i, a in enumerate(arrivals)
        ]
        self.index = {s.id: i for i, s in enumerate(self.specs)}
        nu = len(cfg.users)
        self.udemand = [
            rq.demand(m.TaskSpec(id="x", argv=("sim",), cpu=u.cpu, mem=int(u.mem_gib * GIB)))
            for u in cfg.users
        ]
        self.running_u = [0] * nu
        self.queued_u = [0] * nu
        self.used = [fair.Decayed() for _ in range(nu)]
        self.last = [0.0] * nu
        self.group_running = 0
        self.capped = math.isfinite(cfg.cap)
        self.finish_at = [math.nan] * len(arrivals)
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.busy = 0  # slots busy
        self.busy_integral = 0.0
        self.busy_since = 0.0
        self.samples: list[tuple[float, float]] = []
        self.raw: list[float] = []
        self.use: list[float] = []  # the capped group's running / cap, sampled
        self.share_sum = [0.0] * nu
        self.excess: list[float] = []
        self.peak = 0.0

    # -------------------------------------------------------------- events

    def push(self, at: float, kind: int, payload: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, kind, payload))

    def is_capped(self, i: int) -> bool:
        return self.capped and self.specs[i].group == self.cfg.capped_group

    # -------------------------------------------------------------- usage

    def accrue(self, u: int, now: float) -> None:
        dt = now - self.last[u]
        if dt > 0 and self.running_u[u]:
            self.used[u] = self.used[u].plus(
                self.udemand[u].scaled(self.running_u[u] * dt), now, self.hl
            )
        self.last[u] = now

    def usage_now(self, now: float) -> dict[fair.Principal, fair.Resources]:
        out = {}
        for u, us in enumerate(self.cfg.users):
            self.accrue(u, now)
            out[us.name] = self.used[u].at_time(now, self.hl)
        return out

    def _busy(self, now: float, delta: int) -> None:
        lo, hi = self.cfg.warmup, self.cfg.horizon
        a, b = max(self.busy_since, lo), min(now, hi)
        if b > a:
            self.busy_integral += self.busy * (b - a)
        self.busy_since = now
        self.busy += delta

    def started(self, i: int, now: float) -> None:
        u = self.arrivals[i].user
        self.accrue(u, now)
        self.running_u[u] += 1
        self.queued_u[u] -= 1
        self._busy(now, 1)
        if self.is_capped(i):
            self.group_running += 1
            if self.cfg.warmup <= now <= self.cfg.horizon:
                self.peak = max(self.peak, (self.group_running - self.cfg.cap) / self.cfg.cap)
        self.push(now + self.arrivals[i].service, FINISH, i)

    def finished(self, i: int, now: float) -> None:
        u = self.arrivals[i].user
        self.accrue(u, now)
        self.running_u[u] -= 1
        self._busy(now, -1)
        if self.is_capped(i):
            self.group_running -= 1
        self.finish_at[i] = now

    def sample(self, now: float) -> None:
        cfg = self.cfg
        wants = [self.running_u[u] + self.queued_u[u] for u in range(len(cfg.users))]
        fair_tasks = drf_allocation(
            wants,
            [fair.dominant_share(d, self.capacity) for d in self.udemand],
            [self.capped and u.group == cfg.capped_group for u in cfg.users],
            float(cfg.nodes * cfg.slots),
            cfg.cap,
        )
        raw, rel = [], []
        for u in range(len(cfg.users)):
            s = fair.dominant_share(self.udemand[u].scaled(self.running_u[u]), self.capacity)
            self.share_sum[u] += s
            if wants[u]:
                raw.append(s)
                rel.append(self.running_u[u] / fair_tasks[u])
        self.samples.append((now, fair.jain_index(rel)))
        self.raw.append(fair.jain_index(raw))
        if self.capped:
            self.excess.append(max(self.group_running - cfg.cap, 0.0) / cfg.cap)
            self.use.append(self.group_running / cfg.cap)

    def schedule_common(self) -> None:
        for i, a in enumerate(self.arrivals):
            self.push(a.at, ARRIVE, i)
        t = self.cfg.warmup
        k = 0
        while t <= self.cfg.horizon + 1e-9:
            self.push(t, SAMPLE, k)
            k += 1
            t = self.cfg.warmup + k * self.cfg.sample_every

    def result(self, name: str) -> FairResult:
        cfg = self.cfg
        self._busy(cfg.horizon, 0)
        rts = [
            self.finish_at[i] - a.at
            for i, a in enumerate(self.arrivals)
            if cfg.warmup <= a.at < cfg.horizon
        ]
        n = len(self.samples)
        return FairResult(
            scheduler=name,
            jain=sum(j for _, j in self.samples) / n if n else math.nan,
            jain_raw=sum(self.raw) / n if n else math.nan,
            series=tuple(self.samples),
            mean_response=sum(rts) / len(rts) if rts else math.nan,
            tasks=len(rts),
            utilisation=self.busy_integral / (cfg.nodes * cfg.slots * cfg.day),
            cap=cfg.cap,
            overshoot_peak=self.peak,
            overshoot_mean=sum(self.excess) / len(self.excess) if self.excess else 0.0,
            cap_use=sum(self.use) / len(self.use) if self.use else math.nan,
            share_by_user=tuple(s / n if n else math.nan for s in self.share_sum),
        )


class _Swarm(_Common):
    """Every node orders its own queue on stale gossip (the agent's functions)."""

    def __init__(self, cfg: FairSimConfig, arrivals: Sequence[Arrival]) -> None:
        super().__init__(cfg, arrivals)
        n = cfg.nodes
        self.rng = random.Random(cfg.seed * 31 + 5)
        self.node_ids = [f"n{j}" for j in range(n)]
        self.queue: list[list[int]] = [[] for _ in range(n)]
        self.run = [0] * n
        self.where = [0] * len(arrivals)
        # The capped group's demand per node: now, last published, visible to others.
        self.cur_q = [0] * n
        self.cur_r = [0] * n
        self.pub = [(0, 0)] * n
        self.vis = [(0, 0)] * n
        self.seen: dict[m.NodeId, tuple[tuple[str, int, int], ...]] = {}
        self.version = 0  # of `seen`
        self.refused_at: dict[int, tuple[int, int, int]] = {}  # node -> (version, q, r)
        self.bin_of = [self.rng.randrange(cfg.bins) for _ in range(n)]
        self.dirty: list[set[int]] = [set() for _ in range(cfg.bins)]
        self.blocked: list[set[int]] = [set() for _ in range(cfg.bins)]
        self.pending: dict[int, list[tuple[int, int, int]]] = {}
        self.napply = 0
        self.snapshots: deque[tuple[float, dict[fair.Principal, fair.Resources]]] = deque()
        self.in_system = 0
        self.published_at = [-math.inf] * n
        # what each node's reports said it had queued of the capped group, and when
        self.demand_log: list[deque[tuple[float, int]]] = [deque() for _ in range(n)]
        self.publishing: set[int] = set()

    # -------------------------------------------------------------- views

    def usage_view(self, now: float) -> dict[fair.Principal, fair.Resources]:
        if self.cfg.fresh:
            return self.usage_now(now)
        edge = now - self.cfg.delay
        snaps = self.snapshots
        while len(snaps) > 1 and snaps[1][0] <= edge + 1e-12:
            snaps.popleft()
        if not snaps or snaps[0][0] > edge + 1e-12:
            return {}
        return snaps[0][1]

    def _changed(self, j: int, now: float) -> None:
        if self.cfg.fresh:
            self._see(j, self.cur_q[j], self.cur_r[j])
        elif self.cfg.publish_on_change:
            if j not in self.publishing:
                self.publishing.add(j)
                self.push(max(now, self.published_at[j] + self.cfg.publish_gap), PUBLISH, j)
        else:
            self.dirty[self.bin_of[j]].add(j)

    def publish(self, j: int, now: float) -> None:
        """Node j's changed report goes out (the others see it `delay` later)."""
        self.publishing.discard(j)
        self.published_at[j] = now
        q, r = self.cur_q[j], self.cur_r[j]
        pq, pr = self.pub[j]
        if (q, r) == (pq, pr):
            return
        self.pub[j] = (q, r)
        qu.log_demand(self.demand_log[j], now, q, self.cfg.quota_lag)
        deltas = [(j, q - pq, r - pr)]
        if self.cfg.delay <= 0:
            self.apply(deltas)
        else:
            self.napply += 1
            self.pending[self.napply] = deltas
            self.push(now + self.cfg.delay, APPLY, self.napply)

    def tick(self, b: int, now: float) -> None:
        cfg = self.cfg
        if b == 0 and not cfg.fresh:
            self.snapshots.append((now, self.usage_now(now)))
        deltas = []
        for j in self.dirty[b]:
            q, r = self.cur_q[j], self.cur_r[j]
            pq, pr = self.pub[j]
            if (q, r) != (pq, pr):
                deltas.append((j, q - pq, r - pr))
                self.pub[j] = (q, r)
                qu.log_demand(self.demand_log[j], now, q, self.cfg.quota_lag)
        self.dirty[b].clear()
        if deltas:
            if cfg.delay <= 0:
                self.apply(deltas)
            else:
                self.napply += 1
                self.pending[self.napply] = deltas
                self.push(now + cfg.delay, APPLY, self.napply)
        if self.blocked[b]:
            for j in sorted(self.blocked[b]):
                self.try_start(j, now)
        if self.in_system or now < self.cfg.horizon:
            self.push(now + cfg.report_interval / cfg.bins, TICK, (b + 1) % cfg.bins)

    def apply(self, deltas: list[tuple[int, int, int]]) -> None:
        for j, dq, dr in deltas:
            q, r = self.vis[j]
            self._see(j, q + dq, r + dr)

    def _see(self, j: int, q: int, r: int) -> None:
        """Node j's group row as the others now see it (a node holding none of the
        group's work reports no row, as the agent's report does)."""
        self.vis[j] = (q, r)
        self.version += 1
        if q or r:
            self.seen[self.node_ids[j]] = ((self.cfg.capped_group, q, r),)
        else:
            self.seen.pop(self.node_ids[j], None)

    # -------------------------------------------------------------- decisions

    def arrive(self, i: int, now: float) -> None:
        n = self.cfg.nodes
        a, b = self.rng.randrange(n), self.rng.randrange(n)
        la, lb = len(self.queue[a]) + self.run[a], len(self.queue[b]) + self.run[b]
        j = a if la <= lb else b
        self.where[i] = j
        self.queue[j].append(i)
        self.queued_u[self.arrivals[i].user] += 1
        self.in_system += 1
        if self.is_capped(i):
            self.cur_q[j] += 1
            self._changed(j, now)
        self.try_start(j, now)

    def try_start(self, j: int, now: float) -> None:
        """Node j starts what it may: its queue in `runqueue.order`, a capped group's
        task only when `runqueue.quota_refusal` lets it."""
        cfg = self.cfg
        free = cfg.slots - self.run[j]
        self.blocked[self.bin_of[j]].discard(j)
        if free <= 0 or not self.queue[j]:
            return
        specs = self.specs
        view = rq.QueueView(self.usage_view(now), self.capacity, now)
        ids = rq.order([specs[i] for i in self.queue[j]], view, self.weights)
        refused: set[str] = set()
        start: list[int] = []
        for tid in ids:
            i = self.index[tid]
            spec = specs[i]
            if spec.group in refused:
                continue
            if self.capped and spec.group == cfg.capped_group:
                queued = self.cur_q[j]
                if not cfg.fresh:  # as the agent: its own demand as the others see it
                    queued = qu.lagged_demand(self.demand_log[j], now, cfg.quota_lag, queued)
                memo = (self.version, queued, self.cur_r[j])
                if self.refused_at.get(j) == memo:  # nothing it reads has changed
                    refused.add(spec.group)
                    continue
                why = rq.quota_refusal(
                    self.sharing, spec, self.node_ids[j], self.seen, self.cur_r[j], queued
                )
                if why is not None:
                    self.refused_at[j] = memo
                    refused.add(spec.group)
                    continue
                self.cur_q[j] -= 1
                self.cur_r[j] += 1
                self._changed(j, now)
            start.append(i)
            self.run[j] += 1
            free -= 1
            if free == 0:
                break
        if start:
            gone = set(start)
            self.queue[j] = [i for i in self.queue[j] if i not in gone]
            for i in start:
                self.started(i, now)
        if free > 0 and self.queue[j]:
            self.blocked[self.bin_of[j]].add(j)

    def finish(self, i: int, now: float) -> None:
        j = self.where[i]
        self.run[j] -= 1
        self.in_system -= 1
        if self.is_capped(i):
            self.cur_r[j] -= 1
            self._changed(j, now)
        self.finished(i, now)
        self.try_start(j, now)

    def simulate(self) -> FairResult:
        self.schedule_common()
        self.push(0.0, TICK, 0)
        while self.heap:
            now, _, kind, x = heapq.heappop(self.heap)
            if kind == ARRIVE:
                self.arrive(x, now)
            elif kind == FINISH:
                self.finish(x, now)
            elif kind == TICK:
                self.tick(x, now)
            elif kind == APPLY:
                self.apply(self.pending.pop(x))
            elif kind == PUBLISH:
                self.publish(x, now)
            else:
                self.sample(now)
        return self.result("swarm")


class _Central(_Common):
    """One omniscient DRF scheduler over all slots, fresh usage, the cap exact."""

    def __init__(self, cfg: FairSimConfig, arrivals: Sequence[Arrival]) -> None:
        super().__init__(cfg, arrivals)
        self.free = cfg.nodes * cfg.slots
        self.waiting: list[deque[int]] = [deque() for _ in cfg.users]
        self.open = fair.Resources(1.0, math.inf, math.inf, math.inf)  # one slot

    def dispatch(self, now: float) -> None:
        cfg = self.cfg
        while self.free > 0:
            heads = []
            demand = {}
            for q in self.waiting:
                if not q:
                    continue
                i = q[0]
                if self.is_capped(i) and self.group_running + 1 > cfg.cap + 1e-9:
                    continue
                spec = self.specs[i]
                heads.append(fair.Waiting(spec.id, rq.user_principal(spec), i))
                demand[spec.id] = rq.demand(spec)
            if not heads:
                return
            usage = self.usage_now(now)
            pick = fair.drf_schedule(heads, demand, usage, self.capacity, self.open, self.weights)
            i = self.index[pick[0]]
            self.waiting[self.arrivals[i].user].popleft()
            self.free -= 1
            self.started(i, now)

    def simulate(self) -> FairResult:
        self.schedule_common()
        while self.heap:
            now, _, kind, x = heapq.heappop(self.heap)
            if kind == ARRIVE:
                self.waiting[self.arrivals[x].user].append(x)
                self.queued_u[self.arrivals[x].user] += 1
                self.dispatch(now)
            elif kind == FINISH:
                self.free += 1
                self.finished(x, now)
                self.dispatch(now)
            else:
                self.sample(now)
        return self.result("central")


def run_swarm(cfg: FairSimConfig, arrivals: Sequence[Arrival] | None = None) -> FairResult:
    return _Swarm(cfg, trace(cfg) if arrivals is None else arrivals).simulate()


def run_central(cfg: FairSimConfig, arrivals: Sequence[Arrival] | None = None) -> FairResult:
    return _Central(cfg, trace(cfg) if arrivals is None else arrivals).simulate()


DEFAULT = FairSimConfig()  # the experiment's workload and timers (100 nodes)
