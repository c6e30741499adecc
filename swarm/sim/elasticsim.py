"""Experiment 10, `swarm sim elastic`: autoscaling without a leader (issue 25).

One pool over a diurnal day with bursts: a fixed fleet sized for the peak, a fixed
fleet sized for the mean, swarm's autoscaler (the node `ActorSeat` elects decides, on
a gossiped view, and the acting node crashes mid-run) and a central autoscaler with
the same `ScaleConfig` on a fresh view. A second table runs both autoscalers over
more seeds for a few values of `scale_in_utilisation`, the target's value (0.7)
being HPA's own landing: it shows why the default is 0.5. The engine is
`sim.elasticengine`; this module runs the seeds and writes the outcome (tables,
figure, prose).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import attrs

from ..policy.autoscale import ScaleConfig
from . import plots
from .elasticengine import (
    CENTRAL,
    FIXED,
    SWARM,
    ElasticConfig,
    ElasticResult,
    closest_reversal,
    reversals,
    run_elastic,
)
from .report import Outcome, Table, mean_ci

SEEDS = 5
SENS_SEEDS = 20  # seeds of the scale_in_utilisation table (elastic-in)
IN_UTILS = (0.5, 0.55, 0.6, 0.7)  # scale_in_utilisation tried; 0.7, the target, is HPA's
NODES = 40  # max_nodes
TASKS_PER_NODE = 75  # default tasks per day: 3000 for 40 nodes
PEAK, MEAN = "fixed at peak", "fixed at mean"
ROWS = (PEAK, MEAN, SWARM, CENTRAL)


def configs(max_nodes: int, tasks: int, seed: int) -> dict[str, ElasticConfig]:
    base = ElasticConfig(max_nodes=max_nodes, tasks=tasks, seed=seed)
    peak = min(max_nodes, base.nodes_for(base.base_rate * (1 + base.swing)))
    mean = min(max_nodes, base.nodes_for(base.base_rate))
    return {
        PEAK: attrs.evolve(base, policy=FIXED, fixed=peak),
        MEAN: attrs.evolve(base, policy=FIXED, fixed=mean),
        SWARM: base,
        CENTRAL: attrs.evolve(base, policy=CENTRAL),
    }


def run_all(
    max_nodes: int, tasks: int, seeds: list[int]
) -> tuple[dict[str, list[ElasticResult]], dict[str, ElasticConfig]]:
    runs: dict[str, list[ElasticResult]] = {k: [] for k in ROWS}
    cfgs: dict[str, ElasticConfig] = {}
    for s in seeds:
        print(f"  elastic: seed {s}", file=sys.stderr)
        cfgs = configs(max_nodes, tasks, s)
        for k in ROWS:
            runs[k].append(run_elastic(cfgs[k]))
    return runs, cfgs


def _ci(rs: list[ElasticResult], f: str) -> tuple[float, float]:
    return mean_ci([round(float(getattr(r, f)), 9) for r in rs])


def in_burst(cfg: ElasticConfig, r: ElasticResult) -> int:
    """Flaps whose reversal falls inside a burst (a step in demand, not noise)."""
    return sum(
        1
        for a, b in reversals(r.decisions)
        if b.at - a.at < cfg.in_window
        and any(s * cfg.day <= b.at < s * cfg.day + n for s, n, _ in cfg.bursts)
    )


@attrs.frozen
class Sensitivity:
    """Swarm and central over `seeds` for each `scale_in_utilisation` in `utils`."""

    utils: tuple[float, ...]
    seeds: list[int]
    runs: dict[tuple[float, str], list[ElasticResult]]
    cfgs: dict[tuple[float, str], ElasticConfig]
    peak: list[ElasticResult]  # the fleet fixed at the peak, per seed (no decisions)

    def flaps(self, u: float, k: str) -> int:
        return sum(r.flaps for r in self.runs[u, k])

    def flapping_seeds(self, u: float, k: str) -> int:
        return sum(1 for r in self.runs[u, k] if r.flaps)

    def at_burst(self, u: float, k: str) -> int:
        return sum(in_burst(self.cfgs[u, k], r) for r in self.runs[u, k])

    def closest(self, u: float, k: str) -> float:
        return min(closest_reversal(r.decisions) for r in self.runs[u, k])

    def ratios(self, u: float, k: str) -> list[float]:
        rs = self.runs[u, k]
        return [r.node_hours / p.node_hours for r, p in zip(rs, self.peak, strict=True)]


def sensitivity(max_nodes: int, tasks: int, seeds: list[int]) -> Sensitivity:
    runs: dict[tuple[float, str], list[ElasticResult]] = {}
    cfgs: dict[tuple[float, str], ElasticConfig] = {}
    peak = []
    for s in seeds:
        print(f"  elastic-in: seed {s}", file=sys.stderr)
        base = configs(max_nodes, tasks, s)
        peak.append(run_elastic(base[PEAK]))
        for u in IN_UTILS:
            for k in (SWARM, CENTRAL):
                cfgs[u, k] = attrs.evolve(base[k], in_util=u)
                runs.setdefault((u, k), []).append(run_elastic(cfgs[u, k]))
    return Sensitivity(IN_UTILS, seeds, runs, cfgs, peak)


def sensitivity_table(sens: Sensitivity) -> Table:
    rows = []
    for u in sens.utils:
        for k in (SWARM, CENTRAL):
            rs = sens.runs[u, k]
            rel = mean_ci(sens.ratios(u, k))
            mu, p9 = _ci(rs, "mean"), _ci(rs, "p99")
            rows.append(
                (
                    u,
                    k,
                    len(rs),
                    sens.flaps(u, k),
                    sens.flapping_seeds(u, k),
                    sens.at_burst(u, k),
                    sens.closest(u, k),
                    rel[0],
                    rel[1],
                    max(sens.ratios(u, k)),
                    mu[0],
                    mu[1],
                    p9[0],
                    p9[1],
                    _ci(rs, "outs")[0],
                    _ci(rs, "ins")[0],
                )
            )
    return Table.of(
        [
            "scale_in_utilisation",
            "policy",
            "seeds",
            "flaps (all seeds)",
            "seeds with a flap",
            "flaps at a burst",
            "quickest reversal (s)",
            "node-hours / fixed at peak",
            "+-95%",
            "worst seed",
            "mean response (s)",
            "+-95%",
            "p99 (s)",
            "+-95%",
            "scale-outs",
            "scale-ins",
        ],
        rows,
    )


def _pm(x: tuple[float, float], d: int = 1) -> str:
    return f"{x[0]:.{d}f} +- {x[1]:.{d}f}"


def elastic_outcome(out: Path, nodes: int | None, tasks: int | None, seed: int) -> Outcome:
    n = nodes or NODES
    m = tasks or TASKS_PER_NODE * n
    seeds = [seed + k for k in range(SEEDS)]
    runs, cfgs = run_all(n, m, seeds)
    base = cfgs[SWARM]
    peak_rs = runs[PEAK]
    rows = []
    for k in ROWS:
        rs = runs[k]
        fleet = str(cfgs[k].fixed) if cfgs[k].policy == FIXED else f"{base.min_nodes}..{n}"
        nh, mu, p9 = _ci(rs, "node_hours"), _ci(rs, "mean"), _ci(rs, "p99")
        rel = mean_ci([r.node_hours / p.node_hours for r, p in zip(rs, peak_rs, strict=True)])
        sw = k == SWARM
        rows.append(
            (
                k,
                fleet,
                len(rs),
                nh[0],
                nh[1],
                rel[0],
                mu[0],
                mu[1],
                p9[0],
                p9[1],
                _ci(rs, "outs")[0],
                _ci(rs, "ins")[0],
                max(r.max_nodes for r in rs),
                sum(r.flaps for r in rs),
                min(closest_reversal(r.decisions) for r in rs)
                if cfgs[k].policy != FIXED
                else math.nan,
                _ci(rs, "restarted")[0],
                _ci(rs, "lost_seconds")[0] / 3600,
                _ci(rs, "crash_restarted")[0],
                _ci(rs, "handovers")[0] if sw else math.nan,
                _ci(rs, "no_actor")[0] if sw else math.nan,
                _ci(rs, "takeover")[0] if sw else math.nan,
            )
        )
    table = Table.of(
        [
            "policy",
            "nodes",
            "seeds",
            "node-hours",
            "+-95%",
            "/ fixed at peak",
            "mean response (s)",
            "+-95%",
            "p99 (s)",
            "+-95%",
            "scale-outs",
            "scale-ins",
            "max nodes",
            "flaps (all seeds)",
            "quickest reversal (s)",
            "restarted by drain",
            "work lost (task-h)",
            "restarted by crash",
            "actor handovers",
            "s without actor",
            "crash to next decision (s)",
        ],
        rows,
    )
    sens = sensitivity(n, m, [seed + k for k in range(SENS_SEEDS)])
    _figure(out, runs, base, seeds[0])
    return _outcome(n, m, seeds, base, cfgs, table, runs, sens)


def _figure(out: Path, runs: dict[str, list[ElasticResult]], cfg: ElasticConfig, s: int) -> None:
    ts = [i * cfg.period for i in range(int(cfg.day / cfg.period) + 1)]
    need = [cfg.rate(t) * cfg.service / (cfg.slots * cfg.target) for t in ts]
    series = [
        plots.Series("demand: nodes at the target", [t / 3600 for t in ts], need, "-", 1.0, "grey")
    ]
    colours = {PEAK: "tab:red", MEAN: "tab:orange", SWARM: "tab:blue", CENTRAL: "tab:green"}
    for k in ROWS:
        r = runs[k][0]
        xs = [t / 3600 for t, _ in r.series]
        series.append(plots.Series(k, xs, [v for _, v in r.series], "-", 1.5, colours[k]))
    plots.lines(
        out / "elastic.png",
        series,
        title=f"Nodes over a compressed day (seed {s}, booting and draining included)",
        xlabel="simulated hours",
        ylabel="nodes",
    )


def _s(x: float) -> str:
    return "none" if math.isinf(x) else f"{x:.0f} s"


def _outcome(
    n: int,
    m: int,
    seeds: list[int],
    cfg: ElasticConfig,
    cfgs: dict[str, ElasticConfig],
    table: Table,
    runs: dict[str, list[ElasticResult]],
    sens: Sensitivity,
) -> Outcome:
    sc = cfg.scale()
    hpa = sc.target_utilisation  # scale_in_utilisation at the target: HPA's landing
    default_in = ScaleConfig().scale_in_utilisation
    sw, ce, pk, mn = runs[SWARM], runs[CENTRAL], runs[PEAK], runs[MEAN]
    nh_sw = mean_ci([a.node_hours / b.node_hours for a, b in zip(sw, pk, strict=True)])
    nh_ce = mean_ci([a.node_hours / b.node_hours for a, b in zip(ce, pk, strict=True)])
    mean_rel = mean_ci([a.mean / b.mean for a, b in zip(sw, ce, strict=True)])
    p99_rel = mean_ci([a.p99 / b.p99 for a, b in zip(sw, ce, strict=True)])
    elastic = sw + ce
    bounds = all(sc.min_nodes <= r.low_nodes and r.max_nodes <= sc.max_nodes for r in elastic)
    lost = sum(r.tasks - r.completed for rs in runs.values() for r in rs)
    fl_sw, fl_ce = sum(r.flaps for r in sw), sum(r.flaps for r in ce)
    bf_sw, bf_ce = sum(in_burst(cfg, r) for r in sw), sum(in_burst(cfg, r) for r in ce)
    q_sw = min(closest_reversal(r.decisions) for r in sw)
    q_ce = min(closest_reversal(r.decisions) for r in ce)
    double = sum(r.double for r in sw)
    take = [r.takeover for r in sw if not math.isnan(r.takeover)]
    take_s = f"{min(take):.0f} to {max(take):.0f} s" if take else "(none measured)"
    if take and min(take) == max(take):
        take_s = f"{min(take):.0f} s in every seed"
    bursts = ", ".join(f"{b[0] * cfg.day / 3600:.2f} h" for b in cfg.bursts)
    peak_n, mean_n = cfgs[PEAK].fixed, cfgs[MEAN].fixed
    ns = len(sens.seeds)
    u_in = sc.scale_in_utilisation

    def nh(u: float, k: str) -> str:
        return _pm(mean_ci(sens.ratios(u, k)), 3)

    def resp(u: float, k: str, f: str) -> str:
        return f"{_ci(sens.runs[u, k], f)[0]:.0f} s"

    def fl(u: float) -> str:
        return (
            f"swarm {sens.flaps(u, SWARM)} in {sens.flapping_seeds(u, SWARM)} of {ns} seeds"
            f" ({sens.at_burst(u, SWARM)} at a burst), central {sens.flaps(u, CENTRAL)} in"
            f" {sens.flapping_seeds(u, CENTRAL)} ({sens.at_burst(u, CENTRAL)} at a burst)"
        )

    others = [u for u in sens.utils if u not in (u_in, hpa)]
    between = "; ".join(f"at {u:g}, {fl(u)}" for u in others)
    busy = cfg.rate(0.0) * cfg.service  # busy slots at the trough, in the steady state
    rise = sc.target_utilisation * (1 + sc.tolerance) / sc.in_utilisation - 1
    sens_clean = all(sens.flaps(u_in, k) == 0 for k in (SWARM, CENTRAL))
    caveat = (
        "A scale-in just before a burst can still be undone by it within a window; that"
        " none was in these seeds is a measured rate, not a guarantee."
        if sens_clean
        else "A scale-in just before a burst can still be undone by it within a window,"
        " as the flaps above show."
    )
    return Outcome(
        name="elastic",
        title="10. Elasticity: autoscaling without a leader",
        setup=f"""
