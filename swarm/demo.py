"""`make demo`: a local swarm on loopback takes a workload and shows where it went.

Starts five agents in a temporary directory (real processes, real sockets, real
journals; shares 2048, 1024, 1024, 512 and 512), submits a workload at ONE of them,
and shows how the work spread over the cluster next to the share-weighted ideal: a
table of tasks per node, a timeline of queued+running tasks per node, and a PNG plot.
Then it shuts everything down.

The workload is what people feed a fleet (issue 23): one array of a few hundred
elements of mixed length (`--array 0-N`; the element's index picks its length), a
task that fails on purpose, and tasks that depend on them (`--after`): a report that
waits for the whole array to succeed, a cleanup that runs whatever the failing task
did (`any:`), a retry that runs because it failed (`notok:`), and one that needs it to
succeed and so fails with "dependency never satisfied" (`ok:`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from .client import Client
from .localcluster import LocalAgent
from .node.arrays import element_id

FINAL = ("succeeded", "failed", "cancelled", "lost")

DEMO_ARGS = [
    "--insecure",
    "--no-mdns",
    "--bind",
    "127.0.0.1",
    "--port",
    "0",
    "--profile",
    "local",
    "--log-level",
    "warning",
]
SHARES = [2048, 1024, 1024, 512, 512]


# An element's length from its index (and the demo's seed): six in ten short
# (0.2-0.8 s), three medium (1.0-2.5 s), one long (3-6 s).
ELEMENT = (
    "x=$(( ({index} * 7919 + {seed}) % 100 )); "
    "if [ $x -lt 60 ]; then sleep 0.$(( x % 7 + 2 )); "
    "elif [ $x -lt 90 ]; then sleep 1.$(( x % 9 + 1 )); "
    "else sleep $(( x % 4 + 3 )); fi"
)
# name: (argv, --after clauses given the failing task's id F and the array's A);
# the names that must end failed for the demo to pass are EXPECTED_FAILED
DEPENDENTS: dict[str, tuple[list[str], str]] = {
    "report": (["sh", "-c", "echo all elements done"], "ok:{A}"),
    "cleanup": (["sh", "-c", "echo cleaning up"], "any:{F}"),
    "retry-after-failure": (["sh", "-c", "echo retrying"], "notok:{F}"),
    "needs-success": (["sh", "-c", "echo never runs"], "ok:{F}"),
}
EXPECTED_FAILED = {"fails-on-purpose", "needs-success"}


def workload(n: int, seed: int) -> tuple[str, list[str]]:
    """The array's `--array` text and its command (with `{index}`)."""
    return f"0-{n - 1}", ["sh", "-c", ELEMENT.replace("{seed}", str(seed % 100))]


