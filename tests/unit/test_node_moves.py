"""Migrations' pure side (node/moves.py, movebook.py, departures.py), without I/O:
a move's phases and endings, expiry of prepared, staged and retained state, arrivals
and their journal keys, the target's answers, the cost rule's use and explain records."""

from __future__ import annotations

import random
from typing import Any

import attrs
import pytest

from swarm import model as m
from swarm.cluster import handoff as h
from swarm.cluster import migrate as mx
from swarm.node import events as ev
from swarm.node import moves as mv
from swarm.node.departures import MIN_BW_SAMPLE, candidates, explain_record
from swarm.node.movebook import PREPARED_GRACE, Moves
from swarm.policy import migration as pol
from swarm.policy.view import LoadView

S = m.TaskState
MM = m.MigrateMode
POLICY = pol.MigrationConfig(
    max_per_node=100, max_cluster=100, cooldown=0.0, max_moves=100, burst=100.0,
    max_report_age=1e9,
)  # fmt: skip
SETTINGS = mv.MoveSettings(policy=POLICY, checkpoint_timeout=30.0, staged_ttl=300.0)


def spec(tid: str = "t1", home: str = "a", mode: MM = MM.CHECKPOINT, **kw: Any) -> m.TaskSpec:
    return m.TaskSpec(id=tid, argv=("true",), migrate=mode, home=home, **kw)  # type: ignore[arg-type]


def running(s: m.TaskSpec, node: str = "a") -> m.Task:
    return m.transition(m.new_task(s, 0.0, node), S.RUNNING, 1.0, "started", node=node)


def report(node: str, running: int = 0, slots: int = 4, lpc: float = 0.0) -> m.LoadReport:
    return m.LoadReport(node=node, version=1, running=running, slots=slots, load_per_core=lpc)


def book(node: str = "a", here: set[str] | None = None, **kw: Any) -> Moves:
    located = here if here is not None else set()
    return Moves(
        node, attrs.evolve(SETTINGS, **kw), located_here=lambda t: t in located, token="abc"
    )


def begin(tid: str = "t1", mid: str = "b:x:1", mode: MM = MM.CHECKPOINT) -> mx.Begin:
    return mx.Begin(tid, mid, mode, 1, 10, "b", 50.0, 100.0, 2, {})


def stage(b: Moves, tid: str = "t1", source: str = "b", now: float = 0.0) -> mv.Incoming:
    inc = mv.Incoming("b:x:1", source, spec(tid, home=source), now)
    b.incoming[tid] = inc
    return inc


def decision(tid: str, target: str) -> pol.MigrationDecision:
    return pol.MigrationDecision(tid, target, True, pol.MIGRATE, "slowdown", 9.0, 1.0, 0.2)


def kinds(instrs: list[Any]) -> list[str]:
    return [type(i).__name__ for i in instrs]


# ------------------------------------------------------------------ phases


def test_endings_say_what_each_failure_undoes() -> None:
    e = mv.ENDINGS
    assert e["refused"] == mv.Ending("refused")  # nothing happened to the task yet
    assert e["not-stopped"].abort_target and not e["not-stopped"].put_back
    assert e["transfer-failed"] == mv.Ending("failed", abort_target=True, put_back=True)
    assert not e["undecided"].abort_target  # the home decides: nothing to undo here
    assert e["internal-error"].put_back and not e["internal-error"].abort_target
    assert {x.outcome for x in e.values()} == {
        "refused", "not-stopped", "cancelled", "failed", "undecided", "moved",
    }  # fmt: skip


@pytest.mark.parametrize("phase", list(mv.Phase))
def test_cancel_during_a_move_waits_for_its_next_step_until_the_move(phase: mv.Phase) -> None:
    b = book()
    b.outgoing["t1"] = mv.Outgoing("a:abc:1", "b", MM.CHECKPOINT, 0.0, step=phase)
    how = b.cancel("t1", "user", offering=False)
    if phase is mv.Phase.MOVE:
        assert how == "nothing" and b.outgoing["t1"].cancel is None
    else:
        assert how == "next-step" and b.outgoing["t1"].cancel == "user"


def test_cancel_without_a_move_is_now_or_when_the_offer_is_decided() -> None:
    b = book()
    assert b.cancel("t1", "user", offering=False) == "now"
    assert b.cancel("t1", "user", offering=True) == "offer"