`sim.elasticengine` (engine) and `sim.elasticsim` (this run). One pool of nodes of
{cfg.slots} slots over a "day" compressed to {cfg.day / 3600:g} h: Poisson arrivals at
rate `r(t) = r0 (1 - {cfg.swing} cos(2 pi t / day))` (trough at the start and the end,
peak at mid-day), {m} tasks a day on average before bursts, plus three bursts of
{cfg.bursts[0][1]:.0f} s at {bursts} that add {cfg.bursts[0][2]:g} r0. Service is
exponential, mean {cfg.service:.0f} s; one task takes one slot. Work goes to the least
busy usable node from a shared FIFO (an idealised pull: the point is the scaling
decision, not placement). A launched node takes work after a {cfg.boot:.0f} s boot; a
node chosen for scale-in takes no new work and is removed once empty, or after a
{cfg.grace:.0f} s grace, when its running tasks restart elsewhere (counted as
*restarted by drain* and *work lost*; no task is dropped). The system starts in the
steady state of the first rate (tasks already running at 0 are not measured).

Policies, each on the same arrivals per seed:

- *fixed at peak*: {peak_n} nodes, enough for the diurnal peak `1.6 r0` at the target
  utilisation {cfg.target:g} (bursts not counted); *fixed at mean*: {mean_n} nodes,
  enough for `r0`. A crashed node is replaced at once (it boots).
