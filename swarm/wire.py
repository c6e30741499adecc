"""Length-prefixed msgpack frames and schema-checked decoding into model types.

Every byte that comes from outside (the submit socket, peers) goes through here.
Decoding never raises anything but `WireError` subclasses, so callers can answer
with a clear error (or drop and count) instead of crashing.

Frame: 4-byte big-endian length, then one msgpack map. Maps carry "v" (protocol
version) where they are top-level messages.
"""

from __future__ import annotations

import builtins
import math
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import msgpack

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


class _Packers(threading.local):
    """One msgpack Packer per thread, reused: `msgpack.packb` builds a Packer (and its
    buffer) at every call, which was half the cost of packing a small message, and
    the agent packs every frame, record and journal entry (issue 23: `packb` was 8 %
    of the home's loop in an array burst). Per thread, as a Packer is not safe to
    share (clients submit from threads); one that fails resets itself."""

    def __init__(self) -> None:
        self.plain = msgpack.Packer(use_bin_type=True)
        self.lenient = msgpack.Packer(use_bin_type=True, default=str)


_packers = _Packers()


def pack(obj: Any) -> bytes:
    return _packers.plain.pack(obj)  # type: ignore[no-any-return]


def pack_lenient(obj: Any) -> bytes:
    """Pack what may hold values msgpack has no type for (an explain record's odd
    field): those go as their str(), as json.dumps(default=str) did."""
    return _packers.lenient.pack(obj)  # type: ignore[no-any-return]


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


def _all_str(items: Iterable[Any]) -> bool:
    """Is every item a string? (`str.join` checks in C: a task's environment, dozens of
    strings, is read at its home, its runner and each copy; issue 23)"""
    try:
        "".join(items)
    except TypeError:
        return False
    return True


