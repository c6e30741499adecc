#!/usr/bin/env python3
"""A fake cloud for elastic-pool tests (issue 25): the scale hook that starts and
stops loopback agents.

    scale_hook.py BASE

The agent runs it with a minimal environment (PATH, LANG, HOME and the SWARM_SCALE_*
values), so everything else comes from files under BASE, written by the test:

- BASE/hook.json: {"python": ..., "args": [agent arguments, --config included],
  "env": {the agents' environment}};
- BASE/agents.json: the inventory, {name: {"pid", "port", "by": "test"|"hook",
  "stopped": wall time or null}}, read and written under an flock on BASE/agents.lock;
- BASE/calls.jsonl: one JSON line per call, appended: the SWARM_SCALE_* values, wall
  times of its start and end, the nodes started or stopped, ok or the error.

scale-out (SWARM_SCALE_ACTION=out): starts SWARM_SCALE_COUNT new agents named e1,
e2, ... (each in BASE/agents/NAME, its own session so that it outlives this hook),
seeded to every agent of the inventory still running, and waits until each answers
on its socket. scale-in: SIGTERMs each node of SWARM_SCALE_NODES and waits for it to
exit (SIGKILL after 30 s); a name not in the inventory fails the call, as an
operator's script should refuse names it does not know. Stopping a node already
stopped succeeds (a hand-over may ask twice).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STOP_TIMEOUT = 30.0
READY_TIMEOUT = 60.0


@contextlib.contextmanager
def inventory(base: Path) -> Iterator[dict[str, Any]]:
    """agents.json, locked; written back when the block ends without an error."""
    with open(base / "agents.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = base / "agents.json"
        inv: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        yield inv
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(inv, indent=1))
        tmp.replace(path)


def running(pid: int, name: str) -> bool:
    """Is `pid` still the agent `name` (not exited, not a zombie, not a reused pid)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    if stat.rpartition(")")[2].split()[0] in ("Z", "X"):
        return False
    return "--node-id" in argv and argv[argv.index("--node-id") + 1 :][:1] == [name]


def scale_out(base: Path, count: int) -> list[str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from swarm.localcluster import LocalAgent

    cfg = json.loads((base / "hook.json").read_text())
    with inventory(base) as inv:
        seeds = [
            f"127.0.0.1:{e['port']}"
            for n, e in sorted(inv.items())
            if e.get("port") and running(e["pid"], n)
        ]
        taken = {int(n[1:]) for n in inv if n.startswith("e") and n[1:].isdigit()}
        first = max(taken, default=0) + 1
        names = [f"e{k}" for k in range(first, first + count)]
        for n in names:  # reserved now: a concurrent call picks other names
            inv[n] = {"pid": 0, "port": None, "by": "hook", "stopped": None}
    agents = []
    for n in names:
        args = [*cfg["args"], *(["--seeds", ",".join(seeds)] if seeds else [])]
        a = LocalAgent(base / "agents", n, args, env=cfg["env"], python=cfg["python"])
        a.start(wait=False)
        assert a.pid is not None
        with inventory(base) as inv:
            inv[n]["pid"] = a.pid  # recorded before waiting: the test stops it whatever
        agents.append(a)
    for a in agents:
        a.wait_ready(READY_TIMEOUT)
        with inventory(base) as inv:
            inv[a.name]["port"] = a.port
    return names


def scale_in(base: Path, nodes: list[str]) -> list[str]:
    with inventory(base) as inv:
        unknown = [n for n in nodes if n not in inv]
        if unknown:
            raise SystemExit(f"scale-in of nodes not in the inventory: {unknown}")
        targets = {n: int(inv[n]["pid"]) for n in nodes}
    for n, pid in targets.items():
        if running(pid, n):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for n, pid in targets.items():
        while running(pid, n) and time.monotonic() < deadline:
            time.sleep(0.05)
        if running(pid, n):
            os.kill(pid, signal.SIGKILL)
    with inventory(base) as inv:
        for n in nodes:
            inv[n]["stopped"] = inv[n]["stopped"] or time.time()
    return nodes


def main(argv: list[str]) -> int:
    base = Path(argv[1])
    env = {k: v for k, v in os.environ.items() if k.startswith("SWARM_SCALE_")}
    call: dict[str, Any] = {"env": env, "t0": time.time(), "pid": os.getpid()}
    action = env.get("SWARM_SCALE_ACTION")
    rc = 0
    try:
        if action == "out":
            call["started"] = scale_out(base, int(env["SWARM_SCALE_COUNT"]))
        elif action == "in":
            call["stopped"] = scale_in(base, env.get("SWARM_SCALE_NODES", "").split())
        else:
            raise SystemExit(f"unknown SWARM_SCALE_ACTION {action!r}")
        call["ok"] = True
    except BaseException as e:  # logged for the test, then the hook fails
        call["ok"] = False
        call["error"] = "".join(traceback.format_exception_only(type(e), e)).strip()
        rc = 1
    call["t1"] = time.time()
    with open(base / "calls.jsonl", "a") as fh:
        fh.write(json.dumps(call) + "\n")
    print(json.dumps(call))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
