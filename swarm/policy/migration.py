"""Whether to move running tasks: MOSIX-style cost-benefit, descheduler-style limits.

A running task moves only when the time it is expected to save on the target beats
what the move costs, by a safety margin:

    gain = remaining * (slowdown_here - slowdown_there)
    cost = state_bytes / bandwidth + pause + warmup  (+ age for RESTART: lost work)
    move iff gain > margin * cost, and no safety limit says no.

`remaining` is declared (expected_runtime - age) or, without a declaration, taken
from the task's age: run times are heavy-tailed (Harchol-Balter & Downey: for a
Pareto tail with alpha ~ 1, E[remaining | age a] ~ a), so old tasks are the ones
worth moving and young ones are left alone. The factor is configurable.

Safety limits (after Koordinator's descheduler): at most K migrations in flight per
node (here and at the target) and in the cluster view, a per-task cooldown, a
maximum number of moves per task, a global token-bucket rate limit, no moves when
the task's home, this node or the target is suspect, and a dry-run mode that only
reports. The target re-checks with fresh state and may refuse; a refused or failed
migration leaves the task running where it was.

Pure: `now`, the running tasks, the local report and the candidate targets (the same
two-choice sample placement uses) go in; decisions and the new bucket come out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence

import attrs

from swarm.model import GpuRequest, LoadReport, MigrateMode, NodeId, TaskId

from .constraints import Constraint
from .constraints import unmet as unmet_constraints
from .gpu import fits_summary

# ------------------------------------------------------------------ inputs


@attrs.frozen
class RunningTask:
    """What the decision needs to know about one task running on this node."""

    task_id: TaskId
    mode: MigrateMode
    age: float  # seconds since it started (here or, for CRIU/checkpoint, overall)
    expected_runtime: float | None = None  # declared total run time, seconds
    state_bytes: int = 0  # measured or declared checkpoint / image size
    pause: float = 0.0  # seconds the task is stopped while it moves
    warmup: float = 0.0  # seconds until it runs at full speed again on the target
    moves: int = 0  # migrations so far
    last_move_at: float | None = None  # when it last arrived somewhere by migration
    home: NodeId = ""  # node that owns its record
    gpu: GpuRequest | None = None
    constraints: tuple[Constraint, ...] = ()  # hard: a target must satisfy them


@attrs.frozen
class Candidate:
    """A possible target from the two-choice sample, with its gossiped report's age."""

    node: NodeId
    report: LoadReport
    age: float  # seconds since that report was made


@attrs.frozen
class InFlight:
    """Migrations already in flight: at this node (in and out), per node as known
    from gossip, and in the whole cluster view."""

    here: int = 0
    cluster: int = 0
    by_node: Mapping[NodeId, int] = attrs.field(factory=dict, hash=False)


SlowdownFn = Callable[[LoadReport, int], float]


def cpu_slowdown(report: LoadReport, extra: int = 0) -> float:
    """How much slower a CPU-bound task runs on this node than on an idle one, with
    `extra` tasks added (negative: removed).

    Processor sharing: runnable work per core, read both from the running task count
    and from the 1-minute load average per core, never below 1. Cores are the
    reported `cpus`, or the task slots when a node does not report them. The fleet
    load index (weights per share) measures fairness, not speed, so it is not used
    for time estimates; inject another `slowdown` in MigrationConfig for GPU-bound
    or I/O-bound work.
    """
    cores = report.cpus if report.cpus > 0 else max(1, report.slots)
    by_tasks = (report.running + extra) / cores
    by_load = report.load_per_core + extra / cores
    return max(1.0, by_tasks, by_load)


# ------------------------------------------------------------------ rate limit


@attrs.frozen
class TokenBucket:
    """Global migration rate limit: `rate` tokens per second, at most `burst` saved.

    Time going backwards (a clock step) refills nothing rather than failing.
    """

    rate: float
    burst: float
    tokens: float
    at: float | None = None

    @classmethod
    def full(cls, rate: float, burst: float, now: float | None = None) -> TokenBucket:
        return cls(rate=rate, burst=burst, tokens=burst, at=now)

    def refill(self, now: float) -> TokenBucket:
        if self.at is None:
            return attrs.evolve(self, at=now)
        if now <= self.at:
            return self
        tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        return attrs.evolve(self, tokens=tokens, at=now)

    def take(self, now: float, n: float = 1.0) -> tuple[bool, TokenBucket]:
        """(granted, new bucket)."""
        b = self.refill(now)
        if b.tokens + 1e-9 >= n:
            return True, attrs.evolve(b, tokens=max(0.0, b.tokens - n))
        return False, b


