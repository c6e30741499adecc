"""Where a task may run, simulated (issue 21): hard constraints and data locality.

A small discrete-event cluster of n nodes with `slots` servers each (FIFO queue, a
task runs alone in its slot), Poisson arrivals at a uniformly random home node, and
one of four placers:

- `SWARM`: the agent's own decision. The home calls `policy.placement.place` (power
  of d choices, constraint filter and its widening to a scan, the data preference)
  with its fresh report over a stale gossiped view; for a task that reads data it
  applies delay scheduling exactly as the agent's rule states it: while
  `placement.data_first` holds it places with `Where(holders_only=True)`, and while
  `placement.hold_for_data` says so it keeps the task and places it again every
  `retry` (and once more when the delay runs out); after that it places anywhere.
  The target re-checks the hard constraints on its own labels (`constraints.unmet`,
  as `placement.admit` does) before it queues the task.
- `JSQ` (yardstick, no agent code): join the shortest queue among the eligible nodes,
  on fresh state (omniscient).
- `PROBE` (baseline, no agent code): Sparrow-style probing that knows nothing of
  constraints: probe d uniformly random nodes of the whole cluster (fresh replies;
  an ineligible node answers "no"), draw d more until d eligible ones answered or
  `probe_rounds` rounds are spent, join the shortest queue among those found; with
  none found, back off (`placement.RetryPolicy`, in units of S) and start again.
- `BLIND`: swarm's placement of the same task with its data keys left out (a
  scheduler that knows nothing of where data is).

Staleness is `engine.GossipAge`'s model: every node re-publishes its report every
`period` (random phase) and the view receives it `gossip_delay` later. A node that can
never receive a task (one that fails the constraint every task carries) never
changes, so its unchanged report is not re-published (no decision could differ).

Common random numbers: arrivals and service times come from `workloads.poisson` on
their own seed, homes and data keys from a second stream, cluster layout from a
third; the policies' rng is separate. Two placers compared at one seed see the same
tasks at the same times from the same homes.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from typing import Any

import attrs

from swarm.model import LoadReport, NodeId, TaskSpec
from swarm.policy import constraints as cons
from swarm.policy.datakeys import digest
from swarm.policy.load import default_shares
from swarm.policy.placement import (
    NOWHERE,
    Needs,
    RetryPolicy,
    Where,
    data_first,
    hold_for_data,
    parsed,
    place,
)
from swarm.policy.view import LoadView, PeerEntry

from .simconfig import SimError, quantile
from .workloads import Exponential, ServiceDist, poisson

SWARM = "swarm"
JSQ = "jsq"
PROBE = "probe"
BLIND = "blind"
METHODS = (SWARM, JSQ, PROBE, BLIND)
HOLDERS = Where(holders_only=True)
EXPO = Exponential(1.0)

ARRIVE, DONE, PUBLISH, VIEWPUT, RETRY, HANDOFF = range(6)


@attrs.frozen
class WhereConfig:
    """One run. Times are in the workload's unit (the mean of `service`)."""

    nodes: int = 100
    slots: int = 1
    labelled: int | None = None  # nodes with label LABEL (None: all)
    label: tuple[str, str] = ("pool", "x")
    constraints: tuple[str, ...] = ()  # every task's hard constraints
    datasets: int = 0  # K data keys "ds0".."ds{K-1}"; each task reads one (0: none)
    replication: int = 3  # holders per data key (distinct random nodes)
    method: str = SWARM
    d: int = 2
    delay: float = 0.0  # delay scheduling: D
    retry: float = 0.25  # the home places a held task again this often
    remote: float = 0.0  # a task away from its data runs this fraction longer
    period: float = 1.0  # gossip: each node re-publishes its report this often
    gossip_delay: float = 0.05  # ... and the view receives it this much later
    net_delay: float = 0.005  # one-way delay of a handoff and of a probe
    probe_rounds: int = 8
    backoff: RetryPolicy = attrs.field(factory=RetryPolicy)
    load: float = 0.75  # offered load / capacity of the eligible nodes
    service: ServiceDist = EXPO
    tasks: int = 2000
    warmup: float = 0.1  # statistics skip this fraction of the first tasks
    seed: int = 1

    def __attrs_post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}")
        if self.nodes < 1 or self.slots < 1 or self.tasks < 1 or self.load <= 0:
            raise ValueError("nodes, slots, tasks and load must be positive")
        if self.datasets and self.replication > self.nodes:
            raise ValueError("replication exceeds the nodes")


