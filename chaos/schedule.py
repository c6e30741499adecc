"""Seeded plans for a chaos run: the nemesis (which fault, where, when, for how long),
the drains, and the workload. Pure: the same seed and scenario give the same plan, so
a failing run is replayed with `python -m chaos.run --scenario NAME --seed S`
(the plan replays exactly; thread timing on a busy machine does not).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs

from swarm.node.state import Settings


@attrs.frozen
class Scenario:
    """What a run does. Durations are seconds of workload; faults stop before the end."""

    name: str
    nodes: int = 5
    duration: float = 40.0
    tasks: int = 120
    faults: tuple[str, ...] = ()  # kinds the nemesis draws from (lane 1)
    faults2: tuple[str, ...] = ()  # a second lane, overlapping the first
    hold: tuple[float, float] = (5.0, 10.0)  # how long a fault lasts
    gap: tuple[float, float] = (3.0, 6.0)  # quiet time between faults of one lane
    lane2: tuple[tuple[float, float], tuple[float, float]] | None = None  # its (hold, gap)
    drains: bool = True
    shim: str | None = None  # every agent runs under this transport fault spec
    tmpfs_node: bool = False  # node 1's state dir on a small tmpfs (disk-full)
    slots: int = 4
    task_seconds: tuple[float, float] = (0.1, 0.8)  # how long each task sleeps
    bursts: int = 0  # bursts of 8 tasks at one node, to build queues (transfers)
    settle: float = 120.0  # longest wait for acknowledged tasks after the last heal
    converge_bound: float = 60.0  # membership must agree within this after the last heal
    globals: int = 3
    canary: bool = False  # add a burst at node 1 drained right after (self-test workload)
    encrypted: bool = False  # agents share a generated cluster key instead of --insecure
    # two priority classes: waves of `low` tasks (task_seconds) fill every slot and queue,
    # `high` ones (high_seconds) come a little later and preempt them; `bursts` = waves
    priorities: bool = False
    high_seconds: tuple[float, float] = (0.3, 1.5)
    # node i gets `--labels rack=r{i%3+1},pool=a|b` (a when i is odd) and most tasks
    # hard constraints over them (CONSTRAINT_MENU)
    labels: bool = False
    # every agent carries the `[scale.chaos]` pool of chaos.elastic (issue 25), whose
    # hooks only record their calls; a light workload lets it scale in during the run
    elastic: bool = False
    home_grace: float | None = None  # agents' --home-grace (None: their default, 30 s)
    keep_tasks: str | None = None  # agents' --keep-tasks (None: their default, restart)
    profile: str | None = None  # agents' --profile (None: the suite's `local`)
    warmup: float = 4.0  # seconds of workload before the first fault of lane 1
    gangs: int = 0  # issue 22: this many gangs of 3 (2 in 3 strict), spread over the run
    groups: int = 0  # issue 23: this many arrays, each followed by dependent tasks
    late_binding: int = 0  # issue 24: agents' --late-binding (0: off)
    # issue 24: this many --idempotent tasks (some 6x slower on n1, the straggler node) and
    # agents that back a late one up after BACKUP_HISTORY runs of its class
    backups: int = 0
    description: str = ""


def restarts_only(sc: Scenario) -> bool:
    """Are agent restarts (SIGTERM, a new run at once) the scenario's only faults?"""
    return set(sc.faults) | set(sc.faults2) == {"restart"}


def home_grace(sc: Scenario) -> float:
    """The agents' --home-grace in this scenario (theirs by default)."""
    return sc.home_grace if sc.home_grace is not None else Settings().home_grace


def down_only(sc: Scenario) -> bool:
    """Are the scenario's faults agents down (killed, restarted, lost), none cut off or
    frozen (which may see a live home's tasks adopted: at-least-once by design)?"""
    return set(sc.faults) | set(sc.faults2) <= {"kill", "restart", "lose"}


@attrs.frozen
class FaultPlan:
    kind: str
    targets: tuple[int, ...]
    start: float
    end: float
    lane: int = 1


@attrs.frozen
class DrainPlan:
    node: int
    start: float
    end: float