# ------------------------------------------------------------------ bandwidth


@attrs.frozen
class BandwidthEstimator:
    """EWMA of bytes/second measured on earlier transfers, per peer.

    Nonsense observations (no bytes, no time, NaN) are dropped and counted.
    """

    alpha: float = 0.3
    peers: Mapping[NodeId, float] = attrs.field(factory=dict, hash=False)
    dropped: int = 0

    def observe(self, peer: NodeId, nbytes: int, seconds: float) -> BandwidthEstimator:
        sample = nbytes / seconds if nbytes > 0 and seconds > 0 else 0.0
        if not (math.isfinite(sample) and sample > 0):
            return attrs.evolve(self, dropped=self.dropped + 1)
        old = self.peers.get(peer)
        new = sample if old is None else (1 - self.alpha) * old + self.alpha * sample
        return attrs.evolve(self, peers={**self.peers, peer: new})

    def estimate(self, peer: NodeId, default: float) -> float:
        return self.peers.get(peer, default)


# ------------------------------------------------------------------ config


@attrs.frozen
class MigrationConfig:
    """Knobs of the decision; the defaults are conservative because a wrong move costs
    a pause and risk while a missed one only costs some speed.

    margin: gain must beat margin x cost. age_factor: E[remaining | age] / age.
    default_bandwidth: bytes/s when no transfer to the peer was measured yet.
    max_per_node / max_cluster: migrations in flight at one node (here or target) /
    in this node's view of the cluster. cooldown: seconds after a task arrived before
    it may move again. max_moves: moves per task over its life. rate / burst: token
    bucket over all migrations started here. max_report_age: ignore targets whose
    gossiped report is older. dry_run: decide and report, start nothing.
    slowdown: (report, extra tasks) -> slowdown factor (see cpu_slowdown).
    """

    margin: float = 1.5
    age_factor: float = 1.0
    default_bandwidth: float = 100e6  # bytes/s
    max_per_node: int = 1
    max_cluster: int = 8
    cooldown: float = 600.0
    max_moves: int = 3
    rate: float = 1.0 / 60  # tokens/s
    burst: float = 2.0
    max_report_age: float = 30.0
    dry_run: bool = False
    slowdown: SlowdownFn = cpu_slowdown

    def __attrs_post_init__(self) -> None:
        for name in ("margin", "default_bandwidth"):
            if not getattr(self, name) > 0:
                raise ValueError(f"migration: {name} must be > 0, got {getattr(self, name)}")
        for name in (
            "age_factor",
            "max_per_node",
            "max_cluster",
            "cooldown",
            "max_moves",
            "rate",
            "burst",
            "max_report_age",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f"migration: {name} must be >= 0, got {getattr(self, name)}")

    def new_bucket(self, now: float | None = None) -> TokenBucket:
        return TokenBucket.full(self.rate, self.burst, now)


# ------------------------------------------------------------------ outputs

# Stable decision codes (metrics labels, `swarm explain`).
MIGRATE = "migrate"
DRY_RUN = "dry-run"
NEVER = "never"
NO_CRIU = "no-criu"
MAX_MOVES = "max-moves"
COOLDOWN = "cooldown"
SUSPECT = "suspect"
NO_TARGET = "no-target"
NOT_WORTH_IT = "not-worth-it"
NODE_LIMIT = "node-limit"
CLUSTER_LIMIT = "cluster-limit"
RATE_LIMIT = "rate-limit"


@attrs.frozen
class CostBenefit:
    """The arithmetic behind one task/target pair, in seconds."""

    remaining: float
    slowdown_here: float
    slowdown_there: float
    bandwidth: float  # bytes/s
    transfer: float  # state_bytes / bandwidth
    lost_work: float  # age, for RESTART
    gain: float
    cost: float

    def worth_it(self, margin: float) -> bool:
        return self.gain > margin * self.cost


