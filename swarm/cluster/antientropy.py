"""Anti-entropy: push-pull of the full state over a reliable stream.

Used to join (push-pull with each seed), every push_pull_interval with a random
member, and beyond memberlist to heal partitions (push-pull with a random dead
member every reconnect_interval, tombstones included). `bootstrap` installs a known
view without any exchange (a warm start, or the simulator's large converged
clusters).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from swarm import model as m

from . import gossip as g
from .appgossip import AppGossip
from .member_merge import MemberMerge
from .membership_events import (
    Addr,
    AppState,
    NodeId,
    Outgoing,
)
from .membership_state import (
    ALIVE,
    DEAD,
    is_live_state,
    ring_key,
)
from .messages import (
    MemberUpdate,
    PushPull,
)


class AntiEntropy(MemberMerge, AppGossip):
    """Joining, periodic and healing push-pulls, and bootstrapping a known view."""

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
                is_live_state(rec.state)
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
