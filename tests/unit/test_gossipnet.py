"""The simulated network itself: delivery, loss, partitions, kills, stalls, counters.

A tiny recording endpoint stands in for the protocol so the network's semantics are
checked on their own.
"""

from __future__ import annotations

import math
import random

import pytest

from swarm import model as m
from swarm.cluster.membership import Addr, MembershipConfig, Outgoing
from swarm.sim.gossipnet import GossipNet, SimNode, uniform_latency


class Recorder:
    """Logs what it receives and when it is ticked; sends what it is told to."""

    def __init__(self, me: m.Member, now: float) -> None:
        self.me = me
        self.got: list[tuple[float, Addr, bytes, bool]] = []
        self.ticks: list[float] = []
        self.calls: list[str] = []
        self.outbox: list[Outgoing] = []
        self.wake = math.inf

    def tick(self, now: float) -> list[Outgoing]:
        self.ticks.append(now)
        self.calls.append("tick")
        self.wake = math.inf
        out, self.outbox = self.outbox, []
        return out

    def receive(
        self, src: Addr, payload: bytes, now: float, reliable: bool = False
    ) -> list[Outgoing]:
        self.got.append((now, src, payload, reliable))
        self.calls.append("recv")
        return []

    def next_deadline(self) -> float:
        return self.wake

    def poll_events(self) -> list[str]:
        return []


def make(net: GossipNet, n: int) -> list[tuple[SimNode, Recorder]]:
    out = []
    for _ in range(n):
        nd = net.add_node(factory=lambda me, rng, now: Recorder(me, now))
        ep = nd.endpoint
        assert isinstance(ep, Recorder)
        out.append((nd, ep))
    return out


def send(
    net: GossipNet,
    src: tuple[SimNode, Recorder],
    dst: SimNode,
    payload: bytes,
    reliable: bool = False,
) -> None:
    """Ask src's endpoint to send at the current time (through its next tick)."""
    node, ep = src
    ep.outbox.append(Outgoing(dst.addr, payload, reliable))
    ep.wake = net.now
    net._reschedule(node)


def test_delivery_after_latency_and_counters() -> None:
    net = GossipNet(seed=1, latency=uniform_latency(0.01, 0.01))
    (a, ra), (b, rb) = make(net, 2)
    send(net, (a, ra), b, b"hello")
    net.run_for(0.005)
    assert rb.got == []
    net.run_for(0.01)
    ((t, src, p, r),) = rb.got
    assert (src, p, r) == (a.addr, b"hello", False) and t == pytest.approx(0.01)
    assert (a.counters.udp_out_packets, a.counters.udp_out_bytes) == (1, 5)
    assert (b.counters.udp_in_packets, b.counters.udp_in_bytes) == (1, 5)


def test_loss_drops_datagrams_but_only_delays_reliable_payloads() -> None:
    net = GossipNet(seed=2, loss=0.3, latency=uniform_latency(0.001, 0.001))
    (a, ra), (b, rb) = make(net, 2)
    for i in range(200):
        send(net, (a, ra), b, b"u%d" % i)
        send(net, (a, ra), b, b"t%d" % i, reliable=True)
    net.run_for(60.0)
    udp = [p for _, _, p, r in rb.got if not r]
    tcp = [(t, p) for t, _, p, r in rb.got if r]
    assert 100 < len(udp) < 180  # about 70% arrive
    assert len(tcp) >= 197  # TCP resends; a leg failing 6 times in a row is rare (~0.2%)
    assert min(t for t, _ in tcp) == pytest.approx(0.003, abs=1e-4)  # three clean legs
    assert max(t for t, _ in tcp) > 1.0  # a lost SYN costs a 1 s retransmission timeout


def test_total_loss_fails_reliable_connections_too() -> None:
    net = GossipNet(seed=2, loss=1.0)
    (a, ra), (b, rb) = make(net, 2)
    send(net, (a, ra), b, b"udp")
    send(net, (a, ra), b, b"tcp", reliable=True)
    net.run_for(100.0)
    assert rb.got == []
    assert net.dropped_loss == 2 and a.counters.lost == 2


