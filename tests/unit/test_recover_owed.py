"""A runner restarted before its home acknowledged a result (chaos home-loss, seed
1018): the finished record comes back with the guest entry, so that adopting the task
from a home gone for good keeps the result instead of running the task again."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

from swarm import model as m
from swarm import wire
from swarm.node.replicas import RELEASE
from swarm.node.state import NodeState
from swarm.policy.shares import ShareLedger
from swarm.runtime import journal as jr
from swarm.runtime import journaldb

S = m.TaskState


def _row(raw: sqlite3.Connection, t: m.Task) -> None:
    raw.execute(
        "INSERT INTO tasks(id, state, terminal, updated, record) VALUES (?,?,?,?,?)",
        (t.id, t.state.value, int(t.state.terminal), 1.0, journaldb.encode_task(t)),
    )


def test_recover_returns_finished_records_that_still_have_a_guest_entry() -> None:
    spec = m.TaskSpec(id="t1", argv=("x",), home="n2")
    done = m.transition(
        m.transition(m.new_task(spec, 1.0, "n3"), S.RUNNING, 2.0, "started"),
        S.SUCCEEDED,
        3.0,
        "exited 0",
        exit_code=0,
    )
    other = m.transition(
        m.transition(m.new_task(m.TaskSpec(id="t2", argv=("x",)), 1.0, "n3"), S.RUNNING, 2.0, "s"),
        S.FAILED,
        3.0,
        "exited 1",
        exit_code=1,
    )
    with tempfile.TemporaryDirectory(prefix="sw-owed-") as d:
        path = Path(d) / "journal.db"
        j = jr.Journal(path)
        raw = sqlite3.connect(path, isolation_level=None)
        try:
            _row(raw, done)
            _row(raw, other)  # finished, no guest entry: stays in the journal only
            raw.execute(
                "INSERT INTO kv(key, value) VALUES (?, ?)", ("guest:t1", wire.pack({"x": 1}))
            )
            rec = j.recover()
            assert rec.active == []
            assert [t.id for t in rec.owed] == ["t1"] and rec.owed[0].state is S.SUCCEEDED
        finally:
            raw.close()
            j.close()


def _finished(tid: str, home: str = "n3") -> m.Task:
    spec = m.TaskSpec(id=tid, argv=("x",), home=home)
    run = m.transition(m.new_task(spec, 1.0, home), S.RUNNING, 2.0, "started")
    return m.transition(run, S.SUCCEEDED, 3.0, "exited 0", exit_code=0)


def _owed_after_recover(tasks: list[m.Task], kv: dict[str, object]) -> list[m.Task]:
    """A journal holding these finished records and keys, recovered: what it owes."""
    with tempfile.TemporaryDirectory(prefix="sw-owed-") as d:
        path = Path(d) / "journal.db"
        j = jr.Journal(path)
        raw = sqlite3.connect(path, isolation_level=None)
        try:
            for t in tasks:
                _row(raw, t)
            put = "INSERT INTO kv(key, value) VALUES (?, ?)"
            for key, value in kv.items():
                raw.execute(put, (key, wire.pack(value)))
            return list(j.recover().owed)
        finally:
            raw.close()
            j.close()


def test_recover_returns_our_finished_tasks_whose_copies_are_owed_their_release() -> None:
    """Chaos late-binding (seed 1024, stop 45): a home restarted after its task ended
    sent the release to a stray copy without how the task ended (its finished record
    was not in memory); it reached the stray before the copy itself, which then
    stayed `queued` there. A task named by `repls:` or `strays:` comes back, and the
    release it is owed after the restart says how it ended."""
    tasks = [_finished(tid) for tid in ("t1", "t2", "t3")]
    owed = _owed_after_recover(tasks, {"strays:t1": ["n1"], "repls:t2": ["n2"]})
    assert sorted(t.id for t in owed) == ["t1", "t2"]  # t3: nothing owed, journal only
    st = NodeState("n3", ledger=ShareLedger(1024))
    for t in owed:
        st.records.store(t)
    st.strays = {"t1": frozenset({"n1"})}
    st.succession.on_member("n1", m.MemberState.ALIVE, 0.0)
    (send,) = st.replica_update("t1")
    assert send.dest == "n1" and send.msg.kind == RELEASE
    assert send.msg.final is not None and send.msg.final.state == "succeeded"


def test_recover_returns_finished_records_we_keep_a_copy_of_and_array_ends_uncounted() -> None:
    """Stop 52: a runner that keeps the copy of a task it ran reads its finished record
    back (adopting the copy after its home's loss, it adopts the task as it ended, not
    as a new one: failover.py `_adopt_copy`); and an array element whose end its
    array's journaled progress has not counted yet (`aelem:`, node/arrays.py)."""
    tasks = [_finished(tid, home="n2") for tid in ("t1", "arr_0", "t3")]
    owed = _owed_after_recover(tasks, {"replica:t1": {"home": "n2"}, "aelem:arr_0": "arr"})
    assert sorted(t.id for t in owed) == ["arr_0", "t1"]  # t3: nothing owed
