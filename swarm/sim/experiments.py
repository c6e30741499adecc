"""The experiments of `swarm sim NAME`: each runs, plots and explains itself.

Every experiment returns a `report.Outcome` (tables, figures, prose with the figures it
measured, and the checks the issue asks for) and writes NAME.csv, NAME.png and NAME.md
into the output directory. Sizes default to a few tens of seconds each on one core;
`nodes` and `tasks` override them. Time is in units of the mean service time S.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from swarm.policy import migration as mig
from swarm.policy.latebind import LateConfig
from swarm.policy.transfer import TransferConfig

from . import balls as balls_mod
from . import constraintsim, elasticsim, gangsim, hedgesim, localitysim, plots
from . import fairsim as fs
from .calibrate import measure_load_age
from .engine import (
    FRONTEND,
    NODE,
    Board,
    GossipAge,
    Jsq,
    LeastLoaded,
    MigrationSpec,
    PowerOfD,
    SimConfig,
    SimResult,
    Strategy,
    simulate,
)
from .flexsim import FLEX, LRF, FlexResult, FlexSimConfig, flex_config, run_flex
from .gpusim import GpuResult, GpuSimConfig, run_gpu
from .report import T975, Outcome, Table, mean_ci  # noqa: F401  (re-exported: tests and sims use them here)
from .workloads import (
    BoundedPareto,
    Exponential,
    NodeSpec,
    ServiceDist,
    hetero_nodes,
    poisson,
    uniform_nodes,
)

# `swarm sim NAME --quick`: the sizes of the reproducibility test (every experiment's
# CSVs at these sizes are committed in docs/experiments/quick/ and must come out the
# same byte for byte, so a change to a random stream forces a regeneration)
QUICK_NODES = 10
QUICK_TASKS = 300


@attrs.frozen
class Params:
    out: Path
    nodes: int | None = None
    tasks: int | None = None
    seed: int = 1


# ------------------------------------------------------------------ shared settings

PARETO = BoundedPareto(alpha=1.1, ratio=1000.0, mean=1.0)
EXPO = Exponential(1.0)

# The policies' timers, scaled to the mean service time S (the agent's defaults are in
# seconds for tasks of minutes; here one round per S/2 keeps 10,000 nodes affordable).
NET_DELAY = 0.005
TICK = 0.5
TRANSFER = TransferConfig(
    round_interval=TICK,
    probe_timeout=0.05,
    task_cooldown=0.2,
    switch_cooldown=0.2,
    accept_hold=0.05,
)
SENDER_ONLY = attrs.evolve(TRANSFER, wm_low=1e9, wm_high=2e9, wm_band=0.0)
RECEIVER_ONLY = attrs.evolve(TRANSFER, wm_low=-2.0, wm_high=-1.0, wm_band=0.0)
GOSSIP = GossipAge(period=1.0, delay=0.05)
LATE = LateConfig(d=4, sample=8, stage=3 * NET_DELAY, hold=3.0, pull_timeout=0.5)
MIGRATION = mig.MigrationConfig(
    margin=1.5,
    cooldown=1.0,
    max_moves=3,
    rate=0.5,
    burst=2.0,
    max_report_age=5.0,
    max_cluster=8,
)


def migration_spec(pause: float = 0.05) -> MigrationSpec:
    return MigrationSpec(config=MIGRATION, interval=0.5, pause=pause)


def _run(cfg: SimConfig, rate: float, service: ServiceDist, count: int, seed: int) -> SimResult:
    """One run; the workload's own rng depends only on `seed`, so every policy compared
    at the same seed sees the same arrivals and service times."""
    return simulate(cfg, poisson(rate, service, random.Random(seed * 1000 + 7), count=count))


def mm1_mean(rho: float) -> float:
    return 1.0 / (1.0 - rho)


def mmc_mean(rho: float, c: int) -> float:
    """Mean response time of M/M/c with service rate 1 per server (Erlang C)."""
    a = rho * c
    term = 1.0
    total = 1.0
    for k in range(1, c):
        term *= a / k
        total += term
    last = term * a / c / (1.0 - rho)
    p_wait = last / (total + last)
    return 1.0 + p_wait / (c * (1.0 - rho))


def supermarket_mean(lam: float, d: int = 2, terms: int = 60) -> float:
    """Mean time in system of the supermarket model's fixed point (n -> infinity):
    sum over i >= 1 of s_i / lam, s_i = lam^((d^i - 1)/(d - 1))."""
    total = 0.0
    for i in range(1, terms):
        e = (d**i - 1) // (d - 1)
        s = lam**e
        if s < 1e-15:
            break
        total += s
    return total / lam


def _timed(fn: Callable[[Params], Outcome]) -> Callable[[Params], Outcome]:
    def wrapper(p: Params) -> Outcome:
        t0 = time.perf_counter()
        o = fn(p)
        o.seconds = time.perf_counter() - t0
        o.write(p.out)
        return o

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


# ------------------------------------------------------------------ 1. balls


@_timed
def balls(p: Params) -> Outcome:
    """Max load of m = n unit tasks: random vs d = 2 vs d = 3, with the theory."""
    top = p.nodes or 100_000
    ns = [n for n in (100, 300, 1000, 3000, 10_000, 30_000, 100_000) if n <= top]
    if top not in ns:
        ns.append(top)
    rows = []
    ok = True
    reps = 5  # runs per n and d: each mean with its 95 % confidence interval
    for n in ns:
        loads: dict[int, list[int]] = {1: [], 2: [], 3: []}
        for d in (1, 2, 3):
            for r in range(reps):
                rng = random.Random(p.seed * 100_003 + n * 7 + r * 13 + d)
                loads[d].append(balls_mod.throw(n, n, d, rng).max_load)
        t1, t2, t3 = (
            balls_mod.theory_random(n),
            balls_mod.theory_d(n, 2),
            balls_mod.theory_d(n, 3),
        )
        ok = ok and max(loads[2]) <= t2 + 1.0
        row: list[float] = [n, reps]
        for d in (1, 2, 3):
            row += [*mean_ci([float(x) for x in loads[d]]), max(loads[d])]
        rows.append(tuple([*row, t1, t2, t3]))
    table = Table.of(
        [
            "n",
            "runs",
            "random mean",
            "+-",
            "random max",
            "d=2 mean",
            "+-",
            "d=2 max",
            "d=3 mean",
            "+-",
            "d=3 max",
            "ln n/ln ln n",
            "ln ln n/ln 2",
            "ln ln n/ln 3",
        ],
        rows,
    )
    xs = [float(r[0]) for r in rows]
    plots.lines(
        p.out / "balls.png",
        [
            plots.Series("random (measured)", xs, table.column("random mean"), "o-"),
            plots.Series("d=2 (measured)", xs, table.column("d=2 mean"), "s-"),
            plots.Series("d=3 (measured)", xs, table.column("d=3 mean"), "^-"),
            plots.Series("ln n / ln ln n", xs, table.column("ln n/ln ln n"), "--", 1),
            plots.Series("ln ln n / ln 2", xs, table.column("ln ln n/ln 2"), "--", 1),
            plots.Series("ln ln n / ln 3", xs, table.column("ln ln n/ln 3"), ":", 1),
        ],
        title="Balls into bins through place(): max load, m = n",
        xlabel="n (bins = tasks)",
        ylabel="maximum load",
        logx=True,
    )
    last = rows[-1]
    d2_txt = (
        "sits within +1 of ln ln n / ln 2 at every n"
        if ok
        else "exceeds ln ln n / ln 2 + 1 at some n (see the check below)"
    )
    return Outcome(
        name="balls",
        title="1. Balls into bins: power of d choices",
        setup=f"""
m = n unit tasks are placed one at a time by `policy.placement.place` from a
submitter that runs nothing (its drained local report is never a candidate), so
exactly d peers are sampled and the least loaded of them takes the task; d = 1 is
uniform random. The view is fresh (each task's effect is posted before the next is
placed), as in the classical analysis. n = {xs[0]:.0f} to {xs[-1]:.0f}; 5 runs at
every n and d (mean with the half-width of its 95 % confidence interval; "max" is the
largest over the runs).
""",
        tables=[("balls", table)],
        figures=[("balls.png", "Maximum load vs n, measured (solid) and theory (dashed)")],
        findings=f"""
**What it shows.** One random choice gives a maximum load that keeps growing with n
(at n = {last[0]:,} it was {last[2]:g} +- {last[3]:.2g} on average); two choices
flatten it to {last[5]:g} +- {last[6]:.2g} and three to {last[8]:g} +- {last[9]:.2g}.
The theory's leading terms are ln n / ln ln n = {last[11]:.2f} and ln ln n / ln d =
{last[12]:.2f} (d = 2), {last[13]:.2f} (d = 3). Measured d = 2 {d2_txt}: the O(1)
term of Azar, Broder, Karlin and Upfal (1994). The random curve is above
its leading term because ln n / ln ln n drops lower-order terms that are large at
these n (the exact asymptote is Gamma^-1(n)); the gap is the known one, not a
swarm artefact.
""",
        checks={"d = 2 within +1 of ln ln n / ln 2 for every n up to the largest": ok},
    )


# ------------------------------------------------------------------ 2. staleness

STALE_T = (0.0, 1.0, 2.0, 5.0, 10.0)
STALE_SEEDS = 5
STALE_TASKS = 100_000  # per run; 20,000 left the large-T cells 18-26 % low (issue 24)
# not measured: an M/M/1 queue at load 0.9 (the random column) takes some 400 service
# times to forget that it started empty; with 20 the doubled run moved it by 10 %
STALE_WARMUP = 300.0
# random never reads the board: one set of runs, this many times as long, serves every
# T (an M/M/1 queue at load 0.9 needs long runs: 100,000 tasks moved 9 % when doubled)
STALE_RANDOM = 5


@_timed
def staleness(p: Params) -> Outcome:
    """Mitzenmacher's bulletin board: mean time in system vs the board's period T."""
    n = p.nodes or 100
    count = p.tasks or STALE_TASKS
    lam = 0.9
    seeds = [p.seed + k for k in range(STALE_SEEDS)]
    warm = min(STALE_WARMUP, 0.3 * count / (lam * n))  # short runs (--quick): 30 %
    pols: list[tuple[str, Strategy]] = [
        ("random", PowerOfD(1)),
        ("d=2", PowerOfD(2)),
        ("d=3", PowerOfD(3)),
        ("least-loaded", LeastLoaded()),
    ]

    def mean_of(strat: Strategy, period: float, seed: int, tasks: int) -> float:
        cfg = SimConfig(
            nodes=uniform_nodes(n),
            placement=strat,
            staleness=Board(period),
            origin=FRONTEND,
            seed=seed,
            warmup=warm,
        )
        return _run(cfg, lam * n, EXPO, tasks, seed).mean

    runs: dict[tuple[str, float], list[float]] = {}
    longer: list[tuple[float, str, int, float, float, float]] = []  # run length, seed 1
    for period in STALE_T:
        for label, strat in pols:
            if label == "random" and period != STALE_T[0]:
                runs[(label, period)] = runs[(label, STALE_T[0])]  # it never reads the board
                continue
            tasks = count * (STALE_RANDOM if label == "random" else 1)
            runs[(label, period)] = [mean_of(strat, period, sd, tasks) for sd in seeds]
            short = runs[(label, period)][0]
            twice = mean_of(strat, period, seeds[0], 2 * tasks)
            longer.append((period, label, tasks, short, twice, 100.0 * (twice / short - 1.0)))
    cis = {k: mean_ci(v) for k, v in runs.items()}
    res = {k: c[0] for k, c in cis.items()}
    rows = [
        tuple([T] + [x for lb, _ in pols for x in cis[(lb, T)]] + [len(seeds), count])
        for T in STALE_T
    ]
    table = Table.of(["T"] + [c for lb, _ in pols for c in (lb, "+-")] + ["seeds", "tasks"], rows)
    ltable = Table.of(["T", "policy", "tasks", "mean", "at twice the tasks", "change %"], longer)
    worst = max(longer, key=lambda r: abs(r[5]))
    within = [r for r in longer if abs(r[5]) > 3.0]
    plots.lines(
        p.out / "staleness.png",
        [plots.Series(lb, list(STALE_T), [res[(lb, T)] for T in STALE_T]) for lb, _ in pols],
        title=f"Stale load information: n = {n}, load {lam}, exponential service",
        xlabel="board period T (mean service times)",
        ylabel="mean time in system",
        logy=True,
        hline=(mm1_mean(lam), "M/M/1 (random, theory)"),
    )
    t5 = 5.0
    ll5, r5, d25 = res[("least-loaded", t5)], res[("random", t5)], res[("d=2", t5)]
    sm = supermarket_mean(lam)
    # What the age model stands for: the real membership core's load ages.
    ages = [measure_load_age(k, seed=p.seed, duration=20.0, warmup=8.0) for k in (50, 100, 200)]
    atable = Table.of(
        ["nodes", "report every s", "mean age s", "p50", "p90", "p99", "delay s", "coverage"],
        [
            (a.nodes, a.report_interval, a.mean, a.p50, a.p90, a.p99, a.dissemination, a.coverage)
            for a in ages
        ],
    )
    a100 = ages[1]
    return Outcome(
        name="staleness",
        title="2. Staleness: how useful is old information?",
        setup=f"""
