"""What `--at-most-once` costs (issue 19): real agents on loopback.

A drained home A, a runner B (16 slots), a drained seed C. Two measurements:

1. submit-to-start of a remote task, plain against `--at-most-once` (the runner asks
   A for a lease before it starts it: one more round trip), A/B in the same minutes
   (order plain, fenced, fenced, plain): each task writes its start time (the host's
   clock) to a file; the client notes the time just before its submit call;
2. lease traffic: N fenced `sleep` tasks running on B for a while; the lease requests
   B sent and A granted (the agents' counters), per running task per minute, and the
   payload bytes of one request and its answer (msgpack, before the transport's
   framing and sealing).

Prints the figures and writes bench/results/fencing.json.

    python bench/fencing.py [--tasks 40] [--running 20] [--hold 30] [--ttl 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swarm.localcluster import LocalAgent  # noqa: E402

HERE = Path(__file__).resolve().parent


def info(a: LocalAgent) -> dict[str, Any]:
    with a.client(timeout=30) as c:
        return c.info()


def counter(a: LocalAgent, name: str) -> int:
    return int(info(a).get("coordinator", {}).get(name, 0))


def starts(a: LocalAgent, out: Path, n: int, fenced: bool, tag: str) -> list[float]:
    """Submit-to-start (ms) of `n` tasks submitted one after another at `a`."""
    lat = []
    with a.client() as cl:
        for i in range(n):
            mark = out / f"{tag}{i}"
            argv = ["sh", "-c", f"date +%s.%N > {mark}"]
            t0 = time.time()
            cl.submit(argv, name=f"{tag}{i}", cwd="/", at_most_once=fenced)
            deadline = time.monotonic() + 30
            while not (mark.exists() and mark.read_text().strip()):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{tag}{i} did not start")
                time.sleep(0.002)
            lat.append((float(mark.read_text()) - t0) * 1000)
    return lat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=40, help="tasks per A/B block")
    ap.add_argument("--running", type=int, default=20, help="fenced tasks held running")
    ap.add_argument("--hold", type=float, default=30.0, help="seconds they run")
    ap.add_argument("--ttl", type=float, default=10.0, help="the agents' --fence-ttl")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "fencing.json")
    args = ap.parse_args()
    base = ["--no-mdns", "--port", "0", "--bind", "127.0.0.1", "--insecure"]
    base += ["--profile", "local", "--fence-ttl", str(args.ttl), "--replicas", "1"]
    blocks: dict[str, list[float]] = {"plain": [], "at-most-once": []}
    with tempfile.TemporaryDirectory(prefix="sw-fe-") as d:
        root = Path(d)
        out = root / "marks"
        out.mkdir()
        out.chmod(0o777)
        c = LocalAgent(root, "c", [*base, "--shares", "0"]).start()
        seed = ["--seeds", f"127.0.0.1:{c.port}"]
        b = LocalAgent(root, "b", [*base, *seed, "--slots", "16"]).start()
        a = LocalAgent(root, "a", [*base, *seed, "--shares", "0"]).start()
        try:
            time.sleep(2.0)  # everybody sees everybody
            for k, fenced in enumerate((False, True, True, False)):
                name = "at-most-once" if fenced else "plain"
                lat = starts(a, out, args.tasks, fenced, f"b{k}-")
                blocks[name] += lat
                print(
                    f"block {k + 1} {name:12s} submit-to-start p50 "
                    f"{statistics.median(lat):6.2f} ms  p90 "
                    f"{sorted(lat)[int(0.9 * len(lat))]:6.2f} ms",
                    flush=True,
                )
            asked0, granted0 = counter(b, "leases_asked"), counter(a, "leases_granted")
            with a.client() as cl:
                ids = [
                    cl.submit(["sleep", str(args.hold + 5)], cwd="/", at_most_once=True)
                    for _ in range(args.running)
                ]
            t0 = time.monotonic()
            time.sleep(args.hold)
            held = time.monotonic() - t0
            asked = counter(b, "leases_asked") - asked0
            granted = counter(a, "leases_granted") - granted0
            with a.client() as cl:
                for tid in ids:
                    cl.cancel(tid)
        finally:
            for x in (a, b, c):
                x.stop(timeout=15)
    tid = "t" + "0" * 16
    req = len(msgpack.packb({"op": "lease", "task": tid, "epoch": 3, "v": 1, "from": "node-17"}))
    rep = len(msgpack.packb({"granted": True, "why": ""}))
    per_min = asked / args.running / held * 60
    result = {
        "ttl": args.ttl,
        "tasks_per_block": args.tasks,
        "submit_to_start_ms": {
            k: {"p50": statistics.median(v), "p90": sorted(v)[int(0.9 * len(v))], "n": len(v)}
            for k, v in blocks.items()
        },
        "running": args.running,
        "held_s": round(held, 1),
        "leases_asked": asked,
        "leases_granted": granted,
        "requests_per_task_per_minute": round(per_min, 2),
        "request_payload_bytes": req,
        "answer_payload_bytes": rep,
    }
    print(
        f"\nlease traffic: {args.running} fenced tasks for {held:.0f} s (fence-ttl "
        f"{args.ttl:g}): {asked} requests asked, {granted} granted = {per_min:.1f} per task "
        f"per minute; payloads {req} B + {rep} B (before framing and sealing)"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
