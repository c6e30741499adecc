"""Regression tests for agent bugs the chaos suite found (see docs/chaos.md).

Each drives the real runtime pieces (journal, task table, runner, coordinator,
executor with real processes) in one trio run, without a cluster.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import trio

from swarm import model as m
from swarm.policy.shares import ShareLedger
from swarm.runtime.coordinator import Coordinator
from swarm.runtime.executor import Executor
from swarm.runtime.journal import Journal
from swarm.runtime.runner import LocalRunner
from swarm.runtime.tasks import TaskTable


def _node(tmp: Path, shares: int, slots: int) -> tuple[TaskTable, LocalRunner, ShareLedger]:
    journal = Journal(tmp / "journal.db", node="n1")
    table = TaskTable(journal, "n1")
    runner = LocalRunner(
        table, Executor(kill_grace=1.0), node="n1", slots=slots, log_dir=tmp / "logs",
        state_dir=tmp,
    )  # fmt: skip
    ledger = ShareLedger(shares)
    coord = Coordinator(
        node="n1", table=table, journal=journal, runner=runner, cluster=None, ledger=ledger,
        log=runner.log,
    )  # fmt: skip
    runner.can_start = coord.can_start
    runner.on_started = coord.on_started
    runner.on_finished = coord.on_finished
    return table, runner, ledger


async def test_reservations_queued_together_never_oversubscribe(tmp_path: Path) -> None:
    """Found by the chaos canary: two tasks reserving 600 of 1024 shares, queued when
    the runner's dispatch pass came, both passed the start gate in that one pass
    (the ledger learnt of the first start only later, in the task's own coroutine), so
    both ran at once; the second's late ledger.start then failed and its shares were
    never counted, letting later starts oversubscribe further."""
    table, runner, ledger = _node(tmp_path, shares=1024, slots=4)
    peak: list[int] = []
    started = runner.on_started
    assert started is not None

    def watch(task: m.Task) -> None:
        started(task)
        peak.append(ledger.reserved)

    runner.on_started = watch
    specs = [
        m.TaskSpec(id=f"t{i}", argv=("sleep", "0.3"), reserve_shares=600, home="n1", cwd="/")
        for i in range(3)
    ]
    async with trio.open_nursery() as nursery:
        await nursery.start(table.journal.run)
        for s in specs:
            await table.add(m.new_task(s, time.time(), "n1"))
            ledger.add(s)
            runner.queue.append(s.id)  # all queued before the first dispatch pass
        await nursery.start(runner.run)
        with trio.fail_after(30):
            for s in specs:
                await table.wait_terminal(s.id)
        nursery.cancel_scope.cancel()
    done = [table.get_cached(s.id) for s in specs]
    assert all(t is not None and t.state is m.TaskState.SUCCEEDED for t in done)
    spans = sorted((t.started_at or 0.0, t.finished_at or 0.0) for t in done if t is not None)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, f"two 600-share reservations ran at once: {spans}"
    assert peak and max(peak) <= 1024, peak
    assert ledger.reserved == 0 and len(ledger) == 0
