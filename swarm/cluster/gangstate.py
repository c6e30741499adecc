"""A gang coordinator's state, and how a round fails or the gang ends (issue 22, pure).

The part of `gangcoord.Coordinator` that does not depend on the phase it is in:
the fields, aborting a round (and what the next round must wait for), the back-off
and the end. gangcoord.py holds the phases and the stimuli.
"""

from __future__ import annotations

import enum
import random

import attrs

from ..model import NodeId
from . import gang as g


class Phase(enum.Enum):
    WAITING = "waiting"  # backing off, or waiting for targets
    PREPARING = "preparing"
    COMMITTING = "committing"
    RUNNING = "running"
    ENDED = "ended"


@attrs.define
class Share:
    """One node's part of the current round."""

    node: NodeId
    slots: tuple[int, ...]
    asked_at: float | None = None  # the first prepare's send time
    last_sent: float = 0.0
    next_seq: int = 0  # the next prepare's seq
    sent: dict[int, float] = attrs.field(factory=dict)  # prepare seq -> when it was sent
    hold_from: float = float("-inf")  # the hold lasts hold_ttl from at least this
    queued_at: float | None = None  # the node put the round first in line for room
    granted: bool = False
    refused: bool = False
    port: int = 0
    committed_at: float | None = None
    started: bool = False
    gone: bool = False
    answer_at: float = float("-inf")  # the last Started/Alive
    awaiting: bool = False  # a renewal sent, no answer yet
    running: frozenset[int] = frozenset()
    exited: dict[int, int] = attrs.field(factory=dict)


@attrs.define
class Aborting:
    """An abort not yet acknowledged: sent again until it is, or until `until`."""

    round: int
    until: float
    last_sent: float