@attrs.frozen
class WhereResult:
    """What a run measured, over the tasks after the warm-up."""

    measured: int
    mean: float  # response time: finish - arrival
    p50: float
    p99: float
    local: float  # fraction of the tasks that read data which ran on a holder
    held: float  # mean time from arrival to the send (delay scheduling, back-offs)
    gave_up: float  # fraction of data tasks sent anywhere after waiting the full D
    probes: float  # probes per task (PROBE)
    examined: float  # view entries examined per placement (SWARM, BLIND)
    scanned: float  # fraction of placements that examined the whole view
    messages: float  # per task: handoffs + probe requests and replies
    backoffs: float  # per task: rounds that found no eligible node
    attempts: float  # place() calls per task (SWARM, BLIND; retries included)
    offered: float  # work run (remote penalty included) / eligible slot-time of arrivals
    violations: int  # tasks started on a node that fails their constraints (must be 0)
    horizon: float
    events: int


class _Node:
    __slots__ = (
        "busy",
        "digest",
        "eligible",
        "id",
        "keys",
        "labels",
        "queue",
        "rep",
        "running",
        "slots",
        "ver",
    )

    def __init__(self, idx: int, slots: int) -> None:
        self.id: NodeId = f"n{idx:04d}"
        self.slots = slots
        self.labels: tuple[tuple[str, str], ...] = ()
        self.keys: frozenset[str] = frozenset()
        self.digest = b""
        self.eligible = False
        self.queue: deque[_Task] = deque()
        self.running = 0
        self.busy = 0.0  # slot-time spent running tasks
        self.rep: LoadReport | None = None
        self.ver = 0

    def report(self) -> LoadReport:
        r = self.rep
        if r is None:
            self.ver += 1
            q = len(self.queue)
            r = LoadReport(
                self.id,
                self.ver,
                shares=default_shares(self.slots),
                weight_sum=float(self.running + q),
                queued=q,
                running=self.running,
                slots=self.slots,
                labels=self.labels,
                data=self.digest,
            )
            self.rep = r
        return r


class _Task:
    __slots__ = ("arrival", "home", "idx", "key", "needs", "rounds", "sent", "spec", "work")

    def __init__(self, idx: int, spec: TaskSpec, arrival: float, work: float, home: _Node) -> None:
        self.idx = idx
        self.spec = spec
        self.needs = Needs.of(spec)
        self.arrival = arrival
        self.work = work
        self.home = home
        self.key = spec.data[0] if spec.data else ""
        self.rounds = 0
        self.sent = -1.0


