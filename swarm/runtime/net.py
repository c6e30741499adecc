"""UDP + TCP peer transport on one port, with optional sealing and a fault shim.

The membership core produces opaque payloads; this module carries them. Datagrams
(`send_packet`) are fire-and-forget; "reliable" packets (`send_reliable`) take a short
TCP connection; request/response and long streams (logs, checkpoints) use framed TCP
streams. Every UDP datagram and every TCP frame body is one *envelope*: sealed with the
cluster keyring (`swarm.crypto.Sealer`) or, in insecure mode, marked plain and tagged
with the cluster name, so that secure and insecure nodes never talk by accident.

Anything wrong with inbound bytes is dropped (UDP) or closes the connection (TCP), and
is counted in `Transport.counters`; callers only ever see `TransportError`.
docs/protocol.md ("Transport") describes the wire format and the fault shim.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import math
import os
import random
import socket
import struct
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from .. import wire
from ..cluster.ratelimit import ConnGate, SourceLimiter
from ..crypto import OVERHEAD as SEAL_OVERHEAD
from ..crypto import VERSION as SEAL_VERSION
from ..crypto import CryptoError, Opened, Sealer, SealStream
from .clock import Clock, system_time

log = logging.getLogger(__name__)

Addr = tuple[str, int]
PacketHandler = Callable[[Addr, bytes, bool], None]
StreamHandler = Callable[["FramedStream", Addr], Awaitable[None]]

PLAIN_MARKER = 0x00
PLAIN_OVERHEAD = 5  # marker + 4-byte cluster tag
HELLO_VERSION = 2  # 2: the server speaks first (challenge); the client binds to it
HELLO_MAX = 4096  # msgpack bytes of the first frame each way (challenge, hello)
UDP_BATCH = 256  # datagrams read per wakeup before other tasks get a turn
UDP_RCVBUF = 8 << 20  # asked for (best effort; the kernel may cap it)
_LEN = struct.Struct(">I")
_MAX_UDP = 65507

DROP_REASONS = (
    "decrypt",
    "replay",
    "stale",
    "malformed",
    "oversize",
    "fault",
    "other_cluster",
    "mode",
    "backlog",
    "ratelimit",
)
COUNTER_NAMES = (
    "udp_in_packets",
    "udp_in_bytes",
    "udp_out_packets",
    "udp_out_bytes",
    "udp_send_errors",
    "tcp_in_frames",
    "tcp_in_bytes",
    "tcp_out_frames",
    "tcp_out_bytes",
    "tcp_conns_in",
    "tcp_conns_out",
    "tcp_conns_rejected",
    "tcp_conns_evicted",
    "tcp_conn_errors",
    "handler_errors",
    *(f"dropped_{r}" for r in DROP_REASONS),
)
_CRYPTO_TO_DROP = {
    "short": "malformed",
    "version": "malformed",
    "decrypt": "decrypt",
    "replay": "replay",
    "stale": "stale",
}


class TransportError(Exception):
    """Connect failure, timeout, broken or closed stream, rejected frame."""


class DatagramTooLarge(TransportError):
    """The payload does not fit in one datagram (`max_datagram`)."""


class StreamClosed(TransportError):
    """The peer closed the stream cleanly (between frames)."""


class FaultSpecError(ValueError):
    """A fault shim spec string or value is invalid."""


def cluster_tag(cluster: str) -> bytes:
    return hashlib.sha256(b"swarm cluster\x00" + cluster.encode("utf-8")).digest()[:4]


def new_counters() -> dict[str, int]:
    return dict.fromkeys(COUNTER_NAMES, 0)


# ------------------------------------------------------------------ fault shim


@attrs.frozen
class DatagramPlan:
    """What the shim does with one outbound datagram: one send per delay (none =
    dropped, two = duplicated); `hold` = held back until the next one (reorder)."""

    delays: tuple[float, ...]
    hold: bool = False


@attrs.frozen
class RequestPlan:
    delay: float = 0.0
    drop_request: bool = False
    drop_reply: bool = False


def _prob(name: str, v: float) -> float:
    if not (0.0 <= v <= 1.0):
        raise FaultSpecError(f"fault {name}={v} must be a probability in [0, 1]")
    return v


def _seconds(name: str, v: float) -> float:
    if not (math.isfinite(v) and v >= 0.0):
        raise FaultSpecError(f"fault {name}={v} must be a duration >= 0 seconds")
    return v


@attrs.define
class FaultShim:
    """Seeded network faults for tests and the chaos suite (outbound only).

    Spec: comma-separated `key=value`: drop=P, dup=P, reorder=P (probabilities),
    delay=A:B (uniform seconds) | delay=A (fixed) | delay=exp:M (exponential mean M),
    hold=S (longest a reordered datagram waits, default 0.05), seed=N.
    """

    drop: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    delay_min: float = 0.0
    delay_max: float = 0.0
    delay_mean: float = 0.0  # > 0 selects the exponential distribution
    hold: float = 0.05
    seed: int | None = None
    rng: random.Random = attrs.field(init=False, repr=False, eq=False)

    KEYS = ("drop", "dup", "reorder", "delay", "hold", "seed")

    def __attrs_post_init__(self) -> None:
        for name in ("drop", "dup", "reorder"):
            _prob(name, getattr(self, name))
        for name in ("delay_min", "delay_max", "delay_mean", "hold"):
            _seconds(name, getattr(self, name))
        if self.delay_min > self.delay_max:
            raise FaultSpecError(f"fault delay {self.delay_min}:{self.delay_max}: min > max")
        if self.delay_mean and self.delay_max:
            raise FaultSpecError("fault delay: choose uniform/fixed or exponential, not both")
        self.rng = random.Random(self.seed)

    @classmethod
    def parse(cls, spec: str) -> FaultShim:
        """Parse e.g. "drop=0.2,delay=0.01:0.05,dup=0.05,reorder=0.1,seed=7"."""
        text = spec.strip()
        kw: dict[str, Any] = {}
        if text.lower() in ("", "none", "off"):
            return cls()
        seen: set[str] = set()
        for raw in text.split(","):
            part = raw.strip()
            if not part:
                continue
            key, sep, val = part.partition("=")
            key, val = key.strip().lower(), val.strip()
            if not sep or not val:
                raise FaultSpecError(f"fault spec {spec!r}: {part!r} is not key=value")
            if key not in cls.KEYS:
                raise FaultSpecError(
                    f"fault spec {spec!r}: unknown key {key!r} (valid: {', '.join(cls.KEYS)})"
                )
            if key in seen:
                raise FaultSpecError(f"fault spec {spec!r}: {key!r} given twice")
            seen.add(key)
            if key == "seed":
                try:
                    kw["seed"] = int(val)
                except ValueError:
                    raise FaultSpecError(f"fault spec: seed={val!r} is not an integer") from None
            elif key == "delay":
                kw.update(_parse_delay(val))
            else:
                kw[key] = _number(key, val)
        return cls(**kw)

    def spec(self) -> str:
        """The canonical spec string (parse(spec()) gives an equal shim)."""
        parts = [
            f"{k}={getattr(self, k)!r}" for k in ("drop", "dup", "reorder") if getattr(self, k)
        ]
        if self.delay_mean:
            parts.append(f"delay=exp:{self.delay_mean!r}")
        elif self.delay_max:
            parts.append(f"delay={self.delay_min!r}:{self.delay_max!r}")
        if self.hold != 0.05:
            parts.append(f"hold={self.hold!r}")
        if self.seed is not None:
            parts.append(f"seed={self.seed}")
        return ",".join(parts) or "none"

    @property
    def active(self) -> bool:
        return bool(self.drop or self.dup or self.reorder or self.delay_max or self.delay_mean)

    def sample_delay(self) -> float:
        if self.delay_mean:
            return self.rng.expovariate(1.0 / self.delay_mean)
        if self.delay_max:
            return self.rng.uniform(self.delay_min, self.delay_max)
        return 0.0

    def plan_datagram(self) -> DatagramPlan:
        r = self.rng
        if self.drop and r.random() < self.drop:
            return DatagramPlan(())
        copies = 2 if self.dup and r.random() < self.dup else 1
        delays = tuple(self.sample_delay() for _ in range(copies))
        return DatagramPlan(delays, bool(self.reorder) and r.random() < self.reorder)

    def plan_request(self) -> RequestPlan:
        r = self.rng
        drop_request = drop_reply = False
        if self.drop and r.random() < self.drop:
            if r.random() < 0.5:
                drop_request = True
            else:
                drop_reply = True
        return RequestPlan(self.sample_delay(), drop_request, drop_reply)


def _number(key: str, val: str) -> float:
    try:
        v = float(val)
    except ValueError:
        raise FaultSpecError(f"fault spec: {key}={val!r} is not a number") from None
    if not math.isfinite(v):
        raise FaultSpecError(f"fault spec: {key}={val!r} is not finite")
    return v


def _parse_delay(val: str) -> dict[str, float]:
    if val.lower().startswith("exp:"):
        return {"delay_mean": _number("delay", val[4:])}
    lo, sep, hi = val.partition(":")
    if sep:
        return {"delay_min": _number("delay", lo), "delay_max": _number("delay", hi)}
    v = _number("delay", val)
    return {"delay_min": v, "delay_max": v}


# ------------------------------------------------------------------ envelopes


class _Drop(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class _Codec:
    """Envelope wrap/unwrap shared by UDP and TCP."""

    def __init__(self, cluster: str, sealer: Sealer | None, wall_clock: Callable[[], float]):
        self.sealer = sealer
        self.tag = cluster_tag(cluster)
        # the system clock (time.time), not the agent's Clock: the replay window
        # compares envelope times across nodes, so it must be real time everywhere
        self.wall_clock = wall_clock
        self.overhead = SEAL_OVERHEAD if sealer is not None else PLAIN_OVERHEAD

    def wrap(self, payload: bytes, stream: SealStream | None, bind: bytes = b"") -> bytes:
        if self.sealer is None:
            return bytes((PLAIN_MARKER,)) + self.tag + payload
        if stream is None:
            return self.sealer.seal(payload, self.wall_clock(), bind)
        return stream.seal(payload, self.wall_clock(), bind)

    def unwrap(self, data: bytes, bind: bytes = b"") -> tuple[bytes, Opened | None]:
        if not data:
            raise _Drop("malformed", "empty")
        marker = data[0]
        if self.sealer is None:
            if marker == SEAL_VERSION:
                raise _Drop("mode", "sealed packet but this node runs insecure")
            if marker != PLAIN_MARKER or len(data) < PLAIN_OVERHEAD:
                raise _Drop("malformed", "bad envelope")
            if data[1:PLAIN_OVERHEAD] != self.tag:
                raise _Drop("other_cluster")
            return bytes(data[PLAIN_OVERHEAD:]), None
        if marker == PLAIN_MARKER:
            raise _Drop("mode", "plain packet but this node requires encryption")
        try:
            opened = self.sealer.open_info(data, self.wall_clock(), bind)
        except CryptoError as e:
            raise _Drop(_CRYPTO_TO_DROP[e.reason], str(e)) from None
        return opened.plaintext, opened


class _FrameSplitter:
    """Raw length-prefixed frames (wire.FrameDecoder's semantics, but the body must
    be unsealed before it is msgpack). The first frame of a connection (challenge or
    hello, not yet authenticated) may be at most `first_max` bytes: a bigger length
    prefix is refused before its body is read."""

    def __init__(self, max_size: int, first_max: int | None = None) -> None:
        self.max_size = max_size
        self.first_max = max_size if first_max is None else min(first_max, max_size)
        self.frames = 0  # frames split so far
        self._buf = bytearray()

    @property
    def limit(self) -> int:
        return self.first_max if self.frames == 0 else self.max_size

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        while len(self._buf) >= _LEN.size:
            (length,) = _LEN.unpack_from(self._buf)
            limit = self.limit
            if length > limit:
                raise wire.FrameTooLarge(f"frame of {length} bytes exceeds {limit}")
            end = _LEN.size + length
            if len(self._buf) < end:
                break
            out.append(bytes(self._buf[_LEN.size : end]))
            del self._buf[:end]
            self.frames += 1
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)


# ------------------------------------------------------------------ streams


class FramedStream:
    """One TCP connection carrying msgpack objects, one sealed frame each.

    Only one task may send and one may receive at a time. Errors close the stream
    and raise TransportError; a clean close by the peer raises StreamClosed (and
    ends `async for obj in stream`).
    """

    def __init__(
        self,
        transport: Transport,
        stream: trio.SocketStream,
        *,
        peer: Addr,
        remote: Addr,
        server: bool,
        timeout: float,
    ) -> None:
        self._t = transport
        self._stream = stream
        self.peer = peer  # the peer's advertised address (its listening port)
        self.remote = remote  # the socket's remote address (ephemeral port on clients)
        self.timeout = timeout  # idle limit per send/receive; math.inf for none
        self._server = server
        sealer = transport.sealer
        self._seal = sealer.new_stream() if sealer is not None else None
        # Binding (associated data) of each direction. The client's hello is unbound;
        # the server answers with a challenge on its fresh stream, and everything the
        # client sends after the hello is bound to that stream's ident (the server's
        # instance, random per process start, and a stream id it never reuses), so a
        # recorded session opens on no other connection of any node. Every server
        # frame is bound to the client's stream ident.
        self._bind_out = b""
        self._bind_in = b"" if server or self._seal is None else self._seal.ident
        self._authed = False  # server: a frame bound to our challenge has opened
        self._frames_in = 0  # frames accepted (authenticated, in order)
        self._peer_ident: bytes | None = None
        self._expect = 0
        overhead = transport.codec.overhead
        self._split = _FrameSplitter(transport.config.max_frame + overhead, HELLO_MAX + overhead)
        self.conn_id = -1  # the server's ConnGate id; -1 on clients
        self._pending: deque[bytes] = deque()
        self._closed = False

    async def __aenter__(self) -> FramedStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> FramedStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except StreamClosed:
            raise StopAsyncIteration from None

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        self._closed = True
        await trio.aclose_forcefully(self._stream)

    async def _fail(self, reason: str | None, message: str) -> TransportError:
        c = self._t.counters
        if reason is not None:
            c[f"dropped_{reason}"] += 1
            self._t.last_drop[reason] = self.peer
        c["tcp_conn_errors"] += 1
        await self.aclose()
        return TransportError(f"{self.peer[0]}:{self.peer[1]}: {message}")

    async def send(self, obj: Any, timeout: float | None = None) -> None:
        if self._closed:
            raise TransportError("stream is closed")
        body = wire.pack(obj)
        if len(body) > self._t.config.max_frame:
            raise TransportError(f"frame of {len(body)} bytes exceeds {self._t.config.max_frame}")
        env = self._t.codec.wrap(body, self._seal, self._bind_out)
        data = _LEN.pack(len(env)) + env
        limit = self.timeout if timeout is None else timeout
        with trio.move_on_after(limit) as cs:
            try:
                await self._stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                raise await self._fail(None, f"send failed: {e}") from None
        if cs.cancelled_caught:
            raise await self._fail(None, f"send timed out after {limit}s")
        self._t.counters["tcp_out_frames"] += 1
        self._t.counters["tcp_out_bytes"] += len(data)

    async def receive(self, timeout: float | None = None) -> Any:
        if self._closed:
            raise TransportError("stream is closed")
        limit = self.timeout if timeout is None else timeout
        with trio.move_on_after(limit) as cs:
            while not self._pending:
                # before the first frame, read no more than it may be: nothing is
                # buffered for a connection that has not authenticated
                size = 65536 if self._split.frames else self._split.limit + _LEN.size
                try:
                    data = await self._stream.receive_some(size)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                    raise await self._fail(None, f"receive failed: {e}") from None
                if not data:
                    if self._split.pending:
                        raise await self._fail("malformed", "connection closed mid-frame")
                    await self.aclose()
                    raise StreamClosed(f"{self.peer[0]}:{self.peer[1]}: closed by peer")
                try:
                    self._pending.extend(self._split.feed(data))
                except wire.FrameTooLarge as e:
                    raise await self._fail("oversize", str(e)) from None
        if cs.cancelled_caught:
            raise await self._fail(None, f"receive timed out after {limit}s")
        body = self._pending.popleft()
        self._t.counters["tcp_in_frames"] += 1
        self._t.counters["tcp_in_bytes"] += len(body) + _LEN.size
        if self._server and self._peer_ident is None and not self._t.may_derive(body, self.remote):
            raise await self._fail("ratelimit", "too many new sender instances from here")
        try:
            payload, opened = self._t.codec.unwrap(body, self._bind_in)
        except _Drop as e:
            raise await self._fail(e.reason, f"frame rejected: {e}") from None
        if opened is not None:
            try:
                self._check_order(opened)
            except _OrderError as e:
                raise await self._fail("replay", str(e)) from None
        self._frames_in += 1
        if self._server and not self._authed and self._frames_in > 1:
            self._authed = True  # a frame after the hello, bound to our challenge
            self._t._gate.authenticated(self.conn_id)
        try:
            return wire.unpack(payload, self._t.config.max_frame)
        except wire.WireError as e:
            raise await self._fail("malformed", str(e)) from None

    def _check_order(self, opened: Opened) -> None:
        """A connection carries exactly one sender stream, from counter 0, no gaps:
        frames spliced in from elsewhere, or dropped by an attacker, are caught."""
        if self._peer_ident is None:
            if opened.counter != 0:
                raise _OrderError("first frame of a connection must have counter 0")
            self._peer_ident = opened.ident
            self._bind_out = opened.ident
            if self._server and self._seal is not None:
                self._bind_in = self._seal.ident  # the rest: bound to our challenge
        elif opened.ident != self._peer_ident or opened.counter != self._expect:
            raise _OrderError("frame from another stream or out of order")
        self._expect = opened.counter + 1


class _OrderError(Exception):
    pass


# ------------------------------------------------------------------ transport


def _is_wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::")


def guess_advertise_host(family_v6: bool = False) -> str:
    """Best-effort primary address (routing lookup, no packet sent); loopback if none."""
    import socket

    fam = socket.AF_INET6 if family_v6 else socket.AF_INET
    probe = ("2001:db8::1", 9) if family_v6 else ("192.0.2.1", 9)
    try:
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.connect(probe)
            host: str = s.getsockname()[0]
            return host
    except OSError:
        return "::1" if family_v6 else "127.0.0.1"


@attrs.frozen
class TransportConfig:
    cluster: str
    bind_host: str = "0.0.0.0"
    port: int = 0  # 0 = a port free for both UDP and TCP
    advertise_host: str | None = None  # default: bind_host, or a guess when wildcard
    max_datagram: int = 1400  # payload bytes per datagram (envelope not included)
    max_frame: int = wire.MAX_FRAME  # msgpack bytes per TCP frame
    max_connections: int = 256  # concurrent inbound TCP connections
    max_pending: int = 128  # of which waiting for their hello (unauthenticated)
    max_pending_per_source: int = 32  # ... from one source address
    connect_timeout: float = 5.0
    handshake_timeout: float = 3.0  # inbound hello must arrive within this
    # new sender instances (an HKDF each) per source address and in all, per second
    derive_rate: float = 20.0
    derive_burst: float = 50.0
    derive_total_rate: float = 200.0
    derive_total_burst: float = 400.0
    io_timeout: float = 30.0  # default idle limit per stream send/receive
    inbound_queue: int = 4096  # datagrams buffered for `incoming` (no on_packet)

    def __attrs_post_init__(self) -> None:
        if not (0 <= self.port <= 65535):
            raise ValueError(f"port {self.port} out of range")
        if not (1 <= self.max_datagram <= _MAX_UDP - SEAL_OVERHEAD):
            raise ValueError(f"max_datagram must be in [1, {_MAX_UDP - SEAL_OVERHEAD}]")
        if self.max_frame < 64 or self.max_connections < 1 or self.inbound_queue < 1:
            raise ValueError("max_frame, max_connections and inbound_queue are too small")
        if self.max_pending < 1 or self.max_pending_per_source < 1:
            raise ValueError("max_pending and max_pending_per_source must be >= 1")


class Transport:
    """Created by `open_transport`; see the module docstring."""

    def __init__(
        self,
        config: TransportConfig,
        sealer: Sealer | None,
        udp: trio.socket.SocketType,
        tcp: trio.socket.SocketType,
        nursery: trio.Nursery,
        *,
        faults: FaultShim | None,
        on_packet: PacketHandler | None,
        stream_handler: StreamHandler | None,
        wall_clock: Callable[[], float],
        clock: Clock,
    ) -> None:
        if sealer is not None and sealer.cluster != config.cluster:
            raise ValueError(f"sealer is for cluster {sealer.cluster!r}, not {config.cluster!r}")
        self.config = config
        self.clock = clock  # rate limits and connection admission: clock.now()
        self.sealer = sealer
        self.codec = _Codec(config.cluster, sealer, wall_clock)
        self.counters = new_counters()
        self.last_drop: dict[str, Addr] = {}  # reason -> where the latest such drop came from
        self.faults = faults
        self.on_packet = on_packet
        self._stream_handler = stream_handler
        self._udp = udp
        self._tcp = tcp
        self._nursery = nursery
        host, port = udp.getsockname()[:2]
        self.local: Addr = (host, port)
        self.port: int = port
        adv = config.advertise_host
        if adv is None:
            adv = guess_advertise_host(":" in host) if _is_wildcard(host) else host
        self.advertise: Addr = (adv, port)
        send, recv = trio.open_memory_channel[tuple[Addr, bytes, bool]](config.inbound_queue)
        self._in_send = send
        self.incoming: trio.MemoryReceiveChannel[tuple[Addr, bytes, bool]] = recv
        self._held: dict[Addr, tuple[bytes, DatagramPlan]] = {}
        self._active = 0
        self._udp_wire_max = config.max_datagram + self.codec.overhead
        self._gate = ConnGate(
            config.max_connections, config.max_pending, config.max_pending_per_source
        )
        self._conn_scopes: dict[int, trio.CancelScope] = {}
        self._next_conn = 0
        self.derive_limiter = SourceLimiter(
            config.derive_rate,
            config.derive_burst,
            config.derive_total_rate,
            config.derive_total_burst,
        )
        self.udp_rcvbuf = _rcvbuf(udp)

    def may_derive(self, data: bytes, src: Addr) -> bool:
        """False if `data` would cost a key derivation (a sender instance not seen
        before) and `src`'s address has used up its share of those: checked before any
        decryption, so a flood of forged headers costs a dict lookup each."""
        sealer = self.sealer
        if sealer is None or not sealer.needs_derive(data):
            return True
        return self.derive_limiter.allow(src[0], self.clock.now())

    # -- server side

    def serve(self, handler: StreamHandler | None) -> None:
        """Install the handler for inbound streams (None: refuse them).
        `async def handler(stream: FramedStream, peer: Addr)`; the stream is closed
        when it returns; exceptions are logged and counted, never fatal."""
        self._stream_handler = handler

    # -- UDP

    async def send_packet(self, addr: Addr, payload: bytes) -> None:
        """Send one datagram. Too large: DatagramTooLarge. Network errors are counted
        (`udp_send_errors`), not raised: UDP is best effort."""
        if len(payload) > self.config.max_datagram:
            raise DatagramTooLarge(
                f"payload of {len(payload)} bytes exceeds max_datagram {self.config.max_datagram}"
            )
        data = self.codec.wrap(payload, None)
        faults = self.faults
        if faults is None or not faults.active:
            await self._sendto(data, addr)
            return
        plan = faults.plan_datagram()
        if not plan.delays:
            self.counters["dropped_fault"] += 1
            return
        if plan.hold and addr not in self._held:
            self._held[addr] = (data, plan)
            self._nursery.start_soon(self._release_held, addr, data, faults.hold)
            return
        await self._emit(addr, data, plan)
        held = self._held.pop(addr, None)
        if held is not None:
            await self._emit(addr, *held)

    async def _emit(self, addr: Addr, data: bytes, plan: DatagramPlan) -> None:
        for delay in plan.delays:
            if delay > 0:
                self._nursery.start_soon(self._send_later, addr, data, delay)
            else:
                await self._sendto(data, addr)

    async def _send_later(self, addr: Addr, data: bytes, delay: float) -> None:
        await trio.sleep(delay)
        await self._sendto(data, addr)

    async def _release_held(self, addr: Addr, data: bytes, after: float) -> None:
        await trio.sleep(after)
        held = self._held.get(addr)
        if held is not None and held[0] is data:
            del self._held[addr]
            await self._emit(addr, *held)

    async def _sendto(self, data: bytes, addr: Addr) -> None:
        try:
            await self._udp.sendto(data, addr)
        except (OSError, UnicodeError) as e:
            self.counters["udp_send_errors"] += 1
            log.debug("udp send to %s failed: %s", addr, e)
            return
        self.counters["udp_out_packets"] += 1
        self.counters["udp_out_bytes"] += len(data)

    async def _udp_loop(self) -> None:
        """Drain the socket in batches with plain non-blocking reads (a trio
        `recvfrom` per datagram costs several times more), so a flood is dropped at
        the rate the kernel delivers it and peers' datagrams are not lost behind it in
        a full receive buffer."""
        limit = self._udp_wire_max
        raw = socket.socket(fileno=os.dup(self._udp.fileno()))
        raw.setblocking(False)
        try:
            while True:
                await trio.lowlevel.wait_readable(raw)
                for _ in range(UDP_BATCH):
                    try:
                        data, src = raw.recvfrom(limit + 1)
                    except BlockingIOError:
                        break
                    except OSError as e:  # e.g. ECONNREFUSED from an ICMP error
                        log.debug("udp receive error: %s", e)
                        continue
                    self._on_datagram(data, (src[0], src[1]))
                await trio.lowlevel.checkpoint()
        finally:
            raw.close()

    def _on_datagram(self, data: bytes, src: Addr) -> None:
        c = self.counters
        c["udp_in_packets"] += 1
        c["udp_in_bytes"] += len(data)
        if len(data) > self._udp_wire_max:
            c["dropped_oversize"] += 1
            return
        if not self.may_derive(data, src):
            c["dropped_ratelimit"] += 1
            self.last_drop["ratelimit"] = src
            return
        try:
            payload, _ = self.codec.unwrap(data)
        except _Drop as e:
            c[f"dropped_{e.reason}"] += 1
            self.last_drop[e.reason] = src
            return
        self._deliver(src, payload, False)

    def _deliver(self, src: Addr, payload: bytes, reliable: bool) -> None:
        handler = self.on_packet
        if handler is None:
            try:
                self._in_send.send_nowait((src, payload, reliable))
            except trio.WouldBlock:
                self.counters["dropped_backlog"] += 1
            return
        try:
            handler(src, payload, reliable)
        except Exception:
            self.counters["handler_errors"] += 1
            log.exception("packet handler failed on a packet from %s", src)

    # -- TCP, client side

    async def open_stream(self, addr: Addr, timeout: float | None = None) -> FramedStream:
        """Connect and send the hello; the caller owns (and closes) the stream."""
        faults = self.faults
        if faults is not None and faults.active:
            plan = faults.plan_request()
            if plan.drop_request or plan.drop_reply:
                self.counters["dropped_fault"] += 1
                raise TransportError(f"{addr[0]}:{addr[1]}: connection dropped (fault shim)")
            await trio.sleep(plan.delay)
        return await self._connect(addr, {"k": "s"}, timeout)

    async def _connect(
        self, addr: Addr, hello: dict[str, Any], timeout: float | None
    ) -> FramedStream:
        limit = self.config.connect_timeout if timeout is None else timeout
        host, port = addr
        try:
            with trio.fail_after(limit):
                sock = await trio.open_tcp_stream(host, port)
        except trio.TooSlowError:
            raise TransportError(f"{host}:{port}: connect timed out after {limit}s") from None
        except (OSError, UnicodeError, ValueError) as e:
            raise TransportError(f"{host}:{port}: connect failed: {e}") from None
        self.counters["tcp_conns_out"] += 1
        fs = FramedStream(
            self, sock, peer=addr, remote=addr, server=False, timeout=self.config.io_timeout
        )
        try:
            await fs.send({"v": HELLO_VERSION, "port": self.port, **hello}, timeout=limit)
            try:
                challenge = await fs.receive(timeout=limit)
            except StreamClosed:
                raise TransportError(f"{host}:{port}: closed during the handshake") from None
            if not (
                isinstance(challenge, dict)
                and challenge.get("v") == HELLO_VERSION
                and challenge.get("k") == "c"
            ):
                raise await fs._fail("malformed", "bad handshake challenge")
        except BaseException:
            await fs.aclose()
            raise
        return fs

    async def send_reliable(self, addr: Addr, payload: bytes, timeout: float | None = None) -> None:
        """Deliver `payload` to the peer's packet handler over TCP (reliable=True).
        Success means written to the socket; no acknowledgement."""
        faults = self.faults
        if faults is not None and faults.active:
            plan = faults.plan_request()
            if plan.drop_request or plan.drop_reply:
                self.counters["dropped_fault"] += 1
                raise TransportError(f"{addr[0]}:{addr[1]}: reliable packet dropped (fault shim)")
            await trio.sleep(plan.delay)
        fs = await self._connect(addr, {"k": "p"}, timeout)
        try:
            await fs.send(
                payload, timeout=self.config.connect_timeout if timeout is None else timeout
            )
        finally:
            await fs.aclose()

    async def request(self, addr: Addr, obj: Any, timeout: float) -> Any:
        """One request, one reply, within `timeout` seconds in all."""
        faults = self.faults
        plan = faults.plan_request() if faults is not None and faults.active else RequestPlan()
        with trio.move_on_after(timeout):
            await trio.sleep(plan.delay)
            if plan.drop_request:
                self.counters["dropped_fault"] += 1
                await trio.sleep_forever()
            async with await self._connect(addr, {"k": "s"}, timeout) as fs:
                await fs.send(obj, timeout=math.inf)
                try:
                    reply = await fs.receive(timeout=math.inf)
                except StreamClosed:
                    raise TransportError(
                        f"{addr[0]}:{addr[1]}: connection closed before the reply"
                    ) from None
            if plan.drop_reply:
                self.counters["dropped_fault"] += 1
                raise TransportError(f"{addr[0]}:{addr[1]}: reply dropped (fault shim)")
            return reply
        raise TransportError(f"{addr[0]}:{addr[1]}: request timed out after {timeout}s")

    # -- TCP, server side

    async def _accept_loop(self) -> None:
        listener = trio.SocketListener(self._tcp)
        while True:
            try:
                stream = await listener.accept()
            except OSError as e:  # EMFILE and friends: back off, keep serving
                log.warning("tcp accept failed: %s", e)
                await trio.sleep(0.1)
                continue
            self._nursery.start_soon(self._handle_conn, stream)

    async def _handle_conn(self, stream: trio.SocketStream) -> None:
        c = self.counters
        c["tcp_conns_in"] += 1
        try:
            remote_raw = stream.socket.getpeername()
            remote: Addr = (remote_raw[0], remote_raw[1])
        except OSError:
            await trio.aclose_forcefully(stream)
            return
        conn = self._next_conn
        self._next_conn += 1
        adm = self._gate.open(conn, remote[0], self.clock.now())
        for victim in adm.evict:
            c["tcp_conns_evicted"] += 1
            self.last_drop["evicted"] = remote
            scope = self._conn_scopes.pop(victim, None)
            if scope is not None:
                scope.cancel()
        if not adm.admit:
            c["tcp_conns_rejected"] += 1
            self.last_drop["rejected"] = remote
            await trio.aclose_forcefully(stream)
            return
        self._active += 1
        try:
            with trio.CancelScope() as scope:
                self._conn_scopes[conn] = scope
                fs = FramedStream(
                    self,
                    stream,
                    peer=remote,
                    remote=remote,
                    server=True,
                    timeout=self.config.io_timeout,
                )
                fs.conn_id = conn
                try:
                    await self._serve_conn(fs)
                except TransportError as e:
                    log.debug("connection from %s: %s", remote, e)
                except Exception:
                    c["handler_errors"] += 1
                    log.exception("stream handler failed for %s", remote)
                finally:
                    await fs.aclose()
        finally:
            self._conn_scopes.pop(conn, None)
            self._gate.close(conn)
            self._active -= 1

    async def _serve_conn(self, fs: FramedStream) -> None:
        limit = self.config.handshake_timeout
        hello = await fs.receive(timeout=limit)
        if (
            not isinstance(hello, dict)
            or hello.get("v") != HELLO_VERSION
            or hello.get("k") not in ("p", "s")
            or not isinstance(hello.get("port"), int)
            or isinstance(hello.get("port"), bool)
            or not (0 <= hello["port"] <= 65535)
        ):
            self.counters["dropped_malformed"] += 1
            self.counters["tcp_conn_errors"] += 1
            return
        fs.peer = (fs.remote[0], hello["port"])
        # the challenge: what the client sends next must be bound to this stream
        await fs.send({"v": HELLO_VERSION, "k": "c"}, timeout=limit)
        if hello["k"] == "p":
            payload = await fs.receive(timeout=limit)
            if not isinstance(payload, bytes):
                self.counters["dropped_malformed"] += 1
                self.counters["tcp_conn_errors"] += 1
                return
            self._deliver(fs.peer, payload, True)
            return
        handler = self._stream_handler
        if handler is None:
            self.counters["tcp_conn_errors"] += 1
            with contextlib.suppress(TransportError):
                await fs.receive(timeout=limit)  # read the request: a clean close, no reset
            return
        await handler(fs, fs.peer)


def _grow_rcvbuf(udp: trio.socket.SocketType) -> None:
    """Best effort: a big UDP receive buffer absorbs bursts (floods included) while the
    receive loop catches up. SO_RCVBUFFORCE (root, CAP_NET_ADMIN) passes the
    net.core.rmem_max cap; SO_RCVBUF is capped by it."""
    force = getattr(socket, "SO_RCVBUFFORCE", None)
    if force is not None:
        try:
            udp.setsockopt(socket.SOL_SOCKET, force, UDP_RCVBUF)
            return
        except OSError:
            pass
    try:
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_RCVBUF)
    except OSError:
        pass


def _rcvbuf(udp: trio.socket.SocketType) -> int:
    try:
        return int(udp.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
    except OSError:
        return 0


async def _bind_pair(host: str, port: int) -> tuple[trio.socket.SocketType, trio.socket.SocketType]:
    """Bind TCP and UDP to the same port (retrying random ports when port == 0)."""
    family = trio.socket.AF_INET6 if ":" in host else trio.socket.AF_INET
    last: OSError | None = None
    for _ in range(50 if port == 0 else 1):
        tcp = trio.socket.socket(family, trio.socket.SOCK_STREAM)
        udp = trio.socket.socket(family, trio.socket.SOCK_DGRAM)
        try:
            tcp.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)
            await tcp.bind((host, port))
            chosen = tcp.getsockname()[1]
            await udp.bind((host, chosen))
            tcp.listen(512)
            _grow_rcvbuf(udp)
            return udp, tcp
        except OSError as e:
            tcp.close()
            udp.close()
            last = e
            if e.errno != errno.EADDRINUSE:
                break
    raise TransportError(f"cannot bind UDP+TCP on {host}:{port}: {last}")


@asynccontextmanager
async def open_transport(
    config: TransportConfig,
    sealer: Sealer | None = None,
    *,
    faults: FaultShim | None = None,
    on_packet: PacketHandler | None = None,
    stream_handler: StreamHandler | None = None,
    wall_clock: Callable[[], float] = system_time,
    clock: Clock | None = None,
) -> AsyncIterator[Transport]:
    """Bind, run the UDP receiver and TCP acceptor, yield the Transport; everything
    (including delayed fault-shim packets and open server connections) stops on exit.

    `wall_clock` stamps and checks sealed envelopes against the replay window, which
    compares them with other nodes' system clocks: it stays the real system clock
    (time.time), not the agent's `clock`, even under a test's MockClock. `clock`
    (trio time) is for the local rate limits."""
    if sealer is not None and sealer.cluster != config.cluster:
        raise ValueError(f"sealer is for cluster {sealer.cluster!r}, not {config.cluster!r}")
    udp, tcp = await _bind_pair(config.bind_host, config.port)
    try:
        async with collapse_single_group(), trio.open_nursery() as nursery:
            t = Transport(
                config,
                sealer,
                udp,
                tcp,
                nursery,
                faults=faults,
                on_packet=on_packet,
                stream_handler=stream_handler,
                wall_clock=wall_clock,
                clock=clock or Clock.system(),
            )
            nursery.start_soon(t._udp_loop)
            nursery.start_soon(t._accept_loop)
            try:
                yield t
            finally:
                nursery.cancel_scope.cancel()
    finally:
        udp.close()
        tcp.close()


@asynccontextmanager
async def collapse_single_group() -> AsyncIterator[None]:
    """Re-raise a lone exception out of a nursery group as itself, so the body of
    `async with open_transport(...)` raises what it raised (our background tasks
    never fail, so the only exception is usually the caller's own)."""
    try:
        yield
    except BaseExceptionGroup as eg:
        if len(eg.exceptions) != 1:
            raise
        exc = eg.exceptions[0]
        raise exc from exc.__cause__
