"""Tasks outlive their agent (issue 19): each runs under its supervisor (swarm-shim),
so a `kill -9` of the agent neither kills running tasks nor, after a restart, runs
again those that ended while it was down. Real agent, real processes; the tasks'
own side effects are the evidence, not the agent's bookkeeping."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest

from swarm.localcluster import LocalAgent
from tests.conftest import AgentFactory

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler for swarm-shim")


def _wait(pred, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _status(a: LocalAgent, tid: str) -> dict:  # type: ignore[type-arg]
    with a.client(timeout=30) as c:
        return c.status(tid)


def _lines(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


def _restart(a: LocalAgent) -> None:
    a.kill(signal.SIGKILL)
    a.start()


def test_kill_9_neither_kills_running_tasks_nor_reruns_ended_ones(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    a = make_agent("a1", "--slots", "8")
    marks = tmp_path / "marks"
    marks.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(marks, 0o777)
    # short tasks: each appends its id once, ends while the agent is down; long enough
    # to be still running once the long task has started (with 1.5 s, under make test's
    # load, one ended before the test saw them all running, and it waited for ever)
    short = [
        a.cli(
            "submit", "--", "sh", "-c", f'sleep 4; echo "$SWARM_TASK_ID" >> {marks}/short'
        ).stdout.strip()
        for _ in range(5)
    ]
    # a long one: its pid, then a line a second on stdout
    pidfile = marks / "long.pid"
    long_id = a.cli(
        "submit",
        "--",
        "sh",
        "-c",
        f"echo $$ > {pidfile}; i=0; while true; do i=$((i+1)); echo tick$i; sleep 0.2; done",
    ).stdout.strip()
    _wait(lambda: pidfile.exists() and pidfile.read_text().strip() != "", 20, "the long task")
    _wait(lambda: all(_status(a, t)["state"] == "running" for t in short), 20, "short tasks run")
    pid = int(pidfile.read_text())
    a.kill(signal.SIGKILL)
    # the agent is gone; its tasks are not
    assert psutil.pid_exists(pid)
    _wait(
        lambda: (marks / "short").exists() and len((marks / "short").read_text().split()) == 5,
        20,
        "the short tasks to end while the agent is down",
    )
    a.start()
    for t in short:
        with a.client(timeout=60) as c:
            done = c.wait(t, timeout=60)
        assert done["state"] == "succeeded", done
        assert done["attempts"] == 1
    # each ran exactly once (their own side effect), though none ended with the agent up
    assert sorted((marks / "short").read_text().split()) == sorted(short)
    # the long one was re-attached: same process, still running, logs still growing
    st = _status(a, long_id)
    assert st["state"] == "running" and st["attempts"] == 1
    assert psutil.pid_exists(pid) and int(pidfile.read_text()) == pid
    before = a.cli("logs", long_id).stdout.count("tick")
    _wait(lambda: a.cli("logs", long_id).stdout.count("tick") > before + 2, 20, "more log lines")
    # and cancel still reaches it
    assert a.cli("cancel", long_id).returncode == 0
    with a.client(timeout=60) as c:
        end = c.wait(long_id, timeout=60)
    assert end["state"] == "cancelled"
    _wait(
        lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie",
        20,
        "the long task's process to end",
    )


def test_a_second_restart_and_a_stop(make_agent: AgentFactory, tmp_path: Path) -> None:
    """Re-attached twice, then a plain stop (SIGTERM, not a systemd restart) ends it and
    it is queued to run again, as a stop always did."""
    a = make_agent("a1", "--slots", "2")
    pidfile = tmp_path / "pid"
    os.chmod(tmp_path, 0o777)
    tid = a.cli("submit", "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 60").stdout.strip()
    _wait(lambda: pidfile.exists() and pidfile.read_text().strip() != "", 20, "the task")
    pid = int(pidfile.read_text())
    for _ in range(2):
        _restart(a)
        st = _status(a, tid)
        assert st["state"] == "running" and st["attempts"] == 1
        assert psutil.pid_exists(pid)
    a.stop(timeout=30)
    _wait(
        lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie",
        20,
        "a stop to end the task",
    )


def test_kill_9_under_200_running_tasks(make_agent: AgentFactory, tmp_path: Path) -> None:
    """Issue 19's figure: 200 short tasks running, the agent killed with SIGKILL and
    restarted while some still run and others have ended: every one succeeds once,
    by its own side effect, with attempts 1; none is lost, none runs twice."""
    n = 200
    a = make_agent("a1", "--slots", str(n))
    marks = tmp_path / "marks"
    marks.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(marks, 0o777)
    go = marks / "go"
    # each waits for the go file (so all 200 run at once), then 0-2 s, then marks itself
    script = (
        f"while [ ! -e {go} ]; do sleep 0.05; done; "
        'sleep "0.$((RANDOM % 10))"; sleep "$((RANDOM % 2))"; '
        f'echo "$SWARM_TASK_ID" >> {marks}/done'
    )
    with a.client(timeout=60) as c:
        ids = [c.submit(["bash", "-c", script]) for _ in range(n)]
    _wait(
        lambda: sum(1 for t in ids if _status(a, t)["state"] == "running") == n,
        120,
        "all 200 to run",
    )
    go.touch()
    time.sleep(0.8)  # some end before the kill, most while the agent is down or after
    a.kill(signal.SIGKILL)
    at_kill = _lines(marks / "done")
    time.sleep(0.5)
    a.start()
    at_restart = _lines(marks / "done")
    print(
        f"ended before the kill {at_kill}, while down {at_restart - at_kill},"
        f" after {n - at_restart}"
    )
    with a.client(timeout=120) as c:
        ends = [c.wait(t, timeout=120) for t in ids]
    assert [e["state"] for e in ends] == ["succeeded"] * n
    assert all(e["attempts"] == 1 for e in ends)
    done = (marks / "done").read_text().split()
    assert sorted(done) == sorted(ids)  # each exactly once: none lost, none twice


def test_status_directories_are_reused_and_a_restart_keeps_only_those_in_use(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    """One directory serves task after task (runtime/statusdirs.py), not one per task
    kept for a week; after a kill -9 the running task's stays (its shim writes there)
    and a directory no journaled row names goes."""
    a = make_agent("a1", "--slots", "1")
    shim_root = a.state_dir / "shim"
    with a.client(timeout=60) as c:
        ids = [c.submit(["true"], cwd="/") for _ in range(6)]
        assert all(c.wait(t, timeout=60)["state"] == "succeeded" for t in ids)
        info = c.info()
    assert info["status_dirs"]["reused"] >= 4, info["status_dirs"]
    assert len(list(shim_root.iterdir())) <= 2

    # given back emptied: no exit file to misread. A wait can answer while the last
    # end is still being written (it reads the record in memory); the directory goes
    # back only once that write is on disk, so allow for the write.
    def left_files() -> list[Path]:
        return [f for d in shim_root.iterdir() for f in d.iterdir()]

    end = time.monotonic() + 10
    while left_files() and time.monotonic() < end:
        time.sleep(0.05)
    with a.client(timeout=60) as c:
        assert left_files() == [], c.info()["status_dirs"]
    pidfile = tmp_path / "pid"
    os.chmod(tmp_path, 0o777)
    tid = a.cli("submit", "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 60").stdout.strip()
    _wait(lambda: pidfile.exists() and pidfile.read_text().strip() != "", 20, "the task")
    a.kill(signal.SIGKILL)
    stray = shim_root / "_left-by-a-crash"
    stray.mkdir()
    (stray / "exit").write_text("pid 1\nexit 0\n")
    a.start()
    # the pool's free directories and the stray went; the running task's stayed
    (left,) = list(shim_root.iterdir())
    st = _status(a, tid)
    assert st["state"] == "running" and st["attempts"] == 1
    assert a.cli("cancel", tid).returncode == 0
    with a.client(timeout=60) as c:
        assert c.wait(tid, timeout=60)["state"] == "cancelled"
    assert (left / "exit").exists()  # its shim wrote its end there
