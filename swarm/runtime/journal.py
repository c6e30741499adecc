"""Durable task store: sqlite3 in WAL mode with group commit.

Nothing acknowledged may be lost, so a submission is committed (fsync'd WAL) before
the submit socket answers. One fsync per submission would cap us at a few hundred
submissions per second, so concurrent writers are group-committed: a single writer
task takes everything queued since the last commit and writes it in one transaction.

sqlite is blocking; under load the writer writes each transaction on the loop and
syncs it in a thread of its own (syncthread.py: a leaner round trip than
`trio.to_thread.run_sync`), one at a time, so the event loop does not wait on disk
while it has other work. When it has none (no runnable task) a small batch is
written and synced on the loop itself: the thread round trip (two wake-ups of an idle
CPU) cost ~0.4 ms on the development VM, half an fsync, on every lone submission.

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

Small disks. sqlite checkpoints the WAL into the database only once it holds
`wal_autocheckpoint` pages, and never shrinks it by default: with the default 1,000
pages (4 MiB) the WAL alone filled a 2 MB state filesystem before its first
checkpoint, and every later write (and the checkpoint on close) needed more room than
there was, so the journal stayed full after space returned, across restarts too. So
the WAL may take at most 1/WAL_DISK_SHARE of the state filesystem (`wal_pages`: 64
pages, 256 KiB, on 2 MB; from 32 MB up sqlite's own 1,000 pages, as checkpointing
more often costs fsyncs: at every 128 pages bench/submit.py's 8-client rate looked
~20% lower, in noisy runs). The writer checkpoints at that size and cuts the WAL back
to it after each checkpoint (journal_size_limit), and a write that fails with
SQLITE_FULL runs `wal_checkpoint(TRUNCATE)` (which frees the WAL's space once its
pages are in the database) and is tried once more. While writes fail the journal is
`wedged` (shown by `swarm info`): the first write that lands clears it (state records
are retried every RETRY_INTERVAL; with nothing to retry, a tiny probe write goes every
PROBE_INTERVAL), so the agent takes work again without a restart. Retries go in a
transaction of their own, before the new batch: a submission that fits is not refused
for their size.

Files are private: the database is created 0600 (sqlite gives its WAL and shared-memory
files the database's mode) and an existing one is tightened to 0600 at open.

This module is the writer (its reads are journalreads.py); the database side (tables, the
operations and their SQL, record encoding, file modes, WAL sizing) is
`journaldb.py`, and its names are importable from here too.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import trio

from ..logs import NULL_LOG, EventLog
from .clock import Clock
from .journaldb import (
    FILE_MODE,
    SCHEMA,
    SCHEMA_VERSION,
    SQLITE_FULL,
    WAL_DISK_SHARE,
    WAL_MAX_PAGES,
    WAL_MIN_PAGES,
    DelKV,
    DelProc,
    DelTask,
    Event,
    ForgetFinished,
    JournalError,
    Op,
    PutKV,
    PutProc,
    PutTask,
    Recovered,
    apply_ops,
    connect,
    describe_error,
    disk_full,
    fsync_dir,
    integrity_check,
    private_files,
    retry_key,
    wal_pages,
)
from .journalreads import JournalReads
from .syncthread import SyncThread

__all__ = [
    "FILE_MODE",
    "INLINE_OPS",
    "PROBE_INTERVAL",
    "RETRY_INTERVAL",
    "SCHEMA_VERSION",
    "SQLITE_FULL",
    "WAL_DISK_SHARE",
    "WAL_MAX_PAGES",
    "WAL_MIN_PAGES",
    "DelKV",
    "DelProc",
    "DelTask",
    "Event",
    "ForgetFinished",
    "Journal",
    "JournalError",
    "Op",
    "PutKV",
    "PutProc",
    "PutTask",
    "Recovered",
    "Wedged",
    "describe_error",
    "integrity_check",
    "wal_pages",
]

INLINE_OPS = 8  # a batch this small may be written and synced on the loop when it is idle
WRITE_CHUNK = 256  # ops written between two checkpoints of the loop
RETRY_INTERVAL = 1.0  # seconds between retries of failed must-land writes
PROBE_INTERVAL = 5.0  # seconds between probes of a wedged journal with nothing to retry
LAZY_FLUSH = 0.25  # seconds a lazy write waits for a commit to go with (enqueue_lazy)


@attrs.define
class _Pending:
    ops: list[Op]
    done: trio.Event
    error: BaseException | None = None
    must_land: bool = False  # keep retrying on failure instead of failing the writer
    on_written: Callable[[], None] | None = None  # called once written, before the fsync
    lazy_mark: bool = False  # no ops: lazy writes wait (enqueue_lazy); time their flush


@attrs.frozen
class Wedged:
    """Why the journal cannot write, since when (wall clock), and failed attempts."""

    error: str
    since: float
    disk_full: bool
    failures: int = 1


@attrs.define
class _Attempt:
    written: bool = False  # the ops are written (the sync may still fail)


class Journal(JournalReads):
    def __init__(
        self, path: Path, log: EventLog = NULL_LOG, node: str = "", clock: Clock | None = None
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.clock = clock or Clock.system()
        self.log = log
        self.node = node
        private_files(path)
        # the writer's commits are synced by _sync_wal (see the module docstring)
        self._wconn = connect(path, "NORMAL")
        page = int(self._wconn.execute("PRAGMA page_size").fetchone()[0])
        st = os.statvfs(path.parent)
        self.wal_pages = wal_pages(st.f_blocks * st.f_frsize, page)
        self._wconn.execute(f"PRAGMA wal_autocheckpoint={self.wal_pages}")
        self._wconn.execute(f"PRAGMA journal_size_limit={self.wal_pages * page}")
        self._rconn = connect(path)
        self._wal_path = Path(f"{path}-wal")
        self._wal_fd: int | None = None
        self._syncer = SyncThread("journal fsync")
        self._wconn.executescript(SCHEMA)
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
        self._open: _Pending | None = None  # the queued entry enqueue() adds to
        self._lazy: list[Op] = []  # enqueue_lazy's writes, waiting for the next commit
        self._rlimit = trio.CapacityLimiter(1)
        self.commits = 0  # transactions written (for group-commit figures)
        self.inline_commits = 0  # of which written on the idle loop, not in a thread
        self.ops_written = 0
        self.failures = 0
        self.wedged: Wedged | None = None  # set while writes fail, cleared by one landing
        self.full_checkpoints = 0  # wal_checkpoint(TRUNCATE) runs after SQLITE_FULL
        self._sync_wal()
        fsync_dir(path.parent)  # the journal's files, when this call created them

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
        self._flush_lazy()  # what waited goes first, in this very transaction
        p = _Pending(list(ops), trio.Event(), must_land=must_land, on_written=on_written)
        self._open = None  # later enqueues go after these ops, never before them
        self._send.send_nowait(p)
        await p.done.wait()
        if p.error is not None and not must_land:
            raise JournalError(describe_error(p.error, self.path)) from p.error

    @property
    def settled(self) -> bool:
        """Has everything written so far landed (no write to retry, not wedged)? Read
        after a commit returns: then every op enqueued before it is on disk."""
        return not self._retry and self.wedged is None

    def enqueue(self, ops: Iterable[Op]) -> None:
        """Fire-and-forget write that must eventually land (state records). Writes
        enqueued before the writer next takes its queue share one entry in it (a burst
        enqueues thousands, and an entry and its event each cost more than the op)."""
        self._flush_lazy()
        self._open_entry().ops.extend(ops)

    def enqueue_lazy(self, ops: Iterable[Op]) -> None:
        """A write that must land but need not soon (issue 23): it starts no commit of
        its own, but goes with the next one (ahead of that one's ops: order is kept),
        or on its own after LAZY_FLUSH seconds. For what a crash may lose at no cost:
        state whose loss the protocol repairs by asking again (a guest's entry once
        the home took its report: the report is sent again and answered again).
        Where a queue drains, these were a commit of their own per task."""
        if self._open is not None:  # a write is queued already: go with it
            self.enqueue(ops)
            return
        if not self._lazy:
            self._mark_lazy()
        self._lazy.extend(ops)

    def _mark_lazy(self) -> None:
        """Wake the writer to time a flush of the lazy writes (it may wait for work)."""
        self._send.send_nowait(_Pending([], trio.Event(), must_land=True, lazy_mark=True))

    def _flush_lazy(self) -> None:
        """The lazy writes into the queue, before whatever is queued next."""
        if self._lazy:
            ops, self._lazy = self._lazy, []
            self._open_entry().ops.extend(ops)

    def _open_entry(self) -> _Pending:
        p = self._open
        if p is None:
            p = self._open = _Pending([], trio.Event(), must_land=True)
            self._send.send_nowait(p)
        return p

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The single writer: batches whatever is queued into one transaction."""
        task_status.started()
        while True:
            if self._retry or self.wedged is not None:
                # retry what must land every RETRY_INTERVAL, or probe a wedged journal
                # every PROBE_INTERVAL; only the wait is cancelled, never a write
                # (its waiters would hang)
                self._flush_lazy()  # no waiting for company now
                batch = []
                with trio.move_on_after(RETRY_INTERVAL if self._retry else PROBE_INTERVAL):
                    batch.append(await self._recv.receive())
                self._drain_into(batch)
                await self._write_batch(batch)
                continue
            first = await self._recv.receive()
            if first.lazy_mark:
                # lazy writes wait for company (enqueue_lazy), LAZY_FLUSH at most; what
                # comes meanwhile took them along (commit and enqueue flush them first)
                with trio.move_on_after(LAZY_FLUSH):
                    while first.lazy_mark:
                        first = await self._recv.receive()
                if first.lazy_mark:
                    self._flush_lazy()  # queued as an entry of its own: taken next
                    continue
            batch = [first]
            self._drain_into(batch)
            await self._write_batch(batch)

    def _drain_into(self, batch: list[_Pending]) -> None:
        marked = False
        while True:
            try:
                p = self._recv.receive_nowait()
            except trio.WouldBlock:
                self._open = None  # taken: later enqueues start a new entry
                if marked and self._lazy:  # their mark is taken: time them again
                    self._mark_lazy()
                return
            marked = marked or p.lazy_mark
            batch.append(p)

    async def _write_batch(self, batch: list[_Pending]) -> None:
        """Write what must land again (if anything failed before), then the batch.

        The retries go in their own transaction: after a full disk they may be many
        large records, and a submission must not be refused for their size once its
        own record fits. They are older than anything in the batch, and a batch that
        lands supersedes them (newest record per key wins)."""
        retried = False
        if self._retry:
            retried = True
            if await self._attempt(list(self._retry.values()), []) is None:
                self._retry.clear()
        ops: list[Op] = [op for p in batch for op in p.ops]
        if not ops and (retried or self.wedged is None):
            for p in batch:
                p.done.set()
            return
        # no ops: a probe of a wedged journal (a tiny write) that clears it if it lands
        err = await self._attempt(ops, batch)
        if err is None:
            for op in ops:
                self._retry.pop(retry_key(op), None)
        for p in batch:
            if err is not None:
                if p.must_land:
                    for op in p.ops:
                        self._retry[retry_key(op)] = op
                else:
                    p.error = err
            p.done.set()

    async def _attempt(self, ops: list[Op], batch: list[_Pending]) -> BaseException | None:
        """One transaction of `ops` (none: a probe), written and synced; the error when
        it failed (logged, and the journal is wedged until a write lands)."""
        attempt = _Attempt()
        try:
            try:
                await self._write(ops, batch, attempt)
            except sqlite3.Error as e:
                # A full disk: the WAL may hold most of the space. Once its pages are in
                # the database, a TRUNCATE checkpoint gives that space back; try again.
                if attempt.written or not disk_full(e) or not await self._checkpoint_truncate():
                    raise
                await self._write(ops, batch, attempt)
        except (sqlite3.Error, OSError) as e:
            self.failures += 1
            self._wedge(e)
            # after `written`, the fsync failed: what it was to sync may never reach
            # the disk, and the submitters whose tasks already started must undo them
            what = "journal.sync_failed" if attempt.written else "journal.write_failed"
            failures = self.wedged.failures if self.wedged is not None else 1
            # a submitter's write is always logged; retries and probes once a minute
            if failures % 60 == 1 or any(not p.must_land for p in batch):
                self.log.error(what, error=str(e), ops=len(ops), failures=failures)
            return e
        if self.wedged is not None:
            self.log.info(
                "journal.recovered", failures=self.wedged.failures, error=self.wedged.error
            )
            self.wedged = None
        self.commits += 1
        self.ops_written += len(ops)
        return None

    async def _write(self, ops: list[Op], batch: list[_Pending], attempt: _Attempt) -> None:
        """Write and sync `ops` (no ops: a probe of a wedged journal), running the
        batch's on_written callbacks in between."""
        if trio.lowlevel.current_statistics().tasks_runnable == 0 and len(ops) <= INLINE_OPS:
            # Nothing else is ready to run: write on the loop. Handing the write to a
            # worker thread and back costs two thread wake-ups, ~0.4 ms on an idle
            # VM (half an fsync), and that sat between every lone submission and
            # its acknowledgement. Under load there are runnable tasks: a thread.
            # Written first, then synced: the callbacks (a task's start) run in
            # between, so a lone submission's process starts during the fsync.
            self._write_sync(ops)
            attempt.written = True
            self._written(batch)
            self._sync_wal()
            self.inline_commits += 1
        else:
            # Under load: written on the loop, WRITE_CHUNK ops at a time with a
            # checkpoint between chunks, then synced in a worker thread. Written in a
            # thread, each sqlite call gave up the GIL and had to win it back from the
            # busy loop (up to the 5 ms switch interval): a burst's 10,000-op
            # transaction took seconds where its CPU time is a fraction of one.
            await self._write_chunked(ops)
            attempt.written = True
            self._written(batch)
            await self._syncer.run(self._sync_wal)

    async def _write_chunked(self, ops: list[Op]) -> None:
        """One transaction of `ops` on the loop, a chunk at a time (only this writer
        uses the write connection, so other tasks may run in between)."""
        with self._transaction() as c:
            for i in range(0, len(ops), WRITE_CHUNK):
                if i:
                    # between chunks only: a yield after the last one made every commit
                    # wait a whole turn of a busy loop before its COMMIT (issue 23)
                    await trio.lowlevel.cancel_shielded_checkpoint()
                apply_ops(c, ops[i : i + WRITE_CHUNK], self.node)
            if not ops:
                _probe(c)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE on the write connection; COMMIT, or ROLLBACK on any error."""
        c = self._wconn
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
            c.execute("COMMIT")
        except BaseException:
            try:
                c.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise

    def _wedge(self, e: BaseException) -> None:
        why, full = describe_error(e, self.path), disk_full(e)
        w = self.wedged
        if w is None:
            self.wedged = Wedged(why, self.clock.wall(), disk_full=full)
        else:
            self.wedged = attrs.evolve(w, error=why, disk_full=full, failures=w.failures + 1)

    async def _checkpoint_truncate(self) -> bool:
        """`wal_checkpoint(TRUNCATE)` after SQLITE_FULL: True when the WAL was emptied."""

        def run() -> bool:
            row = self._wconn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            return row is not None and row[0] == 0

        try:
            done = await trio.to_thread.run_sync(run, abandon_on_cancel=False)
        except sqlite3.Error as e:
            self.log.warning("journal.full_checkpoint", result="failed", error=str(e))
            return False
        self.full_checkpoints += 1
        self.log.warning("journal.full_checkpoint", result="ok" if done else "busy")
        return done

    def _written(self, batch: list[_Pending]) -> None:
        for p in batch:
            cb, p.on_written = p.on_written, None
            if cb is None:
                continue
            try:
                cb()
            except Exception as e:  # a caller's bug must not stop the only writer
                self.log.exception("journal.on_written_failed", e)

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
        """One transaction of `ops`; none: a probe (one tiny row) of a wedged journal."""
        with self._transaction() as c:
            apply_ops(c, ops, self.node)
            if not ops:
                _probe(c)

    def close(self) -> None:
        for c in (self._wconn, self._rconn):
            try:
                c.close()
            except sqlite3.Error:
                pass
        self._syncer.close()
        if self._wal_fd is not None:
            os.close(self._wal_fd)
            self._wal_fd = None


def _probe(c: sqlite3.Connection) -> None:
    """The write of a probe of a wedged journal: any changing value does. The system
    clock, as trio's clock (the agent's Clock) cannot be read from a worker thread."""
    c.execute("INSERT OR REPLACE INTO meta(key, value) VALUES('probe', ?)", (repr(time.time()),))
