"""Length-prefixed msgpack frames and schema-checked decoding into model types.

Every byte that comes from outside (the submit socket, peers) goes through here.
Decoding never raises anything but `WireError` subclasses, so callers can answer
with a clear error (or drop and count) instead of crashing.

Frame: 4-byte big-endian length, then one msgpack map. Maps carry "v" (protocol
version) where they are top-level messages.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import msgpack

from . import model as m

PROTOCOL_VERSION = 1
MAX_FRAME = 4 * 1024 * 1024  # default limit for one frame (submit socket, RPC)
_HEADER = struct.Struct(">I")

T = TypeVar("T")


class WireError(Exception):
    """Anything wrong with bytes from outside. `code` is stable for clients."""

    code = "bad_request"


class FrameTooLarge(WireError):
    code = "frame_too_large"


class MalformedFrame(WireError):
    code = "malformed"


class SchemaError(WireError):
    code = "invalid"


class VersionMismatch(WireError):
    code = "version"


# --------------------------------------------------------------------- framing


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes, max_size: int = MAX_FRAME) -> Any:
    """Decode one msgpack object; bounded so a hostile frame cannot blow up memory."""
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_str_len=max_size,
            max_bin_len=max_size,
            max_array_len=min(max_size, 1_000_000),
            max_map_len=100_000,
            max_ext_len=0,
        )
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise MalformedFrame(f"malformed msgpack: {e}") from None
    except (ValueError, TypeError, UnicodeDecodeError, OverflowError) as e:
        raise MalformedFrame(f"malformed msgpack: {e}") from None
    except Exception as e:  # msgpack can raise odd things on hostile input
        raise MalformedFrame(f"malformed msgpack: {type(e).__name__}: {e}") from None


def encode_frame(obj: Any, max_size: int = MAX_FRAME) -> bytes:
    body = pack(obj)
    if len(body) > max_size:
        raise FrameTooLarge(f"frame of {len(body)} bytes exceeds limit {max_size}")
    return _HEADER.pack(len(body)) + body


class FrameDecoder:
    """Sans-IO frame splitter: feed bytes, get decoded objects.

    An oversized length prefix raises FrameTooLarge before buffering the body, so a
    peer cannot make us allocate what it claims. After an error the stream is
    unsynchronised; callers answer once and close.
    """

    def __init__(self, max_size: int = MAX_FRAME) -> None:
        self.max_size = max_size
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self._buf += data
        out: list[Any] = []
        while len(self._buf) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._buf)
            if length > self.max_size:
                raise FrameTooLarge(f"frame of {length} bytes exceeds limit {self.max_size}")
            if len(self._buf) < _HEADER.size + length:
                break
            body = bytes(self._buf[_HEADER.size : _HEADER.size + length])
            del self._buf[: _HEADER.size + length]
            out.append(unpack(body, self.max_size))
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)


# --------------------------------------------------------------- field checks


class Fields:
    """Strict reader for one decoded map: typed getters, unknown keys rejected.

    Usage: f = Fields(obj, "submit"); x = f.str("name", ""); ...; f.done()
    """

    def __init__(self, obj: Any, what: str, ignore: tuple[str, ...] = ()) -> None:
        if not isinstance(obj, dict):
            raise SchemaError(f"{what}: expected a map, got {type(obj).__name__}")
        self.obj: dict[str, Any] = obj
        self.what = what
        self.seen: set[str] = set(ignore)

    def _get(self, key: str, default: Any, required: bool) -> Any:
        self.seen.add(key)
        if key not in self.obj or self.obj[key] is None:
            if required:
                raise SchemaError(f"{self.what}: missing field {key!r}")
            return default
        return self.obj[key]

    def _bad(self, key: str, want: str, got: Any) -> SchemaError:
        return SchemaError(f"{self.what}: field {key!r} must be {want}, got {got!r:.60}")

    def str(self, key: str, default: Any = None, *, required: bool = False, max_len: int = 4096) -> Any:
        v = self._get(key, default, required)
        if v is default and not required:
            return v
        if not isinstance(v, str):
            raise self._bad(key, "a string", v)
        if len(v) > max_len:
            raise SchemaError(f"{self.what}: field {key!r} longer than {max_len}")
        return v

    def int(
        self,
        key: str,
        default: Any = None,
        *,
        required: bool = False,
        lo: int | None = None,
        hi: int | None = None,
    ) -> Any:
        v = self._get(key, default, required)
        if v is default and not required:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._bad(key, "an integer", v)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise SchemaError(f"{self.what}: field {key!r}={v} out of range [{lo}, {hi}]")
        return v

    def float(
        self,
        key: str,
        default: Any = None,
        *,
        required: bool = False,
        lo: float | None = None,
        hi: float | None = None,
    ) -> Any:
        v = self._get(key, default, required)
        if v is default and not required:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self._bad(key, "a number", v)
        v = float(v)
        if not math.isfinite(v):
            raise SchemaError(f"{self.what}: field {key!r} must be finite")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise SchemaError(f"{self.what}: field {key!r}={v} out of range [{lo}, {hi}]")
        return v

    def bool(self, key: str, default: Any = None, *, required: bool = False) -> Any:
        v = self._get(key, default, required)
        if v is default and not required:
            return v
        if not isinstance(v, bool):
            raise self._bad(key, "a boolean", v)
        return v

    def bytes(self, key: str, default: Any = None, *, required: bool = False) -> Any:
        v = self._get(key, default, required)
        if v is default and not required:
            return v
        if not isinstance(v, bytes):
            raise self._bad(key, "bytes", v)
        return v

    def str_list(self, key: str, *, required: bool = False, max_items: int = 4096) -> list[str]:
        v = self._get(key, [], required)
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
            raise self._bad(key, "a list of strings", v)
        if len(v) > max_items:
            raise SchemaError(f"{self.what}: field {key!r} has more than {max_items} items")
        return list(v)

    def str_map(self, key: str, *, max_items: int = 4096) -> dict[str, str]:
        v = self._get(key, {}, False)
        if not isinstance(v, dict) or not all(
            isinstance(k, str) and isinstance(x, str) for k, x in v.items()
        ):
            raise self._bad(key, "a map of strings to strings", v)
        if len(v) > max_items:
            raise SchemaError(f"{self.what}: field {key!r} has more than {max_items} items")
        return dict(v)

    def list(self, key: str, *, required: bool = False) -> list[Any]:
        v = self._get(key, [], required)
        if not isinstance(v, (list, tuple)):
            raise self._bad(key, "a list", v)
        return list(v)

    def map(self, key: str, *, required: bool = False) -> dict[str, Any]:
        v = self._get(key, {}, required)
        if not isinstance(v, dict):
            raise self._bad(key, "a map", v)
        return v

    def nested(self, key: str, decode: Callable[[Any], T], default: Any = None) -> Any:
        v = self._get(key, default, False)
        if v is default:
            return v
        return decode(v)

    def enum(self, key: str, cls: type[Any], default: Any = None, *, required: bool = False) -> Any:
        v = self._get(key, default, required)
        if v is default and not required:
            return v
        try:
            return cls(v)
        except ValueError:
            choices = ", ".join(str(c.value) for c in cls)
            raise SchemaError(
                f"{self.what}: field {key!r} must be one of {choices}, got {v!r:.40}"
            ) from None

    def done(self) -> None:
        unknown = sorted(set(self.obj) - self.seen)
        if unknown:
            raise SchemaError(f"{self.what}: unknown field(s) {', '.join(map(repr, unknown))}")


def check_version(obj: Any, what: str) -> None:
    if not isinstance(obj, dict):
        raise SchemaError(f"{what}: expected a map, got {type(obj).__name__}")
    v = obj.get("v", PROTOCOL_VERSION)
    if v != PROTOCOL_VERSION:
        raise VersionMismatch(f"{what}: protocol version {v!r} not supported (want {PROTOCOL_VERSION})")


# ------------------------------------------------------------------ codecs


def gpu_request_to_wire(g: m.GpuRequest) -> dict[str, Any]:
    return {"core": g.core, "memory_bytes": g.memory_bytes, "memory_ratio": g.memory_ratio}


def gpu_request_from_wire(obj: Any) -> m.GpuRequest:
    f = Fields(obj, "gpu")
    g = m.GpuRequest(
        core=f.int("core", required=True, lo=0, hi=100 * 1024),
        memory_bytes=f.int("memory_bytes", lo=0),
        memory_ratio=f.int("memory_ratio", lo=0, hi=100 * 1024),
    )
    f.done()
    return g


def task_spec_to_wire(s: m.TaskSpec) -> dict[str, Any]:
    return {
        "id": s.id,
        "argv": list(s.argv),
        "name": s.name,
        "env": dict(s.env),
        "cwd": s.cwd,
        "weight": s.weight,
        "reserve_shares": s.reserve_shares,
        "is_global": s.is_global,
        "labels": dict(s.labels),
        "uid": s.uid,
        "user": s.user,
        "no_retry": s.no_retry,
        "cpu": s.cpu,
        "mem": s.mem,
        "gpu": None if s.gpu is None else gpu_request_to_wire(s.gpu),
        "migrate": s.migrate.value,
        "expected_runtime": s.expected_runtime,
        "submitted_at": s.submitted_at,
        "home": s.home,
    }


def task_spec_from_wire(obj: Any) -> m.TaskSpec:
    f = Fields(obj, "task")
    argv = f.str_list("argv", required=True, max_items=65536)
    if not argv:
        raise SchemaError("task: argv must not be empty")
    spec = m.TaskSpec(
        id=f.str("id", required=True, max_len=128),
        argv=tuple(argv),
        name=f.str("name", ""),
        env=f.str_map("env"),
        cwd=f.str("cwd"),
        weight=f.float("weight", 1.0, lo=0.0, hi=1e6),
        reserve_shares=f.int("reserve_shares", 0, lo=0, hi=1 << 31),
        is_global=f.bool("is_global", False),
        labels=f.str_map("labels"),
        uid=f.int("uid", lo=0, hi=(1 << 32) - 1),
        user=f.str("user"),
        no_retry=f.bool("no_retry", False),
        cpu=f.float("cpu", lo=0.0, hi=1e6),
        mem=f.int("mem", lo=0),
        gpu=f.nested("gpu", gpu_request_from_wire),
        migrate=f.enum("migrate", m.MigrateMode, m.MigrateMode.NEVER),
        expected_runtime=f.float("expected_runtime", lo=0.0),
        submitted_at=f.float("submitted_at", 0.0),
        home=f.str("home", ""),
    )
    f.done()
    return spec


def _state_or_none(v: m.TaskState | None) -> str | None:
    return None if v is None else v.value


def transition_to_wire(t: m.Transition) -> dict[str, Any]:
    return {"at": t.at, "src": _state_or_none(t.src), "dst": t.dst.value, "cause": t.cause, "node": t.node}


def transition_from_wire(obj: Any) -> m.Transition:
    f = Fields(obj, "transition")
    t = m.Transition(
        at=f.float("at", required=True),
        src=f.enum("src", m.TaskState),
        dst=f.enum("dst", m.TaskState, required=True),
        cause=f.str("cause", "", max_len=65536),
        node=f.str("node", ""),
    )
    f.done()
    return t


def task_to_wire(t: m.Task) -> dict[str, Any]:
    return {
        "spec": task_spec_to_wire(t.spec),
        "state": t.state.value,
        "node": t.node,
        "attempts": t.attempts,
        "exit_code": t.exit_code,
        "signal": t.signal,
        "reason": t.reason,
        "created_at": t.created_at,
        "started_at": t.started_at,
        "finished_at": t.finished_at,
        "history": [transition_to_wire(x) for x in t.history],
    }


def task_from_wire(obj: Any) -> m.Task:
    f = Fields(obj, "task record")
    t = m.Task(
        spec=task_spec_from_wire(f.map("spec", required=True)),
        state=f.enum("state", m.TaskState, required=True),
        node=f.str("node", ""),
        attempts=f.int("attempts", 0, lo=0),
        exit_code=f.int("exit_code"),
        signal=f.int("signal"),
        reason=f.str("reason", "", max_len=65536),
        created_at=f.float("created_at", 0.0),
        started_at=f.float("started_at"),
        finished_at=f.float("finished_at"),
        history=tuple(transition_from_wire(x) for x in f.list("history")),
    )
    f.done()
    return t


def gpu_free_to_wire(g: m.GpuDeviceFree) -> list[int]:
    return [g.index, g.free_core, g.free_mem, g.total_mem]


def gpu_free_from_wire(obj: Any) -> m.GpuDeviceFree:
    if (
        not isinstance(obj, (list, tuple))
        or len(obj) != 4
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in obj)
    ):
        raise SchemaError(f"gpu summary: expected [index, free_core, free_mem, total_mem], got {obj!r:.60}")
    return m.GpuDeviceFree(*obj)


def load_report_to_wire(r: m.LoadReport) -> dict[str, Any]:
    return {
        "node": r.node,
        "version": r.version,
        "shares": r.shares,
        "reserved_shares": r.reserved_shares,
        "weight_sum": r.weight_sum,
        "queued": r.queued,
        "running": r.running,
        "slots": r.slots,
        "cpu_util": r.cpu_util,
        "load_per_core": r.load_per_core,
        "cpus": r.cpus,
        "mem_available": r.mem_available,
        "mem_total": r.mem_total,
        "psi_cpu": r.psi_cpu,
        "psi_mem": r.psi_mem,
        "gpus": [gpu_free_to_wire(g) for g in r.gpus],
        "isolation": r.isolation,
        "criu": r.criu,
    }


def load_report_from_wire(obj: Any) -> m.LoadReport:
    f = Fields(obj, "load report")
    r = m.LoadReport(
        node=f.str("node", required=True, max_len=256),
        version=f.int("version", required=True, lo=0),
        shares=f.int("shares", m.DEFAULT_SHARES, lo=-(1 << 40), hi=1 << 40),
        reserved_shares=f.int("reserved_shares", 0, lo=-(1 << 40), hi=1 << 40),
        weight_sum=f.float("weight_sum", 0.0, lo=-1e12, hi=1e12),
        queued=f.int("queued", 0, lo=0),
        running=f.int("running", 0, lo=0),
        slots=f.int("slots", 1, lo=0),
        cpu_util=f.float("cpu_util", 0.0, lo=0.0),
        load_per_core=f.float("load_per_core", 0.0, lo=0.0),
        cpus=f.float("cpus", 0.0, lo=0.0, hi=1e6),
        mem_available=f.int("mem_available", 0, lo=0),
        mem_total=f.int("mem_total", 0, lo=0),
        psi_cpu=f.float("psi_cpu", 0.0, lo=0.0),
        psi_mem=f.float("psi_mem", 0.0, lo=0.0),
        gpus=tuple(gpu_free_from_wire(x) for x in f.list("gpus")),
        isolation=f.str("isolation", "none", max_len=32),
        criu=f.bool("criu", False),
    )
    f.done()
    return r


def member_to_wire(mb: m.Member) -> dict[str, Any]:
    return {
        "node": mb.node,
        "addr": mb.addr,
        "port": mb.port,
        "state": mb.state.value,
        "incarnation": mb.incarnation,
        "cluster": mb.cluster,
    }


def member_from_wire(obj: Any) -> m.Member:
    f = Fields(obj, "member")
    mb = m.Member(
        node=f.str("node", required=True, max_len=256),
        addr=f.str("addr", required=True, max_len=256),
        port=f.int("port", required=True, lo=0, hi=65535),
        state=f.enum("state", m.MemberState, m.MemberState.ALIVE),
        incarnation=f.int("incarnation", 0, lo=0),
        cluster=f.str("cluster", "", max_len=256),
    )
    f.done()
    return mb


def decode_with(decode: Callable[[Any], T], obj: Any) -> T:
    """Run a codec, converting any stray exception into SchemaError (never crash)."""
    try:
        return decode(obj)
    except WireError:
        raise
    except Exception as e:
        raise SchemaError(f"invalid value: {type(e).__name__}: {e}") from None


def as_map(obj: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(obj, dict):
        raise SchemaError(f"{what}: expected a map, got {type(obj).__name__}")
    return obj
