"""A fake network for the gang protocol (issue 22): the coordinators and hold books
of gang.py on simulated nodes, messages that are delayed, lost, duplicated and
reordered, and nodes that die; with the protocol's invariants checked as it runs.

The unit tests drive it over random seeds; `swarm sim gang` runs traces through it.
Everything is deterministic for a seed: one `random.Random` draws every delay, loss
and placement, and events at the same time run in the order they were scheduled.

Placement is what the agent does for a single task, per member: two random nodes,
the one with more free room in the (possibly stale) view, re-checked at the target
by the prepare. Each member takes one slot; a node holds `capacity` slots.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from typing import Any

import attrs

from ..cluster import gang as g
from ..cluster.gangcoord import Coordinator
from ..cluster.gangholds import HoldBook
from ..model import NodeId

SAME_INSTANT = 10_000  # events at one instant: more means a loop that never moves on


class InvariantBroken(AssertionError):
    pass


@attrs.frozen
class NetConfig:
    delay_lo: float = 0.0005
    delay_hi: float = 0.003
    loss: float = 0.0
    dup: float = 0.0
    detect: float = 1.0  # seconds from a death to every node knowing it
    view_every: float = 0.0  # placement's view of free room refreshed this often (0: fresh)
    poke: bool = False  # a refreshed view with room pokes the gangs waiting for room


@attrs.define
class Member:
    gang: str
    round: int
    node: NodeId
    slot: int
    start: float
    end: float | None = None
    code: int | None = None  # None: stopped (killed), else its exit code


@attrs.define
class GangRun:
    """What the network knows of one submitted gang (for invariants and reports)."""

    spec: g.GangSpec
    home: NodeId
    submitted: float
    duration: Callable[[int], float]  # slot -> how long its member runs
    code: Callable[[int, int], int]  # (round, slot) -> its exit code
    coord: Coordinator | None = None
    first_running: float | None = None
    ended: g.GangEnded | None = None
    ended_at: float | None = None
    running: dict[tuple[NodeId, int], Member] = attrs.field(factory=dict)
    partial_since: float | None = None
    longest_partial: float = 0.0
    rounds: int = 0


class GangNet:
    """Nodes, gangs and a message queue in simulated time."""

    def __init__(
        self,
        capacity: dict[NodeId, int],
        rng: random.Random,
        timers: g.Timers = g.Timers(),
        net: NetConfig = NetConfig(),
        max_holds: int = g.DEFAULT_MAX_HOLDS,
        check: bool = True,
        max_waiting: int = 0,
    ) -> None:
        self.capacity = dict(capacity)
        self.rng = rng
        self.timers = timers
        self.net = net
        self.check = check
        self.now = 0.0
        self.alive = set(capacity)
        self.books = {n: HoldBook(n, max_holds, max_waiting) for n in capacity}
        self.used = {n: 0 for n in capacity}  # slots running members
        self.gangs: dict[str, GangRun] = {}
        self.members: list[Member] = []
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = itertools.count()
        self.wakes: dict[tuple[str, str], float] = {}
        self.no_room: set[str] = set()  # gangs told "no room" (poked when the view has room)
        if net.poke and net.view_every > 0:
            self._at(0.0, "gossip", None)
        self.messages = 0
        self.view: dict[NodeId, int] = {}
        self.view_at = float("-inf")
        self.held_slot_seconds = 0.0
        self._last_account = 0.0

    # ------------------------------------------------------------------ driving

    def submit(
        self,
        at: float,
        spec: g.GangSpec,
        home: NodeId,
        duration: Callable[[int], float],
        code: Callable[[int, int], int] = lambda r, s: 0,
    ) -> None:
        self.gangs[spec.gang] = GangRun(spec, home, at, duration, code)
        self._at(at, "submit", spec.gang)

    def kill(self, at: float, node: NodeId) -> None:
        self._at(at, "kill", node)

    def cancel(self, at: float, gang: str) -> None:
        self._at(at, "cancel", gang)

    def run(self, until: float) -> None:
        same = 0
        while self.events and self.events[0][0] <= until:
            t, _, kind, data = heapq.heappop(self.events)
            same = same + 1 if t == self.now else 0
            if same > SAME_INSTANT:
                raise InvariantBroken(f"{same} events at t={t:.6f}: a wake that never moves on")
            self._account(t)
            self.now = t
            getattr(self, f"_ev_{kind}")(data)
            if self.check:
                self._check()
        self._account(until)
        self.now = max(self.now, until)
        if self.check:
            for run in self.gangs.values():
                self._partial(run)

    # ------------------------------------------------------------------ events

    def _at(self, t: float, kind: str, data: Any) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, data))

    def _ev_gossip(self, _: None) -> None:
        """The view refreshes (gossip): gangs that found no room and fit it now are poked."""
        self._refresh()
        free = sum(max(v, 0) for v in self.view.values())
        for name in sorted(self.no_room):
            run = self.gangs[name]
            if run.coord is None or run.home not in self.alive or not run.coord.no_room:
                self.no_room.discard(name)
            elif run.spec.size <= free:
                self.no_room.discard(name)
                self._home_out(run, run.coord.poke(self.now))
        if self.net.view_every > 0 and self.events:  # anything else still to happen
            self._at(self.now + self.net.view_every, "gossip", None)

    def _refresh(self) -> None:
        self.view = {
            n: self.capacity[n] - self.used[n] - self.books[n].held_slots() for n in self.alive
        }
        self.view_at = self.now

    def _ev_submit(self, gang: str) -> None:
        run = self.gangs[gang]
        if run.home not in self.alive:
            return
        run.coord = Coordinator(run.spec, run.home, self.now, self.rng, self.timers)
        self._home_out(run, run.coord.tick(self.now))

    def _wake(self, kind: str, key: str, at: float) -> None:
        """One pending wake per actor: the earliest asked for (as the agent's driver)."""
        at = max(at, self.now)
        if self.wakes.get((kind, key), float("inf")) > at:
            self.wakes[(kind, key)] = at
            self._at(at, kind, key)

    def _woke(self, kind: str, key: str) -> bool:
        if self.wakes.get((kind, key)) != self.now:
            return False
        del self.wakes[(kind, key)]
        return True

    def _ev_wake_home(self, gang: str) -> None:
        if not self._woke("wake_home", gang):
            return
        run = self.gangs[gang]
        if run.coord is not None and run.home in self.alive:
            self._home_out(run, run.coord.tick(self.now))

    def _ev_wake_node(self, node: NodeId) -> None:
        if self._woke("wake_node", node) and node in self.alive:
            self._node_out(node, self.books[node].tick(self.now))

    def _ev_deliver(self, data: tuple[NodeId, NodeId, g.Message]) -> None:
        src, dst, msg = data
        if src not in self.alive or dst not in self.alive:
            return
        if isinstance(msg, (g.Prepare, g.Commit, g.Renew, g.Abort)):
            room = self.capacity[dst] - self.used[dst] - self.books[dst].held_slots()
            port = 29500 + len(self.books[dst].entries)
            self._node_out(dst, self.books[dst].on_message(self.now, src, msg, room, port))
        else:
            run = self.gangs.get(msg.gang)
            if run is not None and run.coord is not None and run.home == dst:
                self._home_out(run, run.coord.on_message(self.now, src, msg))

    def _ev_exit(self, member: Member) -> None:
        if member.end is not None or member.node not in self.alive:
            return
        run = self.gangs[member.gang]
        code = run.code(member.round, member.slot)
        self._stop_member(member, code)
        out = self.books[member.node].on_member_exit(
            self.now, member.gang, member.round, member.slot, code
        )
        self._node_out(member.node, out)

    def _ev_kill(self, node: NodeId) -> None:
        if node not in self.alive:
            return
        self.alive.discard(node)
        for m in [m for run in self.gangs.values() for m in run.running.values() if m.node == node]:
            self._stop_member(m, None)
        old = self.books[node]
        self.books[node] = HoldBook(node, old.max_holds, old.max_waiting)
        self._at(self.now + self.net.detect, "dead", node)

    def _ev_dead(self, node: NodeId) -> None:
        for run in self.gangs.values():
            if run.coord is not None and run.home in self.alive:
                self._home_out(run, run.coord.on_node_dead(self.now, node))

    def _ev_cancel(self, gang: str) -> None:
        run = self.gangs[gang]
        if run.coord is not None and run.home in self.alive:
            self._home_out(run, run.coord.cancel(self.now, "cancelled by its user"))

    # ------------------------------------------------------------------ instructions

    def _home_out(self, run: GangRun, out: list[g.Instruction]) -> None:
        assert run.coord is not None
        for ins in out:
            if isinstance(ins, g.Send):
                self._send(run.home, ins.to, ins.msg)
            elif isinstance(ins, g.WakeAt):
                self._wake("wake_home", run.spec.gang, ins.at)
            elif isinstance(ins, g.NeedTargets):
                targets = self._place(run.spec.size)
                self._home_out(run, run.coord.on_targets(self.now, targets))
                if targets is None and self.net.poke:
                    self.no_room.add(run.spec.gang)
            elif isinstance(ins, g.RoundStarted):
                run.rounds += 1
            elif isinstance(ins, g.GangRunning):
                if run.first_running is None:
                    run.first_running = self.now
            elif isinstance(ins, g.GangEnded):
                run.ended = ins
                run.ended_at = self.now

    def _node_out(self, node: NodeId, out: list[g.Instruction]) -> None:
        for ins in out:
            if isinstance(ins, g.Send):
                self._send(node, ins.to, ins.msg)
            elif isinstance(ins, g.WakeAt):
                self._wake("wake_node", node, ins.at)
            elif isinstance(ins, g.StartMembers):
                run = self.gangs[ins.gang]
                for slot in ins.ranks:
                    m = Member(ins.gang, ins.round, node, slot, self.now)
                    run.running[(node, slot)] = m
                    self.members.append(m)
                    self.used[node] += 1
                    self._at(self.now + run.duration(slot), "exit", m)
                self._partial(run)
            elif isinstance(ins, g.StopMembers):
                run = self.gangs[ins.gang]
                for slot in ins.slots:
                    was = run.running.get((node, slot))
                    if was is not None and was.round == ins.round:
                        self._stop_member(was, None)

    def _stop_member(self, m: Member, code: int | None) -> None:
        run = self.gangs[m.gang]
        m.end = self.now
        m.code = code
        if run.running.get((m.node, m.slot)) is m:
            del run.running[(m.node, m.slot)]
            self.used[m.node] -= 1
        self._partial(run)

    def _send(self, src: NodeId, dst: NodeId, msg: g.Message) -> None:
        self.messages += 1
        copies = 2 if self.rng.random() < self.net.dup else 1
        for _ in range(copies):
            if self.rng.random() < self.net.loss:
                continue
            delay = self.rng.uniform(self.net.delay_lo, self.net.delay_hi)
            self._at(self.now + delay, "deliver", (src, dst, msg))

    def _place(self, size: int) -> list[NodeId] | None:
        """Two choices per member on the view of free room (counting this gang's own
        earlier members); None when the view has no room for all of them."""
        if self.net.view_every <= 0 or (
            not self.net.poke and self.now - self.view_at >= self.net.view_every
        ):
            self._refresh()
        free = {n: v for n, v in self.view.items() if n in self.alive}
        if sum(max(v, 0) for v in free.values()) < size:
            return None
        nodes = sorted(free)
        out: list[NodeId] = []
        for _ in range(size):
            a, b = self.rng.choice(nodes), self.rng.choice(nodes)
            pick = a if free[a] >= free[b] else b
            if free[pick] <= 0:
                roomy = [n for n in nodes if free[n] > 0]
                pick = self.rng.choice(roomy)
            free[pick] -= 1
            out.append(pick)
        return out

    # ------------------------------------------------------------------ invariants

    def _account(self, t: float) -> None:
        dt = t - self._last_account
        if dt > 0:
            self.held_slot_seconds += dt * sum(b.held_slots() for b in self.books.values())
            self._last_account = t

    def _partial(self, run: GangRun) -> None:
        """Track how long a strict gang runs partly (some members, not all)."""
        if run.spec.mode is not g.Mode.STRICT:
            return
        n = len(run.running)
        partial = 0 < n < run.spec.size
        if partial and run.partial_since is None:
            run.partial_since = self.now
        if run.partial_since is not None:
            run.longest_partial = max(run.longest_partial, self.now - run.partial_since)
            if self.check and run.longest_partial > self.timers.partial_bound() + 1e-9:
                raise InvariantBroken(
                    f"{run.spec.gang} ran partly for {run.longest_partial:.3f} s "
                    f"> bound {self.timers.partial_bound():.3f} s at t={self.now:.3f}"
                )
        if not partial:
            run.partial_since = None

    def _check(self) -> None:
        for n in self.alive:
            book = self.books[n]
            for e in book.entries.values():
                # lapse runs first in every stimulus and WakeAt names the deadline, so
                # an entry is never seen after its deadline (at it, its wake is next)
                if e.deadline < self.now:
                    raise InvariantBroken(
                        f"{n}: {e.gang} round {e.round} {e.phase.value} past its deadline"
                    )
            if self.used[n] + book.held_slots() > self.capacity[n]:
                raise InvariantBroken(
                    f"{n}: {self.used[n]} running + {book.held_slots()} held > {self.capacity[n]}"
                )
        for run in self.gangs.values():
            rounds = {m.round for m in run.running.values()}
            if len(rounds) > 1:
                raise InvariantBroken(
                    f"{run.spec.gang}: rounds {sorted(rounds)} run at once at t={self.now:.3f}"
                )
