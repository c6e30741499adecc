"""A home back from a long absence waits before it places its own tasks (pure; stop 47).

While a home is down for longer than its grace, the peers holding its tasks take them
over (failover.py): a copy's holder queues and runs a task that was queued at the home,
the runner of a task runs on as its new home. Each tells the old home so (a notice)
once it sees it alive again, and the old home lets go (`_yield`). Before this module,
a home that restarted placed its queued tasks at once, from its journal, before it had
even rejoined: it ran a task that its replica had adopted and run already (the
restart's notices stopped the second run only when they came first; at-least-once).

So a home that restarts after an absence of `grace` or more (by its own clock: the
last `alive_at` it journaled, every ALIVE_EVERY seconds while it has an active task,
against now) is in doubt about
each of its tasks that someone could have taken over, those the succession core holds
as ours (copies elsewhere, or held elsewhere): it places none of them for
max(grace, DOUBT_MIN) seconds, or until a notice makes it let the task go. The others,
and every task after a short absence, are placed at once: nobody adopts a task whose
home was down for less than the grace (adoption needs a SWIM death, then the grace).
A home with no `alive_at` (its first start, or a journal from before this module) is
taken to have been down long.

What it does not cover: a home that was cut off, not down (its heartbeat went on), and
whose tasks were adopted meanwhile: it learns of its death or of the adoption by gossip
and lets go then (at-least-once, as documented in cluster/succession.py). A key holder
can do nothing new here; a local user can only see the wait (`swarm explain`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .. import model as m
from ..cluster import handoff as h
from ..cluster.succession import Succession
from . import events as ev
from .records import TaskRecords
from .recovery import ALIVE_AT

ALIVE_EVERY = 5.0  # seconds between the journal's `alive_at` heartbeats
DOUBT_MIN = 10.0  # seconds a home in doubt waits at least (its peers' notices to come)

S = m.TaskState


def alive_at_of(kv: Mapping[str, Any]) -> float | None:
    """The journal's last heartbeat (None: none, or not a number)."""
    v = kv.get(ALIVE_AT)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class RestartDoubt:
    """The restart-doubt part of NodeState (state.py), which holds the fields below."""

    node: m.NodeId
    records: TaskRecords
    succession: Succession
    counters: dict[str, int]
    alive_written: float  # wall time of the last `alive_at` heartbeat journaled
    doubt_until: float  # trio time the restart's doubt ends (0: none)
    doubted: set[m.TaskId]  # our tasks someone may have taken over while we were down
    deferred: set[m.TaskId]  # ... whose placement waits for the doubt to end
    copies_owed: set[m.TaskId]  # replicas.py: tasks whose copies the next tick looks at

    if TYPE_CHECKING:  # failover.py, state.py

        def _sync_succession(self, only: Iterable[m.TaskId] | None = None) -> None: ...
        def explain(self, tid: m.TaskId, rec: dict[str, object], wall: float) -> ev.Explain: ...
        def enqueue_local(
            self, task: m.Task, now: float, front: bool = False
        ) -> list[ev.Instruction]: ...

    def restarted_after(
        self, now: float, wall: float, alive_at: float | None
    ) -> list[ev.Instruction]:
        """The agent restarted (its records restored): in doubt about the tasks of ours
        that could have been taken over, if it was down for the grace or more."""
        grace = self.succession.grace
        down = None if alive_at is None else max(0.0, wall - alive_at)
        beat: list[ev.Instruction] = [ev.Persist((ev.Put(ALIVE_AT, wall),))]
        self.alive_written = wall
        if down is not None and down < grace:
            return beat
        self._sync_succession()
        me = self.node
        self.doubted = {t for t, r in self.succession.records().items() if r.home == me}
        if not self.doubted:
            return beat
        # no heartbeat until the doubt is over: a restart during it is in doubt again
        # (stop 53: a second restart soon after the first read the first's heartbeat,
        # a short absence, and sent the old home's copies over an adopter's)
        self.alive_written = -ALIVE_EVERY
        out: list[ev.Instruction] = []
        wait = max(grace, DOUBT_MIN)
        self.doubt_until = now + wait
        self.counters["restart_doubted"] = self.counters.get("restart_doubted", 0) + len(
            self.doubted
        )
        gone = "unknown" if down is None else f"{down:.0f}s"
        out.append(
            ev.log(
                "warning",
                "failover.restart_doubt",
                tasks=len(self.doubted),
                down=gone,
                wait=round(wait, 1),
            )
        )
        return [*out, ev.WakeAt(self.doubt_until)]

    def in_doubt_here(self, tid: m.TaskId, now: float) -> bool:
        """Must this placement of our task wait (restart doubt; the task still ours)?"""
        if tid not in self.doubted:
            return False
        if now >= self.doubt_until or not self.succession.is_authority(tid):
            self.doubted.discard(tid)
            self.copies_owed.add(tid)  # their news waited (replicas.py)
            return False
        return True

    def back_home(self, t: m.Task, now: float, wall: float) -> list[ev.Instruction]:
        """Our task came back home by a move (location.py): into the run queue, or, in
        doubt, its placement waits for the doubt's end as a queued task's does. The
        move may have been on its way when this home died, and the runner that asked
        may have adopted the task since: before stop 53 it ran at once, twice (the
        copies stateful walks)."""
        if self.in_doubt_here(t.id, now):
            return self.defer_in_doubt(t.id, wall)
        return self.enqueue_local(t, now)

    def move_refused(
        self, r: h.MoveRequest, now: float, wall: float
    ) -> tuple[h.Reply, list[ev.Instruction]] | None:
        """A move of our task on to another node is refused while we are in doubt about
        it: the refusal, and a line in its `swarm explain` here (before stop 54 only
        the runner's log said so). The runner that asked may have adopted it since (the
        request was on its way while we were down): before stop 53 the move went
        through, and the task ran at its adopter and at the move's target (the copies
        walks). Back home is taken, and waits (`back_home`)."""
        if r.target == self.node or not self.in_doubt_here(r.task_id, now):
            return None
        why = "its home restarted after its grace and is in doubt about it: it stays"
        note: dict[str, object] = {"outcome": f"move to {r.target} refused: {why}"}
        return h.Reply(r.task_id, r.epoch, False, reason=why), [self.explain(r.task_id, note, wall)]

    def defer_in_doubt(self, tid: m.TaskId, wall: float) -> list[ev.Instruction]:
        """Placing `tid` waits for the doubt's end (failover ticks place it then)."""
        if tid in self.deferred:
            return []
        self.deferred.add(tid)
        why = (
            "placement waits: this node restarted after its grace, and a peer may have "
            "taken the task over (a notice would say so)"
        )
        return [self.explain(tid, {"outcome": why}, wall)]

    def doubt_tick(self, now: float, wall: float) -> list[ev.Instruction]:
        """At each failover tick: the heartbeat, and the placements the doubt held back
        once it is over (or the task let go: then nothing)."""
        out: list[ev.Instruction] = []
        # only while some task is active here: with none there is nothing a restart
        # could doubt, and an idle agent writes nothing (its disk may sleep). A crash
        # just after the first task came, before the next tick, reads the old beat:
        # a long absence, so the restart waits (the safe side)
        stale = wall >= self.alive_written + ALIVE_EVERY or wall < self.alive_written
        if stale and self.records.active and now >= self.doubt_until:
            self.alive_written = wall
            out.append(ev.Persist((ev.Put(ALIVE_AT, wall),)))
        if self.deferred:
            ready = {t for t in self.deferred if not self.in_doubt_here(t, now)}
            self.deferred -= ready
            out += [ev.Place(t) for t in sorted(ready) if self._ours_queued(t)]
        if now >= self.doubt_until and self.doubted:
            self.copies_owed |= self.doubted  # their copies' news waited (replicas.py)
            self.doubted.clear()
        return out

    def _ours_queued(self, tid: m.TaskId) -> bool:
        """Queued here, and still ours: no succession record says another node holds
        its home role. A task with no record at all is ours too: nothing elsewhere
        could take it over (back home, no copies). Before stop 52 such a task stayed
        queued for ever: its runner died during the doubt (it came back home, with
        no copies at --replicas 1 or on two nodes), the failover tick released its
        record, and the doubt's end then dropped its placement (found by the stateful
        test's restarts)."""
        t = self.records.active.get(tid)
        if t is None or t.state is not S.QUEUED or t.spec.home != self.node:
            return False
        rec = self.succession.record(tid)
        return rec is None or rec.home == self.node
