"""An end made where nothing can await (a gang member's refused start, a member found
at start-up, recovery's --no-retry failures) is answered to a wait only once it is on
disk, as every other end: what a wait reports survives a crash of the agent."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from swarm import model as m
from swarm.runtime.journal import Journal, PutTask
from swarm.runtime.tasks import TaskTable


def _spec(tid: str) -> m.TaskSpec:
    return m.TaskSpec(id=tid, argv=("true",), home="n1", cwd="/")


def _state_on_disk(path: Path, tid: str) -> str | None:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:
        row = c.execute("SELECT state FROM tasks WHERE id=?", (tid,)).fetchone()
    return None if row is None else str(row[0])


async def test_end_now_changes_the_record_at_once_and_answers_once_written(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "journal.db", node="n1")
    table = TaskTable(journal, "n1")
    hold = trio.Event()
    real_commit = journal.commit

    async def held_commit(ops: Any, **kw: Any) -> None:
        if any(isinstance(op, PutTask) and op.task.state.terminal for op in ops):
            await hold.wait()
        await real_commit(ops, **kw)

    journal.commit = held_commit  # type: ignore[method-assign]
    answered: list[m.Task] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await table.add(m.new_task(_spec("t1"), time.time(), "n1"))

        def spawn(fn: Callable[[], Awaitable[None]]) -> None:
            nursery.start_soon(fn)

        ended = table.end_now("t1", m.TaskState.FAILED, "cannot start: refused", spawn)
        # in memory at once: nothing may start it meanwhile
        assert ended.state is m.TaskState.FAILED
        cached = table.get_cached("t1")
        assert cached is not None and cached.state is m.TaskState.FAILED

        async def wait() -> None:
            answered.append(await table.wait_terminal("t1"))

        nursery.start_soon(wait)
        await trio.sleep(0.2)
        assert answered == []  # not from memory while the write is held
        assert _state_on_disk(journal.path, "t1") == "queued"
        hold.set()
        with trio.fail_after(10):
            while not answered:
                await trio.sleep(0.01)
        assert _state_on_disk(journal.path, "t1") == "failed"
        nursery.cancel_scope.cancel()
    assert answered[0].state is m.TaskState.FAILED
    assert answered[0].history[-1].cause == "cannot start: refused"


async def test_an_empty_commit_returns_once_what_was_enqueued_before_is_on_disk(
    tmp_path: Path,
) -> None:
    """The agent's barrier before it answers anyone (agent.py): recovery enqueues its
    ends (a --no-retry task whose agent restarted) before the journal runs."""
    journal = Journal(tmp_path / "journal.db", node="n1")
    table = TaskTable(journal, "n1")
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await table.add(m.new_task(_spec("t1"), time.time(), "n1"))
        nursery.cancel_scope.cancel()
    journal = Journal(tmp_path / "journal.db", node="n1")
    table = TaskTable(journal, "n1")
    table.load(journal.recover().active)
    table.change("t1", m.TaskState.FAILED, "agent restarted while task was running")
    assert _state_on_disk(journal.path, "t1") == "queued"  # enqueued only
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await journal.commit([], must_land=True)
        assert _state_on_disk(journal.path, "t1") == "failed"
        nursery.cancel_scope.cancel()
