"""Migration of running tasks between real agents on loopback.

Overload is real but cheap: a node with many slots runs dozens of `sleep` tasks, so
its running-task count per core (the policy's slowdown) is high while an idle peer's
is low. The checkpointing program (tests/programs/ckpt_sum.py) computes a known sum
in blocks, checkpoints on SIGUSR1 and resumes from its state, so a correct result
after a move shows the state went along. The local profile makes the decision loop
run every 0.5 s.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from swarm.localcluster import LocalAgent
from swarm.runtime import criu as criu_rt
from tests.conftest import AgentFactory
from tests.integration.test_cluster import LOOP, all_see, wait_for

PROGRAMS = Path(__file__).parents[1] / "programs"
CKPT = str(PROGRAMS / "ckpt_sum.py")
N = 3_000_000  # 150 blocks
SLEEP = 0.1  # per block: ~15 s of run time, light on a shared machine


def expected(n: int = N) -> int:
    return ((n - 1) * n * (2 * n - 1) // 6) % ((1 << 61) - 1)


def ckpt_argv(tag: str, *extra: str, n: int = N, sleep: float = SLEEP) -> list[str]:
    return [sys.executable, CKPT, "--n", str(n), "--sleep", str(sleep), "--tag", tag, *extra]


def overload(a: LocalAgent, count: int = 40) -> list[str]:
    """`count` long sleeps running on `a` (its slowdown becomes count / cores)."""
    with a.client() as c:
        ids = [c.submit(["sleep", "300"], cwd="/") for _ in range(count)]
    wait_for(lambda: running_count(a) >= count, 60, f"{count} load tasks running on {a.name}")
    return ids


def running_count(a: LocalAgent) -> int:
    with a.client() as c:
        return int(c.info()["running"])


def status(a: LocalAgent, tid: str) -> dict[str, Any]:
    with a.client() as c:
        return c.call("status", id=tid)


def explain(a: LocalAgent, tid: str) -> list[dict[str, Any]]:
    with a.client() as c:
        return list(c.call("explain", id=tid)["decisions"])


def wait_done(a: LocalAgent, tid: str, timeout: float = 180) -> dict[str, Any]:
    with a.client(timeout=timeout + 10) as c:
        r = c.call("wait", id=tid, timeout=timeout)
    assert not r["timed_out"], r["task"]
    return dict(r["task"])


def result_line(a: LocalAgent, tid: str) -> str:
    out = a.cli("logs", tid).stdout
    lines = [x for x in out.splitlines() if x.startswith("result=")]
    assert len(lines) == 1, out
    return lines[0]


def join(make_agent: AgentFactory, name: str, seed: LocalAgent, *extra: str) -> LocalAgent:
    a = make_agent(name, *LOOP, "--slots", "64", "--seeds", f"127.0.0.1:{seed.port}", *extra)
    wait_for(lambda: all_see([seed, a], {seed.name, a.name}), 60, f"{name} to join")
    return a


def kill_tasks(ids: list[str]) -> None:
    """Kill task processes left behind by a SIGKILLed agent (found by SWARM_TASK_ID)."""
    wanted = set(ids)
    for p in psutil.process_iter():
        try:
            if p.environ().get("SWARM_TASK_ID") in wanted:
                p.kill()
        except (psutil.Error, OSError):
            continue


def tagged(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        # a task's supervisor (swarm-shim) carries its command line: not a copy
        if cmd and "swarm-shim" in os.path.basename(cmd[0]):
            continue
        if "--tag" in cmd and tag in cmd and CKPT in cmd:
            out.append(p)
    return out


def log_has(a: LocalAgent, text: str) -> bool:
    return text in a.log_text()


def diag(tid: str, *agents: LocalAgent) -> str:
    """What the agents said about migrations and the task (for failure messages)."""
    out = []
    for a in agents:
        lines = [x for x in a.log_text().splitlines() if "migration" in x or tid in x]
        out.append(f"--- {a.name}\n" + "\n".join(lines[-40:]))
    return "\n".join(out)


# ------------------------------------------------------------------ checkpoint


def test_checkpointing_task_moves_to_an_idle_node_and_resumes(make_agent: AgentFactory) -> None:
    p1 = make_agent("p1", *LOOP, "--slots", "64")
    overload(p1)
    with p1.client() as c:
        tid = c.submit(ckpt_argv("move"), cwd="/", migrate="checkpoint", expected_runtime=60.0)
    wait_for(lambda: status(p1, tid)["task"]["state"] == "running", 30, "the task to start")
    p2 = join(make_agent, "p2", p1)
    t = wait_done(p1, tid)
    assert t["state"] == "succeeded" and t["node"] == p2.name, t
    line = result_line(p1, tid)  # the home proxies the log from where it ran last
    assert line.startswith(f"result={expected()} runs=2 nodes=p1,p2"), line
    out = p1.cli("logs", tid).stdout
    resumed_at = int(out.split("from i=")[1].split()[0])
    assert 0 < resumed_at < N, out  # it continued from its checkpoint, not from 0
    # the home's record: RUNNING -> MIGRATING -> QUEUED(p2) -> RUNNING(p2) -> SUCCEEDED
    path = [(h["dst"], h["node"]) for h in t["history"]]
    i = path.index(("migrating", "p1"))
    assert path[i + 1 : i + 4] == [("queued", "p2"), ("running", "p2"), ("succeeded", "p2")]
    # swarm status lists the migration with its measured costs
    (mg,) = status(p1, tid)["migrations"]
    assert mg["from"] == "p1" and mg["to"] == "p2" and mg["mode"] == "checkpoint"
    assert mg["outcome"] == "moved" and mg["resumed_on"] == "p2"
    assert mg["bytes"] > 0 and mg["pause_s"] >= 0 and "gain" in mg["reason"]
    text = p1.cli("status", tid).stdout
    assert "migrations:" in text and "p1 -> p2" in text and "moved" in text
    # swarm explain shows the decision with its figures
    codes = [d.get("code") for d in explain(p1, tid) if d.get("kind") == "migration"]
    assert "migrate" in codes, codes
    ex = p1.cli("explain", tid).stdout
    assert "migration migrate" in ex and "slowdown" in ex
    # counters on both ends
    with p1.client() as c:
        mig1 = c.info()["migration"]
    with p2.client() as c:
        mig2 = c.info()["migration"]
    assert mig1["outcome:moved"] == 1 and mig1["bytes_sent"] > 0
    assert mig2["bytes_received"] == mig1["bytes_sent"] and mig2["resumed"] == 1
    # the source no longer keeps the state; the target has it
    assert not (p1.state_dir / "task-state" / tid).exists()


def test_huge_state_on_a_slow_link_stays(make_agent: AgentFactory) -> None:
    slow = ["--bandwidth", "1000"]  # bytes/s: 2 MB of state would take 2000 s to move
    p1 = make_agent("p1", *LOOP, "--slots", "64", *slow)
    overload(p1)
    with p1.client() as c:
        tid = c.submit(
            # cancelled at the end: a 45 s run costs nothing and outlasts a loaded
            # machine's slow join of p2, which a 15 s run may not
            ckpt_argv("big", "--state-bytes", str(2_000_000), sleep=3 * SLEEP),
            cwd="/",
            migrate="checkpoint",
            expected_runtime=60.0,
        )
    wait_for(lambda: status(p1, tid)["task"]["state"] == "running", 30, "the task to start")
    join(make_agent, "p2", p1, *slow)

    def judged() -> bool:
        return any(
            d.get("code") == "not-worth-it" and d.get("target") == "p2" for d in explain(p1, tid)
        )

    wait_for(judged, 30, "a not-worth-it decision against p2")
    time.sleep(2)  # a few more rounds
    st = status(p1, tid)
    assert st["task"]["state"] == "running" and st["task"]["node"] == "p1"
    assert st["migrations"] == []
    d = next(d for d in explain(p1, tid) if d.get("code") == "not-worth-it")
    assert d["figures"]["transfer"] >= 1999 and d["cost"] > d["gain"] / d["margin"]
    with p1.client() as c:
        c.cancel(tid)


def test_dry_run_only_records_what_it_would_do(make_agent: AgentFactory) -> None:
    p1 = make_agent("p1", *LOOP, "--slots", "64", "--migration", "dry-run")
    overload(p1)
    with p1.client() as c:
        # cancelled at the end: 45 s of run outlasts a loaded machine's slow join of p2
        # (with 15 s, no decision came within 30 s in a four-lane trial, stop 39)
        tid = c.submit(
            ckpt_argv("dry", sleep=3 * SLEEP), cwd="/", migrate="checkpoint", expected_runtime=60.0
        )
    wait_for(lambda: status(p1, tid)["task"]["state"] == "running", 30, "the task to start")
    join(make_agent, "p2", p1)
    wait_for(
        lambda: any(d.get("code") == "dry-run" for d in explain(p1, tid)),
        30,
        "a dry-run decision",
    )
    time.sleep(1.5)
    st = status(p1, tid)
    assert st["task"]["state"] == "running" and st["task"]["node"] == "p1"
    assert st["migrations"] == []
    with p1.client() as c:
        info = c.info()["migration"]
        c.cancel(tid)
    assert info["decision:dry-run"] >= 1 and info.get("started", 0) == 0


def test_restart_mode_kills_and_starts_again_elsewhere(make_agent: AgentFactory) -> None:
    p1 = make_agent("p1", *LOOP, "--slots", "64")
    overload(p1)
    with p1.client() as c:
        tid = c.submit(ckpt_argv("restart"), cwd="/", migrate="restart", expected_runtime=60.0)
    wait_for(lambda: status(p1, tid)["task"]["state"] == "running", 30, "the task to start")
    join(make_agent, "p2", p1)
    t = wait_done(p1, tid)
    assert t["state"] == "succeeded" and t["node"] == "p2"
    # no state travels with a restart: it computed everything again, once, on p2
    assert result_line(p1, tid).startswith(f"result={expected()} runs=1 nodes=p2")
    causes = [h["cause"] for h in t["history"]]
    assert "stopped for migration (restart)" in causes
    (mg,) = status(p1, tid)["migrations"]
    assert mg["outcome"] == "moved" and mg["mode"] == "restart"


# ------------------------------------------------------------------ failures


def test_target_killed_mid_transfer_the_task_restarts_on_the_source(
    make_agent: AgentFactory,
) -> None:
    p1 = make_agent("p1", *LOOP, "--slots", "64")
    overload(p1)
    with p1.client() as c:
        tid = c.submit(
            # 64 MB of state; a checkpoint that takes a second: time to stop the target
            ckpt_argv("cut", "--state-bytes", str(64 << 20), "--ckpt-delay", "1.0"),
            cwd="/",
            migrate="checkpoint",
            expected_runtime=60.0,
        )
    wait_for(lambda: status(p1, tid)["task"]["state"] == "running", 30, "the task to start")
    p2 = join(make_agent, "p2", p1)
    wait_for(lambda: log_has(p2, "event=migration.prepared"), 60, "the target to prepare")
    p2.kill(signal.SIGSTOP)  # the stream now stalls at the target ...
    wait_for(lambda: log_has(p1, "event=migration.streaming"), 30, "the stream to start")
    time.sleep(0.5)
    p2.kill(signal.SIGKILL)  # ... and the target dies in the middle of it
    t = wait_done(p1, tid)
    assert t["state"] == "succeeded" and t["node"] == "p1", t
    line = result_line(p1, tid)
    assert line.startswith(f"result={expected()} runs=2 nodes=p1,p1"), line
    out = p1.cli("logs", tid).stdout
    assert int(out.split("run 2 on p1 from i=")[1].split()[0]) > 0  # from its checkpoint
    migs = status(p1, tid)["migrations"]
    assert migs and migs[0]["outcome"] == "failed" and migs[0]["to"] == "p2"
    assert migs[0]["detail"].startswith("transfer:"), migs[0]
    assert all(m["outcome"] != "moved" for m in migs)
    finals = [h for h in t["history"] if h["dst"] in ("succeeded", "failed", "cancelled")]
    assert len(finals) == 1


def test_source_dies_after_the_target_restored_it_exactly_one_copy_runs(
    make_agent: AgentFactory,
) -> None:
    # p3 is the home (drained: it runs nothing), p1 the loaded source, p2 the target
    p3 = make_agent("p3", *LOOP, "--slots", "64")
    assert "drained" in p3.cli("drain").stdout
    p1 = join(make_agent, "p1", p3)
    load = overload(p1)
    try:
        with p3.client() as c:
            tid = c.submit(ckpt_argv("one"), cwd="/", migrate="checkpoint", expected_runtime=60.0)
        wait_for(
            lambda: (
                status(p3, tid)["task"]["node"] == "p1"
                and status(p3, tid)["task"]["state"] == "running"
            ),
            30,
            "the task to run on p1",
        )
        p2 = join(make_agent, "p2", p3)

        def resumed_on_p2() -> bool:
            # the source's part of the record (its "from") reaches the home on its own,
            # apart from the target's: killed before it lands, it never does
            st = status(p3, tid)
            return st["task"]["node"] == "p2" and any(
                m.get("resumed_on") == "p2" and m.get("from") == "p1" for m in st["migrations"]
            )

        try:
            wait_for(resumed_on_p2, 60, "the task to resume on p2")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{status(p3, tid)}\n{diag(tid, p3, p2, p1)}") from None
        p1.kill(signal.SIGKILL)
        for _ in range(40):  # 8 s: the source's death must not bring back a second copy
            copies = tagged("one")
            assert len(copies) <= 1, [p.cmdline() for p in copies]
            time.sleep(0.2)
        t = wait_done(p3, tid)
        why = diag(tid, p3, p2, p1)
        assert t["state"] == "succeeded" and t["node"] == "p2", (t, why)
        line = result_line(p3, tid)
        assert line.startswith(f"result={expected()} runs=2 nodes=p1,p2"), (line, why)
        migs = status(p3, tid)["migrations"]
        assert len(migs) == 1, (migs, why)
        mg = migs[0]
        assert mg["from"] == "p1" and mg["outcome"] == "moved" and mg["pause_s"] >= 0
        history = [(h["dst"], h["node"]) for h in t["history"]]
        assert ("migrating", "p1") in history, (history, why)
        assert history.count(("running", "p2")) == 1, (history, why)
        assert p2.alive()
    finally:
        kill_tasks(load)


# ------------------------------------------------------------------ CRIU


def fake_criu_path(d: Path) -> str:
    exe = d / "criu"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {PROGRAMS / "fake_criu.py"} "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return f"{d}:{os.environ['PATH']}"


def criu_move(make_agent: AgentFactory) -> tuple[LocalAgent, LocalAgent, str]:
    p1 = make_agent("p1", *LOOP, "--slots", "64")
    overload(p1)
    nodes = json.loads(p1.cli("nodes", "--json").stdout)
    assert nodes[0]["load"]["criu"] is True, "the agent did not find a working CRIU"
    with p1.client() as c:
        tid = c.submit(ckpt_argv("criu"), cwd="/", migrate="criu", expected_runtime=60.0)
    wait_for(lambda: status(p1, tid)["task"]["state"] == "running", 30, "the task to start")
    p2 = join(make_agent, "p2", p1)
    return p1, p2, tid


@pytest.mark.skipif(os.geteuid() != 0, reason="CRIU (and its stand-in) need the agent as root")
def test_criu_path_with_a_stand_in_for_criu(
    make_agent: AgentFactory, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole CRIU path (detection, dump into the state dir, streaming the image,
    the restore helper on the target, exit status) with tests/programs/fake_criu.py,
    which restarts the program instead of restoring its memory."""
    bindir = short_tmp / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", fake_criu_path(bindir))
    p1, _p2, tid = criu_move(make_agent)
    t = wait_done(p1, tid)
    assert t["state"] == "succeeded" and t["node"] == "p2", t
    assert "dumped by CRIU for migration" in [h["cause"] for h in t["history"]]
    (mg,) = status(p1, tid)["migrations"]
    assert mg["mode"] == "criu" and mg["outcome"] == "moved" and mg["bytes"] > 0
    # the stand-in "restored" the program from its command line: a fresh run, on p2
    assert result_line(p1, tid).startswith(f"result={expected()} runs=1")


