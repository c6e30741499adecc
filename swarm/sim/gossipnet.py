"""A deterministic discrete-event network hosting many `Membership` cores in one process.

Everything is driven by one event heap and one seeded `random.Random`, so a run is
reproducible bit for bit. Time is simulated seconds (`net.now`); nothing sleeps.

The network models what the membership protocol has to survive:

* per-packet latency (any distribution: a function of the rng), random loss of
  datagrams, reliable payloads modelled as TCP (every leg of the handshake and the
  data may be lost and is then resent after a retransmission timeout, so loss shows
  up as delay; a connection fails after 5 resends of one leg), partitions (groups
  that cannot reach each other, both kinds of traffic) and heal;
* node faults: `kill` (the process is gone: nothing runs, packets to it vanish),
  `stall` (the process is frozen, as under CPU starvation: its timers do not fire
  and packets queue up; on resume it sees late timers and a backlog), `leave`, and
  `restart` (a new process under the same id and address);
* byte and packet counters per node (UDP and reliable separately).

Typical use::

    net = GossipNet(seed=1, config=MembershipConfig.local())
    nodes = net.bootstrap(200)               # a converged cluster, instantly
    newcomer = net.add_node(); net.join(newcomer.id, [nodes[0].id])
    net.kill(nodes[5].id)
    net.run_for(30.0)
    assert net.converged()

Observers (`net.observers.append(fn)`) see every event every node emits as
``fn(node, event, now)``; events are drained after each call into a node, so
memory stays flat however long the run.

The simulator only uses the public API of `Membership` (plus `bootstrap`, a quiet
warm start), so whatever it shows holds for the real agent's core as well.
"""

from __future__ import annotations

import functools
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import attrs

from swarm import model as m
from swarm.cluster.membership import Addr, Membership, MembershipConfig, Outgoing
from swarm.cluster.messages import Codec

LatencyFn = Callable[[random.Random], float]
Observer = Callable[["SimNode", Any, float], None]


class Endpoint(Protocol):
    """What a node runs: any sans-IO core with this shape (Membership has it)."""

    def tick(self, now: float) -> list[Outgoing]: ...

    def receive(
        self, src: Addr, payload: bytes, now: float, reliable: bool = False
    ) -> list[Outgoing]: ...

    def next_deadline(self) -> float: ...

    def poll_events(self) -> Sequence[Any]: ...


EndpointFactory = Callable[[m.Member, random.Random, float], Endpoint]

_TICK = 0
_DELIVER = 1
_CALL = 2
_RESUME = 3


def uniform_latency(lo: float, hi: float) -> LatencyFn:
    """One-way delay uniform in [lo, hi] seconds."""
    return lambda rng: rng.uniform(lo, hi)


def lognormal_latency(median: float, sigma: float = 0.5) -> LatencyFn:
    """Long-tailed delay: lognormal with the given median (seconds)."""
    mu = math.log(median)
    return lambda rng: rng.lognormvariate(mu, sigma)


@attrs.define
class NodeCounters:
    udp_out_packets: int = 0
    udp_out_bytes: int = 0
    udp_in_packets: int = 0
    udp_in_bytes: int = 0
    tcp_out_payloads: int = 0
    tcp_out_bytes: int = 0
    tcp_in_payloads: int = 0
    tcp_in_bytes: int = 0
    lost: int = 0  # datagrams of ours the network dropped (loss, partition, dead peer)

    @property
    def out_bytes(self) -> int:
        return self.udp_out_bytes + self.tcp_out_bytes

    @property
    def in_bytes(self) -> int:
        return self.udp_in_bytes + self.tcp_in_bytes


@attrs.define(eq=False)
class SimNode:
    id: m.NodeId
    index: int
    addr: Addr
    endpoint: Endpoint
    alive: bool = True
    stalled_until: float = -math.inf
    resume_timers_first: bool = True
    backlog: deque[tuple[Addr, bytes, bool]] = attrs.field(factory=deque)
    tick_at: float = math.inf
    counters: NodeCounters = attrs.field(factory=NodeCounters)
    started_at: float = 0.0

    @property
    def membership(self) -> Membership:
        """The endpoint as a Membership (the default kind of node)."""
        if not isinstance(self.endpoint, Membership):
            raise TypeError(f"node {self.id} runs a {type(self.endpoint).__name__}")
        return self.endpoint


