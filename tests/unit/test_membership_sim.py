"""Membership at cluster scale on the simulated network (seeded, simulated time).

Bounds on *simulated* time are protocol properties (how many probe periods a
detection takes), not wall-clock thresholds.
"""

from __future__ import annotations

import functools
import random
from collections import Counter

import attrs
import pytest

from swarm import model as m
from swarm.cluster.membership import (
    AppMessage,
    AppState,
    Event,
    EventKind,
    MemberEvent,
    Membership,
    MembershipConfig,
)
from swarm.sim.gossipnet import GossipNet, SimNode

S = m.MemberState
LOCAL = MembershipConfig.local()


class Recorder:
    """Collects (observer, kind, subject) for membership events."""

    def __init__(self) -> None:
        self.events: list[tuple[str, EventKind, str, float]] = []
        self.apps: list[tuple[str, Event]] = []

    def __call__(self, node: SimNode, ev: Event, now: float) -> None:
        if isinstance(ev, MemberEvent):
            self.events.append((node.id, ev.kind, ev.member.node, now))
        elif isinstance(ev, (AppMessage, AppState)):
            self.apps.append((node.id, ev))

    def about(self, subject: str, kind: EventKind) -> list[tuple[str, float]]:
        return [(o, t) for o, k, s, t in self.events if s == subject and k is kind]

    def count(self, kind: EventKind, subjects: set[str] | None = None) -> int:
        return sum(
            1 for _, k, s, _ in self.events if k is kind and (subjects is None or s in subjects)
        )


def _state(net: GossipNet, observer: str, subject: str) -> S | None:
    rec = net.node(observer).membership.member(subject)
    return None if rec is None else rec.state


def _all_see(net: GossipNet, subject: str, states: set[S], exclude: set[str] = frozenset()) -> bool:  # type: ignore[assignment]
    return all(
        _state(net, nd.id, subject) in states
        for nd in net.live_nodes()
        if nd.id != subject and nd.id not in exclude
    )


def _no_internal_errors(net: GossipNet) -> None:
    for nd in net.nodes.values():
        assert nd.membership.stats["error.internal"] == 0, nd.membership.last_error


def test_200_nodes_converge_after_joins() -> None:
    net = GossipNet(seed=11, config=LOCAL)
    seed = net.add_node()
    others = [net.add_node() for _ in range(199)]
    for i, nd in enumerate(others):
        # staggered joins through the first node or any node that joined before
        via = seed.id if i < 5 else others[net.rng.randrange(i)].id
        net.at(0.01 * i, functools.partial(net.join, nd.id, [via]))
    assert net.run_until_true(net.converged, timeout=60.0, check_every=0.5)
    assert all(nd.membership.joined for nd in net.live_nodes())
    assert all(nd.membership.num_live == 200 for nd in net.live_nodes())
    _no_internal_errors(net)


def test_killed_node_is_declared_dead_by_every_member() -> None:
    rec = Recorder()
    net = GossipNet(seed=3, config=LOCAL)
    net.observers.append(rec)
    nodes = net.bootstrap(100)
    net.run_for(2.0)
    victim = nodes[17].id
    t0 = net.now
    net.kill(victim)
    # memberlist's bound: a probe round plus the *maximum* suspicion timeout
    min_timeout = LOCAL.suspicion_mult * 2 * LOCAL.probe_interval  # log10(100) = 2
    bound = 2 * LOCAL.probe_interval + LOCAL.suspicion_max_timeout_mult * min_timeout
    assert net.run_until_true(lambda: _all_see(net, victim, {S.DEAD}), timeout=bound)
    took = net.now - t0
    # with 100 nodes the suspicion is confirmed quickly: close to the minimum timeout
    assert took < 3 * min_timeout
    dead_events = rec.about(victim, EventKind.DEAD)
    assert {o for o, _ in dead_events} == {nd.id for nd in net.live_nodes()}
    assert rec.count(EventKind.DEAD, {nd.id for nd in net.live_nodes()}) == 0
    _no_internal_errors(net)


