"""The membership core's shared state and its way out: member records, tombstones,
the probe ring, timers, the piggyback queue, counters; packet building with
piggybacked gossip, gossip rounds, random member picks.

`swarm.cluster.membership` explains the protocol; this module is the base the
protocol's parts (member_merge, probing, appgossip, antientropy) are written
against.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any

import attrs

from swarm import model as m

from . import gossip as g
from .lifeguard import Awareness, Suspicion
from .membership_config import MembershipConfig
from .membership_events import (
    Addr,
    Event,
    LoadEntry,
    NodeId,
    Outgoing,
)
from .messages import (
    MESSAGE_KIND,
    Codec,
    MemberUpdate,
    blob_overhead,
    envelope_overhead,
)
from .timers import Timers

ALIVE = m.MemberState.ALIVE
SUSPECT = m.MemberState.SUSPECT
DEAD = m.MemberState.DEAD
LEFT = m.MemberState.LEFT


@functools.lru_cache(maxsize=1 << 16)
def ring_key(node: NodeId) -> int:
    """A member's place in the rotating probe order: the same on every member (not
    Python's salted hash) and unrelated to how node ids are made."""
    return int.from_bytes(hashlib.blake2b(node.encode(), digest_size=8).digest(), "big")


def is_live_state(state: m.MemberState) -> bool:
    # Identity tests: Enum.__hash__ runs in Python and set lookups showed up in profiles.
    return state is ALIVE or state is SUSPECT


# Upper bounds (seconds) of the probe round-trip histogram's buckets.
PROBE_RTT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

_OUT_KEYS = {k: ("out." + k, "out." + k + ".bytes") for k in MESSAGE_KIND.values()}


@attrs.define
class PendingProbe:
    """A probe of ours waiting for its ack (or, once failed, for late nacks)."""

    seq: int
    node: NodeId
    incarnation: int
    start: float
    acked: bool = False
    expected_nacks: int = 0
    nacks: int = 0
    ended: bool = False  # failed; only waiting for late nacks (the nack grace)


@attrs.define
class PendingRelay:
    """A ping we send for another member's ping-req; its ack (or nack) goes back."""

    requester: Addr
    orig_seq: int
    nack: bool


