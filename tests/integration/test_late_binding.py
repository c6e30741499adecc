"""Late binding (issue 24) with real agents on loopback: a task that finds no room at
its home waits there while peers hold reservations; the first with room pulls it; the
home runs it itself when its own slot frees first."""

from __future__ import annotations

import time

from swarm.localcluster import LocalAgent
from tests.conftest import AgentFactory
from tests.integration.test_placement import cluster, wait_all

LATE = ("--slots", "1", "--late-binding", "2", "--migration", "off")


def _pinned(a: LocalAgent, node: str, seconds: float) -> str:
    with a.client() as c:
        return c.submit(["sleep", str(seconds)], cwd="/", constraints=[f"pin={node}"])


def _running_on(a: LocalAgent, tid: str, node: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with a.client() as c:
            t = c.call("status", id=tid)["task"]
        if t["state"] == "running" and t["node"] == node:
            return
        time.sleep(0.1)
    raise AssertionError(f"{tid} not running on {node}: {t['state']} on {t['node']}")


def _labels(n: int) -> dict[int, list[str]]:
    return {i: ["--labels", f"pin=p{i}"] for i in range(1, n + 1)}


def test_busy_home_holds_tasks_and_idle_peers_pull_them(make_agent: AgentFactory) -> None:
    agents = cluster(make_agent, 3, *LATE, per_node=_labels(3))
    home = agents[0]
    long = _pinned(home, "p1", 60)
    _running_on(home, long, "p1")
    with home.client() as c:
        ids = [c.submit(["sleep", "1"], cwd="/") for _ in range(6)]
    tasks = wait_all(home, ids, timeout=90)
    assert all(t["state"] == "succeeded" for t in tasks), [t["state"] for t in tasks]
    # p1 was busy all along: every one was pulled by p2 or p3, and each ran once
    assert {t["node"] for t in tasks} <= {"p2", "p3"}, [t["node"] for t in tasks]
    for t in tasks:
        assert sum(1 for h in t["history"] if h["dst"] == "running") == 1, t["history"]
    why = home.cli("explain", ids[0]).stdout
    assert "held here (late binding)" in why, why
    assert "pulled by p" in why, why
    with home.client() as c:
        c.call("cancel", id=long)


def test_home_runs_its_held_task_when_its_own_slot_frees_first(
    make_agent: AgentFactory,
) -> None:
    agents = cluster(make_agent, 3, *LATE, per_node=_labels(3))
    home = agents[0]
    busy = [_pinned(home, f"p{i}", 60) for i in (2, 3)]
    for i, tid in zip((2, 3), busy, strict=True):
        _running_on(home, tid, f"p{i}")
    short = _pinned(home, "p1", 2)
    _running_on(home, short, "p1")
    with home.client() as c:
        held = c.submit(["true"], cwd="/")
    (t,) = wait_all(home, [held], timeout=60)
    assert t["state"] == "succeeded" and t["node"] == "p1", (t["state"], t["node"])
    assert sum(1 for h in t["history"] if h["dst"] == "running") == 1
    why = home.cli("explain", held).stdout
    assert "held here (late binding)" in why, why
    assert "started here before a reserved peer pulled it" in why, why
    with home.client() as c:
        for tid in busy:
            c.call("cancel", id=tid)