def test_partition_heals_and_views_remerge() -> None:
    net = GossipNet(seed=5, config=LOCAL)
    nodes = net.bootstrap(40)
    left = [nd.id for nd in nodes[:20]]
    right = [nd.id for nd in nodes[20:]]
    net.run_for(1.0)
    net.partition(left, right)
    # each side declares the other dead
    assert net.run_until_true(
        lambda: (
            all(_state(net, a, b) is S.DEAD for a in left for b in right)
            and all(_state(net, b, a) is S.DEAD for a in left for b in right)
        ),
        timeout=60.0,
    )
    assert net.converged(left) and net.converged(right)
    net.run_for(10.0)  # a long partition: gossip-to-the-dead time is over
    net.heal()
    assert net.run_until_true(net.converged, timeout=30.0, check_every=0.5)
    _no_internal_errors(net)


def test_no_false_dead_with_ten_percent_loss() -> None:
    rec = Recorder()
    net = GossipNet(seed=7, config=LOCAL, loss=0.10)
    net.observers.append(rec)
    nodes = net.bootstrap(60)
    net.run_for(60.0)  # 300 probe periods
    assert rec.count(EventKind.DEAD) == 0
    # transient suspicions are expected under loss; nobody is missing from any view
    for nd in nodes:
        assert nd.membership.num_live == 60
    assert sum(nd.membership.stats["probe.failed"] for nd in nodes) > 0  # loss did bite
    _no_internal_errors(net)


def _stall_run(lifeguard: bool) -> tuple[int, int, int]:
    """One node starves (frozen 80% of the time) for 30 s; count what the *healthy*
    nodes suffer: suspicion and death events about them, and refutations."""
    cfg = MembershipConfig.local(lifeguard=lifeguard)
    rec = Recorder()
    net = GossipNet(seed=21, config=cfg)
    net.observers.append(rec)
    nodes = net.bootstrap(30)
    sick = nodes[0].id
    net.run_for(2.0)
    net.starve(sick, 30.0)
    net.run_for(40.0)
    healthy = {nd.id for nd in nodes} - {sick}
    false_suspect = rec.count(EventKind.SUSPECT, healthy)
    false_dead = rec.count(EventKind.DEAD, healthy)
    refutes = sum(net.node(h).membership.stats["refute"] for h in healthy)
    _no_internal_errors(net)
    return false_suspect, false_dead, refutes


def test_stalled_node_does_not_get_healthy_peers_declared_dead() -> None:
    on = _stall_run(lifeguard=True)
    off = _stall_run(lifeguard=False)
    assert on[1] == 0, f"false dead with Lifeguard: {on}"
    # Lifeguard is what makes the difference: without it the starving node accuses
    # healthy peers again and again.
    assert on[0] * 3 <= off[0], f"lifeguard on {on}, off {off}"
    assert on[2] < off[2]


def test_falsely_suspected_node_refutes_with_higher_incarnation() -> None:
    net = GossipNet(seed=9, config=LOCAL)
    nodes = net.bootstrap(30)
    net.run_for(1.0)
    target = nodes[4]
    inc0 = target.membership.incarnation
    # an accusation from nowhere lands at one node
    accuser = nodes[9].membership
    suspect = m.Member(
        node=target.id,
        addr=target.addr[0],
        port=target.addr[1],
        state=S.SUSPECT,
        incarnation=inc0,
        cluster="sim",
    )
    from swarm.cluster.messages import MemberUpdate

    pkt = net.codec.encode_packet("sim", [net.codec.encode(MemberUpdate(suspect, "ghost"))])
    accuser.receive(("10.9.9.9", 1), pkt, net.now)
    assert accuser.member(target.id).state is S.SUSPECT  # type: ignore[union-attr]
    net.run_for(0.0)
    assert net.run_until_true(
        lambda: all(
            (r := nd.membership.member(target.id)) is not None
            and r.state is S.ALIVE
            and r.incarnation > inc0
            for nd in net.live_nodes()
        ),
        timeout=10.0,
    )
    assert target.membership.incarnation > inc0
    assert target.membership.stats["refute"] >= 1
    net.run_for(10.0)
    assert net.converged()


