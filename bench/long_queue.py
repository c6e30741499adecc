"""What a long queue costs idle agents (issue 23).

A home (4 slots, role=home, --replicas 1) and one runner (16 slots, role=worker) on
loopback; measures each agent's CPU (ms per second) idle, then after `Q` `sleep 600`
tasks were submitted at the home with the constraint role=worker (16 run, the rest
wait in the runner's queue). Prints both lines.

    python bench/long_queue.py [Q]   (default 4000)
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.client import Client
from swarm.localcluster import LocalAgent

BASE = [
    "--insecure",
    "--no-mdns",
    "--bind",
    "127.0.0.1",
    "--port",
    "0",
    "--profile",
    "lan",
    "--log-level",
    "warning",
]


def _cpu(a: LocalAgent) -> float:
    assert a.proc is not None
    t = psutil.Process(a.proc.pid).cpu_times()
    return float(t.user + t.system)


def _window(agents: list[LocalAgent], secs: float) -> list[float]:
    c0 = [_cpu(a) for a in agents]
    time.sleep(secs)
    return [(_cpu(a) - c) / secs * 1000 for a, c in zip(agents, c0, strict=True)]


def main() -> None:
    q = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        root = Path(tmp)
        home = LocalAgent(
            root, "home", [*BASE, "--slots", "4", "--labels", "role=home", "--replicas", "1"]
        ).start()
        seed = ["--seeds", f"127.0.0.1:{home.port}"]
        runner = LocalAgent(
            root, "w0", [*BASE, "--slots", "16", "--labels", "role=worker", *seed]
        ).start()
        agents = [home, runner]
        try:
            time.sleep(6)
            print("idle, CPU ms/s (home, runner):", [f"{x:.1f}" for x in _window(agents, 8)])

            def submit(k: int) -> None:
                with Client(home.socket, timeout=120) as c:
                    for _ in range(k):
                        c.submit(["sleep", "600"], cwd="/", constraints=["role=worker"])

            threads = [threading.Thread(target=submit, args=(q // 8,)) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            time.sleep(10)
            print(f"{q} submitted, CPU ms/s:", [f"{x:.1f}" for x in _window(agents, 15)])
        finally:
            for a in agents:
                a.stop()


if __name__ == "__main__":
    main()
