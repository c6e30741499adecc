"""Load reports and application messages gossiped over the membership protocol.

Beyond memberlist's user broadcasts: every member publishes a versioned load report
(re-published every load_refresh_interval, relayed on its own tier of the
piggyback queue with a smaller share of each packet), and the application gossips
keyed messages (a newer one replaces an older one with the same key) plus a state
object that rides every push-pull.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from swarm import model as m

from . import gossip as g
from .membership_events import (
    AppMessage,
    LoadEntry,
    LoadUpdated,
)
from .membership_state import (
    MembershipState,
    is_live_state,
)
from .messages import (
    AppBroadcast,
    LoadUpdate,
    blob_overhead,
)

_APP_SEEN_MAX = 65536


class AppGossip(MembershipState):
    """Publishing and receiving load reports and app messages."""

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

    def _on_load(self, r: m.LoadReport, now: float, *, relay_blob: bytes | None) -> None:
        node = r.node
        if node == self._me:
            # A report of ours from a previous life: publish above it from now on.
            self._load_version = max(self._load_version, r.version)
            return
        rec = self._members.get(node)
        if rec is None or not is_live_state(rec.state):
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
