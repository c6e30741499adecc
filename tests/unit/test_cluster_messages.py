"""Membership wire codec: round trips, strictness, and that garbage only ever raises
WireError (and Membership.receive never raises at all)."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm import model as m
from swarm import wire
from swarm.cluster.membership import Membership, MembershipConfig
from swarm.cluster.messages import (
    Ack,
    AppBroadcast,
    ClusterMismatch,
    Codec,
    IndirectPing,
    LoadUpdate,
    MemberUpdate,
    Message,
    Nack,
    Ping,
    PushPull,
    blob_overhead,
    envelope_overhead,
    load_from_compact,
    load_to_compact,
)

CLUSTER = "test"


def _member(node: str = "n1", state: m.MemberState = m.MemberState.ALIVE, inc: int = 3) -> m.Member:
    return m.Member(
        node=node, addr="10.0.0.1", port=7946, state=state, incarnation=inc, cluster=CLUSTER
    )


def _report(node: str = "n1", version: int = 7, **kw: Any) -> m.LoadReport:
    return m.LoadReport(node=node, version=version, **kw)


MESSAGES: list[Message] = [
    Ping(seq=1, target="n2"),
    Ping(seq=2, target=""),
    Ack(seq=3),
    Nack(seq=4),
    IndirectPing(seq=5, target="n3", addr="10.0.0.3", port=7946, nack=True),
    MemberUpdate(_member()),
    MemberUpdate(_member(state=m.MemberState.SUSPECT), accuser="n9"),
    MemberUpdate(_member(state=m.MemberState.DEAD), accuser="n9"),
    MemberUpdate(_member(state=m.MemberState.LEFT)),
    LoadUpdate(_report()),
    LoadUpdate(
        _report(
            cpu_util=0.5,
            queued=3,
            gpus=(m.GpuDeviceFree(0, 50, 1 << 30, 2 << 30),),
            isolation="cgroup2",
            criu=True,
        )
    ),
    AppBroadcast(origin="n1", key="globals", incarnation=2, seq=9, payload={"tasks": ["a", "b"]}),
]


def _packet(codec: Codec, blobs: list[bytes], cluster: str = CLUSTER) -> bytes:
    return codec.encode_packet(cluster, blobs)


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda x: type(x).__name__)
def test_message_round_trip(msg: Message) -> None:
    codec = Codec()
    pkt = codec.decode_packet(_packet(codec, [codec.encode(msg)]), max_size=1400, cluster=CLUSTER)
    assert pkt.messages == (msg,)
    assert pkt.cluster == CLUSTER


def test_compound_packet_keeps_order_and_blobs() -> None:
    codec = Codec()
    blobs = [codec.encode(x) for x in MESSAGES]
    pkt = codec.decode_packet(_packet(codec, blobs), max_size=65507, cluster=CLUSTER)
    assert list(pkt.messages) == MESSAGES
    assert list(pkt.blobs) == blobs


def test_push_pull_round_trip() -> None:
    codec = Codec()
    members = [_member(f"n{i}", inc=i) for i in range(5)] + [_member("d", m.MemberState.DEAD)]
    loads = [_report(f"n{i}", version=100 + i, weight_sum=1.5) for i in range(3)]
    blob = codec.encode_push_pull(
        _member("me"), members, loads, app_state={"x": 1}, reply=True, join=False, heal=True
    )
    pkt = codec.decode_packet(_packet(codec, [blob]), max_size=wire.MAX_FRAME, cluster=CLUSTER)
    (pp,) = pkt.messages
    assert isinstance(pp, PushPull)
    assert pp.sender == _member("me")
    assert list(pp.members) == members
    assert list(pp.loads) == loads
    assert pp.app_state == {"x": 1}
    assert (pp.reply, pp.join, pp.heal) == (True, False, True)


def test_compact_load_leaves_defaults_out_and_round_trips() -> None:
    r = _report()
    assert load_to_compact(r) == {"n": "n1", "v": 7}
    full = _report(
        shares=0,
        reserved_shares=5,
        weight_sum=2.5,
        queued=1,
        running=2,
        slots=4,
        cpu_util=0.9,
        load_per_core=1.2,
        mem_available=1,
        mem_total=2,
        psi_cpu=3.0,
        psi_mem=4.0,
        cpus=6.5,
        gpus=(m.GpuDeviceFree(1, 2, 3, 4),),
        isolation="cgroup1",
        criu=True,
        task_seconds=14.0,
        unmovable_seconds=10.0,
    )
    assert load_from_compact(load_to_compact(full)) == full


def test_every_load_field_has_a_short_wire_name() -> None:
    from swarm import codec as model_codec
    from swarm.cluster.messages import _LOAD_SHORT

    full = model_codec.load_report_to_wire(_report())
    assert set(full) == set(_LOAD_SHORT)
    assert len(set(_LOAD_SHORT.values())) == len(_LOAD_SHORT)


def test_compact_load_accepts_long_names_but_not_both() -> None:
    assert load_from_compact({"node": "a", "v": 3}) == _report("a", 3)
    with pytest.raises(wire.SchemaError):
        load_from_compact({"n": "a", "node": "a", "v": 3})


def test_codec_cache_returns_same_objects() -> None:
    codec = Codec(cache_size=10)
    blob = codec.encode(MemberUpdate(_member()))
    a = codec.decode_message(blob, CLUSTER)
    b = codec.decode_message(bytes(blob), CLUSTER)
    assert a is b
    # the cluster is part of the key: a record is never shared across clusters
    c = codec.decode_message(blob, "other")
    assert isinstance(c, MemberUpdate) and c.member.cluster == "other"


def test_overhead_helpers_are_upper_bounds() -> None:
    codec = Codec()
    for n_msgs in (0, 1, 15, 16, 40):
        blobs = [b"x" * (i % 300) for i in range(n_msgs)]
        size = len(codec.encode_packet(CLUSTER, blobs))
        assert size <= envelope_overhead(CLUSTER) + sum(
            len(b) + blob_overhead(len(b)) for b in blobs
        )


# ------------------------------------------------------------------ strictness


def _raw_packet(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def _msg_packet(msg_obj: Any) -> bytes:
    return _raw_packet({"v": 1, "c": CLUSTER, "m": [_raw_packet(msg_obj)]})


@pytest.mark.parametrize(
    "data, code",
    [
        (b"", "malformed"),
        (b"\xc1", "malformed"),
        (_raw_packet([1, 2]), "invalid"),
        (_raw_packet({"v": 1, "c": CLUSTER}), "invalid"),
        (_raw_packet({"v": 1, "c": CLUSTER, "m": [], "extra": 1}), "invalid"),
        (_raw_packet({"v": 2, "c": CLUSTER, "m": []}), "version"),
        (_raw_packet({"v": True, "c": CLUSTER, "m": []}), "invalid"),
        (_raw_packet({"v": 1, "c": 5, "m": []}), "invalid"),
        (_raw_packet({"v": 1, "c": CLUSTER, "m": ["not bytes"]}), "invalid"),
        (_raw_packet({"v": 1, "c": "other", "m": []}), "cluster"),
        (_msg_packet({"t": "p", "s": 1, "n": "x", "zzz": 1}), "invalid"),
        (_msg_packet({"t": "p", "s": -1}), "invalid"),
        (_msg_packet({"t": "p", "s": "1"}), "invalid"),
        (_msg_packet({"t": "a"}), "invalid"),
        (_msg_packet({"t": "q", "s": 1}), "invalid"),
        (_msg_packet({"t": "m", "n": "a", "a": "h", "p": 70000, "i": 1, "s": 0}), "invalid"),
        (_msg_packet({"t": "m", "n": "a", "a": "h", "p": 1, "i": 1, "s": 4}), "invalid"),
        (_msg_packet({"t": "m", "n": "", "a": "h", "p": 1, "i": 1, "s": 0}), "invalid"),
        (_msg_packet({"t": "l", "r": {"n": "a", "v": 1, "bogus": 2}}), "invalid"),
        (_msg_packet({"t": "l", "r": {"n": "a", "v": 1, "c": "high"}}), "invalid"),
        (_msg_packet({"t": "x", "o": "a", "k": "k", "i": 0, "q": 1, "d": {1: 2}}), "malformed"),
        (_msg_packet({"t": "pp", "f": b"\x80", "m": []}), "invalid"),
        (_msg_packet({"t": "pp", "f": "x", "m": []}), "invalid"),
    ],
)
def test_bad_packets_raise_typed_errors(data: bytes, code: str) -> None:
    with pytest.raises(wire.WireError) as exc:
        Codec().decode_packet(data, max_size=65507, cluster=CLUSTER)
    assert exc.value.code == code


def test_cluster_mismatch_is_a_wire_error() -> None:
    assert issubclass(ClusterMismatch, wire.WireError)


def test_oversize_packet_rejected_before_parsing() -> None:
    codec = Codec()
    data = codec.encode_packet(CLUSTER, [b"x" * 2000])
    with pytest.raises(wire.FrameTooLarge):
        codec.decode_packet(data, max_size=1400, cluster=CLUSTER)


# ------------------------------------------------------------------ fuzzing


def _node() -> Membership:
    me = m.Member(node="me", addr="10.0.0.1", port=7946, cluster=CLUSTER)
    return Membership(MembershipConfig.local(), me, random.Random(1), 0.0)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_only_raise_wire_errors(data: bytes) -> None:
    try:
        Codec().decode_packet(data, max_size=65507, cluster=CLUSTER)
    except wire.WireError:
        pass


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.binary(max_size=8),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=3), inner, max_size=4)
    ),
    max_leaves=12,
)
_keys = st.sampled_from(
    ["t", "s", "n", "a", "p", "i", "f", "k", "r", "o", "q", "d", "m", "l", "j", "h", "zz"]
)
_types = st.sampled_from(["p", "a", "na", "pr", "m", "l", "x", "pp", "??"])


@st.composite
def _message_maps(draw: st.DrawFn) -> dict[str, Any]:
    d: dict[str, Any] = draw(st.dictionaries(_keys, _values, max_size=7))
    if draw(st.booleans()):
        d["t"] = draw(_types)
    return d


def _encodable(obj: Any) -> bytes | None:
    try:
        return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError):
        return None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_message_maps(), min_size=1, max_size=4), st.booleans())
def test_structured_garbage_only_raises_wire_errors_and_never_crashes_receive(
    maps: list[dict[str, Any]], reliable: bool
) -> None:
    blobs = [b for b in (_encodable(x) for x in maps) if b is not None]
    data = _raw_packet({"v": 1, "c": CLUSTER, "m": blobs})
    try:
        Codec().decode_packet(data, max_size=65507, cluster=CLUSTER)
    except wire.WireError:
        pass
    node = _node()
    node.receive(("10.0.0.9", 1), data, 1.0, reliable=reliable)
    node.tick(2.0)
    assert node.stats["error.internal"] == 0, node.last_error


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.booleans())
def test_receive_never_raises_on_random_bytes(data: bytes, reliable: bool) -> None:
    node = _node()
    assert node.receive(("10.0.0.9", 1), data, 1.0, reliable=reliable) == []
    assert node.stats["error.internal"] == 0
