"""Deterministic discrete-event simulator of a swarm cluster, driving the real policies.

What is simulated: nodes (shares, cores, task slots, speed) running tasks under
processor sharing (k running tasks each progress at speed * min(1, cores / k); at
most `slots` run, the rest wait FIFO, so slots = cores = 1 is the M/M/1 queue), task
arrivals from a workload, a one-way network delay for every message, and stale load
information in the view the placers read.

What is *not* re-implemented: every decision calls the agent's own code. The node's
decisions (`swarm.node`): `decide.choose` picks targets with the agent's placement
rule (two choices with d peers: d = 1 is uniform random from a front end, d = 0
keeps a task at its origin; or the agent's `random` baseline), `decide.
admission_refusal` is the target's re-check, `gate.can_start` is every node's start
gate (shares, reservations, drain, GPU slice). Below them, `PlacementRetry` drives
retries and back-off, `ShareLedger` keeps every node's books (load index,
reservations), `TransferPolicy` runs on every node with its probes, replies, pushes
and steals carried as delayed messages, and `policy.migration.plan_migrations`
decides which running tasks move (the target re-checks with the same admission and
`recheck_at_target`). Modelled here rather than taken from the agent: the two
reference baselines, least-loaded-of-the-view and the omniscient join-shortest-queue
(yardsticks that swarm must never use, so there is no agent code for them), the
handoff protocol (a task handed to a node is settled there on arrival), and Flex
measurements (none: admission at P = 1 with no usage).

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

The run is one `ClusterSim`, made of parts by concern: `books.Books` (nodes, tasks,
the event heap, queueing and starting), `placesim.PlacementSim`, `movesim.TransferSim`
and `movesim.MigrationSim`; this module adds arrivals, staleness and the results.
Configuration and result values are in `simconfig` (re-exported here).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs

from swarm.model import LoadReport, NodeId, TaskSpec
from swarm.policy.latebind import LateStats
from swarm.policy.transfer import TransferPolicy, TransferStats
from swarm.policy.view import PeerEntry

from .books import (
    ARRIVE,
    BOARD,
    MIGTICK,
    PUBLISH,
    RESET,
    STEP,
    VIEWPUT,
    SimNode,
    SimTask,
)
from .latesim import LateSim
from .movesim import MigrationSim, TransferSim
from .simconfig import (
    FRONTEND,
    NODE,
    Board,
    Fresh,
    GossipAge,
    Jsq,
    LeastLoaded,
    MigrationSpec,
    PlaceRandom,
    PowerOfD,
    SimConfig,
    SimError,
    SimResult,
    Staleness,
    Strategy,
    quantile,
)
from .workloads import Job

__all__ = [
    "FRONTEND",
    "NODE",
    "Board",
    "ClusterSim",
    "Fresh",
    "GossipAge",
    "Jsq",
    "LeastLoaded",
    "MigrationSpec",
    "PlaceRandom",
    "PowerOfD",
    "SimConfig",
    "SimError",
    "SimNode",
    "SimResult",
    "SimTask",
    "Staleness",
    "Strategy",
    "quantile",
    "simulate",
]


class ClusterSim(LateSim, TransferSim, MigrationSim):
    """One run: build with a config and a job iterator, then `run()`.

    Useful attributes after the run: `finished` (bytearray, one count per arrival:
    every entry must be 1), `times` (response times of measured tasks).
    """

    def __init__(self, cfg: SimConfig, jobs: Iterable[Job]) -> None:
        super().__init__(cfg)
        self._jobs: Iterator[Job] = iter(jobs)
        self._from_nodes = cfg.origin == NODE
        self._n_nodes = len(self.nodes)
        self._frozen_load: tuple[float, ...] = ()
        self._frozen_reserved: tuple[float, ...] = ()
        self._frozen_busy: tuple[float, ...] = ()
        self._frozen_levels: tuple[float, ...] = ()
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
            self._on_reserve,
            self._on_cancel,
            self._on_pull,
            self._on_pullrep,
            self._on_lategive,
            self._on_lateexp,
        ]
        self._setup()

    # ------------------------------------------------------------------ setup

    def _setup(self) -> None:
        cfg = self.cfg
        rng = self.rng
        for n in self.nodes:
            self.view.put(n.id, PeerEntry(n.report(), 0.0))
        st = cfg.staleness
        if isinstance(st, Board) and st.period > 0:
            self._push(st.period, BOARD)
        elif isinstance(st, GossipAge):
            if st.period <= 0:
                raise ValueError("gossip period must be > 0")
            # Phases are quantised to period / buckets: one event publishes a bucket,
            # so 10,000 nodes cost 100 heap entries per period instead of 10,000.
            nb = max(1, min(len(self.nodes), st.buckets))
            self._wheel: list[list[SimNode]] = [[] for _ in range(nb)]
            for n in self.nodes:
                self._wheel[rng.randrange(nb)].append(n)
            self._push(rng.random() * st.period / nb, PUBLISH, 0)
        if cfg.transfer is not None:
            tick = cfg.tick if cfg.tick is not None else cfg.transfer.round_interval
            if tick <= 0:
                raise ValueError("transfer tick must be > 0")
            for n in self.nodes:
                n.tp = TransferPolicy(n.id, cfg.transfer)
                self._push(rng.random() * tick, STEP, n, tick)
        if cfg.migration is not None:
            ms = cfg.migration
            for n in self.nodes:
                n.bucket = ms.config.new_bucket(0.0)
                self._push(rng.random() * ms.interval, MIGTICK, n)
        self._late_setup()
        if cfg.warmup > 0:
            self._push(cfg.warmup, RESET)
        self._next_arrival()

    def _next_arrival(self) -> None:
        job = next(self._jobs, None)
        if job is None:
            self._jobs_left = False
            self._freeze()
            return
        self._push(max(job.t, self.now), ARRIVE, job)

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
            self._push(now + st.delay, VIEWPUT, batch)
        else:
            put = self.view.put
            for n in wheel[b]:
                put(n.id, PeerEntry(n.report(), now))
        self._push(now + st.period / len(wheel), PUBLISH, (b + 1) % len(wheel))

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
        self._push(now + st.period, BOARD)

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
        late = LateStats()
        for n in self.nodes:
            if n.lb is not None:
                late = LateStats(
                    *(
                        a + b
                        for a, b in zip(attrs.astuple(late), attrs.astuple(n.lb.stats), strict=True)
                    )
                )
        return SimResult(
            late_stats=late,
            arrivals=len(self.finished),
            completions=sum(self.finished),
            measured=len(times),
            mean=sum(times) / len(times) if times else math.nan,
            p50=quantile(times, 0.5),
            p99=quantile(times, 0.99),
            horizon=self.now,
            events=self.events,
            placements=self.placements,
            handoffs=self.handoffs,
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
