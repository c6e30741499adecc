"""What an elastic pool's controller (node/scaling.py) says and hears (pure; issue 25):
its instructions to the runtime, the record of a hook run, and the strict decoding of
the announcements it gossips and the record it journals. Times travel as ages
("ago"), never as another node's clock readings; the journal keeps wall-clock times,
since a restart's monotonic clock starts afresh."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import attrs

from .. import wire
from ..cluster.actor import MAX_EPOCH, Lease
from ..model import NodeId
from ..policy import autoscale as asc
from ..policy.scalepool import PoolSpec

MAX_VICTIMS = 64  # nodes named in one announcement or journal record
MAX_BASELINE = 4096  # the pool's nodes a journal record names (what booting counts from)


# --------------------------------------------------------------- instructions


@attrs.frozen
class Announce:
    """Gossip this pool's seat state (app message and push-pull state under `key`)."""

    key: str
    payload: dict[str, Any]


@attrs.frozen
class RunHook:
    """Run one attempt of the pool's hook; report the result with `hook_done`."""

    pool: str
    action: Literal["out", "in"]
    command: str
    env: dict[str, str]
    timeout: float
    attempt: int  # 0: the first attempt


@attrs.frozen
class Drain:
    """Drain (`on`) or undrain a node of the pool (a peer request when not this node)."""

    pool: str
    node: NodeId
    on: bool
    reason: str


@attrs.frozen
class Journal:
    """Write the pool's record (`key` in the journal's key-value table) and an event."""

    key: str
    value: dict[str, Any]
    note: dict[str, Any]


Instruction = Announce | RunHook | Drain | Journal


@attrs.frozen
class HookRun:
    """One finished hook attempt, for `swarm scale status`."""

    action: str
    count: int
    nodes: tuple[NodeId, ...]
    attempt: int
    ok: bool
    rc: int | None
    error: str
    output: str
    at: float  # when it ended (this node's clock)
    duration: float


def acted_wire(a: asc.Acted | None, now: float) -> dict[str, Any] | None:
    if a is None:
        return None
    return {"a": a.action, "c": a.count, "ago": max(0.0, now - a.at)}


def acted_from(obj: Any, now: float) -> asc.Acted | None:
    if obj is None:
        return None
    f = wire.Fields(obj, "scale action")
    action = f.str("a", required=True, max_len=3)
    count = f.int("c", required=True, lo=0, hi=1 << 20)
    ago = f.float("ago", required=True, lo=0.0, hi=1e9)
    f.done()
    if action not in ("out", "in"):
        raise wire.SchemaError(f"scale action: field 'a' must be out or in, got {action!r:.10}")
    return asc.Acted(action, count, now - ago)  # type: ignore[arg-type]


def booting_wire(count: int, at: float | None, now: float) -> dict[str, Any] | None:
    """Nodes a scale-out launched that have not joined yet, and the age of the newest
    launch among them (a holder that takes over counts them until its boot timeout)."""
    if count <= 0 or at is None:
        return None
    return {"c": count, "ago": max(0.0, now - at)}


def booting_from(
    obj: Any, now: float, wall: float | None = None
) -> tuple[int, float, frozenset[NodeId] | None] | None:
    """(count, launched at on this node's clock, the pool they are not in: None when
    not said) from `booting_wire`'s form, or from the journal's (`journal_value`: a
    wall-clock time instead of an age, and the pool's nodes) with `wall`."""
    if obj is None:
        return None
    f = wire.Fields(obj, "scale booting")
    count = f.int("c", required=True, lo=0, hi=1 << 20)
    base = None
    if wall is None:
        ago = f.float("ago", required=True, lo=0.0, hi=1e9)
    else:
        ago = max(0.0, wall - f.float("wall", required=True, lo=0.0, hi=1e12))
        base = frozenset(nodes_from(f.list("base"), "scale booting base", MAX_BASELINE))
    f.done()
    return count, now - ago, base


def nodes_from(obj: Any, what: str, limit: int = MAX_VICTIMS) -> list[NodeId]:
    if not isinstance(obj, list) or len(obj) > limit:
        raise wire.SchemaError(f"{what}: expected a list of at most {limit} node ids")
    out: list[NodeId] = []
    for n in obj:
        if not isinstance(n, str) or not n or len(n) > 256:
            raise wire.SchemaError(f"{what}: a node id must be a non-empty string")
        out.append(n)
    return out


@attrs.define
class HeardBoot:
    """The nodes the holder announced as booting, for a node that takes over from it."""

    count: int
    at: float  # the newest of their launches (this node's clock)
    baseline: frozenset[NodeId] | None = None  # the pool at the next tick after hearing it


def hook_env(
    pool: str,
    actor: NodeId,
    action: str,
    count: int,
    nodes: tuple[NodeId, ...],
    desired: int,
    epoch: int,
    attempt: int,
) -> dict[str, str]:
    """The hook's SWARM_SCALE_* environment (values only: never shell text)."""
    return {
        "SWARM_SCALE_POOL": pool,
        "SWARM_SCALE_ACTION": action,
        "SWARM_SCALE_COUNT": str(count),
        "SWARM_SCALE_NODES": " ".join(nodes),
        "SWARM_SCALE_DESIRED": str(desired),
        "SWARM_SCALE_EPOCH": str(epoch),
        "SWARM_SCALE_ACTOR": actor,
        "SWARM_SCALE_ATTEMPT": str(attempt),
    }


