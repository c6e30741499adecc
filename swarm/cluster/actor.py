"""One actor without a leader (pure): rendezvous ownership and an expiring lease.

Where the cluster needs exactly one node to act for a key (the autoscaler of a pool,
issue 25), the node that acts is chosen from membership, not elected by messages:

* **Owner.** The owner of `key` is the rendezvous (highest random weight) winner among
  the live members: weight = the first 8 bytes of blake2b(key + "\\0" + node), big
  endian; ties (never seen in practice) go to the smaller node id. Every node that
  sees the same live set names the same owner, with no message exchanged, and
  removing a member that is not the owner never changes it.
* **Lease.** The owner announces a `Lease(key, holder, epoch, ttl)` through gossip and
  renews it every ttl/3 while it holds it. A receiver keeps the newest lease per
  holder with its *receipt* time on its own clock: the lease is valid until receipt +
  ttl. Clocks of different nodes are never compared.
* **Epochs.** A claim takes the largest epoch this node has seen (its own included)
  plus one, so epochs grow along the chain of holders; a lease older than the newest
  one recorded for the same holder is stale and ignored.

`ActorSeat` is the state one node keeps for one key. `step(live, now)` says whether
the node may act now, and what to announce. The node may act only when all hold:

1. it is in `live` and is the rendezvous owner of `key` among `live`;
2. it holds a claim that it announced on an earlier step (others can see it) and whose
   last announcement is younger than ttl on its own clock (a node whose steps stopped
   for a ttl, paused or starved, has lost its claim and claims anew);
3. no other holder's lease *in force* outranks its claim, by (epoch, holder). A lease is
   in force until receipt + ttl when its holder is in `live`, and until receipt + ttl
   + grace when it is not (a paused ex-holder's late actions and ours must not overlap).

A node claims (a fresh epoch, announced at once, acting from the next step) only when
it is the owner, has listened for `listen` seconds since its seat started (default: one
ttl, so a node that just started or restarted hears the current holder's renewals
before it competes), and no other holder's lease is in force at all. An owner that
stops being the owner (a member that hashes higher joined) stops acting and renewing
at once; the new owner waits for its lease to run out. A holder that sees a lease in
force that outranks its own yields at once (stops acting and renewing).

Two nodes act at once only when they do not hear each other: two nodes that have
each received the other's latest announcement never both act (the lower one yields).
During a partition each side elects its own actor; `bound_double_action` states what
that can cost.

For the runtime: gossip each node's latest lease as part of its state (so a node that
joins hears the newest epoch even when nobody renews any more), feed received leases
to `on_lease`, call `step` a few times per ttl, and journal each action with the
step's `epoch`.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Iterable
from typing import Any

import attrs

from .. import wire
from ..model import NodeId

MAX_KEY_LEN = 256
MAX_HOLDER_LEN = 256
MIN_TTL = 0.01
MAX_TTL = 3600.0
MAX_EPOCH = 2**63 - 1


# ------------------------------------------------------------------ rendezvous


@functools.lru_cache(maxsize=1 << 14)
def rendezvous_weight(key: str, node: NodeId) -> int:
    """The node's weight for `key`: the same in every process (never Python's hash())."""
    digest = hashlib.blake2b(f"{key}\0{node}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def rendezvous_order(key: str, members: Iterable[NodeId]) -> list[NodeId]:
    """The members (each once), highest weight for `key` first; ties by node id."""
    return sorted(set(members), key=lambda n: (-rendezvous_weight(key, n), n))


def rendezvous_owner(key: str, members: Iterable[NodeId]) -> NodeId | None:
    """The member that owns `key`, or None for no members."""
    best: NodeId | None = None
    best_rank: tuple[int, NodeId] | None = None
    for n in members:
        rank = (-rendezvous_weight(key, n), n)
        if best_rank is None or rank < best_rank:
            best, best_rank = n, rank
    return best


# ---------------------------------------------------------------------- leases


@attrs.frozen
class Lease:
    """`holder` acts for `key` in `epoch`; valid for `ttl` seconds from its receipt."""

    key: str
    holder: NodeId
    epoch: int
    ttl: float

    def to_wire(self) -> dict[str, Any]:
        return {"key": self.key, "holder": self.holder, "epoch": self.epoch, "ttl": self.ttl}

    @classmethod
    def from_wire(cls, obj: Any) -> Lease:
        f = wire.Fields(obj, "lease")
        key = f.str("key", required=True, max_len=MAX_KEY_LEN)
        holder = f.str("holder", required=True, max_len=MAX_HOLDER_LEN)
        epoch = f.int("epoch", required=True, lo=1, hi=MAX_EPOCH)
        ttl = f.float("ttl", required=True, lo=MIN_TTL, hi=MAX_TTL)
        f.done()
        for name, v in (("key", key), ("holder", holder)):
            if not v:
                raise wire.SchemaError(f"lease: field {name!r} must not be empty")
        return cls(key, holder, epoch, ttl)


def bound_double_action(max_step: int, partitions: int) -> int:
    """The most nodes that can be changed in one cooldown when the cluster is split.

    Each side of a partition sees its own live set and so elects its own actor (one
    per consistent view); each actor changes at most `max_step` nodes per action and
    acts at most once per cooldown (the policy's rule, read from the gossiped time of
    the last action). So `partitions` sides change at most `partitions * max_step`
    nodes per cooldown, where a connected cluster changes at most `max_step`. A holder
    whose renewals are all lost counts as a side of its own.
    """
    if max_step < 0:
        raise ValueError(f"max_step must be >= 0, got {max_step}")
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    return partitions * max_step


# ------------------------------------------------------------------------ seat


@attrs.frozen
class SeatStep:
    """What one step decided: act or not, what to gossip, and why (one line)."""

    acting: bool
    announce: Lease | None
    reason: str
    owner: NodeId | None = None  # the rendezvous owner among the live members
    epoch: int = 0  # this node's claim (0: none); journal actions with it


@attrs.define
class _Seen:
    lease: Lease
    received: float  # on this node's clock


class ActorSeat:
    """One node's seat for one key: the leases it heard and its own claim."""

    def __init__(
        self, me: NodeId, key: str, ttl: float, grace: float, *, listen: float | None = None
    ) -> None:
        if not (math.isfinite(ttl) and MIN_TTL <= ttl <= MAX_TTL):
            raise ValueError(f"ttl must be in [{MIN_TTL}, {MAX_TTL}], got {ttl}")
        if not (math.isfinite(grace) and grace >= 0):
            raise ValueError(f"grace must be >= 0, got {grace}")
        listen = ttl if listen is None else listen
        if not (math.isfinite(listen) and listen >= 0):
            raise ValueError(f"listen must be >= 0, got {listen}")
        self.me = me
        self.key = key
        self.ttl = ttl
        self.grace = grace
        self.listen = listen
        self.seen: dict[NodeId, _Seen] = {}  # newest lease per other holder
        self.max_epoch = 0
        self.claim: Lease | None = None
        self.claimed_at = 0.0
        self.announced_at = 0.0
        self.started: float | None = None

    def _start(self, now: float) -> None:
        if self.started is None:
            self.started = now

    def on_lease(self, lease: Lease, now: float) -> bool:
        """Record a received lease; True if it was news (not stale, not ours, our key)."""
        self._start(now)
        if lease.key != self.key:
            return False
        if lease.holder == self.me:
            # our own announcement echoed back, or one of a previous life: epochs only
            self.max_epoch = max(self.max_epoch, lease.epoch)
            return False
        rec = self.seen.get(lease.holder)
        if rec is not None and lease.epoch < rec.lease.epoch:
            return False  # stale: an older announcement of the same holder
        received = now if rec is None else max(now, rec.received)
        self.seen[lease.holder] = _Seen(lease, received)
        self.max_epoch = max(self.max_epoch, lease.epoch)
        return True

    def in_force_until(self, rec: _Seen, live: frozenset[NodeId]) -> float:
        """Until when a lease heard of another holder keeps this node from acting."""
        end = rec.received + rec.lease.ttl
        return end if rec.lease.holder in live else end + self.grace

    def _prune(self, now: float) -> None:
        gone = [h for h, r in self.seen.items() if now >= r.received + r.lease.ttl + self.grace]
        for holder in gone:
            del self.seen[holder]

    def step(self, live_members: Iterable[NodeId], now: float) -> SeatStep:
        """Decide for this moment. `live_members` is this node's view; it includes this
        node (if it does not, the node does not act)."""
        self._start(now)
        live = frozenset(live_members)
        self._prune(now)
        if self.me not in live:
            self.claim = None
            return SeatStep(False, None, f"{self.me} is not in its own live set: not acting")
        owner = rendezvous_owner(self.key, live)
        assert owner is not None
        if owner != self.me:
            if self.claim is not None:
                self.claim = None
                why = f"stopped acting: {owner} now hashes higher for {self.key}"
            else:
                why = f"{owner} is the owner of {self.key}{self._heard(owner, now)}"
            return SeatStep(False, None, why, owner)
        note = ""
        if self.claim is not None:
            gap = now - self.announced_at
            if gap >= self.ttl:
                self.claim = None  # our lease ran out on everyone's clock: start again
                note = f"lease lapsed after {gap:.1f}s without a step; "
            else:
                rival = self._rival(live, now, (self.claim.epoch, self.me))
                if rival is not None:
                    self.claim = None
                    return SeatStep(
                        False,
                        None,
                        f"yielded to {rival.lease.holder}'s lease of epoch {rival.lease.epoch}",
                        owner,
                    )
                return self._hold(now, owner)
        return self._try_claim(live, now, owner, note)

    def _hold(self, now: float, owner: NodeId) -> SeatStep:
        assert self.claim is not None
        announce = None
        if now - self.announced_at >= self.ttl / 3:
            announce = self.claim
            self.announced_at = now
        e = self.claim.epoch
        if now > self.claimed_at:
            why = f"acting for {self.key} (epoch {e}, lease renewed every {self.ttl / 3:.1f}s)"
            return SeatStep(True, announce, why, owner, e)
        why = f"claimed epoch {e}: acting from the next step, once others have seen it"
        return SeatStep(False, announce, why, owner, e)

    def _try_claim(self, live: frozenset[NodeId], now: float, owner: NodeId, note: str) -> SeatStep:
        assert self.started is not None
        if now < self.started + self.listen:
            left = self.started + self.listen - now
            why = f"{note}owner; listening {left:.1f}s more for a current holder before claiming"
            return SeatStep(False, None, why, owner)
        blocker = self._rival(live, now, None)
        if blocker is not None:
            h = blocker.lease.holder
            left = self.in_force_until(blocker, live) - now
            if h in live:
                why = f"owner; waiting {left:.1f}s for {h}'s lease (epoch {blocker.lease.epoch})"
            else:
                why = (
                    f"owner; {h} is gone: waiting {left:.1f}s for its lease "
                    f"(epoch {blocker.lease.epoch}) plus grace"
                )
            return SeatStep(False, None, note + why, owner)
        self.max_epoch += 1
        self.claim = Lease(self.key, self.me, self.max_epoch, self.ttl)
        self.claimed_at = self.announced_at = now
        e = self.claim.epoch
        why = f"{note}claimed epoch {e}: acting from the next step, once others have seen it"
        return SeatStep(False, self.claim, why, owner, e)

    def _rival(
        self, live: frozenset[NodeId], now: float, above: tuple[int, NodeId] | None
    ) -> _Seen | None:
        """The other holders' lease in force that lasts longest (among those that
        outrank `above`, when given)."""
        best: _Seen | None = None
        for rec in self.seen.values():
            if now >= self.in_force_until(rec, live):
                continue
            if above is not None and (rec.lease.epoch, rec.lease.holder) <= above:
                continue
            if best is None or self.in_force_until(rec, live) > self.in_force_until(best, live):
                best = rec
        return best

    def _heard(self, owner: NodeId, now: float) -> str:
        rec = self.seen.get(owner)
        if rec is None:
            return ""
        return f" (its lease of epoch {rec.lease.epoch} heard {now - rec.received:.1f}s ago)"
