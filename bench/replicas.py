"""What `replicas = 2` costs a submission (issue 19): A/B against `replicas = 1` in the
same minutes, on loopback agents.

Two drained peers stay up (they only keep copies); for each round a fresh agent joins
them with `--replicas 1` or `--replicas 2` (rounds in the order 1, 2, 2, 1, ... so that
the VM's drift falls on both) and is measured as bench/submit.py measures one agent:

- durable submissions per second with 8 concurrent clients (its one slot held by a
  blocker, so the figure is the submit path: with 2, each answer also waits for the
  copy's round trip and the peer's fsync);
- submit-to-process-start p50 / p99 of a stamping program (the start does not wait
  for the copy, the answer does: the figure is from the submit call to the start).

Prints both and writes bench/results/replicas.json.

    python bench/replicas.py [--rounds 4] [--per-client 150] [--samples 150]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from submit import build_stamp, latency_pairs, pct  # noqa: E402

from swarm.localcluster import LocalAgent  # noqa: E402

BASE = ["--insecure", "--no-mdns", "--port", "0", "--profile", "local", "--bind", "127.0.0.1"]
BASE += ["--log-level", "warning"]


def joined(a: LocalAgent, names: set[str]) -> bool:
    with a.client(timeout=10) as c:
        seen = {n["node"] for n in c.call("nodes")["nodes"] if n["state"] == "alive"}
    return names <= seen


def wait_joined(a: LocalAgent, names: set[str]) -> None:
    t0 = time.monotonic()
    while not joined(a, names):
        if time.monotonic() - t0 > 30:
            raise TimeoutError(f"{a.name} does not see {names}")
        time.sleep(0.1)


def throughput(a: LocalAgent, clients: int, per_client: int) -> tuple[float, int]:
    with a.client() as c:
        c.submit(["sleep", "3600"], cwd="/")
    copies: list[int] = []
    barrier = threading.Barrier(clients + 1)

    def worker() -> None:
        with a.client() as c:
            barrier.wait()
            for _ in range(per_client):
                copies.append(int(c.call("submit", argv=["true"], cwd="/").get("replicas", 0)))

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return clients * per_client / (time.perf_counter() - t0), sum(copies)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--per-client", type=int, default=150)
    ap.add_argument("--samples", type=int, default=150)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "replicas.json")
    args = ap.parse_args()
    order = [1, 2, 2, 1] * ((args.rounds + 3) // 4)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="swb-r-") as d:
        work = Path(d)
        stamp = build_stamp(work)
        p1 = LocalAgent(work, "p1", [*BASE, "--shares", "0"]).start()
        seed = ["--seeds", f"127.0.0.1:{p1.port}"]
        p2 = LocalAgent(work, "p2", [*BASE, *seed, "--shares", "0"]).start()
        peers = [p1, p2]
        try:
            wait_joined(p2, {"p1", "p2"})
            for r, k in enumerate(order[: args.rounds]):
                extra = [*seed, "--replicas", str(k)]
                t = LocalAgent(work, f"t{r}", [*BASE, *extra, "--slots", "1"]).start()
                try:
                    wait_joined(t, {"p1", "p2"})
                    rate, copies = throughput(t, 8, args.per_client)
                finally:
                    t.stop()
                s = LocalAgent(work, f"s{r}", [*BASE, *extra, "--slots", "4"]).start()
                try:
                    wait_joined(s, {"p1", "p2"})
                    _, via = latency_pairs(s, stamp, args.samples)
                finally:
                    s.stop()
                row = {
                    "replicas": k,
                    "per_second_8_clients": rate,
                    "copies_made": copies,
                    "start_p50_ms": 1000 * statistics.median(via),
                    "start_p99_ms": 1000 * pct(via, 0.99),
                }
                rows.append(row)
                print(
                    f"round {r + 1} replicas={k}: {rate:7.0f} submissions/s (8 clients, "
                    f"{copies} copies), submit-to-start p50 {row['start_p50_ms']:.2f} ms "
                    f"p99 {row['start_p99_ms']:.2f} ms",
                    flush=True,
                )
        finally:
            for p in peers:
                p.stop()
    out: dict[str, Any] = {"rounds": rows}
    for k in (1, 2):
        sel = [r for r in rows if r["replicas"] == k]
        if sel:
            out[f"replicas_{k}"] = {
                key: [round(r[key], 2) for r in sel]
                for key in ("per_second_8_clients", "start_p50_ms", "start_p99_ms")
            }
    print(json.dumps({k: v for k, v in out.items() if k != "rounds"}, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
