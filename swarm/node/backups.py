"""Speculative backups in the node (issue 24, pure): a second copy of a late task that
may run twice (`swarm submit --idempotent`), decided by its home.

The decision is policy/hedge.py's `Hedger` (the simulator's too): a run past 1.2x the
90th percentile of its class's runtimes (its array, its `--name`, or its program; 20
runs known), while some node has room, within a budget of 5 % of the task-seconds of
the work finished here.

- **The backup is a record of its own** at the same home: a fresh id, the original's
  spec with `backup_of` naming it. It is placed like any task of this home, except
  that it never goes where the original runs (nor does the original, placed again
  after a death, go where its backup is), and it is compared against every peer in
  the view rather than two: a backup is worth something only where it starts now.
- **The race** is judged here every `TICK` while a pair is open. The original ended
  first (any outcome, `swarm cancel` included): the backup is stopped ("lost the
  race"). The backup succeeded first: the original's record takes its result
  (SUCCEEDED, exit 0, "backup X finished first on N") and the original's run is
  stopped; its late report finds the record ended and changes nothing. So one result
  is recorded, the original's. A backup that failed or was cancelled leaves the
  original running (its outcome is not trusted over the original's).
- **History**: the runtimes of the succeeded runs of idempotent tasks homed here, by
  class, measured on the runner's clock (its final report says when the run started;
  the home hears of a start up to a report period late). A loser's run is not history.
- **Durability**: a backup's record is journaled when it is made; after a restart the
  open pairs are found again among the records (the race goes on). The history and
  the budget start empty again, so no new backup until `min_history` runs have ended.
  A home lost for good with a race open: whoever adopts the original and the backup
  (failover.py) holds two tasks; one that adopted both pairs them again before it would
  make a second backup, otherwise both copies run to their ends, each with its record.

Who can do what: only the task's owner marks it idempotent; a backup runs as the
same user with the same spec, so it can do nothing the original could not. A key
holder could already run any task twice (a handoff it accepts and reports twice is
deduplicated, not prevented), so backups give it nothing new.
"""

from __future__ import annotations

import random
import re
from typing import TYPE_CHECKING, Any

import attrs

from .. import model as m
from ..cluster import handoff as h
from ..policy import hedge
from ..policy.latebind import LateBinding, has_room
from ..policy.view import LoadView
from . import events as ev

S = m.TaskState
TICK = 0.25  # seconds between looks at the open pairs and the running idempotent tasks
WON = "backup {} finished first on {}: its result; this run stopped"  # the original's cause
_WON = re.compile(r"backup (\S+) finished first on ")


def won_by(t: m.Task) -> m.TaskId | None:
    """The backup whose result `t`'s record took, if any: its output (`swarm logs`,
    an Executor's result) is that backup's."""
    for step in reversed(t.history):
        if step.dst.terminal and step.src is not step.dst:
            found = _WON.match(step.cause)
            return found.group(1) if found else None
    return None


