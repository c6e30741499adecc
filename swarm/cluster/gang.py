"""Gangs without a leader (issue 22): the values and messages of the protocol.

A gang is N members of one command that must run together (an MPI job, a
distributed training run). No node of swarm is in charge, so the gang's *home*
(where it was submitted) coordinates it (`gangcoord.Coordinator`), and every node
that may run members keeps a book of holds (`gangholds.HoldBook`).

One attempt to start the gang is a *round* (numbered; numbers only grow):

1. **Prepare.** The home picks a node for each member (placement's two choices; the
   caller's business) and asks those nodes, one at a time in node-id order, to hold
   resources for the members it wants there. A node grants a hold in arrival order
   when the members fit and it holds fewer than `max_holds` uncommitted holds;
   otherwise it refuses at once (it never makes a prepare wait). A hold expires by
   itself `hold_ttl` after it was granted (the node's clock). Asking in one global
   order means that two gangs that want the same nodes meet at the first one they
   share: one of them is refused there while it holds nothing above it, so gangs that
   compete for the same nodes never take each other's holds in turn (no livelock);
   gangs whose node sets only partly overlap may both fail a round, and back off by
   a jittered, doubling delay. Optionally (`HoldBook.max_waiting`, `queue_wait`) a
   node without room keeps one gang first in line (`Queued`) and turns other gangs
   away until it grants it; waits then follow node-id order, so they cannot form a
   cycle. `swarm sim gang` measured this worse than refusing, so it is off by
   default. Later prepares of a round (a higher `seq`) extend its holds while it
   waits.
2. **Commit.** Once enough nodes hold (every member for a strict gang, `min_available`
   for a non-strict one), the home sends each a commit with the members' ranks, the
   world size and the rendezvous (rank 0's node and the port it reserved). A node
   turns a hold it still has into started members, each under a *run lease* of
   `run_ttl` from the commit's receipt; a hold already gone is answered `gone` and
   the round fails.
3. **Run.** The home renews the run leases every `run_ttl / 3`, but only while the
   gang is *whole*: a strict gang's every member has answered `running` within
   `ack_fresh` (or ended with 0), a non-strict gang's at least `min_available`. A
   member's node that stops hearing renewals stops its members when their lease
   lapses, whatever the home does (the supervisor enforces it in the agent). So a
   strict gang never runs partly for longer than `partial_bound()`: a member's death
   stops renewals, and the others' leases run out.
4. **Abort.** A failed round, a failed member or a cancel sends `abort` to every node
   of the round, which drops the holds and stops the members. A home whose round had
   started members waits before its next round until every node acknowledged the
   abort or until any lease it granted has surely lapsed, so at most one round of a
   gang has members running at any time.

Messages to and from the nodes carry (gang, round); a node refuses a round older
than the newest it has seen for the gang, and a prepare for a round it was told to
abort, so late duplicates can neither create holds nor start members.

What each side can do (security): the messages travel as authenticated peer
requests; a key holder can ask a node to hold or start members only of gangs whose
records it could submit anyway; a network attacker without the key can only delay or
drop them, which costs rounds, never a partial start past a lease.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from ..model import NodeId

MAX_GANG = 4096  # members of one gang
DEFAULT_HOLD_TTL = 5.0  # seconds a hold lasts without a commit
DEFAULT_RUN_TTL = 15.0  # seconds a member runs without a renewal
DEFAULT_MAX_HOLDS = 2  # uncommitted holds one node grants at once


class Mode(enum.Enum):
    STRICT = "strict"  # all N members or none
    NONSTRICT = "nonstrict"  # start with at least min_available; run while that many live


@attrs.frozen
class Timers:
    """The protocol's timers (seconds). `max_delay` bounds how late a peer message may
    arrive (the peer requests' timeout and the sealed packets' age limit): the home's
    waits add it so that a late renewal cannot outlast them."""

    hold_ttl: float = DEFAULT_HOLD_TTL
    run_ttl: float = DEFAULT_RUN_TTL
    answer_timeout: float = 1.0  # a prepare or commit not answered in this: the node refused
    queue_wait: float = 0.0  # how long a round waits at a node that queued it (0: never)
    resend: float = 0.25  # an unanswered message is sent again after this
    backoff_base: float = 0.2  # a failed round waits base * 2^failures (jittered) ...
    backoff_cap: float = 10.0  # ... at most this
    max_delay: float = 1.0
    drift: float = 0.01  # clock-rate difference allowed between two nodes

    @property
    def renew_every(self) -> float:
        return self.run_ttl / 3

    @property
    def ack_fresh(self) -> float:
        """A member counts as running while its node's last answer is this young."""
        return self.run_ttl * 2 / 3

    def partial_bound(self) -> float:
        """The longest a strict gang can run partly (some members, not all): the home
        renews on answers up to `ack_fresh` old, a renewal may take `max_delay` to
        arrive and gives `run_ttl`; plus one delay for the answer itself."""
        return self.ack_fresh + 2 * self.max_delay + self.run_ttl * (1 + self.drift)

    def lapse_wait(self) -> float:
        """How long after its last lease-giving send the home waits for the lease to
        have lapsed everywhere."""
        return self.max_delay + self.run_ttl * (1 + self.drift) + 0.1


