"""Cluster membership: SWIM failure detection with the Lifeguard extensions (sans-IO).

The model is HashiCorp memberlist. `Membership` never touches a socket or a clock:
the adapter feeds it received payloads (`receive`), calls `tick` when
`next_deadline()` comes, and sends the `Outgoing` packets it returns
(``reliable=False``: one UDP datagram; ``reliable=True``: one TCP payload, used for
push-pull only). Events (members joining, failing, leaving; load reports; app
gossip) are collected and handed out by `poll_events`.

What happens, in memberlist's words (docs/protocol.md, "Membership", has the whole
picture and the figures):

* Probe: every probe interval ping one member; no ack within the probe timeout ->
  ask `indirect_checks` random members to ping it (ping-req); still nothing by the
  end of the interval -> suspect it. Which member:
  memberlist walks its own shuffled round-robin list (`probe_order="shuffled"`), so a
  dead node waits for the first of n - 1 independent walks to reach it (about one
  interval on average, 4.6 at the 99th percentile). Beyond memberlist, the default
  `"rotating"` order has every member probed exactly once per round: all members sort
  the view the same way (by a hash of the node id), and in wall-clock round r the
  member at position p probes position p + 1 + (r mod (n - 1)), a permutation of the
  members that changes every round (so a suspicion still gets independent
  confirmations, one per round). Same probes, same bandwidth; the wait for the first
  probe is at most about two intervals.
* Suspicion: gossiped; the suspected node refutes by gossiping an alive message with
  a higher incarnation; otherwise after the (Lifeguard: dynamic) suspicion timeout it
  is declared dead. A graceful leave is gossiped as "left", not "dead".
* Dissemination: every membership change, every load report and every app broadcast
  is piggybacked on pings, acks and dedicated gossip packets (every gossip interval
  to `gossip_nodes` random members, and to members that died recently).
* Anti-entropy: periodic push-pull of the full state with a random member over a
  reliable stream, also used to join and (beyond memberlist) to heal partitions by
  periodically contacting a random dead member.
"""

from __future__ import annotations

import bisect
import enum
import functools
import hashlib
import heapq
import math
import random
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from swarm import model as m
from swarm import wire

from . import gossip as g
from .lifeguard import Awareness, Suspicion, suspicion_timeout
from .messages import (
    MESSAGE_KIND,
    Ack,
    AppBroadcast,
    Codec,
    IndirectPing,
    LoadUpdate,
    MemberUpdate,
    Message,
    Nack,
    Ping,
    PushPull,
    blob_overhead,
    envelope_overhead,
)

Addr = tuple[str, int]
NodeId = m.NodeId

ALIVE = m.MemberState.ALIVE
SUSPECT = m.MemberState.SUSPECT
DEAD = m.MemberState.DEAD
LEFT = m.MemberState.LEFT


@functools.lru_cache(maxsize=1 << 16)
def ring_key(node: NodeId) -> int:
    """A member's place in the rotating probe order: the same on every member (not
    Python's salted hash) and unrelated to how node ids are made."""
    return int.from_bytes(hashlib.blake2b(node.encode(), digest_size=8).digest(), "big")


def _live(state: m.MemberState) -> bool:
    # Identity tests: Enum.__hash__ runs in Python and set lookups showed up in profiles.
    return state is ALIVE or state is SUSPECT


MAX_UDP_PAYLOAD = 65507
_MAX_DEFERRALS = 2
_APP_SEEN_MAX = 65536


def _positive(_inst: Any, attr: attrs.Attribute[Any], value: float) -> None:
    if not (isinstance(value, (int, float)) and value > 0):
        raise ValueError(f"{attr.name} must be > 0, got {value!r}")


def _non_negative(_inst: Any, attr: attrs.Attribute[Any], value: float) -> None:
    if not (isinstance(value, (int, float)) and value >= 0):
        raise ValueError(f"{attr.name} must be >= 0, got {value!r}")


