"""The membership core's probe round-trip histogram (exported as swarm_probe_rtt_seconds)."""

from __future__ import annotations

import random

import pytest

from swarm import model as m
from swarm.cluster.membership import PROBE_RTT_BUCKETS, Membership, MembershipConfig
from swarm.cluster.messages import Ack, Codec, Ping

CLUSTER = "c"
CODEC = Codec()
PEER = ("10.0.0.2", 7946)


def _member(i: int) -> m.Member:
    return m.Member(f"n{i}", f"10.0.0.{i}", 7946, cluster=CLUSTER)


def _next_ping(ms: Membership) -> tuple[int, float]:
    """Tick until a probe goes out: (its sequence number, when)."""
    while True:
        now = ms.next_deadline()
        for o in ms.tick(now):
            for msg in CODEC.decode_packet(o.payload, max_size=65507, cluster=CLUSTER).messages:
                if isinstance(msg, Ping):
                    return msg.seq, now


def _ack(seq: int) -> bytes:
    return CODEC.encode_packet(CLUSTER, [CODEC.encode(Ack(seq))])


def test_acked_probes_land_in_their_buckets() -> None:
    cfg = MembershipConfig.lan()
    ms = Membership(cfg, _member(1), random.Random(1), 0.0)
    ms.bootstrap([_member(2)], 0.0)
    assert sum(ms.probe_rtt) == 0 and ms.probe_rtt_sum == 0.0
    rtts = [0.0004, 0.003, 0.003, 0.2, 0.45]
    assert max(rtts) < cfg.probe_timeout
    for rtt in rtts:
        seq, sent = _next_ping(ms)
        ms.receive(PEER, _ack(seq), sent + rtt)
    got = ms.probe_rtt
    assert len(got) == len(PROBE_RTT_BUCKETS) + 1 and sum(got) == len(rtts)
    assert got[0] == 1  # <= 1 ms
    assert got[PROBE_RTT_BUCKETS.index(0.005)] == 2  # 3 ms: in (2.5 ms, 5 ms]
    assert got[PROBE_RTT_BUCKETS.index(0.25)] == 1
    assert got[PROBE_RTT_BUCKETS.index(0.5)] == 1
    assert ms.probe_rtt_sum == pytest.approx(sum(rtts))
    # an ack that answers no probe is not a sample
    ms.receive(PEER, _ack(10_000), 1e6)
    assert sum(ms.probe_rtt) == len(rtts)
