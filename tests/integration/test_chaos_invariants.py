"""The chaos suite's invariant checkers, on synthetic journals (pure and fast).

Each checker must pass a clean history and name its invariant on a broken one; the
journal reader must decode what the agent's own Journal writes.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import attrs
import hypothesis.strategies as st
import trio
from hypothesis import given, settings

from chaos import invariants as inv
from chaos.journals import JournalData, SharesEvent, TransitionEvent, read_journal
from chaos.schedule import Scenario, make_plan
from chaos.suites import CANARY, FULL, SMOKE, find
from swarm import model as m
from swarm.logs import _logfmt_value
from swarm.runtime.journal import Event, Journal, PutTask

T0 = 1_000_000.0


def _spec(tid: str, home: str = "n1", reserve: int = 0, is_global: bool = False) -> m.TaskSpec:
    return m.TaskSpec(
        id=tid, argv=("true",), home=home, reserve_shares=reserve, is_global=is_global
    )


def _task(spec: m.TaskSpec, moves: list[tuple[float, m.TaskState, str]]) -> m.Task:
    t = m.new_task(spec, T0, spec.home)
    for at, dst, node in moves:
        t = m.transition(t, dst, at, "test", node=node)
    return t


class Book:
    """Builds one node's JournalData the way the agent journals: a transition event per
    record write, with the writer's idea of where the task is."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.tasks: dict[str, m.Task] = {}
        self.events: list[TransitionEvent] = []
        self.shares: list[SharesEvent] = []
        self.seq = 0

    def _ev(self, tid: str, at: float, src: str | None, dst: str, node: str) -> None:
        self.seq += 1
        self.events.append(TransitionEvent(self.seq, at, tid, node, src, dst, "test"))

    def submit(self, spec: m.TaskSpec, at: float = T0) -> None:
        self.tasks[spec.id] = m.new_task(spec, at, self.node)
        self._ev(spec.id, at, None, "queued", self.node)

    def move(self, tid: str, dst: m.TaskState, at: float, node: str | None = None) -> None:
        old = self.tasks[tid]
        where = node or self.node
        self.tasks[tid] = m.transition(old, dst, at, "test", node=where)
        self._ev(tid, at, old.state.value, dst.value, where)

    def run(self, spec: m.TaskSpec, start: float, end: float) -> None:
        self.submit(spec, start - 0.1)
        self.move(spec.id, m.TaskState.RUNNING, start)
        self.move(spec.id, m.TaskState.SUCCEEDED, end)

    def set_shares(self, at: float, old: int, new: int) -> None:
        self.seq += 1
        self.shares.append(SharesEvent(self.seq, at, old, new))

    def data(self) -> JournalData:
        return JournalData(self.node, dict(self.tasks), tuple(self.events), tuple(self.shares))


# --------------------------------------------------------------- results


def test_acked_tasks_terminal_with_one_result_pass() -> None:
    b = Book("n1")
    b.run(_spec("t1"), T0 + 1, T0 + 2)
    out = inv.check_acked([inv.Acked("t1", "n1")], {"n1": b.data()})
    assert out.violations == () and out.lost == () and out.states == {"succeeded": 1}


def test_an_acked_task_missing_from_its_home_is_lost() -> None:
    out = inv.check_acked([inv.Acked("t9", "n1")], {"n1": Book("n1").data()})
    assert out.lost == ("t9",)
    assert [v.invariant for v in out.violations] == [inv.ACKED]


def test_an_acked_task_never_finished_is_lost() -> None:
    b = Book("n1")
    b.submit(_spec("t1"))
    b.move("t1", m.TaskState.RUNNING, T0 + 1)
    out = inv.check_acked([inv.Acked("t1", "n1")], {"n1": b.data()})
    assert out.lost == ("t1",) and out.states == {"unfinished": 1}
    assert "never finished" in str(out.violations[0])


def test_two_journaled_results_break_one_result() -> None:
    b = Book("n1")
    b.run(_spec("t1"), T0 + 1, T0 + 2)
    b._ev("t1", T0 + 3, "running", "failed", "n1")  # a second result written over the first
    out = inv.check_acked([inv.Acked("t1", "n1")], {"n1": b.data()})
    assert [v.invariant for v in out.violations] == [inv.ONE_RESULT]
    assert out.lost == ()


def test_a_lost_no_retry_task_is_a_result_not_lost_work() -> None:
    b = Book("n1")
    b.submit(_spec("t1"))
    b.move("t1", m.TaskState.RUNNING, T0 + 1, node="n2")
    b.move("t1", m.TaskState.LOST, T0 + 2, node="n2")
    out = inv.check_acked([inv.Acked("t1", "n1")], {"n1": b.data()})
    assert out.violations == () and out.states == {"lost": 1} and out.lost == ()


def _adopted_at(b: Book, spec: m.TaskSpec, at: float, end: m.TaskState | None) -> None:
    """`b`'s node took `spec` over from its home (its record now names b's node)."""
    import attrs

    b.submit(spec, at - 2)
    b.move(spec.id, m.TaskState.RUNNING, at - 1)
    t = b.tasks[spec.id]
    note = m.Transition(at, t.state, t.state, "adopted from n1", b.node)
    b.tasks[spec.id] = attrs.evolve(
        t, spec=attrs.evolve(spec, home=b.node), history=(*t.history, note)
    )
    b._ev(spec.id, at, t.state.value, t.state.value, b.node)
    if end is not None:
        b.move(spec.id, end, at + 1)