def test_graceful_leave_is_seen_as_left_not_dead() -> None:
    rec = Recorder()
    net = GossipNet(seed=13, config=LOCAL)
    net.observers.append(rec)
    nodes = net.bootstrap(50)
    net.run_for(1.0)
    leaver = nodes[7]
    net.leave(leaver.id)
    assert net.run_until_true(lambda: leaver.membership.leave_complete, timeout=10.0)
    net.kill(leaver.id)  # the process exits after its leave message went out
    assert net.run_until_true(lambda: _all_see(net, leaver.id, {S.LEFT}), timeout=10.0)
    net.run_for(15.0)  # long enough that a probe-based death would have happened
    assert _all_see(net, leaver.id, {S.LEFT})
    assert rec.about(leaver.id, EventKind.DEAD) == []
    assert len(rec.about(leaver.id, EventKind.LEFT)) == 49


def test_dead_node_rejoins_with_higher_incarnation() -> None:
    rec = Recorder()
    net = GossipNet(seed=17, config=LOCAL)
    net.observers.append(rec)
    nodes = net.bootstrap(30)
    net.run_for(1.0)
    victim = nodes[3].id
    net.kill(victim)
    assert net.run_until_true(lambda: _all_see(net, victim, {S.DEAD}), timeout=30.0)
    dead_inc = net.node(nodes[0].id).membership.member(victim).incarnation  # type: ignore[union-attr]
    # a new process, same id and address, starting again from incarnation 0
    reborn = net.restart(victim, incarnation=0, seeds=[nodes[0].id])
    assert net.run_until_true(net.converged, timeout=20.0)
    assert reborn.membership.incarnation > dead_inc
    assert len(rec.about(victim, EventKind.JOINED)) >= 29


def test_load_reports_propagate_and_newest_version_wins() -> None:
    net = GossipNet(seed=19, config=LOCAL)
    nodes = net.bootstrap(80)
    for i, nd in enumerate(nodes):
        nd.membership.set_local_load(m.LoadReport(node=nd.id, version=1000, queued=i), net.now)
    src = nodes[5]

    def everyone_has(version: int, queued: int) -> bool:
        for nd in net.live_nodes():
            if nd is src:
                continue
            e = nd.membership.load_view().get(src.id)
            if e is None or e.report.version < version or e.report.queued != queued:
                return False
        return True

    assert net.run_until_true(lambda: everyone_has(1000, 5), timeout=10.0)
    src.membership.set_local_load(m.LoadReport(node=src.id, version=2000, queued=42), net.now)
    net._reschedule(src)  # the adapter would wake the node; the sim does it on its next call
    assert net.run_until_true(lambda: everyone_has(2000, 42), timeout=10.0)
    # an old report arriving late does not roll anything back
    from swarm.cluster.messages import LoadUpdate

    stale = net.codec.encode(LoadUpdate(m.LoadReport(node=src.id, version=1500, queued=1)))
    nodes[0].membership.receive(("10.9.9.9", 1), net.codec.encode_packet("sim", [stale]), net.now)
    assert nodes[0].membership.load_view()[src.id].report.queued == 42
    # and every node's view comes to cover the whole cluster, with ages
    everyone = {nd.id for nd in nodes}
    assert net.run_until_true(
        lambda: set(nodes[0].membership.load_view()) == everyone, timeout=10.0
    )
    view = nodes[0].membership.load_view()
    assert all(0 <= e.age(net.now) < 10.0 for e in view.values())
    _no_internal_errors(net)


