"""Drives the pure membership core over the real transport, with discovery.

The membership core (swarm.cluster.membership) decides; this adapter feeds it
packets and the clock, sends what it returns, joins seeds and mDNS-discovered peers
(with backoff), keeps a snapshot of known peers so a restarted agent rejoins without
discovery, and serves peer RPCs (handoff, probes, logs...) on the same port (the RPC
client and server are in `peerrpc.py`; `ClusterNode` inherits them).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from .. import model as m
from ..cluster.membership import (
    AppMessage,
    AppState,
    Event,
    LoadUpdated,
    MemberEvent,
    Membership,
    MembershipConfig,
    Outgoing,
)
from ..crypto import Keyring, Sealer
from ..logs import NULL_LOG, EventLog
from ..node.config import Profile
from .clock import Clock
from .discovery import (
    DiscoveredPeer,
    JoinBackoff,
    load_peers,
    open_discovery,
    parse_seeds,
    save_peers,
)
from .net import (
    Addr,
    FaultShim,
    FramedStream,
    Transport,
    TransportConfig,
    TransportError,
    open_transport,
)
from .peerrpc import PeerRpc, RemoteError, RpcHandler


class ClusterError(Exception):
    pass


class ClusterNode(PeerRpc):
    """One node's part in the cluster: drives the membership core over the transport
    (packets in, timers, packets out, events to its listeners), joins seeds, snapshot
    peers and mDNS-discovered ones, and serves and sends peer RPCs (`PeerRpc`)."""

    def __init__(
        self,
        *,
        node: m.NodeId,
        cluster: str,
        bind: str,
        port: int,
        advertise: str | None,
        seeds: list[str],
        mdns: bool,
        mdns_interfaces: list[str],
        keyring: Keyring | None,
        profile: Profile,
        state_dir: Path,
        clock: Clock,
        faults: str | None = None,
        log: EventLog = NULL_LOG,
        rng: random.Random | None = None,
    ) -> None:
        self.node = node
        self.clock = clock
        self.cluster = cluster
        self.bind = bind
        self.port = port
        self.advertise_host = advertise
        self.seed_addrs = parse_seeds(",".join(seeds)) if seeds else []
        self.mdns = mdns
        self.mdns_interfaces = mdns_interfaces
        self.keyring = keyring
        self.profile = profile
        self.snapshot_path = state_dir / "peers.json"
        self.faults = FaultShim.parse(faults) if faults else None
        self.log = log
        self.rng = rng or random.Random()
        self.transport: Transport | None = None
        self.membership: Membership | None = None
        self.rpc: dict[str, RpcHandler] = {}
        self._app_parts: dict[str, Any] = {}  # the push-pull state, by key
        self._listeners: list[Callable[[Event], None]] = []  # membership events
        self._wake = trio.Event()
        self._send_q_send, self._send_q_recv = trio.open_memory_channel[Outgoing](10_000)
        self.counters: dict[str, int] = {"rpc_in": 0, "rpc_errors": 0, "joins": 0, "discovered": 0}
        self.joined_event = trio.Event()
        self._pool: dict[Addr, list[FramedStream]] = {}

    # ------------------------------------------------------------------ run

    def config(self) -> MembershipConfig:
        return self.profile.membership

    @property
    def addr(self) -> Addr:
        assert self.transport is not None
        return self.transport.advertise

    def subscribe(self, listener: Callable[[Event], None]) -> None:
        """Hear every membership event (joins, deaths, load reports, app messages)."""
        self._listeners.append(listener)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sealer = None if self.keyring is None else Sealer(self.keyring, self.cluster)
        tconf = TransportConfig(
            cluster=self.cluster,
            bind_host=self.bind,
            port=self.port,
            advertise_host=self.advertise_host,
        )
        async with open_transport(
            tconf,
            sealer,
            faults=self.faults,
            on_packet=self._on_packet,
            stream_handler=self._serve,
            clock=self.clock,
        ) as t:
            self.transport = t
            host, port = t.advertise
            me = m.Member(
                node=self.node,
                addr=host,
                port=port,
                cluster=self.cluster,
                incarnation=int(self.clock.wall()),
            )
            now = self.clock.now()
            # rotating probe order: rounds are numbered by the wall clock (NTP-shared)
            self.membership = Membership(
                self.config(), me, self.rng, now, wall_offset=self.clock.wall() - now
            )
            self.log.info("cluster.listening", addr=f"{host}:{port}", encrypted=sealer is not None)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._tick_loop)
                nursery.start_soon(self._send_loop)
                nursery.start_soon(self._join_loop)
                nursery.start_soon(self._snapshot_loop)
                nursery.start_soon(self._drop_monitor)
                if self.mdns:
                    nursery.start_soon(self._discovery_loop, host, port)
                task_status.started()
                await trio.sleep_forever()

    async def leave(self, timeout: float = 2.0) -> None:
        """Gossip a graceful leave and give it a moment to spread."""
        ms = self.membership
        if ms is None:
            return
        self._dispatch(ms.leave(self.clock.now()))
        with trio.move_on_after(timeout):
            while not ms.leave_complete and ms.num_live > 0:
                await trio.sleep(0.05)
        self._save_snapshot()

    # ------------------------------------------------------------ membership

    def _on_packet(self, src: Addr, payload: bytes, reliable: bool) -> None:
        ms = self.membership
        if ms is None:
            return
        out = ms.receive(src, payload, self.clock.now(), reliable)
        self._dispatch(out)
        self._drain_events()
        self._wake.set()

    def _dispatch(self, out: list[Outgoing]) -> None:
        for o in out:
            try:
                self._send_q_send.send_nowait(o)
            except trio.WouldBlock:
                self.counters["send_queue_full"] = self.counters.get("send_queue_full", 0) + 1

    def _drain_events(self) -> None:
        ms = self.membership
        if ms is None:
            return
        for ev in ms.poll_events():
            if isinstance(ev, MemberEvent):
                self.log.info(
                    "member." + ev.kind.value,
                    peer=ev.member.node,
                    addr=f"{ev.member.addr}:{ev.member.port}",
                    incarnation=ev.member.incarnation,
                )
                if not self.joined_event.is_set() and ev.member.node != self.node:
                    self.joined_event.set()
            try:
                for listen in self._listeners:
                    listen(ev)
            except Exception as e:  # a bug in a handler must not stop membership
                self.log.exception("cluster.event_handler_failed", e)

    async def _tick_loop(self) -> None:
        ms = self.membership
        assert ms is not None
        while True:
            now = self.clock.now()
            # follow wall-clock steps (NTP) so probe rounds stay aligned with peers':
            # the clock's offset, re-taken by its resync (the coordinator's report loop)
            ms.wall_offset = self.clock.offset
            self._dispatch(ms.tick(now))
            self._drain_events()
            delay = max(0.005, min(0.5, ms.next_deadline() - self.clock.now()))
            with trio.move_on_after(delay):
                await self._wake.wait()
            self._wake = trio.Event()

    async def _send_loop(self) -> None:
        t = self.transport
        assert t is not None
        async with trio.open_nursery() as nursery:
            async for o in self._send_q_recv:
                if o.reliable:
                    nursery.start_soon(self._send_reliable, o)
                else:
                    try:
                        await t.send_packet(o.dest, o.payload)
                    except TransportError as e:
                        self.log.debug(
                            "cluster.send_failed", dest=f"{o.dest[0]}:{o.dest[1]}", error=str(e)
                        )

    async def _send_reliable(self, o: Outgoing) -> None:
        assert self.transport is not None
        try:
            await self.transport.send_reliable(o.dest, o.payload, timeout=5.0)
        except TransportError as e:
            self.log.debug("cluster.reliable_failed", dest=f"{o.dest[0]}:{o.dest[1]}", error=str(e))

    def reload_keyring(self, keyring: Keyring) -> None:
        """New keys for everything sent from now on; all of them open what arrives."""
        self.keyring = keyring
        if self.transport is not None and self.transport.sealer is not None:
            self.transport.sealer.reload(keyring)

    def set_local_load(self, report: m.LoadReport) -> None:
        if self.membership is not None:
            self.membership.set_local_load(report, self.clock.now())
            self._wake.set()

    def broadcast_app(self, key: str, payload: dict[str, Any]) -> None:
        if self.membership is not None:
            self.membership.broadcast_app(key, payload)
            self._wake.set()

    def set_app_state(self, obj: dict[str, Any] | None) -> None:
        """Replace the whole state carried in every push-pull."""
        self._app_parts = {} if obj is None else dict(obj)
        if self.membership is not None:
            self.membership.set_app_state(obj)

    def set_app_state_part(self, key: str, obj: Any) -> None:
        """Set (None: remove) one key of the push-pull state, keeping the others: the
        global task set and each elastic pool's lease share it."""
        if obj is None:
            self._app_parts.pop(key, None)
        else:
            self._app_parts[key] = obj
        if self.membership is not None:
            self.membership.set_app_state(dict(self._app_parts) or None)

    # ------------------------------------------------------------- joining

    def _known_addrs(self) -> set[Addr]:
        ms = self.membership
        if ms is None:
            return set()
        return {(mb.addr, mb.port) for mb in ms.members()}

    def join(self, addrs: list[Addr]) -> None:
        ms = self.membership
        if ms is None or not addrs:
            return
        self.counters["joins"] += 1
        self._dispatch(ms.join(addrs, self.clock.now()))

    async def _join_loop(self) -> None:
        """Join seeds and snapshot peers until someone answers; then keep quiet."""
        snap, warning = load_peers(self.snapshot_path)
        if warning:
            self.log.warning("cluster.snapshot", warning=warning)
        targets = list(self.seed_addrs) + [(p.addr, p.port) for p in snap if p.node != self.node]
        if not targets:
            return
        backoff = JoinBackoff(self.rng, base=self.profile.join_backoff_base, cap=30.0)
        while True:
            ms = self.membership
            assert ms is not None
            if ms.num_live > 1:
                # connected; still make sure every seed is known (partition healing)
                missing = [a for a in self.seed_addrs if a not in self._known_addrs()]
                if missing:
                    self.join(missing)
                await trio.sleep(30.0)
                continue
            self.join(targets)
            await trio.sleep(backoff.next_delay())

    async def _discovery_loop(self, host: str, port: int) -> None:
        seen: set[tuple[str, str, int]] = set()
        try:
            async with open_discovery(
                node=self.node,
                cluster=self.cluster,
                host=host,
                port=port,
                interfaces=self.mdns_interfaces or None,
            ) as d:
                async for peer in d.peers:
                    key = (peer.node, peer.addr, peer.port)
                    if key in seen and (peer.addr, peer.port) in self._known_addrs():
                        continue
                    seen.add(key)
                    self.counters["discovered"] += 1
                    self.log.info(
                        "cluster.discovered", peer=peer.node, addr=f"{peer.addr}:{peer.port}"
                    )
                    self.join([(peer.addr, peer.port)])
        except (OSError, ValueError) as e:
            self.log.warning("cluster.mdns_unavailable", error=str(e))

    async def _drop_monitor(self) -> None:
        """Say (once per interval, not per packet) when peers' packets are refused, and
        why: the operator's first clue to a wrong key or a foreign cluster."""
        hints = {
            "decrypt": "wrong cluster key, or a node of another cluster",
            "other_cluster": "a node of another cluster",
            "mode": "an insecure node talking to secure ones (or the reverse)",
            "replay": "replayed or duplicated packets",
            "stale": "clock skew or replayed packets",
            "ratelimit": "a flood of packets from unknown senders (dropped before decryption)",
            "evicted": "TCP connections that never authenticated, closed to make room",
            "rejected": "TCP connections refused: every slot holds an authenticated peer",
        }
        seen: dict[str, int] = {}
        while True:
            await trio.sleep(self.profile.refused_report_interval)
            t = self.transport
            if t is None:
                continue
            for reason, hint in hints.items():
                n = t.counters.get("dropped_" + reason, t.counters.get("tcp_conns_" + reason, 0))
                if n > seen.get(reason, 0):
                    src = t.last_drop.get(reason)
                    self.log.warning(
                        "cluster.packets_refused",
                        reason=reason,
                        count=n - seen.get(reason, 0),
                        last_from="-" if src is None else f"{src[0]}:{src[1]}",
                        hint=hint,
                    )
                    seen[reason] = n

    async def _snapshot_loop(self) -> None:
        while True:
            await trio.sleep(self.profile.snapshot_interval)
            self._save_snapshot()

    def _save_snapshot(self) -> None:
        ms = self.membership
        if ms is None:
            return
        peers = [
            DiscoveredPeer(mb.node, mb.addr, mb.port, self.cluster)
            for mb in ms.alive_members()
            if mb.node != self.node
        ]
        try:
            save_peers(self.snapshot_path, peers)
        except OSError as e:
            self.log.warning("cluster.snapshot_failed", error=str(e))


__all__ = [
    "AppMessage",
    "AppState",
    "ClusterError",
    "ClusterNode",
    "LoadUpdated",
    "MemberEvent",
    "RemoteError",
    "RpcHandler",
]