def test_a_task_its_lost_home_handed_out_ends_once_at_its_adopter() -> None:
    home, runner = Book("n1"), Book("n2")
    home.submit(_spec("t1"))
    home.move("t1", m.TaskState.RUNNING, T0 + 1, node="n2")  # then n1 is lost
    _adopted_at(runner, _spec("t1"), T0 + 5, m.TaskState.SUCCEEDED)
    journals = {"n1": home.data(), "n2": runner.data()}
    out = inv.check_acked([inv.Acked("t1", "n1")], journals, frozenset({"n1"}))
    assert out.violations == () and out.states == {"succeeded": 1} and out.lost == ()
    marks = {"t1": ["n2"]}
    assert inv.check_executed([inv.Acked("t1", "n1")], journals, marks) == []
    # a note on a finished record (adopted after it ended) is not a second result
    done = Book("n2")
    _adopted_at(done, _spec("t1"), T0 + 5, None)
    done.move("t1", m.TaskState.SUCCEEDED, T0 + 4)
    _adopted_at(Book("n3"), _spec("t2"), T0 + 5, m.TaskState.SUCCEEDED)
    out = inv.check_acked([inv.Acked("t1", "n1")], {"n1": home.data(), "n2": done.data()})
    assert out.violations == ()


def test_a_handed_out_task_nobody_took_over_breaks_adoption() -> None:
    home = Book("n1")
    home.submit(_spec("t1"))
    home.move("t1", m.TaskState.RUNNING, T0 + 1, node="n2")
    home.submit(_spec("t2"))  # still queued at its home, no copy: lost with it, counted
    home.submit(_spec("t3"))  # queued at its home with a copy elsewhere: must be adopted
    import attrs

    lost_home = attrs.evolve(home.data(), replicated=frozenset({"t3"}))
    journals = {"n1": lost_home, "n2": Book("n2").data()}
    acked = [inv.Acked("t1", "n1"), inv.Acked("t2", "n1"), inv.Acked("t3", "n1")]
    out = inv.check_acked(acked, journals, frozenset({"n1"}))
    assert [v.invariant for v in out.violations] == [inv.ADOPTED, inv.ACKED, inv.ADOPTED, inv.ACKED]
    assert "kept a copy" in str(out.violations[2])
    assert out.states.get(inv.LOST_WITH_HOME) == 1


def test_two_nodes_holding_one_tasks_home_role_break_one_result() -> None:
    home, b2, b3 = Book("n1"), Book("n2"), Book("n3")
    home.submit(_spec("t1"))
    _adopted_at(b2, _spec("t1"), T0 + 5, m.TaskState.SUCCEEDED)
    _adopted_at(b3, _spec("t1"), T0 + 5, m.TaskState.SUCCEEDED)
    journals = {"n1": home.data(), "n2": b2.data(), "n3": b3.data()}
    out = inv.check_acked([inv.Acked("t1", "n1")], journals, frozenset({"n1"}))
    assert inv.ONE_RESULT in [v.invariant for v in out.violations]


def test_a_global_task_must_finish_on_every_node() -> None:
    books = {n: Book(n) for n in ("n1", "n2")}
    books["n1"].run(_spec("g1", is_global=True), T0 + 1, T0 + 2)
    journals = {n: b.data() for n, b in books.items()}
    out = inv.check_acked([inv.Acked("g1", "n1", is_global=True)], journals)
    assert out.lost == ("g1",)
    assert out.violations[0].node == "n2" and out.violations[0].invariant == inv.ACKED
    books["n2"].run(_spec("g1", is_global=True), T0 + 1, T0 + 3)
    journals = {n: b.data() for n, b in books.items()}
    assert inv.check_acked([inv.Acked("g1", "n1", is_global=True)], journals).violations == ()


def test_success_without_any_execution_is_flagged() -> None:
    b = Book("n1")
    b.run(_spec("t1"), T0 + 1, T0 + 2)
    acked = [inv.Acked("t1", "n1")]
    assert inv.check_executed(acked, {"n1": b.data()}, {"t1": ["n1"]}) == []
    vs = inv.check_executed(acked, {"n1": b.data()}, {})
    assert [v.invariant for v in vs] == [inv.EXECUTED]


def test_duplicate_executions_count_extra_runs_per_node_for_globals() -> None:
    acked = [inv.Acked("t1", "n1"), inv.Acked("g1", "n1", is_global=True)]
    marks = {"t1": ["n1", "n2", "n2"], "g1": ["n1", "n2", "n2", "n3"]}
    assert inv.duplicate_executions(acked, marks) == 2 + 1


def test_starts_are_counted_in_the_executors_own_journals() -> None:
    home, ex = Book("n1"), Book("n2")
    home.submit(_spec("t1"))
    home.move("t1", m.TaskState.RUNNING, T0 + 2, node="n2")  # the home's record of it
    ex.run(_spec("t1"), T0 + 1, T0 + 2)
    assert inv.starts_by_task({"n1": home.data(), "n2": ex.data()})["t1"] == 1


# ------------------------------------------------------------------- drain


def test_a_start_while_drained_is_flagged_and_one_before_is_not() -> None:
    b = Book("n1")
    b.run(_spec("before"), T0 + 1, T0 + 5)  # started before the drain, still running
    b.set_shares(T0 + 2, 1024, 0)
    b.run(_spec("during"), T0 + 3, T0 + 4)
    b.set_shares(T0 + 6, 0, 1024)
    b.run(_spec("after"), T0 + 7, T0 + 8)
    b.run(_spec("glob", is_global=True), T0 + 3.5, T0 + 4)  # global tasks may
    j = {"n1": b.data()}
    vs = inv.check_drain(j, inv.specs_of(j))
    assert [v.invariant for v in vs] == [inv.DRAIN]
    assert "during" in vs[0].detail


