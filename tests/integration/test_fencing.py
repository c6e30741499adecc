"""--at-most-once on real agents (loopback; node/fencing.py, runtime/swarm_shim.c): a
drained home A, a runner B, a third node C (drained until the task runs on B). B's
agent is paused (SIGSTOP) while the task runs: its supervisor, not paused, kills the
task once the lease lapses; A declares B dead, and places the task on C only after
the last lease it granted has surely lapsed. The task's own marks (a line every 0.1 s
from each copy, with the host's clock) show that the two copies never overlap. The
same experiment without --at-most-once shows both copies running at once."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from swarm.localcluster import LocalAgent
from tests.conftest import AgentFactory
from tests.integration.test_cluster import all_see, wait_for

LOOP = ["--bind", "127.0.0.1"]
TTL = 3.0


def status(a: LocalAgent, tid: str) -> dict[str, Any]:
    with a.client(timeout=30) as c:
        return c.call("status", id=tid)


def beats(path: Path) -> dict[str, list[float]]:
    """Each copy (node:pid) -> the times of its marks."""
    out: dict[str, list[float]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        f = line.split()
        if len(f) == 3:
            out.setdefault(f"{f[0]}:{f[2]}", []).append(float(f[1]))
    return out


def _run(make_agent: AgentFactory, out: Path, at_most_once: bool) -> tuple[str, LocalAgent]:
    opts = [*LOOP, "--fence-ttl", str(TTL), "--home-grace", "600"]
    c = make_agent("kc", *opts, "--shares", "0")
    seed = ["--seeds", f"127.0.0.1:{c.port}"]
    a = make_agent("ka", *opts, *seed, "--shares", "0")
    b = make_agent("kb", *opts, *seed, "--slots", "1")
    wait_for(lambda: all_see([a, b, c], {"ka", "kb", "kc"}), 30, "three agents to see each other")
    mark = f'echo "$SWARM_NODE $(date +%s.%N) $$" >> {out}/marks'
    script = f"for i in $(seq 150); do {mark}; sleep 0.1; done"
    with a.client() as cl:
        tid = cl.submit(["sh", "-c", script], name="fenced", cwd="/", at_most_once=at_most_once)
    try:
        wait_for(lambda: "kb" in {k.split(":")[0] for k in beats(out / "marks")}, 30, "B to run it")
    except AssertionError:
        print(status(a, tid), a.cli("explain", tid).stdout, b.log_tail(60))
        raise
    with c.client() as cl:
        cl.call("shares", undrain=True, shares=1024)
    b.kill(signal.SIGSTOP)  # paused: its sockets held, nothing answered, its shims run on
    try:
        wait_for(lambda: status(a, tid)["task"]["node"] == "kc", 60, "A to place it on C")
        wait_for(lambda: "kc" in {k.split(":")[0] for k in beats(out / "marks")}, 30, "C to run it")
        time.sleep(1.0)
    finally:
        b.kill(signal.SIGCONT)
    return tid, a


def test_a_paused_runner_is_fenced_before_its_task_runs_elsewhere(
    make_agent: AgentFactory, short_tmp: Path
) -> None:
    out = short_tmp / "out"
    out.mkdir()
    out.chmod(0o777)
    tid, a = _run(make_agent, out, at_most_once=True)
    runs = beats(out / "marks")
    (b_run,) = [v for k, v in runs.items() if k.startswith("kb:")]
    (c_run,) = [v for k, v in runs.items() if k.startswith("kc:")]
    gap = c_run[0] - b_run[-1]
    print(f"B's copy last marked {gap:.2f}s before C's copy started (fence-ttl {TTL}s)")
    assert gap > 0, "two copies ran at once"
    rec = status(a, tid)
    explains = a.cli("explain", tid).stdout
    assert "has surely lapsed (--at-most-once)" in explains, explains
    assert rec["task"]["attempts"] >= 1
    # B, resumed, finds its run fenced and lets go; A's record is not disturbed
    wait_for(lambda: status(a, tid)["task"]["state"] == "succeeded", 60, "C to finish it")
    assert "Traceback" not in a.log_text()


def test_without_at_most_once_the_copies_overlap(make_agent: AgentFactory, short_tmp: Path) -> None:
    """The contrast (at-least-once, the default): B's copy runs on while C's runs."""
    out = short_tmp / "out"
    out.mkdir()
    out.chmod(0o777)
    _run(make_agent, out, at_most_once=False)
    runs = beats(out / "marks")
    (b_run,) = [v for k, v in runs.items() if k.startswith("kb:")]
    (c_run,) = [v for k, v in runs.items() if k.startswith("kc:")]
    assert b_run[-1] > c_run[0], "expected the copies to overlap without fencing"