def test_one_move_from_start_to_moved() -> None:
    b = book("a")
    t = running(spec("t1", home="a"))
    rt = b.running_task(t, now=100.0, wall=1000.0, state_bytes=1 << 20)
    d = decision("t1", "b")
    out = mv.Outgoing(b.new_mid(), "b", MM.CHECKPOINT, 100.0)
    assert out.mid == "a:abc:1" and b.new_mid() == "a:abc:2"
    b.outgoing["t1"] = out
    s = mv.Start(t, rt, d, out)
    rec, logs = b.begin(s, wall=1000.0)
    assert rec["from"] == "a" and rec["to"] == "b" and rec["state_bytes"] == 1 << 20
    assert [x.event for x in logs if isinstance(x, ev.Log)] == ["migration.start"]
    prep = b.prepare_message(s, report("a"))
    assert prep.bandwidth == POLICY.default_bandwidth and prep.mid == out.mid
    b.transferred(out, rec, MIN_BW_SAMPLE, 0.5)
    assert rec["bytes_per_s"] == MIN_BW_SAMPLE / 0.5 and b.counters["bytes_sent"] == MIN_BW_SAMPLE
    assert b.bandwidth.estimate("b", 1.0) != 1.0  # a big enough transfer is a sample
    b.moved("t1", out, rec, handover=2.0, now=110.0)
    assert b.retained["t1"] == (out.mid, 110.0) and rec["handover_s"] == 2.0
    assert b.pauses.estimate("checkpoint", 0.0) == 2.0
    instrs = b.finish(s, rec, "moved", "to b", wall=1010.0)
    assert "t1" not in b.outgoing and b.counters["outcome:moved"] == 1
    (store,) = [i for i in instrs if isinstance(i, mv.StoreRecord)]  # home is here
    assert store.record["outcome"] == "moved" and store.record["mid"] == out.mid
    assert b.records("t1", []) == [store.record]


def test_a_small_transfer_measures_no_bandwidth_and_a_guest_sends_its_record() -> None:
    b = book("a")
    t = running(spec("t1", home="h"))
    out = mv.Outgoing("a:abc:1", "b", MM.CHECKPOINT, 0.0)
    b.transferred(out, {}, MIN_BW_SAMPLE - 1, 0.1)
    assert b.bandwidth.estimate("b", 7.0) == 7.0
    s = mv.Start(t, b.running_task(t, 0.0, 0.0, 0), decision("t1", "b"), out)
    instrs = b.finish(s, {}, "failed", "transfer: broken", wall=5.0)
    assert [i.event for i in instrs if isinstance(i, ev.Log)] == ["migration.failed"]
    assert instrs[0].level == "warning"  # type: ignore[union-attr]
    (send,) = [i for i in instrs if isinstance(i, mv.SendRecord)]
    assert send.home == "h" and send.record["outcome"] == "failed"


# ------------------------------------------------------------------ expiry


def test_a_prepared_move_expires_after_the_checkpoint_timeout_plus_grace() -> None:
    b = book()
    stage(b, now=0.0)
    ttl = SETTINGS.checkpoint_timeout + PREPARED_GRACE
    assert b.expire(ttl) == [] and "t1" in b.incoming
    assert kinds(b.expire(ttl + 0.1)) == ["RemoveState"] and "t1" not in b.incoming


def test_a_staged_move_expires_after_staged_ttl_with_its_arrival() -> None:
    b = book()
    inc = stage(b)
    instrs = b.staged(inc, begin(), "b", 10, now=5.0, wall=500.0)
    assert instrs == [ev.Persist((ev.Put("marr:t1", b.arrivals["t1"].to_wire()),))]
    assert b.counters["bytes_received"] == 10
    assert b.expire(5.0 + SETTINGS.staged_ttl) == []  # the staged ttl, not the prepared one
    out = b.expire(5.1 + SETTINGS.staged_ttl)
    assert out == [ev.Persist((ev.Delete("marr:t1"),)), mv.RemoveState("t1")]
    assert b.arrivals == {}


def test_expired_state_of_a_task_that_lives_here_is_kept() -> None:
    b = book(here={"t1"})
    stage(b)
    b.retained["t2"] = ("a:abc:1", 0.0)
    b.outgoing["t2"] = mv.Outgoing("a:abc:2", "c", MM.CHECKPOINT, 0.0)
    assert b.expire(1e6) == []  # t1 runs here; t2 is moving away again
    assert b.incoming == {} and b.retained == {}


def test_a_retained_copy_goes_when_the_target_started_or_after_the_ttl() -> None:
    b = book()
    b.retained["t1"] = ("a:abc:1", 0.0)
    assert b.started_there("t1", "a:abc:9") == []  # another move's news
    assert b.started_there("t1", "a:abc:1") == [mv.RemoveState("t1")]
    b.retained["t2"] = ("a:abc:2", 0.0)
    assert b.expire(SETTINGS.staged_ttl) == []
    assert b.expire(SETTINGS.staged_ttl + 1) == [mv.RemoveState("t2")]


