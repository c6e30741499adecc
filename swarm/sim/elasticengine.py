"""Experiment 10's engine (`swarm sim elastic`): a fleet that scales itself over a day.

A discrete-event simulation (heapq, one injected `random.Random` per seed) of one pool
of nodes of `slots` slots under a sinusoidal arrival rate with a few bursts. Work is
placed by an idealised pull (a shared FIFO; a free slot on the least busy usable node
takes the head), because the point is the scaling decision, which is the agent's own
code: `policy.autoscale.decide` on a `PoolView`, `choose_victims` for scale-in, and,
for swarm, `cluster.actor.ActorSeat` on every member to say which node decides.

Policies: a fixed fleet (no decisions; a crashed node is replaced at once), *swarm*
(the decision runs on the node that `ActorSeat` elects, on a view `delay` seconds old;
each node keeps its own `ScaleState`, passes its lease epoch to `decide`, so a new
tenure starts a fresh window, and learns every action from gossip, `delay` seconds
after it, so the cooldowns survive a hand-over) and *central* (one
controller, same `ScaleConfig`, on a fresh view, never handed over). The outcome
(tables, figure, prose) is in `sim.elasticsim`.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from typing import Any

import attrs

from ..cluster.actor import ActorSeat, Lease, rendezvous_owner
from ..policy.autoscale import (
    Acted,
    NodeWork,
    PoolView,
    ScaleConfig,
    ScaleState,
    choose_victims,
    decide,
)

FIXED, SWARM, CENTRAL = "fixed", "swarm", "central"
KEY = "autoscale/default"


@attrs.frozen
class ElasticConfig:
    policy: str = SWARM
    max_nodes: int = 40
    min_nodes: int = 2
    tasks: int = 3000  # expected arrivals over the day, bursts not counted
    seed: int = 1
    slots: int = 8
    day: float = 10800.0  # s: one compressed "day" (3 h)
    swing: float = 0.6  # rate = base * (1 - swing * cos(2 pi t / day))
    # bursts: (start as a fraction of the day, seconds, extra rate / base rate)
    bursts: tuple[tuple[float, float, float], ...] = (
        (0.2, 300.0, 1.0),
        (0.45, 300.0, 1.0),
        (0.8, 300.0, 1.0),
    )
    service: float = 300.0  # s: mean of the exponential service time
    boot: float = 90.0  # s from launch until a node takes work (and joins membership)
    grace: float = 600.0  # s a draining node may run; its tasks then restart elsewhere
    period: float = 15.0  # s between decisions (HPA's sync period)
    step: float = 5.0  # s between ActorSeat steps on every member (ttl / 3)
    delay: float = 2.0  # s: age of swarm's gossiped view
    ttl: float = 15.0  # the actor's lease
    lease_grace: float = 15.0  # ActorSeat's grace for a gone holder
    detect: float = 5.0  # s until membership drops a crashed node
    crash_at: float | None = 0.4  # fraction of the day: the acting node crashes
    fixed: int = 0  # nodes of a fixed fleet
    target: float = 0.7
    in_window: float = 300.0
    in_util: float | None = None  # ScaleConfig.scale_in_utilisation; None: its default

    @property
    def base_rate(self) -> float:
        return self.tasks / self.day

    def rate(self, t: float) -> float:
        lam = self.base_rate * (1 - self.swing * math.cos(2 * math.pi * t / self.day))
        for start, length, extra in self.bursts:
            if start * self.day <= t < start * self.day + length:
                lam += extra * self.base_rate
        return lam

    def nodes_for(self, rate: float) -> int:
        """Nodes that carry `rate` at the target utilisation."""
        return max(self.min_nodes, math.ceil(rate * self.service / (self.slots * self.target)))

    def scale(self) -> ScaleConfig:
        """The `ScaleConfig` of swarm and central alike: the agent's defaults but for
        the pool's bounds, target, scale-in window and node size."""
        cfg = ScaleConfig(
            min_nodes=self.min_nodes,
            max_nodes=self.max_nodes,
            target_utilisation=self.target,
            scale_in_window=self.in_window,
            slots_per_node=float(self.slots),
        )
        if self.in_util is not None:
            cfg = attrs.evolve(cfg, scale_in_utilisation=self.in_util)
        return cfg


