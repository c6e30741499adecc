"""Submission throughput and submit-to-start latency of one real agent.

Prints a table and writes bench/results/submit.json:
- durable submissions per second (acknowledged = journaled) with 1 client and with
  8 concurrent clients, each on its own connection, submitting `true`;
- submit-to-process-start latency p50/p99 for a `true`-like program that prints its
  own start time, next to starting the same program directly with subprocess in the
  same run (ratio), the two in alternating blocks of 10 starts; back to back (the
  target's figure) and again with an idle gap before each start (for reference).

Targets (issue 2): >= 1,000 durable submissions/s with 8 clients; submit-to-start
p50 no more than 3x the direct spawn.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.localcluster import LocalAgent

HERE = Path(__file__).resolve().parent
AGENT_ARGS = [
    "--insecure",
    "--no-mdns",
    "--port",
    "0",
    "--profile",
    "local",
    "--log-level",
    "warning",
]


def build_stamp(work: Path) -> list[str]:
    """A compiled stamper if a C compiler is here, else a Python one (noisier)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        out = work / "stamp"
        subprocess.run([cc, "-O2", "-o", str(out), str(HERE / "stamp.c")], check=True)
        return [str(out)]
    return [sys.executable, "-S", "-c", "import time; print(repr(time.time()))"]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def throughput(work: Path, name: str, clients: int, per_client: int) -> dict[str, float]:
    """Submissions acknowledged per second by a fresh agent whose one slot is held by a
    blocker, so the figure is the submit path itself (decode, validate, journal with
    fsync, reply), not process spawning competing for the same core."""
    agent = LocalAgent(work, name, [*AGENT_ARGS, "--slots", "1"])
    agent.start()
    try:
        with agent.client() as c:
            c.submit(["sleep", "3600"], cwd="/")
        ids: list[list[str]] = [[] for _ in range(clients)]
        barrier = threading.Barrier(clients + 1)

        def worker(i: int) -> None:
            with agent.client() as c:
                barrier.wait()
                for _ in range(per_client):
                    ids[i].append(c.submit(["true"], cwd="/"))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        with agent.client() as c:
            info = c.info()
            queued = sum(1 for t in c.list(limit=100_000) if t["state"] == "queued")
    finally:
        agent.stop()
    total = clients * per_client
    assert queued == total, f"{queued} of {total} acknowledged tasks found queued"
    return {
        "clients": clients,
        "submissions": total,
        "seconds": elapsed,
        "per_second": total / elapsed,
        "journal_commits": info["journal_commits"],
        "journal_ops": info["journal_ops"],
    }


IDLE_GAP_S = 0.05
BLOCK = 10


def one_via_swarm(c: Any, stamp: list[str]) -> float:
    t0 = time.time()
    tid = c.submit(stamp, cwd="/")
    c.wait(tid)
    out = b"".join(c.logs(tid)).decode().strip()
    return float(out) - t0


def one_direct(stamp: list[str]) -> float:
    t0 = time.time()
    p = subprocess.run(stamp, stdout=subprocess.PIPE, check=True, cwd="/")
    return float(p.stdout.decode().strip()) - t0