def test_starts_recorded_by_a_home_for_another_node_are_not_that_nodes_starts() -> None:
    home = Book("n1")
    home.set_shares(T0 + 1, 1024, 0)
    home.submit(_spec("t1"))
    home.move("t1", m.TaskState.RUNNING, T0 + 2, node="n2")  # ran on n2, not here
    j = {"n1": home.data()}
    assert inv.check_drain(j, inv.specs_of(j)) == []


# ------------------------------------------------------------ reservations


def test_reservations_that_fit_pass_and_lowering_shares_kills_nothing() -> None:
    b = Book("n1")
    b.run(_spec("a", reserve=600), T0 + 1, T0 + 3)
    b.run(_spec("b", reserve=400), T0 + 2, T0 + 4)
    b.set_shares(T0 + 2.5, 1024, 500)  # below what runs: legal, blocks further starts
    b.run(_spec("c", reserve=100), T0 + 5, T0 + 6)
    j = {"n1": b.data()}
    assert inv.check_reservations(j, inv.specs_of(j), {"n1": 1024}) == []


def test_two_reservations_over_the_shares_at_once_are_flagged() -> None:
    b = Book("n1")
    b.run(_spec("a", reserve=600), T0 + 1, T0 + 3)
    b.run(_spec("b", reserve=600), T0 + 2, T0 + 4)
    j = {"n1": b.data()}
    vs = inv.check_reservations(j, inv.specs_of(j), {"n1": 1024})
    assert [v.invariant for v in vs] == [inv.RESERVE]
    assert "task b reserving 600" in vs[0].detail


def test_a_start_with_no_unreserved_share_is_flagged() -> None:
    b = Book("n1")
    b.run(_spec("a", reserve=1024), T0 + 1, T0 + 3)
    b.run(_spec("b"), T0 + 2, T0 + 4)
    j = {"n1": b.data()}
    assert [v.invariant for v in inv.check_reservations(j, inv.specs_of(j), {})] == [inv.RESERVE]


def test_a_restart_ends_a_run_in_the_journal() -> None:
    b = Book("n1")
    b.submit(_spec("a", reserve=600))
    b.move("a", m.TaskState.RUNNING, T0 + 1)
    b.move("a", m.TaskState.QUEUED, T0 + 2)  # agent restarted: requeued
    b.run(_spec("b", reserve=600), T0 + 3, T0 + 4)
    j = {"n1": b.data()}
    assert inv.check_reservations(j, inv.specs_of(j), {"n1": 1024}) == []


def test_shares_at_follows_the_journaled_changes() -> None:
    evs = [SharesEvent(1, 10.0, 1024, 0), SharesEvent(2, 20.0, 0, 512)]
    assert [inv.shares_at(evs, 7, t) for t in (5.0, 10.0, 15.0, 25.0)] == [1024, 0, 0, 512]
    assert inv.shares_at([], 7, 5.0) == 7


# -------------------------------------------------------------- membership


def test_membership_agreement() -> None:
    ok = {"n1": {"n1": "alive", "n2": "alive"}, "n2": {"n1": "alive", "n2": "alive"}}
    assert inv.check_membership(ok, ["n1", "n2"], 0.5) == []
    bad = {"n1": {"n1": "alive", "n2": "dead"}}
    vs = inv.check_membership(bad, ["n1", "n2"], None)
    assert {v.invariant for v in vs} == {inv.MEMBERSHIP}
    assert len(vs) == 3  # no agreement in time, n1 misses n2, n2 did not answer


# -------------------------------------------------------------------- logs


def test_logs_tracebacks_stacks_and_errors() -> None:
    clean = "ts=1 level=info event=agent.ready node=n1\n# chaos: start Traceback-free\n"
    assert inv.check_log("n1", clean) == []
    text = (
        'ts=1 level=error event=api.handler_crashed node=n1 stack="Traceback\\n..."\n'
        "Traceback (most recent call last):\n"
        "ts=2 level=error event=journal.write_failed node=n1\n"
    )
    assert len(inv.check_log("n1", text)) == 3
    assert len(inv.check_log("n1", text, allowed_errors=["journal.write_failed"])) == 2


def test_exits_the_harness_did_not_cause_are_crashes() -> None:
    vs = inv.check_exits("n1", [(1.0, -9, True), (2.0, 0, False), (3.0, 1, False)])
    assert [v.invariant for v in vs] == [inv.NO_CRASH, inv.NO_CRASH]
    assert "did not send" in vs[0].detail and "code 1" in vs[1].detail


def test_integrity() -> None:
    good = Book("n1").data()
    bad = JournalData("n2", {}, (), (), integrity="*** in database main ***", bad_records=2)
    vs = inv.check_integrity({"n1": good, "n2": bad})
    assert [v.node for v in vs] == ["n2", "n2"]


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z_.]{0,8}", fullmatch=True),
        st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=20)
        | st.sampled_from(['a "quoted" value', "back\\slash", "two\nlines", ""]),
        max_size=6,
    )
)
def test_logfmt_reads_what_the_agent_writes(fields: dict[str, str]) -> None:
    line = " ".join(f"{k}={_logfmt_value(v)}" for k, v in fields.items())
    assert inv.logfmt(line) == fields


# ---------------------------------------------------------------- journals


async def test_read_journal_decodes_the_agents_own_journal(tmp_path: Path) -> None:
    j = Journal(tmp_path / "journal.db", node="n1")
    spec = _spec("t1", reserve=300)
    t = m.new_task(spec, time.time(), "n1")
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run)
        await j.commit([PutTask(t)])
        t = m.transition(t, m.TaskState.RUNNING, time.time(), "started", node="n1")
        await j.commit(
            [PutTask(t), Event(time.time(), "shares", None, "n1", {"old": 1024, "new": 0})]
        )
        nursery.cancel_scope.cancel()
    j.close()
    data = read_journal("n1", tmp_path / "journal.db")
    assert data.integrity == "ok" and data.bad_records == 0
    assert data.tasks["t1"].spec.reserve_shares == 300
    assert [(e.src, e.dst, e.node) for e in data.transitions] == [
        (None, "queued", "n1"),
        ("queued", "running", "n1"),
    ]
    assert [(s.old, s.new) for s in data.shares] == [(1024, 0)]


