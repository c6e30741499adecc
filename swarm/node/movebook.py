"""The books of a node's migrations (pure): moves in flight to and from here, tasks
that arrived by migration (journaled), copies of state kept for moved tasks, their
expiry, the migration records, and the target's answers to a source.

The phases, values and instructions are in moves.py; the source's decisions in
departures.py; the mechanics (signals, CRIU, the state stream, files) in runtime/."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from .. import model as m
from .. import wire
from ..cluster import migrate as mx
from ..policy import migration as pol
from . import events as ev
from .departures import Departures
from .moves import (
    ARRIVAL_KEY,
    MM,
    Arrival,
    Incoming,
    MoveInstruction,
    MoveSettings,
    Outgoing,
    PutBack,
    RemoveState,
    SendRecord,
    StoreRecord,
    TellSource,
)

RECORD_CACHE = 10_000  # tasks whose recent record parts are kept in memory
PREPARED_GRACE = 60.0  # a prepared (not staged) move expires checkpoint_timeout + this


class Moves(Departures):
    """Both ends' bookkeeping of migrations on one node.

    `located_here(task id)`: does the task live here (running, queued, held as a
    guest, or its record says this node)? The runtime answers from the node's state.
    `token`: a random part of this agent run's migration ids.
    """

    def __init__(
        self,
        node: m.NodeId,
        settings: MoveSettings,
        *,
        located_here: Callable[[m.TaskId], bool],
        token: str,
    ) -> None:
        self.node = node
        self.s = settings
        self.located_here = located_here
        self.token = token
        self.bandwidth = pol.BandwidthEstimator()
        self.pauses = pol.DurationEstimator()
        self.bucket = settings.policy.new_bucket()
        self.outgoing: dict[m.TaskId, Outgoing] = {}
        self.incoming: dict[m.TaskId, Incoming] = {}
        self.arrivals: dict[m.TaskId, Arrival] = {}
        self.started: dict[m.TaskId, float] = {}  # trio time the current run began here
        self.last: dict[m.TaskId, tuple[str, str | None]] = {}
        # record parts written by this process, until the journal surely has them
        self.recent: OrderedDict[m.TaskId, list[dict[str, Any]]] = OrderedDict()
        # moved away, state kept until the target started it: task -> (mid, since)
        self.retained: dict[m.TaskId, tuple[str, float]] = {}
        self.counters: Counter[str] = Counter()
        self.seq = 0

    def restore(self, kv: Mapping[str, Any]) -> list[MoveInstruction]:
        """The journaled arrivals; a malformed one is logged and skipped."""
        out: list[MoveInstruction] = []
        for key, value in kv.items():
            if not key.startswith(ARRIVAL_KEY):
                continue
            try:
                self.arrivals[key[len(ARRIVAL_KEY) :]] = Arrival.from_wire(value)
            except wire.WireError as e:
                out.append(_log("error", "migration.bad_state", key=key, error=str(e)))
        return out

    def _persist_arrival(self, tid: m.TaskId) -> ev.Persist:
        a = self.arrivals.get(tid)
        if a is None:
            return ev.Persist((ev.Delete(ARRIVAL_KEY + tid),))
        return ev.Persist((ev.Put(ARRIVAL_KEY + tid, a.to_wire()),))

    def here(self, tid: m.TaskId) -> bool:
        """Does the task live here, or is its state being received or staged here?"""
        return tid in self.incoming or self.located_here(tid)

    def busy(self, tid: m.TaskId) -> bool:
        """Must retention keep this task's record (a move of it is in the books)?"""
        return (
            tid in self.outgoing
            or tid in self.incoming
            or tid in self.retained
            or tid in self.arrivals
        )

    def new_mid(self) -> str:
        self.seq += 1
        return f"{self.node}:{self.token}:{self.seq}"

    # ------------------------------------------------------------- runner events

    def on_started(self, task: m.Task, now: float, wall: float) -> list[MoveInstruction]:
        """A run began here; a task that arrived by migration has resumed."""
        tid = task.id
        self.started[tid] = now
        self.incoming.pop(tid, None)
        arr = self.arrivals.get(tid)
        if arr is None or arr.resumed:
            return []
        pause = max(0.0, wall - arr.stopped_at)
        self.arrivals[tid] = attrs.evolve(arr, resumed=True)
        self.counters["resumed"] += 1
        out: list[MoveInstruction] = [
            self._persist_arrival(tid),
            _log("info", "migration.resumed", task=tid, source=arr.source, pause=round(pause, 3)),
        ]
        if arr.source != self.node:
            out.append(TellSource(arr.source, tid, arr.mid))
        fields = {"resumed_on": self.node, "resumed_at": wall, "pause_s": round(pause, 4)}
        out.append(self.record(task.spec, arr.mid, fields, wall))
        return out

    def on_stopped(self, task: m.Task) -> list[MoveInstruction]:
        """The runner recorded RUNNING -> MIGRATING. Without a migration in flight (the
        task checkpointed on its own, or a timeout passed) it restarts here."""
        if task.id in self.outgoing:
            return []
        return [PutBack(task.id, "checkpointed with no move in flight: restarts here")]

    def forget(self, tid: m.TaskId) -> list[MoveInstruction]:
        self.started.pop(tid, None)
        self.last.pop(tid, None)
        if self.arrivals.pop(tid, None) is not None:
            return [self._persist_arrival(tid)]
        return []

    def on_left(self, tid: m.TaskId) -> list[MoveInstruction]:
        """The task no longer lives here (moved, revoked, dropped): its state goes too,
        except while a migration of it from here is in flight or kept (retained)."""
        out = self.forget(tid)
        if self.here(tid) or tid in self.outgoing or tid in self.retained:
            return out
        return [*out, RemoveState(tid)]

    def release(self, tid: m.TaskId) -> list[MoveInstruction]:
        """The kept copy of a moved task's state is no longer needed."""
        self.retained.pop(tid, None)
        if not self.here(tid) and tid not in self.outgoing:
            return [RemoveState(tid)]
        return []

    def drop_staged(self, tid: m.TaskId) -> list[MoveInstruction]:
        out: list[MoveInstruction] = []
        if self.arrivals.pop(tid, None) is not None:
            out.append(self._persist_arrival(tid))
        return [*out, RemoveState(tid)]

    def expire(self, now: float) -> list[MoveInstruction]:
        """Prepared or staged migrations whose task never came: forget, delete the state.
        Copies kept for moved tasks: deleted after the same time as staged ones."""
        out: list[MoveInstruction] = []
        for tid, (_mid, since) in list(self.retained.items()):
            if now - since > self.s.staged_ttl:
                out += self.release(tid)
        for tid, inc in list(self.incoming.items()):
            ttl = self.s.staged_ttl if inc.staged else self.s.checkpoint_timeout + PREPARED_GRACE
            if now - inc.since <= ttl:
                continue
            del self.incoming[tid]
            if not self.here(tid):
                out += self.drop_staged(tid)
        return out

    def restore_image(self, tid: m.TaskId) -> tuple[Arrival | None, list[MoveInstruction]]:
        """A task that arrived with a CRIU image starts by restoring it, once: the
        arrival to restore from (now marked used), or None."""
        arr = self.arrivals.get(tid)
        if arr is None or arr.mode is not MM.CRIU or arr.restore_used:
            return None, []
        self.arrivals[tid] = attrs.evolve(arr, restore_used=True)
        return arr, [self._persist_arrival(tid)]

    # ------------------------------------------------------------- records

    def record(
        self, spec: m.TaskSpec, mid: str, fields: dict[str, Any], wall: float
    ) -> StoreRecord | SendRecord:
        """Part of a migration's record: stored at the task's home (merged by mid)."""
        rec = {"mid": mid, **fields}
        if spec.home in ("", self.node):
            return self.store_record(spec.id, rec, wall)
        return SendRecord(spec.home, spec.id, rec)

    def store_record(self, tid: m.TaskId, rec: dict[str, Any], wall: float) -> StoreRecord:
        self.recent.setdefault(tid, []).append(rec)
        self.recent.move_to_end(tid)
        while len(self.recent) > RECORD_CACHE:
            self.recent.popitem(last=False)
        return StoreRecord(tid, rec, wall)

    def records(self, tid: m.TaskId, journaled: Iterable[Any]) -> list[dict[str, Any]]:
        """The task's migrations (oldest first): the journal's parts and those written
        since (a write may not have landed yet). The source's and the target's parts
        set different fields, so the merge order is free."""
        return mx.merge_records([*journaled, *self.recent.get(tid, [])])

    # ------------------------------------------------------------- receiving (target)

    def prepare(
        self,
        p: mx.Prepare,
        sender: m.NodeId,
        now: float,
        *,
        admission_refusal: Callable[[m.TaskSpec], str | None],
        local_report: Callable[[], m.LoadReport],
    ) -> tuple[dict[str, Any], list[MoveInstruction]]:
        """The source asks whether it may send this task: the reply and log lines."""
        tid = p.spec.id

        def refuse(why: str) -> tuple[dict[str, Any], list[MoveInstruction]]:
            self.counters["prepare_refused"] += 1
            log = _log("info", "migration.refused", task=tid, source=sender, reason=why)
            return {"ok": False, "reason": why}, [log]

        if self.s.mode == "off":
            return refuse(f"migration is off on {self.node}")
        inc = self.incoming.get(tid)
        if inc is not None:
            if inc.mid == p.mid and inc.source == sender:
                return {"ok": True}, []  # a retry of the same question
            return refuse("another migration of this task is in flight here")
        if tid in self.outgoing or self.here(tid):
            return refuse("the task is already here")
        why = admission_refusal(p.spec)
        if why is not None:
            return refuse(why)
        task = attrs.evolve(p.task, gpu=p.spec.gpu)
        why = pol.recheck_at_target(
            task,
            p.source,
            local_report(),
            config=self.s.policy,
            bandwidth=p.bandwidth,
            incoming=len(self.incoming) + len(self.outgoing),
        )
        if why is not None:
            return refuse(why)
        self.incoming[tid] = Incoming(p.mid, sender, p.spec, now)
        return {"ok": True}, [
            _log("info", "migration.prepared", task=tid, source=sender, mid=p.mid)
        ]

    def prepared(self, b: mx.Begin, sender: m.NodeId) -> Incoming | None:
        """The move a state stream belongs to (None: none was prepared here)."""
        inc = self.incoming.get(b.task_id)
        if inc is None or inc.mid != b.mid or inc.source != sender:
            return None
        return inc

    def staged(
        self, inc: Incoming, b: mx.Begin, sender: m.NodeId, nbytes: int, now: float, wall: float
    ) -> list[MoveInstruction]:
        """The state is verified and installed here: the task may come."""
        inc.staged = True
        inc.since = now
        self.arrivals[b.task_id] = Arrival(
            mid=b.mid,
            source=sender,
            mode=b.mode,
            moves=b.moves,
            age=b.age,
            stopped_at=b.stopped_at,
            arrived_at=wall,
            files=dict(b.files),
        )
        self.counters["bytes_received"] += nbytes
        return [self._persist_arrival(b.task_id)]

    def abort(self, tid: m.TaskId, mid: str, sender: m.NodeId) -> list[MoveInstruction]:
        """The source gave up on a move it prepared here."""
        inc = self.incoming.get(tid)
        if inc is None or inc.mid != mid or inc.source != sender:
            return []
        del self.incoming[tid]
        return [] if self.here(tid) else self.drop_staged(tid)

    def started_there(self, tid: m.TaskId, mid: str) -> list[MoveInstruction]:
        """The target says the moved task started: the kept copy may go."""
        kept = self.retained.get(tid)
        if kept is not None and kept[0] == mid:
            return self.release(tid)
        return []


def _log(level: str, event: str, **fields: Any) -> ev.Log:
    return ev.log(level, event, **fields)
