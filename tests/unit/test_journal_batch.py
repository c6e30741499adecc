"""The journal's batched writes (issue 23): `apply_ops` leaves the database exactly as
`apply_op` one op at a time would, and `enqueue` shares one queue entry without ever
putting a write before an earlier `commit`."""

from __future__ import annotations

import sqlite3
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm import model as m
from swarm import wire
from swarm.runtime import journal as jr
from swarm.runtime import journaldb as jdb

S = m.TaskState
IDS = ["a", "b", "c"]


def _task(tid: str, state: S, at: float) -> m.Task:
    t = m.new_task(m.TaskSpec(id=tid, argv=("true",), home="n1", cwd="/"), at, "n1")
    if state is not S.QUEUED:
        t = m.transition(t, S.RUNNING, at + 1, "started", node="n2")
    if state.terminal:
        t = m.transition(t, state, at + 2, "exited 0", node="n2")
    return t


ops = st.one_of(
    st.builds(
        lambda tid, state, at: jdb.PutTask(_task(tid, state, at)),
        st.sampled_from(IDS),
        st.sampled_from([S.QUEUED, S.RUNNING, S.SUCCEEDED]),
        st.floats(0, 100),
    ),
    st.builds(jdb.DelTask, st.sampled_from(IDS)),
    st.builds(jdb.PutKV, st.sampled_from(["k1", "k2"]), st.integers(0, 9)),
    st.builds(jdb.DelKV, st.sampled_from(["k1", "k2"])),
    st.builds(
        lambda at, tid: jdb.Event(at, "decision", tid, "", {"outcome": "x"}),
        st.floats(0, 100),
        st.sampled_from(IDS),
    ),
    st.builds(
        jdb.PutProc,
        st.sampled_from(IDS),
        st.integers(1, 9),
        st.floats(0, 100),
        st.integers(0, 3),
        st.sampled_from(["", "/s1", "/s2"]),
    ),
    st.builds(jdb.DelProc, st.sampled_from(IDS)),
)


def _db() -> sqlite3.Connection:
    c = sqlite3.connect(":memory:", isolation_level=None)
    c.executescript(jdb.SCHEMA)
    return c


def _dump(c: sqlite3.Connection) -> dict[str, Any]:
    return {
        "tasks": c.execute("SELECT * FROM tasks ORDER BY id").fetchall(),
        "kv": c.execute("SELECT * FROM kv ORDER BY key").fetchall(),
        "events": c.execute("SELECT * FROM events ORDER BY seq").fetchall(),
        "procs": c.execute("SELECT * FROM procs ORDER BY task_id").fetchall(),
        "shims": c.execute("SELECT * FROM shims ORDER BY task_id").fetchall(),
    }


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, max_size=30))
def test_apply_ops_writes_what_apply_op_writes(batch: list[jdb.Op]) -> None:
    one, many = _db(), _db()
    for op in batch:
        jdb.apply_op(one, op, "n1")
    jdb.apply_ops(many, batch, "n1")
    assert _dump(one) == _dump(many)


def test_a_batch_with_a_retention_delete_is_written_in_order() -> None:
    one, many = _db(), _db()
    batch: list[jdb.Op] = [
        jdb.PutTask(_task("a", S.SUCCEEDED, 1.0)),
        jdb.ForgetFinished("a"),
        jdb.PutTask(_task("a", S.QUEUED, 2.0)),
    ]
    for op in batch:
        jdb.apply_op(one, op, "n1")
    jdb.apply_ops(many, batch, "n1")
    assert _dump(one) == _dump(many)
    assert len(_dump(many)["tasks"]) == 1


