"""The journal's reads (journal.py): a task's record, its events, what retention may
forget. Each runs in trio's worker thread on the read connection, one at a time, so
the loop never waits on sqlite and the single writer is never blocked by a reader
(WAL: readers see the last commit)."""

from __future__ import annotations

import sqlite3
from typing import Any

import trio

from .. import model as m
from .journaldb import decode_event, decode_task


class JournalReads:
    """Journal's read methods; it opens `_rconn` and `_rlimit` (CapacityLimiter(1))."""

    _rconn: sqlite3.Connection
    _rlimit: trio.CapacityLimiter

    async def get_task(self, task_id: m.TaskId) -> m.Task | None:
        def read() -> m.Task | None:
            row = self._rconn.execute("SELECT record FROM tasks WHERE id=?", (task_id,)).fetchone()
            return None if row is None else decode_task(row[0])

        return await trio.to_thread.run_sync(read, limiter=self._rlimit)

    async def events_for(self, task_id: m.TaskId, kind: str, limit: int = 50) -> list[Any]:
        """The `data` of a task's events of one kind, oldest first."""

        def read() -> list[Any]:
            rows = self._rconn.execute(
                "SELECT data FROM events WHERE task_id=? AND kind=? ORDER BY seq DESC LIMIT ?",
                (task_id, kind, limit),
            ).fetchall()
            out = []
            for (data,) in reversed(rows):
                try:
                    out.append(decode_event(data))
                except (TypeError, ValueError):
                    continue
            return out

        return await trio.to_thread.run_sync(read, limiter=self._rlimit)

    async def finished_before(self, before: float, limit: int) -> list[m.TaskId]:
        """Ids of finished tasks whose last change is older than `before` (wall
        clock), oldest first: what retention may forget."""

        def read() -> list[m.TaskId]:
            rows = self._rconn.execute(
                "SELECT id FROM tasks WHERE terminal=1 AND updated<? ORDER BY updated LIMIT ?",
                (before, limit),
            ).fetchall()
            return [m.TaskId(r[0]) for r in rows]

        return await trio.to_thread.run_sync(read, limiter=self._rlimit)

    async def recent_terminal(self, limit: int) -> list[m.Task]:
        def read() -> list[m.Task]:
            rows = self._rconn.execute(
                "SELECT record FROM tasks WHERE terminal=1 ORDER BY updated DESC LIMIT ?", (limit,)
            ).fetchall()
            return [decode_task(r[0]) for r in rows]

        return await trio.to_thread.run_sync(read, limiter=self._rlimit)