# ---------------------------------------------------------------- schedule


def test_plans_are_seeded_and_heal_before_the_workload_ends() -> None:
    for sc in (*FULL, *SMOKE, CANARY):
        a, b = make_plan(sc, 7), make_plan(sc, 7)
        assert a == b
        assert make_plan(sc, 8) != a or not a.faults
        for f in a.faults:
            assert 0 < f.start < f.end <= sc.duration - 3.0 + 1e-9, (sc.name, f)
            assert all(1 <= i <= sc.nodes for i in f.targets)
        assert all(d.end <= sc.duration for d in a.drains)
        assert all(0 < s.at < sc.duration for s in a.submits)


def test_a_single_lane_draws_every_fault_kind_before_repeating() -> None:
    sc = Scenario("two", faults=("loss", "bandwidth"), duration=40.0, hold=(3.0, 4.0))
    for seed in range(20):
        kinds = [f.kind for f in make_plan(sc, seed).faults]
        assert len(kinds) >= 2 and set(kinds[:2]) == {"loss", "bandwidth"}


def test_network_faults_are_left_out_when_unavailable() -> None:
    sc = next(s for s in FULL if s.name == "mixed")
    plan = make_plan(sc, 3, available=["kill", "pause", "shim", "cpu-hog"])
    assert plan.faults and {f.kind for f in plan.faults} <= {"kill", "pause", "shim", "cpu-hog"}


def test_the_canary_buries_node_1_in_work_then_drains_everyone() -> None:
    plan = make_plan(CANARY, random.Random(1).randint(0, 99))
    at_n1 = [s for s in plan.submits if s.node == 1 and 1.0 <= s.at < 1.2]
    assert len(at_n1) >= 16 and sum(1 for s in at_n1 if s.reserve == 600) >= 8
    drained = {d.node for d in plan.drains}
    assert drained == set(range(1, CANARY.nodes + 1))
    n1 = next(d for d in plan.drains if d.node == 1)
    assert all(d.start < n1.start < d.end for d in plan.drains if d.node != 1)


def test_the_keyed_check_names_plaintext_and_failed_authentication() -> None:
    clean = {"dropped_decrypt": 0, "dropped_mode": 0, "dropped_replay": 7}
    assert inv.check_encrypted("n1", "ts=1 level=info event=agent.started", clean) == []
    bad = inv.check_encrypted(
        "n2", "level=warning event=agent.insecure", {"dropped_decrypt": 3, "dropped_mode": 1}
    )
    assert {v.invariant for v in bad} == {inv.ENCRYPTED} and len(bad) == 3
    assert inv.check_encrypted("n3", "", None)[0].invariant == inv.ENCRYPTED


def test_the_full_suite_has_a_keyed_scenario_and_newer_ones_come_after_it() -> None:
    # appended: the scenarios before each keep their seeds (suite seed + index)
    names = [sc.name for sc in FULL]
    assert [sc.name for sc in FULL if sc.encrypted] == ["encrypted", "clock-skew"]
    assert names.index("encrypted") == 14
    assert names[15:] == [
        "priority-preempt", "constrained", "elastic", "home-loss",
        "agent-restart", "clock-skew", "home-loss-restarts", "gangs", "arrays",
        "late-binding", "backups", "home-back", "copies-after-a-return",
    ]  # fmt: skip
    assert not any(sc.encrypted for sc in SMOKE)


def test_the_chaos_key_file_is_private(tmp_path: Path) -> None:
    import os
    import stat

    from chaos.scenario import write_cluster_key
    from swarm.crypto import Keyring

    old = os.umask(0)
    try:
        p = write_cluster_key(tmp_path / "cluster.key")
    finally:
        os.umask(old)
    st_ = p.stat()
    assert stat.S_IMODE(st_.st_mode) == 0o600 and st_.st_uid == os.getuid()
    assert Keyring.parse(p.read_text()).primary


# ------------------------------------------------------------ issue 19's new checks


def test_at_most_once_tasks_never_overlap_in_their_marks() -> None:
    S = inv.Span
    acked = [inv.Acked("t1", "n1", at_most_once=True), inv.Acked("t2", "n1")]
    spans = {
        "t1": [S("n2", "10", T0, T0 + 3.0), S("n3", "11", T0 + 4.0, T0 + 5.0)],
        "t2": [S("n2", "12", T0, T0 + 3.0), S("n3", "13", T0 + 1.0, T0 + 5.0)],
    }
    out, procs, again = inv.check_at_most_once(acked, spans)
    assert out == [] and (procs, again) == (2, 1)  # t2 may overlap: at least once
    spans["t1"].append(S("n4", "14", T0 + 4.5, T0 + 6.0))
    out, _, _ = inv.check_at_most_once(acked, spans)
    assert [(v.invariant, v.node) for v in out] == [(inv.AT_MOST_ONCE, "n4")]
    assert "ran twice at once" in out[0].detail


