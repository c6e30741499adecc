"""Durable task store: sqlite3 in WAL mode with group commit.

Nothing acknowledged may be lost, so a submission is committed (fsync'd WAL) before
the submit socket answers. One fsync per submission would cap us at a few hundred
submissions per second, so concurrent writers are group-committed: a single writer
task takes everything queued since the last commit and writes it in one transaction.

sqlite is blocking; the writer runs each transaction in trio's worker thread
(`trio.to_thread.run_sync`), one at a time, so the event loop does not wait on disk
while it has other work. When it has none (no runnable task) a small batch is
written on the loop itself: the thread round trip (two wake-ups of an idle CPU) cost
~0.4 ms on the development VM, half an fsync, on every lone submission.

Written, then synced. The writer connection runs with synchronous=NORMAL and the
journal fsyncs the WAL itself after each transaction: the same durability as FULL
(sqlite's NORMAL still syncs the WAL before every checkpoint), in two steps a caller
can tell apart. Once the transaction is written (in the OS's page cache) it survives
a crash of the agent, and only a crash of the whole machine can lose it, which kills
any process the agent started too. So a submission's task may start as soon as its
record is written (`commit(..., on_written=...)`), during the fsync; the submitter is
still answered only after the fsync. On an idle agent this takes the fsync (~0.4-0.8 ms
on the development VM) off the submit-to-start path.

Failure policy: a batch that fails (disk full, I/O error) fails the writers that
need an answer (submissions: the client gets an error, nothing was acknowledged);
state records of known tasks are kept and retried until they land, newest record
per task wins, so a transient full disk delays the journal but does not lose a
result.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
import trio

from .. import codec, wire
from .. import model as m
from ..logs import NULL_LOG, EventLog

SCHEMA_VERSION = 1
INLINE_OPS = 8  # a batch this small may be written on the loop when it is idle

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks(
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    terminal INTEGER NOT NULL,
    updated REAL NOT NULL,
    record BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_terminal ON tasks(terminal, updated);
CREATE TABLE IF NOT EXISTS events(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    task_id TEXT,
    node TEXT,
    data TEXT
);
CREATE INDEX IF NOT EXISTS events_task ON events(task_id);
CREATE TABLE IF NOT EXISTS kv(key TEXT PRIMARY KEY, value BLOB);
CREATE TABLE IF NOT EXISTS procs(
    task_id TEXT PRIMARY KEY, pid INTEGER NOT NULL, create_time REAL NOT NULL
);
"""


class JournalError(Exception):
    """The journal could not persist a write (disk full, I/O error, corruption)."""


# ------------------------------------------------------------------ operations


@attrs.frozen
class PutTask:
    """Upsert a task's full record, and log its newest transition as an event."""

    task: m.Task


@attrs.frozen
class DelTask:
    """Forget a task record (a guest that moved on before it ever ran here)."""

    task_id: m.TaskId


@attrs.frozen
class ForgetFinished:
    """Delete a finished task's record and its events (retention). A task that is not
    finished (terminal) is left alone, whatever the caller thought."""

    task_id: m.TaskId


@attrs.frozen
class PutKV:
    key: str
    value: Any  # msgpack-able


@attrs.frozen
class DelKV:
    key: str


@attrs.frozen
class PutProc:
    """A process started for a task: lets a restarted agent find and kill orphans."""

    task_id: m.TaskId
    pid: int
    create_time: float


@attrs.frozen
class DelProc:
    task_id: m.TaskId


@attrs.frozen
class Event:
    """An append-only fact for audits (drain changes, handoffs, migrations...)."""

    at: float
    kind: str
    task_id: str | None = None
    node: str = ""
    data: Any = None


Op = PutTask | DelTask | ForgetFinished | PutKV | DelKV | PutProc | DelProc | Event


@attrs.define
class _Pending:
    ops: list[Op]
    done: trio.Event
    error: BaseException | None = None
    must_land: bool = False  # keep retrying on failure instead of failing the writer
    on_written: Callable[[], None] | None = None  # called once written, before the fsync


@attrs.frozen
class Recovered:
    """What a starting agent reads back."""

    active: list[m.Task]  # every non-terminal task
    kv: dict[str, Any]
    procs: dict[m.TaskId, tuple[int, float]]


def _connect(path: Path, synchronous: str = "FULL") -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def _record(task: m.Task) -> bytes:
    return wire.pack(codec.task_to_wire(task))


def _task(blob: bytes) -> m.Task:
    return wire.decode_with(codec.task_from_wire, wire.unpack(blob))