async def test_enqueue_shares_an_entry_but_never_overtakes_a_commit(tmp_path: Any) -> None:
    """enqueue(x1), commit(x2), enqueue(x3) for one task: x3 lands last, whatever
    the writer batches together."""
    j = jr.Journal(tmp_path / "journal.db", node="n1")
    try:
        j.enqueue([jdb.PutTask(_task("a", S.QUEUED, 1.0))])
        j.enqueue([jdb.PutKV("k", 1)])  # shares the first entry
        async with trio.open_nursery() as nursery:
            nursery.start_soon(j.commit, [jdb.PutTask(_task("a", S.RUNNING, 2.0))])
            while j._send.statistics().current_buffer_used < 2:  # the commit is queued
                await trio.sleep(0)
            j.enqueue([jdb.PutTask(_task("a", S.SUCCEEDED, 3.0))])
            await nursery.start(j.run)
            while j.ops_written < 4:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        c = sqlite3.connect(j.path)
        row = c.execute("SELECT record FROM tasks WHERE id='a'").fetchone()
        c.close()
        assert jdb.decode_task(row[0]).state is S.SUCCEEDED
    finally:
        j.close()


def test_a_batch_reply_with_a_newer_epoch_is_kept() -> None:
    """A home that fenced its holder answers the holder's query with the new epoch: the
    holder must get that answer (dropping it left a task MOVING for good); an entry for
    another task, or a malformed one, is no answer for that request alone."""
    from swarm.cluster import handoff as h
    from swarm.runtime import handoffbatch as hb

    reqs = [h.Query("t1", 1, 3, True), h.Commit("t2", 5), h.Commit("t3", 2)]
    raw = [
        h.reply_to_wire(h.Reply("t1", 2, True, h.Verdict.YOURS, "move not carried out")),
        h.reply_to_wire(h.Reply("t9", 5, True)),
        {"task_id": "t3"},
    ]
    got = hb.replies_from_wire(raw, reqs)
    assert got[0] is not None and got[0].epoch == 2 and got[0].verdict is h.Verdict.YOURS
    assert got[1] is None and got[2] is None


def test_a_probe_written_under_load_writes_its_row(tmp_path: Any) -> None:
    """A probe of a wedged journal (no ops) writes one row on either path, so a
    probe that lands means the disk takes writes again (an empty transaction would
    prove nothing)."""
    j = jr.Journal(tmp_path / "journal.db", node="n1")
    try:
        trio.run(j._write_chunked, [])
        c = sqlite3.connect(j.path)
        row = c.execute("SELECT value FROM meta WHERE key='probe'").fetchone()
        c.close()
        assert row is not None
    finally:
        j.close()


async def test_events_are_msgpack_and_an_older_journals_json_still_reads(tmp_path: Any) -> None:
    """Issue 23: an event's data is written as msgpack (3-4x cheaper than JSON); a
    journal an older agent wrote holds JSON text in the same column, and both read
    back through events_for (and the chaos checker's decode_event)."""
    j = jr.Journal(tmp_path / "journal.db", node="n1")
    odd = frozenset({"x"})  # no msgpack type: written as its str(), as JSON did
    async with trio.open_nursery() as n:
        await n.start(j.run)
        await j.commit([jdb.Event(1.0, "decision", "t1", "", {"outcome": "new", "odd": odd})])
        with sqlite3.connect(tmp_path / "journal.db") as c:
            c.execute(
                "INSERT INTO events(at, kind, task_id, node, data) VALUES(?,?,?,?,?)",
                (2.0, "decision", "t1", "n1", '{"outcome": "old"}'),
            )
            c.execute(
                "INSERT INTO events(at, kind, task_id, node, data) VALUES(?,?,?,?,?)",
                (3.0, "decision", "t1", "n1", b"\xc1"),  # not msgpack: skipped
            )
        got = await j.events_for("t1", "decision")
        n.cancel_scope.cancel()
    j.close()
    assert got == [{"outcome": "new", "odd": str(odd)}, {"outcome": "old"}]
    with sqlite3.connect(tmp_path / "journal.db") as c:
        blob = c.execute("SELECT data FROM events ORDER BY seq LIMIT 1").fetchone()[0]
    assert isinstance(blob, bytes) and jdb.decode_event(blob)["outcome"] == "new"
    assert jdb.decode_event('{"a": 1}') == {"a": 1}
    assert jdb.decode_event(jdb.encode_event({"gpus": {0: "a"}})) == {"gpus": {0: "a"}}
    # past msgpack's 64 bits: its str (as JSON's default=str would not have needed)
    assert jdb.decode_event(jdb.encode_event({"n": 2**70})) == {"n": str(2**70)}

    class NoStr:
        def __str__(self) -> str:
            raise ValueError("no str")

        def __repr__(self) -> str:
            return "NoStr()"

    # what cannot be packed even as its str goes as a repr, not as a failed write
    got = jdb.decode_event(jdb.encode_event({"x": NoStr()}))
    assert got == {"unencodable": "{'x': NoStr()}"}
    for bad in (b"\xc1", 5, "{"):
        try:
            jdb.decode_event(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} decoded")


