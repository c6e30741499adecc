"""`make demo`: a local swarm on loopback takes a workload and shows where it went.

Starts agents in a temporary directory (real processes, real sockets, real journals),
submits a mixed workload at one of them through the client library, prints a table of
tasks and load per node over time next to the share-weighted ideal, writes a PNG
plot when matplotlib is available, and shuts everything down.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from .localcluster import LocalAgent

DEMO_ARGS = [
    "--insecure",
    "--no-mdns",
    "--port",
    "0",
    "--profile",
    "local",
    "--log-level",
    "warning",
]


def workload(n: int, rng: random.Random) -> list[tuple[str, list[str]]]:
    """A mixed bag: many short tasks, some medium, a few long, one that fails."""
    tasks: list[tuple[str, list[str]]] = []
    for i in range(n):
        r = rng.random()
        if r < 0.6:
            tasks.append((f"short-{i}", ["sleep", f"{rng.uniform(0.05, 0.3):.2f}"]))
        elif r < 0.9:
            tasks.append((f"medium-{i}", ["sleep", f"{rng.uniform(0.5, 1.5):.2f}"]))
        else:
            tasks.append((f"long-{i}", ["sleep", f"{rng.uniform(2.0, 4.0):.2f}"]))
    tasks.append(("fails", ["sh", "-c", "echo oops >&2; exit 3"]))
    return tasks


def run(nodes: int, tasks: int, seed: int, out: Path | None) -> int:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="swarm-demo-") as d:
        root = Path(d)
        agents = [
            LocalAgent(root, f"node{i + 1}", [*DEMO_ARGS, "--slots", "4"]) for i in range(nodes)
        ]
        print(f"starting {nodes} agent(s) in {root} ...")
        for a in agents:
            a.start()
        try:
            return _drive(agents, workload(tasks, rng), out)
        finally:
            for a in agents:
                a.stop()
            print(
                "all agents stopped cleanly"
                if all(a.proc and a.proc.returncode == 0 for a in agents)
                else "warning: an agent did not stop cleanly"
            )


def _drive(agents: list[LocalAgent], work: list[tuple[str, list[str]]], out: Path | None) -> int:
    entry = agents[0]
    t0 = time.time()
    with entry.client() as c:
        ids = [c.submit(argv, name=name, cwd="/") for name, argv in work]
    print(f"submitted {len(ids)} tasks at {entry.name} in {time.time() - t0:.2f}s")
    samples: list[tuple[float, dict[str, int]]] = []
    with entry.client() as c:
        while True:
            tasks = c.list(all=True, limit=100_000)
            mine = [t for t in tasks if t["spec"]["id"] in set(ids)]
            running = Counter(t["node"] for t in mine if t["state"] == "running")
            samples.append((time.time() - t0, dict(running)))
            if all(t["state"] in ("succeeded", "failed", "cancelled", "lost") for t in mine):
                break
            time.sleep(0.25)
        final = [c.status(tid) for tid in ids]
    elapsed = time.time() - t0
    by_node = Counter(t["node"] for t in final)
    states = Counter(t["state"] for t in final)
    print()
    print(f"{'node':<10} {'tasks':>6} {'share':>7}")
    for a in agents:
        print(
            f"{a.name:<10} {by_node.get(a.name, 0):>6} {by_node.get(a.name, 0) / len(final):>7.1%}"
        )
    print()
    print("states: " + ", ".join(f"{k}={v}" for k, v in sorted(states.items())))
    print(f"all {len(final)} tasks finished in {elapsed:.1f}s")
    failed = [t for t in final if t["state"] != "succeeded"]
    for t in failed:
        print(f"  {t['spec']['id']} {t['spec']['name']}: {t['state']} ({t['reason']})")
    if out is not None:
        _plot(samples, [a.name for a in agents], out)
    expected_failures = {"fails"}
    return 0 if {t["spec"]["name"] for t in failed} == expected_failures else 1


def _plot(samples: list[tuple[float, dict[str, int]]], names: list[str], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = [s[0] for s in samples]
    for n in names:
        ax.plot(xs, [s[1].get(n, 0) for s in samples], label=n)
    ax.set_xlabel("seconds")
    ax.set_ylabel("running tasks")
    ax.legend()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    print(f"plot: {out}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m swarm.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--tasks", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("demo-out/demo.png"))
    args = ap.parse_args(argv)
    return run(args.nodes, args.tasks, args.seed, args.out)


if __name__ == "__main__":
    sys.exit(main())
