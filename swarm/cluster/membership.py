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

Where the parts live (one class, `Membership`, combines them; they share one
state, `membership_state.MembershipState`):

* membership_config.py: `MembershipConfig`; membership_events.py: `Outgoing` and
  the events; timers.py: the keyed timers.
* member_merge.py: merging records, suspicion, refutation.
* probing.py: probe targets, pings, indirect probes, relays.
* appgossip.py: load reports and app messages.
* antientropy.py: join, push-pull, reconnect, bootstrap.
* this module: the entry points (`tick`, `receive`, `leave`) and the dispatch of
  timers and messages to the parts.
"""

from __future__ import annotations

from collections.abc import Hashable

import attrs

from swarm import wire

from . import gossip as g
from .antientropy import AntiEntropy
from .membership_config import MembershipConfig
from .membership_events import (
    Addr,
    AppMessage,
    AppState,
    Event,
    EventKind,
    LoadEntry,
    LoadUpdated,
    MemberEvent,
    NodeId,
    Outgoing,
)
from .membership_state import (
    ALIVE,
    DEAD,
    LEFT,
    PROBE_RTT_BUCKETS,
    SUSPECT,
    PendingProbe,
    PendingRelay,
    ring_key,
)
from .messages import (
    MESSAGE_KIND,
    Ack,
    AppBroadcast,
    IndirectPing,
    LoadUpdate,
    MemberUpdate,
    Message,
    Nack,
    Ping,
    PushPull,
)
from .probing import Probing

__all__ = [
    "ALIVE",
    "DEAD",
    "LEFT",
    "MAX_UDP_PAYLOAD",
    "PROBE_RTT_BUCKETS",
    "SUSPECT",
    "Addr",
    "AppMessage",
    "AppState",
    "Event",
    "EventKind",
    "LoadEntry",
    "LoadUpdated",
    "MemberEvent",
    "Membership",
    "MembershipConfig",
    "NodeId",
    "Outgoing",
    "ring_key",
]

MAX_UDP_PAYLOAD = 65507
_MAX_DEFERRALS = 2


class Membership(Probing, AntiEntropy):
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
            if reliable and isinstance(self._waiters.get(msg.seq), PendingProbe):
                self.stats["probe.tcp_ack"] += 1
            self._on_ack(msg.seq, out, now)
        elif isinstance(msg, Nack):
            w = self._waiters.get(msg.seq)
            if isinstance(w, PendingProbe):
                w.nacks += 1
            else:
                self.stats["drop.stale_nack"] += 1
        elif isinstance(msg, IndirectPing):
            seq = self._next_seq()
            self._waiters[seq] = PendingRelay(requester=src, orig_seq=msg.seq, nack=msg.nack)
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


_IN_KEYS = {t: ("in." + k, "in." + k + ".bytes") for t, k in MESSAGE_KIND.items()}


def _accuses(key: Hashable) -> bool:
    return isinstance(key, tuple) and key[0] in ("probe_end", "suspect")


def _next_period(due: float, interval: float, now: float) -> float:
    """Next tick of a periodic timer; missed ticks are dropped, like a Go ticker."""
    nxt = due + interval
    return nxt if nxt > now else now + interval
