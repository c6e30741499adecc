"""Admission policies for unauthenticated input: token buckets and TCP connection slots."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.cluster.ratelimit import ConnGate, SourceLimiter, TokenBucket


def test_bucket_starts_full_refills_at_rate_and_caps_at_burst() -> None:
    b = TokenBucket(rate=10.0, burst=3.0)
    assert [b.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert not b.take(0.05)  # half a token
    assert b.take(0.1)
    assert not b.take(0.1)
    b.refill(100.0)
    assert b.tokens == 3.0
    assert b.take(100.0, 3.0) and not b.take(100.0)
    assert not b.take(50.0)  # a clock going backwards refills nothing
    with pytest.raises(ValueError):
        TokenBucket(rate=0.0, burst=1.0)


def test_source_limiter_isolates_sources_and_bounds_the_total() -> None:
    lim = SourceLimiter(rate=1.0, burst=5.0, total_rate=10.0, total_burst=12.0)
    assert sum(lim.allow("10.0.0.9", 0.0) for _ in range(1000)) == 5  # the flooder
    assert sum(lim.allow("10.0.0.1", 0.0) for _ in range(3)) == 3  # a peer is not hurt
    assert sum(lim.allow("10.0.0.2", 0.0) for _ in range(10)) == 4  # the shared bucket
    assert lim.denied == 995 + 6
    # a refused source was not charged to the shared bucket
    assert lim.allow("10.0.0.3", 0.2)


def test_source_limiter_forgets_least_recent_sources() -> None:
    lim = SourceLimiter(rate=1.0, burst=1.0, total_rate=1e6, total_burst=1e6, max_sources=2)
    assert lim.allow("a", 0.0) and lim.allow("b", 0.0) and lim.allow("c", 0.0)
    assert lim.sources == 2
    assert not lim.allow("c", 0.0)


def test_gate_evicts_the_oldest_pending_of_a_full_source() -> None:
    g = ConnGate(max_total=10, max_pending=8, max_pending_per_source=2)
    assert g.open(1, "evil", 0.0).admit
    assert g.open(2, "evil", 1.0).admit
    adm = g.open(3, "evil", 2.0)
    assert adm.admit and adm.evict == (1,) and adm.reason == "source_pending_full"
    assert g.open(4, "peer", 3.0) == g.open(5, "peer2", 3.0)  # admitted, nothing evicted
    assert g.pending_from("evil") == 2 and g.total == 4
    g.close(1)  # closing an evicted connection later is harmless
    assert g.total == 4


def test_gate_when_all_pending_slots_are_taken_evicts_from_the_biggest_source() -> None:
    g = ConnGate(max_total=100, max_pending=4, max_pending_per_source=3)
    for i in range(3):
        assert g.open(i, "evil", float(i)).admit
    assert g.open(10, "peer", 5.0).admit
    adm = g.open(11, "other", 6.0)
    assert adm.admit and adm.evict == (0,) and adm.reason == "pending_full"
    assert g.pending == 4


def test_gate_authenticated_connections_are_never_evicted() -> None:
    g = ConnGate(max_total=3, max_pending=3, max_pending_per_source=3)
    for i in range(3):
        g.open(i, "peer", 0.0)
    g.authenticated(0)
    g.authenticated(1)
    adm = g.open(3, "evil", 1.0)
    assert adm.admit and adm.evict == (2,)
    g.authenticated(3)
    adm = g.open(4, "evil", 2.0)
    assert not adm.admit and adm.evict == () and adm.reason == "full"
    g.close(0)
    assert g.open(4, "peer", 3.0).admit
    with pytest.raises(ValueError):
        g.open(4, "peer", 3.0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["open", "auth", "close"]), st.integers(0, 30), st.integers(0, 3))
    )
)
def test_gate_invariants(ops: list[tuple[str, int, int]]) -> None:
    g = ConnGate(max_total=12, max_pending=6, max_pending_per_source=3)
    live: set[int] = set()
    for op, conn, src in ops:
        if op == "open":
            if g.is_open(conn):
                continue
            adm = g.open(conn, f"s{src}", 0.0)
            live -= set(adm.evict)
            if adm.admit:
                live.add(conn)
        elif op == "auth":
            g.authenticated(conn)
        else:
            g.close(conn)
            live.discard(conn)
        assert g.total == len(live) <= 12
        assert g.pending <= 6
        assert all(g.pending_from(f"s{s}") <= 3 for s in range(4))
        assert all(g.is_open(c) for c in live)


def test_needs_derive_is_true_only_for_unseen_instances_of_our_keys() -> None:
    import os

    from swarm.crypto import Keyring, Sealer

    key = bytes(range(32))
    rx = Sealer(Keyring.from_keys([key]), "c")
    tx = Sealer(Keyring.from_keys([key]), "c")
    other = Sealer(Keyring.from_keys([bytes(32)]), "c")
    pkt = tx.seal(b"x", 1000.0)
    assert rx.needs_derive(pkt)
    rx.open(pkt, 1000.0)
    assert not rx.needs_derive(tx.seal(b"y", 1000.0))  # cached: no HKDF to pay
    forged = pkt[:5] + os.urandom(8) + pkt[13:]  # our key hint, a new instance
    assert rx.needs_derive(forged)
    assert not rx.needs_derive(other.seal(b"z", 1000.0))  # no key of ours: cheap reject
    assert not rx.needs_derive(b"\x01short")