class Backups:
    """The backup rules of NodeState (state.py), which holds the fields below."""

    node: m.NodeId
    records: Any
    view: LoadView
    rng: random.Random
    due: dict[str, float]
    counters: dict[str, int]
    running: Any
    queued: Any
    ledger: Any
    jobs: dict[m.TaskId, Any]
    pending_cancel: set[m.TaskId]
    handoffs: Any
    late: LateBinding | None

    if TYPE_CHECKING:  # provided by the other parts of NodeState

        @property
        def home(self) -> h.HomeSide: ...

        def place(self, tid: m.TaskId, now: float, wall: float) -> list[ev.Instruction]: ...
        def explain(self, tid: m.TaskId, rec: dict[str, Any], wall: float) -> ev.Explain: ...
        def local_report(self, wall: float) -> m.LoadReport: ...
        def replica_update(self, tid: m.TaskId) -> list[ev.Instruction]: ...
        def cancel_remote(self, tid: m.TaskId, now: float, wall: float) -> list[ev.Instruction]: ...
        def apply(
            self, outs: Any, task_ids: Any, now: float, wall: float
        ) -> list[ev.Instruction]: ...
        def _change(
            self,
            tid: m.TaskId,
            dst: m.TaskState,
            wall: float,
            cause: str,
            durable: bool = False,
            **kw: Any,
        ) -> tuple[m.Task, ev.Record]: ...

    def init_backups(self, cfg: hedge.HedgeConfig | None) -> None:
        self.hedger = hedge.Hedger(cfg) if cfg is not None else None
        self.backups: dict[m.TaskId, m.TaskId] = {}  # original -> its backup, race open
        self.backed_up: set[m.TaskId] = set()  # originals that got their one backup
        self.hedge_watch: set[m.TaskId] = set()  # idempotent tasks homed here, active
        self.hedge_lost: set[m.TaskId] = set()  # originals whose backup won: no history
        self.hedge_scanned = False  # the records looked through once (after a restart)

    # ---------------------------------------------------------------- hooks

    def backup_watch(self, t: m.Task, now: float) -> list[ev.Instruction]:
        """A task homed here is being placed: watch it if it may get a backup."""
        if self.hedger is None or not t.spec.idempotent or t.spec.backup_of:
            return []
        if t.id in self.hedge_watch or t.spec.home != self.node:
            return []
        self.hedge_watch.add(t.id)
        return self._schedule(now)

    def hedge_ran(self, t: m.Task, seconds: float) -> None:
        """A run of a task homed here succeeded after `seconds`: its class's history
        (idempotent tasks and backups only: the classes someone asked backups for)."""
        if self.hedger is None or not (t.spec.idempotent or t.spec.backup_of):
            return
        if t.id in self.hedge_lost:
            self.hedge_lost.discard(t.id)  # stopped because its backup won: not a run
            return
        self.hedger.finished(hedge.task_class(t.spec), seconds)

    def backup_avoid(self, spec: m.TaskSpec) -> frozenset[m.NodeId]:
        """Where `spec` must not be placed: where its other copy is."""
        other = spec.backup_of or self.backups.get(spec.id)
        if not other:
            return frozenset()
        t = self.records.active.get(other)
        return frozenset({t.node}) if t is not None and t.node else frozenset()

    # ------------------------------------------------------------------ tick

    def backup_tick(self, now: float, wall: float) -> list[ev.Instruction]:
        self.due.pop("backups", None)
        if self.hedger is None:
            return []
        if not self.hedge_scanned:
            self._scan()
        out: list[ev.Instruction] = []
        for oid, bid in list(self.backups.items()):
            out += self._race(oid, bid, now, wall)
        running: list[hedge.Running] = []
        for tid in list(self.hedge_watch):
            t = self.records.active.get(tid)
            if t is None:
                self.hedge_watch.discard(tid)
                self.backed_up.discard(tid)
            elif t.state is S.RUNNING and t.started_at is not None:
                done = tid in self.backed_up
                running.append(
                    hedge.Running(tid, hedge.task_class(t.spec), t.started_at, True, done)
                )
        if any(not r.backed_up for r in running):
            for tid in self.hedger.due(wall, running, self._room(wall)):
                out += self._start_backup(tid, now, wall)
        return out + self._schedule(now)

    def _schedule(self, now: float) -> list[ev.Instruction]:
        if not (self.hedge_watch or self.backups) or "backups" in self.due:
            return []
        self.due["backups"] = now + TICK
        return [ev.WakeAt(now + TICK)]

    def _scan(self) -> None:
        """After a restart: the open pairs and the idempotent tasks homed here."""
        self.hedge_scanned = True
        for t in list(self.records.active.values()):
            if t.spec.home != self.node:
                continue
            if t.spec.backup_of:
                self.backups[t.spec.backup_of] = t.id
                self.backed_up.add(t.spec.backup_of)
            elif t.spec.idempotent:
                self.hedge_watch.add(t.id)

    def _room(self, wall: float) -> int:
        """Nodes where a backup would start at once (the view's reports, and here)."""
        n = sum(1 for node, e in self.view.items() if node != self.node and has_room(e.report))
        return n + int(has_room(self.local_report(wall)))

    # --------------------------------------------------------------- backups

    def _start_backup(self, oid: m.TaskId, now: float, wall: float) -> list[ev.Instruction]:
        assert self.hedger is not None
        o = self.records.active[oid]
        had = [t.id for t in self.records.active.values() if t.spec.backup_of == oid]
        if had:  # one made before (by a home whose role this node adopted): that one
            self.backups[oid] = had[0]
            self.backed_up.add(oid)
            self.hedger.backup_ended(oid, 0.0, won=False)  # no charge for a new one
            return []
        bid = f"t{self.rng.getrandbits(64):016x}"
        if self.records.get_cached(bid) is not None:
            return []  # never: 64 random bits
        spec = attrs.evolve(o.spec, id=bid, backup_of=oid, submitted_at=wall, after=())
        b = m.new_task(spec, wall, self.node, cause=f"backup of {oid}")
        self.records.store(b)
        self.backups[oid] = bid
        self.backed_up.add(oid)
        self.counters["backups"] += 1
        cls = hedge.task_class(o.spec)
        cut = self.hedger.threshold(cls)
        ran = wall - (o.started_at or wall)
        why = (
            f"ran {ran:.1f} s on {o.node}, past {cut:.1f} s ({self.hedger.cfg.slack:g} x the"
            f" {self.hedger.cfg.quantile:.0%} quantile of {self.hedger.history(cls)} runs of"
            f" {cls}): the first copy to finish wins, the other is stopped"
        )
        return [
            ev.Record(b, durable=True),
            self.explain(oid, {"outcome": f"backup {bid} started: {why}"}, wall),
            self.explain(bid, {"outcome": f"backup of {oid}, which {why}"}, wall),
            *self.place(bid, now, wall),
        ]

    def _race(self, oid: m.TaskId, bid: m.TaskId, now: float, wall: float) -> list[ev.Instruction]:
        """Judge one open pair: nothing yet, or its end."""
        assert self.hedger is not None
        o = self.records.get_cached(oid)
        b = self.records.get_cached(bid)
        if b is None:  # forgotten (retention): nothing to judge
            del self.backups[oid]
            self.hedger.backup_ended(oid, 0.0, won=False)
            return []
        if o is None or o.state.terminal:
            del self.backups[oid]
            self.hedger.backup_ended(oid, _ran(b, wall), won=False)
            if b.state.terminal:
                return []
            ended = o.state.value if o is not None else "gone"
            self.counters["backups_lost"] += 1
            why = f"lost the race: {oid} ended first ({ended})"
            return [
                self.explain(bid, {"outcome": why}, wall),
                *self._stop_backup(b, why, now, wall),
            ]
        if not b.state.terminal:
            return []
        del self.backups[oid]
        self.hedger.backup_ended(oid, _ran(b, wall), won=b.state is S.SUCCEEDED)
        if b.state is not S.SUCCEEDED:
            rec = {"outcome": f"backup {bid} ended {b.state.value} ({b.reason}): this run goes on"}
            return [self.explain(oid, rec, wall)]
        self.counters["backups_won"] += 1
        return self._backup_won(o, b, now, wall)

    def _stop_backup(self, b: m.Task, why: str, now: float, wall: float) -> list[ev.Instruction]:
        """Stop the losing backup wherever it is (its record ends cancelled)."""
        if b.id in self.running:
            return [ev.StopRun(b.id, why)]
        e = self.home.entries.get(b.id)
        if e is not None and e.phase is not h.HomePhase.LOCAL:
            return self.cancel_remote(b.id, now, wall)  # offered, queued or running elsewhere
        out = self._unqueue(b.id)
        return [*out, self._change(b.id, S.CANCELLED, wall, why, durable=True)[1]]

    def _backup_won(self, o: m.Task, b: m.Task, now: float, wall: float) -> list[ev.Instruction]:
        """The backup succeeded first: the original's record takes its result, and the
        original's run (or its place in a queue, or its offer) is stopped."""
        e = self.home.entries.get(o.id)
        phase = e.phase if e is not None else h.HomePhase.LOCAL
        local_run = o.id in self.running
        out: list[ev.Instruction] = []
        if not local_run and phase is h.HomePhase.LOCAL:
            out += self._unqueue(o.id)
        if o.state not in (S.RUNNING, S.MIGRATING):  # waiting to run again: ran as b
            out.append(self._change(o.id, S.RUNNING, wall, f"ran as backup {b.id}", node=b.node)[1])
        cause = WON.format(b.id, b.node)
        _, rec = self._change(
            o.id, S.SUCCEEDED, wall, cause, durable=True, node=b.node, exit_code=0
        )
        out += [rec, self.explain(o.id, {"outcome": cause}, wall), *self.replica_update(o.id)]
        self.hedge_lost.add(o.id)
        self.hedge_watch.discard(o.id)
        self.backed_up.discard(o.id)
        stop = f"its backup {b.id} finished first"
        if local_run:
            out.append(ev.StopRun(o.id, stop))
        elif phase is h.HomePhase.OFFERING:
            self.pending_cancel.add(o.id)  # location.py cancels it once committed
        elif phase is h.HomePhase.REMOTE:
            out += self.apply(self.home.cancel(o.id, now), [o.id], now, wall)
        return out

    def _unqueue(self, tid: m.TaskId) -> list[ev.Instruction]:
        """Take a task out of this node's queue (and its placement, and late binding)."""
        self.jobs.pop(tid, None)
        out: list[ev.Instruction] = [ev.Dequeue(tid), ev.LoadChanged()]
        if tid in self.ledger:
            self.ledger.remove(tid)
        if self.late is not None:
            cancels = self.late.forget(tid)
            if cancels:
                out.append(ev.SendLate(tuple(cancels)))
        return out


def _ran(t: m.Task, wall: float) -> float:
    """Seconds a copy has run (0 if it never started)."""
    if t.started_at is None:
        return 0.0
    return max(0.0, (t.finished_at or wall) - t.started_at)