@attrs.frozen
class MigrationDecision:
    """One considered task: where it would go, the figures, and the verdict.

    `migrate` means start it now. `would_migrate` is the verdict ignoring dry-run
    (so a dry run shows what it would have done).
    """

    task_id: TaskId
    target: NodeId | None
    migrate: bool
    code: str
    reason: str
    gain: float
    cost: float
    margin: float
    figures: CostBenefit | None = None
    would_migrate: bool = False


@attrs.frozen
class MigrationPlan:
    decisions: tuple[MigrationDecision, ...]
    start: tuple[MigrationDecision, ...]
    bucket: TokenBucket


# ------------------------------------------------------------------ the decision


def expected_remaining(task: RunningTask, age_factor: float) -> float:
    """Seconds left: the declaration when there is one and it is not yet overrun,
    else `age_factor * age` (heavy-tailed run times; an overrun declaration has been
    shown wrong, so the age rule takes over)."""
    age = max(0.0, task.age)
    if task.expected_runtime is not None and task.expected_runtime > age:
        return task.expected_runtime - age
    return age_factor * age


def cost_benefit(
    task: RunningTask,
    here: LoadReport,
    there: LoadReport,
    *,
    config: MigrationConfig,
    bandwidth: float,
    extra_here: int = 0,
    extra_there: int = 0,
) -> CostBenefit:
    """Gain and cost of moving `task` from `here` to `there`.

    `extra_here` / `extra_there` adjust the loads for moves already decided in this
    round (so one round does not send every task to the same target).
    """
    remaining = expected_remaining(task, config.age_factor)
    s_here = config.slowdown(here, extra_here)
    s_there = config.slowdown(there, extra_there + 1)
    transfer = max(0, task.state_bytes) / bandwidth
    lost = max(0.0, task.age) if task.mode is MigrateMode.RESTART else 0.0
    gain = remaining * (s_here - s_there)
    cost = transfer + max(0.0, task.pause) + max(0.0, task.warmup) + lost
    return CostBenefit(remaining, s_here, s_there, bandwidth, transfer, lost, gain, cost)


def _task_block(
    task: RunningTask,
    local: LoadReport,
    now: float,
    config: MigrationConfig,
    suspect: Collection[NodeId],
) -> tuple[str, str] | None:
    """Limits that hold whatever the target: (code, reason) or None."""
    if task.mode is MigrateMode.NEVER:
        return NEVER, "the task opted out of migration (migrate=never)"
    if task.mode is MigrateMode.CRIU and not local.criu:
        return NO_CRIU, "CRIU is not available on this node"
    if task.moves >= config.max_moves:
        return MAX_MOVES, f"moved {task.moves} times already (max {config.max_moves})"
    if task.last_move_at is not None and now - task.last_move_at < config.cooldown:
        left = config.cooldown - (now - task.last_move_at)
        return COOLDOWN, f"moved {now - task.last_move_at:.0f}s ago; cooldown {left:.0f}s left"
    if local.node in suspect:
        return SUSPECT, f"this node ({local.node}) is suspect"
    if task.home and task.home in suspect:
        return SUSPECT, f"the task's home {task.home} is suspect"
    return None


def _target_problem(
    task: RunningTask,
    local: LoadReport,
    cand: Candidate,
    config: MigrationConfig,
    suspect: Collection[NodeId],
    in_flight_at: int,
) -> str | None:
    r = cand.report
    if cand.node == local.node:
        return "is this node"
    if cand.node in suspect:
        return "is suspect"
    if cand.age > config.max_report_age:
        return f"report is {cand.age:.0f}s old (max {config.max_report_age:.0f}s)"
    if r.shares - r.reserved_shares <= 0:
        return "is draining or has no unreserved shares"
    if task.mode is MigrateMode.CRIU and not r.criu:
        return "has no CRIU"
    if task.gpu is not None and not fits_summary(task.gpu, r.gpus):
        return "has no room for the task's GPU request"
    if task.constraints:
        unmet = unmet_constraints(task.constraints, dict(r.labels))
        if unmet is not None:
            return f"does not satisfy it: {unmet}"
    if in_flight_at >= config.max_per_node:
        return f"has {in_flight_at} migrations in flight (max {config.max_per_node})"
    return None


