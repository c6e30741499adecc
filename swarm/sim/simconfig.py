"""What a simulator run is given and what it measures: staleness models, placement
strategies, migration settings, `SimConfig` and `SimResult` (values only)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from swarm.policy import migration as mig
from swarm.policy.latebind import LateConfig, LateStats
from swarm.policy.placement import RetryPolicy
from swarm.policy.transfer import TransferConfig, TransferStats

from .workloads import NodeSpec


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
    """swarm's placement: the agent's two-choice rule with `placement-d` = d
    (`node.decide.choose`, i.e. `policy.placement.place(..., d=d)`). From a front end
    d = 1 is uniform random; d = 0 keeps the task at its origin (when that is a node)."""

    d: int = 2

    def label(self) -> str:
        return {0: "local", 1: "random"}.get(self.d, f"d={self.d}")


@attrs.frozen
class PlaceRandom:
    """The agent's `random` placement rule (`--placement random`, its benchmarks'
    baseline; `node.decide.place_random`): a uniformly random eligible node, the
    origin included, up to 16 draws. Unlike `PowerOfD(1)` placed from a node, which
    takes the better of the origin and one random peer."""

    def label(self) -> str:
        return "random (agent rule)"


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


Strategy = PowerOfD | PlaceRandom | LeastLoaded | Jsq


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
    late: LateConfig | None = None  # late binding at each task's home (origin "node" only)
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
    handoffs: int  # placements sent to another node (a local one sends nothing)
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
    late_stats: LateStats = attrs.field(factory=LateStats)

    @property
    def messages(self) -> int:
        """Messages for placing and moving tasks: a handoff per placement sent to another
        node and a refusal's answer, a probe and its reply, a steal request, a move or a
        migration each, and late binding's reservations, cancels, pulls and answers (a
        pulled task's handoff is counted with the handoffs). Gossip is not counted (the
        same for every policy)."""
        s = self.transfer_stats
        return (
            self.handoffs
            + self.refusals
            + 2 * s.probes
            + s.steals
            + self.transfers
            + self.migrations
            + self.late_stats.messages
        )

    @property
    def p99_ratio(self) -> float:
        return self.p99 / self.mean if self.mean else math.nan


def quantile(xs: Sequence[float], q: float) -> float:
    """The q-quantile of sorted `xs` (nearest rank); nan when empty."""
    if not xs:
        return math.nan
    i = min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))
    return xs[i]
