"""The runner starts a task's process in the dispatch pass itself (submit-to-start
latency), so what used to happen in the task's own coroutine now happens inside
whoever queued the task: these pin down that nothing about it leaks to the caller."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from swarm import model as m
from swarm.runtime import shim
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


async def test_a_wait_answers_once_the_end_is_on_disk_and_its_directory_given_back(
    tmp_path: Path,
) -> None:
    """A wait that comes while the end is being written answers after the write, not
    from the record in memory: what it reports survives a crash, and the runner's steps
    after the write (the status directory back in the pool, emptied) are done (the CI
    failure of test_outlive_agent at e86f5ad)."""
    table, runner = _runner(tmp_path)
    runner.executor.shim = shim.build(tmp_path / "bin")  # a supervised start, as agents'
    journal = table.journal
    hold = trio.Event()
    real_commit = journal.commit

    async def slow_commit(ops, **kw):  # type: ignore[no-untyped-def]
        ops = list(ops)
        if any(getattr(op, "task", None) is not None and op.task.state.terminal for op in ops):
            await hold.wait()
        await real_commit(ops, **kw)

    journal.commit = slow_commit  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await nursery.start(runner.run)
        await table.add(m.new_task(_spec("t1", "true"), time.time(), "n1"))
        runner.enqueue("t1")
        with trio.fail_after(10):
            while (t := table.get_cached("t1")) is None or not t.state.terminal:
                await trio.sleep(0.01)  # applied in memory; its write is held
        # asserted after the write: the runner's end waits for it, shielded
        early, answered = await _wait_while_held(table, nursery, hold)
        # what was there when the wait answered
        back = [(d, list(d.iterdir())) for d in runner.status_dirs.free]
        with trio.fail_after(10):
            while runner.running:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert early == []  # not answered from memory while the write was held
    assert answered[0].state is m.TaskState.SUCCEEDED
    assert len(back) == 1 and back[0][1] == []  # the directory back, emptied


async def test_an_end_the_state_machine_records_is_answered_once_written(tmp_path: Path) -> None:
    """The node's state machine records ends too (a queued task cancelled, a guest's
    result): runtime/effects.py marks them `writing` around their commit, and a wait
    that comes meanwhile answers after it, as for the runner's own ends."""
    table, _ = _runner(tmp_path)
    hold = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(table.journal.run)
        await table.add(m.new_task(_spec("t1", "true"), time.time(), "n1"))
        table.records.apply("t1", m.TaskState.CANCELLED, time.time(), "cancelled")

        async def write() -> None:
            with table.writing(["t1"]):
                await hold.wait()  # the commit, held

        nursery.start_soon(write)
        await trio.sleep(0.05)
        early, answered = await _wait_while_held(table, nursery, hold)
        nursery.cancel_scope.cancel()
    assert early == []
    assert answered[0].state is m.TaskState.CANCELLED


async def _wait_while_held(
    table: TaskTable, nursery: trio.Nursery, hold: trio.Event
) -> tuple[list[m.Task], list[m.Task]]:
    """A wait on t1 started while its end's write is held: what it had answered
    before the write was let go (nothing, if it waits for it), and after."""
    answered: list[m.Task] = []

    async def wait() -> None:
        answered.append(await table.wait_terminal("t1"))

    nursery.start_soon(wait)
    await trio.sleep(0.2)
    early = list(answered)
    hold.set()
    with trio.fail_after(10):
        while not answered:
            await trio.sleep(0.01)
    return early, answered
