"""A runner restarted before its home acknowledged a result (chaos home-loss, seed
1018): the finished record comes back with the guest entry, so that adopting the task
from a home gone for good keeps the result instead of running the task again."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

from swarm import model as m
from swarm import wire
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