class GossipNet:
    """The simulated network. All times are simulated seconds."""

    def __init__(
        self,
        *,
        seed: int = 0,
        config: MembershipConfig | None = None,
        latency: LatencyFn | None = None,
        loss: float = 0.0,
        cluster: str = "sim",
        bandwidth: float = 125e6,
        codec_cache: int = 500_000,
        now: float = 0.0,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.config = config if config is not None else MembershipConfig.local()
        self.latency: LatencyFn = latency if latency is not None else uniform_latency(0.0005, 0.002)
        self.loss = loss
        self.cluster = cluster
        self.bandwidth = bandwidth
        self.codec = Codec(cache_size=codec_cache)
        self.now = now
        self.nodes: dict[m.NodeId, SimNode] = {}
        self.by_addr: dict[Addr, SimNode] = {}
        self.observers: list[Observer] = []
        self._group: dict[m.NodeId, int] = {}
        self._heap: list[tuple[float, int, int, object, object, object, object]] = []
        self._n = 0
        self._next_index = 0
        self.events_processed = 0
        self.dropped_loss = 0
        self.dropped_partition = 0
        self.dropped_dead = 0

    # --------------------------------------------------------------- nodes

    def _make_id(self, index: int) -> m.NodeId:
        return f"n{index:05d}"

    def add_node(
        self,
        node_id: m.NodeId | None = None,
        *,
        config: MembershipConfig | None = None,
        incarnation: int = 0,
        addr: Addr | None = None,
        factory: EndpointFactory | None = None,
    ) -> SimNode:
        """Create a node (not yet joined: see join / bootstrap). By default it runs a
        Membership; `factory(me, rng, now)` makes it run any other Endpoint."""
        index = self._next_index
        self._next_index += 1
        nid = node_id if node_id is not None else self._make_id(index)
        if nid in self.nodes and self.nodes[nid].alive:
            raise ValueError(f"node {nid} exists and is running")
        if addr is None:
            addr = (f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}", 7946)
        me = m.Member(
            node=nid, addr=addr[0], port=addr[1], incarnation=incarnation, cluster=self.cluster
        )
        rng = random.Random(f"{self.seed}:{nid}:{index}")
        ep: Endpoint
        if factory is not None:
            ep = factory(me, rng, self.now)
        else:
            ep = Membership(config or self.config, me, rng, self.now, codec=self.codec)
        node = SimNode(id=nid, index=index, addr=addr, endpoint=ep, started_at=self.now)
        self.nodes[nid] = node
        self.by_addr[addr] = node
        self._reschedule(node)
        return node

    def bootstrap(self, n: int, *, config: MembershipConfig | None = None) -> list[SimNode]:
        """n new nodes that already know each other (a converged cluster at once)."""
        nodes = [self.add_node(config=config) for _ in range(n)]
        view = [nd.membership.me for nd in nodes]
        for nd in nodes:
            nd.membership.bootstrap(view, self.now)
            self._reschedule(nd)
        return nodes

    def live_nodes(self) -> list[SimNode]:
        return [nd for nd in self.nodes.values() if nd.alive]

    def node(self, node_id: m.NodeId) -> SimNode:
        return self.nodes[node_id]

    # ------------------------------------------------------------- actions

    def join(self, node_id: m.NodeId, seeds: Sequence[m.NodeId]) -> None:
        node = self.nodes[node_id]
        out = node.membership.join([self.nodes[s].addr for s in seeds], self.now)
        self._after_call(node, out)

    def leave(self, node_id: m.NodeId) -> None:
        node = self.nodes[node_id]
        self._after_call(node, node.membership.leave(self.now))

    def kill(self, node_id: m.NodeId) -> None:
        """The process is gone: nothing runs any more, packets to it vanish."""
        node = self.nodes[node_id]
        node.alive = False
        node.backlog.clear()
        node.tick_at = math.inf

    def restart(
        self, node_id: m.NodeId, *, incarnation: int = 0, seeds: Sequence[m.NodeId] = ()
    ) -> SimNode:
        """A new process under the same id and address (after kill), then join seeds."""
        old = self.nodes[node_id]
        if old.alive:
            self.kill(node_id)
        del self.by_addr[old.addr]
        node = self.add_node(node_id, incarnation=incarnation, addr=old.addr)
        if seeds:
            self.join(node_id, seeds)
        return node

    def stall(self, node_id: m.NodeId, duration: float, *, timers_first: bool = True) -> None:
        """Freeze a node for `duration`: no ticks, inbound packets queue up.

        On resume the node first sees its (late) timers, then the backlog when
        `timers_first` (the pessimistic order, as a starved process may wake to a
        timer before it reads its socket), else the backlog first.
        """
        node = self.nodes[node_id]
        until = self.now + duration
        if until <= node.stalled_until:
            return
        node.stalled_until = until
        node.resume_timers_first = timers_first
        self._push(until, _RESUME, node, None, None, None)

    def starve(
        self,
        node_id: m.NodeId,
        duration: float,
        *,
        run_slice: float = 0.003,
        stall: tuple[float, float] = (0.1, 0.5),
        timers_first: bool = True,
    ) -> None:
        """CPU starvation for `duration`: the node runs for `run_slice` seconds at a time,
        between freezes of random length in `stall` (uniform). Replies to what it sends
        in a slice often arrive while it is frozen again, as on a starved host."""
        end = self.now + duration
        t = self.now
        while t < end:
            d = min(self.rng.uniform(*stall), end - t)
            self.at(t, functools.partial(self.stall, node_id, d, timers_first=timers_first))
            t += d + run_slice

    def partition(self, *groups: Iterable[m.NodeId]) -> None:
        """Nodes in different groups cannot reach each other; unlisted nodes form one
        more group of their own."""
        self._group = {}
        for i, grp in enumerate(groups, start=1):
            for nid in grp:
                self._group[nid] = i

    def heal(self) -> None:
        self._group = {}

    def at(self, when: float, fn: Callable[[], None]) -> None:
        """Run fn at simulated time `when` (use it to script faults mid-run)."""
        self._push(max(when, self.now), _CALL, fn, None, None, None)

    # ------------------------------------------------------------- running

    def run_until(self, t: float) -> None:
        heap = self._heap
        pop = heapq.heappop
        nodes_alive_check = self._deliver
        while heap and heap[0][0] <= t:
            when, _, kind, a, b, c, d = pop(heap)
            self.now = when
            self.events_processed += 1
            if kind == _TICK:
                node = a
                assert isinstance(node, SimNode)
                if not node.alive or node.tick_at != when or node.stalled_until > when:
                    continue
                node.tick_at = math.inf
                self._after_call(node, node.endpoint.tick(when))
            elif kind == _DELIVER:
                assert isinstance(a, SimNode)
                nodes_alive_check(a, b, c, d)  # type: ignore[arg-type]
            elif kind == _RESUME:
                assert isinstance(a, SimNode)
                self._resume(a)
            else:
                fn = a
                assert callable(fn)
                fn()
        self.now = max(self.now, t)

    def run_for(self, dt: float) -> None:
        self.run_until(self.now + dt)

    def run_until_true(
        self, pred: Callable[[], bool], timeout: float, *, check_every: float = 0.25
    ) -> bool:
        """Run until pred() holds (checked every `check_every` s) or `timeout` passes."""
        end = self.now + timeout
        while True:
            if pred():
                return True
            if self.now >= end:
                return False
            self.run_until(min(end, self.now + check_every))

    # --------------------------------------------------------------- views

    def view_of(self, node_id: m.NodeId) -> dict[m.NodeId, m.MemberState]:
        return {mb.node: mb.state for mb in self.nodes[node_id].membership.members()}

    def converged(self, ids: Iterable[m.NodeId] | None = None) -> bool:
        """Every running node in `ids` (default: all) knows every other one as alive."""
        group = [self.nodes[i] for i in ids] if ids is not None else self.live_nodes()
        group = [nd for nd in group if nd.alive]
        want = {nd.id for nd in group}
        for nd in group:
            ms = nd.membership
            for other in want:
                rec = ms.member(other)
                if rec is None or rec.state is not m.MemberState.ALIVE:
                    return False
        return True

    def reset_counters(self) -> None:
        for nd in self.nodes.values():
            nd.counters = NodeCounters()

    # ------------------------------------------------------------ internals

    def _push(self, when: float, kind: int, a: object, b: object, c: object, d: object) -> None:
        self._n += 1
        heapq.heappush(self._heap, (when, self._n, kind, a, b, c, d))

    def _reschedule(self, node: SimNode) -> None:
        if not node.alive:
            return
        d = node.endpoint.next_deadline()
        if d < node.tick_at:
            d = max(d, self.now)
            node.tick_at = d
            self._push(d, _TICK, node, None, None, None)

    def _after_call(self, node: SimNode, out: list[Outgoing]) -> None:
        ev = node.endpoint.poll_events()
        if ev and self.observers:
            now = self.now
            for obs in self.observers:
                for e in ev:
                    obs(node, e, now)
        if out:
            self._dispatch(node, out)
        self._reschedule(node)

    def _dispatch(self, src: SimNode, out: list[Outgoing]) -> None:
        rng = self.rng
        now = self.now
        latency = self.latency
        groups = self._group
        src_group = groups.get(src.id, 0)
        cnt = src.counters
        for o in out:
            size = len(o.payload)
            if o.reliable:
                cnt.tcp_out_payloads += 1
                cnt.tcp_out_bytes += size
            else:
                cnt.udp_out_packets += 1
                cnt.udp_out_bytes += size
            dst = self.by_addr.get(o.dest)
            if dst is None or not dst.alive:
                self.dropped_dead += 1
                cnt.lost += 1
                continue
            if groups and groups.get(dst.id, 0) != src_group:
                self.dropped_partition += 1
                cnt.lost += 1
                continue
            if o.reliable:
                d = self._tcp_delay(size)
                if d is None:
                    self.dropped_loss += 1
                    cnt.lost += 1
                    continue
                delay = d
            else:
                if self.loss and rng.random() < self.loss:
                    self.dropped_loss += 1
                    cnt.lost += 1
                    continue
                delay = latency(rng)
            self._push(now + delay, _DELIVER, dst, src.addr, o.payload, o.reliable)

    def _tcp_delay(self, size: int) -> float | None:
        """A reliable payload: SYN, SYN-ACK, then one data leg per 64 KiB. Each leg is
        lost with the datagram loss rate and resent after an RTO (1 s for the
        handshake, 0.2 s for data, doubling); after 5 resends the connection fails."""
        rng = self.rng
        loss = self.loss
        legs = [1.0, 1.0] + [0.2] * (1 + size // 65536)
        delay = size / self.bandwidth
        for rto in legs:
            delay += self.latency(rng)
            tries = 0
            while loss and rng.random() < loss:
                tries += 1
                if tries > 5:
                    return None
                delay += rto
                rto *= 2
        return delay

    def _deliver(self, node: SimNode, src: Addr, payload: bytes, reliable: bool) -> None:
        if not node.alive:
            self.dropped_dead += 1
            return
        if node.stalled_until > self.now:
            node.backlog.append((src, payload, reliable))
            return
        self._receive(node, src, payload, reliable)

    def _receive(self, node: SimNode, src: Addr, payload: bytes, reliable: bool) -> None:
        cnt = node.counters
        if reliable:
            cnt.tcp_in_payloads += 1
            cnt.tcp_in_bytes += len(payload)
        else:
            cnt.udp_in_packets += 1
            cnt.udp_in_bytes += len(payload)
        self._after_call(node, node.endpoint.receive(src, payload, self.now, reliable))

    def _resume(self, node: SimNode) -> None:
        if not node.alive or node.stalled_until > self.now:
            return
        node.stalled_until = -math.inf
        if node.resume_timers_first:
            node.tick_at = math.inf
            self._after_call(node, node.endpoint.tick(self.now))
        while node.backlog and node.alive:
            src, payload, reliable = node.backlog.popleft()
            self._receive(node, src, payload, reliable)
        node.tick_at = math.inf
        self._after_call(node, node.endpoint.tick(self.now))