def test_a_task_that_left_takes_its_state_unless_a_move_keeps_it() -> None:
    b = book()
    assert b.on_left("t1") == [mv.RemoveState("t1")]
    b.retained["t1"] = ("a:abc:1", 0.0)
    assert b.on_left("t1") == []
    b2 = book(here={"t1"})
    assert b2.on_left("t1") == []


# ------------------------------------------------------------------ arrivals


def test_an_arrival_resumes_once_and_tells_its_source() -> None:
    b = book("a")
    b.arrivals["t1"] = mv.Arrival("b:x:1", "b", MM.CHECKPOINT, 1, 10.0, 100.0, 101.0)
    b.incoming["t1"] = mv.Incoming("b:x:1", "b", spec(), 0.0)
    instrs = b.on_started(running(spec("t1", home="a")), now=7.0, wall=102.5)
    assert "t1" not in b.incoming and b.started["t1"] == 7.0
    assert kinds(instrs) == ["Persist", "Log", "TellSource", "StoreRecord"]
    assert instrs[2] == mv.TellSource("b", "t1", "b:x:1")
    rec = instrs[3].record  # type: ignore[union-attr]
    assert rec == {"mid": "b:x:1", "resumed_on": "a", "resumed_at": 102.5, "pause_s": 2.5}
    assert b.arrivals["t1"].resumed and b.counters["resumed"] == 1
    assert b.on_started(running(spec("t1", home="a")), now=8.0, wall=103.0) == []


def test_arrivals_round_trip_the_journal_and_a_bad_one_is_logged() -> None:
    a = mv.Arrival("b:x:1", "b", MM.CRIU, 2, 10.0, 1.0, 2.0, {"1": "/o"}, resumed=True)
    b = book()
    logs = b.restore({"marr:t1": a.to_wire(), "marr:t2": {"mid": 3}, "home:t3": {}})
    assert b.arrivals == {"t1": a}
    assert [(x.level, x.event) for x in logs] == [("error", "migration.bad_state")]  # type: ignore[union-attr]


def test_a_criu_image_is_restored_once() -> None:
    b = book()
    b.arrivals["t1"] = mv.Arrival("b:x:1", "b", MM.CRIU, 1, 0.0, 0.0, 0.0)
    arr, instrs = b.restore_image("t1")
    assert arr is not None and kinds(instrs) == ["Persist"]
    assert b.arrivals["t1"].restore_used
    assert b.restore_image("t1") == (None, [])
    b.arrivals["t2"] = mv.Arrival("b:x:2", "b", MM.CHECKPOINT, 1, 0.0, 0.0, 0.0)
    assert b.restore_image("t2") == (None, [])


def test_a_task_stopped_with_no_move_in_flight_is_put_back() -> None:
    b = book()
    t = running(spec())
    assert kinds(b.on_stopped(t)) == ["PutBack"]
    b.outgoing["t1"] = mv.Outgoing("a:abc:1", "b", MM.CHECKPOINT, 0.0)
    assert b.on_stopped(t) == []


# ------------------------------------------------------------------ target side


def prep(tid: str = "t1", mid: str = "b:x:1") -> mx.Prepare:
    s = spec(tid, home="b")
    rt = pol.RunningTask(task_id=tid, mode=MM.CHECKPOINT, age=1000.0, home="b")
    return mx.Prepare(mid, s, rt, report("b", running=8, lpc=2.0), 1e9)


def ask(b: Moves, p: mx.Prepare, refusal: str | None = None, sender: str = "b") -> dict[str, Any]:
    reply, _ = b.prepare(
        p, sender, 1.0, admission_refusal=lambda s: refusal, local_report=lambda: report("a")
    )
    return reply


def test_prepare_books_the_move_and_a_retry_is_the_same_answer() -> None:
    b = book()
    assert ask(b, prep()) == {"ok": True} and b.incoming["t1"].mid == "b:x:1"
    assert ask(b, prep()) == {"ok": True}
    assert ask(b, prep(mid="b:x:2"))["reason"] == (
        "another migration of this task is in flight here"
    )
    assert b.counters["prepare_refused"] == 1


def test_prepare_refusals() -> None:
    assert ask(book(mode="off"), prep())["reason"] == "migration is off on a"
    assert ask(book(here={"t1"}), prep())["reason"] == "the task is already here"
    assert ask(book(), prep(), refusal="no such user") == {"ok": False, "reason": "no such user"}
    busy = book()
    reply, _ = busy.prepare(
        prep(), "b", 1.0, admission_refusal=lambda s: None,
        local_report=lambda: report("a", running=64, lpc=50.0),
    )  # fmt: skip
    assert reply["ok"] is False and busy.incoming == {}  # the re-check at the target


