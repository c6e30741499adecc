"""Migration messages and the state stream receiver (swarm.cluster.migrate)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm import wire
from swarm.cluster import migrate as mx
from swarm.model import LoadReport, MigrateMode, TaskSpec
from swarm.policy.migration import RunningTask

# ------------------------------------------------------------------ codecs


def test_prepare_round_trip() -> None:
    spec = TaskSpec(id="t1", argv=("python", "x.py"), migrate=MigrateMode.CHECKPOINT)
    rt = RunningTask("t1", MigrateMode.CHECKPOINT, 12.5, 60.0, 1000, 0.5, 0.0, 1, None, "h")
    p = mx.Prepare("p1:ab:1", spec, rt, LoadReport(node="p1", version=3, running=7), 1e8)
    back = mx.prepare_from_wire(wire.unpack(wire.pack(mx.prepare_to_wire(p))))
    assert back == p


def test_prepare_with_mismatched_ids_is_refused() -> None:
    spec = TaskSpec(id="t1", argv=("true",))
    rt = RunningTask("t2", MigrateMode.CHECKPOINT, 1.0)
    obj = mx.prepare_to_wire(mx.Prepare("m", spec, rt, LoadReport(node="a", version=1), 1.0))
    with pytest.raises(wire.SchemaError):
        mx.prepare_from_wire(obj)


def test_begin_and_frames_round_trip() -> None:
    b = mx.Begin("t1", "m", MigrateMode.CRIU, 3, 10, "p1", 1.5, 2.5, 2, {"1": "/x/out"})
    assert mx.begin_from_wire(wire.unpack(wire.pack(mx.begin_to_wire(b)))) == b
    data = b"0123456789"
    frames: list[mx.Frame] = [
        mx.Dir("d", 0o755),
        mx.File("d/f", 0o644, 10),
        mx.Link("l", "d/f"),
        mx.Chunk(0, data, hashlib.sha256(data).digest()),
        mx.End(3, 10, hashlib.sha256(hashlib.sha256(data).digest()).digest()),
    ]
    for fr in frames:
        assert mx.frame_from_wire(wire.unpack(wire.pack(mx.frame_to_wire(fr)))) == fr


junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=5)
    ),
    max_leaves=20,
)


def frame_like() -> st.SearchStrategy[Any]:
    keys = st.sampled_from(
        ["t", "path", "mode", "size", "target", "seq", "data", "sha256", "entries", "total"]
    )
    vals = st.one_of(
        st.sampled_from(["dir", "file", "link", "chunk", "end", "x"]),
        st.integers(-5, 2**40),
        st.binary(max_size=40),
        st.text(max_size=10),
        st.none(),
    )
    return st.dictionaries(keys, vals, max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.one_of(junk, frame_like()))
def test_decoders_raise_only_wire_errors(obj: Any) -> None:
    for decode in (
        mx.frame_from_wire,
        mx.begin_from_wire,
        mx.prepare_from_wire,
        mx.running_task_from_wire,
    ):
        try:
            decode(obj)
        except wire.WireError:
            pass


# ------------------------------------------------------------------ the receiver


def stream_of(tree: dict[str, bytes | None], chunk: int = 7) -> tuple[mx.Begin, list[mx.Frame]]:
    """Frames for a tree {path: content (None: a directory)}, parents first."""
    frames: list[mx.Frame] = []
    whole = hashlib.sha256()
    seq = 0
    total = 0
    for path in sorted(tree, key=lambda p: (p.count("/"), p)):
        content = tree[path]
        if content is None:
            frames.append(mx.Dir(path, 0o755))
            continue
        frames.append(mx.File(path, 0o644, len(content)))
        for i in range(0, len(content), chunk):
            piece = content[i : i + chunk]
            digest = hashlib.sha256(piece).digest()
            frames.append(mx.Chunk(seq, piece, digest))
            whole.update(digest)
            seq += 1
        total += len(content)
    frames.append(mx.End(len(tree), total, whole.digest()))
    begin = mx.Begin("t", "m", MigrateMode.CHECKPOINT, len(tree), total, "src", 0.0, 0.0, 1)
    return begin, frames


def apply_all(begin: mx.Begin, frames: list[mx.Frame]) -> dict[str, bytes | None]:
    rx = mx.StateReceiver(begin, max_bytes=1 << 30)
    out: dict[str, bytes | None] = {}
    current: str | None = None
    for fr in frames:
        for a in rx.feed(fr):
            if isinstance(a, mx.MakeDir):
                out[a.path] = None
            elif isinstance(a, mx.OpenFile):
                current = a.path
                out[a.path] = b""
            elif isinstance(a, mx.Write):
                assert current is not None
                out[current] = (out[current] or b"") + a.data
            elif isinstance(a, mx.CloseFile):
                current = None
    assert rx.done
    return out


names = st.text(alphabet="abcxyz._-", min_size=1, max_size=6).filter(lambda s: s not in (".", ".."))


@st.composite
def trees(draw: st.DrawFn) -> dict[str, bytes | None]:
    tree: dict[str, bytes | None] = {}
    dirs = [""]
    for _ in range(draw(st.integers(0, 8))):
        parent = draw(st.sampled_from(dirs))
        name = draw(names)
        path = f"{parent}/{name}" if parent else name
        if path in tree:
            continue
        if draw(st.booleans()):
            tree[path] = None
            dirs.append(path)
        else:
            tree[path] = draw(st.binary(max_size=40))
    return tree


@settings(max_examples=150, deadline=None)
@given(trees())
def test_an_honest_stream_reproduces_the_tree(tree: dict[str, bytes | None]) -> None:
    begin, frames = stream_of(tree)
    assert apply_all(begin, frames) == tree


@settings(max_examples=200, deadline=None)
@given(trees(), st.data())
def test_any_tampering_is_detected(tree: dict[str, bytes | None], data: st.DataObject) -> None:
    begin, frames = stream_of(tree)
    how = data.draw(st.sampled_from(["flip", "drop", "swap", "end", "extra", "digest"]))
    chunks = [i for i, f in enumerate(frames) if isinstance(f, mx.Chunk)]
    bad = list(frames)
    if how == "flip" and chunks:
        i = data.draw(st.sampled_from(chunks))
        c = bad[i]
        assert isinstance(c, mx.Chunk)
        flipped = bytes([c.data[0] ^ 1]) + c.data[1:]
        bad[i] = mx.Chunk(c.seq, flipped, c.sha256)  # data no longer matches its sha
    elif how == "drop" and len(bad) > 1:
        del bad[data.draw(st.integers(0, len(bad) - 2))]  # any frame but the end
    elif how == "swap" and len(chunks) >= 2:
        i, j = chunks[0], chunks[1]
        bad[i], bad[j] = bad[j], bad[i]
    elif how == "end":
        e = bad[-1]
        assert isinstance(e, mx.End)
        bad[-1] = mx.End(e.entries, e.total + 1, e.sha256)
    elif how == "extra":
        bad.append(mx.Dir("late", 0o700))
    elif how == "digest":
        e = bad[-1]
        assert isinstance(e, mx.End)
        bad[-1] = mx.End(e.entries, e.total, hashlib.sha256(b"other").digest())
    else:
        return  # nothing to tamper with in this tree
    with pytest.raises(mx.StateError):
        apply_all(begin, bad)


@pytest.mark.parametrize(
    "path", ["", "/etc/passwd", "a/../../b", "../x", "a//b", "./a", "a/.", "a\x00b", "x" * 5000]
)
def test_paths_that_could_escape_are_refused(path: str) -> None:
    with pytest.raises(mx.StateError):
        mx.check_relpath(path)
    begin = mx.Begin("t", "m", MigrateMode.CHECKPOINT, 1, 0, "s", 0.0, 0.0, 1)
    rx = mx.StateReceiver(begin, max_bytes=10)
    with pytest.raises(mx.StateError):
        rx.feed(mx.Dir(path, 0o700))


def test_no_writing_through_a_link_or_an_undeclared_directory() -> None:
    begin = mx.Begin("t", "m", MigrateMode.CHECKPOINT, 2, 1, "s", 0.0, 0.0, 1)
    rx = mx.StateReceiver(begin, max_bytes=10)
    rx.feed(mx.Link("l", "/etc"))
    with pytest.raises(mx.StateError, match="before its directory"):
        rx.feed(mx.File("l/passwd", 0o644, 1))
    rx2 = mx.StateReceiver(begin, max_bytes=10)
    with pytest.raises(mx.StateError, match="before its directory"):
        rx2.feed(mx.File("nodir/f", 0o644, 1))


def test_modes_lose_setuid_and_stay_writable_by_the_owner() -> None:
    begin = mx.Begin("t", "m", MigrateMode.CHECKPOINT, 2, 0, "s", 0.0, 0.0, 1)
    rx = mx.StateReceiver(begin, max_bytes=10)
    (d,) = rx.feed(mx.Dir("d", 0o7000))
    assert isinstance(d, mx.MakeDir) and d.mode == 0o700
    (f,) = rx.feed(mx.File("d/x", 0o4755, 0))
    assert isinstance(f, mx.OpenFile) and f.mode == 0o755


def test_state_larger_than_accepted_is_refused_up_front() -> None:
    begin = mx.Begin("t", "m", MigrateMode.CHECKPOINT, 1, 100, "s", 0.0, 0.0, 1)
    with pytest.raises(mx.StateError, match="exceeds"):
        mx.StateReceiver(begin, max_bytes=99)


def test_files_may_not_exceed_the_announced_total() -> None:
    begin = mx.Begin("t", "m", MigrateMode.CHECKPOINT, 2, 5, "s", 0.0, 0.0, 1)
    rx = mx.StateReceiver(begin, max_bytes=100)
    rx.feed(mx.File("a", 0o600, 5))
    data = b"12345"
    rx.feed(mx.Chunk(0, data, hashlib.sha256(data).digest()))
    with pytest.raises(mx.StateError, match="exceed"):
        rx.feed(mx.File("b", 0o600, 1))


# ------------------------------------------------------------------ records


def test_records_merge_by_migration_id_in_first_seen_order() -> None:
    parts = [
        {"mid": "a", "from": "p1", "outcome": "started"},
        {"mid": "b", "from": "p2"},
        {"mid": "a", "pause_s": 0.5},
        "junk",
        {"no": "mid"},
        {"mid": "a", "outcome": "moved"},
    ]
    assert mx.merge_records(parts) == [
        {"mid": "a", "from": "p1", "outcome": "moved", "pause_s": 0.5},
        {"mid": "b", "from": "p2"},
    ]


@settings(max_examples=200, deadline=None)
@given(junk)
def test_record_check_accepts_plain_small_maps_only(obj: Any) -> None:
    try:
        rec = mx.check_record(obj)
    except wire.WireError:
        return
    assert isinstance(rec, dict)
    assert len(wire.pack(rec)) <= mx.MAX_RECORD


def test_record_check_refuses_big_or_odd_records() -> None:
    with pytest.raises(wire.SchemaError):
        mx.check_record({"x": "y" * (mx.MAX_RECORD + 1)})
    with pytest.raises(wire.SchemaError):
        mx.check_record({"x": float("inf")})
    with pytest.raises(wire.SchemaError):
        mx.check_record({"x": b"bytes"})
    assert mx.check_record({"mid": "a", "n": [1, 2.5, None, {"k": True}]})["mid"] == "a"
