"""The runner starts a task's process in the dispatch pass itself (submit-to-start
latency), so what used to happen in the task's own coroutine now happens inside
whoever queued the task: these pin down that nothing about it leaks to the caller."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from swarm import model as m
from swarm.runtime.executor import Executor, ProcessPlan
from swarm.runtime.journal import Journal
from swarm.runtime.runner import LocalRunner
from swarm.runtime.tasks import TaskTable


def _runner(tmp: Path) -> tuple[TaskTable, LocalRunner]:
    journal = Journal(tmp / "journal.db", node="n1")
    table = TaskTable(journal, "n1")
    runner = LocalRunner(
        table, Executor(kill_grace=1.0), node="n1", slots=2, log_dir=tmp / "logs",
        state_dir=tmp,
    )  # fmt: skip
    return table, runner


def _spec(tid: str, *argv: str) -> m.TaskSpec:
    return m.TaskSpec(id=tid, argv=argv, home="n1", cwd="/")


async def test_queued_with_a_free_slot_the_process_exists_when_enqueue_returns(
    tmp_path: Path,
) -> None:
    table, runner = _runner(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(table.journal.run)
        await nursery.start(runner.run)
        with trio.fail_after(5):
            while len(runner.logfiles.spares) < runner.logfiles.keep:  # made at start
                await trio.sleep(0.01)
        await table.add(m.new_task(_spec("t1", "sh", "-c", "echo hi"), time.time(), "n1"))
        runner.enqueue("t1")
        t = table.get_cached("t1")
        assert t is not None and t.state is m.TaskState.RUNNING
        assert "t1" in runner.executor.running  # spawned, not merely scheduled
        with trio.fail_after(10):
            await table.wait_terminal("t1")
        nursery.cancel_scope.cancel()
    assert (tmp_path / "logs" / "t1.out").read_bytes() == b"hi\n"
    assert runner.logfiles.used == 2  # both files were spares renamed into place


async def test_a_failing_plan_hook_fails_the_task_not_the_caller(tmp_path: Path) -> None:
    table, runner = _runner(tmp_path)

    def hook(task: m.Task, plan: ProcessPlan) -> ProcessPlan:
        if task.id == "bad":
            raise RuntimeError("hook bug")
        return plan

    runner.plan_hook = hook
    async with trio.open_nursery() as nursery:
        await nursery.start(table.journal.run)
        await nursery.start(runner.run)
        for tid in ("bad", "good"):
            await table.add(m.new_task(_spec(tid, "true"), time.time(), "n1"))
            runner.enqueue(tid)  # must not raise
        with trio.fail_after(10):
            bad = await table.wait_terminal("bad")
            good = await table.wait_terminal("good")
        nursery.cancel_scope.cancel()
    assert bad.state is m.TaskState.FAILED
    assert "hook bug" in bad.history[-1].cause
    assert good.state is m.TaskState.SUCCEEDED
    assert not runner.running and not runner.executor.running