def test_beat_marks_read_as_spans(tmp_path: Path) -> None:
    from chaos.workload import beat_task_argv, read_spans

    argv = beat_task_argv(tmp_path, 0.5)
    assert argv[:2] == ["sh", "-c"] and "m beat" in argv[2]
    (tmp_path / "t1").write_text(
        f"n2 1 start {T0} 10\nn2 1 beat {T0 + 0.2} 10\nn3 2 start {T0 + 1} 11\n"
        f"n2 1 beat {T0 + 0.4} 10\nn3 2 end {T0 + 1.5} 11\nbad line\n"
    )
    assert read_spans(tmp_path) == {
        "t1": [inv.Span("n2", "10", T0, T0 + 0.4), inv.Span("n3", "11", T0 + 1, T0 + 1.5)]
    }


def test_an_obeyed_cancel_must_end_cancelled() -> None:
    b = Book("n1")
    b.run(_spec("t1"), T0 + 1, T0 + 2)  # succeeded
    b.submit(_spec("t2"))
    b.move("t2", m.TaskState.CANCELLED, T0 + 1)
    acked = [inv.Acked("t1", "n1"), inv.Acked("t2", "n1")]
    assert inv.check_cancelled({"t2": "cancelled"}, acked, {"n1": b.data()}) == []
    out = inv.check_cancelled(
        {"t1": "cancelled", "t2": "refused: finished"}, acked, {"n1": b.data()}
    )
    assert [(v.invariant, v.detail) for v in out] == [
        (inv.CANCEL, "task t1: its cancel answered cancelled, its record ends succeeded")
    ]


def test_restart_scenarios_allow_no_second_run() -> None:
    E = inv.Execution
    acked = [inv.Acked("t1", "n1"), inv.Acked("g", "n1", is_global=True)]
    execs = {"t1": [E("n2", 1, T0, T0 + 1)], "g": [E("n1", 1, T0), E("n2", 1, T0)]}
    assert inv.check_no_rerun(acked, execs) == []
    execs["t1"].append(E("n2", 1, T0 + 1.02, T0 + 2))
    out = inv.check_no_rerun(acked, execs)
    assert [(v.invariant, v.node) for v in out] == [(inv.RESTART_RERUN, "n2")]


def test_a_missing_start_is_excused_by_a_kill_loss_or_full_disk_of_its_node() -> None:
    E, F = inv.Execution, inv.FaultWindow
    execs = {"t1": [E("n2", 1, T0 + 1, T0 + 2)]}
    none = {"n2": Book("n2").data()}
    [v] = inv.check_recorded(execs, none, [], name=inv.UNRECORDED)
    assert v.invariant == inv.UNRECORDED
    for kind, start, end in (
        ("kill", T0 + 2, T0 + 3),
        ("lose", T0 + 1.5, T0 + 9),
        ("disk-full", T0, T0 + 5),
    ):
        w = [F(kind, frozenset({"n2"}), start, end)]
        assert inv.check_recorded(execs, none, w, name=inv.UNRECORDED) == [], kind
    w = [F("pause", frozenset({"n2"}), T0 + 2, T0 + 3)]
    assert len(inv.check_recorded(execs, none, w, name=inv.UNRECORDED)) == 1


def test_restart_and_skew_faults_and_the_restart_only_rule() -> None:
    from chaos import faults as fl
    from chaos.schedule import restarts_only

    assert fl.KINDS["restart"] is fl.Restart and fl.KINDS["skew"] is fl.Skew
    assert restarts_only(find("agent-restart")) and not restarts_only(find("clock-skew"))
    assert find("agent-restart").keep_tasks == "always"
    plan = make_plan(find("home-loss-restarts"), 1021)
    lane2 = [f for f in plan.faults if f.lane == 2]
    assert lane2 and all(f.kind == "restart" and f.end - f.start <= 1.0 for f in lane2)


def test_a_second_run_needs_a_retry_point_in_the_journals() -> None:
    E = inv.Execution
    b = Book("n1")
    b.submit(_spec("t1"))
    b.move("t1", m.TaskState.RUNNING, T0 + 1, node="n2")
    b.move("t1", m.TaskState.SUCCEEDED, T0 + 2, node="n2")
    acked = [inv.Acked("t1", "n1")]
    runs = {"t1": [E("n2", 1, T0 + 1, T0 + 2), E("n3", 1, T0 + 3, T0 + 4)]}
    [v] = inv.check_reruns_recorded(acked, runs, {"n1": b.data()})
    assert v.invariant == inv.RETRY_RECORDED and "record shows 0 retries" in v.detail
    # the runner's journal holds a preemption (its record of the task may be gone)
    r = Book("n2")
    r.events.append(TransitionEvent(1, T0 + 2, "t1", "n2", "running", "queued", "preempted by x"))
    assert inv.check_reruns_recorded(acked, runs, {"n1": b.data(), "n2": r.data()}) == []
    ev = TransitionEvent
    assert inv.retry_point(ev(1, T0, "t1", "n1", "queued", "queued", "n2 died: re-queued"))
    assert inv.retry_point(ev(1, T0, "t1", "n1", None, "queued", "adopted from n2: ..."))
    assert not inv.retry_point(ev(1, T0, "t1", "n1", "transferring", "queued", "handed off to n2"))


def test_one_final_state_visible_from_every_node() -> None:
    ok = {"t1": {"n1": "succeeded", "n2": "succeeded"}}
    assert inv.check_visible(ok) == []
    bad = {"t1": {"n1": "succeeded", "n2": "running"}, "t2": {"n1": "error: x"}}
    assert [v.invariant for v in inv.check_visible(bad)] == [inv.VISIBLE, inv.VISIBLE]