Mitzenmacher's bulletin-board model ("How useful is old information?", IEEE TPDS
2000): n = {n} single-server FIFO nodes, Poisson arrivals at total rate
{lam} n, exponential service (mean 1). Every T mean service times the board posts
every node's load at once; between posts placers read the frozen board
(**staleness model: `Board(T)`**, T = 0 is fresh). Tasks come from a front end
(`place` with a drained local node, so d peers compete). random, d = 2 and d = 3 are
`place(d)`; least-loaded is the reference baseline that takes the minimum of the
board. {count:,} tasks per run, the first {warm:g} time units not measured (an
M/M/1 queue at load 0.9 needs some 400 service times to forget its empty start); the
same arrivals for every policy. Seeds {seeds[0]} to {seeds[-1]}: each cell is the mean
over them with the half-width of its 95 % confidence interval (t distribution).
random never reads the board, so its column is one set of runs, {STALE_RANDOM}x as long
({STALE_RANDOM * count:,} tasks), shown at every T. Run length: every cell again at
twice the tasks (seed {seeds[0]}; second table); the largest change is
{worst[5]:+.1f} % ({worst[1]} at T = {worst[0]:g}); {len(within)} of {len(longer)}
cells move by more than 3 %.
""",
        tables=[("staleness", table), ("staleness_length", ltable), ("gossip_age", atable)],
        figures=[("staleness.png", "Mean time in system vs board period T (log scale)")],
        findings=f"""
**What it shows.** With fresh information least-loaded is best
({res[("least-loaded", 0.0)]:.2f}) and d = 2 close ({res[("d=2", 0.0)]:.2f}; the
supermarket fixed point for n -> infinity is {sm:.2f}). As the board ages,
least-loaded herds: every placer sends its tasks to the same few nodes that looked
empty at the last post. At T = 5 it takes {ll5:.1f} (+-{cis[("least-loaded", t5)][1]:.1f})
against {r5:.1f} (+-{cis[("random", t5)][1]:.1f}) for random
(M/M/1 theory: {mm1_mean(lam):.0f}), while d = 2 stays at {d25:.2f}
(+-{cis[("d=2", t5)][1]:.2f}). This is
Mitzenmacher's result: with old information the full minimum is worse than no
information, while sampling two choices keeps most of its benefit; d = 3 is better
than d = 2 when information is fresh and degrades faster as it ages (it herds a
little more). swarm's placer is `place(d=2)` for this reason.

**How old is gossip really?** The second table runs swarm's real SWIM core
(`cluster.membership` over `sim.gossipnet`, LAN timers: gossip every
{a100.gossip_interval:g} s to 3 peers) with every node publishing its load each
second, as the agent does, and reads the observers' load views. At 100 nodes a
peer's report is {a100.mean:.1f} s old on average (p99 {a100.p99:.1f} s): the report
interval plus about {a100.dissemination:.1f} s of dissemination, which grows with n
({ages[0].mean:.1f} s at {ages[0].nodes} nodes, {ages[-1].mean:.1f} s at {ages[-1].nodes}).
In the age model that is `GossipAge(period=1 s, delay={a100.dissemination:.1f} s)`;
for tasks of a minute, T is about {a100.mean / 60:.2f} mean service times, far below
the T = 1 that the `load`, `transfer` and `shares` experiments use on purpose (their
results are pessimistic about staleness). The real core's tail is longer than the
model's (a report can miss a few gossip rounds).

**Versus the published figures.** Mitzenmacher's simulations (n = 100, lambda =
0.9) show the same ordering and the same crossing: least-loaded overtakes random
once T is a few service times, d = 2 stays below both, and d = 3 beats d = 2 only
while information is fresh. The values are ours (other seeds, ties broken at
random), with their confidence intervals; the ordering is his.
""",
        checks={
            "least-loaded worse than random at T = 5": ll5 > r5,
            "d = 2 better than both random and least-loaded at T = 5": d25 < min(r5, ll5),
            "doubling the run moves no cell by more than 3 % (seed 1)": abs(worst[5]) <= 3.0,
        },
    )


# ------------------------------------------------------------------ 3. load

LOAD_U = (0.5, 0.7, 0.8, 0.9, 0.95)


def load_config(
    curve: str,
    nodes: int,
    seed: int,
    *,
    migration_pause: float = 0.05,
    slots: int = 2,
) -> SimConfig:
    """One curve of `load`: random | d2 | d2+transfer | d2+transfer+migration | jsq.

    Nodes: one core, up to `slots` tasks time-share it, the rest wait FIFO. swarm's
    curves place from the node the task arrives at (local node fresh, 2 peers from
    gossip); random and JSQ place from a front end.
    """
    base = SimConfig(
        nodes=uniform_nodes(nodes, cores=1.0, slots=slots),
        staleness=GOSSIP,
        net_delay=NET_DELAY,
        seed=seed,
        warmup=20.0,
    )
    if curve == "random":
        return attrs.evolve(base, placement=PowerOfD(1), origin=FRONTEND)
    if curve == "jsq":
        return attrs.evolve(base, placement=Jsq(), origin=FRONTEND)
    cfg = attrs.evolve(base, placement=PowerOfD(2), origin=NODE)
    if curve == "d2":
        return cfg
    cfg = attrs.evolve(cfg, transfer=TRANSFER, tick=TICK, transfer_cost=0.01)
    if curve == "d2+transfer":
        return cfg
    if curve == "d2+transfer+migration":
        return attrs.evolve(cfg, migration=migration_spec(migration_pause))
    if curve == "late":
        return attrs.evolve(cfg, late=LATE)
    if curve == "late+transfer+migration":
        return attrs.evolve(
            cfg,
            late=LATE,
            transfer=TRANSFER,
            tick=TICK,
            transfer_cost=0.01,
            migration=migration_spec(migration_pause),
        )
    raise ValueError(f"unknown load curve {curve!r}")


MIG_U = 0.7
MIG_COSTS = (0.05, 0.3, 1.0)
LOAD_CURVES = (
    "random",
    "d2",
    "d2+transfer",
    "d2+transfer+migration",
    "late+transfer+migration",
    "jsq",
)
FULL = "late+transfer+migration"  # swarm's full policy at HEAD (the agent's defaults)
BEFORE = "d2+transfer+migration"  # ... before late binding (issue 24)
LOAD_SEEDS = 5
CURVE_LABEL = {
    "random": "random",
    "d2": "d=2 (stale gossip)",
    "d2+transfer": "d=2 + transfer",
    "d2+transfer+migration": "d=2 + transfer + migration",
    "late+transfer+migration": "late binding + transfer + migration",
    "jsq": "JSQ (fresh, ideal)",
}
# Late binding's settings compared (seed p.seed): (label, LateConfig)
LATE_VARIANTS: tuple[tuple[str, LateConfig], ...] = (
    ("d=4 of 8 (default)", LATE),
    ("d=4 of 8, all at once", attrs.evolve(LATE, stage=0.0)),
    ("d=2 of 8", attrs.evolve(LATE, d=2)),
    ("d=4 of 4", attrs.evolve(LATE, sample=4)),
)
LATE_VARIANT_U = (0.5, 0.7, 0.9)


@_timed
def load(p: Params) -> Outcome:
    """Mean and p99 response time vs utilisation, Pareto service, as ratios to JSQ
    (5 seeds, 95 % CIs), with messages per task; late binding's settings; when
    migration pays."""
    n = p.nodes or 100
    count = p.tasks or 12_000
    seeds = [p.seed + k for k in range(LOAD_SEEDS)]
    runs: dict[tuple[str, float, int], SimResult] = {}
    for u in LOAD_U:
        for c in LOAD_CURVES:
            for sd in seeds:
                runs[(c, u, sd)] = _run(load_config(c, n, sd), u * n, PARETO, count, sd)

    def ratio(c: str, u: float, what: str) -> tuple[float, float]:
        return mean_ci(
            [getattr(runs[(c, u, sd)], what) / getattr(runs[("jsq", u, sd)], what) for sd in seeds]
        )

    def r_at(c: str, u: float) -> str:
        m, h = ratio(c, u, "mean")
        return f"{m:.2f}x (+-{h:.2f})"

    def per_task(c: str, u: float) -> float:
        return sum(runs[(c, u, sd)].messages / runs[(c, u, sd)].arrivals for sd in seeds) / len(
            seeds
        )

    rows = []
    for u in LOAD_U:
        for c in LOAD_CURVES:
            if c == "jsq":
                continue
            m, mh = ratio(c, u, "mean")
            q, qh = ratio(c, u, "p99")
            rows.append((u, c, m, mh, q, qh, per_task(c, u), per_task(c, u) / per_task(BEFORE, u)))
    table = Table.of(
        [
            "utilisation",
            "curve",
            "mean/JSQ",
            "mean/JSQ 95% CI +-",
            "p99/JSQ",
            "p99/JSQ 95% CI +-",
            "messages/task",
            f"messages/task / {BEFORE}'s",
        ],
        rows,
    )
    first = seeds[0]
    extra = Table.of(
        [
            "utilisation",
            "curve",
            "mean",
            "p99",
            "transfers",
            "migrations",
            "probes",
            "held",
            "pulled",
            "released",
        ],
        [
            (
                u,
                c,
                r.mean,
                r.p99,
                r.transfers,
                r.migrations,
                r.transfer_stats.probes,
                r.late_stats.held,
                r.late_stats.given,
                r.late_stats.released,
            )
            for u in LOAD_U
            for c in LOAD_CURVES
            for r in [runs[(c, u, first)]]
        ],
    )
    # Run length: the headline cells with twice the tasks.
    hl = 0.9 if 0.9 in LOAD_U else LOAD_U[-2]
    lrows = []
    jsq2 = {sd: _run(load_config("jsq", n, sd), hl * n, PARETO, 2 * count, sd) for sd in seeds}
    for c in (FULL, BEFORE):
        for k in (1, 2):
            xs, ys = [], []
            for sd in seeds:
                if k == 1:
                    r, j = runs[(c, hl, sd)], runs[("jsq", hl, sd)]
                else:
                    r = _run(load_config(c, n, sd), hl * n, PARETO, k * count, sd)
                    j = jsq2[sd]
                xs.append(r.mean / j.mean)
                ys.append(r.p99 / j.p99)
            (m, mh), (q, qh) = mean_ci(xs), mean_ci(ys)
            lrows.append((c, hl, k * count, m, mh, q, qh))
    length = Table.of(["curve", "utilisation", "tasks", "mean/JSQ", "+-", "p99/JSQ", "+-"], lrows)
    # Late binding's settings.
    vrows = []
    for u in LATE_VARIANT_U:
        if u not in LOAD_U:
            continue
        j = runs[("jsq", u, first)]
        base = runs[(BEFORE, u, first)]
        for label, lc in LATE_VARIANTS:
            r = _run(
                attrs.evolve(load_config(FULL, n, first), late=lc), u * n, PARETO, count, first
            )
            vrows.append(
                (
                    u,
                    label,
                    r.mean / j.mean,
                    r.p99 / j.p99,
                    r.messages / r.arrivals,
                    r.messages / base.messages,
                )
            )
    variants = Table.of(
        [
            "utilisation",
            "late binding",
            "mean/JSQ",
            "p99/JSQ",
            "messages/task",
            f"messages / {BEFORE}'s",
        ],
        vrows,
    )
    us = list(LOAD_U)
    colours = dict(zip(LOAD_CURVES, ("C0", "C1", "C2", "C3", "C5", "C4"), strict=True))
    shown = [c for c in LOAD_CURVES if c != "jsq"]
    plots.lines(
        p.out / "load.png",
        [
            plots.Series(
                CURVE_LABEL[c] + " mean",
                us,
                [ratio(c, u, "mean")[0] for u in us],
                "o-",
                1.5,
                colours[c],
            )
            for c in shown
        ]
        + [
            plots.Series(
                CURVE_LABEL[c] + " p99",
                us,
                [ratio(c, u, "p99")[0] for u in us],
                "x--",
                1.0,
                colours[c],
            )
            for c in shown
        ],
        title=f"Response time / JSQ's (the ideal): n = {n}, bounded Pareto service",
        xlabel="utilisation",
        ylabel="ratio to JSQ (1 = ideal)",
        logy=True,
        hline=(1.0, "JSQ"),
    )

    # When does migration pay? Heavy tails vs exponential, cheap vs expensive moves.
    mn = min(n, 64)
    mcount = max(2000, count // 2)
    mrows = []
    pays: dict[tuple[str, float], float] = {}
    for dist_name, dist in (("Pareto", PARETO), ("exponential", EXPO)):
        off = _run(load_config("d2+transfer", mn, p.seed), MIG_U * mn, dist, mcount, p.seed)
        for pause in MIG_COSTS:
            cfg = load_config("d2+transfer+migration", mn, p.seed, migration_pause=pause)
            on = _run(cfg, MIG_U * mn, dist, mcount, p.seed)
            pays[(dist_name, pause)] = on.mean / off.mean
            mrows.append(
                (
                    dist_name,
                    pause,
                    off.mean,
                    on.mean,
                    on.mean / off.mean,
                    on.p99 / off.p99,
                    on.migrations / on.arrivals,
                )
            )
    mtable = Table.of(
        [
            "service",
            "downtime",
            "mean (no migration)",
            "mean (migration)",
            "mean ratio",
            "p99 ratio",
            "moves per task",
        ],
        mrows,
    )
    plots.bars(
        p.out / "load_migration.png",
        [f"downtime {c:g} S" for c in MIG_COSTS],
        [(d, [pays[(d, c)] for c in MIG_COSTS]) for d in ("Pareto", "exponential")],
        title=f"Mean response time with / without migration (n = {mn}, utilisation {MIG_U})",
        ylabel="ratio (< 1: migration helps)",
    )

    def effect(r: float) -> str:
        if r < 0.98:
            return f"helps ({(1 - r):.0%} lower mean)"
        if r > 1.02:
            return f"hurts ({(r - 1):.0%} higher mean)"
        return f"is neutral (ratio {r:.2f})"

    cheap, dear = MIG_COSTS[0], MIG_COSTS[-1]
    if pays[("exponential", dear)] > pays[("Pareto", dear)] + 0.01:
        dist_txt = (
            "The difference is the age rule: the cost-benefit test estimates the remaining "
            "time from the task's age (Harchol-Balter & Downey), which is right for heavy "
            "tails, where an old task is likely a long one, and wrong for exponential "
            "service, where an old task has no more left than a new one; there the "
            "expensive moves it still makes do not pay back."
        )
    else:
        dist_txt = (
            "Here the two distributions fare alike at that cost: the cost-benefit test "
            "declines most expensive moves under both."
        )
    hi = hl

    def show(c: str, what: str = "mean") -> str:
        m, h = ratio(c, hi, what)
        return f"{m:.2f}x (+-{h:.2f})"

    full_m, full_q = ratio(FULL, hi, "mean")[0], ratio(FULL, hi, "p99")[0]
    cost = per_task(FULL, hi) / per_task(BEFORE, hi)
    low = LOAD_U[0]
    return Outcome(
        name="load",
        title="3. Load: response time against the ideal",
        setup=f"""
