"""Retention (keep-finished): old finished tasks are forgotten, nothing else is."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
import trio

from swarm import model as m
from swarm.config import ConfigError, load_config
from swarm.options import parse_duration
from swarm.runtime.journal import Event, Journal, PutTask
from swarm.runtime.retention import BATCH, Retention, pass_interval
from swarm.runtime.tasks import TaskTable
from tests.conftest import AgentFactory
from tests.integration.test_cluster import LOOP, all_see, wait_for

S = m.TaskState
DAY = 86400.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("90", 90.0), ("30s", 30.0), ("15m", 900.0), ("12h", 43200.0),
     ("7d", 7 * DAY), ("2w", 14 * DAY), (" 1.5H ", 5400.0)],
)  # fmt: skip
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "d", "-1d", "7y", "nan", "inf", "seven days"])
def test_bad_durations_name_the_option(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)
    with pytest.raises(ConfigError, match="keep-finished: must be a duration"):
        load_config(env={"SWARM_KEEP_FINISHED": text}, uid=0)


def test_pass_interval_is_a_tenth_within_bounds() -> None:
    assert pass_interval(2.0) == 1.0 and pass_interval(100.0) == 10.0
    assert pass_interval(7 * DAY) == 600.0


def _finished(tid: str, at: float, dst: S = S.SUCCEEDED) -> m.Task:
    t = m.new_task(m.TaskSpec(id=tid, argv=("true",), home="n1", cwd="/"), at - 2, "n1")
    t = m.transition(t, S.RUNNING, at - 1, "started")
    return m.transition(t, dst, at, "exited 0" if dst is S.SUCCEEDED else "failed")


async def test_prune_forgets_old_finished_tasks_and_their_logs_only(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.db", node="n1")
    table = TaskTable(journal, "n1")
    logs = tmp_path / "logs"
    logs.mkdir()
    now = time.time()
    old = [_finished(f"old{i}", now - 2 * DAY) for i in range(BATCH + 5)]  # two batches
    fresh = _finished("fresh", now - 60)
    needed = _finished("needed", now - 2 * DAY, S.FAILED)  # e.g. its home has not acked
    queued = m.new_task(m.TaskSpec(id="queued", argv=("true",), home="n1"), now - 3 * DAY, "n1")
    every = [*old, fresh, needed, queued]

    def log_paths(tid: m.TaskId) -> tuple[Path, Path]:
        return logs / f"{tid}.out", logs / f"{tid}.err"

    for t in every:
        for p in log_paths(t.id):
            p.write_text("output\n")
    ret = Retention(DAY, journal, table, log_paths, lambda tid: tid == "needed")
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await journal.commit([PutTask(t) for t in every])
        await journal.commit([Event(now, "decision", "old0", "n1", {"x": 1})])
        table.load([queued, fresh])
        table.finished["old1"] = old[1]  # a cached copy goes too

        assert await ret.prune(now) == len(old)
        assert await ret.prune(now) == 0  # idempotent
        nursery.cancel_scope.cancel()

    assert ret.forgotten == len(old) and ret.log_files_removed == 2 * len(old)
    assert "old1" not in table.finished
    for t in old:
        assert await journal.get_task(t.id) is None
        assert not any(p.exists() for p in log_paths(t.id))
    assert await journal.events_for("old0", "decision") == []
    for t in (fresh, needed, queued):
        got = await journal.get_task(t.id)
        assert got is not None and got.state is t.state
        assert all(p.exists() for p in log_paths(t.id))


def test_an_agent_forgets_finished_tasks_after_keep_finished(make_agent: AgentFactory) -> None:
    a = make_agent("r1", "--keep-finished", "2s")
    done = a.cli("submit", "--wait", "--", "sh", "-c", "echo kept-for-a-while")
    assert done.returncode == 0, done.stderr
    tid = done.stdout.strip()
    assert a.cli("logs", tid).stdout == "kept-for-a-while\n"
    out, err = (a.state_dir / "logs" / f"{tid}.out", a.state_dir / "logs" / f"{tid}.err")
    assert out.exists() and err.exists()
    running = a.cli("submit", "--", "sleep", "60").stdout.strip()

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and a.cli("status", tid).returncode == 0:
        time.sleep(0.25)
    gone = a.cli("status", tid)
    assert gone.returncode == 1 and "no task" in gone.stderr.lower() + gone.stdout.lower()
    assert not out.exists() and not err.exists()
    st = json.loads(a.cli("status", "--json", running).stdout)
    assert st["state"] == "running"  # a task that has not finished is never forgotten
    info = json.loads(a.cli("info").stdout)
    assert info["retention"]["forgotten"] >= 1 and info["retention"]["keep_finished_s"] == 2.0
    assert "event=retention.forgot" in a.log_text()


def test_a_task_run_elsewhere_is_forgotten_at_its_home_and_where_it_ran(
    make_agent: AgentFactory,
) -> None:
    # 8 s at the runner: the logs are read after `submit --wait` and a `status` (two CLI
    # runs). With 3 s one make test (three pytest lanes on two cores, stop 42) read them
    # empty: the runner had forgotten them already (now `logs` would say so)
    # The home keeps it twice as long: between the two, its logs are asked for where
    # they are gone (`swarm logs` says so, exit 1, rather than print nothing, exit 0).
    home = make_agent("rh", *LOOP, "--keep-finished", "16s")
    peer = make_agent("rp", *LOOP, "--keep-finished", "8s", "--seeds", f"127.0.0.1:{home.port}")
    wait_for(lambda: all_see([home, peer], {"rh", "rp"}), 60, "two agents to converge")
    assert "drained" in home.cli("drain").stdout  # the only other place is rp
    done = home.cli("submit", "--wait", "--", "sh", "-c", "echo ran-elsewhere")
    assert done.returncode == 0, done.stderr
    tid = done.stdout.strip()
    assert json.loads(home.cli("status", "--json", tid).stdout)["node"] == "rp"
    assert home.cli("logs", tid).stdout == "ran-elsewhere\n"  # streamed from rp
    ran = peer.state_dir / "logs" / f"{tid}.out"
    assert ran.exists()

    wait_for(lambda: not ran.exists(), 30, "rp to forget it and its logs")
    gone = home.cli("logs", tid)
    assert home.cli("status", tid).returncode == 0, "the home forgot it too early for this check"
    assert (gone.returncode, gone.stdout) == (1, ""), gone
    assert gone.stderr.strip() == (
        f"swarm: the stdout of {tid} is no longer kept where it ran"
        " (removed with its record after keep-finished, or cleaned up)"
    )
    wait_for(lambda: home.cli("status", tid).returncode == 1, 30, "the home to forget it")
    # the home's settled handoff state went with it (kept only for late revokes)
    db = sqlite3.connect(f"file:{home.state_dir / 'journal.db'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT count(*) FROM kv WHERE key=?", ("home:" + tid,)).fetchone()
    finally:
        db.close()
    assert rows == (0,)