class Journal:
    def __init__(self, path: Path, log: EventLog = NULL_LOG, node: str = "") -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.log = log
        self.node = node
        # the writer's commits are synced by _sync_wal (see the module docstring)
        self._wconn = _connect(path, "NORMAL")
        self._rconn = _connect(path)
        self._wal_path = Path(f"{path}-wal")
        self._wal_fd: int | None = None
        self._wconn.executescript(_SCHEMA)
        row = self._wconn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None:
            self._wconn.execute(
                "INSERT INTO meta(key, value) VALUES('schema', ?)", (str(SCHEMA_VERSION),)
            )
        elif int(row[0]) > SCHEMA_VERSION:
            raise JournalError(
                f"{path}: schema {row[0]} is newer than this agent ({SCHEMA_VERSION})"
            )
        send, recv = trio.open_memory_channel[_Pending](float("inf"))
        self._send = send
        self._recv = recv
        self._retry: dict[str, Op] = {}  # ops that must land, keyed for coalescing
        self._rlimit = trio.CapacityLimiter(1)
        self.commits = 0  # transactions written (for group-commit figures)
        self.inline_commits = 0  # of which written on the idle loop, not in a thread
        self.ops_written = 0
        self.failures = 0
        self._sync_wal()
        _fsync_dir(path.parent)  # the journal's files, when this call created them

    # -------------------------------------------------------------- start-up

    def recover(self) -> Recovered:
        """Read back everything a restarting agent needs (synchronous, before serving)."""
        active: list[m.Task] = []
        for (blob,) in self._rconn.execute("SELECT record FROM tasks WHERE terminal=0"):
            try:
                active.append(_task(blob))
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
        active.sort(key=lambda t: (t.created_at, t.id))
        return Recovered(active=active, kv=kv, procs=procs)

    # --------------------------------------------------------------- writing

    async def commit(
        self,
        ops: Iterable[Op],
        *,
        must_land: bool = False,
        on_written: Callable[[], None] | None = None,
    ) -> None:
        """Persist ops durably, group-committed with concurrent callers.

        Raises JournalError if the batch failed (unless must_land: then the ops are
        retried in the background and this returns once they are queued for retry).
        `on_written` runs (on the loop, from the writer) once the ops are written and
        would survive a crash of the agent, before they are synced; when the sync then
        fails this still raises, and undoing what the callback began is the caller's
        job. It is not called when the write itself fails.
        """
        p = _Pending(list(ops), trio.Event(), must_land=must_land, on_written=on_written)
        self._send.send_nowait(p)
        await p.done.wait()
        if p.error is not None and not must_land:
            raise JournalError(str(p.error)) from p.error

    def enqueue(self, ops: Iterable[Op]) -> None:
        """Fire-and-forget write that must eventually land (state records)."""
        self._send.send_nowait(_Pending(list(ops), trio.Event(), must_land=True))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The single writer: batches whatever is queued into one transaction."""
        task_status.started()
        while True:
            if self._retry:
                with trio.move_on_after(1.0):
                    first = await self._recv.receive()
                    batch = [first]
                    self._drain_into(batch)
                    await self._write_batch(batch)
                    continue
                await self._write_batch([])
                continue
            first = await self._recv.receive()
            batch = [first]
            self._drain_into(batch)
            await self._write_batch(batch)

    def _drain_into(self, batch: list[_Pending]) -> None:
        while True:
            try:
                batch.append(self._recv.receive_nowait())
            except trio.WouldBlock:
                return

    async def _write_batch(self, batch: list[_Pending]) -> None:
        retry_ops = list(self._retry.values())
        ops: list[Op] = retry_ops + [op for p in batch for op in p.ops]
        if not ops:
            for p in batch:
                p.done.set()
            return
        written = False
        try:
            if trio.lowlevel.current_statistics().tasks_runnable == 0 and len(ops) <= INLINE_OPS:
                # Nothing else is ready to run: write on the loop. Handing the write to a
                # worker thread and back costs two thread wake-ups, ~0.4 ms on an idle
                # VM (half an fsync), and that sat between every lone submission and
                # its acknowledgement. Under load there are runnable tasks: a thread.
                # Written first, then synced: the callbacks (a task's start) run in
                # between, so a lone submission's process starts during the fsync.
                self._write_sync(ops)
                written = True
                self._written(batch)
                self._sync_wal()
                self.inline_commits += 1
            else:
                await trio.to_thread.run_sync(self._write_and_sync, ops, abandon_on_cancel=False)
                written = True
                self._written(batch)
        except (sqlite3.Error, OSError) as e:
            self.failures += 1
            # after `written`, the fsync failed: what it was to sync may never reach
            # the disk, and the submitters whose tasks already started must undo them
            what = "journal.sync_failed" if written else "journal.write_failed"
            self.log.error(what, error=str(e), ops=len(ops))
            for p in batch:
                if p.must_land:
                    for op in p.ops:
                        self._retry[_retry_key(op)] = op
                else:
                    p.error = e
                p.done.set()
            return
        self._retry.clear()
        self.commits += 1
        self.ops_written += len(ops)
        for p in batch:
            p.done.set()

    def _written(self, batch: list[_Pending]) -> None:
        for p in batch:
            cb, p.on_written = p.on_written, None
            if cb is None:
                continue
            try:
                cb()
            except Exception as e:  # a caller's bug must not stop the only writer
                self.log.exception("journal.on_written_failed", e)

    def _write_and_sync(self, ops: list[Op]) -> None:
        self._write_sync(ops)
        self._sync_wal()

    def _sync_wal(self) -> None:
        """fsync the WAL: what synchronous=FULL does at each commit. sqlite deletes or
        replaces the WAL file only when its last connection closes (we hold two until
        close()), so one descriptor, opened once the file exists, serves every commit."""
        if self._wal_fd is None:
            try:
                self._wal_fd = os.open(self._wal_path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return  # nothing written through the WAL yet
        os.fdatasync(self._wal_fd)

    def _write_sync(self, ops: list[Op]) -> None:
        c = self._wconn
        c.execute("BEGIN IMMEDIATE")
        try:
            for op in ops:
                self._apply(c, op)
            c.execute("COMMIT")
        except BaseException:
            try:
                c.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise

    def _apply(self, c: sqlite3.Connection, op: Op) -> None:
        if isinstance(op, PutTask):
            t = op.task
            c.execute(
                "INSERT INTO tasks(id, state, terminal, updated, record) VALUES(?,?,?,?,?) "
                "ON CONFLICT(id) DO UPDATE SET state=excluded.state, terminal=excluded.terminal, "
                "updated=excluded.updated, record=excluded.record",
                (
                    t.id,
                    t.state.value,
                    int(t.state.terminal),
                    t.history[-1].at if t.history else 0.0,
                    _record(t),
                ),
            )
            if t.history:
                tr = t.history[-1]
                c.execute(
                    "INSERT INTO events(at, kind, task_id, node, data) VALUES(?,?,?,?,?)",
                    (
                        tr.at,
                        "transition",
                        t.id,
                        tr.node,
                        json.dumps(
                            {
                                "src": tr.src.value if tr.src else None,
                                "dst": tr.dst.value,
                                "cause": tr.cause,
                            }
                        ),
                    ),
                )
        elif isinstance(op, DelTask):
            c.execute("DELETE FROM tasks WHERE id=?", (op.task_id,))
        elif isinstance(op, ForgetFinished):
            gone = c.execute("DELETE FROM tasks WHERE id=? AND terminal=1", (op.task_id,))
            if gone.rowcount:
                c.execute("DELETE FROM events WHERE task_id=?", (op.task_id,))
        elif isinstance(op, PutKV):
            c.execute(
                "INSERT INTO kv(key, value) VALUES(?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (op.key, wire.pack(op.value)),
            )
        elif isinstance(op, DelKV):
            c.execute("DELETE FROM kv WHERE key=?", (op.key,))
        elif isinstance(op, PutProc):
            c.execute(
                "INSERT OR REPLACE INTO procs(task_id, pid, create_time) VALUES(?,?,?)",
                (op.task_id, op.pid, op.create_time),
            )
        elif isinstance(op, DelProc):
            c.execute("DELETE FROM procs WHERE task_id=?", (op.task_id,))
        elif isinstance(op, Event):
            c.execute(
                "INSERT INTO events(at, kind, task_id, node, data) VALUES(?,?,?,?,?)",
                (
                    op.at,
                    op.kind,
                    op.task_id,
                    op.node or self.node,
                    json.dumps(op.data, default=str),
                ),
            )

    # --------------------------------------------------------------- reading

    async def get_task(self, task_id: m.TaskId) -> m.Task | None:
        def read() -> m.Task | None:
            row = self._rconn.execute("SELECT record FROM tasks WHERE id=?", (task_id,)).fetchone()
            return None if row is None else _task(row[0])

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
                    out.append(json.loads(data))
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
            return [_task(r[0]) for r in rows]

        return await trio.to_thread.run_sync(read, limiter=self._rlimit)

    def close(self) -> None:
        for c in (self._wconn, self._rconn):
            try:
                c.close()
            except sqlite3.Error:
                pass
        if self._wal_fd is not None:
            os.close(self._wal_fd)
            self._wal_fd = None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _retry_key(op: Op) -> str:
    if isinstance(op, (PutTask, DelTask, ForgetFinished)):
        return "task:" + (op.task.id if isinstance(op, PutTask) else op.task_id)
    if isinstance(op, (PutKV, DelKV)):
        return "kv:" + op.key
    if isinstance(op, (PutProc, DelProc)):
        return "proc:" + op.task_id
    return f"event:{id(op)}"


def integrity_check(path: Path) -> str:
    """`PRAGMA integrity_check` on a journal file; 'ok' when healthy."""
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()