n = {n} nodes, each one core on which up to 2 tasks time-share (processor sharing)
while the rest wait FIFO. Poisson arrivals at rate u n, **bounded Pareto service**
(alpha 1.1, max/min 1000, mean 1: heavy-tailed like process lifetimes,
Harchol-Balter & Downey 1997). {count:,} tasks per run, seeds {seeds[0]}-{seeds[-1]}
(each seed's arrivals and service times are shared by every curve); the first table
gives the mean over the seeds of each run's ratio to JSQ's, with its 95 % confidence
interval.

- *random*: a front end places uniformly (`place(d=1)`).
- *d=2 (stale gossip)*: each task arrives at a random node, which runs `place(d=2)`
  over the gossip view (**staleness model: `GossipAge`**: every node re-publishes
  its report every 1 S with a random phase, peers see it 0.05 S later; the local
  node's own report is fresh). Handoffs take {NET_DELAY} S; the target re-checks with
  `admit`.
- *+ transfer*: `TransferPolicy` on every node (step every {TICK} S, probes and
  replies as messages with the same delay, a moved queued task is in flight 0.01 S
  longer); timers scaled to S: round {TICK}, probe timeout {TRANSFER.probe_timeout:g},
  task cooldown {TRANSFER.task_cooldown:g}, switch cooldown {TRANSFER.switch_cooldown:g}.
- *+ migration*: `plan_migrations` on every node every 0.5 S over a two-peer
  sample, checkpoint mode, 0.05 S downtime per move, margin 1.5, per-task cooldown
  1 S, at most 3 moves per task and 8 in flight; the target re-checks on fresh state
  with `admit` and `recheck_at_target`, as the agent's migrator does.
- *late binding + transfer + migration* (swarm's full policy): `policy.latebind`
  on every node (Sparrow's late binding). A task arriving at a node with room (a
  free slot on an idle core) runs there; otherwise the node holds it and reserves
  the {LATE.d} least loaded of {LATE.sample} peers read from its gossip view: first
  those whose report says they have room, the others {LATE.stage:g} S later if the
  task is still held. The first of them with room pulls it (pull, answer, handoff:
  three one-way delays) and the others get a cancel; if the home gets room first, it
  runs the task itself; a task nobody pulls within {LATE.hold:g} S joins its home's
  run queue. Transfer and migration as above. *load_late* compares other settings at
  seed {seeds[0]}.
- *JSQ*: the ideal: an omniscient front end joins the node with the fewest tasks
  now.

*Messages per task* counts a handoff per placement, each probe and its reply, each
steal request, move and migration, and late binding's reservations, cancels, pulls
and answers (gossip is the same for every curve and not counted).
""",
        tables=[
            ("load", table),
            ("load_detail", extra),
            ("load_length", length),
            ("load_late", variants),
            ("load_migration", mtable),
        ],
        figures=[
            ("load.png", "Mean (solid) and p99 (dashed) response time as a ratio to JSQ's"),
            ("load_migration.png", "Mean response time with migration / without"),
        ],
        findings=f"""
**What it shows.** At utilisation {hi}, random placement's mean is {show("random")} the
ideal's; two choices on gossip one service time old {show("d2")}; adaptive transfer
(moving *queued* tasks) {show("d2+transfer")}, and migration of *running* tasks on top
{show(BEFORE)} (p99 {show(BEFORE, "p99")}): with heavy tails, a task committed at arrival
to a node that looked light on a second-old report often lands behind a long task,
and moving it later costs a move. **Late binding** commits a task only to a node that
has room at that moment: the full policy reaches {show(FULL)} the ideal's mean and
{show(FULL, "p99")} its p99, for {per_task(FULL, hi):.1f} messages per task against
{per_task(BEFORE, hi):.1f} ({cost:.2f}x; see *load_late* for cheaper settings). At
utilisation {low} the full policy is {r_at(FULL, low)} JSQ's mean; there it costs
{per_task(FULL, low):.1f} messages per task against {per_task(BEFORE, low):.1f}: where
two choices mostly keeps a task at its home for nothing, a task held because its home
is busy sends at least a reservation, a pull, its answer and a handoff, and cancels
to the rest of its first wave (the peers that looked free). *load_length* reruns the
headline cells with twice the tasks: the full policy's cells move by less than 3 %.
JSQ needs exact global state on every arrival;
swarm uses a local fresh report, a sample of stale ones, and the reserved nodes' own
word when they have room.

**When migration pays** (last table, n = {mn}, utilisation {MIG_U}, on top of d = 2
and transfer). With cheap moves (downtime {cheap:g} S) migration
{effect(pays[("Pareto", cheap)])} under Pareto service and
{effect(pays[("exponential", cheap)])} under exponential service: moving a task off
a core it shares to an idle core pays whatever the distribution once a move costs
little. At downtime {dear:g} S (a whole mean service time) migration
{effect(pays[("Pareto", dear)])} under Pareto and {effect(pays[("exponential", dear)])}
under exponential service. {dist_txt} Migration is worth enabling for
heavy-tailed work with cheap checkpoints; with expensive moves or memoryless work,
moving queued tasks (transfer) does the job.
""",
        checks={
            "d=2 on stale gossip beats random at every utilisation": all(
                ratio("d2", x, "mean")[0] < ratio("random", x, "mean")[0] for x in LOAD_U
            ),
            "adaptive transfer improves on d=2 alone at utilisation >= 0.9": all(
                ratio("d2+transfer", x, "mean")[0] < ratio("d2", x, "mean")[0]
                for x in LOAD_U
                if x >= 0.9
            ),
            f"full policy <= 1.2x JSQ's mean at {hi} (issue 24)": full_m <= 1.2,
            f"full policy <= 1.3x JSQ's p99 at {hi} (issue 24)": full_q <= 1.3,
            f"full policy <= 2x the messages per task of {BEFORE} at {hi}": cost <= 2.0,
        },
        extra={"pays": pays},
    )


# ------------------------------------------------------------------ 4. transfer

TRANSFER_U = (0.3, 0.5, 0.7, 0.85, 0.95)
TRANSFER_MODES: tuple[tuple[str, TransferConfig | None], ...] = (
    ("none", None),
    ("sender", SENDER_ONLY),
    ("receiver", RECEIVER_ONLY),
    ("adaptive", TRANSFER),
)


def _crossover(xs: Sequence[float], a: Sequence[float], b: Sequence[float]) -> float | None:
    """First x where b becomes better (lower) than a, linearly interpolated."""
    diff = [bb - aa for aa, bb in zip(a, b, strict=True)]
    for i in range(1, len(xs)):
        if diff[i - 1] >= 0 > diff[i]:
            x0, x1, d0, d1 = xs[i - 1], xs[i], diff[i - 1], diff[i]
            return x0 + (x1 - x0) * d0 / (d0 - d1)
    return None


PROBE_COSTS = (0.0, 0.02)
TRANSFER_COST = 0.1  # S a moved task is in flight
# Where sender-initiated stops winning, with CPU-costly probes: periodic rounds (the
# table's) against near event-driven ones, 5 seeds, on a finer grid.
CROSS_U = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
EVENT_TICK = 0.05
TIMERS: tuple[tuple[str, float], ...] = (
    (f"periodic (rounds every {TICK:g} S)", TICK),
    (f"near event-driven (rounds and cooldowns {EVENT_TICK:g} S)", EVENT_TICK),
)
PAPER_CROSS = "0.7-0.9"  # Eager, Lazowska & Zahorjan's crossover, as the issue reads them


def _transfer_cfg(
    n: int, seed: int, mode: TransferConfig | None, tick: float, pc: float
) -> SimConfig:
    # every timer at most `tick`: rounds, and the cooldowns that would otherwise hold
    # a node or a task back for longer than a round
    tc = (
        None
        if mode is None
        else attrs.evolve(
            mode,
            round_interval=tick,
            task_cooldown=min(mode.task_cooldown, tick),
            switch_cooldown=min(mode.switch_cooldown, tick),
            accept_hold=min(mode.accept_hold, tick),
        )
    )
    return SimConfig(
        nodes=uniform_nodes(n),
        placement=PowerOfD(0),
        origin=NODE,
        staleness=GOSSIP,
        net_delay=NET_DELAY,
        transfer=tc,
        tick=tick,
        transfer_cost=TRANSFER_COST,
        probe_cpu=pc,
        seed=seed,
        warmup=20.0,
    )


@_timed
def transfer(p: Params) -> Outcome:
    """Sender- vs receiver-initiated vs adaptive transfer across load levels."""
    n = p.nodes or 32
    count = p.tasks or 4000
    cost = TRANSFER_COST
    res: dict[tuple[str, float, float], SimResult] = {}
    for u in TRANSFER_U:
        for pc in PROBE_COSTS:
            for label, tc in TRANSFER_MODES:
                if tc is None and pc > 0:
                    continue  # no transfer, no probes: the same run
                cfg = _transfer_cfg(n, p.seed, tc, TICK, pc)
                res[(label, pc, u)] = _run(cfg, u * n, EXPO, count, p.seed)
    modes = [lb for lb, tc in TRANSFER_MODES if tc is not None]
    rows = []
    for u in TRANSFER_U:
        row: list[object] = [u, res[("none", 0.0, u)].mean]
        for pc in PROBE_COSTS:
            row += [res[(lb, pc, u)].mean for lb in modes]
        row += [
            res[(lb, 0.0, u)].transfer_stats.probes / res[(lb, 0.0, u)].arrivals for lb in modes
        ]
        row += [mmc_mean(u, n)]
        rows.append(tuple(row))
    headers = ["utilisation", "no transfer"]
    for pc in PROBE_COSTS:
        headers += [f"{lb} (probe {pc:g})" for lb in modes]
    headers += [f"{lb} probes/task" for lb in modes] + [f"M/M/{n}"]
    table = Table.of(headers, rows)
    us = list(TRANSFER_U)
    series = [plots.Series("no transfer", us, [res[("none", 0.0, u)].mean for u in us], "k.-")]
    for pc, dash in zip(PROBE_COSTS, ("-", "--"), strict=True):
        for lb, mark, colour in zip(modes, ("o", "s", "^"), ("C0", "C1", "C2"), strict=True):
            series.append(
                plots.Series(
                    f"{lb}, probe cpu {pc:g}",
                    us,
                    [res[(lb, pc, u)].mean for u in us],
                    mark + dash,
                    1.5 if pc == 0 else 1.0,
                    colour,
                )
            )
    series.append(plots.Series(f"M/M/{n} (perfect sharing)", us, [mmc_mean(u, n) for u in us], ":"))
    plots.lines(
        p.out / "transfer.png",
        series,
        title=f"Transfer policies: n = {n}, transfer cost {cost} S, exponential service",
        xlabel="utilisation",
        ylabel="mean response time",
        logy=True,
    )
    cross: dict[float, float | None] = {}
    near: dict[float, bool] = {}
    for pc in PROBE_COSTS:
        snd = [res[("sender", pc, u)].mean for u in us]
        rcv = [res[("receiver", pc, u)].mean for u in us]
        ada = [res[("adaptive", pc, u)].mean for u in us]
        cross[pc] = _crossover(us, snd, rcv)
        near[pc] = all(a <= 1.05 * min(x, y) for a, x, y in zip(ada, snd, rcv, strict=True))

    def where(pc: float) -> str:
        c = cross[pc]
        if c is not None:
            return f"receiver-initiated overtakes sender-initiated at utilisation {c:.2f}"
        lo = res[("receiver", pc, us[0])].mean <= res[("sender", pc, us[0])].mean
        return (
            "receiver-initiated is as good or better at every load (no crossover)"
            if lo
            else "sender-initiated is better at every load measured (no crossover)"
        )

    # The crossover with CPU-costly probes: periodic vs near event-driven timers.
    costly = PROBE_COSTS[-1]
    xrows = []
    xs_at: dict[str, list[float]] = {}
    for tlabel, tick in TIMERS:
        found: list[float] = []
        for sd in [p.seed + k for k in range(LOAD_SEEDS)]:
            means = {
                lb: [
                    _run(_transfer_cfg(n, sd, tc, tick, costly), u * n, EXPO, count, sd).mean
                    for u in CROSS_U
                ]
                for lb, tc in TRANSFER_MODES
                if lb in ("sender", "receiver")
            }
            c = _crossover(CROSS_U, means["sender"], means["receiver"])
            if c is not None:
                found.append(c)
        xs_at[tlabel] = found
        m, h = mean_ci(found) if found else (math.nan, math.nan)
        xrows.append((tlabel, len(found), LOAD_SEEDS, m, h, PAPER_CROSS))
    xtable = Table.of(
        ["timers", "seeds with a crossover", "seeds", "crossover", "95% CI +-", "paper"], xrows
    )
    per, ev = (xrows[0][3], xrows[0][4]), (xrows[1][3], xrows[1][4])
    n_in = sum(0.7 <= x <= 0.9 for x in (per[0], ev[0]))
    inside = (
        "both below the paper's range"
        if per[0] < 0.7 and ev[0] < 0.7
        else f"{n_in} of the two inside the paper's range"
    )
    hi, lo0 = us[-1], us[0]
    ada_txt = (
        "within 5 % of the best fixed mode at every load"
        if near[0.0] and near[costly]
        else "close to the better fixed mode at most loads; see the table"
    )

    def probes(mode: str) -> float:
        r = res[(mode, costly, lo0)]
        return r.transfer_stats.probes / r.arrivals

    return Outcome(
        name="transfer",
        title="4. Transfer: sender- vs receiver-initiated vs adaptive",
        setup=f"""
Eager, Lazowska and Zahorjan's setting (1986): n = {n} single-server FIFO nodes,
each with its own Poisson arrivals (tasks stay where they arrive: `place(d=0)`),
exponential service. Load is shared only by `TransferPolicy` moving queued tasks,
with a **per-transfer cost of {cost} S** (the moved task is in flight that long) and
{NET_DELAY} S per message. Modes are the same policy with its watermarks pinned:
*sender* (always the low regime: overloaded nodes probe and push), *receiver* (always
the high regime: idle nodes probe and steal), *adaptive* (swarm's default: the regime
follows the cluster load estimated from gossip, with hysteresis). Two probe costs:
0 (swarm's probes are small messages handled by the agent) and {costly:g} S of CPU on
both the prober and the probed node per probe (EL&Z charge probes to the CPU; here a
probe holds the node's processor, delaying its tasks). **Staleness model: `GossipAge`**
(period 1 S, delay 0.05 S), used only to pick probe targets and estimate the cluster
level; probes are answered on fresh state. Timers: round every {TICK} S, a task may
move {TRANSFER.task_cooldown:g} S after it arrived. {count:,} tasks per point.
""",
        figures=[
            (
                "transfer.png",
                "Mean response time vs utilisation; solid: free probes, dashed: costly",
            )
        ],
        findings=f"""
**What it shows.** Every mode beats no sharing by a wide margin above light load
(at utilisation {hi}: {res[("none", 0.0, hi)].mean:.1f} without transfer,
{res[("adaptive", 0.0, hi)].mean:.2f} adaptive). With free probes {where(0.0)}:
receiver-initiated probes cost nothing even when most of them fail, and a receiver
steals only when it is idle, which is exactly when a transfer helps. With probes that
cost CPU {where(costly)}: at light load receivers probe a lot ({probes("receiver"):.1f}
probes per task at utilisation {lo0}, against {probes("sender"):.1f} for senders) and their probes
land on the busy nodes, which pay for them; at high load senders' probes mostly fail
while idle receivers are rare and every one of them should pull. Adaptive follows the
better of the two ({ada_txt}).

**Versus the published result.** Eager et al. found sender-initiated policies better
at light to moderate load and receiver-initiated better at high load, provided their
transfer costs are comparable; their probe and transfer costs were charged as CPU
time, and their crossover lies at high utilisation ({PAPER_CROSS}). With probes that
cost CPU, swarm's policy shows the same ordering but not the same crossover (second
table, {LOAD_SEEDS} seeds, utilisations {CROSS_U[0]:g}-{CROSS_U[-1]:g}): with rounds every
{TICK:g} S sender-initiated stops winning at utilisation {per[0]:.2f} (+-{per[1]:.2f},
over the {xrows[0][1]} of {LOAD_SEEDS} seeds that cross below {CROSS_U[-1]:g}); with
near event-driven timers (rounds and cooldowns of {EVENT_TICK:g} S) at {ev[0]:.2f}
(+-{ev[1]:.2f}, over {xrows[1][1]} of {LOAD_SEEDS} seeds); {inside}. The models
differ: Eager et al.'s nodes act on every arrival and departure with no cooldowns,
swarm's on rounds with hysteresis, and the timers move the crossover by
{ev[0] - per[0]:+.2f} here. With
swarm's cheap probes the low-load advantage of sender-initiated transfer disappears,
which is why the adaptive policy only needs the watermarks to stop senders at high load
(where their probes are wasted and add traffic to busy nodes).
""",
        checks={
            "with CPU-costly probes, sender-initiated is better at the lowest load": res[
                ("sender", costly, lo0)
            ].mean
            < res[("receiver", costly, lo0)].mean,
            "with free probes, receiver-initiated is better at the highest load": res[
                ("receiver", 0.0, hi)
            ].mean
            < res[("sender", 0.0, hi)].mean,
        },
        tables=[("transfer", table), ("transfer_crossover", xtable)],
        extra={"crossover": cross},
    )


# ------------------------------------------------------------------ 5. shares (+ GPU)

GPU_LOADS = (0.8, 0.95, 1.1)


def _per_class(values: Sequence[float], keys: Sequence[int], classes: Sequence[int]) -> list[float]:
    out = []
    for c in classes:
        xs = [v for v, k in zip(values, keys, strict=True) if k == c]
        out.append(sum(xs) / len(xs))
    return out


def _cv(xs: Sequence[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs)) / m if m else math.nan


SHARES_SEEDS = 5


@attrs.define
class _SharesRun:
    """One seed of the shares experiment: its nodes and, per policy, the figures."""

    specs: tuple[NodeSpec, ...]
    keys: list[int]
    util_ratio: dict[str, list[float]] = attrs.field(factory=dict)
    work: dict[str, list[float]] = attrs.field(factory=dict)
    index: dict[str, list[float]] = attrs.field(factory=dict)
    cv: dict[str, float] = attrs.field(factory=dict)
    waited: dict[str, float] = attrs.field(factory=dict)
    mean_reserved: dict[str, float] = attrs.field(factory=dict)
    mean_plain: dict[str, float] = attrs.field(factory=dict)


def _shares_seed(
    n: int,
    count: int,
    u: float,
    seed: int,
    pols: Sequence[tuple[str, Strategy, str]],
    reserve: tuple[tuple[int, float], ...],
) -> _SharesRun:
    specs = hetero_nodes(n, random.Random(seed * 17 + 1))
    total_cores = sum(s.cores for s in specs)
    keys = [s.shares for s in specs]
    classes = sorted(set(keys))
    out = _SharesRun(specs, keys)
    for label, strat, origin in pols:
        cfg = SimConfig(
            nodes=specs,
            placement=strat,
            origin=origin,
            staleness=GOSSIP,
            net_delay=NET_DELAY,
            seed=seed,
            warmup=20.0,
            node_stats=True,
        )
        jobs = poisson(
            u * total_cores, EXPO, random.Random(seed * 1000 + 7), count=count, reserve=reserve
        )
        r = simulate(cfg, jobs)
        # Work ideal: work in proportion to the shares a node can give to work, i.e.
        # its shares less those held by running reservations (time averages).
        work_done = [b * sp.cores for b, sp in zip(r.node_busy, specs, strict=True)]
        free = [sp.shares - rs for sp, rs in zip(specs, r.node_reserved, strict=True)]
        per_share = sum(work_done) / sum(free)
        ur = [w / (f * per_share) for w, f in zip(work_done, free, strict=True)]
        out.util_ratio[label] = ur
        # Load-index ideal: every node at total weight / total unreserved shares.
        ideal = sum(r.node_load) / sum(free)
        lr = [r.node_load[i] / free[i] / ideal for i in range(len(specs))]
        waited = r.reserved_waited / r.reserved_tasks if r.reserved_tasks else math.nan
        out.work[label] = _per_class(ur, keys, classes)
        out.index[label] = _per_class(lr, keys, classes)
        out.cv[label] = _cv(ur)
        out.waited[label] = 100.0 * waited
        out.mean_reserved[label] = r.mean_reserved
        out.mean_plain[label] = r.mean_plain
    return out


@_timed
def shares(p: Params) -> Outcome:
    """Heterogeneous shares and reservations: per-node load vs the share-weighted
    ideal, how often reserved tasks wait; and the GPU workload (binpack vs spread)."""
    n = p.nodes or 100
    count = p.tasks or 10_000
    u = 0.8
    reserve = ((256, 0.15), (1024, 0.05))
    pols: list[tuple[str, Strategy, str]] = [
        ("random", PowerOfD(1), FRONTEND),
        ("d=2 (gossip)", PowerOfD(2), NODE),
        ("JSQ (fresh)", Jsq(), FRONTEND),
    ]
    seeds = [p.seed + k for k in range(SHARES_SEEDS)]
    per_seed = [_shares_seed(n, count, u, sd, pols, reserve) for sd in seeds]
    keys = per_seed[0].keys
    classes = sorted(set(keys))
    util_ratio = per_seed[0].util_ratio  # the figure: the first seed's nodes
    work: dict[str, list[float]] = {}  # per class, mean over seeds
    index: dict[str, list[float]] = {}
    cv: dict[str, float] = {}
    waited_pct: dict[str, float] = {}
    rows = []
    for label, _, _ in pols:
        work[label] = [
            mean_ci([r.work[label][i] for r in per_seed])[0] for i in range(len(classes))
        ]
        index[label] = [
            mean_ci([r.index[label][i] for r in per_seed])[0] for i in range(len(classes))
        ]
        cvm = mean_ci([r.cv[label] for r in per_seed])
        wm = mean_ci([r.waited[label] for r in per_seed])
        cv[label], waited_pct[label] = cvm[0], wm[0]
        rows.append(
            (
                label,
                *work[label],
                *cvm,
                *index[label],
                *wm,
                mean_ci([r.mean_reserved[label] for r in per_seed])[0],
                mean_ci([r.mean_plain[label] for r in per_seed])[0],
                len(seeds),
            )
        )
    # run length: the first seed again at twice the tasks; the change of each
    # policy's per-class work/ideal and CV
    twice = _shares_seed(n, 2 * count, u, seeds[0], pols, reserve)
    length_rows = []
    for label, _, _ in pols:
        one = [*per_seed[0].work[label], per_seed[0].cv[label]]
        two = [*twice.work[label], twice.cv[label]]
        for what, x1, x2 in zip(
            [*(f"work/ideal {c}" for c in classes), "CV"], one, two, strict=True
        ):
            length_rows.append((label, what, x1, x2, 100.0 * (x2 / x1 - 1.0)))
    ltable = Table.of(
        ["policy", "figure", f"at {count:,} tasks", f"at {2 * count:,}", "change %"], length_rows
    )
    worst = max(length_rows, key=lambda r: abs(float(r[4])))
    table = Table.of(
        ["policy"]
        + [f"work/ideal {c}" for c in classes]
        + ["CV work/ideal", "+-"]
        + [f"load index/ideal {c}" for c in classes]
        + ["reserved waited %", "+-", "mean reserved", "mean other", "seeds"],
        rows,
    )
    groups = [
        plots.Series(label, [float(k) for k in keys], util_ratio[label], st)
        for (label, _, _), st in zip(pols, ("o", "s", "^"), strict=True)
    ]
    plots.scatter(
        p.out / "shares.png",
        groups,
        title=f"Work per node / share-weighted ideal (n = {n}, utilisation {u})",
        xlabel="node shares (capacity: 1024 shares per core)",
        ylabel="work done / ideal",
        logx=True,
        hline=(1.0, "ideal"),
    )

    # GPU sub-experiment (a shorter horizon when the run is made small: --quick)
    gpu_horizon = 300.0 if count >= 10_000 else 100.0
    gres = {}
    gpu_rows = []
    for offered in GPU_LOADS:
        for pol in ("binpack", "spread"):
            gruns = [
                run_gpu(
                    GpuSimConfig(
                        policy=pol,  # type: ignore[arg-type]
                        offered=offered,
                        horizon=gpu_horizon,
                        warmup=gpu_horizon / 5,
                        seed=sd,
                    )
                )
                for sd in seeds
            ]
            alloc = mean_ci([g.allocation for g in gruns])
            frag = mean_ci([g.fragmentation for g in gruns])

            def avg(key: str, runs: list[GpuResult] = gruns) -> float:
                return float(sum(getattr(g, key) for g in runs)) / len(runs)

            g = gres[(pol, offered)] = attrs.evolve(
                gruns[0],
                allocation=alloc[0],
                fragmentation=frag[0],
                frag_of_free=avg("frag_of_free"),
                whole_blocked=avg("whole_blocked"),
                wait_whole=avg("wait_whole"),
                wait_slice=avg("wait_slice"),
            )
            gpu_rows.append(
                (
                    offered,
                    pol,
                    *alloc,
                    *frag,
                    g.frag_of_free,
                    g.whole_blocked,
                    g.wait_whole,
                    g.wait_slice,
                    sum(x.placed for x in gruns) / len(gruns),
                )
            )
    gtable = Table.of(
        [
            "offered",
            "policy",
            "allocation rate",
            "+-",
            "fragmented (of all)",
            "+-",
            "fragmented (of free)",
            "free unusable by 1 GPU",
            "wait whole-GPU",
            "wait fractional",
            "placed",
        ],
        gpu_rows,
    )
    plots.bars(
        p.out / "shares_gpu.png",
        [f"offered {o:g}" for o in GPU_LOADS],
        [
            (f"{pol} {what}", [getattr(gres[(pol, o)], key) for o in GPU_LOADS])
            for what, key in (("allocated", "allocation"), ("fragmented", "fragmentation"))
            for pol in ("binpack", "spread")
        ],
        title="GPU slicing: 16 nodes x 8 GPUs, mostly fractional requests",
        ylabel="share of all GPU compute",
    )
    rnd, d2, jsq = (lb for lb, _, _ in pols)
    bp, sp = gres[("binpack", GPU_LOADS[-1])], gres[("spread", GPU_LOADS[-1])]
    row = {(float(r[0]), str(r[1])): r for r in gpu_rows}
    last = GPU_LOADS[-1]
    gci = {
        (pol, what): float(row[(last, pol)][col])
        for pol in ("binpack", "spread")
        for what, col in (("a", 3), ("f", 5))
    }

    def beyond(o: float, col: int) -> bool:
        """binpack's and spread's figures at load `o` differ by more than their CIs."""
        b_, s_ = row[(o, "binpack")], row[(o, "spread")]
        return abs(float(b_[col]) - float(s_[col])) > float(b_[col + 1]) + float(s_[col + 1])

    apart = [
        o
        for o in GPU_LOADS
        if beyond(o, 4) and float(row[(o, "binpack")][4]) < float(row[(o, "spread")][4])
    ]
    gpu_sig = (
        "the allocations "
        + ("differ by more" if beyond(last, 2) else "differ by less")
        + " than their confidence intervals; binpack's lower fragmentation is beyond"
        + " them at offered load "
        + (", ".join(f"{o:g}" for o in apart) if apart else "none")
        + ("" if len(apart) in (0, len(GPU_LOADS)) else " only")
        + "."
    )

    if bp.frag_of_free > sp.frag_of_free:
        free_txt = (
            f"As a share of the *free* compute, binpack's fragmentation is higher at "
            f"saturation ({bp.frag_of_free:.2f} vs {sp.frag_of_free:.2f}): what little it "
            "leaves free is the leftover of packed devices."
        )
    else:
        free_txt = (
            f"It also leaves a smaller share of the *free* compute fragmented "
            f"({bp.frag_of_free:.2f} vs {sp.frag_of_free:.2f})."
        )

    def cls(values: Sequence[float]) -> str:
        return ", ".join(f"{c}: {v:.2f}" for c, v in zip(classes, values, strict=True))

    return Outcome(
        name="shares",
        title="5. Shares, reservations and GPU slices",
        setup=f"""
n = {n} heterogeneous nodes: shares {", ".join(str(c) for c in classes)} with
capacity in proportion (1024 shares per core: a 512-share node is half a core, a
4096-share node four cores with four slots). Utilisation {u} of the total capacity,
exponential service. 15 % of tasks reserve 256 shares and 5 % reserve 1024 while they
run (`ShareLedger` enforces it: a reserved task starts only when its reservation fits
the node's free shares, and a node whose shares are all reserved takes nothing else).
**Staleness model: `GossipAge`** (period 1 S, delay 0.05 S). {count:,} tasks per
policy and seed; seeds {seeds[0]} to {seeds[-1]} (each draws its own node order and
arrivals): the per-class figures are means over them, the CV and the waited
percentage come with the half-widths of their 95 % confidence intervals; the figure
shows the first seed's nodes. Run length: seed {seeds[0]} again at twice the tasks
moves no work/ideal or CV figure by more than {abs(float(worst[4])):.1f} % ({worst[0]},
{worst[1]}; second table).

The share-weighted ideal gives every node work in proportion to the shares it can
give to work: its shares less those held by running reservations (a reservation
holds shares on purpose; time averages). *work/ideal* is a node's work done over that
ideal, averaged by share class; *load index/ideal* does the same for the time-average
load index `weight_sum / (shares - reserved)`. A reserved task *waited* when no node
had room for its reservation, its target refused it, or it was passed over at start
with a slot free.

GPU sub-experiment: 16 nodes with 8 GPUs each (two NVLink groups of four, 80 GiB).
Requests are shaped after Alibaba's GPU traces (PAI 2020; the 2023 GPU-sharing
trace): about two thirds ask for a fraction of one device (10-75 % of its compute,
memory in proportion), the rest one, two, four or eight whole devices; lognormal
durations. `place(d=2)` samples nodes whose gossiped GPU summary fits
(`gpu.fits_summary`); the target's `GpuAllocator` chooses devices with *binpack* (the
fullest device that fits) or *spread* (the emptiest); tasks that fit nowhere wait
FIFO and are retried when GPUs free up. *Fragmented* is the free GPU compute that the
next request (drawn from the mix) could not use, weighted by the mix
(`gpu.fragmentation`; the measure of Weng et al., ATC'23), as a share of all GPU
compute and of the free compute. Seeds {seeds[0]} to {seeds[-1]}: means, with the
half-widths of the 95 % confidence intervals of the allocation and fragmentation.
""",
        tables=[("shares", table), ("shares_length", ltable), ("shares_gpu", gtable)],
        figures=[
            ("shares.png", "Per-node work / share-weighted ideal, by node shares"),
            ("shares_gpu.png", "GPU compute allocated and fragmented, binpack vs spread"),
        ],
        findings=f"""
**What it shows.** Random placement ignores shares: every node gets the same number
of tasks, so the half-core nodes saturate (work/ideal by class: {cls(work[rnd])}; CV
{cv[rnd]:.2f}), and their queues grow without bound. swarm's `place(d=2)`
compares projected load indexes (weight per unreserved share) and gives every class
close to its share of the work even on gossip one service time old ({cls(work[d2])};
CV {cv[d2]:.2f}; JSQ with fresh information: {cls(work[jsq])}). The largest nodes
get less than their share under both: an idle small node has load 0, below any node
with a task, so it is refilled as soon as it empties, while the 4096-share nodes
absorb the slack with idle cores. Fresh JSQ always finds the empty small node, so it
overfills the small classes most; two stale samples do so less.

The load index itself is not equal across classes ({cls(index[d2])} for d = 2), and
cannot be: a 512-share node holding one task is at load 2/1024 while a 4096-share node
needs eight tasks to get there, and the small node serves its one task at half
speed, so it spends most of its time at one task (twice the ideal load) or zero. Big
nodes pool their cores (M/M/4 rather than M/M/1) and carry less load per share at
the same utilisation. This is the granularity of shares, not a placement error.

Reserved tasks waited for shares in {waited_pct[d2]:.1f} % of cases under d = 2
(random: {waited_pct[rnd]:.1f} %, JSQ: {waited_pct[jsq]:.1f} %): the
placement filter skips nodes whose gossiped free shares are too few and the target's
`admit` re-checks on fresh state, so a reservation rarely lands where it cannot start;
when it does, the origin backs off and places it again.

**GPU.** At offered load {GPU_LOADS[-1]:g} binpack allocates {bp.allocation:.1%}
(+-{gci[("binpack", "a")]:.1%}) of GPU compute vs {sp.allocation:.1%}
(+-{gci[("spread", "a")]:.1%}) for spread, and leaves {bp.fragmentation:.1%}
(+-{gci[("binpack", "f")]:.1%}) of it fragmented vs {sp.fragmentation:.1%}
(+-{gci[("spread", "f")]:.1%}); {gpu_sig} Whole-GPU requests wait
{bp.wait_whole:.1f} vs {sp.wait_whole:.1f} time units, because binpack keeps whole
devices free while spread puts a slice on every empty device. {free_txt} This is the
direction of Weng et al. (ATC'23), who show that fragmentation-blind, spreading
placement strands GPU capacity that whole-GPU and large requests need; their
fragmentation-gradient scheduler is not implemented here (swarm's allocator is
binpack within a node and power of two choices across nodes), so their absolute gains
are not comparable.
""",
        checks={
            "d=2 gives every share class its share of the work within 20 %": all(
                0.8 <= x <= 1.2 for x in work[d2]
            ),
            "d=2 is closer to the share-weighted ideal than random": cv[d2] < cv[rnd],
            "binpack leaves less GPU compute fragmented than spread at every load": all(
                gres[("binpack", o)].fragmentation < gres[("spread", o)].fragmentation
                for o in GPU_LOADS
            ),
        },
    )


# ------------------------------------------------------------------ 6. flex


def _interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """y at x on the piecewise-linear curve (xs ascending), clamped at the ends."""
    pts = sorted(zip(xs, ys, strict=True))
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return pts[-1][1]


FLEX_SEEDS = 5


def _flex_runs(base: FlexSimConfig) -> list[tuple[str, str, FlexSimConfig]]:
    runs: list[tuple[str, str, FlexSimConfig]] = [
        ("requests", "least-fit", base),
        ("requests", "oversub 1.5x", attrs.evolve(base, oversub=1.5)),
        ("requests", "oversub 2x", attrs.evolve(base, oversub=2.0)),
        ("requests", "oversub 2.5x", attrs.evolve(base, oversub=2.5)),
    ]
    for pm in (1.0, 1.25, 1.5, 2.0):
        cfg = attrs.evolve(base, admission=FLEX, flex=flex_config(pm))
        runs.append(("flex-fifo", f"flex FIFO Pmin {pm:g}", cfg))
    for pm in (1.25, 1.5):
        cfg = attrs.evolve(base, admission=FLEX, order=LRF, flex=flex_config(pm))
        runs.append(("flex-lrf", f"flex LRF Pmin {pm:g}", cfg))
    return runs


@_timed
def flex(p: Params) -> Outcome:
    """Least-fit on requests vs oversubscription vs usage-aware (Flex) admission, 5
    seeds: at equal utilisation and at equal parameters."""
    n = p.nodes or 32
    seeds = [p.seed + k for k in range(FLEX_SEEDS)]
    fams: dict[str, str] = {}
    res: dict[str, list[FlexResult]] = {}
    for sd in seeds:
        for fam, lb, cfg in _flex_runs(FlexSimConfig(nodes=n, seed=sd)):
            fams[lb] = fam
            res.setdefault(lb, []).append(run_flex(cfg))
    base = FlexSimConfig(nodes=n)
    steps = n * (base.horizon - base.warmup)  # node-steps measured per run
    labels = list(res)

    def avg(lb: str, f: Callable[[FlexResult], float]) -> tuple[float, float]:
        return mean_ci([f(r) for r in res[lb]])

    lf = "least-fit"
    rows = []
    for lb in labels:
        u, uh = avg(lb, lambda r: r.utilisation)
        v, vh = avg(lb, lambda r: r.violation_pct)
        a, ah = mean_ci([r.admitted / b.admitted for r, b in zip(res[lb], res[lf], strict=True)])
        rows.append(
            (
                lb,
                u,
                uh,
                v,
                vh,
                v / 100 * steps,
                avg(lb, lambda r: r.spread)[0],
                avg(lb, lambda r: r.requested)[0],
                a,
                ah,
                avg(lb, lambda r: r.mean_wait)[0],
            )
        )
    table = Table.of(
        [
            "policy",
            "utilisation",
            "+-",
            "QoS violations %",
            "+-",
            f"violating node-steps (of {steps:,})",
            "usage spread (std/mean)",
            "requested/capacity",
            "admitted vs least-fit",
            "+-",
            "mean wait",
        ],
        rows,
    )
    fam_series = []
    for fam, style in (("requests", "o-"), ("flex-fifo", "s-"), ("flex-lrf", "^-")):
        pts = sorted((r[1], r[3]) for r in rows if fams[r[0]] == fam)
        label = {
            "requests": "requests (least-fit, oversub 1.5-2.5x)",
            "flex-fifo": "flex FIFO (Pmin 1-2)",
            "flex-lrf": "flex LRF",
        }[fam]
        fam_series.append(
            plots.Series(label, [x for x, _ in pts], [max(y, 1e-3) for _, y in pts], style)
        )
    plots.lines(
        p.out / "flex.png",
        fam_series,
        title=f"Utilisation vs QoS violations (n = {n}, {FLEX_SEEDS} seeds, mean)",
        xlabel="CPU utilisation (used / capacity)",
        ylabel="% node-time with demand > capacity",
        logy=True,
    )
    # Equal utilisation: Flex's FIFO curve read at 2x oversubscription's point, per seed.
    fifo = [lb for lb in labels if fams[lb] == "flex-fifo"]
    floor = 100.0 / steps  # one violating node-step: a ratio never divides by zero
    fewer, adm_more, held_more = [], [], []
    ov_sum = fx_sum = 0.0
    for i in range(FLEX_SEEDS):
        ov = res["oversub 2x"][i]
        xs = [res[lb][i].utilisation for lb in fifo]
        viol = _interp(ov.utilisation, xs, [res[lb][i].violation_pct for lb in fifo])
        fewer.append(max(ov.violation_pct, floor) / max(viol, floor))
        ov_sum += ov.violation_pct
        fx_sum += viol
        adm = _interp(ov.utilisation, xs, [float(res[lb][i].admitted) for lb in fifo])
        adm_more.append(adm / res[lf][i].admitted - 1.0)
        req = _interp(ov.utilisation, xs, [res[lb][i].requested for lb in fifo])
        held_more.append(req / res[lf][i].requested - 1.0)
    (fw, fwh), (am, amh), (hm, hmh) = mean_ci(fewer), mean_ci(adm_more), mean_ci(held_more)
    pooled = ov_sum / max(fx_sum, floor)
    wins = sum(1 for x in fewer if x > 1.0)
    adm_wins = sum(1 for x in adm_more if x > 0)
    # Equal parameters: Flex at Pmin 1 (alpha 0.99, the least conservative setting) and
    # 2x oversubscription, each where it lands.
    row = {r[0]: r for r in rows}
    p1, o2 = row["flex FIFO Pmin 1"], row["oversub 2x"]
    gain_pts = (p1[1] - o2[1]) * 100
    p1_more = p1[3] > o2[3]
    return Outcome(
        name="flex",
        title="6. Flex: admission on requests vs on usage",
        setup=f"""
A time-stepped cluster of n = {n} nodes (32 cores, 128 GiB each; one step is one
usage sample). Tasks arrive with CPU and memory *requests* and a usage shaped after
the Google 2011 trace analyses (Reiss et al., SoCC 2012): production tasks (30 %,
long) use about 30 % of their CPU request on average, batch tasks (70 %, short)
about 45 %, memory about half; CPU usage wanders around each task's mean (lognormal
noise, AR(1) correlation 0.8 per step) and bursts above the request (up to 2x).
Requested demand is offered at 3.5x the cluster's capacity, so admission decides how
much runs; tasks wait up to 60 steps, the scheduler looks at the 50 oldest per step.

- *least-fit*: the node with the most unrequested room; admit iff
  requests + request <= capacity (`flex_refusal` with P = 1 over committed requests).
- *oversub kx*: the same with k times the capacity.
- *flex*: swarm's path: `place(d=2)` over reports one step old (filtered on reported
  idle CPU and free memory), then the target's `admit` with its Flex state:
  P x usage estimate + request <= capacity, estimate by `PeakEstimator`
  (half-life 5 steps), P by `flex_update` each step (QoS target: no demand above
  capacity; alpha {flex_config().alpha:g}, the published value), Pmin 1 to 2. FIFO or
  largest-request-first (within the 50-task window).

QoS violation: a node-step with CPU or memory demand above capacity ({steps:,}
node-steps measured per run). Spread: the standard deviation of node CPU usage over
its mean. Seeds {seeds[0]}-{seeds[-1]}: the table gives means and 95 % CIs.
""",
        tables=[("flex", table)],
        figures=[
            (
                "flex.png",
                "QoS violations vs utilisation per admission family (0 is drawn at 0.001)",
            )
        ],
        findings=f"""
**What it shows.** Admitting on requests wastes most of the machine: least-fit
reaches {row[lf][1]:.0%} utilisation because tasks use a third of what they ask.
Oversubscribing by 2x reaches {o2[1]:.0%} with {o2[3]:.2f} % of node-time in violation
({o2[5]:.0f} node-steps a run).

*At equal utilisation* (Flex's FIFO curve read at 2x oversubscription's utilisation,
per seed): pooled over the seeds Flex has {pooled:.1f}x fewer violations, and fewer in
{wins} of {FLEX_SEEDS} seeds; the per-seed ratio runs from {min(fewer):.1f}x to
{max(fewer):.1f}x (mean {fw:.1f}x +- {fwh:.1f}). The Flex runs nearest that
utilisation (Pmin 1.5) violate in {row["flex FIFO Pmin 1.5"][5]:.0f} node-steps of
{steps:,} a run on average: the ratio rests on few events.

*At equal parameters* the comparison reverses: Flex at Pmin 1 (its least
conservative setting, alpha {flex_config().alpha:g}) runs at {p1[1]:.0%} utilisation,
{gain_pts:.0f} points above 2x oversubscription, with {p1[3]:.1f} % violations,
{"more" if p1_more else "fewer"} than 2x oversubscription's {o2[3]:.2f} %. Flex buys
utilisation with violations unless Pmin is raised; its advantage is at equal
utilisation only, and there {"in every seed" if wins == FLEX_SEEDS else "pooled, not seed by seed"}.

**Versus the published result** (usage-aware admission reaches oversubscription's
utilisation with about 3.7x fewer QoS violations and admits about 74 % more than
least-fit). Like for like, at 2x oversubscription's utilisation Flex admits
{am:+.0%} (+-{amh:.0%}) more tasks than least-fit over the run (the offered load caps
this figure), not 74 %; the requested work it holds at once is {hm:+.0%} (+-{hmh:.0%})
above least-fit's, a different measure from the paper's. The direction of the
admitted result holds in {adm_wins} of {FLEX_SEEDS} seeds and that of the violations
{"too" if wins == FLEX_SEEDS else f"only pooled ({wins} of {FLEX_SEEDS} seeds)"}; the
factors depend on the workload: how far usage sits below requests (a third
of the CPU request here) sets how much room admitting on usage finds, and how
correlated tasks' bursts are (independent here, so a node's total is smoother than
under production's correlated bursts and diurnal load) sets how many violations each
extra admitted task costs.
""",
        checks={
            "flex reaches 2x oversubscription's utilisation with fewer violations (pooled)": (
                pooled > 1.0
            ),
            "flex admits more than least-fit at that utilisation": am > 0,
        },
    )


# ------------------------------------------------------------------ 7. fairness

FAIR_SEEDS = 5


# Student's t at 97.5 % for n - 1 degrees of freedom (95 % two-sided intervals).
def _smooth(series: Sequence[tuple[float, float]], k: int) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i in range(0, len(series) - k + 1, k):
        chunk = series[i : i + k]
        xs.append(sum(t for t, _ in chunk) / len(chunk))
        ys.append(sum(j for _, j in chunk) / len(chunk))
    return xs, ys


@_timed
def fairness(p: Params) -> Outcome:
    """Fair share (DRF on stale gossip) and an elastic quota against a central DRF
    scheduler on the same trace; quota overshoot as a function of gossip delay."""
    seeds = [p.seed + k for k in range(FAIR_SEEDS)]
    small = p.nodes or 100
    big = None if p.nodes else 1000
    sec = fs.SECOND

    def cfg_for(n: int, capped: bool, seed: int, **kw: object) -> fs.FairSimConfig:
        base = fs.FairSimConfig(
            nodes=n,
            seed=seed,
            delay=fs.default_delay(n) * sec,
            cap_fraction=fs.DEFAULT.cap_fraction if capped else None,
        )
        return attrs.evolve(base, **kw)  # type: ignore[arg-type]

    def pair(n: int, capped: bool) -> list[tuple[fs.FairResult, fs.FairResult]]:
        out = []
        for sd in seeds:
            c = cfg_for(n, capped, sd)
            tr = fs.trace(c)
            out.append((fs.run_swarm(c, tr), fs.run_central(c, tr)))
        return out

    configs = [(small, True), (small, False)] + ([(big, False)] if big else [])
    runs = {(n, cap): pair(n, cap) for n, cap in configs}
    rows = []
    ratio: dict[tuple[int, bool], tuple[float, float]] = {}
    cost: dict[tuple[int, bool], tuple[float, float]] = {}
    for (n, capped), rs in runs.items():
        ratio[(n, capped)] = mean_ci([s.jain / c.jain for s, c in rs])
        cost[(n, capped)] = mean_ci([s.mean_response / c.mean_response - 1.0 for s, c in rs])
        for k, name in ((0, "swarm"), (1, "central")):
            got = [r[k] for r in rs]
            jn, jci = mean_ci([r.jain for r in got])
            rt, rci = mean_ci([r.mean_response for r in got])
            pk, pci = (
                mean_ci([100 * r.overshoot_peak for r in got]) if capped else (math.nan, math.nan)
            )
            me = mean_ci([100 * r.overshoot_mean for r in got])[0] if capped else math.nan
            rows.append(
                (
                    n,
                    f"{fs.DEFAULT.cap_fraction:.0%} of slots" if capped else "none",
                    name,
                    len(seeds),
                    jn,
                    jci,
                    ratio[(n, capped)][0] if k == 0 else 1.0,
                    mean_ci([r.jain_raw for r in got])[0],
                    rt,
                    rci,
                    cost[(n, capped)][0] if k == 0 else 0.0,
                    mean_ci([r.utilisation for r in got])[0],
                    pk,
                    pci,
                    me,
                )
            )
    table = Table.of(
        [
            "nodes",
            "quota",
            "scheduler",
            "seeds",
            "Jain (alloc / DRF share)",
            "+-95%",
            "Jain vs central",
            "Jain of raw shares",
            "mean response (S)",
            "+-95%",
            "response vs central",
            "utilisation",
            "peak overshoot % of cap",
            "+-95%",
            "mean overshoot % of cap",
        ],
        rows,
    )
    # Quota overshoot as a function of the gossip delay (capped workload, `small` nodes).
    default_d = fs.default_delay(small)
    delays: list[tuple[str, float | None]] = [
        ("fresh (no gossip)", None),
        (f"{default_d:.2f} s (default, n = {small})", default_d),
        (f"{fs.default_delay(1000):.2f} s (the default delay at n = 1000)", fs.default_delay(1000)),
        ("30 s", 30.0),
    ]
    qrows = []
    qx: list[float] = []
    qpeak: list[float] = []
    qmean: list[float] = []
    for label, d in delays:
        if d == default_d:
            got = [s for s, _ in runs[(small, True)]]
        else:
            got = []
            for sd in seeds:
                kw: dict[str, object] = {"fresh": True} if d is None else {"delay": d * sec}
                got.append(fs.run_swarm(cfg_for(small, True, sd, **kw)))
        pk, pci = mean_ci([100 * r.overshoot_peak for r in got])
        me, mci = mean_ci([100 * r.overshoot_mean for r in got])
        qrows.append(
            (
                label,
                0.0 if d is None else d,
                len(seeds),
                pk,
                pci,
                me,
                mci,
                mean_ci([r.utilisation for r in got])[0],
                mean_ci([r.cap_use for r in got])[0],
                mean_ci([r.jain for r in got])[0],
            )
        )
        qx.append(0.0 if d is None else d)
        qpeak.append(pk)
        qmean.append(me)
    qtable = Table.of(
        [
            "gossip delay",
            "delay s",
            "seeds",
            "peak overshoot % of cap",
            "+-95%",
            "mean overshoot % of cap",
            "+-95%",
            "utilisation",
            "batch running / cap",
            "Jain (alloc / DRF share)",
        ],
        qrows,
    )
    # Figures: Jain's index over the day (first seed), and overshoot vs delay.
    series = []
    shown = [(small, True)] + ([(big, False)] if big else [(small, False)])
    for (n, capped), col in zip(shown, ("tab:blue", "tab:orange"), strict=True):
        s, c = runs[(n, capped)][0]
        tag = f"n = {n}, {'capped' if capped else 'no cap'}"
        day = fs.DEFAULT.day
        sx, sy = _smooth(s.series, 5)
        cx, cy = _smooth(c.series, 5)
        series.append(plots.Series(f"swarm, {tag}", [x / day for x in sx], sy, "-", 1.2, col))
        series.append(plots.Series(f"central, {tag}", [x / day for x in cx], cy, ":", 1.2, col))
    plots.lines(
        p.out / "fairness.png",
        series,
        title="Jain's index of dominant shares (allocation / DRF share), seed " + str(seeds[0]),
        xlabel="time (days; a day is 24 S)",
        ylabel="Jain's index (mean of 5 samples)",
    )
    plots.lines(
        p.out / "fairness_quota.png",
        [
            plots.Series("peak", qx, qpeak, "o-"),
            plots.Series("time average", qx, qmean, "s-"),
        ],
        title=f"Quota overshoot vs gossip delay (n = {small}, report every 1 s)",
        xlabel="dissemination delay (s; 0 = fresh views)",
        ylabel="% of the cap",
        hline=(5.0, "target 5 %"),
    )
    within = {k: v[0] >= 0.95 for k, v in ratio.items()}
    peak_default = next(r[3] for r in qrows if r[1] == default_d)
    peak_default_ci = next(r[4] for r in qrows if r[1] == default_d)
    mean_default = next(r[5] for r in qrows if r[1] == default_d)
    peak_fresh = qrows[0][3]
    peak_big = qrows[2][3]
    jain_fresh, jain_default = qrows[0][-1], next(r[-1] for r in qrows if r[1] == default_d)
    use_c = mean_ci([c.cap_use for _, c in runs[(small, True)]])[0]
    use_s = mean_ci([s.cap_use for s, _ in runs[(small, True)]])[0]
    util_s = mean_ci([s.utilisation for s, _ in runs[(small, True)]])[0]
    util_c = mean_ci([c.utilisation for _, c in runs[(small, True)]])[0]
    cap_slots = attrs.evolve(fs.DEFAULT, nodes=small).cap

    held = [k for k, ok in within.items() if ok]
    missed = [k for k, ok in within.items() if not ok]

    def where(ks: list[tuple[int, bool]]) -> str:
        return ", ".join(f"n = {n} {'with' if c else 'without'} the quota" for n, c in ks)

    targets = (
        "Jain's index within 5 % of the central scheduler's: "
        + (f"holds ({where(held)})" if held else "")
        + ("; " if held and missed else "")
        + (f"does not hold ({where(missed)})" if missed else "")
        + ". Quota overshoot under 5 % of the cap at the default timers: "
        + (
            f"holds (peak {peak_default:.1f} +- {peak_default_ci:.1f} %)."
            if peak_default < 5.0
            else f"not met for the peak ({peak_default:.1f} +- {peak_default_ci:.1f} % of"
            f" the cap at n = {small}"
            + (", an interval that straddles 5 %" if peak_default - peak_default_ci < 5 else "")
            + f"); the time average ({mean_default:.2f} %) is well under it, but the"
            " target does not say average and is not counted as met. With the delay"
            f" gossip has at 1,000 nodes the peak is {peak_big:.1f} % (on this"
            f" {small}-node cluster; quotas were not simulated at 1,000 nodes)."
        )
    )

    def rat(k: tuple[int, bool]) -> str:
        mu, ci = ratio[k]
        return f"{mu:.3f} +- {ci:.3f}"

    def rtc(k: tuple[int, bool]) -> str:
        mu, ci = cost[k]
        return f"{mu:+.1%} +- {ci:.1%}"

    big_txt = (
        f" At n = {big} (no cap) it is {rat((big, False))} and costs {rtc((big, False))}."
        if big
        else ""
    )
    users = ", ".join(f"{u.name} ({u.group}, {u.cpu:g} CPU, {u.mem_gib:g} GiB)" for u in fs.USERS)
    return Outcome(
        name="fairness",
        title="7. Fair share and quotas without a leader vs a central DRF scheduler",
        setup=f"""
`sim.fairsim`: n nodes of {fs.DEFAULT.slots} slots ({fs.DEFAULT.cpus:g}
CPUs, {fs.DEFAULT.mem_gib:g} GiB: CPU and memory are counted by DRF, a node runs
{fs.DEFAULT.slots} tasks whatever they ask). Six users with Zipf-skewed demand
(1, 1/2, ... 1/6 of the load): {users}. Arrivals are Poisson with a diurnal rate
(x (1 + 0.6 sin), two time zones a quarter day apart), mean offered load
{fs.DEFAULT.load:.0%} of the slots (peaks above 100 %); service exponential,
mean S = one minute; a day is compressed to {fs.DEFAULT.day:g} S and measured
after {fs.DEFAULT.warmup:g} S of warm-up; the fair-share half-life is that day
(the agent's default, one day). In the capped runs group *batch* (alice) has
quota-max = {fs.DEFAULT.cap_fraction:.0%} of the slots, with the agent's defaults:
quota-floor {fs.DEFAULT.quota_floor:g}, quota-lag {fs.DEFAULT.quota_lag / fs.SECOND:g} s (a
node splits the cap on its own demand as its reports said that long ago), and a
changed report published at once, at most every
{fs.DEFAULT.publish_gap / fs.SECOND:g} s.

- *swarm*: a task goes to the less loaded of two random nodes (fresh lengths; no
  stealing or pushing afterwards, which the agent has: pessimistic) and each node
  orders its own queue with `node.runqueue.order` on a stale cluster usage view and
  gates batch's tasks with `node.runqueue.quota_refusal` on the others' gossiped
  per-node group rows. Every node reports each second (random phase) and the others
  see a report after the dissemination delay that swarm's real SWIM core measured at
  the LAN timers: {fs.default_delay(100):.2f} s at 100 nodes,
  {fs.default_delay(1000):.2f} s at 1,000 (`fairsim.DISSEMINATION`; at 1,000 nodes a
  lower bound).
- *central* (the yardstick): one omniscient scheduler over all slots with fresh
  usage, each start by `policy.fairness.drf_schedule`, the cap enforced exactly.

Jain's index (`policy.fairness.jain_index`) is taken every 0.1 S over the users with
work in the system, of each user's running tasks divided by what DRF would give it at
that moment (max-min fairness of dominant shares by progressive filling, given each
user's tasks in the system and the cap: `fairsim.drf_allocation`); 1 means every user
has exactly its DRF share. *Jain of raw shares* is the index of the dominant shares
themselves (light users want less than an equal share, so it is far below 1 for both,
and it rises when the biggest user is held back, even by idle slots). Overshoot: the
capped group's running tasks above the cap, at every start (peak) and sampled (time
average). Each figure is the mean over seeds {seeds[0]} to {seeds[-1]} with the
half-width of its 95 % confidence interval (t distribution); *vs central* is the mean
of the per-seed ratios. The runs with a quota are at n = {small} only: the agent's
split (`policy.quota.whole_slots`) reads every node's row, so simulating it costs
O(n^2) per report interval (about 15 s per run at 100 nodes).

Command: `swarm sim fairness --out docs/experiments` (seeds 1 to 5; `--seed S` starts
the five at S; `--nodes N` runs N nodes only, capped and not, which takes seconds for
a few tens of nodes).
""",
        tables=[("fairness", table), ("fairness_quota", qtable)],
        figures=[
            ("fairness.png", "Jain's index over the day, swarm (solid) vs central (dotted)"),
            ("fairness_quota.png", "Quota overshoot (% of the cap) vs dissemination delay"),
        ],
        findings=f"""
**Fairness.** Ordering each node's own queue by stale cluster-wide usage keeps Jain's
index at {rat((small, True))} of the central scheduler's with the quota
and {rat((small, False))} without, at n = {small}.{big_txt} The central
scheduler stays close to 1 (it is DRF with fresh data over one pool). Staleness is
not what swarm loses: with fresh views its index is {jain_fresh:.3f}, at the default
delay {jain_default:.3f} (second table, capped, n = {small}). The gap comes with
running the order per node (a task waits on the node it was placed on while a slot
frees elsewhere for someone else, and a node chooses only among its own queue; this
simulator does not move queued tasks, which the agent's stealing would). The cost in
mean response time is {rtc((small, True))} with the quota and {rtc((small, False))}
without at n = {small}. With the quota, swarm also runs the capped group below its
cap on average ({use_s:.0%} of it, against {use_c:.0%} for the central scheduler;
utilisation {util_s:.3f} against {util_c:.3f}). Likely causes: the gate splits the
cap by each node's batch demand, queued tasks included, so part of the cap goes to
nodes whose slots are busy with other users' work while batch tasks wait elsewhere;
and new demand counts only after quota-lag (the price of the low overshoot below).

**Quota overshoot.** At the default timers (n = {small}) batch's peak is
{peak_default:.1f} +- {peak_default_ci:.1f} % above its cap of {cap_slots:g} slots
(time average {mean_default:.2f} %); with fresh views it is {peak_fresh:.1f} %. What
remains comes from staleness: a node counts another's starts only once its report
arrives, and splits on its own demand as it was quota-lag ago; when the
dissemination delay exceeds quota-lag (the 1,000-node delay and beyond, second
table) two nodes again see different figures and the peak grows with the delay. A
cluster that large should set quota-lag near its report age (`swarm nodes`).

**The issue's targets.** {targets}
""",
        checks={
            **{
                f"Jain's index within 5 % of the central scheduler's (n = {n}, "
                f"{'quota' if c else 'no quota'})": ok
                for (n, c), ok in within.items()
            },
            f"peak quota overshoot under 5 % of the cap at the default timers (n = {small})": (
                peak_default < 5.0
            ),
        },
    )


# ------------------------------------------------------------------ 8, 9. where (issue 21)


@_timed
def constraints(p: Params) -> Outcome:
    """Constrained two-choice on stale gossip vs constrained JSQ vs blind probing, as the
    labelled fraction of the nodes falls from 100 % to 1 % (`sim.constraintsim`)."""
    return constraintsim.constraints_outcome(p.out, p.nodes, p.tasks, p.seed)


@_timed
def locality(p: Params) -> Outcome:
    """Data locality and response time vs the delay-scheduling wait D (`sim.localitysim`)."""
    return localitysim.locality_outcome(p.out, p.nodes, p.tasks, p.seed)


# ------------------------------------------------------------------ 10. elastic (issue 25)


@_timed
def elastic(p: Params) -> Outcome:
    """A fleet that scales itself over a diurnal day with bursts: swarm's leaderless
    autoscaler vs a central one vs fixed fleets (`sim.elasticsim`)."""
    return elasticsim.elastic_outcome(p.out, p.nodes, p.tasks, p.seed)


# ------------------------------------------------------------------ 11. gang (issue 22)


@_timed
def gang(p: Params) -> Outcome:
    """Leaderless gangs (the protocol of cluster.gangcoord / gangholds on sim.gangnet)
    against a central gang scheduler on the same trace (`sim.gangsim`)."""
    return gangsim.gang_outcome(p.out, p.nodes, p.tasks, p.seed)


# ------------------------------------------------------------------ 12. hedge (issue 24)


@_timed
def hedge(p: Params) -> Outcome:
    """Stragglers and speculative backups (`policy.hedge` on `sim.hedgesim`)."""
    return hedgesim.hedge_outcome(p.out, p.nodes, p.tasks, p.seed)


# ------------------------------------------------------------------ registry

EXPERIMENTS: dict[str, Callable[[Params], Outcome]] = {
    "balls": balls,
    "staleness": staleness,
    "load": load,
    "transfer": transfer,
    "shares": shares,
    "flex": flex,
    "fairness": fairness,
    "constraints": constraints,
    "locality": locality,
    "elastic": elastic,
    "gang": gang,
    "hedge": hedge,
}

INTRO = """
# Experiments

Generated by `make experiments` (`swarm sim all --out docs/experiments
--doc docs/experiments.md`); every figure and table below comes from that run, over
seeds 1 to 5 with 95 % confidence intervals unless its section says otherwise (a
figure of one seed's run, for instance). Each experiment can be rerun alone:
`swarm sim NAME [--nodes N] [--seed S] [--tasks M] [--out DIR]` writes NAME.csv,
NAME.png and NAME.md. `make experiments` also writes every experiment's CSVs at small
sizes (`swarm sim all --quick --out docs/experiments/quick`); `make test` reruns them
and fails when one is not the same byte for byte, so a change that moves a figure
must regenerate the page. Where a section has a run-length table, its every cell was
run again at twice the tasks (seed 1) to show how much the run length still moves it.

The simulator (`swarm/sim/`) is a deterministic discrete-event engine. Its decisions
are the agent's own code, called exactly as the agent calls it: the node's placement
rule and admission (`node.decide`: `policy.placement.place` and `admit`), its start
gate and GPU slices (`node.gate`), `PlacementRetry`, `ShareLedger`, `TransferPolicy`
(probes, replies, pushes and steals are delayed messages), `LateBinding`
(reservations, cancels, pulls and answers are delayed messages too),
`policy.migration.plan_migrations`, `policy.load` (Flex) and `policy.gpu.GpuAllocator`.
Only the yardsticks that swarm must never use (least-loaded of a stale view,
omniscient join-shortest-queue) and the request-based baselines of the Flex
experiment are computed by the simulator itself.

Staleness: placers read a shared view of load reports. `Board(T)` is Mitzenmacher's
bulletin board (all reports posted together every T); `GossipAge(period, delay)` is
the age model of gossip (each node re-publishes every period with a random phase and
peers see it `delay` later, so a report's age is uniform in [delay, delay + period]).
The model is calibrated against swarm's real membership core: `sim.calibrate` runs
the SWIM core (`cluster.membership`) on the simulated network (`sim.gossipnet`) and
measures how old gossiped load is (experiment 2, second table). Each experiment says
which model it uses.

Time is in units of the mean service time S; the policies' timers are scaled to it (a
transfer round every S/2, for instance), which makes them coarser than the agent's
half-second ticks on tasks of minutes: the simulated policies react more slowly than
the real ones. The agent's coordinator also counts the tasks it has just sent to a
peer in its own view until that peer's next report; the simulator does not, which
again errs on the pessimistic side.
"""


def run(name: str, p: Params) -> Outcome:
    try:
        fn = EXPERIMENTS[name]
    except KeyError:
        raise ValueError(f"unknown experiment {name!r}; one of {', '.join(EXPERIMENTS)}") from None
    return fn(p)
