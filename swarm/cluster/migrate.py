"""Migration messages and the state stream between source and target (pure).

A migration of a running task goes: the source asks the target to *prepare* (the
target re-checks with its fresh load and may refuse), stops the task (checkpoint
signal, kill, or CRIU dump), streams the task's state directory to the target, and
only then moves the task's location through the handoff protocol. This module holds
the messages of that exchange and the receiver's checks; the runtime does the I/O.

The state stream is one `Begin` (in the request that opens the stream), then the
directory's entries in walk order (a directory before anything inside it): `Dir`,
`File` followed by its `Chunk`s, `Link`; then `End`. Every chunk carries a sequence
number and the sha256 of its data; `End` carries the entry count, the byte total and
the sha256 of the whole: the sha256 of all chunk digests in order (each chunk's data
is checked against its digest, so the digest of digests covers every byte, in order,
at the cost of hashing each byte once). The receiver verifies all of it before the
state may be used: a task must never restart from a torn or forged checkpoint, so a
stream that breaks or does not verify is discarded whole, and the task restarts from
the copy that stayed at the source.

The receiver never lets a path leave its staging directory: paths are relative and
normalized (no `..`, no empty or `.` parts), every parent is a directory declared
earlier in the same stream (so never a symlink), and each path appears once.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import attrs

from .. import codec, wire
from ..model import LoadReport, MigrateMode, NodeId, TaskId, TaskSpec
from ..policy.migration import RunningTask

CHUNK = 2 << 20  # bytes of file data per chunk frame (the sender's size)
MAX_CHUNK = 3 << 20  # the largest chunk a receiver accepts (frames are <= 4 MiB)
MAX_PATH = 4096
MAX_ENTRIES = 1_000_000
MAX_RECORD = 16 * 1024  # encoded bytes of one explain / migration record
SHA_LEN = 32


class StateError(wire.SchemaError):
    """The state stream is malformed, inconsistent or does not verify."""


# ------------------------------------------------------------------ prepare


@attrs.frozen
class Prepare:
    """Source -> target before the task is stopped: may I send you this task?"""

    mid: str  # migration id, unique per source: "<source>:<n>"
    spec: TaskSpec
    task: RunningTask  # the figures the source decided on
    source: LoadReport  # the source's load when it decided
    bandwidth: float  # bytes/s the source assumed for this link


def running_task_to_wire(t: RunningTask) -> dict[str, Any]:
    return {
        "task_id": t.task_id,
        "mode": t.mode.value,
        "age": t.age,
        "expected_runtime": t.expected_runtime,
        "state_bytes": t.state_bytes,
        "pause": t.pause,
        "warmup": t.warmup,
        "moves": t.moves,
        "home": t.home,
    }


def running_task_from_wire(obj: Any) -> RunningTask:
    f = wire.Fields(obj, "running task")
    t = RunningTask(
        task_id=f.task_id("task_id", required=True),
        mode=f.enum("mode", MigrateMode, required=True),
        age=f.float("age", 0.0, lo=0.0),
        expected_runtime=f.float("expected_runtime", lo=0.0),
        state_bytes=f.int("state_bytes", 0, lo=0),
        pause=f.float("pause", 0.0, lo=0.0),
        warmup=f.float("warmup", 0.0, lo=0.0),
        moves=f.int("moves", 0, lo=0),
        home=f.str("home", "", max_len=256),
    )
    f.done()
    return t


def prepare_to_wire(p: Prepare) -> dict[str, Any]:
    return {
        "mid": p.mid,
        "spec": codec.task_spec_to_wire(p.spec),
        "task": running_task_to_wire(p.task),
        "source": codec.load_report_to_wire(p.source),
        "bandwidth": p.bandwidth,
    }


def prepare_from_wire(obj: Any) -> Prepare:
    f = wire.Fields(obj, "migrate prepare")
    p = Prepare(
        mid=f.str("mid", required=True, max_len=300),
        spec=wire.decode_with(codec.task_spec_from_wire, f.map("spec", required=True)),
        task=wire.decode_with(running_task_from_wire, f.map("task", required=True)),
        source=wire.decode_with(codec.load_report_from_wire, f.map("source", required=True)),
        bandwidth=f.float("bandwidth", required=True, lo=1e-9),
    )
    f.done()
    if p.task.task_id != p.spec.id:
        raise wire.SchemaError("migrate prepare: task and spec ids differ")
    return p


# ------------------------------------------------------------------ the stream


@attrs.frozen
class Begin:
    """Opens the stream: what comes, and what the target must know of the task."""

    task_id: TaskId
    mid: str
    mode: MigrateMode
    entries: int
    total: int  # bytes of file data
    source: NodeId
    stopped_at: float  # wall clock at the source when the task was stopped
    age: float  # seconds the task had run (all its earlier places included)
    moves: int  # migrations including this one
    files: dict[str, str] = attrs.field(factory=dict)  # CRIU: fd name -> source path


@attrs.frozen
class Dir:
    path: str
    mode: int


@attrs.frozen
class File:
    path: str
    mode: int
    size: int


@attrs.frozen
class Link:
    path: str
    target: str


@attrs.frozen
class Chunk:
    seq: int
    data: bytes
    sha256: bytes


@attrs.frozen
class End:
    entries: int
    total: int
    sha256: bytes


Frame = Dir | File | Link | Chunk | End


def begin_to_wire(b: Begin) -> dict[str, Any]:
    return {
        "task_id": b.task_id,
        "mid": b.mid,
        "mode": b.mode.value,
        "entries": b.entries,
        "total": b.total,
        "source": b.source,
        "stopped_at": b.stopped_at,
        "age": b.age,
        "moves": b.moves,
        "files": dict(b.files),
    }


def begin_from_wire(obj: Any) -> Begin:
    f = wire.Fields(obj, "state begin")
    b = Begin(
        task_id=f.task_id("task_id", required=True),
        mid=f.str("mid", required=True, max_len=300),
        mode=f.enum("mode", MigrateMode, required=True),
        entries=f.int("entries", required=True, lo=0, hi=MAX_ENTRIES),
        total=f.int("total", required=True, lo=0),
        source=f.str("source", required=True, max_len=256),
        stopped_at=f.float("stopped_at", 0.0),
        age=f.float("age", 0.0, lo=0.0),
        moves=f.int("moves", 0, lo=0),
        files=f.str_map("files", max_items=16),
    )
    f.done()
    return b


def frame_to_wire(fr: Frame) -> dict[str, Any]:
    if isinstance(fr, Dir):
        return {"t": "dir", "path": fr.path, "mode": fr.mode}
    if isinstance(fr, File):
        return {"t": "file", "path": fr.path, "mode": fr.mode, "size": fr.size}
    if isinstance(fr, Link):
        return {"t": "link", "path": fr.path, "target": fr.target}
    if isinstance(fr, Chunk):
        return {"t": "chunk", "seq": fr.seq, "data": fr.data, "sha256": fr.sha256}
    return {"t": "end", "entries": fr.entries, "total": fr.total, "sha256": fr.sha256}


def frame_from_wire(obj: Any) -> Frame:
    f = wire.Fields(obj, "state frame")
    kind = f.str("t", required=True, max_len=8)
    fr: Frame
    if kind == "dir":
        fr = Dir(f.str("path", required=True, max_len=MAX_PATH), f.int("mode", 0o700, lo=0))
    elif kind == "file":
        fr = File(
            f.str("path", required=True, max_len=MAX_PATH),
            f.int("mode", 0o600, lo=0),
            f.int("size", required=True, lo=0),
        )
    elif kind == "link":
        fr = Link(
            f.str("path", required=True, max_len=MAX_PATH),
            f.str("target", required=True, max_len=MAX_PATH),
        )
    elif kind == "chunk":
        fr = Chunk(f.int("seq", required=True, lo=0), f.bytes("data", required=True), _sha(f))
    elif kind == "end":
        fr = End(
            f.int("entries", required=True, lo=0),
            f.int("total", required=True, lo=0),
            _sha(f),
        )
    else:
        raise wire.SchemaError(f"state frame: unknown kind {kind!r}")
    f.done()
    return fr


def _sha(f: wire.Fields) -> bytes:
    v: bytes = f.bytes("sha256", required=True)
    if len(v) != SHA_LEN:
        raise wire.SchemaError("state frame: sha256 must be 32 bytes")
    return v


def check_relpath(path: str) -> str:
    """A path that stays inside the staging directory, or StateError."""
    if not path or len(path) > MAX_PATH or "\x00" in path or path.startswith("/"):
        raise StateError(f"state: bad path {path[:80]!r}")
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise StateError(f"state: path {path[:80]!r} is not normalized")
    return path


def parent_of(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


# ------------------------------------------------------------------ receiver


@attrs.frozen
class MakeDir:
    path: str
    mode: int


@attrs.frozen
class OpenFile:
    path: str
    mode: int
    size: int


@attrs.frozen
class Write:
    data: bytes


@attrs.frozen
class CloseFile:
    path: str


@attrs.frozen
class MakeLink:
    path: str
    target: str


@attrs.frozen
class Complete:
    entries: int
    total: int


Action = MakeDir | OpenFile | Write | CloseFile | MakeLink | Complete

_MODE_MASK = 0o777  # no setuid, setgid or sticky bits from the wire


class StateReceiver:
    """Checks one state stream frame by frame and says what to write.

    `feed` returns the actions for the adapter to apply in order, or raises
    StateError; after an error the whole staging directory is to be discarded.
    `max_bytes` bounds what this node accepts (free disk, policy).
    """

    def __init__(self, begin: Begin, *, max_bytes: int) -> None:
        if begin.total > max_bytes:
            raise StateError(f"state of {begin.total} bytes exceeds the {max_bytes} accepted here")
        self.begin = begin
        self.entries = 0
        self.bytes = 0
        self.declared = 0  # sum of announced file sizes
        self.seq = 0
        self.dirs: set[str] = {""}
        self.paths: set[str] = set()
        self.open: tuple[str, int] | None = None  # (path, size)
        self.written = 0
        self.digest = hashlib.sha256()
        self.done = False

    def _close(self) -> list[Action]:
        if self.open is None:
            return []
        path, size = self.open
        if self.written != size:
            raise StateError(f"state: {path} got {self.written} of {size} bytes")
        self.open = None
        return [CloseFile(path)]

    def _entry(self, path: str) -> list[Action]:
        out = self._close()
        check_relpath(path)
        if path in self.paths:
            raise StateError(f"state: {path} sent twice")
        if parent_of(path) not in self.dirs:
            raise StateError(f"state: {path} comes before its directory")
        self.entries += 1
        if self.entries > self.begin.entries:
            raise StateError(f"state: more than the {self.begin.entries} entries announced")
        self.paths.add(path)
        return out

    def feed(self, fr: Frame) -> list[Action]:
        if self.done:
            raise StateError("state: frame after the end")
        if isinstance(fr, Dir):
            out = self._entry(fr.path)
            self.dirs.add(fr.path)
            return [*out, MakeDir(fr.path, (fr.mode & _MODE_MASK) | 0o700)]
        if isinstance(fr, File):
            out = self._entry(fr.path)
            self.declared += fr.size
            if self.declared > self.begin.total:
                raise StateError(f"state: files exceed the {self.begin.total} bytes announced")
            self.open = (fr.path, fr.size)
            self.written = 0
            return [*out, OpenFile(fr.path, (fr.mode & _MODE_MASK) | 0o600, fr.size)]
        if isinstance(fr, Link):
            out = self._entry(fr.path)
            if not fr.target or "\x00" in fr.target:
                raise StateError(f"state: bad link target for {fr.path}")
            return [*out, MakeLink(fr.path, fr.target)]
        if isinstance(fr, Chunk):
            if self.open is None:
                raise StateError("state: chunk outside a file")
            if fr.seq != self.seq:
                raise StateError(f"state: chunk {fr.seq} where {self.seq} was due")
            if not fr.data or len(fr.data) > MAX_CHUNK:
                raise StateError(f"state: chunk of {len(fr.data)} bytes")
            if hashlib.sha256(fr.data).digest() != fr.sha256:
                raise StateError(f"state: chunk {fr.seq} fails its checksum")
            path, size = self.open
            if self.written + len(fr.data) > size:
                raise StateError(f"state: {path} longer than its {size} bytes")
            self.seq += 1
            self.written += len(fr.data)
            self.bytes += len(fr.data)
            self.digest.update(fr.sha256)
            return [Write(fr.data)]
        out = self._close()
        if fr.entries != self.begin.entries or self.entries != fr.entries:
            raise StateError(f"state: {self.entries} entries, {fr.entries} announced at the end")
        if fr.total != self.begin.total or self.bytes != fr.total:
            raise StateError(f"state: {self.bytes} bytes, {fr.total} announced at the end")
        if self.digest.digest() != fr.sha256:
            raise StateError("state: the whole stream fails its checksum")
        self.done = True
        return [*out, Complete(self.entries, self.bytes)]


# ------------------------------------------------------------------ records


def check_record(obj: Any, what: str = "migration record") -> dict[str, Any]:
    """An explain or migration record from a peer: a small map of plain values.

    Records are for people (`swarm explain`, `swarm status`); they never drive a
    decision, so the check is only that they are small and made of plain data."""
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise wire.SchemaError(f"{what}: expected a map with string keys")
    try:
        size = len(wire.pack(obj))
    except (TypeError, ValueError, OverflowError) as e:
        raise wire.SchemaError(f"{what}: {e}") from None
    if size > MAX_RECORD:
        raise wire.SchemaError(f"{what}: {size} bytes (max {MAX_RECORD})")
    _plain(obj, what, 0)
    return obj


def _plain(v: Any, what: str, depth: int) -> None:
    if depth > 4:
        raise wire.SchemaError(f"{what}: nested too deep")
    if v is None or isinstance(v, (bool, int, str)):
        return
    if isinstance(v, float):
        if not math.isfinite(v):
            raise wire.SchemaError(f"{what}: numbers must be finite")
        return
    if isinstance(v, (list, tuple)):
        for x in v:
            _plain(x, what, depth + 1)
        return
    if isinstance(v, dict):
        for k, x in v.items():
            if not isinstance(k, str):
                raise wire.SchemaError(f"{what}: keys must be strings")
            _plain(x, what, depth + 1)
        return
    raise wire.SchemaError(f"{what}: unsupported value of type {type(v).__name__}")


def merge_records(parts: list[Any]) -> list[dict[str, Any]]:
    """One record per migration from its partial records, in the order first seen.

    The source, the target and the home each contribute fields of a migration (the
    decision and the outcome; the resume and the pause), in any order, keyed by the
    migration id `mid`; later values win. Parts without a string `mid` are ignored."""
    merged: dict[str, dict[str, Any]] = {}
    for p in parts:
        if not isinstance(p, dict) or not isinstance(p.get("mid"), str):
            continue
        merged.setdefault(p["mid"], {}).update(p)
    return list(merged.values())