class MembershipState:
    """The state every part of the SWIM/Lifeguard protocol shares, the queries on it,
    and the one way out: `_send` builds a datagram from the given messages plus as
    much queued gossip as fits, so every packet the node sends disseminates.

    The protocol's parts build on this class (merge and suspicion, probing, load and
    app gossip, anti-entropy); `Membership` combines them. One object holds all of it
    because each packet touches several parts (a ping carries gossip, an ack lowers
    the local health score, a push-pull merges records and loads).
    """

    def __init__(
        self,
        config: MembershipConfig,
        me: m.Member,
        rng: random.Random,
        now: float,
        *,
        codec: Codec | None = None,
        wall_offset: float = 0.0,
    ) -> None:
        if not me.node:
            raise ValueError("me.node must not be empty")
        self.config = config
        self.cluster = me.cluster
        self.stats: Counter[str] = Counter()
        self.last_error = ""
        self._rng = rng
        self._codec = codec if codec is not None else Codec()
        self._me: NodeId = me.node
        self._addr: Addr = (me.addr, me.port)
        self._members: dict[NodeId, m.Member] = {me.node: attrs.evolve(me, state=ALIVE)}
        self._dead_since: dict[NodeId, float] = {}
        self._suspicions: dict[NodeId, Suspicion] = {}
        # Every member but us, dead ones included until their tombstones go (random
        # picks: helpers, gossip targets). "shuffled": memberlist's probe order, walked
        # with _ring_pos. "rotating": _ring_pos counts probes between tombstone purges,
        # and _order, the live members sorted by ring_key, is the probe order (dead
        # members must not hold places in it: each would leave a target unprobed).
        self._ring: list[NodeId] = []
        self._ring_pos = 0
        self._rotating = config.probe_order == "rotating"
        self._order: list[NodeId] = []
        self._my_key = ring_key(me.node)
        self.wall_offset = wall_offset  # the adapter may follow wall-clock steps
        self._n_live = 1
        self._queue = g.BroadcastQueue()
        self._timers = Timers()
        self._deferrals: dict[Hashable, int] = {}
        self._awareness = Awareness(config.awareness_max_multiplier)
        self._seq = 0
        # probe round trips (direct or via helpers): counts per PROBE_RTT_BUCKETS
        # bucket (the last one: slower), and their sum, for a latency histogram
        self.probe_rtt: list[int] = [0] * (len(PROBE_RTT_BUCKETS) + 1)
        self.probe_rtt_sum = 0.0
        self._waiters: dict[int, PendingProbe | PendingRelay] = {}
        self._events: list[Event] = []
        self._load: dict[NodeId, LoadEntry] = {}
        self._own_load: LoadEntry | None = None
        self._load_version = -1
        self._app_seen: dict[tuple[NodeId, str], tuple[int, int]] = {}
        self._app_seq = 0
        self._app_state: dict[str, Any] | None = None
        self._leaving = False
        self._joined = False
        self._refuted = False  # set by _apply_self, read by _on_push_pull
        self._stale_accusation = False  # set by _apply_self, read by receive
        self._corrected: dict[Addr, float] = {}  # when we last corrected each sender
        self._budget = config.udp_budget - envelope_overhead(self.cluster)
        if self._budget < 64:
            raise ValueError("max_packet_size too small for the cluster name and overhead")
        self._caps = {g.LOAD_TIER: int(self._budget * min(1.0, config.load_packet_share))}
        self._late = config.probe_timeout / 2
        self._nack_grace = config.probe_timeout / 2
        lg = config.lifeguard
        self._lifeguard = lg
        # Stagger the periodic work so that nodes started together do not beat in step.
        r = rng.random
        self._timers.set("probe", now + r() * config.probe_interval)
        # Gossip rounds are not a heap timer: while the queue is empty they are
        # skipped without waking up (an idle node only wakes to probe), and while it
        # holds nothing but load reports they run at the slower load_gossip_interval.
        self._gossip_last = now - r() * config.gossip_interval
        self._timers.set("push_pull", now + r() * config.push_pull_interval)
        self._timers.set("reconnect", now + (1 + r()) * config.reconnect_interval)
        self._enqueue_member(self._members[me.node], "")

    @property
    def node_id(self) -> NodeId:
        return self._me

    @property
    def me(self) -> m.Member:
        return self._members[self._me]

    @property
    def incarnation(self) -> int:
        return self._members[self._me].incarnation

    @property
    def local_health(self) -> int:
        """Lifeguard's Local Health Multiplier score: 0 (healthy) .. awareness_max - 1."""
        return self._awareness.score

    @property
    def joined(self) -> bool:
        """True once a push-pull exchange with another member happened (a reply came
        back, or somebody joined or synced through us)."""
        return self._joined

    @property
    def leaving(self) -> bool:
        return self._leaving

    @property
    def leave_complete(self) -> bool:
        """After leave(): the 'left' message has been sent its full retransmit count."""
        return self._leaving and (("m", self._me) not in self._queue or self._n_live <= 0)

    @property
    def num_live(self) -> int:
        """Alive and suspect members, ourselves included."""
        return self._n_live

    def member(self, node: NodeId) -> m.Member | None:
        return self._members.get(node)

    def members(self) -> list[m.Member]:
        """Every record we hold: ourselves, live members and tombstones (dead/left)."""
        return list(self._members.values())

    def alive_members(self) -> list[m.Member]:
        """Members not known dead or left (alive and suspect, ourselves included),
        like memberlist's Members(): a suspect is still a member until declared dead."""
        return [mb for mb in self._members.values() if is_live_state(mb.state)]

    def load_view(self) -> dict[NodeId, LoadEntry]:
        """Newest load report per live member, with its local receipt time (O(n) copy)."""
        out = dict(self._load)
        if self._own_load is not None:
            out[self._me] = self._own_load
        return out

    def poll_events(self) -> list[Event]:
        ev, self._events = self._events, []
        return ev

    def next_deadline(self) -> float:
        """When tick must be called next (may be in the past: call it now)."""
        t = self._timers.next()
        if self._queue:
            return min(t, self._gossip_last + self._gossip_period())
        return t

    def _gossip_period(self) -> float:
        cfg = self.config
        if self._queue.only_tier(g.LOAD_TIER):
            return cfg.load_gossip_interval
        return cfg.gossip_interval

    def queue_len(self) -> int:
        return len(self._queue)

    def _random_members(self, k: int, pred: Callable[[m.Member], bool]) -> list[m.Member]:
        """memberlist's kRandomNodes: up to k distinct members passing pred, 3n tries."""
        ring = self._ring
        n = len(ring)
        out: list[m.Member] = []
        if n == 0 or k <= 0:
            return out
        seen: set[NodeId] = set()
        rand = self._rng.randrange
        for _ in range(3 * n):
            if len(out) >= k:
                break
            node = ring[rand(n)]
            if node in seen:
                continue
            rec = self._members.get(node)
            if rec is not None and pred(rec):
                seen.add(node)
                out.append(rec)
        return out

    def _gossip(self, now: float, out: list[Outgoing]) -> None:
        if not self._queue:
            return
        dead_time = self.config.gossip_to_the_dead_time
        dead_since = self._dead_since

        def eligible(r: m.Member) -> bool:
            if is_live_state(r.state):
                return True
            return r.state is DEAD and now - dead_since.get(r.node, -math.inf) < dead_time

        for t in self._random_members(self.config.gossip_nodes, eligible):
            if not self._send((t.addr, t.port), [], out):
                return

    def _send(self, dest: Addr, blobs: list[tuple[str, bytes]], out: list[Outgoing]) -> bool:
        """Build one datagram: the given messages plus as much piggyback as fits."""
        budget = self._budget
        for _, b in blobs:
            budget -= len(b) + blob_overhead(len(b))
        if budget > 8 and self._queue:
            for _, kind, blob in self._queue.take(budget, self._n_live, tier_caps=self._caps):
                blobs.append((kind, blob))
        if not blobs:
            return False
        payload = self._codec.encode_packet(self.cluster, [b for _, b in blobs])
        st = self.stats
        st["out.packets"] += 1
        st["out.bytes"] += len(payload)
        for kind, b in blobs:
            k_n, k_b = _OUT_KEYS[kind]
            st[k_n] += 1
            st[k_b] += len(b)
        out.append(Outgoing(dest, payload, False))
        return True

    def _count_out(self, kind: str, payload: bytes, *, reliable: bool) -> None:
        st = self.stats
        st["out.reliable" if reliable else "out.packets"] += 1
        st["out.reliable.bytes" if reliable else "out.bytes"] += len(payload)
        st["out." + kind] += 1

    def _enqueue_member(self, rec: m.Member, accuser: NodeId, blob: bytes | None = None) -> None:
        if blob is None:
            blob = self._codec.encode(MemberUpdate(rec, accuser))
        tier = g.SUSPECT_TIER if rec.state is SUSPECT else g.MEMBER_TIER
        self._queue.enqueue(
            ("m", rec.node), blob, kind="member", tier=tier, mult=self.config.retransmit_mult
        )
