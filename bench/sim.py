"""Simulator speed: events per second, and `load` at 10,000 nodes with 1,000,000 tasks.

Prints a table and writes bench/results/sim.json. Each case runs in a fresh child
process so that its peak memory (max RSS) is its own. Cases:

- `d2-1k`: the `load` experiment's "d=2 (stale gossip)" curve at 1,000 nodes,
  utilisation 0.9, 100,000 tasks: events/s and tasks/s of the core engine
  (arrivals, place() + admit() per task, processor sharing, gossip publishing).
- `transfer-1k`: the same with adaptive transfer on (TransferPolicy.step on every
  node every S/2, probes and steals as messages), 50,000 tasks.
- `load-10k`: the "d=2 (stale gossip)" curve of `load` at 10,000 nodes with
  1,000,000 tasks (target: under 2 minutes on one core).
- `transfer-10k`: "d=2 + transfer" at 10,000 nodes, 100,000 tasks: the per-task cost
  of transfer at that size (a million would take proportionally longer).

Usage: python bench/sim.py [--quick] [--cases a,b,...]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HERE = Path(__file__).resolve().parent

CASES: dict[str, tuple[str, int, int]] = {
    # name: (load curve, nodes, tasks)
    "d2-1k": ("d2", 1_000, 100_000),
    "transfer-1k": ("d2+transfer", 1_000, 50_000),
    "load-10k": ("d2", 10_000, 1_000_000),
    "transfer-10k": ("d2+transfer", 10_000, 100_000),
}
QUICK: dict[str, tuple[str, int, int]] = {
    "d2-1k": ("d2", 1_000, 20_000),
    "transfer-1k": ("d2+transfer", 1_000, 5_000),
    "load-10k": ("d2", 10_000, 50_000),
    "transfer-10k": ("d2+transfer", 10_000, 10_000),
}


def child(curve: str, nodes: int, tasks: int) -> dict[str, object]:
    from swarm.sim.experiments import PARETO, _run, load_config

    cfg = load_config(curve, nodes, seed=1)
    t0 = time.perf_counter()
    c0 = time.process_time()
    r = _run(cfg, 0.9 * nodes, PARETO, tasks, seed=1)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    return {
        "curve": curve,
        "nodes": nodes,
        "tasks": tasks,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "events": r.events,
        "events_per_s": round(r.events / cpu),
        "tasks_per_s": round(tasks / cpu),
        "us_per_task": round(cpu / tasks * 1e6, 1),
        "mean_response": round(r.mean, 4),
        "p99_response": round(r.p99, 4),
        "transfers": r.transfers,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--cases", help="comma-separated subset of " + ",".join(CASES))
    ap.add_argument("--child", nargs=3, metavar=("CURVE", "NODES", "TASKS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        curve, nodes, tasks = args.child
        print(json.dumps(child(curve, int(nodes), int(tasks))))
        return 0
    table = QUICK if args.quick else CASES
    names = args.cases.split(",") if args.cases else list(table)
    results: dict[str, object] = {}
    print(
        f"{'case':14} {'nodes':>6} {'tasks':>9} {'wall s':>8} {'events/s':>9} "
        f"{'us/task':>8} {'peak MiB':>9}"
    )
    for name in names:
        curve, nodes, tasks = table[name]
        out = subprocess.run(
            [sys.executable, __file__, "--child", curve, str(nodes), str(tasks)],
            check=True,
            capture_output=True,
            text=True,
        )
        res = json.loads(out.stdout.strip().splitlines()[-1])
        results[name] = res
        print(
            f"{name:14} {nodes:6d} {tasks:9d} {res['wall_s']:8.1f} {res['events_per_s']:9d} "
            f"{res['us_per_task']:8.1f} {res['peak_rss_mib']:9.1f}",
            flush=True,
        )
    load_avg = (
        Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    )
    doc = {
        "bench": "sim",
        "quick": args.quick,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "load_average_after": load_avg,
        "cases": results,
        "target": "load-10k wall time under 120 s on one core",
    }
    dest = HERE / "results" / "sim.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