@attrs.frozen(kw_only=True)
class MembershipConfig:
    """Timers and limits. Defaults are memberlist's DefaultLANConfig.

    `tcp_fallback_ping` is memberlist's TCP ping sent along with the indirect probes
    (a reliable Outgoing); it keeps UDP-only loss from turning into suspicions.

    Beyond memberlist: `probe_order` "rotating" (default: a shared order, every
    member probed once per round) or "shuffled" (memberlist's per-node shuffled
    round-robin, for comparison); `lifeguard` switches all Lifeguard parts off
    together (for comparison; then: no local health, no nacks, fixed suspicion
    timeout, no buddy pings, no late-timer guard); the `load_*` knobs;
    `reconnect_interval` (push-pull to a random dead member, which heals partitions);
    `tombstone_ttl` (how long dead and left members are remembered, so stale gossip
    cannot resurrect them).
    """

    probe_interval: float = attrs.field(default=1.0, validator=_positive)
    probe_timeout: float = attrs.field(default=0.5, validator=_positive)
    gossip_interval: float = attrs.field(default=0.2, validator=_positive)
    gossip_nodes: int = attrs.field(default=3, validator=_positive)
    indirect_checks: int = attrs.field(default=3, validator=_non_negative)
    suspicion_mult: int = attrs.field(default=4, validator=_positive)
    suspicion_max_timeout_mult: int = attrs.field(default=6, validator=_positive)
    retransmit_mult: int = attrs.field(default=4, validator=_positive)
    push_pull_interval: float = attrs.field(default=30.0, validator=_positive)
    max_packet_size: int = attrs.field(default=1400, validator=_positive)
    transport_overhead: int = attrs.field(default=64, validator=_non_negative)
    awareness_max_multiplier: int = attrs.field(default=8, validator=_positive)
    gossip_to_the_dead_time: float = attrs.field(default=30.0, validator=_non_negative)
    lifeguard: bool = True
    tcp_fallback_ping: bool = True
    reconnect_interval: float = attrs.field(default=30.0, validator=_positive)
    tombstone_ttl: float = attrs.field(default=3600.0, validator=_positive)
    load_refresh_interval: float = attrs.field(default=5.0, validator=_positive)
    load_gossip_interval: float = attrs.field(default=1.0, validator=_positive)
    load_queue_max: int = attrs.field(default=512, validator=_positive)
    load_retransmit_mult: int = attrs.field(default=1, validator=_positive)
    load_packet_share: float = attrs.field(default=0.5, validator=_positive)
    load_events: bool = True
    probe_order: str = attrs.field(
        default="rotating", validator=attrs.validators.in_(("rotating", "shuffled"))
    )
    max_reliable_size: int = attrs.field(default=wire.MAX_FRAME - 4096, validator=_positive)

    @classmethod
    def lan(cls, **overrides: Any) -> MembershipConfig:
        return cls(**overrides)

    @classmethod
    def local(cls, **overrides: Any) -> MembershipConfig:
        """A faster profile for loopback and tests (about 5x the LAN rates)."""
        base: dict[str, Any] = {
            "probe_interval": 0.2,
            "probe_timeout": 0.1,
            "gossip_interval": 0.05,
            "push_pull_interval": 5.0,
            "gossip_to_the_dead_time": 5.0,
            "reconnect_interval": 2.0,
            "load_refresh_interval": 1.0,
            "load_gossip_interval": 0.25,
        }
        base.update(overrides)
        return cls(**base)

    @property
    def udp_budget(self) -> int:
        """Bytes our packet may have so that the transport's envelope still fits."""
        return self.max_packet_size - self.transport_overhead


# ------------------------------------------------------------------- outputs


@attrs.frozen
class Outgoing:
    dest: Addr
    payload: bytes
    reliable: bool = False


class EventKind(enum.Enum):
    JOINED = "joined"  # first seen alive, or back after dead/left
    ALIVE = "alive"  # a suspicion was refuted
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"
    UPDATED = "updated"  # address or port changed


@attrs.frozen
class MemberEvent:
    kind: EventKind
    member: m.Member
    at: float


@attrs.frozen
class LoadUpdated:
    report: m.LoadReport
    at: float


@attrs.frozen
class AppMessage:
    origin: NodeId
    key: str
    payload: Mapping[str, Any] = attrs.field(hash=False)  # shared: treat as read-only
    at: float = 0.0


@attrs.frozen
class AppState:
    node: NodeId
    state: Mapping[str, Any] = attrs.field(hash=False)  # shared: treat as read-only
    at: float = 0.0


Event = MemberEvent | LoadUpdated | AppMessage | AppState


@attrs.frozen
class LoadEntry:
    report: m.LoadReport
    received_at: float  # local time of receipt (for ourselves: of set_local_load)

    def age(self, now: float) -> float:
        return now - self.received_at


# -------------------------------------------------------------------- timers


