"""mDNS discovery on loopback, static seeds, the peer snapshot and join backoff."""

from __future__ import annotations

import json
import os
import random
import uuid
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from zeroconf import IPVersion

from swarm.runtime.discovery import (
    DiscoveredPeer,
    Discovery,
    JoinBackoff,
    SeedError,
    instance_label,
    load_peers,
    open_discovery,
    parse_seeds,
    save_peers,
)

LO = "127.0.0.1"


def loopback(node: str, cluster: str, port: int) -> AbstractAsyncContextManager[Discovery]:
    return open_discovery(
        node=node,
        cluster=cluster,
        host=LO,
        port=port,
        interfaces=[LO],
        ip_version=IPVersion.V4Only,
    )


# ------------------------------------------------------------------ zeroconf


@pytest.mark.slow
async def test_three_nodes_find_each_other_and_other_cluster_is_filtered() -> None:
    # A random cluster name keeps concurrent test runs on this host apart.
    cluster = "test-" + uuid.uuid4().hex[:8]
    other = cluster + "-other"
    specs = [("n1", cluster, 7001), ("n2", cluster, 7002), ("n3", cluster, 7003)]
    seen: dict[str, dict[str, DiscoveredPeer]] = {}

    async with AsyncExitStack() as stack:
        nodes: list[Discovery] = [
            await stack.enter_async_context(loopback(n, c, p)) for n, c, p in specs
        ]
        # same node id as a member, other cluster: filtered as a foreigner, not as "self"
        stranger: Discovery = await stack.enter_async_context(loopback("n1", other, 7009))

        async def watch(d: Discovery) -> None:
            seen[d.node] = {}
            async for peer in d.peers:
                seen[d.node][peer.node] = peer
                if len(seen[d.node]) == 2:
                    return

        # generous: mDNS probing alone takes about a second
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for d in nodes:
                    nursery.start_soon(watch, d)
            # the stranger was seen and filtered out by every member
            while not all(d.counters["filtered_cluster"] >= 1 for d in nodes):
                await trio.sleep(0.05)
            while stranger.counters["filtered_cluster"] < 3:
                await trio.sleep(0.05)

    ports = {"n1": 7001, "n2": 7002, "n3": 7003}
    for me, peers in seen.items():
        assert set(peers) == set(ports) - {me}
        for name, peer in peers.items():
            assert peer == DiscoveredPeer(name, LO, ports[name], cluster)
    assert all(d.zc.done for d in nodes)  # closed on exit
    assert stranger.counters["resolved"] == 0


async def test_cancellation_closes_zeroconf() -> None:
    cluster = "test-" + uuid.uuid4().hex[:8]
    holder: list[Discovery] = []
    with trio.move_on_after(0.3):
        async with loopback("solo", cluster, 7100) as d:
            holder.append(d)
            await trio.sleep_forever()
    assert holder[0].zc.done
    with pytest.raises(trio.EndOfChannel):
        holder[0].peers.receive_nowait()


async def test_exception_in_body_is_not_wrapped_in_a_group() -> None:
    with pytest.raises(KeyError):
        async with loopback("solo", "test-" + uuid.uuid4().hex[:8], 7101):
            raise KeyError("mine")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "my-host", ""])
async def test_announce_needs_a_concrete_address(host: str) -> None:
    with pytest.raises(ValueError):
        async with open_discovery(node="a", cluster="c", host=host, port=1):
            pass


def test_instance_label_is_dns_safe_and_unique() -> None:
    a = instance_label("web-01.example.com", "prod")
    assert a.startswith("web-01-example-com-") and len(a) <= 63
    assert instance_label("web-01.example.com", "staging") != a
    assert instance_label("ü" * 100, "c").startswith("node-")
    assert len(instance_label("x" * 300, "c")) <= 63


# --------------------------------------------------------------------- seeds


