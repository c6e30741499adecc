"""Dependencies on real agents (issue 23; node/depends.py): three loopback agents. A
child submitted at another node starts only after its parent ended; a child of a
failed parent fails with the reason; a dependency on an array element and on a whole
array; a child still waiting when its home restarts runs once its parent ends; unknown
ids are refused at submit (exit 2)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from swarm.localcluster import LocalAgent
from tests.conftest import AgentFactory
from tests.integration.test_cluster import all_see, wait_for

LOOP = ["--bind", "127.0.0.1"]


def _three(make_agent: AgentFactory) -> list[LocalAgent]:
    a = make_agent("da", *LOOP, "--slots", "2")
    seed = ["--seeds", f"127.0.0.1:{a.port}"]
    agents = [a, *(make_agent(n, *LOOP, *seed, "--slots", "2") for n in ("db", "dc"))]
    wait_for(lambda: all_see(agents, {"da", "db", "dc"}), 30, "three agents to see each other")
    return agents


def _status(a: LocalAgent, tid: str) -> dict[str, Any]:
    with a.client(timeout=30) as c:
        return c.status(tid)


def test_children_wait_for_parents_across_nodes(make_agent: AgentFactory, short_tmp: Path) -> None:
    a, b, _c = _three(make_agent)
    with a.client() as c:
        parent = c.submit(["sleep", "2"], cwd="/")
        bad = c.submit(["sh", "-c", "exit 4"], cwd="/")
        arr = c.submit(["sh", "-c", "exit $0", "{index}"], cwd="/", array="0-3")
    with b.client() as c:
        child = c.submit(["true"], cwd="/", after=[f"ok:{parent}"])
        never = c.submit(["true"], cwd="/", after=[f"ok:{bad}"])
        cleanup = c.submit(["true"], cwd="/", after=[f"notok:{bad}", f"any:{arr}"])
        elem = c.submit(["true"], cwd="/", after=[f"ok:{arr}[0]"])
        whole = c.submit(["true"], cwd="/", after=[f"ok:{arr}"])
    time.sleep(1.0)
    assert _status(b, child)["state"] == "queued"  # its parent still runs
    assert f"--after: waiting for {parent} (ok)" in b.cli("explain", child).stdout
    wait_for(lambda: _status(b, child)["state"] == "succeeded", 30, "the child to run")
    p, ch = _status(a, parent), _status(b, child)
    print(f"child started {ch['started_at'] - p['finished_at']:.2f}s after its parent ended")
    assert ch["started_at"] >= p["finished_at"]
    wait_for(lambda: _status(b, never)["state"] == "failed", 30, "the child of a failed parent")
    assert "dependency never satisfied" in _status(b, never)["reason"]
    wait_for(lambda: _status(b, cleanup)["state"] == "succeeded", 30, "notok + any to hold")
    wait_for(lambda: _status(b, elem)["state"] == "succeeded", 30, "element 0 (exit 0) to count")
    wait_for(lambda: _status(b, whole)["state"] == "failed", 30, "the whole array's failure")
    assert f"{arr} ended failed" in _status(b, whole)["reason"]


def test_a_waiting_child_survives_its_home_restart_and_unknown_parents_are_refused(
    make_agent: AgentFactory, short_tmp: Path
) -> None:
    a, b, _c = _three(make_agent)
    with a.client() as c:
        parent = c.submit(["sleep", "6"], cwd="/")
    with b.client() as c:
        child = c.submit(["true"], cwd="/", after=[f"ok:{parent}"])
    assert _status(b, child)["state"] == "queued"
    b.stop()
    b.start()
    wait_for(lambda: _status(b, child)["state"] == "succeeded", 60, "the child after the restart")
    assert _status(b, child)["started_at"] >= _status(a, parent)["finished_at"]
    # a waiting array is cancelled before it made any element
    with b.client() as c:
        waiting = c.submit(["true"], cwd="/", array="0-9", after=[f"ok:{parent}"])
        late = c.submit(["true"], cwd="/", after=[f"ok:{parent}"])
        c.cancel(waiting)
    assert _status(b, waiting)["state"] == "cancelled"
    wait_for(lambda: _status(b, late)["state"] == "succeeded", 60, "a child of a done parent")
    r = b.cli("submit", "--after", "ok:tdoesnotexist0000", "--", "true")
    assert r.returncode == 2 and "after: no task tdoesnotexist0000" in r.stderr, r.stderr
    r = b.cli("submit", "--after", "soon:x", "--", "true")
    assert r.returncode == 2 and "unknown condition" in r.stderr, r.stderr