def latency_pairs(
    agent: LocalAgent, stamp: list[str], n: int, gap: float = 0.0
) -> tuple[list[float], list[float]]:
    """n direct starts and n starts through the agent, in alternating blocks of
    BLOCK, so that both see the same minutes of this VM (whose speed drifts: a direct
    start's p50 moved between 0.64 and 1.05 ms from run to run when the two were taken
    apart). Blocks, not single alternation: a direct start right after one through the
    agent overlaps the agent's after-work (the exit journaled, logs read) and came out
    ~20% slower, which flattered the ratio.
    `gap`: idle time before each start. Back to back (0) is the target's figure; after
    an idle gap both get slower (CPUs wake from idle), and with cgroups the move into
    the task's group waits for an RCU grace period (see docs/benchmarks.md)."""
    direct: list[float] = []
    via: list[float] = []
    with agent.client() as c:
        for _ in range(20):  # warm up
            one_via_swarm(c, stamp)
        while len(via) < n:
            k = min(BLOCK, n - len(via))
            for _ in range(k):
                if gap:
                    time.sleep(gap)
                direct.append(one_direct(stamp))
            for _ in range(k):
                if gap:
                    time.sleep(gap)
                via.append(one_via_swarm(c, stamp))
    return direct, via


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-client", type=int, default=500, help="submissions per client")
    ap.add_argument("--latency-samples", type=int, default=300)
    ap.add_argument("--idle-samples", type=int, default=100, help="starts after an idle gap")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--out", default=str(HERE / "results" / "submit.json"))
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="swb-") as d:
        work = Path(d)
        stamp = build_stamp(work)
        one = throughput(work, "one", 1, args.per_client)
        eight = throughput(work, "eight", 8, args.per_client)
        lat: dict[str, tuple[list[float], list[float]]] = {}
        idle: dict[str, tuple[list[float], list[float]]] = {}
        for iso in ("none", "auto"):
            agent = LocalAgent(
                work,
                f"latency-{iso}",
                [*AGENT_ARGS, "--slots", str(args.slots), "--isolation", iso],
            )
            agent.start()
            try:
                lat[iso] = latency_pairs(agent, stamp, args.latency_samples)
                idle[iso] = latency_pairs(agent, stamp, args.idle_samples, IDLE_GAP_S)
            finally:
                agent.stop()

    res: dict[str, Any] = {
        "throughput_1_client": one,
        "throughput_8_clients": eight,
        "latency_ms": {},
        "latency_after_idle_ms": {},
        "idle_gap_s": IDLE_GAP_S,
        "stamp": stamp[0],
    }
    for key, runs in (("latency_ms", lat), ("latency_after_idle_ms", idle)):
        for iso, (direct, via) in runs.items():
            res[key][iso] = {
                "swarm_p50": 1000 * statistics.median(via),
                "swarm_p99": 1000 * pct(via, 0.99),
                "direct_p50": 1000 * statistics.median(direct),
                "direct_p99": 1000 * pct(direct, 0.99),
                "ratio_p50": statistics.median(via) / statistics.median(direct),
            }
    res["targets"] = {
        "submissions_per_s_8_clients>=1000": eight["per_second"] >= 1000,
        "start_p50_ratio<=3 (no isolation)": res["latency_ms"]["none"]["ratio_p50"] <= 3.0,
        "start_p50_ratio<=3 (cgroup isolation)": res["latency_ms"]["auto"]["ratio_p50"] <= 3.0,
    }
    print("submission throughput (acknowledged = journaled, fsync'd)")
    for label, r in (("1 client ", one), ("8 clients", eight)):
        print(f"  {label}: {r['per_second']:8.0f} /s  ({r['submissions']} in {r['seconds']:.2f} s)")
    print(f"  8 clients: {eight['journal_ops']} journal ops in {eight['journal_commits']} commits")
    titles = {
        "latency_ms": "submit-to-process-start latency (ms), back to back, in alternating blocks",
        "latency_after_idle_ms": f"the same, {1000 * IDLE_GAP_S:.0f} ms idle before each start",
    }
    for key, title in titles.items():
        print(title)
        for iso, lm in res[key].items():
            what = "no isolation" if iso == "none" else "per-task cgroups (isolation auto)"
            print(f"  {what}:")
            print(f"    swarm  p50 {lm['swarm_p50']:7.2f}  p99 {lm['swarm_p99']:7.2f}")
            print(
                f"    direct p50 {lm['direct_p50']:7.2f}  p99 {lm['direct_p99']:7.2f}  (subprocess)"
            )
            print(f"    ratio p50 {lm['ratio_p50']:.2f}x")
    for k, v in res["targets"].items():
        print(f"  target {k}: {'met' if v else 'NOT met'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