@attrs.frozen
class SubmitPlan:
    at: float
    node: int
    kind: (
        str  # plain | weighted | reserved | no-retry | at-most-once | cancel | migratable | global
        # | idempotent (issue 24) | ...
    )
    seconds: float  # how long the task sleeps
    weight: float | None = None
    reserve: int = 0
    priority: str | None = None  # a priority class name (`swarm submit --priority`)
    constraints: tuple[str, ...] = ()  # hard constraints (`swarm submit --constraint`)
    # `cancel`: cancelled this long after its acknowledgement, at node `cancel_node`
    cancel_after: float = 0.0
    cancel_node: int = 0
    migrate: str | None = None  # `swarm submit --migrate` (kind `migratable`)
    gang: int = 0  # kind `gang`: `swarm submit --gang N` (issue 22)
    strict: bool = True
    array: str = ""  # kind `array`: `swarm submit --array` (issue 23)
    # kind `after`: `--after COND:P` where P is the `pick`-th latest acknowledged task
    cond: str = ""
    pick: int = 1


@attrs.frozen
class Plan:
    faults: tuple[FaultPlan, ...]
    drains: tuple[DrainPlan, ...]
    submits: tuple[SubmitPlan, ...]


def _targets(kind: str, n: int, rng: random.Random, tmpfs_node: int) -> tuple[int, ...]:
    nodes = list(range(1, n + 1))
    if kind == "disk-full":
        return (tmpfs_node,)
    if kind == "split":
        k = max(1, n // 2)
        return tuple(sorted(rng.sample(nodes, k)))
    if kind == "loss" and n >= 4:
        return tuple(sorted(rng.sample(nodes, 2)))
    return (rng.choice(nodes),)


def nemesis(
    sc: Scenario, kinds: Sequence[str], rng: random.Random, lane: int, warmup: float = 4.0
) -> list[FaultPlan]:
    """Faults one after another (within a lane), each healed before the next starts;
    the last one is healed a few seconds before the workload ends."""
    if lane == 2 and sc.lane2 is not None:
        sc = attrs.evolve(sc, hold=sc.lane2[0], gap=sc.lane2[1])
    out: list[FaultPlan] = []
    if not kinds:
        return out
    t = warmup + rng.uniform(0.0, 2.0)
    end_by = sc.duration - 3.0
    order: list[str] = []
    while True:
        if not order:  # every kind once, in a random order, then again
            order = rng.sample(list(kinds), len(kinds))
        kind = order.pop()
        hold = rng.uniform(*sc.hold)
        if t + hold > end_by:
            if out:
                break
            hold = max(2.0, end_by - t)
        out.append(FaultPlan(kind, _targets(kind, sc.nodes, rng, 1), t, t + hold, lane))
        t += hold + rng.uniform(*sc.gap)
        if t >= end_by - 2.0:
            break
    return out


def drains(sc: Scenario, rng: random.Random) -> list[DrainPlan]:
    """One node drained at a time, for a few seconds, now and then."""
    out: list[DrainPlan] = []
    if not sc.drains or sc.nodes < 2:
        return out
    t = 2.0 + rng.uniform(0.0, 4.0)
    while t + 3.0 < sc.duration - 2.0:
        hold = rng.uniform(3.0, 7.0)
        out.append(DrainPlan(rng.randint(1, sc.nodes), t, min(t + hold, sc.duration - 2.0)))
        t += hold + rng.uniform(3.0, 9.0)
    return out


def workload(sc: Scenario, rng: random.Random) -> list[SubmitPlan]:
    """Short tasks at random nodes and times: plain, weighted, reserved, --no-retry,
    --at-most-once, cancelled from a random node a moment after their acknowledgement,
    --migrate restart ones, a few global ones, and bursts at one node."""
    out: list[SubmitPlan] = []
    span = max(1.0, sc.duration - 4.0)
    times = [rng.uniform(0.5, span) for _ in range(sc.tasks)]
    nodes = [rng.randint(1, sc.nodes) for _ in range(sc.tasks)]
    for b in range(sc.bursts):
        at, node = span * (b + 0.3) / sc.bursts, rng.randint(1, sc.nodes)
        times += [at + 0.01 * k for k in range(8)]
        nodes += [node] * 8
    for at, node in zip(times, nodes, strict=True):
        secs = round(rng.uniform(*sc.task_seconds), 2)
        r = rng.random()
        if r < 0.55:
            out.append(SubmitPlan(at, node, "plain", secs))
        elif r < 0.72:
            out.append(SubmitPlan(at, node, "weighted", secs, weight=round(rng.uniform(0.5, 4), 2)))
        elif r < 0.84:
            reserve = rng.choice([200, 300, 400, 600])
            out.append(SubmitPlan(at, node, "reserved", secs, reserve=reserve))
        elif r < 0.89:
            out.append(SubmitPlan(at, node, "no-retry", secs))
        elif r < 0.94:
            out.append(SubmitPlan(at, node, "at-most-once", secs))
        elif r < 0.97:
            # longer than it waits to be cancelled, from any node
            after, by = round(rng.uniform(0.3, 2.0), 2), rng.randint(1, sc.nodes)
            out.append(
                SubmitPlan(at, node, "cancel", secs + 3.0, cancel_after=after, cancel_node=by)
            )
        else:
            out.append(SubmitPlan(at, node, "migratable", secs * 3, migrate="restart"))
    for k in range(sc.globals):
        at = span * (k + 0.5) / max(1, sc.globals)
        out.append(SubmitPlan(at, rng.randint(1, sc.nodes), "global", 0.2))
    out.sort(key=lambda s: s.at)
    return out


def gang_workload(sc: Scenario, seed: int) -> list[SubmitPlan]:
    """`sc.gangs` gangs of 3 members at random nodes over the run, each member beating
    for 2-6 s; two in three strict, the others non-strict with at least 2."""
    rng = random.Random(f"{sc.name}:{seed}:gangs")
    span = max(1.0, sc.duration - 4.0)
    out = []
    for k in range(sc.gangs):
        at = span * (k + rng.uniform(0.1, 0.9)) / sc.gangs
        secs = round(rng.uniform(2.0, 6.0), 2)
        out.append(
            SubmitPlan(at, rng.randint(1, sc.nodes), "gang", secs, gang=3, strict=k % 3 != 2)
        )
    return out


def group_workload(sc: Scenario, seed: int) -> list[SubmitPlan]:
    """`sc.groups` arrays of 4-12 short elements (most with a cap), each followed a
    moment later by a few tasks --after it or after the tasks before them: chains of
    ok / any / notok over arrays, elements and single tasks."""
    rng = random.Random(f"{sc.name}:{seed}:groups")
    span = max(1.0, sc.duration - 6.0)
    out = []
    for k in range(sc.groups):
        at = span * (k + rng.uniform(0.05, 0.6)) / sc.groups
        n = rng.randint(4, 12)
        cap = f"%{rng.randint(1, 4)}" if rng.random() < 0.7 else ""
        node = rng.randint(1, sc.nodes)
        out.append(
            SubmitPlan(at, node, "array", round(rng.uniform(0.2, 1.0), 2), array=f"0-{n - 1}{cap}")
        )
        for d in range(rng.randint(1, 3)):
            cond = rng.choice(["ok", "any", "any", "notok"])
            out.append(
                SubmitPlan(
                    at + 0.3 + 0.2 * d,
                    rng.randint(1, sc.nodes),
                    "after",
                    round(rng.uniform(0.2, 1.0), 2),
                    cond=cond,
                    pick=rng.randint(1, 2),
                )
            )
    return out


def priority_workload(sc: Scenario, rng: random.Random) -> list[SubmitPlan]:
    """Waves: every node gets `slots + 1` low tasks at once (every slot taken, one more
    queued), then, 1 s to 70 % of the wave later, `nodes // 2 + 1` high tasks at random
    nodes, which find every slot held by low work and so preempt it."""
    out: list[SubmitPlan] = []
    span = max(1.0, sc.duration - 4.0)
    waves = max(1, sc.bursts)
    period = span / waves
    for w in range(waves):
        at = 0.5 + period * w
        for node in range(1, sc.nodes + 1):
            for k in range(sc.slots + 1):
                secs = round(rng.uniform(*sc.task_seconds), 2)
                t = at + 0.02 * k + rng.uniform(0.0, 0.3)
                out.append(SubmitPlan(t, node, "low", secs, priority="low"))
        for _ in range(sc.nodes // 2 + 1):
            t = at + rng.uniform(1.0, max(1.5, 0.7 * period))
            secs = round(rng.uniform(*sc.high_seconds), 2)
            out.append(SubmitPlan(t, rng.randint(1, sc.nodes), "high", secs, priority="high"))
    out.sort(key=lambda s: s.at)
    return out


# What a labelled scenario's tasks ask for (one set each); with 6 nodes every set is met
# by 2-4 of them, so a kill or a cut can leave a task only one node or none for a while.
CONSTRAINT_MENU: tuple[tuple[str, ...], ...] = (
    ("pool=a",),
    ("pool!=a",),
    ("rack in r1,r2",),
    ("rack!=r3",),
    ("rack notin r1",),
    ("rack=r2",),
    ("pool=b", "rack in r2,r3"),
    ("rack~^r[13]$",),
    ("pool==a", "rack!=r1"),
)
CONSTRAINED_SHARE = 0.8  # of the ordinary tasks


def node_labels(sc: Scenario) -> dict[int, dict[str, str]]:
    """Node index -> the labels the harness gives it (none unless `sc.labels`)."""
    if not sc.labels:
        return {}
    return {
        i: {"rack": f"r{i % 3 + 1}", "pool": "a" if i % 2 else "b"} for i in range(1, sc.nodes + 1)
    }


def constrain(submits: Sequence[SubmitPlan], rng: random.Random) -> list[SubmitPlan]:
    """Most ordinary tasks get a constraint set from CONSTRAINT_MENU (global tasks take
    none: a global task runs everywhere)."""
    out = []
    for sp in submits:
        if sp.kind != "global" and rng.random() < CONSTRAINED_SHARE:
            sp = attrs.evolve(sp, constraints=rng.choice(CONSTRAINT_MENU))
        out.append(sp)
    return out


def canary_burst(sc: Scenario) -> tuple[list[SubmitPlan], list[DrainPlan]]:
    """The other nodes drained first, so that a burst at node 1 of long-ish tasks and of
    reserving tasks that cannot all run at once stays in node 1's run queue; then node 1
    drained too while most of them still wait there (with every node drained, nothing
    can move them away). A build that ignores drain or oversubscribes reservations shows
    it here every time."""
    burst = []
    for k in range(8):
        burst.append(SubmitPlan(1.0 + 0.02 * k, 1, "plain", 2.0))
        burst.append(SubmitPlan(1.01 + 0.02 * k, 1, "reserved", 1.5, reserve=600))
    until = min(7.0, sc.duration - 1.0)
    others = [DrainPlan(i, 0.3, until) for i in range(2, sc.nodes + 1)]
    return burst, [*others, DrainPlan(1, 1.6, until)]


BACKUP_HISTORY = 3  # agents' --backup-history with backups (5 left seed 1025 with none)
BACKUP_BUDGET = 0.5  # ... and --backup-budget (a short run earns little budget)


def backup_workload(sc: Scenario, seed: int) -> list[SubmitPlan]:
    """`sc.backups` --idempotent tasks at random nodes over the run (kind `idempotent`,
    all of one class: their name), so that every home has a history of them early."""
    rng = random.Random(f"{sc.name}:{seed}:backups")
    span = max(1.0, sc.duration - 4.0)
    out = []
    for _ in range(sc.backups):
        at = rng.uniform(0.5, span)
        secs = round(rng.uniform(*sc.task_seconds), 2)
        out.append(SubmitPlan(at, rng.randint(1, sc.nodes), "idempotent", secs))
    return out


def make_plan(sc: Scenario, seed: int, available: Sequence[str] | None = None) -> Plan:
    """The whole plan of a run; fault kinds not in `available` (e.g. network faults
    without root) are left out."""
    rng = random.Random(f"{sc.name}:{seed}")
    ok = set(available) if available is not None else None
    lane1 = [k for k in sc.faults if ok is None or k in ok]
    lane2 = [k for k in sc.faults2 if ok is None or k in ok]
    faults = nemesis(sc, lane1, rng, 1, warmup=sc.warmup) + nemesis(sc, lane2, rng, 2, warmup=8.0)
    faults.sort(key=lambda f: f.start)
    submits = priority_workload(sc, rng) if sc.priorities else workload(sc, rng)
    drain_plan = drains(sc, rng)
    if sc.labels:
        submits = constrain(submits, rng)
    if sc.canary:
        burst, drain_plan = canary_burst(sc)
        submits = sorted([*submits, *burst], key=lambda s: s.at)
    if sc.gangs:  # drawn from a stream of their own: the other draws stay as they were
        submits = sorted([*submits, *gang_workload(sc, seed)], key=lambda s: s.at)
    if sc.groups:
        submits = sorted([*submits, *group_workload(sc, seed)], key=lambda s: s.at)
    if sc.backups:
        submits = sorted([*submits, *backup_workload(sc, seed)], key=lambda s: s.at)
    return Plan(tuple(faults), tuple(drain_plan), tuple(submits))
