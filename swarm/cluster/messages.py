"""Membership wire messages and their strict codec.

One UDP datagram (or one reliable TCP payload) is one *packet*: a msgpack map
``{"v": version, "c": cluster name, "m": [blob, ...]}`` where every blob is one
message encoded on its own (a msgpack map with a type tag ``"t"``). Keeping each
message as its own blob is what makes piggybacking cheap: a queued broadcast is
encoded once and copied into many packets, and a receiver can cache decodes by
blob (in the simulator thousands of nodes share one `Codec`, so a message that
travels through the whole cluster is validated once).

Decoding is strict (`swarm.wire.Fields`: unknown fields and wrong types are
rejected) and raises only `swarm.wire.WireError` subclasses. A packet whose
cluster name is not ours raises `ClusterMismatch` before any message in it is
looked at, so nothing from another cluster is ever admitted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import msgpack

from swarm import codec as model_codec
from swarm import model as m
from swarm import wire
from swarm.wire import Fields, FrameTooLarge, MalformedFrame, SchemaError, VersionMismatch

PROTOCOL_VERSION = 1
MAX_MESSAGES = 1024  # per packet; a 1400-byte datagram cannot hold more than ~700
MAX_RECORDS = 200_000  # per push-pull list
MAX_ID_LEN = 256


class ClusterMismatch(wire.WireError):
    """The packet belongs to another cluster (or to no cluster we accept)."""

    code = "cluster"


# State codes on the wire (small ints keep records compact). The order is the merge
# precedence at equal incarnation, see swarm.cluster.gossip.precedence.
STATE_CODE: Mapping[m.MemberState, int] = {
    m.MemberState.ALIVE: 0,
    m.MemberState.SUSPECT: 1,
    m.MemberState.DEAD: 2,
    m.MemberState.LEFT: 3,
}
CODE_STATE: Mapping[int, m.MemberState] = {v: k for k, v in STATE_CODE.items()}


# ------------------------------------------------------------------ messages


@attrs.frozen
class Ping:
    """Direct probe. `target` is the node id we think lives at the address: a node that
    restarted under another id at the same address must not answer for the old one."""

    seq: int
    target: m.NodeId


@attrs.frozen
class Ack:
    seq: int


@attrs.frozen
class Nack:
    """Lifeguard: an indirect prober could not reach the target either. Tells the
    requester that the relay is healthy, so a missing ack is not its own fault."""

    seq: int


@attrs.frozen
class IndirectPing:
    """Ask a relay to probe `target` for us; the relay answers with Ack or Nack(seq)."""

    seq: int
    target: m.NodeId
    addr: str
    port: int
    nack: bool


@attrs.frozen
class MemberUpdate:
    """A member record: alive (join / refutation), suspect, dead or left.

    One message type for all four states because the merge rule is one lattice join
    over (incarnation, precedence); `accuser` names the node that suspected or
    declared it dead (independent confirmations shorten the suspicion timeout).
    """

    member: m.Member
    accuser: m.NodeId = ""


@attrs.frozen
class LoadUpdate:
    report: m.LoadReport


@attrs.frozen
class AppBroadcast:
    """Application gossip. (origin, key) identifies it; (incarnation, seq) orders it."""

    origin: m.NodeId
    key: str
    incarnation: int
    seq: int
    payload: Mapping[str, Any] = attrs.field(hash=False)


@attrs.frozen
class PushPull:
    """Full state exchange over a reliable stream (join, anti-entropy, partition heal)."""

    sender: m.Member
    members: tuple[m.Member, ...]
    loads: tuple[m.LoadReport, ...]
    app_state: Mapping[str, Any] | None = attrs.field(default=None, hash=False)
    reply: bool = False
    join: bool = False
    heal: bool = False


Message = Ping | Ack | Nack | IndirectPing | MemberUpdate | LoadUpdate | AppBroadcast | PushPull

MESSAGE_KIND: Mapping[type, str] = {
    Ping: "ping",
    Ack: "ack",
    Nack: "nack",
    IndirectPing: "ping_req",
    MemberUpdate: "member",
    LoadUpdate: "load",
    AppBroadcast: "app",
    PushPull: "push_pull",
}


@attrs.frozen
class Packet:
    cluster: str
    messages: tuple[Message, ...]
    blobs: tuple[bytes, ...]  # each message as received (relayed as is, sizes counted)


# ---------------------------------------------------------- compact records

# Load reports travel often, so their keys are shortened and default values left out.
# Decoding maps the short keys back and runs the shared schema (codec.load_report_from_wire).
_LOAD_SHORT: Mapping[str, str] = {
    "node": "n",
    "version": "v",
    "shares": "s",
    "reserved_shares": "r",
    "weight_sum": "w",
    "queued": "q",
    "running": "u",
    "slots": "k",
    "cpu_util": "c",
    "load_per_core": "lc",
    "cpus": "cp",
    "mem_available": "ma",
    "mem_total": "mt",
    "psi_cpu": "pc",
    "psi_mem": "pm",
    "gpus": "g",
    "isolation": "i",
    "criu": "cr",
    "bands": "b",
    "groups": "gr",
    "usage": "us",
    "labels": "lb",
    "data": "dk",
    "task_seconds": "ts",
    "unmovable_seconds": "um",
    "homing": "hm",
}
_LOAD_DEFAULTS: Mapping[str, Any] = model_codec.load_report_to_wire(
    m.LoadReport(node="", version=0)
)
# A field added to LoadReport later travels under its long name until it gets a short
# one here (tests check that every field has one).
_LOAD_LONG: Mapping[str, str] = {
    **{k: k for k in _LOAD_DEFAULTS},
    **{v: k for k, v in _LOAD_SHORT.items()},
}


def load_to_compact(r: m.LoadReport) -> dict[str, Any]:
    full = model_codec.load_report_to_wire(r)
    out: dict[str, Any] = {}
    for k, v in full.items():
        if k in ("node", "version") or v != _LOAD_DEFAULTS.get(k):
            out[_LOAD_SHORT.get(k, k)] = v
    return out


def load_from_compact(obj: Any) -> m.LoadReport:
    """Map the short keys back and run the shared schema (strict, typed errors)."""
    if not isinstance(obj, dict):
        raise SchemaError(f"load report: expected a map, got {type(obj).__name__}")
    full: dict[str, Any] = {}
    for k, v in obj.items():
        long = _LOAD_LONG.get(k) if isinstance(k, str) else None
        if long is None or long in full:
            raise SchemaError(f"load report: unknown or repeated field {k!r:.40}")
        full[long] = v
    report: m.LoadReport = wire.decode_with(model_codec.load_report_from_wire, full)
    return report


def member_to_compact(mb: m.Member) -> dict[str, Any]:
    return {
        "n": mb.node,
        "a": mb.addr,
        "p": mb.port,
        "i": mb.incarnation,
        "s": STATE_CODE[mb.state],
    }


def _member_fields(f: Fields, cluster: str) -> m.Member:
    node = f.str("n", required=True, max_len=MAX_ID_LEN)
    if not node:
        raise SchemaError(f"{f.what}: empty node id")
    return m.Member(
        node=node,
        addr=f.str("a", required=True, max_len=MAX_ID_LEN),
        port=f.int("p", required=True, lo=0, hi=65535),
        state=CODE_STATE[f.int("s", required=True, lo=0, hi=3)],
        incarnation=f.int("i", required=True, lo=0, hi=(1 << 63) - 1),
        cluster=cluster,
    )


def member_from_compact(obj: Any, cluster: str) -> m.Member:
    f = Fields(obj, "member record")
    mb = _member_fields(f, cluster)
    f.done()
    return mb


# -------------------------------------------------------------- to the wire

_U63 = (1 << 63) - 1
_ENVELOPE_KEYS = frozenset({"v", "c", "m"})


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def message_to_wire(msg: Message) -> dict[str, Any]:
    """The map for one message (without the packet envelope)."""
    if isinstance(msg, Ping):
        return {"t": "p", "s": msg.seq, "n": msg.target}
    if isinstance(msg, Ack):
        return {"t": "a", "s": msg.seq}
    if isinstance(msg, Nack):
        return {"t": "na", "s": msg.seq}
    if isinstance(msg, IndirectPing):
        return {
            "t": "pr",
            "s": msg.seq,
            "n": msg.target,
            "a": msg.addr,
            "p": msg.port,
            "k": msg.nack,
        }
    if isinstance(msg, MemberUpdate):
        d = member_to_compact(msg.member)
        d["t"] = "m"
        if msg.accuser:
            d["f"] = msg.accuser
        return d
    if isinstance(msg, LoadUpdate):
        return {"t": "l", "r": load_to_compact(msg.report)}
    if isinstance(msg, AppBroadcast):
        return {
            "t": "x",
            "o": msg.origin,
            "k": msg.key,
            "i": msg.incarnation,
            "q": msg.seq,
            "d": dict(msg.payload),
        }
    # PushPull is encoded by Codec.encode_push_pull (its records are nested blobs).
    raise TypeError(f"cannot encode {type(msg).__name__} as a single message")


def blob_overhead(n: int) -> int:
    """Bytes msgpack adds around a bin of length n inside the packet's array."""
    if n < 256:
        return 2
    if n < 65536:
        return 3
    return 5


