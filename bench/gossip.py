"""Membership (SWIM + Lifeguard) on the simulated network, next to memberlist's formulas.

Run:  .venv/bin/python bench/gossip.py [--sizes 100,1000,5000] [--quick] [--seed N]

For each cluster size n, with the LAN defaults (memberlist's DefaultLANConfig):

* join: seconds (and gossip rounds) until 99.9% of the members know a new node;
* kill: how long until members mark a killed node dead (each member's time: median,
  p99; and the time until *all* of them have), over several victims;
* false positives: false "dead" declarations and false suspicions of live nodes
  during a run with 5% and with 20% datagram loss (nobody is actually failing);
* bytes/s per node (mean, max) in steady state: membership alone (comparable to
  memberlist), and with every node publishing its load report (our extension);
* memberlist's formulas for the same n: suspicion timeout min/max, expected
  detection time (wait for the first probe + the failing probe's interval +
  suspicion timeout: see memberlist_formulas), and the bytes/s bound of its
  defaults (gossip_nodes * max_packet / gossip_interval + full ping and ack per
  probe interval).

All times are simulated seconds. The table goes to stdout, the figures to
bench/results/gossip.json. (A real-process part is to be added by the agent's
owner; this file only covers the simulated network.)
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from swarm import model as m
from swarm.cluster import gossip as g
from swarm.cluster.lifeguard import suspicion_timeout
from swarm.cluster.membership import Event, EventKind, MemberEvent, MembershipConfig
from swarm.sim.gossipnet import GossipNet, SimNode

RESULTS = Path(__file__).resolve().parent / "results" / "gossip.json"


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    k = min(len(s) - 1, max(0, math.ceil(p / 100.0 * len(s)) - 1))
    return s[k]


def memberlist_formulas(cfg: MembershipConfig, n: int) -> dict[str, float]:
    """memberlist's figures for n members and these settings.

    Detection, memberlist's way (and ours, which is the same algorithm): a killed node
    is first probed when the first of the n-1 others reaches it in its shuffled
    round-robin, one probe per interval T; for each member that moment is uniform over
    its round of (n-1)T, so the first probe comes after F = min of n-1 such draws
    (median (n-1)T(1 - 2^(-1/(n-1))) ~ T ln 2, mean (n-1)T/n ~ T). That probe fails at
    the end of its interval (direct, then indirect probes: memberlist's probeNode
    waits until start + T), the prober suspects, and with the k = mult - 2 independent
    confirmations that further failed probes bring within it, Lifeguard's suspicion
    timeout is its minimum, SuspicionMult * log10(n) * T. Detection = F + T + min.
    The older figure `interval_plus_suspicion_s` (T + min) leaves out F, which
    memberlist waits too."""
    lo = suspicion_timeout(cfg.suspicion_mult, n, cfg.probe_interval)
    gossip_bps = cfg.gossip_nodes * cfg.max_packet_size / cfg.gossip_interval
    probe_bps = 2 * cfg.max_packet_size / cfg.probe_interval  # ping + ack, both full
    t, others = cfg.probe_interval, max(1, n - 1)
    first_probe_median = others * t * (1.0 - 2.0 ** (-1.0 / others))
    first_probe_p99 = others * t * (1.0 - 0.01 ** (1.0 / others))
    first_probe_mean = others * t / (others + 1)
    return {
        "suspicion_min_s": lo,
        "suspicion_max_s": cfg.suspicion_max_timeout_mult * lo,
        "first_probe_median_s": first_probe_median,
        "expected_detection_median_s": first_probe_median + t + lo,
        "expected_detection_mean_s": first_probe_mean + t + lo,
        "expected_detection_p99_s": first_probe_p99 + t + lo,
        "interval_plus_suspicion_s": t + lo,
        "gossip_bytes_per_s": gossip_bps,
        "bytes_per_s_bound": gossip_bps + probe_bps,
        "retransmit_limit": g.retransmit_limit(cfg.retransmit_mult, n),
        "push_pull_interval_s": g.push_pull_scale(cfg.push_pull_interval, n),
    }


def load_report(node: SimNode, version: int) -> m.LoadReport:
    i = node.index
    return m.LoadReport(
        node=node.id,
        version=version,
        weight_sum=float(i % 5),
        queued=i % 7,
        running=i % 3,
        slots=8,
        cpu_util=0.37,
        load_per_core=0.8,
        cpus=8.0,
        mem_available=8 << 30,
        mem_total=16 << 30,
        psi_cpu=1.5,
    )


def bytes_per_s(nodes: list[SimNode], seconds: float) -> dict[str, float]:
    outs = [nd.counters.out_bytes / seconds for nd in nodes if nd.alive]
    udp = [nd.counters.udp_out_bytes / seconds for nd in nodes if nd.alive]
    return {
        "mean": statistics.fmean(outs),
        "max": max(outs),
        "udp_mean": statistics.fmean(udp),
        "udp_max": max(udp),
    }


# ------------------------------------------------------------------ scenarios


def scenario_membership(
    n: int, cfg: MembershipConfig, seed: int, plan: dict[str, Any]
) -> dict[str, Any]:
    """Steady state (bytes/s), then a join, then kills; membership traffic only."""
    net = GossipNet(seed=seed, config=cfg)
    nodes = net.bootstrap(n)
    joined_at: dict[str, float] = {}
    dead_at: dict[str, dict[str, float]] = {}
    false_dead: list[tuple[str, str]] = []
    killed: set[str] = set()
    newcomer = ""

    def observe(node: SimNode, ev: Event, now: float) -> None:
        if not isinstance(ev, MemberEvent):
            return
        s = ev.member.node
        if ev.kind is EventKind.JOINED and s == newcomer:
            joined_at.setdefault(node.id, now)
        elif ev.kind is EventKind.DEAD:
            if s in killed:
                dead_at.setdefault(s, {}).setdefault(node.id, now)
            else:
                false_dead.append((node.id, s))

    net.observers.append(observe)
    net.run_for(plan["warmup"])
    net.reset_counters()
    t0 = net.now
    net.run_for(plan["steady"])
    steady_bps = bytes_per_s(nodes, net.now - t0)

    # join: a new node contacts one random member
    newcomer_node = net.add_node()
    newcomer = newcomer_node.id
    t_join = net.now
    net.join(newcomer, [nodes[net.rng.randrange(n)].id])
    need = math.ceil(0.999 * n)
    net.run_until_true(lambda: len(joined_at) >= need, timeout=60.0, check_every=0.05)
    join_999 = sorted(joined_at.values())[need - 1] - t_join if len(joined_at) >= need else math.nan
    net.run_until_true(lambda: len(joined_at) >= n, timeout=30.0, check_every=0.1)
    join_all = max(joined_at.values()) - t_join if len(joined_at) >= n else math.nan

    # kills, one after the other, each at a random moment
    per_member: list[float] = []
    all_members: list[float] = []
    # memberlist's expected detection for each kill, at the member count of that moment
    # (each kill shrinks the cluster, and the suspicion timeout follows log10(n))
    model_at_kill: list[float] = []
    model_p99_at_kill: list[float] = []
    model_mean_at_kill: list[float] = []
    bound = 3 * cfg.probe_interval + memberlist_formulas(cfg, n)["suspicion_max_s"] + 10.0
    for _ in range(plan["kills"]):
        net.run_for(net.rng.uniform(0.0, cfg.probe_interval * 3))
        victim = nodes[net.rng.randrange(n)]
        while victim.id in killed:
            victim = nodes[net.rng.randrange(n)]
        killed.add(victim.id)
        t_kill = net.now
        net.kill(victim.id)
        watchers = {nd.id for nd in net.live_nodes()}
        members = len(watchers) + 1  # the victim counts until it is declared dead
        model = memberlist_formulas(cfg, members)
        model_at_kill.append(model["expected_detection_median_s"])
        model_mean_at_kill.append(model["expected_detection_mean_s"])
        model_p99_at_kill.append(model["expected_detection_p99_s"])

        def all_dead(v: str = victim.id, w: set[str] = watchers) -> bool:
            return len(dead_at.get(v, {}).keys() & w) >= len(w)

        net.run_until_true(all_dead, timeout=bound, check_every=0.1)
        times = [t - t_kill for o, t in dead_at.get(victim.id, {}).items() if o in watchers]
        per_member += times
        all_members.append(max(times) if len(times) >= len(watchers) else math.inf)
    return {
        "steady_bytes_per_s": steady_bps,
        "join": {
            "seconds_99_9": join_999,
            "rounds_99_9": join_999 / cfg.gossip_interval,
            "seconds_all": join_all,
        },
        "kill": {
            "victims": plan["kills"],
            "probe_order": cfg.probe_order,
            "memberlist_median_at_kills_s": statistics.median(model_at_kill),
            "memberlist_mean_at_kills_s": statistics.fmean(model_mean_at_kill),
            # the p99 of F + T + min at the mean kill's n (min moves < 0.2 s between
            # kills; F's tail, 4.6 T, is what matters)
            "memberlist_p99_at_kills_s": statistics.fmean(model_p99_at_kill),
            "members_first_last_kill": [n + 1, n + 2 - plan["kills"]],
            "per_member_median_s": statistics.median(per_member) if per_member else math.nan,
            "per_member_mean_s": statistics.fmean(per_member) if per_member else math.nan,
            "per_member_p99_s": pct(per_member, 99),
            "all_members_median_s": statistics.median(all_members),
            "all_members_max_s": max(all_members),
        },
        "false_dead_during_kills": len(false_dead),
        "events": net.events_processed,
    }


def scenario_loss(
    n: int, cfg: MembershipConfig, seed: int, loss: float, seconds: float
) -> dict[str, Any]:
    net = GossipNet(seed=seed, config=cfg, loss=loss)
    nodes = net.bootstrap(n)
    counts = {"false_dead": 0, "false_suspect": 0}
    dead_subjects: set[str] = set()
    suspicions: set[tuple[str, int]] = set()  # one suspicion = (node, incarnation)

    def observe(node: SimNode, ev: Event, now: float) -> None:
        if isinstance(ev, MemberEvent):
            if ev.kind is EventKind.DEAD:
                counts["false_dead"] += 1
                dead_subjects.add(ev.member.node)
            elif ev.kind is EventKind.SUSPECT:
                counts["false_suspect"] += 1
                suspicions.add((ev.member.node, ev.member.incarnation))

    net.observers.append(observe)
    net.run_for(seconds)
    return {
        "loss": loss,
        "seconds": seconds,
        "false_dead_events": counts["false_dead"],
        "false_dead_nodes": len(dead_subjects),
        "false_suspect_events": counts["false_suspect"],  # summed over all observers
        "false_suspicions": len(suspicions),
        "false_suspicions_per_node_per_min": len(suspicions) / n / (seconds / 60.0),
        "refutations": sum(nd.membership.stats["refute"] for nd in nodes),
        "max_local_health": max(nd.membership.local_health for nd in nodes),
        "bytes_per_s": bytes_per_s(nodes, seconds),
    }


def scenario_load(
    n: int, cfg: MembershipConfig, seed: int, warmup: float, seconds: float
) -> dict[str, Any]:
    """Every node publishes a load report (re-published every load_refresh_interval)."""
    net = GossipNet(seed=seed, config=cfg)
    nodes = net.bootstrap(n)
    for nd in nodes:
        nd.membership.set_local_load(load_report(nd, 1_700_000_000_000), net.now)
        net._reschedule(nd)
    net.run_for(warmup)
    net.reset_counters()
    t0 = net.now
    net.run_for(seconds)
    ages: list[float] = []
    coverage: list[float] = []
    sample = nodes[:: max(1, n // 50)]
    for nd in sample:
        view = nd.membership.load_view()
        coverage.append(len(view) / n)
        ages += [e.age(net.now) for k, e in view.items() if k != nd.id]
    return {
        "bytes_per_s": bytes_per_s(nodes, net.now - t0),
        "load_view_coverage_mean": statistics.fmean(coverage),
        "load_age_median_s": statistics.median(ages) if ages else math.nan,
        "load_age_p90_s": pct(ages, 90),
        "after_s": warmup + seconds,
    }


# --------------------------------------------------------------------- driver


def plan_for(n: int, quick: bool) -> dict[str, Any]:
    """Simulated seconds per scenario. Heavy loss saturates the gossip channel (every
    node sends full packets), which is what costs wall time at large n."""
    plan: dict[str, Any]
    if quick:
        plan = {"warmup": 5.0, "steady": 5.0, "kills": 2, "loss_s": (30.0, 20.0)}
        plan["load"] = (10.0, 5.0)
    elif n <= 1000:
        # 100 victims: the wait for the first probe is ~exponential with mean T, so a
        # median over k victims has a standard error of ~T/sqrt(k); over 5 (as before)
        # it moved by +-0.5 s from run to run
        plan = {"warmup": 10.0, "steady": 10.0, "kills": min(100, n // 3), "loss_s": (60.0, 40.0)}
        plan["load"] = (20.0, 10.0)
    else:
        plan = {"warmup": 2.0, "steady": 5.0, "kills": 10, "loss_s": (30.0, 15.0)}
        plan["load"] = (5.0, 5.0)
    return plan


def run_size(n: int, seed: int, quick: bool, with_load: bool) -> dict[str, Any]:
    cfg = MembershipConfig.lan(load_events=False)
    plan = plan_for(n, quick)
    started = time.monotonic()
    res: dict[str, Any] = {"n": n, "plan": plan, "memberlist": memberlist_formulas(cfg, n)}
    res["config_probe_interval"] = cfg.probe_interval
    res["membership"] = scenario_membership(n, cfg, seed, plan)
    if n <= 1000 or quick:
        # the same kills with memberlist's own probe order: the A/B of the rotating order
        ml = attrs.evolve(cfg, probe_order="shuffled")
        res["membership_shuffled"] = scenario_membership(n, ml, seed, plan)["kill"]
    res["loss"] = [
        scenario_loss(n, cfg, seed + i + 1, p, secs)
        for i, (p, secs) in enumerate(zip((0.05, 0.20), plan["loss_s"], strict=True))
    ]
    if with_load:
        res["load"] = scenario_load(n, cfg, seed + 7, *plan["load"])
    res["wall_s"] = time.monotonic() - started
    res["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return res


def fmt(x: float, nd: int = 1) -> str:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return "-"
    return f"{x:.{nd}f}"


def at(r: dict[str, Any], path: str) -> Any:
    """r["a"]["b"][1] for "a.b.1"; nan where a part is missing (e.g. --no-load)."""
    x: Any = r
    for part in path.split("."):
        if isinstance(x, list):
            x = x[int(part)]
        elif isinstance(x, dict) and part in x:
            x = x[part]
        else:
            return math.nan
    return x


def both(a: str, b: str, nd: int = 1) -> Any:
    return lambda r: f"{fmt(at(r, a), nd)} / {fmt(at(r, b), nd)}"


def print_table(results: list[dict[str, Any]]) -> None:
    spec: list[tuple[str, Any]] = [
        ("join: s to 99.9% of members", lambda r: fmt(at(r, "membership.join.seconds_99_9"), 2)),
        ("join: gossip rounds to 99.9%", lambda r: fmt(at(r, "membership.join.rounds_99_9"))),
        (
            "kill: member median / p99 s",
            both("membership.kill.per_member_median_s", "membership.kill.per_member_p99_s"),
        ),
        (
            "kill: all members med / max s",
            both("membership.kill.all_members_median_s", "membership.kill.all_members_max_s"),
        ),
        (
            "kill: member mean s",
            lambda r: fmt(at(r, "membership.kill.per_member_mean_s"), 2),
        ),
        (
            "memberlist's order: median / p99 s",
            both("membership_shuffled.per_member_median_s", "membership_shuffled.per_member_p99_s"),
        ),
        (
            "memberlist's order: mean s",
            lambda r: fmt(at(r, "membership_shuffled.per_member_mean_s"), 2),
        ),
        (
            "memberlist: detection median / mean s",
            both("memberlist.expected_detection_median_s", "memberlist.expected_detection_mean_s"),
        ),
        (
            "memberlist: median at the kills' n s",
            lambda r: fmt(at(r, "membership.kill.memberlist_median_at_kills_s"), 2),
        ),
        (
            "memberlist: mean / p99 at the kills' n s",
            both(
                "membership.kill.memberlist_mean_at_kills_s",
                "membership.kill.memberlist_p99_at_kills_s",
                2,
            ),
        ),
        (
            "memberlist: T + suspicion min s",
            lambda r: fmt(at(r, "memberlist.interval_plus_suspicion_s")),
        ),
        (
            "memberlist: suspicion min / max s",
            both("memberlist.suspicion_min_s", "memberlist.suspicion_max_s"),
        ),
    ]
    for i, p in enumerate(("5%", "20%")):
        spec += [
            (
                f"loss {p}: false dead events (nodes)",
                lambda r, i=i: "{} ({})".format(
                    at(r, f"loss.{i}.false_dead_events"), at(r, f"loss.{i}.false_dead_nodes")
                ),
            ),
            (
                f"loss {p}: false suspicions",
                lambda r, i=i: str(at(r, f"loss.{i}.false_suspicions")),
            ),
            (
                f"loss {p}: .. per node per minute",
                lambda r, i=i: fmt(at(r, f"loss.{i}.false_suspicions_per_node_per_min"), 3),
            ),
        ]
    spec += [
        (
            "B/s/node membership mean / max",
            both("membership.steady_bytes_per_s.mean", "membership.steady_bytes_per_s.max", 0),
        ),
        (
            "B/s/node at 20% loss mean / max",
            both("loss.1.bytes_per_s.mean", "loss.1.bytes_per_s.max", 0),
        ),
        ("B/s/node with load mean / max", both("load.bytes_per_s.mean", "load.bytes_per_s.max", 0)),
        ("load: view coverage %", lambda r: fmt(100 * at(r, "load.load_view_coverage_mean"), 0)),
        ("load: median / p90 age s", both("load.load_age_median_s", "load.load_age_p90_s")),
        (
            "memberlist: B/s bound gossip+probe",
            lambda r: fmt(at(r, "memberlist.bytes_per_s_bound"), 0),
        ),
        ("wall s / max RSS MB", both("wall_s", "max_rss_mb", 0)),
    ]
    head = ("n", *(str(r["n"]) for r in results))
    rows = [(label, *(f(r) for r in results)) for label, f in spec]
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    print(line(head))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


def detection_verdict(r: dict[str, Any]) -> tuple[str, float, float, float]:
    """(verdict, measured median, memberlist's median, standard error of the measured
    median). The error comes from the wait for the first probe, ~exponential with
    mean T for memberlist's order: its sample median over k victims has a standard
    error of ~T / sqrt(k) (the rotating order's wait is at most ~2 T, so less)."""
    measured = float(at(r, "membership.kill.per_member_median_s"))
    model = float(at(r, "membership.kill.memberlist_median_at_kills_s"))
    victims = int(at(r, "membership.kill.victims"))
    se = float(r["config_probe_interval"]) / math.sqrt(max(1, victims))
    if measured <= model:
        verdict = "met"
    elif measured <= model + 2 * se:
        verdict = f"within sampling error (+{measured - model:.2f} s, 2 SE = {2 * se:.2f} s)"
    else:
        verdict = "NOT met"
    return verdict, measured, model, se


def tail_verdicts(r: dict[str, Any]) -> str:
    """Mean and p99 against memberlist's expected figures at the kills' n."""
    parts = []
    for what in ("mean", "p99"):
        measured = float(at(r, f"membership.kill.per_member_{what}_s"))
        model = float(at(r, f"membership.kill.memberlist_{what}_at_kills_s"))
        if math.isnan(measured) or math.isnan(model):
            continue
        ok = "met" if measured <= model else "NOT met"
        parts.append(f"{what} {measured:.2f} s vs {model:.2f} s: {ok}")
    ab = at(r, "membership_shuffled.per_member_median_s")
    if not math.isnan(ab):
        parts.append(
            "memberlist's order in the same simulation: median {} / mean {} / p99 {} s".format(
                fmt(ab, 2),
                fmt(at(r, "membership_shuffled.per_member_mean_s"), 2),
                fmt(at(r, "membership_shuffled.per_member_p99_s"), 2),
            )
        )
    return "; ".join(parts)


def print_targets(results: list[dict[str, Any]]) -> None:
    print()
    for r in results:
        verdict, measured, model, se = detection_verdict(r)
        bps = float(at(r, "membership.steady_bytes_per_s.mean"))
        bound = float(at(r, "memberlist.bytes_per_s_bound"))
        fp5 = at(r, "loss.0.false_dead_events")
        print(
            f"n={r['n']}: detection median {measured:.2f} s vs memberlist {model:.2f} s "
            f"(SE {se:.2f} s): {verdict}; bytes/s {bps:.0f} vs {bound:.0f}: "
            f"{'met' if bps <= bound else 'NOT met'}; false dead at 5% loss {fp5}: "
            f"{'met' if fp5 == 0 else 'NOT met'}"
        )
        print(f"  {tail_verdicts(r)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--sizes", default=None, help="comma-separated cluster sizes (default 100,1000,5000)"
    )
    ap.add_argument("--quick", action="store_true", help="smaller sizes and shorter runs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-load", action="store_true", help="skip the load-dissemination run")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.sizes:
        sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    else:
        sizes = [50, 200] if args.quick else [100, 1000, 5000]
    results = []
    for n in sizes:
        print(f"n={n} ...", file=sys.stderr, flush=True)
        results.append(run_size(n, args.seed, args.quick, with_load=not args.no_load))
    print_table(results)
    print_targets(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cfg = MembershipConfig.lan()
    doc = {
        "bench": "gossip (simulated network)",
        "config": attrs.asdict(cfg),
        "seed": args.seed,
        "quick": args.quick,
        "results": results,
    }
    args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"\nwrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