class GangRounds:
    """The home's side of one gang: its state, failing rounds and ending."""

    def __init__(
        self,
        spec: g.GangSpec,
        home: NodeId,
        now: float,
        rng: random.Random,
        timers: g.Timers = g.Timers(),
        first_round: int = 1,
    ) -> None:
        self.spec = spec
        self.home = home
        self.timers = timers
        self.rng = rng
        self.created = now
        self.phase = Phase.WAITING
        self.round = first_round - 1
        self.wait_until = now
        self.lapse_until = now  # the next round not before: leases of the last one lapsed
        self.asking = False  # NeedTargets sent, on_targets not called yet
        self.failures = 0  # failed rounds in a row (the back-off's exponent)
        self.no_room = False  # backing off because the view had no room (poke ends it)
        self.rounds = 0
        self.shares: dict[NodeId, Share] = {}
        self.order: list[NodeId] = []
        self.next_ask = 0
        self.ranks: dict[int, int] = {}  # slot -> rank of the committed round
        self.world = 0
        self.master: tuple[NodeId, int] = ("", 0)  # rank 0's node and its port
        self.ever_ran = False
        self.renew_seq = 0
        self.last_renew = now
        self.lease_sent = float("-inf")  # the last commit or renewal sent
        self.aborting: dict[NodeId, Aborting] = {}
        self.result: g.GangEnded | None = None
        self.why = "waiting for its first round"  # for explain

    # ------------------------------------------------------------------ failing and ending

    def _fail_round(self, now: float, reason: str) -> list[g.Instruction]:
        ran = self.phase is Phase.RUNNING
        exits = self._exits()
        out = self._abort_round(now, reason)
        self.why = f"round {self.round} failed: {reason}"
        limit = self.spec.max_rounds and self.rounds >= self.spec.max_rounds
        if (ran and not self.spec.restart) or limit:
            what = f"round {self.round} failed: {reason}"
            return out + self._end(
                now, False, what if not limit else f"{what} (after {self.rounds} rounds)", exits
            )
        if ran:
            self.failures = 0
        self._back_off(now)
        return out

    def _abort_round(self, now: float, reason: str) -> list[g.Instruction]:
        """Abort everything the current round asked for; leases it gave must lapse (or
        the abort be acknowledged) before the next round."""
        out: list[g.Instruction] = []
        committed = any(s.committed_at is not None for s in self.shares.values())
        t = self.timers
        for s in self.shares.values():
            if s.asked_at is None:
                continue
            # a hold lasts hold_ttl from the arrival of the last prepare sent to it
            until = (
                self.lease_sent + t.lapse_wait()
                if s.committed_at is not None
                else s.last_sent + t.hold_ttl + t.max_delay
            )
            self.aborting[s.node] = Aborting(self.round, until, now)
            out.append(g.Send(s.node, g.Abort(self.spec.gang, self.round, reason)))
        if committed:
            self.lapse_until = max(self.lapse_until, self.lease_sent + t.lapse_wait())
        self.shares = {}
        self.order = []
        self._maybe_lapsed(now)
        return out

    def _maybe_lapsed(self, now: float) -> None:
        """Every node of the last round acknowledged its abort: no lease to wait for."""
        if not any(a.until > now for a in self.aborting.values()):
            self.lapse_until = min(self.lapse_until, now)

    def _resend_aborts(self, now: float) -> list[g.Instruction]:
        out: list[g.Instruction] = []
        for node, a in list(self.aborting.items()):
            if now >= a.until:
                del self.aborting[node]
            elif now >= a.last_sent + self.timers.resend:
                a.last_sent = now
                out.append(g.Send(node, g.Abort(self.spec.gang, a.round, "aborted")))
        self._maybe_lapsed(now)
        return out

    def _back_off(self, now: float) -> None:
        t = self.timers
        delay = min(t.backoff_cap, t.backoff_base * 2**self.failures) * self.rng.uniform(0.5, 1.5)
        self.failures = min(self.failures + 1, 30)
        self.phase = Phase.WAITING
        self.wait_until = now + delay
        self.no_room = False

    def _end(
        self, now: float, ok: bool, reason: str, exits: dict[int, int] | None = None
    ) -> list[g.Instruction]:
        exits = exits if exits is not None else self._exits()
        out: list[g.Instruction] = []
        if self.shares and not ok:
            out += self._abort_round(now, reason)
        self.phase = Phase.ENDED
        self.asking = False
        self.why = reason
        self.result = g.GangEnded(self.spec.gang, self.round, ok, reason, exits)
        return [*out, self.result]

    def _exits(self) -> dict[int, int]:
        return {
            self.ranks[slot]: c
            for s in self.shares.values()
            for slot, c in s.exited.items()
            if slot in self.ranks
        }

    @staticmethod
    def _fmt(failed: list[tuple[int, int]]) -> str:
        return ", ".join(f"rank {r} exited {c}" for r, c in failed) or "none exited 0"

    def _renewed(self) -> list[Share]:
        return [s for s in self.shares.values() if s.started and not s.gone and s.running]

    def _woken(self, now: float, out: list[g.Instruction]) -> list[g.Instruction]:
        due = self._next_due(now)
        if due is not None:
            out.append(g.WakeAt(due))
        return out

    def _next_due(self, now: float) -> float | None:
        t = self.timers
        dues = [a.last_sent + t.resend for a in self.aborting.values()]
        if self.phase is Phase.WAITING and not self.asking:
            dues.append(max(self.wait_until, self.lapse_until))
        elif self.phase in (Phase.PREPARING, Phase.COMMITTING):
            dues.append(now + min(t.resend, t.answer_timeout) / 2)
        elif self.phase is Phase.RUNNING:
            dues.append(self.last_renew + t.renew_every)
            dues += [s.last_sent + t.resend for s in self._renewed() if s.awaiting]
            # a member turns silent then (one already silent is judged by now)
            dues += [
                s.answer_at + t.ack_fresh
                for s in self.shares.values()
                if s.started and s.running and s.answer_at + t.ack_fresh > now
            ]
        if self.spec.timeout and not self.ever_ran and self.phase is not Phase.ENDED:
            dues.append(self.created + self.spec.timeout)
        return min(dues) if dues else None