def _best_target(
    task: RunningTask,
    local: LoadReport,
    candidates: Sequence[Candidate],
    *,
    config: MigrationConfig,
    bandwidth: BandwidthEstimator,
    suspect: Collection[NodeId],
    in_flight: InFlight,
    moved_out: int,
    moved_to: Mapping[NodeId, int],
) -> tuple[Candidate, CostBenefit] | str:
    """The eligible candidate with the largest net gain, or why there is none."""
    options: list[tuple[float, NodeId, Candidate, CostBenefit]] = []
    problems: list[str] = []
    for cand in candidates:
        busy = in_flight.by_node.get(cand.node, 0) + moved_to.get(cand.node, 0)
        problem = _target_problem(task, local, cand, config, suspect, busy)
        if problem is not None:
            problems.append(f"{cand.node} {problem}")
            continue
        cb = cost_benefit(
            task,
            local,
            cand.report,
            config=config,
            bandwidth=bandwidth.estimate(cand.node, config.default_bandwidth),
            extra_here=-moved_out,
            extra_there=moved_to.get(cand.node, 0),
        )
        options.append((-(cb.gain - config.margin * cb.cost), cand.node, cand, cb))
    if not options:
        return "; ".join(problems) if problems else "no candidate targets"
    # Largest net gain first; the smaller node id breaks ties (deterministic).
    best = min(options, key=lambda o: (o[0], o[1]))
    return best[2], best[3]


def plan_migrations(
    tasks: Sequence[RunningTask],
    local: LoadReport,
    candidates: Sequence[Candidate | tuple[NodeId, LoadReport, float]],
    *,
    now: float,
    bucket: TokenBucket,
    config: MigrationConfig = MigrationConfig(),
    bandwidth: BandwidthEstimator | None = None,
    in_flight: InFlight = InFlight(),
    suspect: Collection[NodeId] = frozenset(),
) -> MigrationPlan:
    """Decide for every task; return all decisions, those to start now, and the bucket.

    Tasks are considered best-first (largest net gain against the unchanged loads),
    and each decided move updates the loads the following tasks see (one fewer task
    here, one more at its target), so a round never empties a node onto one peer.
    In dry-run the same bookkeeping runs on a copy of the bucket and the returned
    bucket is only refilled: reports show what would happen, nothing is spent.
    """
    bw = bandwidth if bandwidth is not None else BandwidthEstimator()
    tasks = list({t.task_id: t for t in reversed(tasks)}.values())[::-1]  # first wins
    freshest: dict[NodeId, Candidate] = {}
    for c in candidates:
        cand = c if isinstance(c, Candidate) else Candidate(*c)
        seen = freshest.get(cand.node)
        if seen is None or cand.age < seen.age:
            freshest[cand.node] = cand  # one entry per node: the freshest report
    cands = list(freshest.values())
    suspects = frozenset(suspect)

    def first_pass_key(t: RunningTask) -> tuple[int, float, TaskId]:
        if _task_block(t, local, now, config, suspects) is not None:
            return (1, 0.0, t.task_id)
        got = _best_target(
            t,
            local,
            cands,
            config=config,
            bandwidth=bw,
            suspect=suspects,
            in_flight=in_flight,
            moved_out=0,
            moved_to={},
        )
        if isinstance(got, str):
            return (1, 0.0, t.task_id)
        cb = got[1]
        return (0, -(cb.gain - config.margin * cb.cost), t.task_id)

    order = sorted(tasks, key=first_pass_key)
    decisions: dict[TaskId, MigrationDecision] = {}
    moved_to: dict[NodeId, int] = {}
    moved = 0
    tokens = bucket
    margin = config.margin

    for task in order:
        block = _task_block(task, local, now, config, suspects)
        got = _best_target(
            task,
            local,
            cands,
            config=config,
            bandwidth=bw,
            suspect=suspects,
            in_flight=in_flight,
            moved_out=moved,
            moved_to=moved_to,
        )
        target: NodeId | None = None
        cb: CostBenefit | None = None
        if not isinstance(got, str):
            target, cb = got[0].node, got[1]
        gain, cost = (cb.gain, cb.cost) if cb is not None else (0.0, 0.0)

        base = MigrationDecision(task.task_id, target, False, "", "", gain, cost, margin, cb)

        def verdict(code: str, reason: str, base: MigrationDecision = base) -> MigrationDecision:
            return attrs.evolve(base, code=code, reason=reason)

        if block is not None:
            decisions[task.task_id] = verdict(*block)
            continue
        if cb is None or target is None:
            decisions[task.task_id] = verdict(NO_TARGET, f"no eligible target: {got}")
            continue
        if not cb.worth_it(margin):
            decisions[task.task_id] = verdict(
                NOT_WORTH_IT,
                f"gain {gain:.1f}s <= margin {margin:g} x cost {cost:.1f}s (to {target})",
            )
            continue
        if in_flight.here + moved >= config.max_per_node:
            decisions[task.task_id] = verdict(
                NODE_LIMIT,
                f"{in_flight.here + moved} migrations in flight here (max {config.max_per_node})",
            )
            continue
        if in_flight.cluster + moved >= config.max_cluster:
            decisions[task.task_id] = verdict(
                CLUSTER_LIMIT,
                f"{in_flight.cluster + moved} migrations in flight in the cluster view "
                f"(max {config.max_cluster})",
            )
            continue
        granted, tokens = tokens.take(now)
        if not granted:
            decisions[task.task_id] = verdict(RATE_LIMIT, "global migration rate limit reached")
            continue
        moved += 1
        moved_to[target] = moved_to.get(target, 0) + 1
        why = f"gain {gain:.1f}s > margin {margin:g} x cost {cost:.1f}s (to {target})"
        if config.dry_run:
            decisions[task.task_id] = attrs.evolve(
                verdict(DRY_RUN, "dry run, would migrate: " + why), would_migrate=True
            )
        else:
            decisions[task.task_id] = attrs.evolve(
                verdict(MIGRATE, why), migrate=True, would_migrate=True
            )

    ordered = tuple(decisions[t.task_id] for t in tasks)
    out_bucket = bucket.refill(now) if config.dry_run else tokens.refill(now)
    return MigrationPlan(ordered, tuple(d for d in ordered if d.migrate), out_bucket)