def test_load_of_a_dead_node_leaves_the_view() -> None:
    net = GossipNet(seed=23, config=LOCAL)
    nodes = net.bootstrap(20)
    for nd in nodes:
        nd.membership.set_local_load(m.LoadReport(node=nd.id, version=1), net.now)
    net.run_for(3.0)
    assert nodes[3].id in nodes[0].membership.load_view()
    net.kill(nodes[3].id)
    assert net.run_until_true(lambda: _all_see(net, nodes[3].id, {S.DEAD}), timeout=20.0)
    assert nodes[3].id not in nodes[0].membership.load_view()


def test_other_cluster_is_never_admitted() -> None:
    net = GossipNet(seed=29, config=LOCAL)
    nodes = net.bootstrap(10)

    def evil(me: m.Member, rng: random.Random, now: float) -> Membership:
        return Membership(LOCAL, attrs.evolve(me, cluster="evil"), rng, now, codec=net.codec)

    # same network, another cluster name
    intruder = net.add_node("intruder", factory=evil)
    net.join(intruder.id, [nodes[0].id])
    net.run_for(10.0)
    for nd in nodes:
        assert nd.membership.member("intruder") is None
    assert sum(nd.membership.stats["drop.cluster"] for nd in nodes) >= 1
    assert intruder.membership.num_live == 1


def test_app_broadcast_reaches_everyone_once_and_newer_replaces_older() -> None:
    rec = Recorder()
    net = GossipNet(seed=31, config=LOCAL)
    net.observers.append(rec)
    nodes = net.bootstrap(60)
    src = nodes[2]
    src.membership.broadcast_app("globals", {"tasks": ["a"]})
    src.membership.broadcast_app("globals", {"tasks": ["a", "b"]})  # replaces the queued one
    net._reschedule(src)
    net.run_for(5.0)
    got = Counter(o for o, ev in rec.apps if isinstance(ev, AppMessage) and ev.key == "globals")
    assert set(got) == {nd.id for nd in nodes} - {src.id}
    payloads = {
        o: ev.payload for o, ev in rec.apps if isinstance(ev, AppMessage) and ev.key == "globals"
    }
    assert all(p == {"tasks": ["a", "b"]} for p in payloads.values())
    assert all(c == 1 for c in got.values())


def test_app_state_travels_with_push_pull() -> None:
    rec = Recorder()
    net = GossipNet(seed=37, config=LOCAL)
    net.observers.append(rec)
    nodes = net.bootstrap(5)
    nodes[1].membership.set_app_state({"globals": ["t1"]})
    net.run_for(LOCAL.push_pull_interval * 2.5)
    states = [ev for o, ev in rec.apps if isinstance(ev, AppState) and ev.node == nodes[1].id]
    assert states and all(ev.state == {"globals": ["t1"]} for ev in states)


@pytest.mark.parametrize("seed", [1, 2])
def test_simulation_is_deterministic(seed: int) -> None:
    def run() -> tuple[int, list[tuple[str, int]]]:
        net = GossipNet(seed=seed, config=LOCAL, loss=0.05)
        nodes = net.bootstrap(20)
        net.kill(nodes[1].id)
        net.run_for(10.0)
        return net.events_processed, sorted(
            (nd.id, nd.counters.out_bytes) for nd in net.live_nodes()
        )

    assert run() == run()


def test_every_member_is_probed_about_once_per_probe_interval() -> None:
    """SWIM's detection time rests on this: n members probing round-robin in
    independently shuffled orders hit any given member about once per interval,
    from the start (a warm start once gave every node the same order, and the
    members just after its wrap point went almost unprobed)."""
    net = GossipNet(seed=41, config=LOCAL)
    nodes = net.bootstrap(200)
    net.run_for(5 * LOCAL.probe_interval)
    before = {nd.id: nd.membership.stats["in.ping"] for nd in nodes}
    periods = 40
    net.run_for(periods * LOCAL.probe_interval)
    counts = [nd.membership.stats["in.ping"] - before[nd.id] for nd in nodes]
    assert 0.9 < sum(counts) / len(counts) / periods < 1.1
    assert min(counts) >= periods // 3  # nobody is left out (Poisson tail: ~16 at worst)
