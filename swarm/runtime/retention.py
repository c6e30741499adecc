"""Retention: a finished task's record, events and log files go after `keep-finished`.

Without it a busy node's journal and log directory grow forever (every task leaves a
record, its transitions and two log files). Only finished (terminal) tasks are ever
forgotten, and only once nothing on this node still needs them: a result not yet
acknowledged by the task's home, a handoff or a migration in flight. Records go in
small batches so the journal's writer and the disk are never held for long.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import trio

from .. import model as m
from ..logs import NULL_LOG, EventLog
from .clock import Clock
from .journal import ForgetFinished, Journal
from .tasks import TaskTable

BATCH = 200  # records forgotten per journal commit
MAX_INTERVAL = 600.0  # seconds between passes, at most


def pass_interval(keep: float) -> float:
    """How often to look: a tenth of the retention, between 1 s and 10 min."""
    return min(MAX_INTERVAL, max(1.0, keep / 10))


def _unlink_all(paths: list[Path]) -> int:
    removed = 0
    for p in paths:
        try:
            os.unlink(p)
            removed += 1
        except OSError:
            pass  # already gone, or not ours to remove: the record is forgotten anyway
    return removed


class Retention:
    def __init__(
        self,
        keep: float,
        journal: Journal,
        table: TaskTable,
        log_paths: Callable[[m.TaskId], tuple[Path, Path]],
        in_use: Callable[[m.TaskId], bool],
        log: EventLog = NULL_LOG,
        on_forget: Callable[[m.TaskId], object] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.keep = keep  # seconds; 0 = forever
        self.clock = clock or table.clock  # finished_at is wall time: compared with wall()
        self.journal = journal
        self.table = table
        self.log_paths = log_paths
        self.in_use = in_use
        self.on_forget = on_forget  # drops what other caches hold of a forgotten task
        self.log = log
        self.forgotten = 0
        self.log_files_removed = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if self.keep <= 0:
            return
        interval = pass_interval(self.keep)
        while True:
            await trio.sleep(interval)
            await self.prune(self.clock.wall())

    async def prune(self, now: float) -> int:
        """Forget every finished task older than the retention; returns how many."""
        total = 0
        skipped: set[m.TaskId] = set()  # still needed here: looked at again next pass
        while True:
            limit = BATCH + len(skipped)
            ids = await self.journal.finished_before(now - self.keep, limit)
            batch: list[m.TaskId] = []
            for tid in ids:
                if tid in skipped:
                    continue
                if tid in self.table.active or self.in_use(tid):
                    skipped.add(tid)
                    continue
                batch.append(tid)
            if batch:
                await self.journal.commit([ForgetFinished(tid) for tid in batch], must_land=True)
                paths: list[Path] = []
                for tid in batch:
                    self.table.finished.pop(tid, None)
                    if self.on_forget is not None:
                        self.on_forget(tid)
                    paths.extend(self.log_paths(tid))
                self.log_files_removed += await trio.to_thread.run_sync(_unlink_all, paths)
                total += len(batch)
                self.forgotten += len(batch)
            if len(ids) < limit:
                break
        if total:
            self.log.info("retention.forgot", tasks=total, older_than_s=self.keep)
        return total