def test_partition_cuts_both_kinds_until_healed() -> None:
    net = GossipNet(seed=3)
    (a, ra), (b, rb), (c, rc) = make(net, 3)
    net.partition([a.id], [b.id])  # c is in the group of the unlisted
    send(net, (a, ra), b, b"x", reliable=True)
    send(net, (a, ra), c, b"y")
    send(net, (b, rb), c, b"z")
    net.run_for(1.0)
    assert rb.got == [] and rc.got == []
    assert net.dropped_partition == 3
    net.heal()
    send(net, (a, ra), b, b"x")
    net.run_for(1.0)
    assert [p for _, _, p, _ in rb.got] == [b"x"]


def test_killed_node_neither_runs_nor_receives() -> None:
    net = GossipNet(seed=4)
    (a, ra), (b, rb) = make(net, 2)
    rb.wake = 0.5
    net._reschedule(b)
    net.kill(b.id)
    send(net, (a, ra), b, b"x")
    net.run_for(1.0)
    assert rb.got == [] and rb.ticks == []
    assert net.dropped_dead == 1


def test_stall_queues_packets_and_resumes_timers_first() -> None:
    net = GossipNet(seed=5, latency=uniform_latency(0.001, 0.001))
    (a, ra), (b, rb) = make(net, 2)
    net.stall(b.id, 0.5)
    rb.wake = 0.2  # a timer that comes due during the freeze
    net._reschedule(b)
    send(net, (a, ra), b, b"1")
    send(net, (a, ra), b, b"2")
    net.run_for(0.4)
    assert rb.got == [] and rb.ticks == []
    net.run_for(0.2)
    assert [p for _, _, p, _ in rb.got] == [b"1", b"2"]
    assert all(t == pytest.approx(0.5) for t, _, _, _ in rb.got)
    assert rb.calls[:3] == ["tick", "recv", "recv"]


def test_stall_can_resume_with_the_backlog_first() -> None:
    net = GossipNet(seed=6)
    (a, ra), (b, rb) = make(net, 2)
    net.stall(b.id, 0.3, timers_first=False)
    send(net, (a, ra), b, b"1")
    net.run_for(1.0)
    assert rb.calls[0] == "recv"


def test_starve_freezes_most_of_the_time() -> None:
    net = GossipNet(seed=7)
    ((b, _),) = make(net, 1)
    net.starve(b.id, 10.0, run_slice=0.01, stall=(0.2, 0.3))
    frozen = 0
    for i in range(1000):
        net.run_until(i * 0.01 + 0.005)
        frozen += b.stalled_until > net.now
    assert 900 <= frozen <= 990


def test_at_and_run_until_true() -> None:
    net = GossipNet(seed=8)
    hits: list[float] = []
    net.at(2.0, lambda: hits.append(net.now))
    assert not net.run_until_true(lambda: bool(hits), timeout=1.0)
    assert net.run_until_true(lambda: bool(hits), timeout=5.0, check_every=0.1)
    assert hits == [2.0]


def test_same_seed_same_run_different_seed_different_run() -> None:
    def run(seed: int) -> list[tuple[str, int]]:
        net = GossipNet(seed=seed, config=MembershipConfig.local(), loss=0.1)
        nodes = net.bootstrap(15)
        net.run_for(5.0)
        return [(nd.id, nd.counters.out_bytes) for nd in nodes]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_restart_reuses_id_and_address() -> None:
    net = GossipNet(seed=9, config=MembershipConfig.local())
    nodes = net.bootstrap(5)
    old = nodes[2]
    fresh = net.restart(old.id, seeds=[nodes[0].id])
    assert fresh.id == old.id and fresh.addr == old.addr and fresh is not old
    assert not old.alive and fresh.alive
    assert net.by_addr[old.addr] is fresh
    with pytest.raises(ValueError):
        net.add_node(old.id)


def test_membership_property_guards_other_endpoints() -> None:
    net = GossipNet(seed=10)
    ((a, _),) = make(net, 1)
    with pytest.raises(TypeError):
        _ = a.membership
    rnd = random.Random(1)
    assert 0.0 <= uniform_latency(0.0, 1.0)(rnd) <= 1.0
