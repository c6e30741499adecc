"""Fuzzing every decoder that takes bytes from outside (issue 17).

Each one may only ever raise its typed error: wire.WireError (and subclasses) for
frames, model codecs, gossip packets, socket requests and journal rows;
crypto.CryptoError for sealed packets. Anything else escaping would crash a
connection handler, a gossip receive loop or an agent's recovery.

Two kinds of input per decoder: arbitrary bytes / arbitrary msgpack values, and a
valid encoding with one field replaced, dropped or added (which reaches far deeper
into the schema than random bytes do).
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import msgpack
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm import codec, crypto, request_checks, wire
from swarm import model as m
from swarm.cluster import gang as gg
from swarm.cluster import gangwire, succession
from swarm.cluster import handoff as hf
from swarm.cluster import messages as msgs
from swarm.node import replicas
from swarm.policy import latebind
from swarm.runtime import fencingio, gangio, handoffbatch, journaldb, net, replicabatch
from swarm.runtime import journal as jr
from swarm.runtime.api import ApiServer, Ops, PeerCred

# SWARM_FUZZ_EXAMPLES=5000 for a longer hunt; the default keeps the file near 30 s
FUZZ = settings(
    max_examples=int(os.environ.get("SWARM_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# ----------------------------------------------------------------- strategies

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | st.binary(max_size=40)
)
# anything msgpack can carry (map keys: strings, as the decoders' strict_map_key asks)
values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6)
    ),
    max_leaves=25,
)


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


@st.composite
def mutated(draw: st.DrawFn, valid: dict[str, Any]) -> Any:
    """`valid` with one field replaced by any value, dropped, or one field added; or
    a nested map/list field mutated in turn."""
    obj = dict(valid)
    how = draw(st.sampled_from(["replace", "drop", "add", "nested"]))
    keys = sorted(obj)
    if how == "add" or not keys:
        obj[draw(st.text(max_size=8))] = draw(values)
        return obj
    key = draw(st.sampled_from(keys))
    if how == "drop":
        del obj[key]
    elif how == "nested" and isinstance(obj[key], dict) and obj[key]:
        obj[key] = draw(mutated(obj[key]))
    elif how == "nested" and isinstance(obj[key], list) and obj[key]:
        items = list(obj[key])
        i = draw(st.integers(0, len(items) - 1))
        items[i] = draw(mutated(items[i]) if isinstance(items[i], dict) else values)
        obj[key] = items
    else:
        obj[key] = draw(values)
    return obj


def only_typed(fn: Callable[[], Any], typed: type[BaseException] = wire.WireError) -> None:
    try:
        fn()
    except typed:
        pass


# ------------------------------------------------------------------ samples


def _field(obj: Any, key: str) -> Any:
    """A field of an RPC message (the transport hands handlers maps only)."""
    return obj.get(key) if isinstance(obj, dict) else None


SPEC = m.TaskSpec(
    id="t0123456789abcdef",
    argv=("python", "-c", "print(1)"),
    name="n",
    env={"A": "1"},
    cwd="/tmp",
    labels={"k": "v"},
    uid=1000,
    user="u",
    cpu=1.5,
    mem=1 << 20,
    gpu=m.GpuRequest(core=50, memory_bytes=1 << 30),
    expected_runtime=3.0,
    submitted_at=1.0,
    home="n1",
)
GANG_SPEC = attrs.evolve(
    SPEC,
    id="g0123456789abcdef",
    gang=m.GangRequest(size=4, mode="nonstrict", min_available=3, restart=True, timeout=60.0),
)
TASK = m.new_task(SPEC, 2.0, "n1")
GPUF = m.GpuDeviceFree(index=0, free_core=50, free_mem=1 << 30, total_mem=1 << 34)
LOAD = m.LoadReport(node="n1", version=5, cpus=4.0, mem_total=1 << 33, gpus=(GPUF,))
MEMBER = m.Member(node="n2", addr="10.0.0.2", port=7946, incarnation=3, cluster="c")
NOTICE = succession.Notice("n1", "t0123456789abcdef", "n2", 3, "n2", ("n3", "n4"), 1)

CODECS: list[tuple[str, Callable[[Any], Any], dict[str, Any]]] = (
    [
        ("task", codec.task_from_wire, codec.task_to_wire(TASK)),
        ("task_spec", codec.task_spec_from_wire, codec.task_spec_to_wire(SPEC)),
        ("transition", codec.transition_from_wire, codec.transition_to_wire(TASK.history[0])),
        ("load_report", codec.load_report_from_wire, codec.load_report_to_wire(LOAD)),
        ("member", codec.member_from_wire, codec.member_to_wire(MEMBER)),
        ("gpu_request", codec.gpu_request_from_wire, codec.gpu_request_to_wire(SPEC.gpu)),  # type: ignore[arg-type]
        (
            "adoption_notice",
            lambda obj: succession.notice_from_wire(obj, "n1"),
            succession.notice_to_wire(NOTICE),
        ),
        (
            "replica_msg",
            replicas.replica_msg_from_wire,
            replicas.replica_msg_to_wire(
                replicas.ReplicaMsg("hold", SPEC.id, "n1", "n2", ("n3",), SPEC)
            ),
        ),
        (
            "replica_release_final",
            replicas.replica_msg_from_wire,
            replicas.replica_msg_to_wire(
                replicas.ReplicaMsg(
                    "release",
                    SPEC.id,
                    "n1",
                    "n2",
                    ("n3",),
                    final=replicas.Final("succeeded", 0, None, "", 3.0),
                )
            ),
        ),
        ("lease_request", fencingio.lease_request_from_wire, {"task": SPEC.id, "epoch": 3}),
        ("lease_reply", fencingio.lease_reply_from_wire, {"granted": True, "why": ""}),
    ]
    + [
        (f"gang_{type(msg).__name__.lower()}", gangwire.from_wire, gangwire.to_wire(msg))
        for msg in (
            gg.Prepare("g0123456789abcdef", 2, (0, 3), 5.0),
            gg.Commit("g0123456789abcdef", 2, {0: 0, 3: 3}, 4, "n2", 29500, 15.0),
            gg.Renew("g0123456789abcdef", 2, 7, 15.0),
            gg.Abort("g0123456789abcdef", 2, "rank 1 exited 3"),
            gg.Granted("g0123456789abcdef", 2, 29500),
            gg.Refused("g0123456789abcdef", 2, "room for 0 of 2"),
            gg.Started("g0123456789abcdef", 2, (0, 3)),
            gg.Alive("g0123456789abcdef", 2, (0,), {3: 1}),
            gg.Gone("g0123456789abcdef", 2, "no hold"),
            gg.Aborted("g0123456789abcdef", 2),
        )
    ]
    + [
        # issue 22 in the agent: a gang's and a member's record, and the op `gang` itself
        ("task_spec_gang", codec.task_spec_from_wire, codec.task_spec_to_wire(GANG_SPEC)),
        # issue 23: an array's record and one of its elements
        (
            "task_spec_array",
            codec.task_spec_from_wire,
            codec.task_spec_to_wire(
                attrs.evolve(SPEC, array="0-99:3,200-300%5", after=("ok:t1,t2_3~bob", "any:t4"))
            ),
        ),
        (
            "task_spec_element",
            codec.task_spec_from_wire,
            codec.task_spec_to_wire(
                attrs.evolve(SPEC, id="t0123456789abcdef_7", element=m.ArrayRole(SPEC.id, 7))
            ),
        ),
        (
            "task_spec_member",
            codec.task_spec_from_wire,
            codec.task_spec_to_wire(
                attrs.evolve(
                    SPEC,
                    id="g0123456789abcdef.1",
                    member=m.GangRole(GANG_SPEC.id, "n1", 2, 1, 1, 4),
                )
            ),
        ),
        (
            "gang_op",
            gangio.gang_request_from_wire,
            {
                "op": "gang",
                "msg": gangwire.to_wire(gg.Commit(GANG_SPEC.id, 2, {0: 0}, 4, "n2", 29500, 15.0)),
                "spec": codec.task_spec_to_wire(GANG_SPEC),
                "run": 1,
                "master_addr": "10.0.0.2",
            },
        ),
        (
            "handoff_batch",
            lambda obj: handoffbatch.batch_from_wire(_field(obj, "reqs")),
            {
                "op": "handoff_batch",
                "reqs": handoffbatch.batch_to_wire(
                    [hf.Offer(SPEC.id, 3, SPEC), hf.Commit(SPEC.id, 3), hf.Query("t9", 1, 2, True)]
                ),
            },
        ),
        (
            "handoff_batch_replies",
            lambda obj: handoffbatch.replies_from_wire(
                _field(obj, "replies"), [hf.Commit(SPEC.id, 3), hf.Query("t9", 1)]
            ),
            {
                "replies": [
                    hf.reply_to_wire(hf.Reply(SPEC.id, 3, True, at=1_764_000_000_123)),
                    hf.reply_to_wire(hf.Reply("t9", 1, True, hf.Verdict.WAIT, "offer in flight")),
                ]
            },
        ),
        (
            "replica_batch",
            lambda obj: replicabatch.batch_from_wire(_field(obj, "msgs")),
            {
                "op": "replica_batch",
                "msgs": [
                    replicas.replica_msg_to_wire(
                        replicas.ReplicaMsg("hold", SPEC.id, "n1", "n2", ("n3",), SPEC)
                    ),
                    replicas.replica_msg_to_wire(
                        replicas.ReplicaMsg("runner", SPEC.id, "n1", "n2", ("n3",))
                    ),
                ],
            },
        ),
        (
            "replica_batch_answers",
            lambda obj: replicabatch.answers_from_wire(_field(obj, "answers"), 2),
            {"answers": [{"ok": True, "reason": None}, {"ok": False, "reason": "not home"}]},
        ),
        # issue 24: late binding's op `late` (reserve, cancel, pull)
        ("late", latebind.msg_from_wire, latebind.msg_to_wire(latebind.PULL, SPEC.id)),
    ]
)


def test_the_samples_decode() -> None:
    for _, dec, valid in CODECS:
        dec(valid)


# ------------------------------------------------------------- wire frames


@FUZZ
@given(st.binary(max_size=300))
def test_unpack_any_bytes(data: bytes) -> None:
    only_typed(lambda: wire.unpack(data))


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=8), st.integers(0, 4096))
def test_frame_decoder_any_chunks(chunks: list[bytes], limit: int) -> None:
    def run() -> None:
        d = wire.FrameDecoder(max(1, limit))
        for c in chunks:
            d.feed(c)

    only_typed(run)


@FUZZ
@given(values)
def test_frame_decoder_any_framed_value(obj: Any) -> None:
    body = _pack(obj)
    only_typed(lambda: wire.FrameDecoder().feed(len(body).to_bytes(4, "big") + body))


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=8), st.integers(1, 512))
def test_tcp_frame_splitter_any_chunks(chunks: list[bytes], first: int) -> None:
    def run() -> None:
        s = net._FrameSplitter(4096, first)
        for c in chunks:
            s.feed(c)

    only_typed(run)


# ------------------------------------------------------------- model codecs


@pytest.mark.parametrize(("name", "dec", "valid"), CODECS, ids=[c[0] for c in CODECS])
def test_codec_any_value(name: str, dec: Callable[[Any], Any], valid: dict[str, Any]) -> None:
    @FUZZ
    @given(values)
    def any_value(obj: Any) -> None:
        only_typed(lambda: dec(obj))

    @FUZZ
    @given(mutated(valid))
    def mutated_value(obj: Any) -> None:
        only_typed(lambda: dec(obj))

    any_value()
    mutated_value()


# ------------------------------------------------------------- gossip packets

CLUSTER = "c"
_codec = msgs.Codec()
BLOBS = [
    _codec.encode(msgs.Ping(seq=1, target="n2")),
    _codec.encode(msgs.IndirectPing(seq=2, target="n3", addr="10.0.0.3", port=1, nack=True)),
    _codec.encode(msgs.MemberUpdate(member=MEMBER, accuser="n1")),
    _codec.encode(msgs.LoadUpdate(report=LOAD)),
    _codec.encode(msgs.AppBroadcast(origin="n1", key="k", incarnation=1, seq=2, payload={"a": 1})),
    _codec.encode_push_pull(
        MEMBER, [MEMBER], [LOAD], app_state={"x": [1]}, reply=True, join=False, heal=False
    ),
]
MESSAGE_MAPS = [msgpack.unpackb(b, raw=False) for b in BLOBS]


def _decode_packet(data: bytes) -> None:
    msgs.Codec().decode_packet(data, max_size=65536, cluster=CLUSTER)


def test_the_gossip_samples_decode() -> None:
    p = msgs.Codec().decode_packet(
        _codec.encode_packet(CLUSTER, BLOBS), max_size=65536, cluster=CLUSTER
    )
    assert len(p.messages) == len(BLOBS)


@FUZZ
@given(st.binary(max_size=400))
def test_packet_any_bytes(data: bytes) -> None:
    only_typed(lambda: _decode_packet(data))


@FUZZ
@given(values)
def test_packet_any_value(obj: Any) -> None:
    only_typed(lambda: _decode_packet(_pack(obj)))


@FUZZ
@given(st.sampled_from(MESSAGE_MAPS).flatmap(mutated))
def test_message_mutated(obj: Any) -> None:
    blob = _pack(obj)
    only_typed(lambda: _decode_packet(_codec.encode_packet(CLUSTER, [blob])))


@FUZZ
@given(st.lists(st.binary(max_size=60), max_size=4))
def test_packet_of_random_blobs(blobs: list[bytes]) -> None:
    only_typed(lambda: _decode_packet(_codec.encode_packet(CLUSTER, blobs)))


@FUZZ
@given(values, st.booleans())
def test_push_pull_records(obj: Any, as_member: bool) -> None:
    rec = _pack(obj)
    pp = _codec.encode_push_pull(
        MEMBER, [], [], app_state=None, reply=False, join=False, heal=False
    )
    d = msgpack.unpackb(pp, raw=False)
    d["m" if as_member else "l"] = [rec]
    only_typed(lambda: _decode_packet(_codec.encode_packet(CLUSTER, [_pack(d)])))


@FUZZ
@given(values)
def test_compact_records(obj: Any) -> None:
    only_typed(lambda: msgs.load_from_compact(obj))
    only_typed(lambda: msgs.member_from_compact(obj, CLUSTER))


KEYRING = crypto.Keyring.from_keys([b"k" * crypto.KEY_SIZE])
SEALER = crypto.Sealer(KEYRING, CLUSTER)
SEALED = SEALER.seal(b"hello", 100.0)


@FUZZ
@given(st.binary(max_size=200))
def test_sealed_packet_any_bytes(data: bytes) -> None:
    only_typed(lambda: crypto.Sealer(KEYRING, CLUSTER).open(data, 100.0), crypto.CryptoError)


@FUZZ
@given(st.integers(0, len(SEALED) - 1), st.integers(0, 255), st.booleans())
def test_sealed_packet_flipped_or_cut(i: int, byte: int, cut: bool) -> None:
    data = SEALED[:i] if cut else SEALED[:i] + bytes([byte]) + SEALED[i + 1 :]
    if data == SEALED:
        return
    with pytest.raises(crypto.CryptoError):
        crypto.Sealer(KEYRING, CLUSTER).open(data, 100.0)


# ------------------------------------------------------------ socket requests


def _submit_fields(obj: Any) -> None:
    request_checks.submit_spec(
        wire.Fields(obj, "submit request"), uid=1000, user="u", home="n1", now=1.0
    )


VALID_SUBMIT: dict[str, Any] = {
    "argv": ["echo", "hi"],
    "name": "x",
    "env": {"A": "1"},
    "cwd": "/tmp",
    "weight": 2.0,
    "reserve_shares": 1,
    "labels": {"a": "b"},
    "cpu": 1.0,
    "mem": 1024,
    "gpu": {"core": 50, "memory_bytes": 1 << 20},
    "migrate": "checkpoint",
    "expected_runtime": 5.0,
    "no_retry": True,
    "id": "my-task",
}
VALID_ARRAY_SUBMIT: dict[str, Any] = {
    **VALID_SUBMIT,
    "array": "0-9999:2%50",
    "after": ["ok:job1,t0123456789abcdef[3]", "notok:x~bob"],
}
VALID_GANG_SUBMIT: dict[str, Any] = {
    **VALID_SUBMIT,
    "migrate": "never",
    "gang": {"size": 4, "mode": "nonstrict", "min_available": 2, "restart": True, "timeout": 5.0},
}


def test_the_submit_sample_is_valid() -> None:
    _submit_fields(dict(VALID_SUBMIT))
    _submit_fields(dict(VALID_GANG_SUBMIT))
    _submit_fields(dict(VALID_ARRAY_SUBMIT))


@FUZZ
@given(mutated(VALID_ARRAY_SUBMIT))
def test_array_submit_mutated(obj: Any) -> None:
    only_typed(lambda: _submit_fields(obj))


@FUZZ
@given(mutated(VALID_GANG_SUBMIT))
def test_gang_submit_mutated(obj: Any) -> None:
    only_typed(lambda: _submit_fields(obj))


@FUZZ
@given(values)
def test_submit_spec_any_value(obj: Any) -> None:
    only_typed(lambda: _submit_fields(obj))


@FUZZ
@given(mutated(VALID_SUBMIT))
def test_submit_spec_mutated(obj: Any) -> None:
    only_typed(lambda: _submit_fields(obj))


class _Stream:
    """What ApiServer reads from and writes to: the fuzzed chunks, then EOF."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.sent: list[bytes] = []

    async def receive_some(self, n: int) -> bytes:
        await trio.lowlevel.checkpoint()
        return self.chunks.pop(0) if self.chunks else b""

    async def send_all(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.sent.append(bytes(data))

    async def aclose(self) -> None:
        pass

    async def __aenter__(self) -> _Stream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass


async def _submit_op(f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
    spec = request_checks.submit_spec(f, uid=cred.uid, user="u", home="n1", now=1.0)
    return {"id": spec.id}


async def _status_op(f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
    request_checks.check_task_id(f.str("id", required=True, max_len=256))
    f.done()
    return {"task": None}


async def _list_op(f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
    f.bool("all", False)
    f.int("limit", 1000, lo=1, hi=100_000)
    f.done()
    return {"tasks": []}


def _serve(chunks: list[bytes]) -> list[Any]:
    """Run the socket server's real request path over `chunks`; the decoded replies."""
    ops = Ops(unary={"submit": _submit_op, "status": _status_op, "list": _list_op})
    server = ApiServer(Path("/nonexistent/sock"), ops)
    stream = _Stream(chunks)
    trio.run(server._serve_connection, stream, PeerCred(1, 1000, 1000))  # type: ignore[arg-type]
    replies = []
    for frame in stream.sent:
        replies += wire.FrameDecoder().feed(frame)
    return replies


def _frame(obj: Any) -> bytes:
    body = _pack(obj)
    return len(body).to_bytes(4, "big") + body


def _no_crash(replies: list[Any]) -> None:
    for r in replies:
        assert isinstance(r, dict)
        assert r.get("error") != "internal", r  # a handler crashed on bad input


def test_the_socket_sample_answers() -> None:
    r = _serve([_frame({"v": 1, "op": "submit", **VALID_SUBMIT})])
    assert r[0]["ok"] is True


@FUZZ
@given(st.lists(st.binary(max_size=80), max_size=5))
def test_socket_any_bytes(chunks: list[bytes]) -> None:
    _no_crash(_serve(chunks))


@FUZZ
@given(values)
def test_socket_any_request_value(obj: Any) -> None:
    _no_crash(_serve([_frame(obj)]))


@FUZZ
@given(
    st.sampled_from(
        [
            {"v": 1, "op": "submit", **VALID_SUBMIT},
            {"v": 1, "op": "status", "id": "t1"},
            {"v": 1, "op": "list", "all": True, "limit": 5},
        ]
    ).flatmap(mutated)
)
def test_socket_mutated_requests(obj: Any) -> None:
    _no_crash(_serve([_frame(obj)]))


# --------------------------------------------------------------- journal rows


@FUZZ
@given(st.binary(max_size=300))
def test_journal_record_any_bytes(blob: bytes) -> None:
    only_typed(lambda: journaldb.decode_task(blob))


@FUZZ
@given(mutated(codec.task_to_wire(TASK)))
def test_journal_record_mutated(obj: Any) -> None:
    only_typed(lambda: journaldb.decode_task(_pack(obj)))


_sql_values = (
    st.binary(max_size=80)
    | st.text(max_size=40)
    | st.integers(-(1 << 63), (1 << 63) - 1)
    | st.floats(allow_nan=False)
    | st.builds(lambda o: _pack(o), mutated(codec.task_to_wire(TASK)))
)


def test_journal_recover_skips_any_stored_row() -> None:
    """Rows of any SQL type and content read back at start-up: recover() logs and
    skips what it cannot decode, never raises."""
    with tempfile.TemporaryDirectory(prefix="sw-fuzz-") as d:
        path = Path(d) / "journal.db"
        j = jr.Journal(path)
        raw = sqlite3.connect(path, isolation_level=None)

        @FUZZ
        @given(_sql_values, st.one_of(st.none(), _sql_values))
        def recover(record: Any, kv_value: Any) -> None:
            raw.execute("DELETE FROM tasks")
            raw.execute("DELETE FROM kv")
            raw.execute(
                "INSERT INTO tasks(id, state, terminal, updated, record) VALUES (?,?,?,?,?)",
                ("t1", "queued", 0, 1.0, record),
            )
            raw.execute("INSERT INTO kv(key, value) VALUES (?, ?)", ("k", kv_value))
            rec = j.recover()
            assert len(rec.active) <= 1

        try:
            recover()
            # the valid row still decodes
            raw.execute("DELETE FROM tasks")
            raw.execute(
                "INSERT INTO tasks(id, state, terminal, updated, record) VALUES (?,?,?,?,?)",
                (TASK.id, "queued", 0, 1.0, journaldb.encode_task(TASK)),
            )
            assert [t.id for t in j.recover().active] == [TASK.id]
        finally:
            raw.close()
            j.close()