@attrs.frozen
class GangSpec:
    """What the submitter asked for. Members are addressed by slot 0..size-1; a strict
    gang's rank is its slot, a non-strict gang's ranks are given at commit to the
    slots that hold, in slot order."""

    gang: str
    size: int
    mode: Mode = Mode.STRICT
    min_available: int = 0  # non-strict: start and keep running with at least this many
    restart: bool = False  # a failed running gang starts again as a whole (new round)
    timeout: float = 0.0  # not running this long after submission: it fails (0: never)
    max_rounds: int = 0  # rounds before it fails (0: no limit)

    def __attrs_post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> str:
        if not 1 <= self.size <= MAX_GANG:
            return f"gang: size must be 1..{MAX_GANG}, got {self.size}"
        if self.mode is Mode.NONSTRICT and not 1 <= self.min_available <= self.size:
            return (
                f"gang: min-available must be 1..{self.size} (the gang's size), "
                f"got {self.min_available}"
            )
        if self.timeout < 0 or self.max_rounds < 0:
            return "gang: timeout and max-rounds must not be negative"
        return ""

    @property
    def needed(self) -> int:
        """Members that must hold (and live) for the gang to start (and run)."""
        return self.size if self.mode is Mode.STRICT else self.min_available


# ------------------------------------------------------------------ messages
# home -> node


@attrs.frozen
class Prepare:
    """Hold resources for these slots of the gang (one node's share of the round)."""

    gang: str
    round: int
    slots: tuple[int, ...]
    hold_ttl: float
    seq: int = 0  # grows with every send of the round's prepares to this node: a later
    # one extends a hold (or asks again for room), an older copy extends nothing


@attrs.frozen
class Commit:
    """Start the held slots: `ranks` maps each slot held here to its rank."""

    gang: str
    round: int
    ranks: Mapping[int, int]
    world: int
    master: NodeId  # rank 0's node
    port: int  # the port rank 0's node reserved for the rendezvous
    run_ttl: float


@attrs.frozen
class Renew:
    """Extend the run lease of the round's members here; `seq` grows with each renewal
    so a duplicated (late) one extends nothing."""

    gang: str
    round: int
    seq: int
    run_ttl: float


@attrs.frozen
class Abort:
    """Drop the round's holds and stop its members (also every older round's)."""

    gang: str
    round: int
    reason: str = ""


# node -> home


@attrs.frozen
class Granted:
    gang: str
    round: int
    port: int = 0  # a port reserved for the rendezvous, should rank 0 land here
    seq: int = 0  # the prepare's: the hold lasts hold_ttl from that prepare's arrival


@attrs.frozen
class Queued:
    """No room now, but the node keeps the gang first in line for it (`max_waiting`):
    it refuses other gangs' prepares meanwhile, and grants when a later prepare of
    this round finds the room."""

    gang: str
    round: int
    seq: int = 0
    reason: str = ""


@attrs.frozen
class Refused:
    gang: str
    round: int
    reason: str


@attrs.frozen
class Started:
    """Answers a commit: the slots now running."""

    gang: str
    round: int
    slots: tuple[int, ...]


@attrs.frozen
class Alive:
    """Answers a renewal (and is sent when a member ends): the slots still running and
    the exit codes of those that ended."""

    gang: str
    round: int
    running: tuple[int, ...]
    exited: Mapping[int, int] = attrs.field(factory=dict)


@attrs.frozen
class Gone:
    """The node has nothing of this round (its hold lapsed, it was aborted, or the
    node restarted): the commit or renewal found nothing to act on."""

    gang: str
    round: int
    reason: str


@attrs.frozen
class Aborted:
    """Answers an abort: nothing of the round is held or running here any more."""

    gang: str
    round: int


ToNode = Prepare | Commit | Renew | Abort
ToHome = Granted | Queued | Refused | Started | Alive | Gone | Aborted
Message = ToNode | ToHome


# ------------------------------------------------------------------ instructions


@attrs.frozen
class Send:
    to: NodeId
    msg: Message


@attrs.frozen
class WakeAt:
    """Call `tick` at (or soon after) this time."""

    at: float


@attrs.frozen
class NeedTargets:
    """The home asks its caller where to place the gang's members for a new round
    (`Coordinator.on_targets`)."""

    gang: str
    round: int


@attrs.frozen
class RoundStarted:
    """A round is about to send its first prepare: journal `round` first, so that a
    restarted home never numbers a round twice."""

    gang: str
    round: int


@attrs.frozen
class GangRunning:
    gang: str
    round: int
    nodes: Mapping[int, NodeId]  # rank -> node
    world: int


@attrs.frozen
class GangEnded:
    gang: str
    round: int
    ok: bool
    reason: str
    exits: Mapping[int, int] = attrs.field(factory=dict)  # rank -> exit code


@attrs.frozen
class StartMembers:
    """A node starts these members: slot -> rank, with the world size and rendezvous."""

    gang: str
    round: int
    ranks: Mapping[int, int]
    world: int
    master: NodeId
    port: int


@attrs.frozen
class StopMembers:
    gang: str
    round: int
    slots: tuple[int, ...]
    reason: str


@attrs.frozen
class HoldChanged:
    """The node's held resources changed (a hold was granted, committed or dropped):
    its ledger should count `HoldBook.held_slots()` again."""

    gang: str
    round: int


Instruction = (
    Send
    | WakeAt
    | NeedTargets
    | RoundStarted
    | GangRunning
    | GangEnded
    | StartMembers
    | StopMembers
    | HoldChanged
)
