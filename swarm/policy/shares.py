"""Local share accounting, and the cluster's global task set (a CRDT).

ShareLedger is the node's own book of tasks queued and running here: their weights
(the load index numerator) and reservations (consumed only while a task runs). It
enforces the share rules at the moment a task starts, so a reservation can never be
oversubscribed whatever order starts, finishes and `swarm shares N` arrive in.

GlobalTasks is the set of tasks that must run on every node. It is gossiped as an
opaque map; merge is a join (commutative, associative, idempotent), so every node that
has heard the same adds and removes holds the same set, whatever the gossip order.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import attrs

from swarm import codec, wire
from swarm.model import DEFAULT_SHARES, LoadReport, NodeId, TaskId, TaskSpec

from .load import load_index, projected_load
from .view import PeerInfo

MAX_SHARES = 1 << 40


class LedgerError(Exception):
    """A ledger operation that the current state forbids; `reason` is for humans."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@attrs.frozen
class LedgerTask:
    id: TaskId
    weight: float
    reserve_shares: int
    is_global: bool
    running: bool = False


@attrs.frozen
class LedgerSnapshot:
    """The share fields of this node's LoadReport."""

    shares: int
    reserved_shares: int
    weight_sum: float
    queued: int
    running: int

    @property
    def free(self) -> int:
        return self.shares - self.reserved_shares

    @property
    def load(self) -> float:
        return load_index(self.weight_sum, self.shares, self.reserved_shares)


def check_shares(shares: int) -> int:
    if isinstance(shares, bool) or not isinstance(shares, int):
        raise LedgerError(f"shares must be an integer, got {shares!r:.40}")
    if not 0 <= shares <= MAX_SHARES:
        raise LedgerError(f"shares must be in [0, {MAX_SHARES}], got {shares}")
    return shares