# ------------------------------------------------------------------ the target's re-check


def recheck_at_target(
    task: RunningTask,
    source: LoadReport,
    target: LoadReport,
    *,
    config: MigrationConfig,
    bandwidth: float,
    incoming: int = 0,
) -> str | None:
    """The target's second opinion with its fresh load: None to accept, else why not.

    The source decided on a gossiped, possibly stale report of this node; the target
    knows its own load now and refuses a move that is no longer worth it, that it has
    no room for, or that would break its own in-flight limit.
    """
    if task.mode is MigrateMode.NEVER:
        return "the task opted out of migration (migrate=never)"
    if target.shares - target.reserved_shares <= 0:
        return "draining or no unreserved shares"
    if task.mode is MigrateMode.CRIU and not target.criu:
        return "CRIU is not available here"
    if task.gpu is not None and not fits_summary(task.gpu, target.gpus):
        return "no room for the task's GPU request"
    if incoming >= config.max_per_node:
        return f"{incoming} migrations in flight here (max {config.max_per_node})"
    cb = cost_benefit(task, source, target, config=config, bandwidth=bandwidth)
    if not cb.worth_it(config.margin):
        return (
            f"not worth it with this node's fresh load: gain {cb.gain:.1f}s <= "
            f"margin {config.margin:g} x cost {cb.cost:.1f}s"
        )
    return None


@attrs.frozen
class DurationEstimator:
    """EWMA of measured durations (pause, warm-up) per key, e.g. per migration mode.

    Negative or non-finite samples are dropped and counted."""

    alpha: float = 0.3
    values: Mapping[str, float] = attrs.field(factory=dict, hash=False)
    dropped: int = 0

    def observe(self, key: str, seconds: float) -> DurationEstimator:
        if not (math.isfinite(seconds) and seconds >= 0):
            return attrs.evolve(self, dropped=self.dropped + 1)
        old = self.values.get(key)
        new = seconds if old is None else (1 - self.alpha) * old + self.alpha * seconds
        return attrs.evolve(self, values={**self.values, key: new})

    def estimate(self, key: str, default: float) -> float:
        return self.values.get(key, default)