def test_a_copy_must_learn_how_its_task_ended() -> None:
    """Chaos shim: a copy whose holder's answer was lost stayed `queued` for a task
    that had long succeeded at its home."""
    home = Book("n1")
    home.run(_spec("t1", home="n1"), T0 + 1, T0 + 2)
    home.run(_spec("t2", home="n1"), T0 + 1, T0 + 50)  # ended just before the check
    home.submit(_spec("t3", home="n1"))  # still queued: its copy may well say so
    j1 = home.data()
    j2 = attrs.evolve(Book("n2").data(), open_copies={"t1": "n1", "t2": "n1", "t3": "n1"})
    j3 = attrs.evolve(Book("n3").data(), open_copies={"t1": "n1"})
    journals = {"n1": j1, "n2": j2, "n3": j3}
    got = inv.check_copies_released(journals, ended_before=T0 + 10)
    assert [(v.invariant, v.node) for v in got] == [
        (inv.COPY_RELEASED, "n2"),
        (inv.COPY_RELEASED, "n3"),
    ]
    assert "t1" in got[0].detail and "succeeded" in got[0].detail
    # a holder or a home lost for good is not judged
    assert [v.node for v in inv.check_copies_released(journals, ["n3"], T0 + 10)] == ["n2"]
    assert inv.check_copies_released(journals, ["n1"], T0 + 10) == []


# --------------------------------------------------------------- gangs (issue 22)


def _spans(**members: tuple[float, float]) -> dict[str, list[inv.Span]]:
    return {tid.replace("_", "."): [inv.Span("n1", "1", a, b)] for tid, (a, b) in members.items()}


def test_a_gang_start_that_ran_whole_is_no_partial_run() -> None:
    spans = _spans(g_0=(10.0, 20.0), g_1=(10.1, 20.0), g_2=(10.05, 19.9), other=(0.0, 99.0))
    starts = inv.gang_starts("g", spans)
    assert list(starts) == ["1"] and sorted(starts["1"]) == [0, 1, 2]
    worst, _ = inv.longest_partial(starts["1"], 3)
    assert worst < 0.2
    acked = [inv.Acked("g", "n1", gang=3)]
    out, figs = inv.check_gangs(acked, spans, {}, bound=27.15)
    assert out == [] and figs["starts"] == 1 and figs["members"] == 3


def test_a_strict_gang_running_partly_past_the_bound_is_a_violation() -> None:
    # rank 2 died at 12 s; ranks 0 and 1 ran on to 60 s: 48 s partial
    spans = _spans(g_0=(10.0, 60.0), g_1=(10.0, 60.0), g_2=(10.0, 12.0))
    out, figs = inv.check_gangs([inv.Acked("g", "n1", gang=3)], spans, {}, bound=27.15)
    assert [v.invariant for v in out] == [inv.GANG_PARTIAL]
    assert 47.0 < figs["worst_partial_s"] < 49.0
    # a non-strict gang may run on without a member
    out, _ = inv.check_gangs([inv.Acked("g", "n1", gang=3, strict=False)], spans, {}, 27.15)
    assert out == []
    # within the bound: not a violation; a second start (ids g.R.2) is judged on its own
    ok = _spans(g_0=(10.0, 30.0), g_1=(10.0, 30.0), g_2=(10.0, 12.0), g_0_2=(50, 51))
    out, figs = inv.check_gangs([inv.Acked("g", "n1", gang=3)], ok, {}, bound=27.15)
    assert out == [] and figs["starts"] == 2


def test_a_succeeded_strict_gang_needs_a_whole_start() -> None:
    b = Book("n1")
    b.run(m.TaskSpec(id="g", argv=("x",), home="n1", gang=m.GangRequest(3)), T0, T0 + 5)
    spans = _spans(g_0=(T0, T0 + 4), g_1=(T0, T0 + 4))
    out, _ = inv.check_gangs([inv.Acked("g", "n1", gang=3)], spans, {"n1": b.data()}, 27.15)
    assert [v.invariant for v in out] == [inv.GANG_WHOLE]
    # and its record succeeding without marks of its own is not `executed`'s business
    assert inv.check_executed([inv.Acked("g", "n1", gang=3)], {"n1": b.data()}, {}) == []


def test_the_gang_scenario_submits_gangs_from_a_stream_of_its_own() -> None:
    sc = find("gangs")
    plan = make_plan(sc, 5)
    gangs = [s for s in plan.submits if s.kind == "gang"]
    assert len(gangs) == sc.gangs and all(s.gang == 3 for s in gangs)
    assert {s.strict for s in gangs} == {True, False}
    others = [s for s in plan.submits if s.kind != "gang"]
    import attrs as _attrs

    plain = make_plan(_attrs.evolve(sc, gangs=0), 5)
    assert others == list(plain.submits)


def test_a_gang_record_running_at_a_drained_home_is_no_start() -> None:
    # the gang's own record goes RUNNING at its home when its members run elsewhere
    b = Book("n1")
    b.set_shares(T0, 1024, 0)
    gang = m.TaskSpec(id="g", argv=("x",), home="n1", gang=m.GangRequest(3))
    b.run(gang, T0 + 1, T0 + 5)
    b.run(m.TaskSpec(id="a", argv=("x",), home="n1", array="0-3"), T0 + 1, T0 + 5)
    j = {"n1": b.data()}
    assert inv.check_drain(j, inv.specs_of(j)) == []
    assert inv.check_reservations(j, inv.specs_of(j), {"n1": 1024}) == []
    single = m.TaskSpec(id="s", argv=("x",), home="n1")
    b.run(single, T0 + 1, T0 + 5)
    j = {"n1": b.data()}
    assert [v.invariant for v in inv.check_drain(j, inv.specs_of(j))] == [inv.DRAIN]


# --------------------------------------------------------------- arrays and --after (issue 23)


def _ended_as(b: Book, tid: str, reason: str) -> None:
    """The record's reason, as the home writes it when an array ends (arrays.py)."""
    b.tasks[tid] = attrs.evolve(b.tasks[tid], reason=reason)


