"""Frames and codecs: round trips, and every kind of bad input gets a typed error."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm import codec, wire
from swarm import model as m

text = st.text(max_size=20)
specs = st.builds(
    m.TaskSpec,
    id=st.from_regex(r"[a-z0-9]{1,16}", fullmatch=True),
    argv=st.lists(text, min_size=1, max_size=5).map(tuple),
    name=text,
    env=st.dictionaries(st.from_regex(r"[A-Z_]{1,8}", fullmatch=True), text, max_size=4),
    cwd=st.none() | st.just("/tmp"),
    weight=st.floats(min_value=0.01, max_value=1000, allow_nan=False),
    reserve_shares=st.integers(0, 4096),
    is_global=st.booleans(),
    labels=st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), text, max_size=3),
    uid=st.none() | st.integers(0, 65535),
    user=st.none() | text,
    no_retry=st.booleans(),
    cpu=st.none() | st.floats(min_value=0.1, max_value=64),
    mem=st.none() | st.integers(1, 1 << 40),
    gpu=st.none()
    | st.builds(
        m.GpuRequest, core=st.integers(1, 800), memory_bytes=st.none() | st.integers(1, 1 << 36)
    ),
    migrate=st.sampled_from(list(m.MigrateMode)),
    expected_runtime=st.none() | st.floats(min_value=0.1, max_value=1e6),
    submitted_at=st.floats(min_value=0, max_value=2e9),
    home=text,
)


@settings(max_examples=150, deadline=None)
@given(specs)
def test_task_spec_round_trip(spec: m.TaskSpec) -> None:
    obj = wire.unpack(wire.pack(codec.task_spec_to_wire(spec)))
    assert codec.task_spec_from_wire(obj) == spec


@settings(max_examples=80, deadline=None)
@given(specs, st.lists(st.sampled_from(list(m.TaskState)), max_size=8))
def test_task_record_round_trip(spec: m.TaskSpec, moves: list[m.TaskState]) -> None:
    t = m.new_task(spec, 1.0, "n1")
    for i, dst in enumerate(moves):
        if dst in m.ALLOWED_TRANSITIONS[t.state]:
            t = m.transition(t, dst, 2.0 + i, "x", exit_code=1 if dst.terminal else None)
    obj = wire.unpack(wire.pack(codec.task_to_wire(t)))
    assert codec.task_from_wire(obj) == t


def test_load_report_round_trip() -> None:
    r = m.LoadReport(node="n1", version=7, gpus=(m.GpuDeviceFree(0, 50, 1 << 30, 1 << 34),))
    assert codec.load_report_from_wire(wire.unpack(wire.pack(codec.load_report_to_wire(r)))) == r


def test_frames_split_and_joined() -> None:
    frames = b"".join(wire.encode_frame({"i": i}) for i in range(50))
    dec = wire.FrameDecoder()
    out = []
    for i in range(0, len(frames), 7):
        out += dec.feed(frames[i : i + 7])
    assert out == [{"i": i} for i in range(50)]
    assert dec.pending == 0


def test_oversized_length_prefix_rejected_before_buffering() -> None:
    dec = wire.FrameDecoder(max_size=1024)
    with pytest.raises(wire.FrameTooLarge):
        dec.feed(struct.pack(">I", 10_000_000))


def test_oversized_frame_not_encoded() -> None:
    with pytest.raises(wire.FrameTooLarge):
        wire.encode_frame({"x": "a" * 2000}, max_size=1000)


def test_malformed_body() -> None:
    with pytest.raises(wire.MalformedFrame):
        wire.FrameDecoder().feed(struct.pack(">I", 3) + b"\xc1\xc1\xc1")


def test_unknown_field_rejected_with_its_name() -> None:
    obj = codec.task_spec_to_wire(m.TaskSpec(id="a", argv=("x",)))
    obj["frobnicate"] = 1
    with pytest.raises(wire.SchemaError, match="frobnicate"):
        codec.task_spec_from_wire(obj)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("argv", [], "must not be empty"),
        ("argv", "ls", "list of strings"),
        ("weight", "heavy", "must be a number"),
        ("weight", float("nan"), "finite"),
        ("reserve_shares", -1, "out of range"),
        ("migrate", "teleport", "must be one of"),
        ("env", {"A": 1}, "map of strings"),
        ("is_global", 1, "boolean"),
    ],
)
def test_schema_errors_name_the_field(field: str, value: object, message: str) -> None:
    obj = codec.task_spec_to_wire(m.TaskSpec(id="a", argv=("x",)))
    obj[field] = value
    with pytest.raises(wire.SchemaError, match=message):
        codec.task_spec_from_wire(obj)


def test_missing_required_field() -> None:
    with pytest.raises(wire.SchemaError, match="missing field 'id'"):
        codec.task_spec_from_wire({"argv": ["x"]})


def test_version_mismatch() -> None:
    with pytest.raises(wire.VersionMismatch):
        wire.check_version({"v": 99, "op": "x"}, "request")


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_decoder_only_raises_wire_errors_on_random_bytes(data: bytes) -> None:
    dec = wire.FrameDecoder(max_size=4096)
    try:
        objs = dec.feed(data)
    except wire.WireError:
        return
    for obj in objs:
        for decode in (
            codec.task_spec_from_wire,
            codec.task_from_wire,
            codec.load_report_from_wire,
        ):
            try:
                wire.decode_with(decode, obj)
            except wire.WireError:
                pass


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats()
        | st.text(max_size=5)
        | st.binary(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_codecs_only_raise_schema_errors_on_random_structures(obj: object) -> None:
    for decode in (
        codec.task_spec_from_wire,
        codec.task_from_wire,
        codec.load_report_from_wire,
        codec.member_from_wire,
    ):
        try:
            wire.decode_with(decode, obj)
        except wire.WireError:
            pass


def test_unpack_rejects_trailing_garbage() -> None:
    with pytest.raises(wire.MalformedFrame):
        wire.unpack(msgpack.packb({"a": 1}) + b"\x00")
