"""The failover tick's cost with many tasks out (pure NodeStates, no I/O; stop 45).

Once a second each agent's failover tick (node/failover.py) looks at the tasks that
could change hands: its own with copies elsewhere, and the copies and guest tasks it
holds for others. It runs on the agent's event loop, so its time is a stall of
everything else there. Three NodeStates (tests/unit/node_harness.py carries out their
instructions in memory): home A submits N tasks, each copied to its replica (B or C)
and handed to B or C, every message delivered and answered; then A's and B's ticks are
timed in the steady state (nothing owed), 20 ticks per size and round.

Also times B's handling of one notices message (succession's claims, 256 of them as
one message carries, each restating A's claim on a task B runs): a node that adopted
thousands of tasks sends its peers hundreds of such messages, each handled on the
loop (stop 47: they synced every task's record, now only their own).

Prints the median tick per size (ms) and writes bench/results/failover_tick.json.
For an A/B, run this file with PYTHONPATH set to another checkout (the code it
imports is the checkout's; the harness too).

    python bench/failover_tick.py [--sizes 1000,10000,50000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or Path(__file__).parents[1])
sys.path.insert(0, str(ROOT))

from swarm import model as m  # noqa: E402
from swarm.cluster.succession import Notice  # noqa: E402
from swarm.node.failover import NOTICES_PER_MESSAGE  # noqa: E402
from swarm.node.state import Settings  # noqa: E402
from tests.unit.node_harness import FakeNet, FakeNode  # noqa: E402

HERE = Path(__file__).resolve().parent
TICKS = 20


def build(n: int) -> tuple[FakeNode, FakeNode]:
    """Home A with `n` tasks out (copied and handed off), all news delivered."""
    a, b, c = (FakeNode(x, settings=Settings(home_grace=5.0)) for x in "ABC")
    net = FakeNet(a, b, c)
    nodes = {"A": a, "B": b, "C": c}
    for x in nodes.values():
        x.state.members_seen(tuple((y, m.MemberState.ALIVE) for y in "ABC"), 0.0)
    for i in range(n):
        spec = a.submit(m.TaskSpec(id=f"t{i}", argv=("x",)))
        _, order = a.state.choose_replicas(spec.id, list("ABC"))
        r = nodes[order[0]]
        _, instrs = r.state.on_replica("A", a.state.hold_msg(spec, (r.name,)))
        r.run(instrs)
        a.run(a.state.replicas_chosen(spec.id, (r.name,)))
        _, instrs = a.state.offer(spec.id, "B" if i % 2 else "C", 0.0, 0.0)
        a.run(instrs)
    net.settle()
    for k in range(100):
        # A's copies' news, and B's and C's asks about the copies they hold (a home
        # first seen alive is asked, node/copyasks.py, a few thousand a tick),
        # delivered and answered until nothing is owed
        sent = 0
        for x in (a, b, c):
            tick(x, 1.0 + k / 100)
            sent += len(x.replica_out)
            while x.replica_out:
                i = x.replica_out.pop(0)
                _, instrs = nodes[i.dest].state.on_replica(x.name, i.msg)
                nodes[i.dest].run(instrs)
                x.run(x.state.replica_acked(i.dest, i.msg))
        if not sent:
            break
    return a, b


def tick(node: FakeNode, now: float) -> None:
    node.state.failover_at = 0.0
    node.run(node.state.tick(now, 1000.0 + now))


def timed(node: FakeNode) -> float:
    """The median of TICKS steady ticks, in ms."""
    times = []
    for k in range(TICKS):
        t0 = time.perf_counter()
        tick(node, 2.0 + k)
        times.append((time.perf_counter() - t0) * 1000)
    assert not node.replica_out, "the steady state owes nothing"
    return statistics.median(times)


def timed_notices(b: FakeNode) -> float:
    """The median of TICKS notices messages from A at B, in ms."""
    ran = sorted(b.state.guest.entries)[:NOTICES_PER_MESSAGE]
    msg = tuple(Notice("B", tid, "A", 1, "B", ()) for tid in ran)
    times = []
    for k in range(TICKS):
        t0 = time.perf_counter()
        _, instrs = b.state.on_notices("A", msg, 2.0 + k, 1002.0 + k)
        b.run(instrs)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,10000,50000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "failover_tick.json")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = []
    for n in sizes:
        homes, runners, notices = [], [], []
        for _ in range(args.rounds):
            a, b = build(n)
            homes.append(timed(a))
            runners.append(timed(b))
            notices.append(timed_notices(b))
        row = {"tasks": n, "home_ms": homes, "runner_ms": runners, "notices_ms": notices}
        rows.append(row)
        print(
            f"{n:>7} tasks out: home tick {statistics.median(homes):7.2f} ms"
            f" (rounds {', '.join(f'{x:.2f}' for x in homes)}); B (runs half, holds"
            f" about half the copies) {statistics.median(runners):6.2f} ms;"
            f" B's notices message {statistics.median(notices):6.2f} ms",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"code": str(ROOT), "ticks": TICKS, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