def test_every_element_of_an_ended_array_must_have_ended_once() -> None:
    b = Book("n1")
    arr = m.TaskSpec(id="arr", argv=("x",), home="n1", array="0-2")
    b.run(arr, T0, T0 + 9)
    _ended_as(b, "arr", "all 3 elements succeeded")
    for i in (0, 1, 2):
        b.run(m.TaskSpec(id=f"arr_{i}", argv=("x",), home="n1"), T0 + i, T0 + i + 1)
    out, figs = inv.check_arrays([inv.Acked("arr", "n1", array="0-2")], {"n1": b.data()})
    assert out == [] and figs == {"arrays": 1, "elements": 3, "ended": 3}
    b2 = Book("n1")
    b2.run(arr, T0, T0 + 9)
    b2.run(m.TaskSpec(id="arr_0", argv=("x",), home="n1"), T0, T0 + 1)
    out, _ = inv.check_arrays([inv.Acked("arr", "n1", array="0-2")], {"n1": b2.data()})
    assert {v.invariant for v in out} == {inv.ARRAY_WHOLE} and len(out) == 2


def test_an_ended_array_must_say_how_each_element_ended() -> None:
    """Stop 52: a restart lost an element's end from its array's counts, and the array
    could end succeeded with a failed element, or count fewer elements than it has."""
    acked = [inv.Acked("arr", "n1", array="0-2")]
    for reason, fail_one, bad in (
        ("all 3 elements succeeded", False, False),
        ("all 2 elements succeeded", False, True),  # one end never counted
        ("all 3 elements succeeded", True, True),  # succeeded, with a failed element
        ("elements: 1 failed, 2 succeeded", True, False),
        ("elements: 1 failed, 1 succeeded", True, True),
    ):
        b = Book("n1")
        arr = m.TaskSpec(id="arr", argv=("x",), home="n1", array="0-2")
        b.submit(arr, T0)
        b.move("arr", m.TaskState.RUNNING, T0 + 1)
        end = m.TaskState.FAILED if fail_one and "failed" in reason else m.TaskState.SUCCEEDED
        b.move("arr", end, T0 + 9)
        _ended_as(b, "arr", reason)
        for i in (0, 1, 2):
            b.run(m.TaskSpec(id=f"arr_{i}", argv=("x",), home="n1"), T0 + i, T0 + i + 1)
        if fail_one:
            b.tasks["arr_1"] = attrs.evolve(b.tasks["arr_1"], state=m.TaskState.FAILED)
        out, _ = inv.check_arrays(acked, {"n1": b.data()})
        assert [v.invariant for v in out] == ([inv.ARRAY_WHOLE] if bad else []), (reason, out)


def test_a_child_that_started_before_its_parent_ended_is_a_violation() -> None:
    b = Book("n1")
    b.run(m.TaskSpec(id="p", argv=("x",), home="n1"), T0, T0 + 5)
    b.run(m.TaskSpec(id="late", argv=("x",), home="n1"), T0 + 6, T0 + 7)
    b.run(m.TaskSpec(id="early", argv=("x",), home="n1"), T0 + 2, T0 + 3)
    j = {"n1": b.data()}
    ok = [inv.Acked("late", "n1", after=("ok:p",))]
    assert inv.check_dependencies(ok, j)[0] == []
    bad = [inv.Acked("early", "n1", after=("any:p",))]
    assert [v.invariant for v in inv.check_dependencies(bad, j)[0]] == [inv.DEP_ORDER]
    wrong = [inv.Acked("late", "n1", after=("notok:p",))]  # p succeeded
    assert [v.invariant for v in inv.check_dependencies(wrong, j)[0]] == [inv.DEP_ORDER]


def test_the_arrays_scenario_submits_arrays_and_children_from_a_stream_of_its_own() -> None:
    import attrs as _attrs

    sc = find("arrays")
    plan = make_plan(sc, 5)
    arrays = [s for s in plan.submits if s.kind == "array"]
    kids = [s for s in plan.submits if s.kind == "after"]
    assert len(arrays) == sc.groups and kids and all(s.cond in ("ok", "any", "notok") for s in kids)
    plain = make_plan(_attrs.evolve(sc, groups=0), 5)
    assert [s for s in plan.submits if s.kind not in ("array", "after")] == list(plain.submits)


def test_an_array_record_succeeding_without_marks_of_its_own_is_not_unexecuted() -> None:
    b = Book("n1")
    b.run(m.TaskSpec(id="arr", argv=("x",), home="n1", array="0-1"), T0, T0 + 5)
    assert inv.check_executed([inv.Acked("arr", "n1", array="0-1")], {"n1": b.data()}, {}) == []


def test_an_old_home_back_after_its_grace_does_not_start_what_was_adopted_from_it() -> None:
    """node/doubt.py's promise, as chaos checks it (`old-home-waits-after-adoption`)."""
    from chaos.schedule import down_only

    E, F = inv.Execution, inv.FaultWindow
    b = Book("n2")
    b.events.append(
        TransitionEvent(1, T0 + 8, "t1", "n2", "queued", "queued", "adopted from n1: x")
    )
    journals = {"n2": b.data()}
    down = [F("kill", frozenset({"n1"}), T0, T0 + 12)]  # down 12 s, grace 5
    execs = {"t1": [E("n2", 1, T0 + 9, T0 + 10)]}
    assert inv.check_old_home_waits(execs, journals, down, 5.0) == []
    execs["t1"].append(E("n1", 1, T0 + 13, T0 + 14))  # 1 s after its restart: in doubt
    [v] = inv.check_old_home_waits(execs, journals, down, 5.0)
    assert (v.invariant, v.node) == (inv.OLD_HOME_WAITS, "n1") and "adopted by n2" in v.detail
    # run there as the adopter's guest, after letting it go: not the old home's run
    a = Book("n1")
    a.events.append(TransitionEvent(1, T0 + 12.5, "t1", "n1", None, "queued", "accepted from n2"))
    assert inv.check_old_home_waits(execs, {**journals, "n1": a.data()}, down, 5.0) == []
    # a start after the doubt's least window, a shorter absence, or a pause: not checked
    late = {"t1": [E("n1", 1, T0 + 12 + inv.DOUBT_MIN + 0.1)]}
    assert inv.check_old_home_waits(late, journals, down, 5.0) == []
    assert inv.check_old_home_waits(execs, journals, down, 20.0) == []
    paused = [F("pause", frozenset({"n1"}), T0, T0 + 12)]
    assert inv.check_old_home_waits(execs, journals, paused, 5.0) == []
    assert down_only(find("home-loss")) and down_only(find("home-loss-restarts"))
    assert not down_only(find("pause")) and not down_only(find("clock-skew"))