def test_parse_seeds_forms() -> None:
    assert parse_seeds("") == []
    assert parse_seeds(" , ") == []
    assert parse_seeds("10.0.0.1:7946,host2:7000") == [("10.0.0.1", 7946), ("host2", 7000)]
    assert parse_seeds("a.example:1  b:2, a.example:1") == [("a.example", 1), ("b", 2)]
    assert parse_seeds("[::1]:7946,[fe80::1%eth0]:1") == [("::1", 7946), ("fe80::1%eth0", 1)]
    assert parse_seeds("h,[::1]", default_port=7946) == [("h", 7946), ("::1", 7946)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("host", "missing port"),
        ("host:", "missing port"),
        (":7946", "missing host"),
        ("host:abc", "not a number"),
        ("host:0", "out of range"),
        ("host:70000", "out of range"),
        ("::1:7946", "in brackets"),
        ("[::1:7946", "missing ']'"),
        ("[::1]7946", "expected ':port'"),
        ("[nothost]:1", "not an IPv6 address"),
        ("bad/host:1", "not a valid host"),
        ("a..b:1", "not a valid host"),
        ("good:1,-bad:2", "'-bad:2'"),
    ],
)
def test_parse_seeds_errors(text: str, message: str) -> None:
    with pytest.raises(SeedError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_seeds(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_parse_seeds_random_text_only_seed_error(text: str) -> None:
    try:
        out = parse_seeds(text)
    except SeedError:
        return
    for host, port in out:
        assert host and 1 <= port <= 65535


# ------------------------------------------------------------------ snapshot


PEERS = [
    DiscoveredPeer("n1", "10.0.0.1", 7946, "prod"),
    DiscoveredPeer("n2", "::1", 7000, "prod", version=2),
]


def test_snapshot_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "peers.json"
    save_peers(p, PEERS)
    assert load_peers(p) == (PEERS, None)
    save_peers(p, PEERS[:1])  # replaced, not appended
    assert load_peers(p) == (PEERS[:1], None)
    assert oct(os.stat(p).st_mode & 0o777) == "0o600"
    assert sorted(os.listdir(tmp_path)) == ["peers.json"]  # no temp file left behind


def test_snapshot_missing_file_is_quiet(tmp_path: Path) -> None:
    assert load_peers(tmp_path / "none.json") == ([], None)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"version": 1}',
        b'{"version": 99, "peers": []}',
    ],
)
def test_snapshot_corrupt_file(tmp_path: Path, content: bytes) -> None:
    p = tmp_path / "peers.json"
    p.write_bytes(content)
    peers, warning = load_peers(p)
    assert peers == []
    assert warning is not None and str(p) in warning


def test_snapshot_skips_bad_entries(tmp_path: Path) -> None:
    p = tmp_path / "peers.json"
    good = {"node": "n1", "addr": "10.0.0.1", "port": 1, "cluster": "c"}
    bad = [
        {"node": "", "addr": "x", "port": 1, "cluster": "c"},
        {"node": "n", "addr": "x", "port": True, "cluster": "c"},
        {"node": "n", "addr": "x", "port": 0, "cluster": "c"},
        {"node": "n", "addr": "x", "port": 1},
        "str",
    ]
    p.write_text(json.dumps({"version": 1, "peers": [good, *bad]}))
    peers, warning = load_peers(p)
    assert peers == [DiscoveredPeer("n1", "10.0.0.1", 1, "c")]
    assert warning is not None and "skipped 5" in warning


def test_snapshot_unreadable_path(tmp_path: Path) -> None:
    peers, warning = load_peers(tmp_path)  # a directory
    assert peers == [] and warning is not None


def test_save_failure_keeps_old_snapshot(tmp_path: Path) -> None:
    p = tmp_path / "peers.json"
    save_peers(p, PEERS)
    with pytest.raises(OSError):
        save_peers(tmp_path / "missing-dir" / "peers.json", PEERS)
    assert load_peers(p) == (PEERS, None)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_load_random_bytes_never_raises(data: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "peers.json"
        p.write_bytes(data)
        peers, _ = load_peers(p)
        assert isinstance(peers, list)


# ------------------------------------------------------------------- backoff


def test_backoff_grows_caps_and_jitters() -> None:
    b = JoinBackoff(random.Random(1), base=1.0, cap=30.0, jitter=0.5)
    delays = [b.next_delay() for _ in range(12)]
    raw = [min(30.0, 2.0**i) for i in range(12)]
    for d, r in zip(delays, raw, strict=True):
        assert r * 0.5 <= d <= r
    assert len(set(delays)) == len(delays)  # jittered
    b.reset()
    assert 0.5 <= b.next_delay() <= 1.0


def test_backoff_deterministic_and_no_overflow() -> None:
    a = JoinBackoff(random.Random(5), factor=10.0, cap=1e6)
    b = JoinBackoff(random.Random(5), factor=10.0, cap=1e6)
    da = [a.next_delay() for _ in range(5000)]
    assert da == [b.next_delay() for _ in range(5000)]
    assert max(da) <= 1e6
    assert JoinBackoff(random.Random(0), jitter=0.0).next_delay() == 1.0


@pytest.mark.parametrize(
    "kw",
    [{"base": 0.0}, {"base": 5.0, "cap": 1.0}, {"factor": 0.5}, {"jitter": 1.5}],
)
def test_backoff_validation(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        JoinBackoff(random.Random(0), **kw)  # type: ignore[arg-type]