class WhereSim:
    """One run: `WhereSim(cfg).run()`."""

    def __init__(self, cfg: WhereConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)  # the policies' and the engine's
        layout = random.Random(cfg.seed * 1000 + 3)
        self.nodes = [_Node(i, cfg.slots) for i in range(cfg.nodes)]
        n_lab = cfg.nodes if cfg.labelled is None else cfg.labelled
        for i in layout.sample(range(cfg.nodes), n_lab):
            self.nodes[i].labels = (cfg.label,)
        holders: dict[int, set[str]] = {i: set() for i in range(cfg.nodes)}
        for k in range(cfg.datasets):
            for i in layout.sample(range(cfg.nodes), cfg.replication):
                holders[i].add(f"ds{k}")
        for i, n in enumerate(self.nodes):
            n.keys = frozenset(holders[i])
            n.digest = digest(n.keys)
        self.by_id = {n.id: n for n in self.nodes}
        needed = parsed(cfg.constraints)
        self.eligible = [n for n in self.nodes if cons.unmet(needed, dict(n.labels)) is None]
        for n in self.eligible:
            n.eligible = True
        if not self.eligible:
            raise ValueError("no node satisfies the constraints")
        capacity = len(self.eligible) * cfg.slots / cfg.service.mean
        self.jobs = poisson(
            cfg.load * capacity,
            cfg.service,
            random.Random(cfg.seed * 1000 + 7),
            count=cfg.tasks,
        )
        self.draw = random.Random(cfg.seed * 1000 + 11)  # homes and data keys
        self.view = LoadView()
        for n in self.nodes:
            self.view.put(n.id, PeerEntry(n.report(), 0.0))
        self.heap: list[tuple[float, int, int, Any, Any]] = []
        self.seq = 0
        self.now = 0.0
        self.events = 0
        self.done = 0
        self.arrived = 0
        self.warm = int(cfg.tasks * cfg.warmup)
        self.times: list[float] = []
        self.n_local = self.n_data = self.gave_up = self.violations = 0
        self.last_arrival = 0.0
        self.held = self.probes = self.examined = 0.0
        self.placements = self.scans = self.messages = self.backoffs = 0
        if cfg.method in (SWARM, BLIND):
            for n in self.eligible:  # the others never change: nothing to re-publish
                self._push(self.rng.random() * cfg.period, PUBLISH, n)
        self._next()

    def _push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def _next(self) -> None:
        job = next(self.jobs, None)
        if job is not None:
            self._push(job.t, ARRIVE, job)

    # ------------------------------------------------------------------ running

    def run(self) -> WhereResult:
        handlers = (
            self._arrive,
            self._done,
            self._publish,
            self._viewput,
            self._attempt,
            self._handoff,
        )
        heap = self.heap
        total = self.cfg.tasks
        while heap and self.done < total:
            t, _, kind, a, b = heapq.heappop(heap)
            self.now = t
            self.events += 1
            handlers[kind](a, b)
        if self.done < total:
            raise SimError(f"run ended with {total - self.done} tasks unfinished")
        return self._result()

    def _arrive(self, job: Any, _: Any) -> None:
        cfg = self.cfg
        idx = self.arrived
        self.arrived += 1
        home = self.nodes[self.draw.randrange(cfg.nodes)]
        key = f"ds{self.draw.randrange(cfg.datasets)}" if cfg.datasets else ""
        spec = TaskSpec(
            id=f"t{idx}",
            argv=(),
            constraints=cfg.constraints,
            data=(key,) if key and cfg.method != BLIND else (),
            submitted_at=self.now,
        )
        task = _Task(idx, spec, self.now, job.work, home)
        self.last_arrival = self.now
        task.key = key
        self._next()
        self._attempt(task, None)

    def _attempt(self, task: _Task, _: Any) -> None:
        method = self.cfg.method
        if method == JSQ:
            self._send(task, self._shortest(self.eligible))
        elif method == PROBE:
            self._probe(task)
        else:
            self._place(task)

    def _place(self, task: _Task) -> None:
        """The home's decision, as the agent takes it (module docstring)."""
        cfg = self.cfg
        now = self.now
        waited = now - task.arrival
        if now >= task.arrival + cfg.delay:  # the retry at the deadline (float rounding)
            waited = max(waited, cfg.delay)
        first = data_first(task.needs, waited, cfg.delay)
        home = task.home
        where = HOLDERS if first else NOWHERE
        p = place(task.spec, home.report(), self.view, self.rng, now, d=cfg.d, where=where)
        self.placements += 1
        self.examined += p.examined
        self.scans += p.scanned
        target = None if p.target is None else self.by_id[p.target]
        seen = None
        if target is not None:
            seen = home.report() if p.local else self.view[target.id].report
        if hold_for_data(task.needs, waited, cfg.delay, seen):
            deadline = task.arrival + cfg.delay
            self._push(min(now + cfg.retry, deadline), RETRY, task)
            return
        if target is None:
            self._back_off(task)
            return
        if task.needs.data and waited >= cfg.delay > 0:
            self.gave_up += task.idx >= self.warm  # held the full D, then sent anywhere
        self._send(task, target)

    def _probe(self, task: _Task) -> None:
        """Sparrow-style probing without constraint awareness (module docstring)."""
        cfg = self.cfg
        found: dict[str, _Node] = {}
        rounds = 0
        while rounds < cfg.probe_rounds and len(found) < cfg.d:
            rounds += 1
            for n in self.rng.sample(self.nodes, cfg.d):
                if cons.unmet(task.needs.constraints, dict(n.labels)) is None:
                    found[n.id] = n
        self.probes += rounds * cfg.d
        self.messages += 2 * rounds * cfg.d
        if not found:
            self._back_off(task, 2 * rounds * cfg.net_delay)
            return
        target = self._shortest(list(found.values()))
        self._send(task, target, 2 * rounds * cfg.net_delay)

    def _shortest(self, nodes: list[_Node]) -> _Node:
        best = math.inf
        ties: list[_Node] = []
        for n in nodes:
            x = (n.running + len(n.queue)) / n.slots
            if x < best:
                best, ties = x, [n]
            elif x == best:
                ties.append(n)
        return ties[0] if len(ties) == 1 else self.rng.choice(ties)

    def _back_off(self, task: _Task, spent: float = 0.0) -> None:
        task.rounds += 1
        self.backoffs += 1
        if task.rounds > 100:
            raise SimError(f"task {task.spec.id} found no eligible node in 100 rounds")
        wait = spent + self.cfg.backoff.backoff(task.rounds - 1, self.rng)
        self._push(self.now + wait, RETRY, task)

    def _send(self, task: _Task, target: _Node, spent: float = 0.0) -> None:
        task.sent = self.now + spent
        if target is task.home and spent == 0.0:
            self._handoff(task, target)
            return
        self.messages += 1
        self._push(self.now + spent + self.cfg.net_delay, HANDOFF, task, target)

    def _handoff(self, task: _Task, node: _Node) -> None:
        """The target's re-check of the hard constraints on its own labels, then queue."""
        if cons.unmet(task.needs.constraints, dict(node.labels)) is not None:
            raise SimError(f"{task.spec.id} handed to {node.id}, which fails its constraints")
        node.rep = None
        if node.running < node.slots:
            self._start(task, node)
        else:
            node.queue.append(task)

    def _start(self, task: _Task, node: _Node) -> None:
        node.running += 1
        work = task.work
        self.violations += not node.eligible
        measured = task.idx >= self.warm
        if task.key:
            here = task.key in node.keys
            if not here:
                work *= 1.0 + self.cfg.remote
            if measured:
                self.n_data += 1
                self.n_local += here
        if measured:
            self.held += task.sent - task.arrival
        node.busy += work
        self._push(self.now + work, DONE, node, task)

    def _done(self, node: _Node, task: _Task) -> None:
        node.running -= 1
        node.rep = None
        self.done += 1
        if task.idx >= self.warm:
            self.times.append(self.now - task.arrival)
        if node.queue:
            self._start(node.queue.popleft(), node)

    # ------------------------------------------------------------------ gossip

    def _publish(self, node: _Node, _: Any) -> None:
        r = node.report()
        if self.view[node.id].report is not r:
            self._push(self.now + self.cfg.gossip_delay, VIEWPUT, node, r)
        self._push(self.now + self.cfg.period, PUBLISH, node)

    def _viewput(self, node: _Node, r: LoadReport) -> None:
        self.view.put(node.id, PeerEntry(r, self.now))

    # ------------------------------------------------------------------ results

    def _result(self) -> WhereResult:
        times = sorted(self.times)
        m = len(times)
        n = max(self.cfg.tasks, 1)
        slot_time = len(self.eligible) * self.cfg.slots * max(self.last_arrival, 1e-12)
        return WhereResult(
            measured=m,
            mean=sum(times) / m if m else math.nan,
            p50=quantile(times, 0.5),
            p99=quantile(times, 0.99),
            local=self.n_local / self.n_data if self.n_data else math.nan,
            held=self.held / m if m else math.nan,
            gave_up=self.gave_up / self.n_data if self.n_data else math.nan,
            probes=self.probes / n,
            examined=self.examined / self.placements if self.placements else 0.0,
            scanned=self.scans / self.placements if self.placements else 0.0,
            messages=self.messages / n,
            backoffs=self.backoffs / n,
            attempts=self.placements / n,
            offered=sum(x.busy for x in self.nodes) / slot_time,
            violations=self.violations,
            horizon=self.now,
            events=self.events,
        )


def run_where(cfg: WhereConfig) -> WhereResult:
    return WhereSim(cfg).run()
