"""A node's holds for gangs (issue 22, pure): grant, start, renew, lapse, abort.

Every node keeps one `HoldBook`. For each gang it has at most one round's share: a
*hold* (resources kept for the members, until `hold_ttl` after the latest prepare of
the round), then the *running* members (under a run lease that the gang's home
renews), then an *ended* record kept a little while so the home can read the exit
codes. With `max_waiting` > 0 a share may first be *waiting*: first in line for room.

Rules (see gang.py for the whole protocol):

- Prepares are answered in arrival order and never wait: granted when the members fit
  (`room`, from the caller's ledger, which counts the holds) and fewer than
  `max_holds` holds are uncommitted here; refused otherwise, or (`max_waiting`, off
  by default) answered `queued`, the gang first in line and other gangs refused
  until a later prepare of its round finds the room.
- A round older than the newest one seen for the gang, or one the home aborted, is
  refused (prepare) or answered `gone` (commit, renewal): late duplicates create
  nothing. A newer round's prepare ends whatever an older round left here.
- Every stimulus first lapses what is due: no hold outlives its `hold_ttl`, no member
  runs past its run lease (`WakeAt` names the next deadline, so the driver is called
  at it). The agent's supervisor enforces the same deadline on the process itself.
"""

from __future__ import annotations

import enum

import attrs

from ..model import NodeId
from . import gang as g

MAX_TTL = 3600.0
KEEP_ENDED = 60.0  # seconds an ended round's exit codes stay readable
KEEP_FLOOR = 600.0  # seconds a gang's newest round is remembered without anything held


class Phase(enum.Enum):
    WAITING = "waiting"  # queued for room: holds nothing, keeps other gangs' prepares out
    HELD = "held"
    RUNNING = "running"
    ENDED = "ended"


@attrs.define
class Entry:
    """One gang's round at this node."""

    gang: str
    round: int
    home: NodeId
    slots: tuple[int, ...]
    phase: Phase
    deadline: float  # HELD: the hold lapses; RUNNING: the run lease lapses; ENDED: forgotten
    port: int = 0
    ranks: dict[int, int] = attrs.field(factory=dict)
    running: set[int] = attrs.field(factory=set)
    exited: dict[int, int] = attrs.field(factory=dict)
    seq: int = 0  # the newest renewal applied
    prep_seq: int = 0  # the newest prepare applied


