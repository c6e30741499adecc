"""The journal's database: tables, the operations a batch is made of and how each is
written, record encoding, connection set-up, file modes, WAL sizing and error
classification.

Everything here is synchronous and knows nothing of batching: `journal.Journal` (the
single group-committing writer and the readers) decides when and where (the loop
or a worker thread) these run. Split from `journal.py` so that the writer's
failure policy reads apart from the SQL.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import attrs
import msgpack

from .. import codec, wire
from .. import model as m

SCHEMA_VERSION = 1
WAL_MAX_PAGES = 1000  # sqlite's own autocheckpoint: what any real disk keeps
WAL_MIN_PAGES = 32
WAL_DISK_SHARE = 8  # the WAL may take at most 1/8 of the state filesystem
FILE_MODE = 0o600  # the journal's files: task argv, env and results are private
SQLITE_FULL = 13  # sqlite3.Error.sqlite_errorcode (primary code) of "disk is full"

SCHEMA = """
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
CREATE TABLE IF NOT EXISTS shims(
    task_id TEXT PRIMARY KEY, task_pid INTEGER NOT NULL, status_dir TEXT NOT NULL
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
    """A process started for a task: lets a restarted agent find and kill orphans, or,
    under a supervisor (`task_pid` set: `pid` and `create_time` are the shim's), find
    the task again or its end (runtime/shim.py)."""

    task_id: m.TaskId
    pid: int
    create_time: float
    task_pid: int = 0
    status_dir: str = ""


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


def apply_op(c: sqlite3.Connection, op: Op, node: str) -> None:
    """Write one op in the open transaction of `c`; `node` names this node in events
    that do not name one."""
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
                encode_task(t),
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
                    encode_event(
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
        if op.task_pid:
            c.execute(
                "INSERT OR REPLACE INTO shims(task_id, task_pid, status_dir) VALUES(?,?,?)",
                (op.task_id, op.task_pid, op.status_dir),
            )
    elif isinstance(op, DelProc):
        c.execute("DELETE FROM procs WHERE task_id=?", (op.task_id,))
        c.execute("DELETE FROM shims WHERE task_id=?", (op.task_id,))
    elif isinstance(op, Event):
        c.execute(
            "INSERT INTO events(at, kind, task_id, node, data) VALUES(?,?,?,?,?)",
            (
                op.at,
                op.kind,
                op.task_id,
                op.node or node,
                encode_event(op.data),
            ),
        )


_UPSERT_TASK = (
    "INSERT INTO tasks(id, state, terminal, updated, record) VALUES(?,?,?,?,?) "
    "ON CONFLICT(id) DO UPDATE SET state=excluded.state, terminal=excluded.terminal, "
    "updated=excluded.updated, record=excluded.record"
)
_INSERT_EVENT = "INSERT INTO events(at, kind, task_id, node, data) VALUES(?,?,?,?,?)"
_UPSERT_KV = (
    "INSERT INTO kv(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value"
)


def apply_ops(c: sqlite3.Connection, ops: list[Op], node: str) -> None:
    """Write `ops` in the open transaction of `c`, as `apply_op` would one by one, in a
    handful of `executemany` calls: the last write per task and per key (a record is
    rewritten whole), every event. The writer runs in a worker thread, and each sqlite
    call gives up the GIL and must win it back from a busy event loop (up to the
    interpreter's 5 ms switch interval): thousands of calls per transaction made a
    burst's commits take most of a second. A batch with a retention delete is rare and
    is written op by op, in order. Process rows (a start's PutProc, an end's DelProc)
    are in most of a runner's batches: batched too, the last write per task (a PutProc
    without a shim leaves the shim row as it was, as apply_op does)."""
    if any(isinstance(op, ForgetFinished) for op in ops):
        for op in ops:
            apply_op(c, op, node)
        return
    tasks: dict[str, m.Task | None] = {}
    kv: dict[str, PutKV | None] = {}  # packed once, the last write per key
    procs: dict[str, tuple[int, float] | None] = {}
    shims: dict[str, tuple[int, str] | None] = {}
    events: list[tuple[Any, ...]] = []
    for op in ops:
        if isinstance(op, PutProc):
            procs[op.task_id] = (op.pid, op.create_time)
            if op.task_pid:
                shims[op.task_id] = (op.task_pid, op.status_dir)
            continue
        if isinstance(op, DelProc):
            procs[op.task_id] = shims[op.task_id] = None
            continue
        if isinstance(op, PutTask):
            t = op.task
            tasks.pop(t.id, None)  # the last write goes last
            tasks[t.id] = t
            if t.history:
                tr = t.history[-1]
                data = {"src": tr.src.value if tr.src else None, "dst": tr.dst.value}
                data["cause"] = tr.cause
                events.append((tr.at, "transition", t.id, tr.node, encode_event(data)))
        elif isinstance(op, DelTask):
            tasks.pop(op.task_id, None)
            tasks[op.task_id] = None
        elif isinstance(op, PutKV):
            kv.pop(op.key, None)
            kv[op.key] = op
        elif isinstance(op, DelKV):
            kv.pop(op.key, None)
            kv[op.key] = None
        elif isinstance(op, Event):
            blob = encode_event(op.data)
            events.append((op.at, op.kind, op.task_id, op.node or node, blob))
    dels = [(k,) for k, v in tasks.items() if v is None]
    if dels:
        c.executemany("DELETE FROM tasks WHERE id=?", dels)
    rows = [
        (
            t.id,
            t.state.value,
            int(t.state.terminal),
            t.history[-1].at if t.history else 0.0,
            encode_task(t),
        )
        for t in tasks.values()
        if t is not None
    ]
    if rows:
        c.executemany(_UPSERT_TASK, rows)
    if events:
        c.executemany(_INSERT_EVENT, events)
    kdels = [(k,) for k, v in kv.items() if v is None]
    if kdels:
        c.executemany("DELETE FROM kv WHERE key=?", kdels)
    kput = [(k, wire.pack(v.value)) for k, v in kv.items() if v is not None]
    if kput:
        c.executemany(_UPSERT_KV, kput)
    _apply_procs(c, procs, shims)


def _apply_procs(
    c: sqlite3.Connection,
    procs: dict[str, tuple[int, float] | None],
    shims: dict[str, tuple[int, str] | None],
) -> None:
    """The process and shim rows of a batch, each task's last write (apply_ops)."""
    for table, rows in (("procs", procs), ("shims", shims)):
        gone = [(k,) for k, v in rows.items() if v is None]
        if gone:
            c.executemany(f"DELETE FROM {table} WHERE task_id=?", gone)
    put = [(k, *v) for k, v in procs.items() if v is not None]
    if put:
        c.executemany("INSERT OR REPLACE INTO procs(task_id, pid, create_time) VALUES(?,?,?)", put)
    sput = [(k, *v) for k, v in shims.items() if v is not None]
    if sput:
        c.executemany(
            "INSERT OR REPLACE INTO shims(task_id, task_pid, status_dir) VALUES(?,?,?)", sput
        )


def retry_key(op: Op) -> str:
    if isinstance(op, (PutTask, DelTask, ForgetFinished)):
        return "task:" + (op.task.id if isinstance(op, PutTask) else op.task_id)
    if isinstance(op, (PutKV, DelKV)):
        return "kv:" + op.key
    if isinstance(op, (PutProc, DelProc)):
        return "proc:" + op.task_id
    return f"event:{id(op)}"


@attrs.frozen
class Recovered:
    """What a starting agent reads back."""

    active: list[m.Task]  # every non-terminal task
    kv: dict[str, Any]
    procs: dict[m.TaskId, tuple[int, float]]
    # tasks started under a shim: (the task's pid, the shim's status directory)
    shims: dict[m.TaskId, tuple[int, str]] = attrs.field(factory=dict)
    # finished tasks that still have a guest entry (their result not yet acknowledged
    # by their home): the state machine must know they ended, e.g. to adopt the result
    # rather than run the task again when that home turns out to be gone; and our own
    # whose copies (`repls:`) or stray copies (`strays:`) are owed the release, which
    # says how the task ended
    owed: list[m.Task] = attrs.field(factory=list)


def connect(path: Path, synchronous: str = "FULL") -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def encode_event(data: Any) -> bytes:
    """An event's data (a transition, a placement decision, a shares change), as
    msgpack: 3-4x cheaper to make than JSON (issue 23: encoding the decisions of an
    array burst was 6 % of the home's loop). Journals written before hold JSON text
    in the same column; decode_event reads both. A value msgpack has no type for
    goes as its str() (an integer past 64 bits too); what fails even so goes as its
    repr: an event must never fail the journal's transaction, which would wedge it."""
    try:
        return wire.pack_lenient(data)
    except (TypeError, ValueError, OverflowError):
        return wire.pack_lenient({"unencodable": repr(data)[:4096]})


def decode_event(data: Any) -> Any:
    """An event's data, as written by encode_event (bytes) or by an older agent
    (JSON text); ValueError when it is neither."""
    if isinstance(data, bytes):
        try:
            # our own journal: map keys need not be strings (JSON made them so)
            return msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as e:  # msgpack raises several types on bad input
            raise ValueError(f"event data: {e}") from None
    if isinstance(data, str):
        return json.loads(data)
    raise ValueError(f"event data of type {type(data).__name__}")


def encode_task(task: m.Task) -> bytes:
    return wire.pack(codec.task_to_wire(task))


def decode_task(blob: bytes) -> m.Task:
    return wire.decode_with(codec.task_from_wire, wire.unpack(blob))


def private_files(path: Path) -> None:
    """Create the database file 0600 when missing, and tighten an existing database
    and its WAL and shared-memory files (made by an older agent) to 0600. sqlite
    creates the WAL and shared-memory files with the database's mode."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE)
    try:
        if os.fstat(fd).st_mode & 0o777 != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):
        try:
            fd = os.open(f"{path}{suffix}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            continue
        try:
            if os.fstat(fd).st_mode & 0o777 != FILE_MODE:
                os.fchmod(fd, FILE_MODE)
        finally:
            os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def wal_pages(fs_bytes: int, page_size: int) -> int:
    """Pages the WAL may grow to before a checkpoint (and is cut back to after one)
    on a filesystem of `fs_bytes`: 1/WAL_DISK_SHARE of it, within
    [WAL_MIN_PAGES, WAL_MAX_PAGES]."""
    return max(WAL_MIN_PAGES, min(WAL_MAX_PAGES, fs_bytes // WAL_DISK_SHARE // page_size))


def disk_full(e: BaseException) -> bool:
    if isinstance(e, sqlite3.Error):
        return (getattr(e, "sqlite_errorcode", 0) or 0) & 0xFF == SQLITE_FULL
    return isinstance(e, OSError) and e.errno == errno.ENOSPC


def describe_error(e: BaseException, path: Path) -> str:
    """One line for a failed journal write; a full disk names where space is needed."""
    if disk_full(e):
        return f"no space left for the journal in {path.parent} ({e})"
    return str(e)


def integrity_check(path: Path) -> str:
    """`PRAGMA integrity_check` on a journal file; 'ok' when healthy."""
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()
