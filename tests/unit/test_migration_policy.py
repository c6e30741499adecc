"""Migration decision: the cost-benefit threshold and every safety limit."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import attrs
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from swarm.model import GpuDeviceFree, GpuRequest, LoadReport, MigrateMode
from swarm.policy import migration as mig
from swarm.policy.migration import (
    BandwidthEstimator,
    InFlight,
    MigrationConfig,
    RunningTask,
    TokenBucket,
    plan_migrations,
)

NOW = 10_000.0
GEN = MigrationConfig(
    max_per_node=100,
    max_cluster=100,
    cooldown=0.0,
    max_moves=100,
    burst=100.0,
    max_report_age=1e9,
)


def report(node: str, running: int = 0, slots: int = 4, lpc: float = 0.0, **kw: Any) -> LoadReport:
    return LoadReport(node=node, version=1, running=running, slots=slots, load_per_core=lpc, **kw)


def task(tid: str = "t", **kw: Any) -> RunningTask:
    base: dict[str, Any] = {"mode": MigrateMode.CHECKPOINT, "age": 1000.0, "home": "home"}
    base.update(kw)
    return RunningTask(task_id=tid, **base)


def plan(
    tasks: list[RunningTask],
    local: LoadReport,
    cands: list[tuple[str, LoadReport, float]],
    config: MigrationConfig = GEN,
    **kw: Any,
) -> mig.MigrationPlan:
    kw.setdefault("bucket", config.new_bucket(NOW))
    return plan_migrations(tasks, local, cands, now=NOW, config=config, **kw)


# ----------------------------------------------------------- oracle (restated)


def o_slow(r: LoadReport, extra: int) -> float:
    cores = r.cpus if r.cpus > 0 else max(1, r.slots)
    return max(1.0, (r.running + extra) / cores, r.load_per_core + extra / cores)


def o_gain_cost(
    t: RunningTask, here: LoadReport, there: LoadReport, bw: float, factor: float
) -> tuple[float, float]:
    if t.expected_runtime is not None and t.expected_runtime > t.age:
        remaining = t.expected_runtime - t.age
    else:
        remaining = factor * t.age
    gain = remaining * (o_slow(here, 0) - o_slow(there, 1))
    cost = t.state_bytes / bw + t.pause + t.warmup
    if t.mode is MigrateMode.RESTART:
        cost += t.age
    return gain, cost


loads = st.builds(
    report,
    node=st.just("x"),
    running=st.integers(0, 64),
    slots=st.integers(1, 16),
    lpc=st.floats(0, 16),
    cpus=st.sampled_from([0.0, 0.5, 2.0, 16.0]),
)
tasks_st = st.builds(
    task,
    tid=st.just("t"),
    mode=st.sampled_from([MigrateMode.CHECKPOINT, MigrateMode.RESTART, MigrateMode.CRIU]),
    age=st.floats(0, 1e5),
    expected_runtime=st.none() | st.floats(0, 2e5),
    state_bytes=st.integers(0, 2**36),
    pause=st.floats(0, 600),
    warmup=st.floats(0, 600),
)


@settings(max_examples=400, deadline=None)
@given(
    tasks_st,
    loads,
    loads,
    st.floats(1.0, 4.0),
    st.floats(0.1, 3.0),
    st.floats(1e5, 1e10),
)
def test_threshold_exactly_when_no_limit_applies(
    t: RunningTask,
    here: LoadReport,
    there: LoadReport,
    margin: float,
    factor: float,
    bw: float,
) -> None:
    here = attrs.evolve(here, node="me", criu=True)
    there = attrs.evolve(there, node="peer", criu=True)
    cfg = attrs.evolve(GEN, margin=margin, age_factor=factor, default_bandwidth=bw)
    gain, cost = o_gain_cost(t, here, there, bw, factor)
    # Stay off the razor's edge where float rounding could decide either way.
    assume(abs(gain - margin * cost) > 1e-6 * max(1.0, abs(gain), margin * cost))
    p = plan([t], here, [("peer", there, 0.0)], cfg)
    (d,) = p.decisions
    assert d.gain == pytest.approx(gain, rel=1e-9, abs=1e-9)
    assert d.cost == pytest.approx(cost, rel=1e-9, abs=1e-9)
    assert d.migrate == (gain > margin * cost), d.reason
    assert d.code == (mig.MIGRATE if d.migrate else mig.NOT_WORTH_IT)
    assert p.start == ((d,) if d.migrate else ())


# ------------------------------------------------------------- every limit


LIMITS = (
    "never",
    "criu",
    "moves",
    "cooldown",
    "suspect",
    "stale",
    "draining",
    "node",
    "target",
    "cluster",
    "rate",
    "dry",
)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """Busy node, movable tasks; a few limits switched on (tight, random values) and
    the rest permissive, so that each limit is exercised where it alone decides."""
    on = draw(st.sets(st.sampled_from(LIMITS), max_size=3))

    def pick(limit: str, tight: st.SearchStrategy[Any], loose: Any) -> Any:
        return draw(tight) if limit in on else loose

    nodes = ["a", "b", "c", "d"]
    n_tasks = draw(st.integers(1, 6))
    modes = [MigrateMode.CHECKPOINT, MigrateMode.RESTART, MigrateMode.CRIU]
    tasks = [
        task(
            f"t{i}",
            mode=draw(st.sampled_from([*modes, MigrateMode.NEVER] if "never" in on else modes)),
            age=draw(st.floats(0, 1e4)),
            expected_runtime=draw(st.none() | st.floats(0, 2e4)),
            state_bytes=draw(st.integers(0, 2**32)),
            pause=draw(st.floats(0, 60)),
            warmup=draw(st.floats(0, 60)),
            moves=pick("moves", st.integers(0, 4), 0),
            last_move_at=pick("cooldown", st.none() | st.floats(NOW - 2000, NOW), None),
            home=draw(st.sampled_from(["me", *nodes])),
        )
        for i in range(n_tasks)
    ]
    local = report(
        "me",
        running=draw(st.integers(n_tasks, 40)),
        slots=draw(st.integers(1, 8)),
        lpc=draw(st.floats(0, 8)),
        criu=pick("criu", st.booleans(), True),
    )
    cand_nodes = draw(st.lists(st.sampled_from([*nodes, "me"]), min_size=1, max_size=4))
    cands = [
        (
            n,
            report(
                n,
                running=draw(st.integers(0, 10)),
                slots=draw(st.integers(1, 8)),
                lpc=draw(st.floats(0, 4)),
                criu=pick("criu", st.booleans(), True),
                shares=pick("draining", st.sampled_from([0, 1024]), 1024),
            ),
            draw(st.floats(0, 60)),
        )
        for n in cand_nodes
    ]
    cfg = MigrationConfig(
        margin=draw(st.floats(1.0, 3.0)),
        max_per_node=pick("node", st.integers(0, 3), 100),
        max_cluster=pick("cluster", st.integers(0, 5), 100),
        cooldown=pick("cooldown", st.floats(0, 1500), 0.0),
        max_moves=pick("moves", st.integers(0, 4), 100),
        rate=pick("rate", st.floats(0, 0.1), 0.0),
        burst=pick("rate", st.floats(0, 3), 100.0),
        max_report_age=pick("stale", st.floats(0, 60), 1e9),
        dry_run="dry" in on,
        default_bandwidth=draw(st.floats(1e6, 1e9)),
    )
    tokens = pick("rate", st.floats(0, cfg.burst), cfg.burst)
    bucket = TokenBucket(cfg.rate, cfg.burst, tokens, NOW - draw(st.floats(0, 100)))
    in_flight = InFlight(
        here=pick("node", st.integers(0, 3), 0),
        cluster=pick("cluster", st.integers(0, 6), 0),
        by_node=pick(
            "target",
            st.dictionaries(st.sampled_from(nodes), st.integers(0, 2)),
            {},
        ),
    )
    if "target" in on and cfg.max_per_node == 100:
        cfg = attrs.evolve(cfg, max_per_node=draw(st.integers(1, 3)))
    suspect = frozenset(
        pick("suspect", st.lists(st.sampled_from([*nodes, "me", "home"]), max_size=2), [])
    )
    return Scenario(tasks, local, cands, cfg, bucket, in_flight, suspect)


@attrs.frozen
class Scenario:
    tasks: list[RunningTask]
    local: LoadReport
    cands: list[tuple[str, LoadReport, float]]
    config: MigrationConfig
    bucket: TokenBucket
    in_flight: InFlight
    suspect: frozenset[str]


def run(s: Scenario) -> mig.MigrationPlan:
    return plan_migrations(
        s.tasks,
        s.local,
        s.cands,
        now=NOW,
        bucket=s.bucket,
        config=s.config,
        in_flight=s.in_flight,
        suspect=s.suspect,
    )


CODES = {
    mig.MIGRATE,
    mig.DRY_RUN,
    mig.NEVER,
    mig.NO_CRIU,
    mig.MAX_MOVES,
    mig.COOLDOWN,
    mig.SUSPECT,
    mig.NO_TARGET,
    mig.NOT_WORTH_IT,
    mig.NODE_LIMIT,
    mig.CLUSTER_LIMIT,
    mig.RATE_LIMIT,
}


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_every_limit_is_respected(s: Scenario) -> None:
    p = run(s)
    cfg, tasks, local, flight = s.config, s.tasks, s.local, s.in_flight
    suspect, bucket = s.suspect, s.bucket
    cands: dict[str, tuple[LoadReport, float]] = {}
    for n, r, age in s.cands:  # the decision keeps the freshest report per node
        if n not in cands or age < cands[n][1]:
            cands[n] = (r, age)

    assert [d.task_id for d in p.decisions] == [t.task_id for t in tasks]
    assert all(d.code in CODES for d in p.decisions)
    assert all(d.migrate == (d.code == mig.MIGRATE) for d in p.decisions)
    assert p.start == tuple(d for d in p.decisions if d.migrate)
    by_id = {t.task_id: t for t in tasks}
    yes = [d for d in p.decisions if d.would_migrate]
    if cfg.dry_run:
        assert p.start == ()
        assert all(d.code == mig.DRY_RUN for d in yes)
        assert p.bucket == bucket.refill(NOW)
    else:
        assert list(p.start) == yes

    # Concurrency here, in the cluster view, and at each target.
    assert len(yes) <= max(0, cfg.max_per_node - flight.here)
    assert len(yes) <= max(0, cfg.max_cluster - flight.cluster)
    per_target = Counter(d.target for d in yes)
    for target, count in per_target.items():
        assert target is not None
        assert count + flight.by_node.get(target, 0) <= cfg.max_per_node
    # Global rate limit.
    assert len(yes) <= math.floor(bucket.refill(NOW).tokens + 1e-9)
    for d in yes:
        t = by_id[d.task_id]
        assert d.target in cands and d.target != local.node
        r, age = cands[d.target]
        assert d.gain > d.margin * d.cost
        assert t.mode is not MigrateMode.NEVER
        if t.mode is MigrateMode.CRIU:
            assert local.criu and r.criu
        assert t.moves < cfg.max_moves
        assert t.last_move_at is None or NOW - t.last_move_at >= cfg.cooldown
        assert t.home not in suspect and d.target not in suspect and local.node not in suspect
        assert age <= cfg.max_report_age
        assert r.shares - r.reserved_shares > 0


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_dry_run_reports_exactly_what_a_real_run_would_do(s: Scenario) -> None:
    dry = run(attrs.evolve(s, config=attrs.evolve(s.config, dry_run=True)))
    real = run(attrs.evolve(s, config=attrs.evolve(s.config, dry_run=False)))
    assert [(d.task_id, d.target, d.would_migrate) for d in dry.decisions] == [
        (d.task_id, d.target, d.would_migrate) for d in real.decisions
    ]
    assert dry.start == ()


# ------------------------------------------------------------- examples


def test_never_mode_never_moves_however_large_the_gain() -> None:
    p = plan([task(mode=MigrateMode.NEVER, age=1e6)], report("me", 64, 1), [("p", report("p"), 0)])
    (d,) = p.decisions
    assert not d.migrate and d.code == mig.NEVER and d.gain > 0
    assert "opted out" in d.reason


def test_criu_needs_both_ends() -> None:
    t = task(mode=MigrateMode.CRIU)
    busy, idle = report("me", 40, 4, criu=True), report("p", criu=True)
    assert plan([t], busy, [("p", idle, 0)]).decisions[0].migrate
    d = plan([t], attrs.evolve(busy, criu=False), [("p", idle, 0)]).decisions[0]
    assert d.code == mig.NO_CRIU
    d = plan([t], busy, [("p", attrs.evolve(idle, criu=False), 0)]).decisions[0]
    assert d.code == mig.NO_TARGET and "has no CRIU" in d.reason


def test_heavy_tail_leaves_young_tasks_and_moves_old_ones() -> None:
    here, there = report("me", 8, 4), report("p", 0, 4)  # slowdown 2 vs 1
    young = task("young", age=5.0, pause=10.0)
    old = task("old", age=100.0, pause=10.0)
    p = plan([young, old], here, [("p", there, 0)])
    d_young, d_old = p.decisions
    assert d_young.code == mig.NOT_WORTH_IT and d_young.figures is not None
    assert d_young.figures.remaining == 5.0
    assert d_old.migrate and d_old.figures is not None and d_old.figures.remaining == 100.0
    # The age factor is configurable.
    cfg = attrs.evolve(GEN, age_factor=0.1)
    assert not plan([old], here, [("p", there, 0)], cfg).decisions[0].migrate


def test_declared_runtime_near_its_end_stays() -> None:
    here, there = report("me", 8, 4), report("p", 0, 4)
    almost = task(age=1000.0, expected_runtime=1005.0, pause=10.0)
    d = plan([almost], here, [("p", there, 0)]).decisions[0]
    assert d.code == mig.NOT_WORTH_IT and d.figures is not None and d.figures.remaining == 5.0
    # An overrun declaration falls back to the age rule.
    overrun = task(age=1000.0, expected_runtime=500.0, pause=10.0)
    d = plan([overrun], here, [("p", there, 0)]).decisions[0]
    assert d.migrate and d.figures is not None and d.figures.remaining == 1000.0


def test_restart_counts_lost_work() -> None:
    here, there = report("me", 8, 4), report("p", 0, 4)
    d = plan([task(mode=MigrateMode.RESTART, age=100.0)], here, [("p", there, 0)]).decisions[0]
    assert d.figures is not None and d.figures.lost_work == 100.0
    assert d.cost == 100.0 and d.gain == 100.0 and not d.migrate
    d = plan(
        [task(mode=MigrateMode.RESTART, age=100.0, expected_runtime=1000.0)],
        here,
        [("p", there, 0)],
    ).decisions[0]
    assert d.migrate and d.gain == 900.0


def test_bandwidth_ewma_feeds_the_cost() -> None:
    bw = BandwidthEstimator(alpha=0.5)
    assert bw.estimate("p", 7.0) == 7.0
    bw = bw.observe("p", 1000, 1.0).observe("p", 3000, 1.0)
    assert bw.estimate("p", 7.0) == pytest.approx(2000.0)
    bw2 = bw.observe("p", 0, 1.0).observe("p", 10, 0.0).observe("p", 10, math.inf)
    assert bw2.dropped == 3 and bw2.peers == bw.peers
    here, there = report("me", 8, 4), report("p", 0, 4)
    t = task(age=100.0, state_bytes=10**6)
    fast = plan([t], here, [("p", there, 0)], bandwidth=BandwidthEstimator(peers={"p": 1e9}))
    slow = plan([t], here, [("p", there, 0)], bandwidth=bw)
    assert fast.decisions[0].migrate
    assert slow.decisions[0].code == mig.NOT_WORTH_IT
    assert slow.decisions[0].cost == pytest.approx(500.0)


def test_round_bookkeeping_spreads_moves() -> None:
    # Four equal old tasks on an overloaded node; two idle peers.
    here = report("me", 4, 2)
    tasks = [task(f"t{i}", age=1000.0, pause=1.0) for i in range(4)]
    cands = [("p", report("p", 0, 1), 0.0), ("q", report("q", 0, 1), 0.0)]
    p = plan(tasks, here, cands)
    targets = Counter(d.target for d in p.start)
    # Each move lowers the load here and raises it there: slowdown 2 here, so two
    # leave (one to each peer) and the rest see no gain left.
    assert len(p.start) == 2
    assert set(targets) == {"p", "q"}
    assert {d.code for d in p.decisions if not d.migrate} == {mig.NOT_WORTH_IT}


def test_best_first_gets_the_scarce_slot() -> None:
    here, there = report("me", 8, 4), report("p", 0, 4)
    small = task("small", age=50.0)
    big = task("big", age=5000.0)
    cfg = attrs.evolve(GEN, max_per_node=1)
    p = plan([small, big], here, [("p", there, 0), ("q", there, 0)], cfg)
    assert [d.task_id for d in p.start] == ["big"]
    assert p.decisions[0].code == mig.NODE_LIMIT


@pytest.mark.parametrize(
    ("change", "code", "words"),
    [
        ({"moves": 3}, mig.MAX_MOVES, "max 3"),
        ({"last_move_at": NOW - 100}, mig.COOLDOWN, "cooldown"),
        ({"home": "sick"}, mig.SUSPECT, "home sick is suspect"),
    ],
)
def test_task_limits(change: dict[str, Any], code: str, words: str) -> None:
    cfg = attrs.evolve(GEN, max_moves=3, cooldown=600.0)
    p = plan(
        [task(**change)],
        report("me", 8, 4),
        [("p", report("p"), 0)],
        cfg,
        suspect={"sick"},
    )
    d = p.decisions[0]
    assert (d.code, d.migrate) == (code, False)
    assert words in d.reason
    assert d.gain > d.margin * d.cost  # it would have been worth it


@pytest.mark.parametrize(
    ("cand", "words"),
    [
        (("me", report("me"), 0.0), "is this node"),
        (("sick", report("sick"), 0.0), "is suspect"),
        (("p", report("p"), 99.0), "old"),
        (("p", report("p", shares=0), 0.0), "draining"),
        (("p", report("p", shares=10, reserved_shares=10), 0.0), "no unreserved shares"),
    ],
)
def test_target_filters(cand: tuple[str, LoadReport, float], words: str) -> None:
    cfg = attrs.evolve(GEN, max_report_age=30.0)
    d = plan([task()], report("me", 8, 4), [cand], cfg, suspect={"sick"}).decisions[0]
    assert d.code == mig.NO_TARGET and words in d.reason and d.target is None


def test_suspect_self_blocks_everything() -> None:
    d = plan([task()], report("me", 8, 4), [("p", report("p"), 0)], suspect={"me"}).decisions[0]
    assert d.code == mig.SUSPECT and "this node" in d.reason


def test_gpu_tasks_need_room_at_the_target() -> None:
    t = task(gpu=GpuRequest(core=50, memory_ratio=50))
    full = report("p", gpus=(GpuDeviceFree(0, 10, 0, 100),))
    roomy = report("q", gpus=(GpuDeviceFree(0, 100, 100, 100),))
    d = plan([t], report("me", 8, 4), [("p", full, 0), ("q", roomy, 0)]).decisions[0]
    assert d.migrate and d.target == "q"


def test_target_concurrency_and_cluster_limit() -> None:
    cfg = attrs.evolve(GEN, max_per_node=1, max_cluster=3)
    here, there = report("me", 8, 4), report("p")
    d = plan(
        [task()], here, [("p", there, 0)], cfg, in_flight=InFlight(by_node={"p": 1})
    ).decisions[0]
    assert d.code == mig.NO_TARGET and "in flight" in d.reason
    d = plan([task()], here, [("p", there, 0)], cfg, in_flight=InFlight(here=1)).decisions[0]
    assert d.code == mig.NODE_LIMIT
    d = plan([task()], here, [("p", there, 0)], cfg, in_flight=InFlight(cluster=3)).decisions[0]
    assert d.code == mig.CLUSTER_LIMIT


def test_rate_limit_and_dry_run() -> None:
    here, there = report("me", 8, 4), report("p")
    cfg = attrs.evolve(GEN, rate=0.5, burst=1.0)
    empty = TokenBucket(0.5, 1.0, 0.0, NOW - 1.0)  # refills to 0.5: not enough
    d = plan([task()], here, [("p", there, 0)], cfg, bucket=empty).decisions[0]
    assert d.code == mig.RATE_LIMIT
    p = plan([task()], here, [("p", there, 0)], cfg, bucket=TokenBucket(0.5, 1.0, 0.0, NOW - 2.0))
    assert p.decisions[0].migrate and p.bucket.tokens == pytest.approx(0.0)
    dry = attrs.evolve(cfg, dry_run=True)
    p = plan([task()], here, [("p", there, 0)], dry, bucket=TokenBucket(0.5, 1.0, 1.0, NOW))
    (d,) = p.decisions
    assert (d.migrate, d.would_migrate, d.code) == (False, True, mig.DRY_RUN)
    assert "would migrate" in d.reason and p.start == () and p.bucket.tokens == 1.0


def test_token_bucket() -> None:
    b = TokenBucket.full(rate=1.0, burst=2.0, now=0.0)
    ok, b = b.take(0.0)
    ok2, b = b.take(0.0)
    ok3, b = b.take(0.0)
    assert (ok, ok2, ok3) == (True, True, False)
    assert b.refill(100.0).tokens == 2.0  # capped at burst
    assert b.refill(-5.0) == b  # clock went backwards: no refill, no error
    ok, b = b.take(1.0)
    assert ok and b.tokens == pytest.approx(0.0)
    fresh = TokenBucket.full(1.0, 1.0)
    assert fresh.take(5.0)[0]


def test_duplicate_task_ids_get_one_decision() -> None:
    p = plan([task("t"), task("t", age=1.0)], report("me", 8, 4), [("p", report("p"), 0)])
    assert len(p.decisions) == 1 and p.decisions[0].figures is not None
    assert p.decisions[0].figures.remaining == 1000.0


@pytest.mark.parametrize(
    "bad", [{"margin": 0}, {"default_bandwidth": -1}, {"cooldown": -1}, {"max_moves": -1}]
)
def test_config_validation(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="migration: "):
        MigrationConfig(**bad)


def test_custom_slowdown_model() -> None:
    def gpu_bound(r: LoadReport, extra: int) -> float:
        return 1.0 + sum(100 - g.free_core for g in r.gpus) / 100 + 0 * extra

    cfg = attrs.evolve(GEN, slowdown=gpu_bound)
    here = report("me", 0, 4, gpus=(GpuDeviceFree(0, 0, 0, 1),))
    there = report("p", 50, 4, gpus=(GpuDeviceFree(0, 100, 1, 1),))
    d = plan([task(age=100.0)], here, [("p", there, 0)], cfg).decisions[0]
    assert d.migrate and d.gain == pytest.approx(100.0)


def test_cpu_slowdown_uses_reported_cores() -> None:
    r = report("x", running=8, slots=2, lpc=0.5)
    assert mig.cpu_slowdown(r) == 4.0  # no cores reported: slots stand in
    r = attrs.evolve(r, cpus=16.0)
    assert mig.cpu_slowdown(r) == 1.0
    assert mig.cpu_slowdown(r, 8) == 1.0
    assert mig.cpu_slowdown(r, 24) == 2.0
    assert mig.cpu_slowdown(attrs.evolve(r, load_per_core=3.0), 16) == 4.0
