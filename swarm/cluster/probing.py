"""Failure detection: whom to probe each interval, the direct ping, the indirect
probe through helpers (with Lifeguard's nacks and memberlist's TCP fallback ping),
relaying other members' ping-reqs, and turning a failed probe into a suspicion.

Two probe orders: memberlist's per-node shuffled walk, and the default "rotating"
order (a shared order by `ring_key`, every member probed once per wall-clock round;
see `swarm.cluster.membership`).
"""

from __future__ import annotations

import bisect

import attrs

from swarm import model as m

from .member_merge import MemberMerge
from .membership_events import (
    Outgoing,
)
from .membership_state import (
    ALIVE,
    PROBE_RTT_BUCKETS,
    SUSPECT,
    PendingProbe,
    PendingRelay,
    is_live_state,
    ring_key,
)
from .messages import (
    Ack,
    IndirectPing,
    MemberUpdate,
    Nack,
    Ping,
)


class Probing(MemberMerge):
    """The probe side of SWIM: targets, pings, timeouts, relays and local health."""

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
            if rec is not None and is_live_state(rec.state):
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
        return rec if rec is not None and is_live_state(rec.state) else None

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
        probe = PendingProbe(seq=seq, node=target.node, incarnation=target.incarnation, start=now)
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
        if isinstance(w, PendingProbe) and w.ended:  # too late: the probe has failed
            self.stats["drop.stale_ack"] += 1  # (kept: its nacks may still come)
            return
        w = self._waiters.pop(seq, None)
        if isinstance(w, PendingProbe):
            w.acked = True
            rtt = max(0.0, now - w.start)
            self.probe_rtt[bisect.bisect_left(PROBE_RTT_BUCKETS, rtt)] += 1
            self.probe_rtt_sum += rtt
            self._timers.cancel(("probe_timeout", seq))
            if self._lifeguard:
                self._awareness.apply(-1)
        elif isinstance(w, PendingRelay):
            self._timers.cancel(("relay", seq))
            self._send(w.requester, [("ack", self._codec.encode(Ack(w.orig_seq)))], out)
        else:
            self.stats["drop.stale_ack"] += 1

    def _probe_timeout(self, seq: int, now: float, out: list[Outgoing]) -> None:
        probe = self._waiters.get(seq)
        if not isinstance(probe, PendingProbe) or probe.acked:
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
        if isinstance(probe, PendingProbe) and not probe.acked:
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
            if (
                cur is not None
                and is_live_state(cur.state)
                and cur.incarnation == probe.incarnation
            ):
                self._apply(attrs.evolve(cur, state=SUSPECT), self._me, now, gossip=True)
        self._start_probe(now, out)

    def _nack_grace_end(self, seq: int) -> None:
        probe = self._waiters.pop(seq, None)
        if isinstance(probe, PendingProbe):
            self._awareness.apply(probe.expected_nacks - min(probe.nacks, probe.expected_nacks))

    def _relay_timeout(self, seq: int, out: list[Outgoing]) -> None:
        w = self._waiters.pop(seq, None)
        if isinstance(w, PendingRelay) and w.nack:
            self._send(w.requester, [("nack", self._codec.encode(Nack(w.orig_seq)))], out)
