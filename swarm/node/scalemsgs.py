"""What an elastic pool's controller (node/scaling.py) says and hears (pure; issue 25):
its instructions to the runtime, the record of a hook run, and the strict decoding of
the announcements it gossips and the record it journals. Times travel as ages
("ago"), never as another node's clock readings; the journal keeps wall-clock times,
since a restart's monotonic clock starts afresh."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from .. import wire
from ..model import NodeId
from ..policy import autoscale as asc

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