class ShareLedger:
    """Tasks queued or running on this node, with O(1) aggregates.

    Rules: a non-global task starts only when the node is not draining (shares > 0),
    some share is unreserved (else its load is infinite) and its reservation fits the
    unconsumed shares; a global task always starts and may
    push the free shares below zero. Lowering shares below what running tasks hold
    kills nothing; it only blocks further reserving starts until enough finish.
    """

    def __init__(self, shares: int = DEFAULT_SHARES) -> None:
        self._shares = check_shares(shares)
        self._tasks: dict[TaskId, LedgerTask] = {}
        self._weight_sum = 0.0
        self._reserved = 0
        self._running = 0

    # -------------------------------------------------------------- reading

    @property
    def shares(self) -> int:
        return self._shares

    @property
    def draining(self) -> bool:
        return self._shares <= 0

    @property
    def reserved(self) -> int:
        return self._reserved

    @property
    def free(self) -> int:
        return self._shares - self._reserved

    @property
    def weight_sum(self) -> float:
        return self._weight_sum

    @property
    def running(self) -> int:
        return self._running

    @property
    def queued(self) -> int:
        return len(self._tasks) - self._running

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def get(self, task_id: TaskId) -> LedgerTask | None:
        return self._tasks.get(task_id)

    def tasks(self) -> tuple[LedgerTask, ...]:
        return tuple(self._tasks.values())

    def load(self) -> float:
        return load_index(self._weight_sum, self._shares, self._reserved)

    def projected_load(self, spec: TaskSpec) -> float:
        return projected_load(
            self._weight_sum, self._shares, self._reserved, spec.weight, spec.reserve_shares
        )

    def snapshot(self) -> LedgerSnapshot:
        return LedgerSnapshot(
            shares=self._shares,
            reserved_shares=self._reserved,
            weight_sum=self._weight_sum,
            queued=self.queued,
            running=self._running,
        )

    # ------------------------------------------------------------ deciding

    def refuse_new(self, spec: TaskSpec) -> str | None:
        """Why this node must not take `spec` into its queue now, or None.

        The same share test a placer applies to a report (placement.refusal): not
        draining, some share unreserved, and the reservation fits the unconsumed shares
        now.
        """
        if spec.is_global:
            return None
        if self.draining:
            return "node is draining (shares 0)"
        if self.free <= 0:
            return f"no unreserved shares ({self._reserved} of {self._shares} held)"
        if spec.reserve_shares > self.free:
            return (
                f"reservation of {spec.reserve_shares} shares exceeds the"
                f" {max(self.free, 0)} free here"
            )
        return None

    def refuse_start(self, task_id: TaskId) -> str | None:
        """Why the queued task `task_id` must not start now, or None."""
        t = self._tasks.get(task_id)
        if t is None:
            return f"task {task_id} is not here"
        if t.running:
            return f"task {task_id} is already running"
        if t.is_global:
            return None
        if self.draining:
            return "node is draining (shares 0)"
        if self.free <= 0:
            return f"no unreserved shares ({self._reserved} of {self._shares} held)"
        if t.reserve_shares > self.free:
            return (
                f"reservation of {t.reserve_shares} shares exceeds the"
                f" {max(self.free, 0)} free here"
            )
        return None

    # ------------------------------------------------------------ changing

    def set_shares(self, shares: int) -> None:
        self._shares = check_shares(shares)

    def add(self, spec: TaskSpec) -> None:
        """Record a task queued here (admission is a separate decision: refuse_new)."""
        if spec.id in self._tasks:
            raise LedgerError(f"task {spec.id} is already here")
        if spec.weight < 0 or spec.reserve_shares < 0:
            raise LedgerError("weight and reserve_shares must be >= 0")
        self._tasks[spec.id] = LedgerTask(
            spec.id, float(spec.weight), int(spec.reserve_shares), bool(spec.is_global)
        )
        self._weight_sum += float(spec.weight)

    def start(self, task_id: TaskId) -> None:
        why = self.refuse_start(task_id)
        if why is not None:
            raise LedgerError(why)
        t = self._tasks[task_id]
        self._tasks[task_id] = LedgerTask(t.id, t.weight, t.reserve_shares, t.is_global, True)
        self._reserved += t.reserve_shares
        self._running += 1

    def stop(self, task_id: TaskId) -> None:
        """A running task goes back to the queue (restart, migration): frees its shares."""
        t = self._tasks.get(task_id)
        if t is None or not t.running:
            raise LedgerError(f"task {task_id} is not running here")
        self._tasks[task_id] = LedgerTask(t.id, t.weight, t.reserve_shares, t.is_global, False)
        self._reserved -= t.reserve_shares
        self._running -= 1

    def remove(self, task_id: TaskId) -> LedgerTask | None:
        """The task finished, was cancelled or moved away; absent ids are ignored."""
        t = self._tasks.pop(task_id, None)
        if t is None:
            return None
        self._weight_sum -= t.weight
        if not self._tasks:
            self._weight_sum = 0.0  # no float drift once empty
        if t.running:
            self._reserved -= t.reserve_shares
            self._running -= 1
        return t


# ------------------------------------------------------------------ global tasks


def _spec_key(spec: TaskSpec) -> bytes:
    return wire.pack(codec.task_spec_to_wire(spec))


MAX_GLOBAL_ITEMS = 100_000