class _Timers:
    """Keyed one-shot timers on a heap with lazy deletion (rescheduling is cheap)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Hashable]] = []
        self._due: dict[Hashable, float] = {}
        self._n = 0

    def set(self, key: Hashable, when: float) -> None:
        self._due[key] = when
        self._n += 1
        heapq.heappush(self._heap, (when, self._n, key))

    def cancel(self, key: Hashable) -> None:
        self._due.pop(key, None)

    def when(self, key: Hashable) -> float | None:
        return self._due.get(key)

    def _clean(self) -> None:
        h = self._heap
        while h and self._due.get(h[0][2]) != h[0][0]:
            heapq.heappop(h)

    def next(self) -> float:
        self._clean()
        return self._heap[0][0] if self._heap else math.inf

    def pop_due(self, now: float) -> tuple[Hashable, float] | None:
        self._clean()
        h = self._heap
        if not h or h[0][0] > now:
            return None
        when, _, key = heapq.heappop(h)
        del self._due[key]
        return key, when


@attrs.define
class _Probe:
    seq: int
    node: NodeId
    incarnation: int
    start: float
    acked: bool = False
    expected_nacks: int = 0
    nacks: int = 0
    ended: bool = False  # failed; only waiting for late nacks (the nack grace)


@attrs.define
class _Relay:
    requester: Addr
    orig_seq: int
    nack: bool


# ------------------------------------------------------------- the machine


class Membership:
    """One node's view of the cluster and its part in the SWIM/Lifeguard protocol.

    `me.cluster` is the cluster name carried in every packet; `me.incarnation` is the
    starting incarnation (an agent should start from the wall clock in seconds, so a
    restart beats its own tombstone at once; a restart from 0 still works, through
    refutation). `wall_offset` turns `now` into wall-clock seconds (`now +
    wall_offset`): the rotating probe order numbers its rounds by the wall clock, which
    NTP keeps common to all members (a skew only makes a few probes collide near the
    round boundaries; it cannot stop probing). `codec` may be shared between
    instances (the simulator does, with a cache). `receive` never raises; bad packets
    are dropped and counted in `stats`.
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
        self._timers = _Timers()
        self._deferrals: dict[Hashable, int] = {}
        self._awareness = Awareness(config.awareness_max_multiplier)
        self._seq = 0
        # probe round trips (direct or via helpers): counts per PROBE_RTT_BUCKETS
        # bucket (the last one: slower), and their sum, for a latency histogram
        self.probe_rtt: list[int] = [0] * (len(PROBE_RTT_BUCKETS) + 1)
        self.probe_rtt_sum = 0.0
        self._waiters: dict[int, _Probe | _Relay] = {}
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

    # ------------------------------------------------------------ queries

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
        return [mb for mb in self._members.values() if _live(mb.state)]

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

    # ------------------------------------------------------------- inputs

    def join(self, seeds: Sequence[Addr], now: float) -> list[Outgoing]:
        """Push-pull our state to each seed; safe to call again to retry."""
        out: list[Outgoing] = []
        payload = self._push_pull_payload(now, reply=False, join=True, heal=False, peer=None)
        if payload is None:
            return out
        for s in seeds:
            dest = (str(s[0]), int(s[1]))
            if dest == self._addr:
                continue
            self._count_out("push_pull", payload, reliable=True)
            out.append(Outgoing(dest, payload, True))
        return out

    def tick(self, now: float) -> list[Outgoing]:
        """Run every timer due by `now` (probes, suspicions, push-pull, ...) and a
        gossip round if one is due."""
        out: list[Outgoing] = []
        flagged_late = False
        while (item := self._timers.pop_due(now)) is not None:
            key, due = item
            if self._lifeguard and now - due > self._late and _accuses(key):
                # Beyond memberlist: a timer that fires much too late means we were not
                # running (CPU starvation, a pause); replies may be waiting unread in
                # our socket. Give them a chance before accusing anyone.
                n = self._deferrals.get(key, 0)
                if n < _MAX_DEFERRALS:
                    self._deferrals[key] = n + 1
                    self._timers.set(key, now + self.config.probe_timeout)
                    self.stats["timer.deferred"] += 1
                    if not flagged_late:
                        flagged_late = True
                        self._awareness.apply(1)
                    continue
            self._deferrals.pop(key, None)
            self._fire(key, due, now, out)
        if self._queue and now >= self._gossip_last + self._gossip_period():
            self._gossip_last = now
            self._gossip(now, out)
        return out

    def receive(
        self, src: Addr, payload: bytes, now: float, reliable: bool = False
    ) -> list[Outgoing]:
        """Handle one datagram (or reliable payload) from `src`. Never raises: bad,
        foreign or unexpected input is dropped and counted in `stats` ("drop.*")."""
        out: list[Outgoing] = []
        st = self.stats
        try:
            size = len(payload)
        except TypeError:
            size = 0
        st["in.packets"] += 1
        st["in.bytes"] += size
        try:
            pkt = self._codec.decode_packet(
                payload,
                max_size=self.config.max_reliable_size if reliable else MAX_UDP_PAYLOAD,
                cluster=self.cluster,
            )
        except wire.WireError as e:
            st["drop." + e.code] += 1
            return out
        try:
            self._stale_accusation = False
            for msg, blob in zip(pkt.messages, pkt.blobs, strict=True):
                k_n, k_b = _IN_KEYS[type(msg)]
                st[k_n] += 1
                st[k_b] += len(blob)
                self._handle(msg, blob, src, now, reliable, out)
            if self._stale_accusation and not reliable:
                self._correct(src, now, out)
        except Exception as e:  # never let a bug take the node down; make it visible
            st["error.internal"] += 1
            self.last_error = f"{type(e).__name__}: {e}"
        return out

    def _correct(self, src: Addr, now: float, out: list[Outgoing]) -> None:
        """Beyond memberlist: the sender still spreads an accusation we already
        refuted, so it missed the refutation; hand it our current record directly
        (at most once per probe interval per sender). Under heavy loss the gossip
        channel saturates and a refutation may not reach everyone in time."""
        last = self._corrected.get(src)
        if last is not None and now - last < self.config.probe_interval:
            return
        if len(self._corrected) >= 4096:
            self._corrected.clear()
        self._corrected[src] = now
        self.stats["refute.direct"] += 1
        me = self._members[self._me]
        self._send(src, [("member", self._codec.encode(MemberUpdate(me)))], out)

    def leave(self, now: float) -> list[Outgoing]:
        """Gossip that we leave; keep calling tick until `leave_complete`."""
        if self._leaving:
            return []
        self._leaving = True
        me = attrs.evolve(self._members[self._me], state=LEFT)
        self._members[self._me] = me
        self._n_live -= 1
        self._enqueue_member(me, self._me)
        for key in ("probe", "push_pull", "reconnect", "load"):
            self._timers.cancel(key)
        out: list[Outgoing] = []
        self._gossip(now, out)
        return out

    def set_local_load(self, report: m.LoadReport, now: float) -> None:
        """Publish our load. The core keeps versions strictly increasing (it may raise
        `report.version`) and re-publishes at least every load_refresh_interval."""
        if report.node != self._me:
            raise ValueError(f"load report of {report.node!r} is not ours ({self._me!r})")
        version = max(report.version, self._load_version + 1)
        if version != report.version:
            report = attrs.evolve(report, version=version)
        self._load_version = version
        self._own_load = LoadEntry(report, now)
        if not self._leaving:
            blob = self._codec.encode(LoadUpdate(report))
            self._queue.enqueue(
                ("l", self._me),
                blob,
                kind="load",
                tier=g.LOAD_TIER,
                mult=self.config.retransmit_mult,
            )
            self._timers.set("load", now + self.config.load_refresh_interval)

    def broadcast_app(self, key: str, payload: Mapping[str, Any]) -> None:
        """Gossip an application message; a newer one with the same key replaces it.

        Raises TypeError if payload is not msgpack-serializable, ValueError if it does
        not fit in one packet.
        """
        self._app_seq += 1
        msg = AppBroadcast(
            origin=self._me,
            key=key,
            incarnation=self.incarnation,
            seq=self._app_seq,
            payload=dict(payload),
        )
        blob = self._codec.encode(msg)
        if len(blob) + blob_overhead(len(blob)) > self._budget:
            raise ValueError(f"app payload of {len(blob)} bytes does not fit in a packet")
        self._app_seen[(self._me, key)] = (msg.incarnation, msg.seq)
        self._queue.enqueue(
            ("x", self._me, key),
            blob,
            kind="app",
            tier=g.APP_TIER,
            mult=self.config.retransmit_mult,
        )

    def set_app_state(self, obj: Mapping[str, Any] | None) -> None:
        """State sent in every push-pull; receivers get it as an AppState event."""
        self._app_state = None if obj is None else dict(obj)

    def bootstrap(self, records: Iterable[m.Member], now: float) -> None:
        """Install a known view quietly (no events, no gossip): a warm start from a
        snapshot, or the simulator's way to start a large converged cluster fast."""
        me = self._me
        if not isinstance(records, list):
            records = list(records)
        if len(self._members) == 1:
            # Fresh node: bulk path for the common case of alive records (the
            # simulator starts 5,000 nodes with 5,000 records each this way).
            fresh = {r.node: r for r in records if r.state is ALIVE and r.node != me}
            rest = [r for r in records if r.state is not ALIVE and r.node != me]
            self._members.update(fresh)
            self._ring = list(fresh)
            self._n_live += len(fresh)
            # The shuffled order must be a fresh shuffle per node: with one shared
            # order walked from random start offsets, the members just after the wrap
            # point lose their probers for most of the first pass (a dead one there
            # went unnoticed for 14 s at 1,000 nodes). The rotating order shares one
            # order but not positions in it: round numbers come from the clock.
            if self._rotating:
                self._order = sorted(fresh, key=ring_key)
            else:
                self._rng.shuffle(self._ring)
            self._ring_pos = 0
        else:
            rest = [r for r in records if r.node != me]
        for rec in rest:
            self._apply(rec, "", now, gossip=False, quiet=True)
        self._joined = True
        # Stagger the first push-pull over the interval for today's cluster size.
        interval = g.push_pull_scale(self.config.push_pull_interval, self._n_live)
        self._timers.set("push_pull", now + self._rng.random() * interval)

    # ---------------------------------------------------------- dispatch

    def _fire(self, key: Hashable, due: float, now: float, out: list[Outgoing]) -> None:
        cfg = self.config
        if key == "probe":
            self._start_probe(now, out)
        elif key == "push_pull":
            self._periodic_push_pull(now, out)
            interval = g.push_pull_scale(cfg.push_pull_interval, self._n_live)
            self._timers.set("push_pull", _next_period(due, interval, now))
        elif key == "reconnect":
            self._reconnect(now, out)
            self._timers.set("reconnect", _next_period(due, cfg.reconnect_interval, now))
        elif key == "load":
            if self._own_load is not None:
                self.set_local_load(self._own_load.report, now)
        elif isinstance(key, tuple):
            tag, arg = key
            if tag == "probe_timeout":
                self._probe_timeout(arg, now, out)
            elif tag == "probe_end":
                self._probe_end(arg, now, out)
            elif tag == "relay":
                self._relay_timeout(arg, out)
            elif tag == "nack_grace":
                self._nack_grace_end(arg)
            elif tag == "suspect":
                self._suspicion_expired(arg, now)

    def _handle(
        self,
        msg: Message,
        blob: bytes,
        src: Addr,
        now: float,
        reliable: bool,
        out: list[Outgoing],
    ) -> None:
        if isinstance(msg, MemberUpdate):
            self._apply(msg.member, msg.accuser, now, gossip=True, blob=blob)
        elif isinstance(msg, LoadUpdate):
            self._on_load(msg.report, now, relay_blob=blob)
        elif isinstance(msg, Ping):
            if msg.target and msg.target != self._me:
                self.stats["drop.not_for_us"] += 1
                return
            ack = self._codec.encode(Ack(msg.seq))
            if reliable:  # a TCP fallback ping: answer the same way
                payload = self._codec.encode_packet(self.cluster, [ack])
                self._count_out("ack", payload, reliable=True)
                out.append(Outgoing(src, payload, True))
            else:
                self._send(src, [("ack", ack)], out)
        elif isinstance(msg, Ack):
            if reliable and isinstance(self._waiters.get(msg.seq), _Probe):
                self.stats["probe.tcp_ack"] += 1
            self._on_ack(msg.seq, out, now)
        elif isinstance(msg, Nack):
            w = self._waiters.get(msg.seq)
            if isinstance(w, _Probe):
                w.nacks += 1
            else:
                self.stats["drop.stale_nack"] += 1
        elif isinstance(msg, IndirectPing):
            seq = self._next_seq()
            self._waiters[seq] = _Relay(requester=src, orig_seq=msg.seq, nack=msg.nack)
            self._timers.set(("relay", seq), now + self.config.probe_timeout)
            ping = self._codec.encode(Ping(seq, msg.target))
            self._send((msg.addr, msg.port), [("ping", ping)], out)
        elif isinstance(msg, AppBroadcast):
            self._on_app(msg, blob, now)
        elif isinstance(msg, PushPull):
            if not reliable:
                self.stats["drop.push_pull_unreliable"] += 1
                return
            self._on_push_pull(msg, now, out)

    # ------------------------------------------------------------ probing

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _scaled(self, t: float) -> float:
        return self._awareness.scale(t) if self._lifeguard else t

    def _next_probe_target(self, now: float) -> m.Member | None:
        if self._rotating:
            return self._rotating_target(now)
        for _ in range(len(self._ring) + 1):
            if self._ring_pos >= len(self._ring):
                self._reset_ring(now)
                if not self._ring:
                    return None
            node = self._ring[self._ring_pos]
            self._ring_pos += 1
            rec = self._members.get(node)
            if rec is not None and _live(rec.state):
                return rec
        return None

    def _rotating_target(self, now: float) -> m.Member | None:
        """The member this node probes in the current round of the rotating order.

        All members sort the others the same way, so in round r the member at global
        position p probes position p + 1 + (r mod (n - 1)) (mod n): for each r that
        maps the members one to one onto each other, and nobody onto itself. Only live
        members hold places, so a dead one leaves nobody unprobed."""
        if self._ring_pos >= len(self._ring):
            self._purge_tombstones(now)
        self._ring_pos += 1
        order = self._order
        n = len(order)
        if n == 0:
            return None
        r = int((now + self.wall_offset) // self.config.probe_interval)
        me = bisect.bisect_left(order, self._my_key, key=ring_key)
        rec = self._members.get(order[(me + r) % n])
        return rec if rec is not None and _live(rec.state) else None

    def _reorder(self, node: NodeId, live: bool) -> None:
        if node == self._me:  # we hold no place in our own order
            return
        order = self._order
        i = bisect.bisect_left(order, ring_key(node), key=ring_key)
        present = i < len(order) and order[i] == node
        if live and not present:
            order.insert(i, node)
        elif not live and present:
            del order[i]

    def _purge_tombstones(self, now: float) -> None:
        ttl = self.config.tombstone_ttl
        gone = False
        for node, since in list(self._dead_since.items()):
            if now - since > ttl:
                del self._dead_since[node]
                del self._members[node]
                gone = True
        if gone:
            self._ring = [n for n in self._ring if n in self._members]
        self._ring_pos = 0

    def _reset_ring(self, now: float) -> None:
        """End of a probe round: forget old tombstones, reshuffle (memberlist's resetNodes)."""
        self._purge_tombstones(now)
        self._rng.shuffle(self._ring)

    def _start_probe(self, now: float, out: list[Outgoing]) -> None:
        if self._leaving:
            return
        cfg = self.config
        target = self._next_probe_target(now)
        if target is None:
            self._timers.set("probe", now + cfg.probe_interval)
            return
        seq = self._next_seq()
        probe = _Probe(seq=seq, node=target.node, incarnation=target.incarnation, start=now)
        self._waiters[seq] = probe
        blobs: list[tuple[str, bytes]] = []
        if self._lifeguard and target.state is SUSPECT:
            # Buddy system: tell the suspect directly, so it can refute at once.
            accuse = MemberUpdate(target, self._me)
            blobs.append(("member", self._codec.encode(accuse)))
        blobs.append(("ping", self._codec.encode(Ping(seq, target.node))))
        self._send((target.addr, target.port), blobs, out)
        self.stats["probe.sent"] += 1
        self._timers.set(("probe_timeout", seq), now + self._scaled(cfg.probe_timeout))
        self._timers.set(("probe_end", seq), now + self._scaled(cfg.probe_interval))

    def _on_ack(self, seq: int, out: list[Outgoing], now: float) -> None:
        w = self._waiters.get(seq)
        if isinstance(w, _Probe) and w.ended:  # too late: the probe has failed
            self.stats["drop.stale_ack"] += 1  # (kept: its nacks may still come)
            return
        w = self._waiters.pop(seq, None)
        if isinstance(w, _Probe):
            w.acked = True
            rtt = max(0.0, now - w.start)
            self.probe_rtt[bisect.bisect_left(PROBE_RTT_BUCKETS, rtt)] += 1
            self.probe_rtt_sum += rtt
            self._timers.cancel(("probe_timeout", seq))
            if self._lifeguard:
                self._awareness.apply(-1)
        elif isinstance(w, _Relay):
            self._timers.cancel(("relay", seq))
            self._send(w.requester, [("ack", self._codec.encode(Ack(w.orig_seq)))], out)
        else:
            self.stats["drop.stale_ack"] += 1

    def _probe_timeout(self, seq: int, now: float, out: list[Outgoing]) -> None:
        probe = self._waiters.get(seq)
        if not isinstance(probe, _Probe) or probe.acked:
            return
        target = self._members.get(probe.node)
        if target is None:
            return
        helpers = self._random_members(
            self.config.indirect_checks,
            lambda r: r.state is ALIVE and r.node != probe.node,
        )
        req = IndirectPing(
            seq=seq, target=probe.node, addr=target.addr, port=target.port, nack=self._lifeguard
        )
        blob = self._codec.encode(req)
        for h in helpers:
            self._send((h.addr, h.port), [("ping_req", blob)], out)
        probe.expected_nacks = len(helpers) if self._lifeguard else 0
        self.stats["probe.indirect"] += 1
        if self.config.tcp_fallback_ping:
            # memberlist: also try the target over TCP; UDP alone may be what fails.
            ping = self._codec.encode(Ping(seq, probe.node))
            payload = self._codec.encode_packet(self.cluster, [ping])
            self._count_out("ping", payload, reliable=True)
            out.append(Outgoing((target.addr, target.port), payload, True))

    def _probe_end(self, seq: int, now: float, out: list[Outgoing]) -> None:
        self._timers.cancel(("probe_timeout", seq))
        probe = self._waiters.pop(seq, None)
        if isinstance(probe, _Probe) and not probe.acked:
            self.stats["probe.failed"] += 1
            if self._lifeguard:
                # Missed nacks mean *we* may be the problem (Lifeguard); without
                # helpers a failed probe counts against us by itself.
                if probe.expected_nacks > probe.nacks:
                    # A helper nacks one probe timeout after our request reached it,
                    # which with the default timings is just after this moment: wait
                    # a little for nacks still on the wire before counting them as
                    # missed (memberlist counts at once, so a healthy node that
                    # probes a dead one usually takes +3 and slows its probing 4x).
                    probe.ended = True
                    self._waiters[seq] = probe
                    self._timers.set(("nack_grace", seq), now + self._nack_grace)
                elif probe.expected_nacks == 0:
                    self._awareness.apply(1)
            cur = self._members.get(probe.node)
            if cur is not None and _live(cur.state) and cur.incarnation == probe.incarnation:
                self._apply(attrs.evolve(cur, state=SUSPECT), self._me, now, gossip=True)
        self._start_probe(now, out)

    def _nack_grace_end(self, seq: int) -> None:
        probe = self._waiters.pop(seq, None)
        if isinstance(probe, _Probe):
            self._awareness.apply(probe.expected_nacks - min(probe.nacks, probe.expected_nacks))

    def _relay_timeout(self, seq: int, out: list[Outgoing]) -> None:
        w = self._waiters.pop(seq, None)
        if isinstance(w, _Relay) and w.nack:
            self._send(w.requester, [("nack", self._codec.encode(Nack(w.orig_seq)))], out)

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

    # ------------------------------------------------------------- gossip

    def _gossip(self, now: float, out: list[Outgoing]) -> None:
        if not self._queue:
            return
        dead_time = self.config.gossip_to_the_dead_time
        dead_since = self._dead_since

        def eligible(r: m.Member) -> bool:
            if _live(r.state):
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

    # ------------------------------------------------------- state merge

    def _apply(
        self,
        rec: m.Member,
        accuser: NodeId,
        now: float,
        *,
        gossip: bool,
        quiet: bool = False,
        blob: bytes | None = None,
    ) -> None:
        """Merge one member record (the lattice join of gossip.merge_member) and act on it."""
        node = rec.node
        if node == self._me:
            self._apply_self(rec, accuser, now)
            return
        cur = self._members.get(node)
        if cur is rec and rec.state is not SUSPECT:
            return  # the very record we hold (decodes are shared through the codec cache)
        if cur is not None:
            kr, kc = g.record_key(rec), g.record_key(cur)
            if kr < kc:
                self.stats["merge.stale"] += 1
                return
            if kr == kc:
                if rec.cluster == cur.cluster:
                    # Same content: keep the incoming object, so that records shared
                    # through the codec cache hit the identity test above next time.
                    self._members[node] = rec
                if rec.state is SUSPECT:
                    s = self._suspicions.get(node)
                    if s is not None and s.confirm(accuser):
                        self.stats["suspect.confirmed"] += 1
                        self._timers.set(("suspect", node), max(now, s.deadline))
                        if gossip:
                            self._enqueue_member(rec, accuser, blob)
                return
        if rec.cluster != self.cluster:
            rec = attrs.evolve(rec, cluster=self.cluster)
        self._set_member(cur, rec, accuser, now, quiet)
        if gossip:
            self._enqueue_member(rec, accuser, blob)

    def _set_member(
        self, cur: m.Member | None, rec: m.Member, accuser: NodeId, now: float, quiet: bool
    ) -> None:
        node = rec.node
        self._members[node] = rec
        if cur is None:
            ring = self._ring
            ring.append(node)
            if not self._rotating:  # at a random place in the probe order, as memberlist
                j = self._rng.randrange(len(ring))
                ring[-1], ring[j] = ring[j], ring[-1]
        was_live = cur is not None and _live(cur.state)
        is_live = _live(rec.state)
        if was_live != is_live:
            self._n_live += 1 if is_live else -1
            if self._rotating:
                self._reorder(node, is_live)
        if is_live:
            self._dead_since.pop(node, None)
        elif cur is None or _live(cur.state) or cur.state is not rec.state:
            self._dead_since[node] = now
        if rec.state is SUSPECT:
            s = self._suspicions.get(node)
            if s is None or s.incarnation != rec.incarnation:
                self._start_suspicion(rec, accuser, now)
        elif node in self._suspicions:
            del self._suspicions[node]
            self._timers.cancel(("suspect", node))
            self._deferrals.pop(("suspect", node), None)
        if not is_live:
            self._load.pop(node, None)
            self._queue.remove(("l", node))
        if quiet:
            return
        ev = self._events
        if is_live and not was_live:
            ev.append(MemberEvent(EventKind.JOINED, rec, now))
            if rec.state is SUSPECT:
                ev.append(MemberEvent(EventKind.SUSPECT, rec, now))
        elif is_live:
            assert cur is not None
            if cur.state is not rec.state:
                kind = EventKind.SUSPECT if rec.state is SUSPECT else EventKind.ALIVE
                ev.append(MemberEvent(kind, rec, now))
            elif (cur.addr, cur.port) != (rec.addr, rec.port):
                ev.append(MemberEvent(EventKind.UPDATED, rec, now))
        elif cur is not None and (was_live or cur.state is not rec.state):
            kind = EventKind.LEFT if rec.state is LEFT else EventKind.DEAD
            ev.append(MemberEvent(kind, rec, now))

    def _start_suspicion(self, rec: m.Member, accuser: NodeId, now: float) -> None:
        cfg = self.config
        n = self._n_live
        k = cfg.suspicion_mult - 2 if self._lifeguard else 0
        if n - 2 < k:
            k = 0
        lo = suspicion_timeout(cfg.suspicion_mult, n, cfg.probe_interval)
        hi = cfg.suspicion_max_timeout_mult * lo if self._lifeguard else lo
        s = Suspicion.new(
            accuser=accuser,
            start=now,
            k=k,
            min_timeout=lo,
            max_timeout=hi,
            incarnation=rec.incarnation,
        )
        self._suspicions[rec.node] = s
        self._timers.set(("suspect", rec.node), s.deadline)

    def _suspicion_expired(self, node: NodeId, now: float) -> None:
        s = self._suspicions.pop(node, None)
        cur = self._members.get(node)
        if s is None or cur is None or cur.state is not SUSPECT:
            return
        if cur.incarnation != s.incarnation:
            return
        self.stats["declared.dead"] += 1
        self._apply(attrs.evolve(cur, state=DEAD), self._me, now, gossip=True)

    def _apply_self(self, rec: m.Member, accuser: NodeId, now: float) -> bool:
        """Somebody told us about ourselves. Returns True if we had to refute."""
        me = self._members[self._me]
        if self._leaving:
            return False
        if rec.incarnation < me.incarnation:
            if rec.state is not ALIVE:
                self._stale_accusation = True  # receive() answers the sender
            return False
        if rec.state is ALIVE and (rec.addr, rec.port) == (me.addr, me.port):
            # Our own news, or a previous life of ours at this address: that record
            # is exactly what we would say, so adopt its incarnation (out-bidding it
            # would make the result depend on the order records arrive in).
            if rec.incarnation > me.incarnation:
                self._members[self._me] = attrs.evolve(me, incarnation=rec.incarnation)
            return False
        # An accusation, or somebody else claiming our id: out-bid it.
        inc = max(me.incarnation, rec.incarnation) + 1
        if self._lifeguard and rec.state is not ALIVE:
            self._awareness.apply(1)
        me = attrs.evolve(me, incarnation=inc, state=ALIVE)
        self._members[self._me] = me
        self._enqueue_member(me, "")
        self.stats["refute"] += 1
        self._refuted = True
        return True

    # ------------------------------------------------------------- load

    def _on_load(self, r: m.LoadReport, now: float, *, relay_blob: bytes | None) -> None:
        node = r.node
        if node == self._me:
            # A report of ours from a previous life: publish above it from now on.
            self._load_version = max(self._load_version, r.version)
            return
        rec = self._members.get(node)
        if rec is None or not _live(rec.state):
            self.stats["drop.load_not_member"] += 1
            return
        cur = self._load.get(node)
        if cur is not None and r.version <= cur.report.version:
            self.stats["load.stale"] += 1
            return
        self._load[node] = LoadEntry(r, now)
        if self.config.load_events:
            self._events.append(LoadUpdated(r, now))
        if relay_blob is not None:
            q = self._queue
            q.enqueue(
                ("l", node),
                relay_blob,
                kind="load",
                tier=g.LOAD_TIER,
                mult=self.config.load_retransmit_mult,
            )
            cap = self.config.load_queue_max
            if q.tier_len(g.LOAD_TIER) > cap + cap // 8:  # prune in batches
                self.stats["load.pruned"] += q.prune(g.LOAD_TIER, cap)

    # -------------------------------------------------------------- app

    def _on_app(self, msg: AppBroadcast, blob: bytes, now: float) -> None:
        if msg.origin == self._me:
            return
        k = (msg.origin, msg.key)
        v = (msg.incarnation, msg.seq)
        seen = self._app_seen.get(k)
        if seen is not None and v <= seen:
            self.stats["app.duplicate"] += 1
            return
        if seen is None and len(self._app_seen) >= _APP_SEEN_MAX:
            del self._app_seen[next(iter(self._app_seen))]
        self._app_seen[k] = v
        self._events.append(AppMessage(msg.origin, msg.key, msg.payload, now))
        self._queue.enqueue(
            ("x", msg.origin, msg.key),
            blob,
            kind="app",
            tier=g.APP_TIER,
            mult=self.config.retransmit_mult,
        )

    # -------------------------------------------------------- push-pull

    def _push_pull_payload(
        self, now: float, *, reply: bool, join: bool, heal: bool, peer: NodeId | None
    ) -> bytes | None:
        """Our full state. Tombstones go along while they are recent (or all of them to
        heal a partition), and always the peer's own, so a restarted peer learns it."""
        window = self.config.gossip_to_the_dead_time
        me = self._members[self._me]
        recs: list[m.Member] = []
        for node, rec in self._members.items():
            if node == self._me:
                continue
            if (
                _live(rec.state)
                or heal
                or node == peer
                or now - self._dead_since.get(node, now) <= window
            ):
                recs.append(rec)
        loads = [e.report for e in self._load.values()]
        if self._own_load is not None:
            loads.append(self._own_load.report)
        for with_loads in (True, False):
            blob = self._codec.encode_push_pull(
                me,
                recs,
                loads if with_loads else (),
                app_state=self._app_state,
                reply=reply,
                join=join,
                heal=heal,
            )
            payload = self._codec.encode_packet(self.cluster, [blob])
            if len(payload) <= self.config.max_reliable_size:
                return payload
            self.stats["push_pull.too_large"] += 1
        return None

    def _periodic_push_pull(self, now: float, out: list[Outgoing]) -> None:
        if self._leaving:
            return
        peers = self._random_members(1, lambda r: r.state is ALIVE)
        if not peers:
            return
        p = peers[0]
        payload = self._push_pull_payload(now, reply=False, join=False, heal=False, peer=p.node)
        if payload is not None:
            self._count_out("push_pull", payload, reliable=True)
            out.append(Outgoing((p.addr, p.port), payload, True))

    def _reconnect(self, now: float, out: list[Outgoing]) -> None:
        """Beyond memberlist (Serf does this): try a random dead member, to heal partitions."""
        if self._leaving:
            return
        dead = [n for n, r in self._members.items() if r.state is DEAD]
        if not dead:
            return
        rec = self._members[self._rng.choice(dead)]
        payload = self._push_pull_payload(now, reply=False, join=False, heal=True, peer=rec.node)
        if payload is not None:
            self.stats["reconnect"] += 1
            self._count_out("push_pull", payload, reliable=True)
            out.append(Outgoing((rec.addr, rec.port), payload, True))

    def _on_push_pull(self, pp: PushPull, now: float, out: list[Outgoing]) -> None:
        sender = pp.sender
        if sender.node == self._me:
            self.stats["drop.push_pull_self"] += 1
            return
        self._refuted = False
        self._apply(sender, sender.node, now, gossip=True)
        for rec in pp.members:
            if rec.node == sender.node:
                continue
            # Re-gossip what changes a record we knew; a record new to us is
            # most likely old news to everyone else (a joiner learning the cluster).
            known = rec.node in self._members
            self._apply(g.soften(rec), sender.node, now, gossip=known)
        for r in pp.loads:
            self._on_load(r, now, relay_blob=None)
        if pp.app_state is not None:
            self._events.append(AppState(sender.node, pp.app_state, now))
        dest = (sender.addr, sender.port)
        self._joined = True
        if pp.reply:
            if self._refuted:
                # The peer believes we are dead: tell it our refutation directly,
                # do not leave it to chance which node gossips to whom.
                me = self._members[self._me]
                self._send(dest, [("member", self._codec.encode(MemberUpdate(me)))], out)
        else:
            payload = self._push_pull_payload(
                now, reply=True, join=pp.join, heal=pp.heal, peer=sender.node
            )
            if payload is not None:
                self._count_out("push_pull", payload, reliable=True)
                out.append(Outgoing(dest, payload, True))


# Upper bounds (seconds) of the probe round-trip histogram's buckets.
PROBE_RTT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

_IN_KEYS = {t: ("in." + k, "in." + k + ".bytes") for t, k in MESSAGE_KIND.items()}
_OUT_KEYS = {k: ("out." + k, "out." + k + ".bytes") for k in MESSAGE_KIND.values()}


def _accuses(key: Hashable) -> bool:
    return isinstance(key, tuple) and key[0] in ("probe_end", "suspect")


def _next_period(due: float, interval: float, now: float) -> float:
    """Next tick of a periodic timer; missed ticks are dropped, like a Go ticker."""
    nxt = due + interval
    return nxt if nxt > now else now + interval