def workload(cfg: ElasticConfig) -> tuple[int, list[tuple[float, float]]]:
    """(arrival, service) of every task: a thinned Poisson process, one seed. The first
    `warm` tasks are those already running at 0 (the steady state of the first rate:
    Poisson many, exponential residual service); they are not measured."""
    rng = random.Random(cfg.seed)
    mean = cfg.rate(0.0) * cfg.service
    warm, p, u = 0, math.exp(-mean), rng.random()
    cum = p
    while u > cum and warm < 10 * mean + 10:  # inverse transform of Poisson(mean)
        warm += 1
        p *= mean / warm
        cum += p
    out = [(0.0, rng.expovariate(1 / cfg.service)) for _ in range(warm)]
    top = cfg.base_rate * (1 + cfg.swing + sum(e for _, _, e in cfg.bursts))
    t = 0.0
    while True:
        t += rng.expovariate(top)
        if t >= cfg.day:
            return warm, out
        if rng.random() * top < cfg.rate(t):
            out.append((t, rng.expovariate(1 / cfg.service)))


@attrs.frozen
class Decision:
    at: float
    action: str  # "out" or "in"
    count: int  # nodes launched, or drained
    by: str  # the deciding node ("central" for the controller)


@attrs.frozen
class ElasticResult:
    policy: str
    tasks: int
    completed: int
    node_hours: float
    mean: float
    p99: float
    decisions: tuple[Decision, ...]
    flaps: int
    max_nodes: int  # most nodes at once (booting and draining included)
    low_nodes: int  # fewest nodes taking or about to take work (draining excluded)
    restarted: int  # tasks restarted by a drain grace running out (scale-in)
    lost_seconds: float  # task-seconds of work those restarts threw away
    crash_restarted: int  # tasks restarted because their node crashed
    handovers: int  # changes of the acting node (swarm)
    no_actor: float  # s of the day with no acting node, after the first (swarm)
    takeover: float  # s from the crash to the next decision by another node (swarm)
    double: int  # steps where two nodes acted at once (swarm)
    pinned_short: int  # scale-ins that found fewer free nodes than they asked
    series: tuple[tuple[float, int], ...]  # (t, nodes) at every decision period

    @property
    def outs(self) -> int:
        return sum(1 for d in self.decisions if d.action == "out")

    @property
    def ins(self) -> int:
        return sum(1 for d in self.decisions if d.action == "in")


def reversals(decisions: tuple[Decision, ...] | list[Decision]) -> list[tuple[Decision, Decision]]:
    """Consecutive actions in opposite directions (in then out, or out then in)."""
    return [(a, b) for a, b in itertools.pairwise(decisions) if a.action != b.action]


def flaps(decisions: tuple[Decision, ...] | list[Decision], window: float) -> int:
    """Reversals (in then out, or out then in) less than `window` seconds apart."""
    return sum(1 for a, b in reversals(decisions) if b.at - a.at < window)


def closest_reversal(decisions: tuple[Decision, ...] | list[Decision]) -> float:
    """Seconds between the two actions of the quickest reversal; inf with none."""
    return min((b.at - a.at for a, b in reversals(decisions)), default=math.inf)


@attrs.define
class _Node:
    id: str
    up_at: float
    state: str = "boot"  # boot, up, drain, gone
    running: dict[int, float] = attrs.Factory(dict)  # task -> start