@attrs.frozen
class Heard:
    """One decoded announcement: from the holder (with its lease) or relayed by a node
    that heard it (no lease: a relay renews nothing). `epoch` and `seq` order what is
    said about the seat: the holder's lease epoch and its announcement's sequence."""

    lease: Lease | None
    holder: NodeId  # whose seat state this is ("" when a relay does not say)
    epoch: int
    seq: int
    last: asc.Acted | None
    victims: tuple[NodeId, ...]
    removed: tuple[NodeId, ...]
    booting: tuple[int, float, frozenset[NodeId] | None] | None


def announcement_wire(
    *,
    lease: Lease | None,
    holder: NodeId,
    epoch: int,
    seq: int,
    last: asc.Acted | None,
    victims: Iterable[NodeId],
    removed: Iterable[NodeId],
    booting: dict[str, Any] | None,
    now: float,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "holder": holder,
        "epoch": epoch,
        "seq": seq,
        "last": acted_wire(last, now),
        "victims": sorted(victims)[:MAX_VICTIMS],
        "removed": sorted(removed)[:MAX_VICTIMS],
        "booting": booting,
    }
    if lease is not None:
        out["lease"] = lease.to_wire()
    return out


def announcement_from(payload: Any, now: float) -> Heard:
    """Strict: a malformed announcement raises wire.WireError (the caller counts it)."""
    f = wire.Fields(payload, "scale announcement")
    raw_lease = f.map("lease")
    lease = Lease.from_wire(raw_lease) if raw_lease else None
    # a holder's announcement may leave out its epoch (the lease's) and its sequence
    epoch = f.int("epoch", None if lease is None else lease.epoch, lo=0, hi=MAX_EPOCH)
    if epoch is None:
        raise wire.SchemaError("scale announcement: a relay must name its epoch")
    seq = f.int("seq", 0, lo=0, hi=MAX_EPOCH)
    holder = f.str("holder", "" if lease is None else lease.holder, max_len=256)
    last = f.nested("last", lambda o: acted_from(o, now))
    victims = nodes_from(f.list("victims"), "scale announcement victims")
    removed = nodes_from(f.list("removed"), "scale announcement removed")
    booting = f.nested("booting", lambda o: booting_from(o, now))
    f.done()
    if lease is not None and lease.epoch != epoch:
        raise wire.SchemaError("scale announcement: epoch differs from the lease's")
    if lease is not None and holder != lease.holder:
        raise wire.SchemaError("scale announcement: holder differs from the lease's")
    return Heard(lease, holder, epoch, seq, last, tuple(victims), tuple(removed), booting)


def record_from(
    record: Any, now: float, wall: float
) -> tuple[asc.Acted | None, list[NodeId], int, tuple[int, float, frozenset[NodeId] | None] | None]:
    """The journal's form (`journal_value`) back: the last action on this node's clock,
    the victims, the epoch and the nodes booting. Raises wire.WireError."""
    f = wire.Fields(record, "scale record")
    last = f.nested("last", lambda o: o)
    victims = nodes_from(f.list("victims"), "scale record victims")
    epoch = f.int("epoch", 0, lo=0, hi=MAX_EPOCH)
    booting = f.nested("booting", lambda o: booting_from(o, now, wall))
    f.done()
    acted = None
    if last is not None:
        g = wire.Fields(last, "scale record last")
        action = g.str("a", required=True, max_len=3)
        count = g.int("c", required=True, lo=0, hi=1 << 20)
        at_wall = g.float("wall", required=True, lo=0.0, hi=1e12)
        g.done()
        if action in ("out", "in"):
            acted = asc.Acted(action, count, now - max(0.0, wall - at_wall))  # type: ignore[arg-type]
    return acted, victims, epoch, booting


def journal_instr(
    spec: PoolSpec,
    latest: asc.Acted | None,
    victims: Iterable[NodeId],
    epoch: int,
    booting: dict[str, Any] | None,
    pool_nodes: Iterable[NodeId],
    what: tuple[str | None, int, tuple[NodeId, ...], str],
    now: float,
) -> Journal:
    """The pool's record (for a restart: the last action, the victims, the epoch, the
    nodes booting and the pool they were counted against) and the event of `what`:
    (action or None, count, nodes, reason)."""
    action, count, nodes, reason = what
    if booting is not None:
        booting = {**booting, "base": sorted(pool_nodes)[:MAX_BASELINE]}
    return Journal(
        key=spec.key,
        value={
            "last": None
            if latest is None
            else {"a": latest.action, "c": latest.count, "ago": max(0.0, now - latest.at)},
            "victims": sorted(victims)[:MAX_VICTIMS],
            "epoch": epoch,
            "booting": booting,
        },
        note={
            "pool": spec.name,
            "action": action,
            "count": count,
            "nodes": list(nodes),
            "epoch": epoch,
            "reason": reason,
        },
    )


def journal_value(j: Journal, wall: float) -> dict[str, Any]:
    """The journal form of a `Journal` instruction: ages become wall-clock times (a
    restart's monotonic clock starts afresh)."""
    value = dict(j.value)
    last = value.get("last")
    if isinstance(last, dict):
        value["last"] = {"a": last["a"], "c": last["c"], "wall": wall - float(last["ago"])}
    booting = value.get("booting")
    if isinstance(booting, dict):
        value["booting"] = {
            "c": booting["c"],
            "wall": wall - float(booting["ago"]),
            "base": list(booting.get("base", ())),
        }
    return value
