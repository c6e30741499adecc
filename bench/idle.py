"""Real agents at rest: CPU, memory and gossip bytes per agent (30 agents on loopback).

Starts N real agent processes (LAN timing profile, encryption on), waits until every
agent sees every other one with a load report, then measures over a window:
- CPU percent of one core per agent (process CPU time / wall time),
- RSS per agent (MB),
- bytes/s sent and received per agent (the transport's UDP+TCP counters).
Prints a table and writes bench/results/idle.json.

Targets (issue 3): idle agent under 1% of a core and under 60 MB RSS; bytes/s per
node no more than memberlist's defaults.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.client import Client
from swarm.localcluster import LocalAgent

HERE = Path(__file__).resolve().parent


def counters(a: LocalAgent) -> dict[str, int]:
    with Client(a.socket, timeout=30) as c:
        t = c.info()["transport"]
    return {
        "out": t.get("udp_out_bytes", 0) + t.get("tcp_out_bytes", 0),
        "in": t.get("udp_in_bytes", 0) + t.get("tcp_in_bytes", 0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=30)
    ap.add_argument("--window", type=float, default=60.0, help="seconds measured at rest")
    ap.add_argument("--profile", default="lan", choices=["lan", "local"])
    ap.add_argument("--out", default=str(HERE / "results" / "idle.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="swi-") as d:
        root = Path(d)
        key = root / "cluster.key"
        key.write_text(
            subprocess.run(
                [sys.executable, "-m", "swarm", "keygen"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        key.chmod(0o600)
        base = [
            "--keyring",
            str(key),
            "--no-mdns",
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--profile",
            args.profile,
            "--log-level",
            "warning",
            "--slots",
            "2",
        ]
        first = LocalAgent(root, "i1", base).start()
        seed = f"127.0.0.1:{first.port}"
        agents = [first] + [
            LocalAgent(root, f"i{i}", [*base, "--seeds", seed]).start(wait=False)
            for i in range(2, args.agents + 1)
        ]
        try:
            for a in agents:
                a.wait_ready(120)
            t0 = time.monotonic()
            while True:
                with Client(agents[-1].socket, timeout=30) as c:
                    nodes = c.call("nodes")["nodes"]
                if sum(1 for n in nodes if n["state"] == "alive" and n["load"]) == args.agents:
                    break
                if time.monotonic() - t0 > 180:
                    raise SystemExit("agents did not converge")
                time.sleep(1)
            converge = time.monotonic() - t0
            time.sleep(5)  # let start-up traffic (joins, push-pulls) settle
            procs = [psutil.Process(a.pid) for a in agents if a.pid]
            cpu0 = [p.cpu_times() for p in procs]
            c0 = [counters(a) for a in agents]
            w0 = time.monotonic()
            time.sleep(args.window)
            wall = time.monotonic() - w0
            cpu1 = [p.cpu_times() for p in procs]
            c1 = [counters(a) for a in agents]
            rss = [p.memory_info().rss / 1e6 for p in procs]
        finally:
            for a in agents:
                a.stop()
    cpu = [
        100 * ((b.user + b.system) - (a.user + a.system)) / wall
        for a, b in zip(cpu0, cpu1, strict=True)
    ]
    out_bps = [(b["out"] - a["out"]) / wall for a, b in zip(c0, c1, strict=True)]
    in_bps = [(b["in"] - a["in"]) / wall for a, b in zip(c0, c1, strict=True)]
    # memberlist LAN defaults: gossip 3 nodes / 200 ms, packets up to 1400 B, probe 1/s
    memberlist_bound = 3 * 1400 / 0.2 + 2 * 1400
    res: dict[str, Any] = {
        "agents": args.agents,
        "profile": args.profile,
        "converged_s": converge,
        "window_s": wall,
        "cpu_percent": {"mean": statistics.mean(cpu), "max": max(cpu)},
        "rss_mb": {"mean": statistics.mean(rss), "max": max(rss)},
        "bytes_out_per_s": {"mean": statistics.mean(out_bps), "max": max(out_bps)},
        "bytes_in_per_s": {"mean": statistics.mean(in_bps), "max": max(in_bps)},
        "memberlist_default_bound_bytes_per_s": memberlist_bound,
    }
    res["targets"] = {
        "cpu < 1% of a core": res["cpu_percent"]["max"] < 1.0,
        "rss < 60 MB": res["rss_mb"]["max"] < 60.0,
        "bytes/s <= memberlist defaults": res["bytes_out_per_s"]["max"] <= memberlist_bound,
    }
    print(f"{args.agents} agents ({args.profile}), converged {converge:.1f}s, window {wall:.0f}s")
    cpu_r = res["cpu_percent"]
    print(f"  CPU per agent: mean {cpu_r['mean']:.2f}% max {cpu_r['max']:.2f}% of a core")
    print(f"  RSS per agent: mean {res['rss_mb']['mean']:.1f} MB max {res['rss_mb']['max']:.1f} MB")
    print(
        f"  bytes/s out per agent: mean {res['bytes_out_per_s']['mean']:.0f} "
        f"max {res['bytes_out_per_s']['max']:.0f} (memberlist default bound {memberlist_bound:.0f})"
    )
    for k, v in res["targets"].items():
        print(f"  target {k}: {'met' if v else 'NOT met'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
