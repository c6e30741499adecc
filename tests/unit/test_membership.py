"""The Membership state machine driven by hand: explicit packets, explicit time."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm import model as m
from swarm import wire
from swarm.cluster.membership import (
    EventKind,
    LoadUpdated,
    MemberEvent,
    Membership,
    MembershipConfig,
    Outgoing,
    ring_key,
)
from swarm.cluster.messages import (
    Ack,
    Codec,
    IndirectPing,
    MemberUpdate,
    Message,
    Nack,
    Ping,
    PushPull,
)

S = m.MemberState
CLUSTER = "c"
CFG = MembershipConfig.local(indirect_checks=1)
CODEC = Codec()


def member(i: int, state: S = S.ALIVE, inc: int = 0) -> m.Member:
    return m.Member(f"n{i}", f"10.0.0.{i}", 7946, state=state, incarnation=inc, cluster=CLUSTER)


def addr(i: int) -> tuple[str, int]:
    return (f"10.0.0.{i}", 7946)


def node(
    i: int, peers: Iterable[int] = (), cfg: MembershipConfig = CFG, now: float = 0.0
) -> Membership:
    ms = Membership(cfg, member(i), random.Random(i), now)
    ms.bootstrap([member(p) for p in peers], now)
    ms.poll_events()
    return ms


def msgs(o: Outgoing) -> list[Message]:
    max_size = wire.MAX_FRAME if o.reliable else 65507
    return list(CODEC.decode_packet(o.payload, max_size=max_size, cluster=CLUSTER).messages)


T = TypeVar("T")


def of_type(outs: Sequence[Outgoing], t: type[T]) -> list[tuple[Outgoing, T]]:
    return [(o, x) for o in outs for x in msgs(o) if isinstance(x, t)]


def packet(*items: Message) -> bytes:
    return CODEC.encode_packet(CLUSTER, [CODEC.encode(x) for x in items])


def run_to(ms: Membership, t: float, *, answer: bool = False) -> list[Outgoing]:
    """Tick at every deadline up to t. Nothing is delivered, except that with
    `answer` every ping is acked at once (peers are up; an ack never cancels a
    suspicion, so this isolates the timers under test)."""
    out: list[Outgoing] = []
    while (now := ms.next_deadline()) <= t:
        outs = ms.tick(now)
        out += outs
        if answer:
            for o in outs:
                for x in msgs(o):
                    if isinstance(x, Ping):
                        out += ms.receive(o.dest, packet(Ack(x.seq)), now)
    return out


def first_probe(ms: Membership) -> tuple[float, Outgoing, Ping]:
    while True:
        t = ms.next_deadline()
        for o in ms.tick(t):
            for x in msgs(o):
                if isinstance(x, Ping):
                    return t, o, x


# ----------------------------------------------------------------- probing


def test_direct_probe_and_ack() -> None:
    a, b = node(1, [2]), node(2, [1])
    t, o, ping = first_probe(a)
    assert o.dest == addr(2) and ping.target == "n2" and not o.reliable
    acks = of_type(b.receive(addr(1), o.payload, t + 0.001), Ack)
    assert [(x.dest, ack.seq) for x, ack in acks] == [(addr(1), ping.seq)]
    a.receive(addr(2), acks[0][0].payload, t + 0.002)
    run_to(a, t + CFG.probe_interval - 1e-9)  # the rest of this probe round
    assert a.member("n2").state is S.ALIVE  # type: ignore[union-attr]
    assert a.stats["probe.failed"] == 0
    assert a.local_health == 0


def _probe_rounds(cfg: MembershipConfig, n: int, rounds: int) -> list[dict[str, str]]:
    """Who probes whom in each of `rounds` rounds, all members answering."""
    nodes = {f"n{i}": node(i, [j for j in range(1, n + 1) if j != i], cfg) for i in range(1, n + 1)}
    per_round: list[dict[str, str]] = [{} for _ in range(rounds)]
    for name, ms in nodes.items():
        for _ in range(rounds):
            t, _, ping = first_probe(ms)
            ms.receive(addr(int(ping.target[1:])), packet(Ack(ping.seq)), t)
            r = int(t // cfg.probe_interval)
            assert ping.target not in (name, "") and name not in per_round[r]
            per_round[r][name] = ping.target
    return per_round


def test_rotating_order_probes_every_member_once_per_round() -> None:
    n = 12
    rounds = _probe_rounds(CFG, n, 2 * n)
    for probes in rounds:
        assert len(probes) == n
        assert sorted(probes.values()) == sorted(probes)  # a permutation, no one left out
    # and a different one each round: over n - 1 rounds everyone probes everyone
    for name in rounds[0]:
        assert len({probes[name] for probes in rounds[: n - 1]}) == n - 1


def test_rotating_order_skips_dead_members_without_leaving_anyone_unprobed() -> None:
    n = 8
    nodes = {i: node(i, [j for j in range(1, n + 1) if j != i]) for i in range(1, n + 1)}
    for i, ms in nodes.items():  # everybody has seen n8 die
        if i != 8:
            ms.receive(addr(7), packet(MemberUpdate(member(8, S.DEAD), "n7")), 0.0)
    for r in range(n):
        targets = []
        for i in range(1, n):
            ms = nodes[i]
            t, _, ping = first_probe(ms)
            ms.receive(addr(int(ping.target[1:])), packet(Ack(ping.seq)), t)
            assert int(t // CFG.probe_interval) == r
            targets.append(ping.target)
        assert sorted(targets) == [f"n{i}" for i in range(1, n)]


def test_shuffled_order_is_memberlists_independent_walks() -> None:
    n = 12
    rounds = _probe_rounds(
        MembershipConfig.local(indirect_checks=1, probe_order="shuffled"), n, n - 1
    )
    # each member still walks everyone once per n - 1 rounds...
    for name in rounds[0]:
        assert len({probes[name] for probes in rounds}) == n - 1
    # ...but independently: in some round somebody is probed twice and somebody not at all
    assert any(len(set(probes.values())) < n for probes in rounds)


def test_probe_order_must_be_known() -> None:
    with pytest.raises(ValueError, match="probe_order"):
        MembershipConfig.local(probe_order="sorted")


def test_ping_for_another_node_is_not_answered() -> None:
    b = node(2, [1])
    assert b.receive(addr(1), packet(Ping(7, "somebody-else")), 1.0) == []
    assert b.stats["drop.not_for_us"] == 1


def _probing_n2() -> tuple[Membership, Membership, float]:
    """n1 (with helper n3) at the start of its first probe of n2; n3 answers n1."""
    a = node(1, [2, 3])
    c = node(3, [1, 2])
    while True:
        t, _, ping = first_probe(a)
        if ping.target == "n2":
            return a, c, t
        a.receive(addr(3), packet(Ack(ping.seq)), t)  # n3 is fine


def test_missed_ack_goes_indirect_then_suspects_and_nack_keeps_health() -> None:
    a, c, t = _probing_n2()
    # n2 is silent: at the probe timeout a ping-req goes to n3, asking for a nack
    reqs = of_type(run_to(a, t + CFG.probe_timeout), IndirectPing)
    assert len(reqs) == 1
    req_out, req = reqs[0]
    assert req_out.dest == addr(3) and req.nack and req.target == "n2"
    # n3 pings n2 for us; n2 does not answer; n3 nacks
    relay_pings = of_type(c.receive(addr(1), req_out.payload, t + 0.11), Ping)
    assert relay_pings and relay_pings[0][0].dest == addr(2)
    nacks = of_type(run_to(c, t + 0.11 + CFG.probe_timeout), Nack)
    assert nacks and nacks[0][0].dest == addr(1)
    a.receive(addr(3), nacks[0][0].payload, t + 0.15)
    a.poll_events()
    run_to(a, t + CFG.probe_interval)
    assert a.member("n2").state is S.SUSPECT  # type: ignore[union-attr]
    assert a.local_health == 0  # the helper vouched for our health
    kinds = [
        e.kind for e in a.poll_events() if isinstance(e, MemberEvent) and e.member.node == "n2"
    ]
    assert kinds == [EventKind.SUSPECT]


def test_missed_nack_raises_local_health_and_stretches_probing() -> None:
    a = node(1, [2, 3])
    t, _, _ = first_probe(a)
    run_to(a, t + CFG.probe_interval - 1e-6)  # nobody answers anything
    # the probe round ends at t + interval; the next probe starts then
    t2, _, _ = first_probe(a)
    assert t2 == pytest.approx(t + CFG.probe_interval)
    # a nack may still be on the wire: it counts as missed after a grace period
    assert a.local_health == 0
    run_to(a, t2 + CFG.probe_timeout / 2 + 1e-6)
    assert a.local_health == 1  # one expected nack missed
    # the round that had started is not stretched; the next one, by (health + 1)
    run_to(a, t2 + CFG.probe_interval - 1e-6)
    t3, _, _ = first_probe(a)
    assert t3 == pytest.approx(t2 + CFG.probe_interval)
    # the second probe had no helper to ask (the other peer is suspect by then):
    # that failure counts against us at once, so health is 2 when the third starts
    assert a.local_health == 2
    run_to(a, t3 + 3 * CFG.probe_interval - 1e-6)
    t4, _, _ = first_probe(a)
    assert t4 == pytest.approx(t3 + 3 * CFG.probe_interval)


def test_a_nack_just_after_the_round_still_vouches_for_us() -> None:
    """With the default timings a helper's nack comes back a little after the round
    ends (its timer starts when our request reaches it): it still counts."""
    a, c, t = _probing_n2()
    reqs = of_type(run_to(a, t + CFG.probe_timeout), IndirectPing)
    req_out, _ = reqs[0]
    at_helper = t + CFG.probe_timeout + 0.002
    c.receive(addr(1), req_out.payload, at_helper)
    nacks = of_type(run_to(c, at_helper + CFG.probe_timeout), Nack)
    assert nacks
    run_to(a, t + CFG.probe_interval + 1e-6)  # the round ends: n2 is suspected
    assert a.member("n2").state is S.SUSPECT  # type: ignore[union-attr]
    a.receive(addr(3), nacks[0][0].payload, at_helper + CFG.probe_timeout + 0.002)
    run_to(a, t + CFG.probe_interval + CFG.probe_timeout)
    assert a.local_health == 0


def test_successful_probes_bring_health_back_down() -> None:
    a = node(1, [2])
    a._awareness.apply(3)
    for _ in range(3):
        t, _, ping = first_probe(a)
        a.receive(addr(2), packet(Ack(ping.seq)), t + 0.001)
    assert a.local_health == 0


def test_indirect_ack_counts_as_success() -> None:
    a = node(1, [2, 3])
    b, c = node(2, [1, 3]), node(3, [1, 2])
    while True:
        t, _, ping = first_probe(a)
        if ping.target == "n2":
            break
        a.receive(addr(3), packet(Ack(ping.seq)), t)
    req_out, _ = of_type(run_to(a, t + CFG.probe_timeout), IndirectPing)[0]
    relay_out, _ = of_type(c.receive(addr(1), req_out.payload, t + 0.11), Ping)[0]
    ack_out, _ = of_type(b.receive(addr(3), relay_out.payload, t + 0.12), Ack)[0]
    fwd_out, fwd = of_type(c.receive(addr(2), ack_out.payload, t + 0.13), Ack)[0]
    assert fwd_out.dest == addr(1) and fwd.seq == ping.seq
    a.receive(addr(3), fwd_out.payload, t + 0.14)
    run_to(a, t + CFG.probe_interval)
    assert a.member("n2").state is S.ALIVE  # type: ignore[union-attr]
    assert a.stats["probe.failed"] == 0


def test_lifeguard_off_sends_no_nack_requests_and_keeps_health_flat() -> None:
    cfg = MembershipConfig.local(indirect_checks=1, lifeguard=False)
    a = node(1, [2, 3], cfg=cfg)
    t, _, _ = first_probe(a)
    reqs = of_type(run_to(a, t + cfg.probe_timeout), IndirectPing)
    assert reqs and not reqs[0][1].nack
    run_to(a, t + 5 * cfg.probe_interval)
    assert a.local_health == 0


def test_buddy_system_tells_a_suspect_directly_and_it_refutes() -> None:
    a, b = node(1, [2]), node(2, [1])
    a.receive(addr(9), packet(MemberUpdate(member(2, S.SUSPECT), "n9")), 0.0)
    assert a.member("n2").state is S.SUSPECT  # type: ignore[union-attr]
    t, o, _ = first_probe(a)
    carried = [x for x in msgs(o) if isinstance(x, MemberUpdate)]
    assert any(x.member.node == "n2" and x.member.state is S.SUSPECT for x in carried)
    replies = b.receive(addr(1), o.payload, t + 0.001)
    assert b.incarnation == 1 and b.stats["refute"] == 1
    refutation = [x for _, x in of_type(replies, MemberUpdate) if x.member.node == "n2"]
    assert refutation and refutation[0].member.incarnation == 1
    for r in replies:
        a.receive(addr(2), r.payload, t + 0.002)
    rec = a.member("n2")
    assert rec is not None and rec.state is S.ALIVE and rec.incarnation == 1
    kinds = [e.kind for e in a.poll_events() if isinstance(e, MemberEvent)]
    assert kinds == [EventKind.SUSPECT, EventKind.ALIVE]


# --------------------------------------------------------------- suspicion


def _suspect_from(accuser: str, inc: int = 0) -> bytes:
    return packet(MemberUpdate(member(5, S.SUSPECT, inc), accuser))


def test_lone_accuser_takes_the_long_timeout_confirmations_shorten_it() -> None:
    peers = range(2, 12)  # 11 members in all: k = suspicion_mult - 2 = 2
    lone = node(1, peers)
    lone.receive(addr(9), _suspect_from("n9"), 10.0)
    confirmed = node(1, peers)
    confirmed.receive(addr(9), _suspect_from("n9"), 10.0)
    confirmed.receive(addr(8), _suspect_from("n8"), 10.5)
    confirmed.receive(addr(7), _suspect_from("n7"), 10.6)
    lo = CFG.suspicion_mult * 1.0414 * CFG.probe_interval  # log10(11)
    hi = CFG.suspicion_max_timeout_mult * lo

    def dead_at(ms: Membership) -> float:
        t = 10.0
        while ms.member("n5").state is not S.DEAD:  # type: ignore[union-attr]
            t += 0.01
            run_to(ms, t, answer=True)
        return t

    assert dead_at(confirmed) == pytest.approx(10.0 + lo, abs=0.02)
    assert dead_at(lone) == pytest.approx(10.0 + hi, abs=0.05)


def test_confirmations_are_regossiped_once_per_accuser() -> None:
    a = node(1, range(2, 12))
    a.receive(addr(9), _suspect_from("n9"), 1.0)
    assert a.stats["suspect.confirmed"] == 0
    a.receive(addr(8), _suspect_from("n8"), 1.1)
    a.receive(addr(8), _suspect_from("n8"), 1.2)
    assert a.stats["suspect.confirmed"] == 1


def test_alive_with_higher_incarnation_cancels_suspicion() -> None:
    a = node(1, range(2, 6))
    a.receive(addr(9), _suspect_from("n9"), 1.0)
    a.receive(addr(5), packet(MemberUpdate(member(5, S.ALIVE, 1))), 1.5)
    run_to(a, 100.0, answer=True)
    rec = a.member("n5")
    assert rec is not None and rec.state is S.ALIVE and rec.incarnation == 1


def test_late_timer_is_deferred_so_waiting_replies_count() -> None:
    """A node that did not run for a while must not accuse peers it could not hear."""
    a = node(1, [2])
    t, _, ping = first_probe(a)
    # we were frozen: the next tick comes long after the probe round should have ended
    late = t + 5 * CFG.probe_interval
    a.tick(late)
    assert a.member("n2").state is S.ALIVE  # type: ignore[union-attr]
    assert a.stats["timer.deferred"] >= 1
    a.receive(addr(2), packet(Ack(ping.seq)), late + 0.001)  # the backlog: the ack was there
    run_to(a, late + CFG.probe_interval)
    assert a.member("n2").state is S.ALIVE  # type: ignore[union-attr]
    assert a.stats["probe.failed"] == 0


# --------------------------------------------------------- self and refute


def test_accusation_about_ourselves_is_refuted_above_it() -> None:
    a = node(1, [2])
    a.receive(addr(2), packet(MemberUpdate(member(1, S.DEAD, 7), "n2")), 1.0)
    assert a.incarnation == 8
    assert a.member("n1").state is S.ALIVE  # type: ignore[union-attr]
    a.receive(addr(2), packet(MemberUpdate(member(1, S.SUSPECT, 3), "n2")), 1.1)
    assert a.incarnation == 8  # an older accusation needs nothing
    a.receive(addr(2), packet(MemberUpdate(member(1, S.ALIVE, 8))), 1.2)
    assert a.incarnation == 8  # our own news coming back


def test_push_pull_dead_is_only_a_suspicion_and_reply_goes_to_advertised_address() -> None:
    a = node(1, [2, 3])
    sender = member(3)
    blob = CODEC.encode_push_pull(
        sender,
        [member(2, S.DEAD), member(1, S.DEAD)],
        [],
        app_state=None,
        reply=False,
        join=False,
        heal=False,
    )
    pp = CODEC.encode_packet(CLUSTER, [blob])
    outs = a.receive(("10.0.0.3", 55123), pp, 1.0, reliable=True)  # from an ephemeral port
    assert a.member("n2").state is S.SUSPECT  # type: ignore[union-attr]
    assert a.incarnation == 1  # refuted what was said about us
    replies = [o for o in outs if o.reliable]
    assert [o.dest for o in replies] == [addr(3)]
    (reply,) = msgs(replies[0])
    assert isinstance(reply, PushPull) and reply.reply


def test_push_pull_over_udp_is_dropped() -> None:
    a = node(1, [2])
    blob = CODEC.encode_push_pull(
        member(2), [], [], app_state=None, reply=False, join=False, heal=False
    )
    assert a.receive(addr(2), CODEC.encode_packet(CLUSTER, [blob]), 1.0) == []
    assert a.stats["drop.push_pull_unreliable"] == 1


def test_join_sends_push_pull_to_seeds_but_not_to_ourselves() -> None:
    a = Membership(CFG, member(1), random.Random(1), 0.0)
    outs = a.join([addr(1), addr(2), addr(3)], 0.0)
    assert [o.dest for o in outs] == [addr(2), addr(3)]
    assert all(o.reliable for o in outs)
    (pp,) = msgs(outs[0])
    assert isinstance(pp, PushPull) and pp.join and pp.sender.node == "n1"
    assert not a.joined


# ------------------------------------------------------------------ events


def test_member_events() -> None:
    a = node(1)
    a.receive(addr(2), packet(MemberUpdate(member(2))), 1.0)
    a.receive(addr(2), packet(MemberUpdate(member(2, S.SUSPECT), "n3")), 1.1)
    a.receive(addr(2), packet(MemberUpdate(member(2, S.ALIVE, 1))), 1.2)
    moved = m.Member("n2", "10.0.0.99", 7946, incarnation=2, cluster=CLUSTER)
    a.receive(addr(2), packet(MemberUpdate(moved)), 1.3)
    a.receive(addr(2), packet(MemberUpdate(attrs_evolve(moved, state=S.DEAD), "n3")), 1.4)
    a.receive(addr(2), packet(MemberUpdate(attrs_evolve(moved, state=S.LEFT))), 1.5)
    a.receive(addr(2), packet(MemberUpdate(attrs_evolve(moved, incarnation=3))), 1.6)
    kinds = [e.kind for e in a.poll_events() if isinstance(e, MemberEvent)]
    assert kinds == [
        EventKind.JOINED,
        EventKind.SUSPECT,
        EventKind.ALIVE,
        EventKind.UPDATED,
        EventKind.DEAD,
        EventKind.LEFT,
        EventKind.JOINED,
    ]
    assert a.poll_events() == []


def attrs_evolve(mb: m.Member, **kw: object) -> m.Member:
    import attrs

    return attrs.evolve(mb, **kw)  # type: ignore[arg-type]


def test_tombstone_of_unknown_node_is_kept_quietly_and_blocks_stale_alive() -> None:
    a = node(1)
    a.receive(addr(2), packet(MemberUpdate(member(5, S.DEAD, 2), "n2")), 1.0)
    a.receive(addr(2), packet(MemberUpdate(member(5, S.ALIVE, 2))), 1.1)
    assert a.member("n5").state is S.DEAD  # type: ignore[union-attr]
    assert a.poll_events() == []


def test_tombstones_are_forgotten_after_their_ttl() -> None:
    cfg = MembershipConfig.local(tombstone_ttl=3.0)
    a = node(1, [2], cfg=cfg)
    a.receive(addr(2), packet(MemberUpdate(member(5, S.DEAD, 2), "n2")), 1.0)
    assert a.member("n5") is not None
    run_to(a, 10.0)
    assert a.member("n5") is None


# ------------------------------------------------------------------- leave


def test_leave_gossips_left_and_completes() -> None:
    a = node(1, [2, 3, 4])
    outs = a.leave(1.0)
    left = [x for _, x in of_type(outs, MemberUpdate) if x.member.node == "n1"]
    assert left and left[0].member.state is S.LEFT
    assert not a.leave_complete
    run_to(a, 5.0)
    assert a.leave_complete
    assert of_type(run_to(a, 10.0), Ping) == []  # a leaving node probes nobody
    assert a.leave(11.0) == []


# --------------------------------------------------------------------- load


def test_own_load_versions_only_grow_and_are_refreshed() -> None:
    a = node(1, [2])
    a.set_local_load(m.LoadReport(node="n1", version=5), 0.0)
    a.set_local_load(m.LoadReport(node="n1", version=3, queued=2), 0.1)
    own = a.load_view()["n1"]
    assert own.report.version == 6 and own.report.queued == 2
    run_to(a, 0.1 + CFG.load_refresh_interval + 0.01)
    assert a.load_view()["n1"].report.version == 7
    with pytest.raises(ValueError):
        a.set_local_load(m.LoadReport(node="n2", version=1), 1.0)


def test_load_from_a_previous_life_lifts_our_version() -> None:
    a = node(1, [2])
    from swarm.cluster.messages import LoadUpdate

    a.receive(addr(2), packet(LoadUpdate(m.LoadReport(node="n1", version=900))), 0.5)
    a.set_local_load(m.LoadReport(node="n1", version=10), 1.0)
    assert a.load_view()["n1"].report.version == 901


def test_load_events_and_view_age() -> None:
    a = node(1, [2])
    from swarm.cluster.messages import LoadUpdate

    a.receive(addr(2), packet(LoadUpdate(m.LoadReport(node="n2", version=4))), 2.0)
    a.receive(addr(2), packet(LoadUpdate(m.LoadReport(node="n2", version=3))), 2.5)
    (ev,) = a.poll_events()
    assert isinstance(ev, LoadUpdated) and ev.report.version == 4
    assert a.load_view()["n2"].age(5.0) == 3.0
    a.receive(addr(2), packet(LoadUpdate(m.LoadReport(node="stranger", version=1))), 3.0)
    assert "stranger" not in a.load_view()


# --------------------------------------------------------------- app gossip


def test_broadcast_app_rejects_what_cannot_travel() -> None:
    a = node(1, [2])
    with pytest.raises(ValueError):
        a.broadcast_app("big", {"x": "y" * 2000})
    with pytest.raises(TypeError):
        a.broadcast_app("odd", {"x": object()})


# ------------------------------------------------------------------- sizes


def test_every_datagram_fits_the_budget_under_heavy_gossip() -> None:
    cfg = MembershipConfig.lan()
    a = node(1, range(2, 60), cfg=cfg)
    for i in range(2, 60):
        a.receive(addr(i), packet(MemberUpdate(member(i, S.ALIVE, 1))), 0.5)
        from swarm.cluster.messages import LoadUpdate

        rep = m.LoadReport(node=f"n{i}", version=i, cpu_util=0.5, queued=i, mem_total=1 << 34)
        a.receive(addr(i), packet(LoadUpdate(rep)), 0.5)
    a.broadcast_app("k", {"v": "x" * 500})
    outs = run_to(a, 10.0)
    udp = [o for o in outs if not o.reliable]
    assert len(udp) > 20
    assert max(len(o.payload) for o in udp) <= cfg.max_packet_size - cfg.transport_overhead
    assert sum(1 for o in udp if len(o.payload) > 1000) > 0  # packets do get filled


def test_config_validation_and_profiles() -> None:
    with pytest.raises(ValueError):
        MembershipConfig(probe_interval=0)
    with pytest.raises(ValueError):
        MembershipConfig(indirect_checks=-1)
    lan, local = MembershipConfig.lan(), MembershipConfig.local(gossip_nodes=5)
    assert (lan.probe_interval, lan.probe_timeout, lan.gossip_interval) == (1.0, 0.5, 0.2)
    assert (lan.push_pull_interval, lan.max_packet_size, lan.awareness_max_multiplier) == (
        30.0,
        1400,
        8,
    )
    assert local.probe_interval < lan.probe_interval and local.gossip_nodes == 5


def test_idle_node_only_wakes_to_probe() -> None:
    a = node(1, [2])
    run_to(a, 2.0, answer=True)  # the initial alive broadcast drains
    times = []
    while (t := a.next_deadline()) < 4.0:
        times.append(t)
        run_to(a, t, answer=True)
    # one wake-up per probe round (the probe-timeout timer is cancelled by the ack),
    # plus the odd push-pull or reconnect timer: no gossip rounds with nothing to say
    probes = 2.0 / CFG.probe_interval
    assert len(times) <= probes + 4, times


# ----------------------------------------------------- order independence


_recs = st.builds(
    lambda i, state, inc, host: m.Member(
        f"n{i}", f"10.0.0.{host}", 7946, state=state, incarnation=inc, cluster=CLUSTER
    ),
    st.integers(1, 4),  # n1 is the node itself: accusations and refutations included
    st.sampled_from(list(S)),
    st.integers(0, 3),
    st.sampled_from([1, 2, 3, 4, 50]),
)


def _view(ms: Membership) -> dict[str, tuple[S, int, str]]:
    return {x.node: (x.state, x.incarnation, x.addr) for x in ms.members()}


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.tuples(_recs, st.booleans()), max_size=10),
    st.randoms(use_true_random=False),
)
def test_membership_view_is_independent_of_arrival_order(
    items: list[tuple[m.Member, bool]], rnd: random.Random
) -> None:
    """Gossip records and push-pull states, applied in any order, give one view."""

    def apply(order: list[tuple[m.Member, bool]]) -> dict[str, tuple[S, int, str]]:
        ms = node(1, [])
        for rec, via_push_pull in order:
            if via_push_pull:
                blob = CODEC.encode_push_pull(
                    member(7), [rec], [], app_state=None, reply=True, join=False, heal=False
                )
                ms.receive(addr(7), CODEC.encode_packet(CLUSTER, [blob]), 1.0, reliable=True)
            else:
                ms.receive(addr(7), packet(MemberUpdate(rec, "n7")), 1.0)
        assert ms.stats["error.internal"] == 0, ms.last_error
        # the rotating probe order holds exactly the live members but us, in key order
        live = [x.node for x in ms.members() if x.node != "n1" and x.state in (S.ALIVE, S.SUSPECT)]
        assert ms._order == sorted(live, key=ring_key)
        return _view(ms)

    first = apply(items)
    shuffled = list(items)
    rnd.shuffle(shuffled)
    assert apply(shuffled) == first
    assert apply(items + items) == first  # idempotent