class Fields:
    """Strict reader for one decoded map: typed getters, unknown keys rejected.

    Usage: f = Fields(obj, "submit"); x = f.str("name", ""); ...; f.done()
    """

    def __init__(self, obj: Any, what: builtins.str, ignore: tuple[builtins.str, ...] = ()) -> None:
        if not isinstance(obj, dict):
            raise SchemaError(f"{what}: expected a map, got {type(obj).__name__}")
        self.obj: builtins.dict[builtins.str, Any] = obj
        self.what = what
        self.seen: set[builtins.str] = set(ignore)

    def _get(self, key: builtins.str, default: Any, required: builtins.bool) -> Any:
        self.seen.add(key)
        v = self.obj.get(key)
        if v is None:
            if required:
                raise SchemaError(f"{self.what}: missing field {key!r}")
            return default
        return v

    def _bad(self, key: builtins.str, want: builtins.str, got: Any) -> SchemaError:
        return SchemaError(f"{self.what}: field {key!r} must be {want}, got {got!r:.60}")

    def str(
        self,
        key: builtins.str,
        default: Any = None,
        *,
        required: builtins.bool = False,
        max_len: builtins.int = 4096,
    ) -> Any:
        v = self._get(key, default, required)
        if v is default and not required:
            return v
        if not isinstance(v, builtins.str):
            raise self._bad(key, "a string", v)
        if len(v) > max_len:
            raise SchemaError(f"{self.what}: field {key!r} longer than {max_len}")
        return v

    def task_id(
        self, key: builtins.str, default: Any = None, *, required: builtins.bool = False
    ) -> Any:
        """A task id: never a path, never "." or "..", bounded (model.valid_task_id)."""
        # imported here: a module-level import made every `swarm` CLI call import
        # model and attrs (26 -> 78 ms to import swarm.cli, stop 48); the agent pays
        # a sys.modules lookup per call, which no benchmark could tell apart
        from .model import MAX_TASK_ID_LEN, valid_task_id

        v = self.str(key, default, required=required, max_len=MAX_TASK_ID_LEN)
        if not required and v == default:
            return v
        if not valid_task_id(v):
            raise SchemaError(f"{self.what}: field {key!r}: invalid task id {v!r:.80}")
        return v

    def int(
        self,
        key: builtins.str,
        default: Any = None,
        *,
        required: builtins.bool = False,
        lo: builtins.int | None = None,
        hi: builtins.int | None = None,
    ) -> Any:
        v = self._get(key, default, required)
        if v is default and not required:
            return v
        if isinstance(v, builtins.bool) or not isinstance(v, builtins.int):
            raise self._bad(key, "an integer", v)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise SchemaError(f"{self.what}: field {key!r}={v} out of range [{lo}, {hi}]")
        return v

    def float(
        self,
        key: builtins.str,
        default: Any = None,
        *,
        required: builtins.bool = False,
        lo: builtins.float | None = None,
        hi: builtins.float | None = None,
    ) -> Any:
        v = self._get(key, default, required)
        if v is default and not required:
            return v
        if isinstance(v, builtins.bool) or not isinstance(v, (builtins.int, builtins.float)):
            raise self._bad(key, "a number", v)
        v = float(v)
        if not math.isfinite(v):
            raise SchemaError(f"{self.what}: field {key!r} must be finite")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise SchemaError(f"{self.what}: field {key!r}={v} out of range [{lo}, {hi}]")
        return v

    def bool(
        self, key: builtins.str, default: Any = None, *, required: builtins.bool = False
    ) -> Any:
        v = self._get(key, default, required)
        if v is default and not required:
            return v
        if not isinstance(v, builtins.bool):
            raise self._bad(key, "a boolean", v)
        return v

    def bytes(
        self, key: builtins.str, default: Any = None, *, required: builtins.bool = False
    ) -> Any:
        v = self._get(key, default, required)
        if v is default and not required:
            return v
        if not isinstance(v, bytes):
            raise self._bad(key, "bytes", v)
        return v

    def str_list(
        self, key: builtins.str, *, required: builtins.bool = False, max_items: builtins.int = 4096
    ) -> builtins.list[builtins.str]:
        v = self._get(key, [], required)
        if not isinstance(v, (list, tuple)):
            raise self._bad(key, "a list of strings", v)
        if len(v) > max_items:  # before joining them all
            raise SchemaError(f"{self.what}: field {key!r} has more than {max_items} items")
        if not _all_str(v):
            raise self._bad(key, "a list of strings", v)
        return list(v)

    def str_map(
        self, key: builtins.str, *, max_items: builtins.int = 4096
    ) -> builtins.dict[builtins.str, builtins.str]:
        v = self._get(key, {}, False)
        if not isinstance(v, dict):
            raise self._bad(key, "a map of strings to strings", v)
        if len(v) > max_items:  # before joining them all
            raise SchemaError(f"{self.what}: field {key!r} has more than {max_items} items")
        if not (_all_str(v) and _all_str(v.values())):
            raise self._bad(key, "a map of strings to strings", v)
        return dict(v)

    def list(self, key: builtins.str, *, required: builtins.bool = False) -> builtins.list[Any]:
        v = self._get(key, [], required)
        if not isinstance(v, (list, tuple)):
            raise self._bad(key, "a list", v)
        return list(v)

    def map(
        self, key: builtins.str, *, required: builtins.bool = False
    ) -> builtins.dict[builtins.str, Any]:
        v = self._get(key, {}, required)
        if not isinstance(v, dict):
            raise self._bad(key, "a map", v)
        return v

    def nested(self, key: builtins.str, decode: Callable[[Any], T], default: Any = None) -> Any:
        v = self._get(key, default, False)
        if v is default:
            return v
        return decode(v)

    def enum(
        self,
        key: builtins.str,
        cls: type[Any],
        default: Any = None,
        *,
        required: builtins.bool = False,
    ) -> Any:
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
        if self.obj.keys() <= self.seen:  # the common case, without building a set
            return
        unknown = sorted(set(self.obj) - self.seen)
        if unknown:
            raise SchemaError(f"{self.what}: unknown field(s) {', '.join(map(repr, unknown))}")


def check_version(obj: Any, what: str) -> None:
    if not isinstance(obj, dict):
        raise SchemaError(f"{what}: expected a map, got {type(obj).__name__}")
    v = obj.get("v", PROTOCOL_VERSION)
    if v != PROTOCOL_VERSION:
        raise VersionMismatch(
            f"{what}: protocol version {v!r} not supported (want {PROTOCOL_VERSION})"
        )


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
