"""Takeover time after a home's death (issue 19): real agents on loopback.

A runner B and a seed C stay up; each round starts a fresh drained home A (a new node
name each time), submits a long task there, which runs on B, waits until it runs,
then kills A with SIGKILL (for good) and measures, from the kill:

- dead: until B's membership view says A is `dead` (SWIM: suspicion timeout);
- adopted: until `swarm status` at B names B the task's home (dead + `home-grace` +
  at most one failover tick, 1 s);
- seen from C: until `swarm status` at C, which never held the task, answers with B's
  record.

Then the task is cancelled at C (through B) and the next round starts. Prints the
median, p90 and max of each over the rounds (with 20 rounds the max is the p95-p99
estimate; say so), and writes bench/results/failover.json.

    python bench/failover.py [--rounds 20] [--grace 2] [--profile local]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swarm.localcluster import LocalAgent  # noqa: E402

HERE = Path(__file__).resolve().parent


def status(a: LocalAgent, tid: str) -> dict[str, Any]:
    with a.client(timeout=30) as c:
        task: dict[str, Any] = c.call("status", id=tid)["task"]
        return task


def view_of(a: LocalAgent, node: str) -> str | None:
    with a.client(timeout=10) as c:
        for n in c.call("nodes")["nodes"]:
            if n["node"] == node:
                return str(n["state"])
    return None


def until(cond: Any, t0: float, timeout: float, what: str, poll: float = 0.05) -> float:
    """Seconds from `t0` (monotonic) until `cond()` holds."""
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def summary(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {
        "median": statistics.median(s),
        "p90": s[min(len(s) - 1, int(0.9 * len(s)))],
        "max": s[-1],
        "min": s[0],
    }


def one_round(a: LocalAgent, b: LocalAgent, c: LocalAgent, r: int) -> tuple[dict[str, float], str]:
    """A long task submitted at A runs on B; A is killed: the times from the kill."""
    t_join = time.monotonic()
    until(lambda: view_of(b, a.name) == "alive", t_join, 30, "B to see A")
    with a.client() as cl:
        tid = cl.submit(["sleep", "600"], name=f"long{r}", cwd="/")
    until(lambda: status(a, tid)["state"] == "running", t_join, 30, "the task to run")
    t0 = time.monotonic()
    a.kill(signal.SIGKILL)
    dead = until(lambda: view_of(b, a.name) == "dead", t0, 60, "A dead at B")
    adopted = until(lambda: status(b, tid)["spec"]["home"] == "b", t0, 120, "B to adopt")
    seen = until(lambda: status(c, tid)["spec"]["home"] == "b", t0, 120, "C to see B's record")
    return {"dead": dead, "adopted": adopted, "seen_from_c": seen}, tid


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--grace", type=float, default=2.0, help="the agents' --home-grace")
    ap.add_argument("--profile", default="local", help="membership timers (local, lan)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "failover.json")
    args = ap.parse_args()
    base = [
        "--no-mdns",
        "--port",
        "0",
        "--bind",
        "127.0.0.1",
        "--insecure",
        "--profile",
        args.profile,
        "--home-grace",
        str(args.grace),
    ]
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="sw-fo-") as d:
        root = Path(d)
        c = LocalAgent(root, "c", [*base, "--shares", "0"]).start()
        seed = ["--seeds", f"127.0.0.1:{c.port}"]
        b = LocalAgent(root, "b", [*base, *seed, "--slots", "1"]).start()
        agents = [b, c]
        try:
            for r in range(args.rounds):
                a = LocalAgent(root, f"a{r:02d}", [*base, *seed, "--shares", "0"]).start()
                agents.append(a)
                row, tid = one_round(a, b, c, r)
                rows.append(row)
                print(
                    f"round {r + 1:2d}: dead {row['dead']:5.2f}s  adopted {row['adopted']:5.2f}s"
                    f"  seen from C {row['seen_from_c']:5.2f}s",
                    flush=True,
                )
                p = c.cli("cancel", tid)
                if p.returncode != 0:
                    print(f"  cancel at C failed: {p.stderr.strip()}", file=sys.stderr)
        finally:
            for x in agents:
                x.stop(timeout=15)
    result = {
        "rounds": len(rows),
        "home_grace": args.grace,
        "profile": args.profile,
        "rows": rows,
        **{k: summary([row[k] for row in rows]) for k in ("dead", "adopted", "seen_from_c")},
    }
    print(
        f"\n{len(rows)} kills, home-grace {args.grace:g}s, profile {args.profile}"
        " (seconds from the kill; median / p90 / max; with 20 rounds the max stands"
        " for p95-p99)"
    )
    for k in ("dead", "adopted", "seen_from_c"):
        s = result[k]
        print(f"  {k:12s} {s['median']:6.2f} / {s['p90']:6.2f} / {s['max']:6.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