- *swarm*: every member steps a `cluster.actor.ActorSeat` every {cfg.step:g} s (ttl
  {cfg.ttl:g} s, grace {cfg.lease_grace:g} s, leases gossiped with a {cfg.delay:g} s delay,
  a joining node hears the current leases); every {cfg.period:g} s the acting node calls
  `policy.autoscale.decide` on a `PoolView` {cfg.delay:g} s old (age {cfg.delay:g} s) and
  `choose_victims` on the nodes' work as of that view. Each node keeps its own
  `ScaleState` and passes its lease epoch to `decide` (`epoch=`), so a new tenure,
  a node winning the seat back included, waits a whole scale-in window before
  removing anything; every action reaches the other members by gossip
  {cfg.delay:g} s later (`ScaleState.learn`; a joining node hears the last one), so a
  new actor keeps the cooldowns of the old. At {cfg.crash_at or 0:.0%} of the day
  the acting node crashes (its tasks restart; membership drops it after
  {cfg.detect:g} s); actors also change when a node that hashes higher joins, or when
  the actor itself is drained and leaves.
- *central*: one controller outside the pool, the same `ScaleConfig`, a fresh view
  (age 0) every {cfg.period:g} s, never handed over. The same crash happens to a
  worker (the rendezvous owner of the key at that time); only swarm loses its decider.

