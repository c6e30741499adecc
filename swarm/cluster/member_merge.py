"""Merging member records, and the suspicion lifecycle that follows from them.

Every record the node hears of (gossip, push-pull, its own probe failures, expired
suspicions) goes through `_apply`: the lattice join of `gossip.merge_member`, then
the side effects of a change (the probe ring and order, tombstones, events). A
suspect record starts a Lifeguard suspicion whose timeout shrinks as independent
accusers confirm it; an accusation of this node is refuted with a higher
incarnation. All of it in one place because the order of those effects is the
protocol.
"""

from __future__ import annotations

import bisect

import attrs

from swarm import model as m

from . import gossip as g
from .lifeguard import Suspicion, suspicion_timeout
from .membership_events import (
    EventKind,
    MemberEvent,
    NodeId,
)
from .membership_state import (
    ALIVE,
    DEAD,
    LEFT,
    SUSPECT,
    MembershipState,
    is_live_state,
    ring_key,
)


class MemberMerge(MembershipState):
    """Record merge, suspicion (Lifeguard's dynamic timeout) and refutation."""

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
        was_live = cur is not None and is_live_state(cur.state)
        is_live = is_live_state(rec.state)
        if was_live != is_live:
            self._n_live += 1 if is_live else -1
            if self._rotating:
                self._reorder(node, is_live)
        if is_live:
            self._dead_since.pop(node, None)
        elif cur is None or is_live_state(cur.state) or cur.state is not rec.state:
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
