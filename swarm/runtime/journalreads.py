"""The journal's reads (journal.py): everything a restarting agent needs (`recover`,
before it serves anyone), then a task's record, its events, what retention may
forget. Those run in trio's worker thread on the read connection, one at a time, so
the loop never waits on sqlite and the single writer is never blocked by a reader
(WAL: readers see the last commit)."""

from __future__ import annotations

import sqlite3
from typing import Any

import trio

from .. import model as m
from .. import wire
from ..logs import EventLog
from ..node.arrays import MARK
from ..node.recovery import REPLICA, REPLICAS, STRAYS
from .journaldb import Recovered, decode_event, decode_task


class JournalReads:
    """Journal's read methods; it opens `_rconn` and `_rlimit` (CapacityLimiter(1))."""

    _rconn: sqlite3.Connection
    _rlimit: trio.CapacityLimiter
    log: EventLog

    def recover(self) -> Recovered:
        """Read back everything a restarting agent needs (synchronous, before serving)."""
        active: list[m.Task] = []
        for (blob,) in self._rconn.execute("SELECT record FROM tasks WHERE terminal=0"):
            try:
                active.append(decode_task(blob))
            except wire.WireError as e:
                self.log.error("journal.bad_record", error=str(e))
        kv: dict[str, Any] = {}
        for key, value in self._rconn.execute("SELECT key, value FROM kv"):
            try:
                kv[key] = wire.unpack(value)
            except wire.WireError:
                self.log.error("journal.bad_kv", key=key)
        procs = {
            tid: (pid, ct)
            for tid, pid, ct in self._rconn.execute("SELECT task_id, pid, create_time FROM procs")
        }
        shims = {
            tid: (task_pid, status_dir)
            for tid, task_pid, status_dir in self._rconn.execute(
                "SELECT task_id, task_pid, status_dir FROM shims"
            )
        }
        active.sort(key=lambda t: (t.created_at, t.id))
        owed: list[m.Task] = []
        # finished tasks the state machine must still know, with how they ended: those
        # with a guest entry (their result not yet acknowledged by their home), and our
        # own whose copies or stray copies are still owed their release (it carries how
        # the task ended: chaos late-binding at stop 45, a release sent after a restart
        # without it reached a stray before its copy, which then stayed `queued`),
        # array elements whose end their array's journaled counts miss (node/arrays.py),
        # and those we keep a copy of, which we ran (a copy we adopt after its home's
        # loss is then adopted as it ended, not run again: failover.py `_adopt_copy`)
        owed_keys = ("guest:", REPLICAS, STRAYS, MARK, REPLICA)
        ids = sorted({k.split(":", 1)[1] for k in kv if k.startswith(owed_keys)})
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            marks = ",".join("?" * len(chunk))
            for (blob,) in self._rconn.execute(
                f"SELECT record FROM tasks WHERE terminal=1 AND id IN ({marks})", chunk
            ):
                try:
                    owed.append(decode_task(blob))
                except wire.WireError as e:
                    self.log.error("journal.bad_record", error=str(e))
        return Recovered(active=active, kv=kv, procs=procs, shims=shims, owed=owed)

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