def test_a_submission_is_copied_while_a_peer_of_its_home_is_up() -> None:
    """Stop 53 (`copy-while-a-peer-is-up`): an answer with no copy elsewhere while
    another node was surely up is a violation; one while every peer was down, or
    within the margin of a peer's down span, is not judged; answers without the
    field (an array, a gang, --after) are not counted."""
    nodes = ["n1", "n2", "n3", "n4"]
    t0 = 1000.0
    lose = inv.FaultWindow("lose", frozenset({"n4"}), t0, t0 + 500.0)
    kill = inv.FaultWindow("kill", frozenset({"n2"}), t0 + 50.0, t0 + 60.0)
    cut = inv.FaultWindow("isolate", frozenset({"n3"}), t0 + 50.0, t0 + 60.0)
    windows = [lose, kill, cut]

    def acked(tid: str, at: float, copies: int | None, home: str = "n1") -> inv.Acked:
        return inv.Acked(tid, home, at=t0 + at, copies=copies)

    good = [acked("ok", 55.0, 1), acked("array", 55.0, None)]
    out, f = inv.check_copies(good, windows, nodes)
    assert out == [] and f == {"answers": 1, "checked": 1, "copied": 1}
    # n2 killed, n4 lost: n3 is up (a cut is not down): its copy was owed
    out, _ = inv.check_copies([acked("t1", 55.0, 0)], windows, nodes)
    assert [v.invariant for v in out] == [inv.COPIED] and "n3 was up" in out[0].detail
    # at n3, within the margin of n2's kill (taken as down), n4 lost: n1 is up
    out, _ = inv.check_copies([acked("t2", 65.0, 0, home="n3")], windows, nodes)
    assert [v.node for v in out] == ["n3"] and "down then: n2, n4" in out[0].detail
    # no peer surely up: not judged
    both = [inv.FaultWindow("kill", frozenset({"n2", "n3"}), t0 + 50.0, t0 + 60.0), lose]
    assert inv.check_copies([acked("t4", 55.0, 0)], both, nodes) == (
        [],
        {"answers": 1, "checked": 0, "copied": 0},
    )
    # two nodes: no copy is wanted
    assert inv.check_copies([acked("t5", 55.0, 0)], [], ["n1", "n2"])[0] == []


def test_a_task_lost_with_its_home_is_excused_only_if_no_peer_was_back_in_time() -> None:
    """Stop 55 (`copied-once-a-peer-is-back`): a task answered with no copy and lost
    with its home is a violation when a peer was surely up beside the home for
    TOPUP_STRETCH s between the answer and the loss (node/topup.py copies it at the
    next tick); excused when the peers came back too late, or the home was down."""
    nodes = ["n1", "n2", "n3"]
    t0 = 1000.0
    # both peers of n1 killed 0-40 s; n1 lost for good at 100 s
    peers = inv.FaultWindow("kill", frozenset({"n2", "n3"}), t0, t0 + 40.0)
    lose = inv.FaultWindow("lose", frozenset({"n1"}), t0 + 100.0, t0 + 400.0)

    def acked(tid: str, copies: int | None = 0, home: str = "n1") -> inv.Acked:
        return inv.Acked(tid, home, at=t0 + 20.0, copies=copies)

    # the peers were up 50-90 s (outside the margins): the copy was owed
    out, judged = inv.check_copied_late([acked("t1")], ["t1"], [peers, lose], nodes)
    assert [v.invariant for v in out] == [inv.COPIED_LATE] and judged == 1
    assert "n2 was up beside it from 1050.0 to 1090.0" in out[0].detail
    # the peers back at 88 s: within the loss's margin, never surely up together
    late = inv.FaultWindow("kill", frozenset({"n2", "n3"}), t0, t0 + 88.0)
    assert inv.check_copied_late([acked("t1")], ["t1"], [late, lose], nodes) == ([], 1)
    # the peers up, but the home itself killed 45-78 s: 88-90 s left, too short
    home = inv.FaultWindow("kill", frozenset({"n1"}), t0 + 45.0, t0 + 78.0)
    out, _ = inv.check_copied_late([acked("t1")], ["t1"], [peers, home, lose], nodes)
    assert out == []
    # not judged: answered with a copy, or without the field (an array), or not lost,
    # or on two nodes
    assert inv.check_copied_late([acked("t2", 1)], ["t2"], [peers, lose], nodes) == ([], 0)
    assert inv.check_copied_late([acked("t3", None)], ["t3"], [peers, lose], nodes) == ([], 0)
    assert inv.check_copied_late([acked("t4")], [], [peers, lose], nodes) == ([], 0)
    assert inv.check_copied_late([acked("t5")], ["t5"], [peers, lose], nodes[:2]) == ([], 0)