def test_a_state_stream_needs_its_prepared_move_and_abort_drops_it() -> None:
    b = book()
    stage(b)
    assert b.prepared(begin(mid="b:x:9"), "b") is None
    assert b.prepared(begin(), "c") is None
    assert b.prepared(begin(), "b") is b.incoming["t1"]
    assert b.abort("t1", "b:x:1", "c") == [] and "t1" in b.incoming
    assert b.abort("t1", "b:x:1", "b") == [mv.RemoveState("t1")] and b.incoming == {}


def test_records_merge_the_journal_and_recent_parts() -> None:
    b = book("a")
    store = b.record(spec("t1", home="a"), "m1", {"to": "b"}, wall=1.0)
    assert isinstance(store, mv.StoreRecord) and store.at == 1.0
    merged = b.records("t1", [{"mid": "m1", "from": "a"}])
    assert merged == [{"mid": "m1", "from": "a", "to": "b"}]
    assert isinstance(b.record(spec("t1", home="h"), "m1", {}, 1.0), mv.SendRecord)


# ------------------------------------------------------------------ deciding


def test_only_running_movable_tasks_here_are_candidates() -> None:
    b = book("a")
    guest = h.GuestSide("a")
    assert b.eligible(running(spec()), guest)
    assert not b.eligible(running(spec(mode=MM.NEVER)), guest)
    assert not b.eligible(running(spec(is_global=True)), guest)
    assert not b.eligible(m.new_task(spec(), 0.0, "a"), guest)  # queued
    assert not b.eligible(running(spec(home="h")), guest)  # a guest not settled here
    b.outgoing["t1"] = mv.Outgoing("a:abc:1", "b", MM.CHECKPOINT, 0.0)
    assert not b.eligible(running(spec()), guest)
    assert mv.keeps_state(spec(mode=MM.CRIU)) and not mv.keeps_state(spec(mode=MM.RESTART))


def test_the_running_task_carries_its_age_and_moves_from_its_arrival() -> None:
    b = book("a")
    b.arrivals["t1"] = mv.Arrival("b:x:1", "b", MM.CHECKPOINT, 3, 50.0, 0.0, 90.0)
    b.started["t1"] = 10.0
    rt = b.running_task(running(spec()), now=30.0, wall=100.0, state_bytes=5)
    assert rt.age == 70.0 and rt.moves == 3 and rt.state_bytes == 5
    assert rt.last_move_at == 20.0 and rt.pause == SETTINGS.default_pause
    restart = b.running_task(running(spec(mode=MM.RESTART)), 30.0, 100.0, 0)
    assert restart.age == 20.0  # a restart starts afresh: its age here only


def test_a_round_follows_the_cost_rule_and_explains_each_change_once() -> None:
    b = book("a")
    t = running(spec("t1", expected_runtime=10_000.0))
    rt = b.running_task(t, now=1000.0, wall=1000.0, state_bytes=0)
    busy, idle = report("a", running=16, slots=4, lpc=4.0), report("b")
    cands = [pol.Candidate("b", idle, 0.0)]
    rnd = b.plan([(t, rt)], busy, cands, frozenset(), now=1000.0)
    (d,) = rnd.decisions
    assert d.code == pol.MIGRATE and d.target == "b" and d.gain > d.cost
    (st,) = rnd.starts
    assert b.outgoing["t1"] is st.out and st.out.target == "b" and st.out.mid == "a:abc:1"
    note = rnd.instructions[0]
    assert isinstance(note, mv.NoteDecision) and note.record == explain_record("a", d)
    assert note.record["outcome"].startswith("migration migrate: ")
    assert b.counters["decision:migrate"] == 1
    assert b.note("t1", d) == []  # the same decision again: nothing new to explain
    # not worth it: an idle node keeps its task, and says why
    b2 = book("a")
    rnd2 = b2.plan([(t, rt)], report("a"), cands, frozenset(), now=1000.0)
    assert rnd2.starts == [] and b2.outgoing == {}
    assert rnd2.decisions[0].code == pol.NOT_WORTH_IT
    # a suspect target is never chosen
    rnd3 = book("a").plan([(t, rt)], busy, cands, frozenset({"b"}), now=1000.0)
    assert rnd3.starts == []


def test_candidates_skip_this_node_and_draining_peers() -> None:
    view = LoadView()
    view.upsert(attrs.evolve(report("a"), shares=10), 0.0)
    view.upsert(attrs.evolve(report("b"), shares=10), 5.0)
    view.upsert(attrs.evolve(report("c"), shares=0), 5.0)
    got = candidates(view, 2, random.Random(1), "a", now=8.0)
    assert [(c.node, c.age) for c in got] == [("b", 3.0)]