@attrs.frozen
class GlobalTasks:
    """Observed-remove set of global tasks, keyed by task id.

    Task ids are unique and a global task is added once (at its home node), so the
    task id itself is the OR-set's unique add tag: an element is present iff its add
    has been seen and no remove of it has. A remove is recorded as a tombstone of the
    id, so it wins over the add it observed (and over that add arriving late); merge
    is union of adds and union of tombstones. A spec is kept with its add so every
    node can run it. Tombstones are kept forever (a few dozen bytes per removed global
    task): dropping them could let a late add resurrect the task.
    """

    adds: Mapping[TaskId, TaskSpec] = attrs.field(factory=dict)
    removed: frozenset[TaskId] = frozenset()

    def add(self, spec: TaskSpec) -> GlobalTasks:
        if not spec.is_global:
            raise ValueError(f"task {spec.id} is not global")
        if spec.id in self.adds:
            if self.adds[spec.id] == spec:
                return self
            return GlobalTasks(_merge_adds(self.adds, {spec.id: spec}), self.removed)
        return GlobalTasks({**self.adds, spec.id: spec}, self.removed)

    def remove(self, task_id: TaskId) -> GlobalTasks:
        if task_id in self.removed:
            return self
        return GlobalTasks(self.adds, self.removed | {task_id})

    def merge(self, other: GlobalTasks) -> GlobalTasks:
        if other is self:
            return self
        return GlobalTasks(_merge_adds(self.adds, other.adds), self.removed | other.removed)

    @property
    def members(self) -> Mapping[TaskId, TaskSpec]:
        return {k: v for k, v in self.adds.items() if k not in self.removed}

    def __contains__(self, task_id: object) -> bool:
        return task_id in self.adds and task_id not in self.removed

    def to_wire(self) -> dict[str, Any]:
        return {
            "v": wire.PROTOCOL_VERSION,
            "adds": [codec.task_spec_to_wire(s) for _, s in sorted(self.adds.items())],
            "removed": sorted(self.removed),
        }

    @classmethod
    def from_wire(cls, obj: Any) -> GlobalTasks:
        """Strict decode; raises only wire.WireError subclasses."""
        wire.check_version(obj, "global tasks")
        f = wire.Fields(obj, "global tasks", ignore=("v",))
        raw_adds = f.list("adds")
        removed = f.str_list("removed", max_items=MAX_GLOBAL_ITEMS)
        f.done()
        if len(raw_adds) > MAX_GLOBAL_ITEMS:
            raise wire.SchemaError(f"global tasks: more than {MAX_GLOBAL_ITEMS} adds")
        adds: dict[TaskId, TaskSpec] = {}
        for raw in raw_adds:
            spec = wire.decode_with(codec.task_spec_from_wire, raw)
            if not spec.is_global:
                raise wire.SchemaError(f"global tasks: task {spec.id!r:.40} is not global")
            adds = _merge_adds(adds, {spec.id: spec})
        return cls(adds, frozenset(removed))


def _merge_adds(
    a: Mapping[TaskId, TaskSpec], b: Mapping[TaskId, TaskSpec]
) -> dict[TaskId, TaskSpec]:
    """Union; two different specs under one id (a bug upstream) resolve to the one with
    the smaller canonical encoding, so the choice is the same on every node."""
    out = dict(a)
    for k, v in b.items():
        mine = out.get(k)
        if mine is None or (mine != v and _spec_key(v) < _spec_key(mine)):
            out[k] = v
    return out


@attrs.frozen
class GlobalDelta:
    """What a node must do about global tasks: start these, stop those."""

    start: tuple[TaskSpec, ...] = ()
    stop: tuple[TaskId, ...] = ()


def global_delta(
    tasks: GlobalTasks,
    active: Collection[TaskId],
    finished: Collection[TaskId],
    *,
    has_shares: bool,
) -> GlobalDelta:
    """Global tasks this node must start and stop.

    Start: members neither active nor finished here, unless the whole cluster reports
    0 shares (`has_shares` False, from `cluster_has_shares`). Stop: active here and
    removed; an id without a tombstone is never stopped, so passing ordinary task ids
    in `active` is harmless. Sorted by task id, so the result is deterministic.
    """
    members = tasks.members
    start: tuple[TaskSpec, ...] = ()
    if has_shares:
        start = tuple(members[k] for k in sorted(members) if k not in active and k not in finished)
    stop = tuple(sorted(k for k in active if k in tasks.removed))
    return GlobalDelta(start, stop)


def cluster_has_shares(local: LoadReport, view: Mapping[NodeId, PeerInfo]) -> bool:
    """True when some alive node (this one included) reports shares > 0.

    Stops at the first such node, so it is O(1) in any cluster that is not draining.
    """
    if local.shares > 0:
        return True
    return any(entry.report.shares > 0 for entry in view.values())
