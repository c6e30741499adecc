"""A terminate (shutdown, cancel, restart-migration) that races with a task's start.

Seen in `make test`: SIGTERM reached the agent between a task's dispatch and its
process existing; the shutdown's terminate found no process, the task started
afterwards, ran until the shutdown gave up, and was killed without being journaled
as re-queued."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from swarm.runtime.executor import Executor, ProcessPlan


def _plan(tmp_path: Path, tid: str) -> ProcessPlan:
    return ProcessPlan(
        task_id=tid,
        argv=("sleep", "300"),
        env={"PATH": os.defpath},
        cwd="/",
        stdout=tmp_path / f"{tid}.out",
        stderr=tmp_path / f"{tid}.err",
    )


async def test_terminated_before_it_started_never_starts(tmp_path: Path) -> None:
    ex = Executor(kill_grace=1.0)
    ex.claim("t1")  # dispatched: on its way to run()
    assert await ex.terminate("t1", "agent shutdown") is True
    with trio.fail_after(5):
        r = await ex.run(_plan(tmp_path, "t1"))
    assert r.cancelled and r.pid is None and r.spawn_error is None
    assert "t1" not in ex.running
    # the doom does not outlive the attempt: the same task runs normally next time
    assert await ex.terminate("t1", "late") is False


async def test_a_terminate_at_any_moment_of_the_start_stops_it(tmp_path: Path) -> None:
    """Whether the terminate lands before run(), while the process is being spawned
    (open_process runs in a thread) or after: the attempt ends cancelled, never as a
    300 s sleep."""
    ex = Executor(kill_grace=1.0)
    for i, checkpoints in enumerate((0, 1, 2, 3, 5, 8)):
        tid = f"t2-{i}"
        result = []

        async def run(tid: str = tid, result: list = result) -> None:
            result.append(await ex.run(_plan(tmp_path, tid)))

        ex.claim(tid)  # the runner claims at dispatch, before run() is scheduled
        async with trio.open_nursery() as n:
            n.start_soon(run)
            for _ in range(checkpoints):
                await trio.sleep(0)
            assert await ex.terminate(tid, "cancelled") is True
            with trio.fail_after(10):
                while not result:
                    await trio.sleep(0.01)
        r = result[0]
        assert r.cancelled, (checkpoints, r)
        assert r.exit_code is None, (checkpoints, r)  # killed or never started
        assert tid not in ex.running


async def test_unknown_task_is_not_remembered(tmp_path: Path) -> None:
    ex = Executor(kill_grace=1.0)
    assert await ex.terminate("nope", "x") is False
    ex.claim("t3")
    ex.release("t3")  # the attempt ended without reaching run()
    assert await ex.terminate("t3", "x") is False
    with trio.fail_after(5):
        r = await ex.run(
            ProcessPlan("t3", ("true",), {"PATH": os.defpath}, "/", tmp_path / "o", tmp_path / "e")
        )
    assert r.exit_code == 0 and not r.cancelled