def test_criu_with_a_working_criu(make_agent: AgentFactory) -> None:
    found = trio.run(criu_rt.detect)
    if not found.ok:
        pytest.skip(f"no working CRIU on this host: {found.reason}")
    p1, _p2, tid = criu_move(make_agent)
    t = wait_done(p1, tid)
    assert t["state"] == "succeeded" and t["node"] == "p2", t
    # restored, not restarted: one run, which went on where it was
    assert result_line(p1, tid).startswith(f"result={expected()} runs=1 nodes=p1")


def test_a_task_requeued_by_a_restart_resumes_where_its_state_is(
    make_agent: AgentFactory,
) -> None:
    """The node's state machine learns where a task's state is when the task comes to
    be queued (here: the agent stops, the task is re-queued, the agent starts again):
    placement keeps it here, by that knowledge, not by reading the disk itself."""
    p1 = make_agent("p1", *LOOP, "--slots", "64")
    with p1.client() as c:
        tid = c.submit(ckpt_argv("requeue", "--state-bytes", "4096"), cwd="/", migrate="checkpoint")
    wait_for(lambda: status(p1, tid)["task"]["state"] == "running", 30, "the task to start")
    join(make_agent, "p2", p1)  # an idle peer: two choices could pick it
    time.sleep(1.0)  # its state file is written at start
    p1.stop()
    p1.start()
    t = wait_done(p1, tid)
    assert t["state"] == "succeeded" and t["node"] == "p1", t
    outcomes = [str(d.get("outcome", "")) for d in explain(p1, tid)]
    assert "runs here: its checkpoint is here" in outcomes, outcomes
