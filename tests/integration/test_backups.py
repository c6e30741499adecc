"""Speculative backups (issue 24) with real agents on loopback: one node made slow on
purpose, an --idempotent task that lands there gets a backup on another node, the
backup finishes first, the original's run is killed, and its record holds one result.
A task that is not --idempotent is never backed up."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil

from swarm.localcluster import LocalAgent
from tests.conftest import AgentFactory
from tests.integration.test_placement import cluster, wait_all

BACKUPS = (
    "--slots",
    "1",
    "--migration",
    "off",
    "--backup-history",
    "5",
    "--backup-budget",
    "0.5",  # the history here is 2.5 task-seconds: 5 % would buy no backup
)
SLOW = 30  # seconds a task takes on the slow node once the flag is there


def _command(flag: Path) -> list[str]:
    """0.5 s anywhere; SLOW s on p1 once `flag` exists (the artificially slow node)."""
    return [
        "sh",
        "-c",
        f'if [ "$SWARM_NODE" = p1 ] && [ -e {flag} ]; then sleep {SLOW}; fi; sleep 0.5;'
        ' echo "ran on $SWARM_NODE"',
    ]


def _history(home: LocalAgent, flag: Path) -> None:
    """Five runs of the class (`--name job`), none slow: the home's runtime history."""
    with home.client() as c:
        ids = [c.submit(_command(flag), name="job", cwd="/", idempotent=True) for _ in range(5)]
    assert all(t["state"] == "succeeded" for t in wait_all(home, ids, timeout=60))


def _submit_on_p1(home: LocalAgent, flag: Path, idempotent: bool) -> str:
    """A task of the class that starts on p1 (it prefers the slow label; p1 is idle)."""
    with home.client() as c:
        tid = c.submit(
            _command(flag), name="job", cwd="/", idempotent=idempotent, prefer=["slow=yes"]
        )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with home.client() as c:
            t = c.status(tid)
        if t["state"] == "running":
            assert t["node"] == "p1", t
            return tid
        time.sleep(0.05)
    raise AssertionError(f"{tid} did not start: {t['state']}")


def _slow_sleeps(flag: Path) -> list[psutil.Process]:
    """The slow node's `sh` of a task still alive (it sleeps SLOW s)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or ())
        if str(flag) in cmd and f"sleep {SLOW}" in cmd:
            out.append(p)
    return out


def test_a_late_idempotent_task_gets_a_backup_that_wins(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    per_node = {1: ["--labels", "slow=yes"], 2: ["--labels", "slow=no"]}
    per_node[3] = ["--labels", "slow=no"]
    agents = cluster(make_agent, 3, *BACKUPS, per_node=per_node)
    home = agents[0]
    flag = tmp_path / "p1-is-slow"
    _history(home, flag)
    flag.touch()

    t0 = time.monotonic()
    tid = _submit_on_p1(home, flag, idempotent=True)
    (t,) = wait_all(home, [tid], timeout=SLOW - 10)
    took = time.monotonic() - t0
    assert t["state"] == "succeeded" and t["exit_code"] == 0, t
    assert t["node"] in ("p2", "p3"), t["node"]  # the result is the backup's
    assert took < SLOW / 2, took
    finals = [h for h in t["history"] if h["dst"] in ("succeeded", "failed", "cancelled")]
    assert len(finals) == 1 and "finished first on" in finals[0]["cause"], t["history"]

    # the backup is a record of its own, linked to the original, and it succeeded
    ps = json.loads(home.cli("ps", "--all", "--limit", "1000", "--json").stdout)
    (b,) = [x for x in ps if x["spec"].get("backup_of") == tid]
    assert b["state"] == "succeeded" and b["node"] == t["node"], b
    assert finals[0]["cause"].startswith(f"backup {b['spec']['id']} finished first")

    # both attempts are in swarm explain
    why = home.cli("explain", tid).stdout
    assert f"backup {b['spec']['id']} started" in why, why
    assert "finished first" in why, why
    assert f"backup of {tid}" in home.cli("explain", b["spec"]["id"]).stdout

    # its output is the backup's (swarm logs, and so an Executor's result)
    assert home.cli("logs", tid).stdout.strip() == f"ran on {t['node']}"

    # the straggler on p1 was killed, not left to run its 30 s
    deadline = time.monotonic() + 10
    while _slow_sleeps(flag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _slow_sleeps(flag)


def test_a_task_not_marked_idempotent_is_never_backed_up(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    per_node = {1: ["--labels", "slow=yes"], 2: ["--labels", "slow=no"]}
    agents = cluster(make_agent, 2, *BACKUPS, per_node=per_node)
    home = agents[0]
    flag = tmp_path / "p1-is-slow"
    _history(home, flag)
    flag.touch()
    tid = _submit_on_p1(home, flag, idempotent=False)
    time.sleep(4)  # well past the class's 0.5 s: an idempotent task would have a backup
    ps = json.loads(home.cli("ps", "--all", "--limit", "1000", "--json").stdout)
    assert not [x for x in ps if x["spec"].get("backup_of")], ps
    with home.client() as c:
        assert c.status(tid)["state"] == "running"
        c.cancel(tid)
    assert "backup" not in home.cli("explain", tid).stdout


def slow_on_p1(flag: str) -> str:
    """A pure call for the Executor: 0.5 s anywhere, SLOW s on p1 once `flag` exists."""
    node = os.environ.get("SWARM_NODE", "?")
    if node == "p1" and os.path.exists(flag):
        time.sleep(SLOW)
    time.sleep(0.5)
    return node


def test_an_executor_call_marked_idempotent_returns_the_winning_backups_result(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    """`Executor(idempotent=True)`: the call that lands on the slow node gets a backup
    elsewhere, and the future's result is the backup's (read from the winning copy)."""
    from swarm import Executor

    per_node = {1: ["--labels", "slow=yes"], 2: ["--labels", "slow=no"]}
    per_node[3] = ["--labels", "slow=no"]
    agents = cluster(make_agent, 3, *BACKUPS, per_node=per_node)
    home = agents[0]
    flag = tmp_path / "p1-is-slow"
    opts = {"idempotent": True, "name": "pycall", "prefer": ["slow=yes"]}
    with Executor(str(home.socket), **opts) as ex:
        for _ in range(5):  # the class's history, one at a time so that p1 runs them
            assert ex.submit(slow_on_p1, str(flag)).result(timeout=60) == "p1"
        flag.touch()
        t0 = time.monotonic()
        f = ex.submit(slow_on_p1, str(flag))
        tid = ex._calls[f]
        node = f.result(timeout=SLOW - 10)
        took = time.monotonic() - t0
    assert node in ("p2", "p3") and took < SLOW / 2, (node, took)
    ps = json.loads(home.cli("ps", "--all", "--limit", "1000", "--json").stdout)
    (b,) = [x for x in ps if x["spec"].get("backup_of") == tid]
    assert b["state"] == "succeeded" and b["node"] == node, b
    deadline = time.monotonic() + 10
    while _slow_py(flag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _slow_py(flag)


def _slow_py(flag: Path) -> list[psutil.Process]:
    """The slow node's python still running the straggling call."""
    out = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            env = p.info["environ"] or {}
        except (psutil.Error, KeyError):
            continue
        cmd = " ".join(p.info["cmdline"] or ())
        if "swarm.pyrun" in cmd and env.get("SWARM_NODE") == "p1":
            out.append(p)
    return out
