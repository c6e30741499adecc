"""The gang protocol's messages on the wire (issue 22): one msgpack-ready map each,
decoded strictly (`swarm.wire.Fields`: unknown fields, wrong types and values out
of range are refused with the field named; only `wire.WireError` is raised)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import wire
from ..model import valid_task_id
from . import gang as g

MAX_NODE_LEN = 256
MAX_REASON = 512
MAX_TTL = 3600.0
MAX_ROUND = 2**62
MAX_PORT = 65535

_TAGS: dict[type, str] = {
    g.Prepare: "prepare",
    g.Commit: "commit",
    g.Renew: "renew",
    g.Abort: "abort",
    g.Granted: "granted",
    g.Queued: "queued",
    g.Refused: "refused",
    g.Started: "started",
    g.Alive: "alive",
    g.Gone: "gone",
    g.Aborted: "aborted",
}


def to_wire(msg: g.Message) -> dict[str, Any]:
    out: dict[str, Any] = {"t": _TAGS[type(msg)], "gang": msg.gang, "round": msg.round}
    if isinstance(msg, g.Prepare):
        out.update(slots=list(msg.slots), ttl=msg.hold_ttl, seq=msg.seq)
    elif isinstance(msg, g.Commit):
        out.update(
            ranks=[[s, r] for s, r in sorted(msg.ranks.items())],
            world=msg.world,
            master=msg.master,
            port=msg.port,
            ttl=msg.run_ttl,
        )
    elif isinstance(msg, g.Renew):
        out.update(seq=msg.seq, ttl=msg.run_ttl)
    elif isinstance(msg, (g.Abort, g.Refused, g.Gone)):
        out["reason"] = msg.reason
    elif isinstance(msg, g.Granted):
        out.update(port=msg.port, seq=msg.seq)
    elif isinstance(msg, g.Queued):
        out.update(seq=msg.seq, reason=msg.reason)
    elif isinstance(msg, g.Started):
        out["slots"] = list(msg.slots)
    elif isinstance(msg, g.Alive):
        out.update(
            running=list(msg.running), exited=[[s, c] for s, c in sorted(msg.exited.items())]
        )
    return out


def from_wire(obj: Any) -> g.Message:
    f = wire.Fields(obj, "gang message")
    tag = f.str("t", required=True, max_len=16)
    what = f"gang {tag}"
    gang = f.str("gang", required=True, max_len=256)
    if not valid_task_id(gang):
        raise wire.SchemaError(f"{what}: field 'gang': invalid task id {gang!r:.80}")
    rnd = f.int("round", required=True, lo=0, hi=MAX_ROUND)
    msg: g.Message
    if tag == "prepare":
        slots = _slots(f.list("slots", required=True), what, "slots")
        if not slots:
            raise wire.SchemaError(f"{what}: field 'slots' is empty")
        ttl = f.float("ttl", required=True, lo=0.0, hi=MAX_TTL)
        msg = g.Prepare(gang, rnd, slots, ttl, f.int("seq", 0, lo=0, hi=MAX_ROUND))
    elif tag == "commit":
        ranks = _pairs(f.list("ranks", required=True), what, "ranks")
        world = f.int("world", required=True, lo=1, hi=g.MAX_GANG)
        if any(r >= world for r in ranks.values()):
            raise wire.SchemaError(f"{what}: field 'ranks': a rank is not below world {world}")
        master = f.str("master", required=True, max_len=MAX_NODE_LEN)
        port = f.int("port", required=True, lo=0, hi=MAX_PORT)
        msg = g.Commit(
            gang, rnd, ranks, world, master, port, f.float("ttl", required=True, lo=0.0, hi=MAX_TTL)
        )
    elif tag == "renew":
        seq = f.int("seq", required=True, lo=0, hi=MAX_ROUND)
        msg = g.Renew(gang, rnd, seq, f.float("ttl", required=True, lo=0.0, hi=MAX_TTL))
    elif tag in ("abort", "refused", "gone"):
        reason = f.str("reason", "", max_len=MAX_REASON)
        cls = {"abort": g.Abort, "refused": g.Refused, "gone": g.Gone}[tag]
        msg = cls(gang, rnd, reason)
    elif tag == "granted":
        port = f.int("port", 0, lo=0, hi=MAX_PORT)
        msg = g.Granted(gang, rnd, port, f.int("seq", 0, lo=0, hi=MAX_ROUND))
    elif tag == "queued":
        seq = f.int("seq", 0, lo=0, hi=MAX_ROUND)
        msg = g.Queued(gang, rnd, seq, f.str("reason", "", max_len=MAX_REASON))
    elif tag == "started":
        msg = g.Started(gang, rnd, _slots(f.list("slots", required=True), what, "slots"))
    elif tag == "alive":
        running = _slots(f.list("running", required=True), what, "running")
        msg = g.Alive(gang, rnd, running, _pairs(f.list("exited"), what, "exited", signed=True))
    elif tag == "aborted":
        msg = g.Aborted(gang, rnd)
    else:
        raise wire.SchemaError(f"gang message: field 't': unknown type {tag!r:.40}")
    f.done()
    return msg


def _slots(v: list[Any], what: str, key: str) -> tuple[int, ...]:
    if len(v) > g.MAX_GANG:
        raise wire.SchemaError(f"{what}: field {key!r} has more than {g.MAX_GANG} items")
    if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < g.MAX_GANG for x in v):
        raise wire.SchemaError(f"{what}: field {key!r} must hold slots 0..{g.MAX_GANG - 1}")
    if len(set(v)) != len(v):
        raise wire.SchemaError(f"{what}: field {key!r} names a slot twice")
    return tuple(v)


def _pairs(v: list[Any], what: str, key: str, signed: bool = False) -> Mapping[int, int]:
    """[[slot, n], ...] -> {slot: n}; n is a rank (0..MAX_GANG-1) or an exit code."""
    if len(v) > g.MAX_GANG:
        raise wire.SchemaError(f"{what}: field {key!r} has more than {g.MAX_GANG} items")
    out: dict[int, int] = {}
    lo, hi = (-(2**31), 2**31 - 1) if signed else (0, g.MAX_GANG - 1)
    for pair in v:
        ok = (
            isinstance(pair, (list, tuple))
            and len(pair) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in pair)
        )
        if not ok or not 0 <= pair[0] < g.MAX_GANG or not lo <= pair[1] <= hi or pair[0] in out:
            raise wire.SchemaError(
                f"{what}: field {key!r} must hold distinct [slot, value] pairs in range"
            )
        out[pair[0]] = pair[1]
    return out