class HoldBook:
    """The holds and running gang members of one node."""

    def __init__(
        self, node: NodeId, max_holds: int = g.DEFAULT_MAX_HOLDS, max_waiting: int = 0
    ) -> None:
        self.node = node
        self.max_holds = max_holds
        self.max_waiting = max_waiting  # gangs queued for room here (0: refuse at once)
        self.entries: dict[str, Entry] = {}
        self.floor: dict[str, tuple[int, float]] = {}  # gang -> (lowest round accepted, when)
        self.refused = 0
        self.granted = 0
        self.lapsed_holds = 0
        self.lapsed_runs = 0
        self.prune_at = 0.0  # the next look for forgotten floors (not on every stimulus)

    # ------------------------------------------------------------------ reads

    def held_slots(self) -> int:
        """Members held but not started: what the ledger must keep free."""
        return sum(len(e.slots) for e in self.entries.values() if e.phase is Phase.HELD)

    def running_slots(self) -> int:
        return sum(len(e.running) for e in self.entries.values() if e.phase is Phase.RUNNING)

    def holds(self) -> int:
        return sum(1 for e in self.entries.values() if e.phase is Phase.HELD)

    def next_deadline(self) -> float | None:
        live = [e.deadline for e in self.entries.values()]
        return min(live) if live else None

    # ------------------------------------------------------------------ stimuli

    def on_message(
        self, now: float, src: NodeId, msg: g.ToNode, room: int = 0, port: int = 0
    ) -> list[g.Instruction]:
        """A message from a gang's home. `room`: how many more members of this gang the
        node could take now, holds counted (read only for a prepare); `port`: one the
        caller reserved for a rendezvous, given with a grant."""
        out = self._lapse(now)
        if isinstance(msg, g.Prepare):
            out += self._prepare(now, src, msg, room, port)
        elif isinstance(msg, g.Commit):
            out += self._commit(now, src, msg)
        elif isinstance(msg, g.Renew):
            out += self._renew(now, src, msg)
        elif isinstance(msg, g.Abort):
            out += self._abort(now, src, msg)
        return self._woken(out)

    def on_member_exit(
        self, now: float, gang: str, round: int, slot: int, code: int
    ) -> list[g.Instruction]:
        """A member's process ended: tell the home at once (it also reads it on renewal)."""
        out = self._lapse(now)
        e = self.entries.get(gang)
        if e is None or e.round != round or e.phase is not Phase.RUNNING or slot not in e.running:
            return self._woken(out)
        e.running.discard(slot)
        e.exited[slot] = code
        if not e.running:
            e.phase = Phase.ENDED
            e.deadline = now + KEEP_ENDED
        out.append(g.Send(e.home, self._alive(e)))
        return self._woken(out)

    def tick(self, now: float) -> list[g.Instruction]:
        return self._woken(self._lapse(now))

    # ------------------------------------------------------------------ handlers

    def _prepare(
        self, now: float, src: NodeId, msg: g.Prepare, room: int, port: int
    ) -> list[g.Instruction]:
        floor, _ = self.floor.get(msg.gang, (0, now))
        if msg.round < floor:
            return [g.Send(src, g.Refused(msg.gang, msg.round, "stale round"))]
        out: list[g.Instruction] = []
        ttl = _ttl(msg.hold_ttl)
        e = self.entries.get(msg.gang)
        if e is not None and e.round == msg.round:
            fresh = msg.seq > e.prep_seq  # a later prepare; an older copy changes nothing
            if fresh:
                e.prep_seq = msg.seq
            if e.phase is Phase.HELD:
                if fresh:
                    e.deadline = max(e.deadline, now + ttl)
                return [g.Send(src, g.Granted(msg.gang, msg.round, e.port, e.prep_seq))]
            if e.phase is Phase.WAITING and fresh:
                e.deadline = now + ttl  # the home still asks: still first in line
                return self._admit(now, src, e, room, ttl)
            return []
        if e is not None:  # an older round: the home has moved on
            out += self._drop(e, "a newer round of the gang")
        self.floor[msg.gang] = (msg.round, now)
        first = next((w.gang for w in self.entries.values() if w.phase is Phase.WAITING), None)
        if first is not None:
            self.refused += 1
            reason = f"gang {first} is waiting here for room"
            return [*out, g.Send(src, g.Refused(msg.gang, msg.round, reason))]
        slots = tuple(sorted(set(msg.slots)))
        e = Entry(msg.gang, msg.round, src, slots, Phase.WAITING, now + ttl, port, prep_seq=msg.seq)
        if self.holds() < self.max_holds and room >= len(slots):
            self.entries[msg.gang] = e
            return [*out, *self._admit(now, src, e, room, ttl)]
        if self.max_waiting > 0 and room < len(slots):
            self.entries[msg.gang] = e  # first in line (one waiting gang at most)
            reason = f"room for {room} of {len(slots)}; first in line"
            return [*out, g.Send(src, g.Queued(msg.gang, msg.round, msg.seq, reason))]
        self.refused += 1
        if self.holds() >= self.max_holds:
            reason = f"{self.max_holds} holds here already"
        else:
            reason = f"room for {room} of {len(slots)}"
        return [*out, g.Send(src, g.Refused(msg.gang, msg.round, reason))]

    def _admit(
        self, now: float, src: NodeId, e: Entry, room: int, ttl: float
    ) -> list[g.Instruction]:
        """A waiting (or new) entry becomes a hold if the room is there now."""
        if self.holds() >= self.max_holds or room < len(e.slots):
            reason = f"room for {room} of {len(e.slots)}; first in line"
            return [g.Send(src, g.Queued(e.gang, e.round, e.prep_seq, reason))]
        e.phase = Phase.HELD
        e.deadline = now + ttl
        self.granted += 1
        return [
            g.HoldChanged(e.gang, e.round),
            g.Send(src, g.Granted(e.gang, e.round, e.port, e.prep_seq)),
        ]

    def _commit(self, now: float, src: NodeId, msg: g.Commit) -> list[g.Instruction]:
        e = self.entries.get(msg.gang)
        waiting = e is not None and e.phase is Phase.WAITING
        if e is None or e.round != msg.round or e.home != src or waiting:
            return [g.Send(src, g.Gone(msg.gang, msg.round, "no hold for this round"))]
        if e.phase is not Phase.HELD:  # a duplicate: answer again, change nothing
            return [g.Send(src, g.Started(msg.gang, msg.round, tuple(sorted(e.ranks))))]
        ranks = {s: r for s, r in msg.ranks.items() if s in e.slots}
        if not ranks:
            out = self._drop(e, "committed none of its slots")
            return [*out, g.Send(src, g.Gone(msg.gang, msg.round, "no held slot committed"))]
        e.phase = Phase.RUNNING
        e.ranks = ranks
        e.running = set(ranks)
        e.slots = tuple(sorted(ranks))
        e.deadline = now + _ttl(msg.run_ttl)
        return [
            g.HoldChanged(msg.gang, msg.round),
            g.StartMembers(msg.gang, msg.round, dict(ranks), msg.world, msg.master, msg.port),
            g.Send(src, g.Started(msg.gang, msg.round, e.slots)),
        ]

    def _renew(self, now: float, src: NodeId, msg: g.Renew) -> list[g.Instruction]:
        e = self.entries.get(msg.gang)
        held = e is not None and e.phase in (Phase.HELD, Phase.WAITING)
        if e is None or e.round != msg.round or e.home != src or held:
            return [g.Send(src, g.Gone(msg.gang, msg.round, "nothing of this round runs here"))]
        if e.phase is Phase.RUNNING and msg.seq > e.seq:
            e.seq = msg.seq
            e.deadline = max(e.deadline, now + _ttl(msg.run_ttl))
        return [g.Send(src, self._alive(e))]

    def _abort(self, now: float, src: NodeId, msg: g.Abort) -> list[g.Instruction]:
        self._raise_floor(msg.gang, msg.round + 1, now)
        out: list[g.Instruction] = []
        e = self.entries.get(msg.gang)
        if e is not None and e.round <= msg.round:
            out += self._drop(e, f"aborted: {msg.reason}" if msg.reason else "aborted")
        return [*out, g.Send(src, g.Aborted(msg.gang, msg.round))]

    # ------------------------------------------------------------------ helpers

    def _alive(self, e: Entry) -> g.Alive:
        return g.Alive(e.gang, e.round, tuple(sorted(e.running)), dict(e.exited))

    def _drop(self, e: Entry, reason: str) -> list[g.Instruction]:
        del self.entries[e.gang]
        out: list[g.Instruction] = [g.HoldChanged(e.gang, e.round)]
        if e.phase is Phase.RUNNING and e.running:
            out.append(g.StopMembers(e.gang, e.round, tuple(sorted(e.running)), reason))
        return out

    def _lapse(self, now: float) -> list[g.Instruction]:
        out: list[g.Instruction] = []
        for e in [e for e in self.entries.values() if e.deadline <= now]:
            if e.phase is Phase.HELD:
                self.lapsed_holds += 1
            elif e.phase is Phase.RUNNING:
                self.lapsed_runs += 1
                self._raise_floor(e.gang, e.round + 1, now)
            out += self._drop(e, "its run lease lapsed (the gang's home stopped renewing)")
        if now >= self.prune_at:
            self.prune_at = now + KEEP_FLOOR / 10
            for gang, (_, when) in list(self.floor.items()):
                if gang not in self.entries and now - when > KEEP_FLOOR:
                    del self.floor[gang]
        return out

    def _raise_floor(self, gang: str, lowest: int, now: float) -> None:
        """Rounds below `lowest` of `gang` are refused from now on."""
        floor, _ = self.floor.get(gang, (0, now))
        self.floor[gang] = (max(floor, lowest), now)

    def _woken(self, out: list[g.Instruction]) -> list[g.Instruction]:
        nxt = self.next_deadline()
        if nxt is not None:
            out.append(g.WakeAt(nxt))
        return out


def _ttl(seconds: float) -> float:
    """A ttl from a peer, bounded: never negative, never past MAX_TTL."""
    return min(max(seconds, 0.0), MAX_TTL)
