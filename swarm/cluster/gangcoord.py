"""A gang's coordinator at its home (issue 22, pure): rounds of prepare, commit, run.

One `Coordinator` per gang, kept by the node the gang was submitted at. It asks its
caller where to place the members (`NeedTargets` -> `on_targets`), then runs rounds
as gang.py describes: prepares one node at a time in node-id order, commit once
enough nodes hold, renewals only while the gang is whole, abort on any failure, and
a jittered, doubling back-off between failed rounds. Time comes in as `now` and
randomness from the `random.Random` it is given; every answer is a list of
instructions (gang.py), the last of them a `WakeAt` when something is due.

What ends a gang: every member exited (ok when all exited 0); a strict gang's member
failed or its node died while running (unless `restart`: then a new round as a
whole); a non-strict gang fell under `min_available` live members; `cancel`;
`timeout` before it ran; `max_rounds` failed rounds.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model import NodeId
from . import gang as g
from .gangstate import GangRounds, Phase, Share


class Coordinator(GangRounds):
    """The home's side of one gang: the phases and the stimuli."""

    # ------------------------------------------------------------------ stimuli

    def tick(self, now: float) -> list[g.Instruction]:
        out = self._resend_aborts(now)
        if self.phase is Phase.ENDED:
            return self._woken(now, out)
        if self.spec.timeout and not self.ever_ran and now >= self.created + self.spec.timeout:
            return self._woken(
                now,
                out
                + self._end(
                    now, False, f"not running after {self.spec.timeout:g} s (gang-timeout)"
                ),
            )
        if self.phase is Phase.WAITING:
            if not self.asking and now >= max(self.wait_until, self.lapse_until):
                self.asking = True
                out.append(g.NeedTargets(self.spec.gang, self.round + 1))
        elif self.phase is Phase.PREPARING:
            out += self._prepare_tick(now)
        elif self.phase is Phase.COMMITTING:
            out += self._commit_tick(now)
        elif self.phase is Phase.RUNNING:
            out += self._run_tick(now)
        return self._woken(now, out)

    def on_targets(
        self, now: float, targets: Sequence[NodeId] | None, why: str = ""
    ) -> list[g.Instruction]:
        """Where each slot's member should go (len == size), or None: nowhere fits now."""
        if self.phase is not Phase.WAITING or not self.asking:
            return self._woken(now, [])
        self.asking = False
        if targets is None or len(targets) != self.spec.size or not all(targets):
            self.why = f"no placement: {why or 'the cluster has no room for it now'}"
            self._back_off(now)
            self.no_room = True
            return self._woken(now, [])
        by_node: dict[NodeId, list[int]] = {}
        for slot, node in enumerate(targets):
            by_node.setdefault(node, []).append(slot)
        self.round += 1
        self.rounds += 1
        self.shares = {n: Share(n, tuple(s)) for n, s in by_node.items()}
        self.order = sorted(by_node)
        self.next_ask = 0
        self.ranks = {}
        self.phase = Phase.PREPARING
        self.why = f"round {self.round}: asking {len(self.order)} nodes for holds"
        out: list[g.Instruction] = [g.RoundStarted(self.spec.gang, self.round)]
        out += self._ask(now, self.order[0])
        return self._woken(now, out)

    def on_message(self, now: float, src: NodeId, msg: g.ToHome) -> list[g.Instruction]:
        out: list[g.Instruction] = []
        if isinstance(msg, g.Aborted):
            a = self.aborting.get(src)
            if a is not None and a.round <= msg.round:
                del self.aborting[src]
            self._maybe_lapsed(now)
            return self._woken(now, out)
        share = self.shares.get(src)
        if (
            msg.gang != self.spec.gang
            or msg.round != self.round
            or share is None
            or self.phase is Phase.ENDED
        ):
            return self._woken(now, out)
        if isinstance(msg, g.Granted):
            out += self._on_granted(now, share, msg)
        elif isinstance(msg, g.Queued):
            out += self._on_queued(now, share, msg)
        elif isinstance(msg, g.Refused):
            out += self._on_refused(now, share, msg.reason)
        elif isinstance(msg, g.Started):
            out += self._on_started(now, share, msg)
        elif isinstance(msg, g.Alive):
            out += self._on_alive(now, share, msg)
        elif isinstance(msg, g.Gone):
            out += self._on_gone(now, share, msg.reason)
        return self._woken(now, out)

    def on_node_dead(self, now: float, node: NodeId) -> list[g.Instruction]:
        """Membership declared `node` dead: its holds and members are gone. An abort
        still owed to it stays owed until the lease lapses (a node declared dead by
        mistake still runs its members until then)."""
        share = self.shares.get(node)
        out: list[g.Instruction] = []
        if share is not None and self.phase in (Phase.PREPARING, Phase.COMMITTING, Phase.RUNNING):
            if self.phase is Phase.PREPARING and not share.granted and not share.refused:
                out += self._on_refused(now, share, "its node died")
            elif share.granted:
                out += self._on_gone(now, share, f"its node {node} died")
        self._maybe_lapsed(now)
        return self._woken(now, out)

    def poke(self, now: float) -> list[g.Instruction]:
        """The gossiped view changed and has room for the gang again: a gang backing off
        only because there was no room tries again soon (within one `resend`, jittered
        so that gangs poked together do not all ask at once). A back-off after a failed
        round is kept: it is what parts competing gangs."""
        if self.phase is Phase.WAITING and self.no_room and not self.asking:
            self.no_room = False
            self.wait_until = min(self.wait_until, now + self.rng.uniform(0.0, self.timers.resend))
        return self._woken(now, [])

    def cancel(self, now: float, reason: str = "cancelled") -> list[g.Instruction]:
        if self.phase is Phase.ENDED:
            return self._woken(now, [])
        return self._woken(now, self._end(now, False, reason))

    # ------------------------------------------------------------------ preparing

    def _ask(self, now: float, node: NodeId) -> list[g.Instruction]:
        share = self.shares[node]
        if share.asked_at is None:
            share.asked_at = now
        share.last_sent = now
        seq = share.next_seq
        share.next_seq += 1
        share.sent[seq] = now
        msg = g.Prepare(self.spec.gang, self.round, share.slots, self.timers.hold_ttl, seq)
        return [g.Send(node, msg)]

    def _prepare_tick(self, now: float) -> list[g.Instruction]:
        t = self.timers
        if self._hold_lapsing(now):
            return self._fail_round(now, "its holds would lapse before the commit")
        share = self.shares[self.order[self.next_ask]]
        assert share.asked_at is not None
        out = self._refresh_holds(now)
        if share.queued_at is not None:  # first in line there: ask again until the room is
            if now >= share.queued_at + t.queue_wait:
                waited = f"waited {t.queue_wait:g} s for room at {share.node}"
                return [*out, *self._on_refused(now, share, waited)]
            if now >= share.last_sent + t.resend:
                out += self._ask(now, share.node)
            return out
        if now >= share.asked_at + t.answer_timeout:
            return [*out, *self._on_refused(now, share, f"no answer in {t.answer_timeout:g} s")]
        if now >= share.last_sent + t.resend:
            out += self._ask(now, share.node)
        return out

    def _refresh_holds(self, now: float) -> list[g.Instruction]:
        """While the round waits for room further on, the holds it has are kept: a later
        prepare extends each one every third of hold_ttl."""
        t = self.timers
        out: list[g.Instruction] = []
        for s in self.shares.values():
            if s.granted and now >= s.hold_from + t.hold_ttl / 3 and now >= s.last_sent + t.resend:
                out += self._ask(now, s.node)
        return out

    def _hold_lapsing(self, now: float) -> bool:
        """A granted hold might lapse before a commit could reach it."""
        t = self.timers
        return any(
            s.granted and now >= s.hold_from + t.hold_ttl - t.answer_timeout
            for s in self.shares.values()
        )

    def _on_granted(self, now: float, share: Share, msg: g.Granted) -> list[g.Instruction]:
        if self.phase is not Phase.PREPARING:
            return []
        # the hold lasts hold_ttl from the arrival of the prepare answered, sent then
        share.hold_from = max(
            share.hold_from,
            share.sent.get(msg.seq, share.asked_at if share.asked_at is not None else now),
        )
        if share.granted or share.node != self.order[self.next_ask]:
            return []  # a kept hold's answer, or an answer out of turn
        share.granted = True
        share.port = msg.port
        share.queued_at = None
        return self._next(now)

    def _on_queued(self, now: float, share: Share, msg: g.Queued) -> list[g.Instruction]:
        if self.phase is not Phase.PREPARING or share.node != self.order[self.next_ask]:
            return []
        if self.timers.queue_wait <= 0:
            return self._on_refused(now, share, msg.reason or "no room")
        if share.queued_at is None:
            share.queued_at = now
            self.why = f"round {self.round}: first in line for room at {share.node}"
        return []

    def _on_refused(self, now: float, share: Share, reason: str) -> list[g.Instruction]:
        if self.phase is not Phase.PREPARING or share.node != self.order[self.next_ask]:
            return []
        share.refused = True
        if self.spec.mode is g.Mode.STRICT:
            return self._fail_round(now, f"{share.node} refused: {reason}")
        held = sum(len(s.slots) for s in self.shares.values() if s.granted)
        rest = sum(len(self.shares[n].slots) for n in self.order[self.next_ask + 1 :])
        if held + rest < self.spec.needed:
            return self._fail_round(
                now, f"{share.node} refused: {reason}; {held + rest} of {self.spec.needed} left"
            )
        return self._next(now)

    def _next(self, now: float) -> list[g.Instruction]:
        self.next_ask += 1
        if self.next_ask < len(self.order):
            return self._ask(now, self.order[self.next_ask])
        granted = [s for s in self.shares.values() if s.granted]
        if sum(len(s.slots) for s in granted) < self.spec.needed:
            return self._fail_round(now, "too few holds")
        return self._commit(now, granted)

    # ------------------------------------------------------------------ committing

    def _commit(self, now: float, granted: list[Share]) -> list[g.Instruction]:
        slots = sorted(slot for s in granted for slot in s.slots)
        strict = self.spec.mode is g.Mode.STRICT
        self.ranks = {slot: (slot if strict else i) for i, slot in enumerate(slots)}
        self.world = len(slots)
        master = next(s for s in granted if any(self.ranks[x] == 0 for x in s.slots))
        self.master = (master.node, master.port)
        self.phase = Phase.COMMITTING
        self.why = f"round {self.round}: committing {self.world} members"
        out: list[g.Instruction] = []
        for s in granted:
            s.committed_at = now
            out += self._send_commit(now, s)
        return out

    def _send_commit(self, now: float, s: Share) -> list[g.Instruction]:
        s.last_sent = now
        self.lease_sent = now
        ranks = {slot: self.ranks[slot] for slot in s.slots}
        msg = g.Commit(
            self.spec.gang,
            self.round,
            ranks,
            self.world,
            *self.master,
            self.timers.run_ttl,
        )
        return [g.Send(s.node, msg)]

    def _commit_tick(self, now: float) -> list[g.Instruction]:
        t = self.timers
        waiting = [
            s
            for s in self.shares.values()
            if s.committed_at is not None and not s.started and not s.gone
        ]
        # (committed_at is set for every waiting share; 0.0 is a time like any other)
        if any(
            now >= (s.committed_at if s.committed_at is not None else now) + t.answer_timeout
            for s in waiting
        ):
            if self.spec.mode is g.Mode.STRICT:
                return self._fail_round(now, f"commit not answered in {t.answer_timeout:g} s")
            for s in waiting:
                s.gone = True
            return self._settle_commit(now)
        out: list[g.Instruction] = []
        for s in waiting:
            if now >= s.last_sent + t.resend:
                out += self._send_commit(now, s)
        return out

    def _on_started(self, now: float, share: Share, msg: g.Started) -> list[g.Instruction]:
        if self.phase is not Phase.COMMITTING or share.committed_at is None:
            return []
        share.started = True
        share.answer_at = now
        share.running = frozenset(msg.slots) & frozenset(share.slots)
        return self._settle_commit(now)

    def _settle_commit(self, now: float) -> list[g.Instruction]:
        committed = [s for s in self.shares.values() if s.committed_at is not None]
        if any(not (s.started or s.gone) for s in committed):
            return []
        # a member that already ended (a short one: its exit may come before the other
        # nodes' answers) started too
        began = {slot: s.node for s in committed if s.started for slot in s.running | set(s.exited)}
        if len(began) < self.spec.needed or (
            self.spec.mode is g.Mode.STRICT and len(began) < self.world
        ):
            return self._fail_round(now, f"only {len(began)} of {self.world} members started")
        self.phase = Phase.RUNNING
        self.ever_ran = True
        self.failures = 0
        self.last_renew = now
        self.why = f"round {self.round}: running {len(began)} members"
        nodes = {self.ranks[slot]: node for slot, node in began.items()}
        return [g.GangRunning(self.spec.gang, self.round, nodes, self.world), *self._judge(now)]

    # ------------------------------------------------------------------ running

    def _on_alive(self, now: float, share: Share, msg: g.Alive) -> list[g.Instruction]:
        if not share.started:
            if self.phase is not Phase.COMMITTING or share.committed_at is None:
                return []
            share.started = True  # its `started` was lost or is late: this says as much
        share.answer_at = now
        share.awaiting = False
        share.running = frozenset(msg.running) & frozenset(share.slots)
        share.exited.update({s: c for s, c in msg.exited.items() if s in share.slots})
        if self.phase is Phase.COMMITTING:
            return self._settle_commit(now)
        return self._judge(now) if self.phase is Phase.RUNNING else []

    def _on_gone(self, now: float, share: Share, reason: str) -> list[g.Instruction]:
        if share.committed_at is None:
            if self.phase is Phase.PREPARING and share.granted:
                return self._fail_round(now, f"{share.node}'s hold is gone: {reason}")
            return []
        share.gone = True
        share.running = frozenset()
        if self.phase is Phase.COMMITTING:
            if self.spec.mode is g.Mode.STRICT:
                return self._fail_round(now, f"{share.node} could not start: {reason}")
            return self._settle_commit(now)
        return self._judge(now, f"{share.node}: {reason}") if self.phase is Phase.RUNNING else []

    def _members(self, now: float) -> tuple[int, int, list[tuple[int, int]]]:
        """(live, ended ok, [(rank, code) of failures]) over the committed members."""
        live = ok = 0
        failed: list[tuple[int, int]] = []
        for s in self.shares.values():
            if s.committed_at is None:
                continue
            for slot in s.slots:
                code = s.exited.get(slot)
                if code == 0:
                    ok += 1
                elif code is not None:
                    failed.append((self.ranks[slot], code))
                elif slot in s.running and now < s.answer_at + self.timers.ack_fresh and not s.gone:
                    live += 1
        return live, ok, failed

    def _judge(self, now: float, why: str = "") -> list[g.Instruction]:
        """Is the running gang still whole? Ends it, or fails the round, when not."""
        live, ok, failed = self._members(now)
        if self.spec.mode is g.Mode.STRICT:
            if failed:
                return self._fail_round(now, f"rank {failed[0][0]} exited {failed[0][1]}")
            if live + ok < self.world:
                silent = f"{self.world - live - ok} members silent for {self.timers.ack_fresh:g} s"
                return self._fail_round(now, why or silent)
            if live == 0:
                return self._end(now, True, "every member exited 0")
            return []
        if live == 0:
            done = ok >= self.spec.needed and not failed
            return self._end(
                now, done, "members ended" if done else f"members failed: {self._fmt(failed)}"
            )
        if live + ok < self.spec.needed:
            return self._fail_round(
                now, why or f"{live + ok} of min-available {self.spec.needed} members live"
            )
        return []

    def _run_tick(self, now: float) -> list[g.Instruction]:
        out = self._judge(now)
        if out or self.phase is not Phase.RUNNING:
            return out
        if now >= self.last_renew + self.timers.renew_every:
            self.renew_seq += 1
            self.last_renew = now
            return [self._renew(now, s) for s in self._renewed()]
        # a renewal not answered is sent again (the same seq: it extends only once)
        return [
            self._renew(now, s)
            for s in self._renewed()
            if s.awaiting and now >= s.last_sent + self.timers.resend
        ]

    def _renew(self, now: float, s: Share) -> g.Send:
        s.last_sent = now
        s.awaiting = True
        self.lease_sent = now
        return g.Send(
            s.node, g.Renew(self.spec.gang, self.round, self.renew_seq, self.timers.run_ttl)
        )
