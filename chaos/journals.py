"""Read what each agent wrote in its own journal (sqlite): task records, transition
events, share changes. This is the evidence the invariants are checked against.

Opened read-only; the agents are stopped (or at least quiet) when it is read.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from swarm import codec, wire
from swarm import model as m
from swarm.runtime.journal import integrity_check
from swarm.runtime.journaldb import decode_event


@attrs.frozen
class TransitionEvent:
    """One `transition` row of a journal's events table."""

    seq: int
    at: float
    task_id: str
    node: str  # where the task was (or went) at that move, as the writer recorded it
    src: str | None
    dst: str
    cause: str


@attrs.frozen
class SharesEvent:
    seq: int
    at: float
    old: int
    new: int


@attrs.frozen
class ScaleEvent:
    """One `scale` row: an elastic pool's action as its actor journaled it (issue 25):
    a scale-in's chosen victims when their drains began, a hook done, a hook given up."""

    seq: int
    at: float
    node: str  # the actor that wrote it
    pool: str
    action: str | None  # "out", "in", or None (a hook given up)
    count: int
    nodes: tuple[str, ...]
    epoch: int
    reason: str


@attrs.frozen
class JournalData:
    """One agent's journal, decoded."""

    node: str
    tasks: Mapping[str, m.Task]
    transitions: tuple[TransitionEvent, ...]
    shares: tuple[SharesEvent, ...]
    integrity: str = "ok"
    bad_records: int = 0  # rows whose record did not decode
    scale: tuple[ScaleEvent, ...] = ()  # elastic pools' journaled actions
    replicated: frozenset[str] = frozenset()  # tasks of this home with copies (repls:)
    late_held: frozenset[str] = frozenset()  # tasks this home held for late binding
    # copies of other homes' tasks kept here with no word of their end (replica:
    # entries without `final`): task id -> the home the copy names
    open_copies: Mapping[str, str] = attrs.field(factory=dict)

    def events_of(self, task_id: str) -> list[TransitionEvent]:
        return [e for e in self.transitions if e.task_id == task_id]


class JournalMissing(Exception):
    pass


def read_journal(node: str, path: Path) -> JournalData:
    """Decode `path`; raises JournalMissing when there is no journal there."""
    if not path.exists():
        raise JournalMissing(f"{node}: no journal at {path}")
    integrity = integrity_check(path)
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tasks: dict[str, m.Task] = {}
        bad = 0
        for tid, blob in conn.execute("SELECT id, record FROM tasks"):
            try:
                tasks[str(tid)] = wire.decode_with(codec.task_from_wire, wire.unpack(blob))
            except wire.WireError:
                bad += 1
        transitions: list[TransitionEvent] = []
        shares: list[SharesEvent] = []
        scale: list[ScaleEvent] = []
        late: set[str] = set()
        rows = conn.execute("SELECT seq, at, kind, task_id, node, data FROM events ORDER BY seq")
        for seq, at, kind, task_id, ev_node, data in rows:
            d = _json(data)
            if kind == "transition" and isinstance(d, dict):
                transitions.append(
                    TransitionEvent(
                        seq=int(seq),
                        at=float(at),
                        task_id=str(task_id),
                        node=str(ev_node or ""),
                        src=d.get("src"),
                        dst=str(d.get("dst")),
                        cause=str(d.get("cause", "")),
                    )
                )
            elif kind == "shares" and isinstance(d, dict):
                try:
                    shares.append(SharesEvent(int(seq), float(at), int(d["old"]), int(d["new"])))
                except (KeyError, TypeError, ValueError):
                    bad += 1
            elif kind == "decision" and isinstance(d, dict):
                if "(late binding)" in str(d.get("outcome", "")):
                    late.add(str(task_id))
            elif kind == "scale" and isinstance(d, dict):
                try:
                    scale.append(_scale_event(int(seq), float(at), str(ev_node or ""), d))
                except (KeyError, TypeError, ValueError):
                    bad += 1
        replicated = frozenset(
            str(k)[len("repls:") :]
            for (k,) in conn.execute("SELECT key FROM kv WHERE key LIKE 'repls:%'")
        )
        open_copies: dict[str, str] = {}
        for k, v in conn.execute("SELECT key, value FROM kv WHERE key LIKE 'replica:%'"):
            try:
                d = wire.unpack(v)
            except wire.WireError:
                bad += 1
                continue
            if isinstance(d, dict) and d.get("final") is None:
                open_copies[str(k)[len("replica:") :]] = str(d.get("home", ""))
    finally:
        conn.close()
    return JournalData(
        node=node,
        tasks=tasks,
        transitions=tuple(transitions),
        shares=tuple(shares),
        integrity=integrity,
        bad_records=bad,
        scale=tuple(scale),
        replicated=replicated,
        late_held=frozenset(late),
        open_copies=open_copies,
    )


def _scale_event(seq: int, at: float, node: str, d: dict[str, Any]) -> ScaleEvent:
    action = d.get("action")
    return ScaleEvent(
        seq=seq,
        at=at,
        node=node,
        pool=str(d["pool"]),
        action=None if action is None else str(action),
        count=int(d.get("count") or 0),
        nodes=tuple(str(n) for n in d.get("nodes") or ()),
        epoch=int(d.get("epoch") or 0),
        reason=str(d.get("reason", "")),
    )


def _json(text: Any) -> Any:
    """An event's data: msgpack bytes, or JSON text from an older agent."""
    try:
        return decode_event(text)
    except ValueError:
        return None
