"""The simulator against real agents on the same trace (issue 24).

One trace per utilisation: Poisson arrivals, heavy-tailed `sleep` durations (bounded
Pareto, alpha 1.5, max/min 50, mean 0.5 s), each task entering at a uniformly random
node. It runs twice:
- on 5 real agents on loopback (profile `lan`, as deployed; 2 slots each, migration
  off: a `sleep` cannot checkpoint), each task submitted at its arrival time to its
  entry node; response time = its record's end - its submission (the agents' clocks);
- in the simulator configured like them: 5 nodes of 2 slots and 2 cores (a sleeping
  task takes no CPU, so no processor sharing), two choices from the entry node,
  transfer with the `lan` profile's timers, load reports a second old
  (`GossipAge(1.0, 0.05)`, the age model the experiments use), 2 ms per handoff.
The first 10 % of the tasks (by arrival) are a warm-up and not counted. The
simulator draws its entry nodes from its own stream (uniform too), so the two runs
share arrivals and durations, not entry nodes.

Prints a table, writes bench/results/sim_vs_agents.json and, with --md, a markdown
table for docs/experiments.md. Takes about `tasks` / (rate) seconds per point.

    .venv/bin/python bench/sim_vs_agents.py [--tasks 600] [--utils 0.4,0.55,0.7]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.client import Client
from swarm.localcluster import LocalAgent
from swarm.node.config import profile_settings
from swarm.sim.engine import NODE, GossipAge, PowerOfD, SimConfig, simulate
from swarm.sim.report import mean_ci
from swarm.sim.simconfig import quantile
from swarm.sim.workloads import BoundedPareto, Job, NodeSpec, poisson

NODES = 5
SLOTS = 2
MEAN = 0.5  # seconds of sleep per task, on average
SERVICE = BoundedPareto(alpha=1.5, ratio=50.0, mean=MEAN)
BASE = ["--insecure", "--no-mdns", "--bind", "127.0.0.1", "--port", "0", "--profile", "lan"]
ARGS = [*BASE, "--slots", str(SLOTS), "--migration", "off", "--log-level", "warning"]
WARMUP = 0.1
TERMINAL = {"succeeded", "failed", "cancelled", "lost"}


def trace(u: float, seed: int, count: int) -> list[Job]:
    rate = u * NODES * SLOTS / MEAN
    return list(poisson(rate, SERVICE, random.Random(seed), count=count))


def start_cluster(root: Path) -> list[LocalAgent]:
    first = LocalAgent(root, "c1", ARGS).start()
    seed = f"127.0.0.1:{first.port}"
    agents = [first] + [
        LocalAgent(root, f"c{i}", [*ARGS, "--seeds", seed]).start() for i in range(2, NODES + 1)
    ]
    deadline = time.monotonic() + 60
    with first.client() as c:
        while time.monotonic() < deadline:
            nodes = c.call("nodes")["nodes"]
            if sum(1 for n in nodes if n["state"] == "alive" and n["load"]) == NODES:
                return agents
            time.sleep(0.2)
    raise SystemExit("cluster did not converge")


def run_agents(agents: list[LocalAgent], jobs: list[Job], seed: int) -> list[float]:
    """Submit each job at its arrival time at a random entry node; the response times
    of the tasks after the warm-up, from their records."""
    rng = random.Random(seed)
    clients: list[Client] = [a.client(timeout=600) for a in agents]
    ids: list[tuple[int, str, int]] = []  # (job index, task id, agent index)
    late = 0.0
    try:
        t0 = time.monotonic() + 0.5
        for i, job in enumerate(jobs):
            k = rng.randrange(len(agents))
            wait = t0 + job.t - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            else:
                late = max(late, -wait)
            tid = clients[k].submit(["sleep", f"{job.work:.4f}"], cwd="/")
            ids.append((i, tid, k))
        skip = int(len(jobs) * WARMUP)
        out = []
        for i, tid, k in ids:
            r = clients[k].call("wait", id=tid, timeout=600)
            t = r["task"]
            if t["state"] != "succeeded":
                raise SystemExit(f"task {tid}: {t['state']}")
            if i < skip:
                continue
            end = max(h["at"] for h in t["history"] if h["dst"] in TERMINAL)
            out.append(end - t["spec"]["submitted_at"])
    finally:
        for c in clients:
            c.close()
    if late > 0.05:
        print(f"  (submissions fell behind their schedule by up to {late:.3f} s)")
    return out


def sim_config(seed: int, warmup: float) -> SimConfig:
    t = profile_settings("lan").transfer
    return SimConfig(
        nodes=tuple(
            NodeSpec(shares=1024 * SLOTS, cores=float(SLOTS), slots=SLOTS) for _ in range(NODES)
        ),
        placement=PowerOfD(2),
        origin=NODE,
        staleness=GossipAge(period=1.0, delay=0.05),
        net_delay=0.002,
        transfer=t,
        seed=seed,
        warmup=warmup,
    )


def section(result: dict[str, Any]) -> str:
    """docs/experiments.md's section: setup, table and what it shows, from `result`."""
    rows = result["rows"]
    lines = [
        "| utilisation | tasks measured | their mean sleep (s) | agents mean (s) | "
        "simulator mean (s) | sim / agents | agents p99 (s) | simulator p99 (s) | "
        "sim / agents |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['utilisation']:g} | {r['measured']} | {r['sleep_mean']:.3f} | "
            f"{r['agents_mean']:.3f} | "
            f"{r['sim_mean']:.3f} +- {r['sim_mean_ci']:.3f} | {r['mean_ratio']:.2f} | "
            f"{r['agents_p99']:.2f} | {r['sim_p99']:.2f} +- {r['sim_p99_ci']:.2f} | "
            f"{r['p99_ratio']:.2f} |"
        )
    off = [r for r in rows if abs(r["mean_ratio"] - 1.0) > 0.15]
    worst = max(rows, key=lambda r: abs(r["mean_ratio"] - 1.0))
    verdict = (
        f"The simulator's mean response time is within 15 % of the agents' at every "
        f"utilisation (the largest gap: {worst['mean_ratio']:.2f}x at "
        f"{worst['utilisation']:g})."
        if not off
        else "The simulator's mean is off by more than 15 % at "
        + ", ".join(f"{r['utilisation']:g} ({r['mean_ratio']:.2f}x)" for r in off)
        + "; see below."
    )
    waits = [r["agents_mean"] / r["sleep_mean"] - 1.0 for r in rows]
    verdict += (
        f" Waiting (in queues, and the agents' own overhead) adds {min(waits):.0%} to "
        f"{max(waits):.0%} to the tasks' mean sleep on the agents: the part of the "
        "response time that placement and transfer decide, and that the comparison tests."
    )
    return f"""
## The simulator against real agents

Produced by `bench/sim_vs_agents.py --md docs/experiments/sim_vs_agents.md` (real
agents: it is not part of `swarm sim all`; `make experiments` appends its last
section to this page). One trace per utilisation: Poisson arrivals, `sleep` durations
from a {result["service"]}, {result["nodes"]} agents of
{result["slots"]} slots on loopback (profile `lan`, migration off), each task
submitted at its arrival time at a random agent; response time = its record's end -
its submission, the first 10 % not counted. The simulator runs the same arrivals and
durations on {result["nodes"]} nodes of {result["slots"]} slots and cores (a sleeping
task takes no CPU), two choices from the entry node, transfer with the `lan` timers,
reports a second old (`GossipAge(1.0, 0.05)`), 2 ms per handoff;
{result["sim_seeds"]} simulator seeds (its own entry nodes and tie-breaks), mean and
95 % CI. Trace seed {result["seed"]}; one run of the agents per point.

{chr(10).join(lines)}

{verdict} What the simulator leaves out, and which way it leans: a process start and
its exit's detection (a few ms per task, which makes the agents slower), the agents'
own CPU (2 cores shared by 5 agents and the tasks' processes), and real gossip ages
(the age model, not the membership core, stands for them here).
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=600)
    ap.add_argument("--utils", default="0.4,0.55,0.7")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sim-seeds", type=int, default=5, help="simulator runs per point")
    ap.add_argument("--out", default="bench/results/sim_vs_agents.json")
    ap.add_argument(
        "--md",
        default=None,
        help="also write docs/experiments.md's section here (make experiments appends "
        "docs/experiments/sim_vs_agents.md to the page)",
    )
    args = ap.parse_args()
    utils = [float(x) for x in args.utils.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="swarm-cal-") as tmp:
        agents = start_cluster(Path(tmp))
        try:
            for u in utils:
                jobs = trace(u, args.seed, args.tasks)
                warm = jobs[int(len(jobs) * WARMUP)].t
                t_run = time.monotonic()
                real = sorted(run_agents(agents, jobs, args.seed))
                wall = time.monotonic() - t_run
                sims = [simulate(sim_config(s, warm), jobs) for s in range(1, args.sim_seeds + 1)]
                sm, sh = mean_ci([r.mean for r in sims])
                sp, sph = mean_ci([r.p99 for r in sims])
                row = {
                    "utilisation": u,
                    "tasks": len(jobs),
                    "measured": len(real),
                    "sleep_mean": sum(j.work for j in jobs[int(len(jobs) * WARMUP) :])
                    / (len(jobs) - int(len(jobs) * WARMUP)),
                    "agents_mean": sum(real) / len(real),
                    "agents_p99": quantile(real, 0.99),
                    "sim_mean": sm,
                    "sim_mean_ci": sh,
                    "sim_p99": sp,
                    "sim_p99_ci": sph,
                    "seconds": wall,
                }
                row["mean_ratio"] = row["sim_mean"] / row["agents_mean"]
                row["p99_ratio"] = row["sim_p99"] / row["agents_p99"]
                rows.append(row)
                print(
                    f"u={u:.2f}: agents mean {row['agents_mean']:.3f} s p99 "
                    f"{row['agents_p99']:.2f} s | sim mean {sm:.3f} +-{sh:.3f} p99 {sp:.2f} "
                    f"+-{sph:.2f} | sim/agents mean {row['mean_ratio']:.2f} p99 "
                    f"{row['p99_ratio']:.2f} ({wall:.0f} s)",
                    flush=True,
                )
        finally:
            for a in agents:
                a.stop()
    result = {
        "bench": "sim_vs_agents",
        "host": platform.node(),
        "python": platform.python_version(),
        "nodes": NODES,
        "slots": SLOTS,
        "service": SERVICE.label(),
        "seed": args.seed,
        "sim_seeds": args.sim_seeds,
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if args.md:
        Path(args.md).write_text(section(result), encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