def run(nodes: int, tasks: int, seed: int, out: Path | None, slots: int) -> int:
    shares = (SHARES * ((nodes // len(SHARES)) + 1))[:nodes]
    with tempfile.TemporaryDirectory(prefix="swarm-demo-") as d:
        root = Path(d)
        print(f"starting {nodes} agents on loopback in {root}")
        first = LocalAgent(
            root, "node1", [*DEMO_ARGS, "--slots", str(slots), "--shares", str(shares[0])]
        )
        first.start()
        seed_addr = f"127.0.0.1:{first.port}"
        agents = [first]
        for i in range(1, nodes):
            a = LocalAgent(
                root,
                f"node{i + 1}",
                [
                    *DEMO_ARGS,
                    "--slots",
                    str(slots),
                    "--shares",
                    str(shares[i]),
                    "--seeds",
                    seed_addr,
                ],
            )
            agents.append(a.start())
        try:
            _wait_converged(first, nodes)
            return _drive(agents, shares, workload(tasks, seed), out)
        finally:
            for a in agents:
                a.stop()
            clean = all(a.proc is not None and a.proc.returncode == 0 for a in agents)
            print(
                "all agents stopped cleanly" if clean else "warning: an agent did not stop cleanly"
            )


def _wait_converged(a: LocalAgent, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    with a.client() as c:
        while time.monotonic() < deadline:
            nodes = c.call("nodes")["nodes"]
            if sum(1 for x in nodes if x["state"] == "alive" and x["load"]) >= n:
                print(f"{n} agents see each other (gossip), e.g. from node1:")
                print(_nodes_table(nodes))
                return
            time.sleep(0.2)
    raise SystemExit("the agents did not converge in time")


def _nodes_table(nodes: list[dict[str, Any]]) -> str:
    lines = [f"  {'node':<8} {'state':<7} {'shares':>6} {'report age':>10}"]
    for x in nodes:
        lines.append(
            f"  {x['node']:<8} {x['state']:<7} {x['load']['shares']:>6} {x['load_age']:>9.2f}s"
        )
    return "\n".join(lines)


def _drive(
    agents: list[LocalAgent], shares: list[int], work: tuple[str, list[str]], out: Path | None
) -> int:
    entry = agents[0]
    names = [a.name for a in agents]
    t0 = time.time()
    spec, argv = work
    with entry.client() as c:
        aid = c.submit(argv, name="elements", cwd="/", array=spec)
        fail = c.submit(["sh", "-c", "echo oops >&2; exit 3"], name="fails-on-purpose", cwd="/")
        deps = {
            name: c.submit(a, name=name, cwd="/", after=[after.format(A=aid, F=fail)])
            for name, (a, after) in DEPENDENTS.items()
        }
    count = int(spec.split("-")[1]) + 1
    ids = [element_id(aid, i) for i in range(count)]
    others = {"fails-on-purpose": fail, **deps}
    print(
        f"\nsubmitted at {entry.name} in {time.time() - t0:.2f}s: array {aid} of {count} "
        f"elements, {fail} (fails on purpose) and {len(deps)} tasks that depend on them "
        "(--after); watching..."
    )
    timeline: list[tuple[float, dict[str, int]]] = []
    clients = {a.name: Client(a.socket, timeout=30) for a in agents}
    last_print = 0.0
    with entry.client() as c:
        while True:
            now = time.time() - t0
            per_node: dict[str, int] = {}
            for name, cl in clients.items():
                info = cl.call("info")
                per_node[name] = int(info["running"]) + int(info["queued"])
            timeline.append((now, per_node))
            if now - last_print >= 2.0:
                last_print = now
                bar = "  ".join(f"{n}:{per_node[n]:>3}" for n in names)
                print(f"  t={now:5.1f}s  queued+running  {bar}")
            ends = [c.status(t)["state"] for t in [aid, *others.values()]]
            if all(st in FINAL for st in ends):
                break
            time.sleep(0.5)
        final = [c.status(tid) for tid in ids]
        array = c.status(aid)
        after = {name: c.status(tid) for name, tid in others.items()}
        info = c.call("info")
    for cl in clients.values():
        cl.close()
    elapsed = time.time() - t0
    by_node = Counter(t["node"] for t in final)
    work_by_node: defaultdict[str, float] = defaultdict(float)
    for t in final:
        if t.get("started_at") and t.get("finished_at"):
            work_by_node[t["node"]] += float(t["finished_at"]) - float(t["started_at"])
    total_shares = sum(shares)
    total_work = sum(work_by_node.values())
    print()
    print(f"{'node':<8} {'shares':>6} {'tasks':>6} {'ideal':>6} {'work (s)':>9} {'ideal (s)':>9}")
    for name, sh in zip(names, shares, strict=True):
        ideal = len(final) * sh / total_shares
        print(
            f"{name:<8} {sh:>6} {by_node.get(name, 0):>6} {ideal:>6.1f} "
            f"{work_by_node.get(name, 0.0):>9.1f} {total_work * sh / total_shares:>9.1f}"
        )
    states = Counter(t["state"] for t in final)
    print(f"\narray {aid}: {array['state']} ({array.get('reason') or ''})")
    print("  elements: " + ", ".join(f"{k}={v}" for k, v in sorted(states.items())))
    print("dependent tasks (--after), in the order they started:")
    for name, t in sorted(after.items(), key=lambda kv: kv[1].get("started_at") or 1e18):
        clause = t["spec"].get("after") or ["-"]
        began = f"started t={float(t['started_at']) - t0:5.1f}s" if t.get("started_at") else ""
        print(
            f"  {name:<20} {' '.join(clause):<28} {t['state']:<9} {began} {t.get('reason') or ''}"
        )
    coord = info.get("coordinator", {})
    print(
        f"placed by {entry.name}: {coord.get('placed_local', 0)} ran locally, "
        f"{coord.get('placed_remote', 0)} handed off (two choices on gossiped load); "
        f"transfers pushed {coord.get('transfers_pushed', 0)}, "
        f"stolen {coord.get('transfers_stolen', 0)}"
    )
    print(f"all {len(final)} elements and {len(after)} other tasks finished in {elapsed:.1f}s")
    for t in final:
        if t["state"] != "succeeded":
            print(f"  {t['spec']['id']}: {t['state']} ({t['reason']})")
    if out is not None:
        marks = [
            (float(t["started_at"]) - t0, name) for name, t in after.items() if t.get("started_at")
        ]
        _plot(timeline, names, shares, by_node, len(final), out, marks)
    failed = {name for name, t in after.items() if t["state"] != "succeeded"}
    ok = array["state"] == "succeeded" and failed == EXPECTED_FAILED
    return 0 if ok and all(t["state"] == "succeeded" for t in final) else 1


def _plot(
    timeline: list[tuple[float, dict[str, int]]],
    names: list[str],
    shares: list[int],
    by_node: Counter[str],
    total: int,
    out: Path,
    marks: list[tuple[float, str]],
) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot; `pip install .[sim]`)")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [t for t, _ in timeline]
    for n, sh in zip(names, shares, strict=True):
        ax1.plot(xs, [row.get(n, 0) for _, row in timeline], label=f"{n} ({sh} shares)")
    for at, name in marks:  # the dependent tasks' starts
        ax1.axvline(at, color="grey", linestyle=":", linewidth=1)
        ax1.text(at, ax1.get_ylim()[1] * 0.95, f" {name}", rotation=90, va="top", fontsize=7)
    ax1.set_xlabel("seconds since submission (dotted: --after tasks start)")
    ax1.set_ylabel("tasks queued + running")
    ax1.set_title("load per node over time")
    ax1.legend(fontsize=8)
    total_shares = sum(shares)
    pos = range(len(names))
    ax2.bar(
        [p - 0.2 for p in pos], [by_node.get(n, 0) for n in names], width=0.4, label="tasks run"
    )
    ax2.bar(
        [p + 0.2 for p in pos],
        [total * s / total_shares for s in shares],
        width=0.4,
        label="share-weighted ideal",
    )
    ax2.set_xticks(list(pos), names)
    ax2.set_title("where the work went")
    ax2.legend(fontsize=8)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    print(f"plot: {out}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m swarm.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=5)
    ap.add_argument("--tasks", type=int, default=300)
    ap.add_argument("--slots", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("demo-out/demo.png"))
    args = ap.parse_args(argv)
    return run(args.nodes, args.tasks, args.seed, args.out, args.slots)


if __name__ == "__main__":
    sys.exit(main())