class _Sim:
    def __init__(self, cfg: ElasticConfig) -> None:
        self.cfg = cfg
        self.scfg = cfg.scale()
        self.warm, self.tasks = workload(cfg)
        self.heap: list[tuple[float, int, str, Any]] = []
        self.seq = 0
        self.now = 0.0
        self.nodes: dict[str, _Node] = {}
        self.queue: deque[int] = deque()
        self.attempt = [0] * len(self.tasks)
        self.done: list[float] = []
        self.completed = 0
        self.area = 0.0  # node-seconds within the day
        self.decisions: list[Decision] = []
        self.states: dict[str, ScaleState] = {}
        self.seats: dict[str, ActorSeat] = {}
        self.leases: dict[str, Lease] = {}  # each member's latest announcement
        self.ghosts: dict[str, float] = {}  # crashed node -> when membership drops it
        self.snaps: dict[float, tuple[PoolView, list[NodeWork]]] = {}
        self.actor: str | None = None
        self.first_actor = False
        self.stats = dict.fromkeys(
            ("restarted", "crash_restarted", "handovers", "double", "pinned_short"), 0
        )
        self.lost = 0.0
        self.no_actor = 0.0
        self.crash_time: float | None = None
        self.crashed: str | None = None
        self.takeover = math.nan
        self.max_alive = 0
        self.low = 1 << 30
        self.series: list[tuple[float, int]] = []

    # ---------------------------------------------------------------- plumbing

    def at(self, t: float, kind: str, data: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, data))

    def alive(self) -> int:
        return sum(1 for n in self.nodes.values() if n.state != "gone")

    def advance(self, t: float) -> None:
        lo, hi = min(self.now, self.cfg.day), min(t, self.cfg.day)
        if hi > lo:
            self.area += self.alive() * (hi - lo)
        self.now = t

    def launch(self, up: bool = False) -> None:
        nid = f"n{len(self.nodes):03d}"
        self.nodes[nid] = _Node(nid, self.now + (0.0 if up else self.cfg.boot))
        if up:
            self.join(nid)
        else:
            self.at(self.now + self.cfg.boot, "boot", nid)
        self.max_alive = max(self.max_alive, self.alive())

    def join(self, nid: str) -> None:
        self.nodes[nid].state = "up"
        if self.cfg.policy == SWARM:
            self.seats[nid] = ActorSeat(nid, KEY, self.cfg.ttl, self.cfg.lease_grace)
            for lease in self.leases.values():  # gossip carries each member's lease
                self.at(self.now + self.cfg.delay, "lease", (lease, nid))
            if self.decisions:  # and the last action, with the lease
                self.at(self.now + self.cfg.delay, "acted", (self.last_acted(), nid))
        self.dispatch()

    def last_acted(self) -> Acted:
        d = self.decisions[-1]
        return Acted("out" if d.action == "out" else "in", d.count, d.at)

    def remove(self, nid: str) -> None:
        self.nodes[nid].state = "gone"
        self.seats.pop(nid, None)
        self.leases.pop(nid, None)

    def dispatch(self) -> None:
        while self.queue:
            free = [
                n
                for n in self.nodes.values()
                if n.state == "up" and len(n.running) < self.cfg.slots
            ]
            if not free:
                return
            node = min(free, key=lambda n: (len(n.running), n.id))
            task = self.queue.popleft()
            node.running[task] = self.now
            self.at(self.now + self.tasks[task][1], "finish", (node.id, task, self.attempt[task]))

    def restart(self, node: _Node, *, drained: bool) -> int:
        """Put the node's running tasks back at the head of the queue (started anew)."""
        for task in sorted(node.running, reverse=True):
            if drained:
                self.lost += self.now - node.running[task]
            self.attempt[task] += 1
            self.queue.appendleft(task)
        n = len(node.running)
        node.running.clear()
        return n

    # ---------------------------------------------------------------- the view

    def snapshot(self) -> tuple[PoolView, list[NodeWork]]:
        ns = self.nodes.values()
        up = sum(1 for n in ns if n.state == "up")
        view = PoolView(
            nodes=up,
            slots=float(up * self.cfg.slots),
            running=float(sum(len(n.running) for n in ns)),
            queued=float(len(self.queue)),
            draining=sum(1 for n in ns if n.state == "drain"),
            booting=sum(1 for n in ns if n.state == "boot"),  # launched, not joined yet
        )
        work = [
            NodeWork(
                n.id,
                task_seconds=sum(self.now - s for s in n.running.values()),
                unmovable_seconds=max((self.now - s for s in n.running.values()), default=0.0),
            )
            for n in ns
            if n.state == "up"
        ]
        return view, work

    def apply(
        self,
        by: str,
        state: ScaleState,
        view: PoolView,
        work: list[NodeWork],
        epoch: int | None = None,
    ) -> None:
        state, d = decide(state, view, self.scfg, self.now, epoch=epoch)
        self.states[by] = state
        n = len(self.decisions)
        if d.action == "out":
            for _ in range(d.count):
                self.launch()
            self.decisions.append(Decision(self.now, "out", d.count, by))
        elif d.action == "in":
            free = [w for w in work if self.nodes[w.node].state == "up"]
            victims = choose_victims(free, d.count, long_task=self.cfg.grace)
            if len(victims) < d.count:
                self.stats["pinned_short"] += 1
            for nid in victims:
                node = self.nodes[nid]
                node.state = "drain"
                if not node.running:
                    self.remove(nid)
                else:
                    self.at(self.now + self.cfg.grace, "grace", nid)
            if victims:
                self.decisions.append(Decision(self.now, "in", len(victims), by))
        if self.cfg.policy == SWARM and len(self.decisions) > n:  # gossiped to the others
            for other in self.seats:
                if other != by:
                    self.at(self.now + self.cfg.delay, "acted", (self.last_acted(), other))

    # ---------------------------------------------------------------- events

    def members(self) -> set[str]:
        live = {n.id for n in self.nodes.values() if n.state in ("up", "drain")}
        return live | {g for g, until in self.ghosts.items() if self.now < until}

    def tick(self, k: int) -> None:
        cfg = self.cfg
        decide_now = k % round(cfg.period / cfg.step) == 0
        if cfg.policy == SWARM:
            live = self.members()
            acting = []
            epochs: dict[str, int] = {}
            for nid in sorted(self.seats):
                st = self.seats[nid].step(live, self.now)
                if st.announce is not None:
                    self.leases[nid] = st.announce
                    for other in self.seats:
                        if other != nid:
                            self.at(self.now + cfg.delay, "lease", (st.announce, other))
                if st.acting:
                    acting.append(nid)
                    epochs[nid] = st.epoch
            self.stats["double"] += len(acting) > 1
            if acting and acting[0] != self.actor:
                if self.actor is not None:
                    self.stats["handovers"] += 1
                self.actor = acting[0]
            if acting:
                self.first_actor = True
            elif self.first_actor and self.now < cfg.day:
                self.no_actor += cfg.step
            if decide_now and acting:
                snap = self.snaps.pop(self.now, None)
                view, work = snap if snap is not None else self.snapshot()
                view = attrs.evolve(view, age=cfg.delay)
                for nid in acting:
                    crashed = self.crash_time is not None and math.isnan(self.takeover)
                    if crashed and nid != self.crashed and self.crash_time is not None:
                        self.takeover = self.now - self.crash_time
                    # a new epoch (a new tenure) starts the window afresh in `decide`
                    state = self.states.get(nid, ScaleState())
                    self.apply(nid, state, view, work, epoch=epochs[nid])
            self.snaps.pop(self.now, None)
        elif cfg.policy == CENTRAL and decide_now:
            view, work = self.snapshot()
            self.apply(CENTRAL, self.states.get(CENTRAL, ScaleState()), view, work)
        if decide_now:
            self.series.append((self.now, self.alive()))
            taking = sum(1 for n in self.nodes.values() if n.state in ("boot", "up"))
            self.low = min(self.low, taking)
        nxt = (k + 1) * cfg.step
        if nxt <= cfg.day:
            self.at(nxt, "tick", k + 1)
            if cfg.policy == SWARM and (k + 1) % round(cfg.period / cfg.step) == 0:
                self.at(nxt - cfg.delay, "snap", nxt)

    def crash(self) -> None:
        up = [n.id for n in self.nodes.values() if n.state in ("up", "drain")]
        victim: str | None = None
        if self.cfg.policy == SWARM and self.actor is not None and self.actor in up:
            victim = self.actor
        else:
            victim = rendezvous_owner(KEY, up)
        if victim is None:
            return
        self.crash_time, self.crashed = self.now, victim
        self.stats["crash_restarted"] += self.restart(self.nodes[victim], drained=False)
        self.remove(victim)
        self.ghosts[victim] = self.now + self.cfg.detect
        if self.cfg.policy == FIXED:
            self.launch()  # an instance group's repair
        self.dispatch()

    def run(self) -> ElasticResult:
        cfg = self.cfg
        start = cfg.fixed if cfg.policy == FIXED else cfg.nodes_for(cfg.rate(0.0))
        for _ in range(start):
            self.launch(up=True)
        for i, (t, _) in enumerate(self.tasks):
            self.at(t, "arrive", i)
        self.at(0.0, "tick", 0)
        if cfg.crash_at is not None:
            self.at(cfg.crash_at * cfg.day, "crash")
        while self.heap:
            t, _, kind, data = heapq.heappop(self.heap)
            self.advance(t)
            if kind == "arrive":
                self.queue.append(data)
                self.dispatch()
            elif kind == "finish":
                nid, task, attempt = data
                if attempt != self.attempt[task]:
                    continue  # restarted meanwhile
                node = self.nodes[nid]
                del node.running[task]
                self.completed += 1
                if task >= self.warm:
                    self.done.append(self.now - self.tasks[task][0])
                if node.state == "drain" and not node.running:
                    self.remove(nid)
                self.dispatch()
            elif kind == "tick":
                self.tick(data)
            elif kind == "snap":
                self.snaps[data] = self.snapshot()
            elif kind == "lease":
                lease, nid = data
                if nid in self.seats:
                    self.seats[nid].on_lease(lease, self.now)
            elif kind == "acted":
                acted, nid = data
                if nid in self.seats:
                    self.states[nid] = self.states.get(nid, ScaleState()).learn(acted)
            elif kind == "boot":
                self.join(data)
            elif kind == "grace":
                node = self.nodes[data]
                if node.state == "drain":
                    self.stats["restarted"] += self.restart(node, drained=True)
                    self.remove(data)
                    self.dispatch()
            elif kind == "crash":
                self.crash()
        return self.result()

    def result(self) -> ElasticResult:
        rs = sorted(self.done)
        n = len(rs)
        return ElasticResult(
            policy=self.cfg.policy,
            tasks=len(self.tasks),
            completed=self.completed,
            node_hours=self.area / 3600,
            mean=sum(rs) / n if n else math.nan,
            p99=rs[min(n - 1, int(0.99 * n))] if n else math.nan,
            decisions=tuple(self.decisions),
            flaps=flaps(self.decisions, self.cfg.in_window),
            max_nodes=self.max_alive,
            low_nodes=self.low,
            restarted=self.stats["restarted"],
            lost_seconds=self.lost,
            crash_restarted=self.stats["crash_restarted"],
            handovers=self.stats["handovers"],
            no_actor=self.no_actor,
            takeover=self.takeover,
            double=self.stats["double"],
            pinned_short=self.stats["pinned_short"],
            series=tuple(self.series),
        )


def run_elastic(cfg: ElasticConfig) -> ElasticResult:
    return _Sim(cfg).run()