def envelope_overhead(cluster: str) -> int:
    """Bytes of an empty packet plus room for the array header to grow to array16."""
    return len(_pack({"v": PROTOCOL_VERSION, "c": cluster, "m": []})) + 2


# ------------------------------------------------------------------- codec


class Codec:
    """Encodes and strictly decodes packets; optionally memoizes blob decodes.

    The cache maps (cluster, kind, blob) to the decoded, immutable message or record.
    It only ever holds successful decodes, so errors are re-raised on every try. One
    node needs no cache (cache_size=0); the simulator shares one big cache between
    all its nodes. When full it is simply cleared: bounded, no bookkeeping.
    """

    def __init__(self, cache_size: int = 0) -> None:
        self.cache_size = cache_size
        self._dec: dict[tuple[str, str, bytes], Any] = {}
        # Encode caches are keyed by object identity (records are shared, immutable
        # objects; hashing an attrs instance runs in Python and showed in profiles).
        # The entry keeps the object alive, so its id cannot be reused meanwhile.
        self._enc_member: dict[int, tuple[m.Member, bytes]] = {}
        self._enc_load: dict[int, tuple[m.LoadReport, bytes]] = {}

    # ..... encoding

    def encode(self, msg: Message) -> bytes:
        return _pack(message_to_wire(msg))

    def encode_packet(self, cluster: str, blobs: Sequence[bytes]) -> bytes:
        return _pack({"v": PROTOCOL_VERSION, "c": cluster, "m": list(blobs)})

    def member_blob(self, mb: m.Member) -> bytes:
        if not self.cache_size:
            return _pack(member_to_compact(mb))
        e = self._enc_member.get(id(mb))
        if e is not None and e[0] is mb:
            return e[1]
        if len(self._enc_member) >= self.cache_size:
            self._enc_member.clear()
        b = _pack(member_to_compact(mb))
        self._enc_member[id(mb)] = (mb, b)
        return b

    def load_blob(self, r: m.LoadReport) -> bytes:
        if not self.cache_size:
            return _pack(load_to_compact(r))
        e = self._enc_load.get(id(r))
        if e is not None and e[0] is r:
            return e[1]
        if len(self._enc_load) >= self.cache_size:
            self._enc_load.clear()
        b = _pack(load_to_compact(r))
        self._enc_load[id(r)] = (r, b)
        return b

    def encode_push_pull(
        self,
        sender: m.Member,
        members: Iterable[m.Member],
        loads: Iterable[m.LoadReport],
        *,
        app_state: Mapping[str, Any] | None,
        reply: bool,
        join: bool,
        heal: bool,
    ) -> bytes:
        d: dict[str, Any] = {
            "t": "pp",
            "f": self.member_blob(sender),
            "m": [self.member_blob(x) for x in members],
            "l": [self.load_blob(x) for x in loads],
        }
        if app_state is not None:
            d["a"] = dict(app_state)
        if reply:
            d["r"] = True
        if join:
            d["j"] = True
        if heal:
            d["h"] = True
        return _pack(d)

    # ..... decoding

    def decode_packet(self, data: bytes, *, max_size: int, cluster: str) -> Packet:
        """Decode one packet of ours. Raises only wire.WireError subclasses."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise MalformedFrame(f"packet: expected bytes, got {type(data).__name__}")
        if len(data) > max_size:
            raise FrameTooLarge(f"packet of {len(data)} bytes exceeds limit {max_size}")
        obj = wire.unpack(bytes(data), max_size)
        # The envelope is checked by hand (it is on every packet): same strictness as
        # wire.Fields - exact key set, exact types - at a fraction of the cost.
        if type(obj) is not dict:
            raise SchemaError(f"packet: expected a map, got {type(obj).__name__}")
        if obj.keys() != _ENVELOPE_KEYS:
            missing = sorted(_ENVELOPE_KEYS - obj.keys())
            extra = sorted(repr(k) for k in obj.keys() - _ENVELOPE_KEYS)
            raise SchemaError(f"packet: missing {missing}, unknown {extra}")
        v, c, blobs = obj["v"], obj["c"], obj["m"]
        if type(v) is not int:
            raise SchemaError("packet: field 'v' must be an integer")
        if v != PROTOCOL_VERSION:
            raise VersionMismatch(f"packet: protocol version {v} (want {PROTOCOL_VERSION})")
        if type(c) is not str or len(c) > MAX_ID_LEN:
            raise SchemaError("packet: field 'c' must be a string of at most 256 chars")
        if type(blobs) is not list:
            raise SchemaError("packet: field 'm' must be a list")
        if c != cluster:
            raise ClusterMismatch(f"packet of cluster {c!r:.40}, we are {cluster!r:.40}")
        if len(blobs) > MAX_MESSAGES:
            raise SchemaError(f"packet: more than {MAX_MESSAGES} messages")
        msgs: list[Message] = []
        raw: list[bytes] = []
        for b in blobs:
            if not isinstance(b, bytes):
                raise SchemaError("packet: messages must be bytes")
            msgs.append(self.decode_message(b, c, max_size))
            raw.append(b)
        return Packet(cluster=c, messages=tuple(msgs), blobs=tuple(raw))

    def _cached(self, key: tuple[str, str, bytes]) -> Any:
        return self._dec.get(key) if self.cache_size else None

    def _remember(self, key: tuple[str, str, bytes], value: Any) -> None:
        if self.cache_size:
            if len(self._dec) >= self.cache_size:
                self._dec.clear()
            self._dec[key] = value

    def decode_message(self, blob: bytes, cluster: str, max_size: int = wire.MAX_FRAME) -> Message:
        key = (cluster, "msg", blob)
        hit = self._cached(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        msg = wire.decode_with(lambda b: _decode_blob(self, b, cluster, max_size), blob)
        self._remember(key, msg)
        return msg

    def _decode_record(self, blob: Any, cluster: str, kind: str) -> Any:
        if not isinstance(blob, bytes):
            raise SchemaError(f"push-pull: {kind} records must be bytes")
        key = (cluster, kind, blob)
        hit = self._cached(key)
        if hit is not None:
            return hit
        obj = wire.unpack(blob, len(blob))
        rec: Any
        if kind == "member":
            rec = wire.decode_with(lambda o: member_from_compact(o, cluster), obj)
        else:
            rec = load_from_compact(obj)
        self._remember(key, rec)
        return rec


def _decode_blob(codec: Codec, blob: bytes, cluster: str, max_size: int) -> Message:
    obj = wire.unpack(blob, max_size)
    f = Fields(obj, "message")
    t = f.str("t", required=True, max_len=4)
    msg: Message
    if t == "p":
        msg = Ping(
            seq=f.int("s", required=True, lo=0, hi=_U63), target=f.str("n", "", max_len=MAX_ID_LEN)
        )
    elif t == "a":
        msg = Ack(seq=f.int("s", required=True, lo=0, hi=_U63))
    elif t == "na":
        msg = Nack(seq=f.int("s", required=True, lo=0, hi=_U63))
    elif t == "pr":
        msg = IndirectPing(
            seq=f.int("s", required=True, lo=0, hi=_U63),
            target=f.str("n", required=True, max_len=MAX_ID_LEN),
            addr=f.str("a", required=True, max_len=MAX_ID_LEN),
            port=f.int("p", required=True, lo=0, hi=65535),
            nack=f.bool("k", False),
        )
    elif t == "m":
        mb = _member_fields(f, cluster)
        msg = MemberUpdate(member=mb, accuser=f.str("f", "", max_len=MAX_ID_LEN))
    elif t == "l":
        msg = LoadUpdate(report=load_from_compact(f.map("r", required=True)))
    elif t == "x":
        msg = AppBroadcast(
            origin=f.str("o", required=True, max_len=MAX_ID_LEN),
            key=f.str("k", required=True, max_len=MAX_ID_LEN),
            incarnation=f.int("i", required=True, lo=0, hi=_U63),
            seq=f.int("q", required=True, lo=0, hi=_U63),
            payload=_str_keyed(f.map("d", required=True), "app payload"),
        )
    elif t == "pp":
        members = f.list("m", required=True)
        loads = f.list("l")
        if len(members) > MAX_RECORDS or len(loads) > MAX_RECORDS:
            raise SchemaError(f"push-pull: more than {MAX_RECORDS} records")
        app = _opt_map(f, "a")
        msg = PushPull(
            sender=codec._decode_record(f.bytes("f", required=True), cluster, "member"),
            members=tuple(codec._decode_record(b, cluster, "member") for b in members),
            loads=tuple(codec._decode_record(b, cluster, "load") for b in loads),
            app_state=app,
            reply=f.bool("r", False),
            join=f.bool("j", False),
            heal=f.bool("h", False),
        )
    else:
        raise SchemaError(f"message: unknown type {t!r}")
    f.done()
    return msg


def _str_keyed(d: dict[str, Any], what: str) -> dict[str, Any]:
    if not all(isinstance(k, str) for k in d):
        raise SchemaError(f"{what}: keys must be strings")
    return d


def _opt_map(f: Fields, key: str) -> dict[str, Any] | None:
    if f.obj.get(key) is None:
        f.seen.add(key)
        return None
    return _str_keyed(f.map(key), "app state")