`ScaleConfig`: the agent's defaults but for the pool: min {sc.min_nodes}, max
{sc.max_nodes}, target {sc.target_utilisation:g}, tolerance {sc.tolerance:g}, scale-out
window {sc.scale_out_window:g} s, scale-in window {sc.scale_in_window:g} s, cooldowns
{sc.out_cooldown:g} s (out) and {sc.in_cooldown:g} s (in), max_step {sc.max_step},
scale_in_utilisation {u_in:g}, slots_per_node {cfg.slots}. HPA's recommendation
`ceil(nodes * utilisation / target)` with its tolerance band decides a scale-out; below
the band a scale-in goes to `ceil(nodes * utilisation / scale_in_utilisation)` (never
above the current count), so the pool shrinks only while its utilisation is below
{u_in:g} and only down to where the demand sits at {u_in:g} (the Kubernetes cluster
autoscaler's `scale-down-utilization-threshold`, 0.5; with the value at the target,
{hpa:g}, this is HPA's own scale-in to the target). The view counts a booting
node as `booting` (a node of the pool, no slots yet), draining nodes as `draining`,
and demand as running plus queued tasks, draining nodes' included. Node-hours count
every node from launch to removal (booting and draining included) within the day;
responses run from arrival to completion. A *flap* is a scale-in followed by a
scale-out, or the reverse, less than one scale-in window ({sc.scale_in_window:g} s)
apart; *quickest reversal* is the shortest time between two such actions in any
seed. Means over seeds {seeds[0]} to {seeds[-1]} with 95 % confidence half-widths
(t distribution); ratios are means of per-seed ratios. The second table
(*elastic-in*) runs swarm and central over seeds {sens.seeds[0]} to {sens.seeds[-1]}
for `scale_in_utilisation` {", ".join(f"{u:g}" for u in sens.utils)}, all else
equal; *flaps at a burst* are those whose reversal falls inside a burst.

Command: `swarm sim elastic --out docs/experiments` (`--nodes N` sets max_nodes,
default {NODES}; `--tasks M` the tasks per day, default {TASKS_PER_NODE} N; `--seed S`
starts the {SEEDS} seeds, and the {SENS_SEEDS} of the second table, at S).
""",
        tables=[("elastic", table), ("elastic-in", sensitivity_table(sens))],
        figures=[("elastic.png", "Nodes over the day for each policy against the demand")],
        findings=f"""
Node-hours relative to the fleet fixed at the peak: swarm {_pm(nh_sw, 3)}, central
{_pm(nh_ce, 3)}. Swarm's mean response over central's is {_pm(mean_rel, 3)} and its
p99's {_pm(p99_rel, 3)} (per-seed ratios). The fleet fixed at the mean uses the fewest
node-hours and pays for them in response time around the peak and the bursts (see
the table); the elastic fleets follow the demand with the lag of the boot and the
windows (figure).

Scale actions per day: swarm {_pm(_ci(sw, "outs"))} out and {_pm(_ci(sw, "ins"))} in;
central {_pm(_ci(ce, "outs"))} and {_pm(_ci(ce, "ins"))}. Flaps in all {len(seeds)} seeds:
swarm {fl_sw}, central {fl_ce} ({bf_sw} and {bf_ce} at a burst); the quickest reversal
took {_s(q_sw)} for swarm and {_s(q_ce)} for central, against the
{sc.scale_in_window:g} s that would make it a flap.

Why the scale-in lands at {u_in:g} (*elastic-in*, {ns} seeds). With
`scale_in_utilisation` at the target, {hpa:g}, which is HPA's own scale-in, the same
day flaps: {fl(hpa)}; the quickest reversal took {_s(sens.closest(hpa, SWARM))} (swarm)
and {_s(sens.closest(hpa, CENTRAL))} (central). Central, never handed over, flaps too:
the cause is the decision rule, not the leaderless seat. HPA lands a scale-in at the
target, one tolerance ({sc.tolerance:g}) below the next scale-out, with the highest
recommendation of the last {sc.scale_in_window:g} s as its only guard, and two things
cross that margin here. (1) Noise: the demand is a count of busy slots, about
{busy:.0f} at the trough, whose Poisson noise (about 1 / sqrt({busy:.0f}) =
{100 / math.sqrt(busy):.0f} %) is larger than the tolerance, and as a task runs
{cfg.service:.0f} s on average, a {sc.scale_in_window:g} s window holds about one
independent value of it, so its highest does not bound the next minutes: a dip
shrinks the pool and the next rise, or the morning ramp, grows it again (the flaps
not at a burst). (2) Bursts: a scale-out inside a burst undoing a scale-in of the
window before it, decided before the burst showed in the demand (the flaps at a
burst): a step in demand no causal policy foresees. Landing at {u_in:g} instead
needs the demand to rise by {sc.target_utilisation:g} x {1 + sc.tolerance:g} /
{sc.in_utilisation:g} - 1 = {rise * 100:.0f} % before the next scale-out, which
covers the noise and the first minutes of a burst: in the {ns} seeds at {u_in:g},
{fl(u_in)}, the quickest reversal {_s(sens.closest(u_in, SWARM))} (swarm) and
{_s(sens.closest(u_in, CENTRAL))} (central). In between, {between}. {caveat}
The price is capacity kept while the demand falls: node-hours over the fleet fixed
at the peak {nh(u_in, SWARM)} for swarm at {u_in:g} against {nh(hpa, SWARM)} at
{hpa:g} (central {nh(u_in, CENTRAL)} and {nh(hpa, CENTRAL)}), the worst seed at
{u_in:g} using {max(sens.ratios(u_in, SWARM)):.3f} (swarm) and
{max(sens.ratios(u_in, CENTRAL)):.3f} (central) of that fleet; swarm's mean response
{resp(u_in, SWARM, "mean")} at {u_in:g} against {resp(hpa, SWARM, "mean")} at
{hpa:g}, its p99 {resp(u_in, SWARM, "p99")} against {resp(hpa, SWARM, "p99")}.

Scale-in restarted {_pm(_ci(sw, "restarted"))} tasks a day for swarm and
{_pm(_ci(ce, "restarted"))} for central (drains that outlived the
{cfg.grace:.0f} s grace).

Leaderless decision: the acting node changed {_pm(_ci(sw, "handovers"))} times a day
(the crash, a joining node that hashes higher, a drained actor leaving), with
{_pm(_ci(sw, "no_actor"), 0)} s a day without an actor; after the crash the next
decision by another node came {take_s} later (membership's detection, then the dead
holder's lease, ttl + grace, then a claim that acts from the next step). Steps with
two nodes acting at once: {double}. This lag and the fresh state of a new actor are
the differences from the central controller; its view being {cfg.delay:g} s older is
small against the {cfg.period:g} s decision period.

Not simulated: placement and transfer (an ideal shared queue stands in), heavy-tailed
service, several pools, hook failures, partitions (two actors: see
`bound_double_action`). Only this pool size is measured: in a smaller pool the
demand's noise is relatively larger and one node a larger step, so the headroom that
suffices here may not there, and costs relatively more (`--nodes` and `--tasks` run
one).
""",
        checks={
            "swarm uses fewer node-hours than fixed-at-peak (every seed)": all(
                a.node_hours < b.node_hours for a, b in zip(sw, pk, strict=True)
            ),
            "swarm's mean response within 10 % of central's (mean of per-seed ratios)": abs(
                mean_rel[0] - 1
            )
            <= 0.10,
            "swarm's mean response below the fleet fixed at the mean (every seed)": all(
                a.mean < b.mean for a, b in zip(sw, mn, strict=True)
            ),
            "no flapping by swarm (every seed)": fl_sw == 0,
            "no flapping by central (every seed)": fl_ce == 0,
            "swarm flaps no more often than central (all seeds)": fl_sw <= fl_ce,
            f"scale_in_utilisation {u_in:g}: no flapping by swarm or central in any of the"
            f" {ns} seeds of elastic-in": sens_clean,
            f"the configuration run is the agent's default (scale_in_utilisation {default_in:g})": (
                u_in == default_in
            ),
            "never two nodes acting at once": double == 0,
            "node count within [min_nodes, max_nodes] (elastic runs)": bounds,
            "every task completed (none lost)": lost == 0,
        },
    )