def _kv(j: jr.Journal) -> dict[str, Any]:
    c = sqlite3.connect(j.path)
    try:
        return {k: wire.unpack(v) for k, v in c.execute("SELECT key, value FROM kv")}
    finally:
        c.close()


async def _until(cond: Any, what: str, timeout: float = 10.0) -> None:
    with trio.move_on_after(timeout):
        while not cond():
            await trio.sleep(0.01)
        return
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_lazy_write_waits_for_company_then_goes_alone(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """enqueue_lazy starts no commit: with nothing else written, its ops land on their
    own once LAZY_FLUSH has passed, never before."""
    monkeypatch.setattr(jr, "LAZY_FLUSH", 0.3)
    j = jr.Journal(tmp_path / "journal.db", node="n1")
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(j.run)
            t0 = trio.current_time()
            j.enqueue_lazy([jdb.PutKV("k", 1)])
            await trio.sleep(0.1)
            assert j.ops_written == 0 and "k" not in _kv(j)
            await _until(lambda: j.ops_written == 1, "the lazy write")
            assert trio.current_time() - t0 >= 0.3
            nursery.cancel_scope.cancel()
        assert _kv(j) == {"k": 1} and j.commits == 1
    finally:
        j.close()


async def test_lazy_writes_go_with_the_next_commit_ahead_of_its_ops(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """The next commit takes the lazy writes along, in one transaction, written before
    its own ops (so the newer value of a key wins), and returns once they landed too;
    so does the next enqueue."""
    monkeypatch.setattr(jr, "LAZY_FLUSH", 60.0)  # only company can take them
    j = jr.Journal(tmp_path / "journal.db", node="n1")
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(j.run)
            j.enqueue_lazy([jdb.PutKV("k", 1)])
            j.enqueue_lazy([jdb.PutKV("other", 1)])
            await trio.sleep(0.05)
            assert j.commits == 0
            await j.commit([jdb.PutKV("k", 2)])
            assert _kv(j) == {"k": 2, "other": 1} and j.commits == 1
            j.enqueue_lazy([jdb.DelKV("other")])
            j.enqueue([jdb.PutKV("other", 3)])
            await _until(lambda: j.commits == 2, "the enqueue's commit")
            assert _kv(j) == {"k": 2, "other": 3}
            nursery.cancel_scope.cancel()
    finally:
        j.close()


async def test_a_lazy_write_behind_a_busy_writer_still_goes(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """A lazy write made while a write is queued goes with it; one made behind a
    queued commit (its mark then taken in the same drain as the commit) is timed again
    and lands alone after LAZY_FLUSH."""
    monkeypatch.setattr(jr, "LAZY_FLUSH", 0.3)
    j = jr.Journal(tmp_path / "journal.db", node="n1")
    try:
        j.enqueue([jdb.PutKV("a", 1)])
        j.enqueue_lazy([jdb.PutKV("b", 1)])  # an entry is queued: goes with it
        async with trio.open_nursery() as nursery:
            nursery.start_soon(j.commit, [jdb.PutKV("c", 1)])
            while j._send.statistics().current_buffer_used < 2:  # the commit is queued
                await trio.sleep(0)
            j.enqueue_lazy([jdb.PutKV("d", 1)])  # its mark queues behind the commit
            await nursery.start(j.run)
            await _until(lambda: "c" in _kv(j), "the commit")
            await _until(lambda: "d" in _kv(j), "the lazy write behind it")
            nursery.cancel_scope.cancel()
        assert _kv(j) == {"a": 1, "b": 1, "c": 1, "d": 1}
        assert j.commits == 2
    finally:
        j.close()
