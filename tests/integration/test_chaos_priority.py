"""The priority scenario's checks (chaos/invariants.py, preemption section) on synthetic
journals and marks: each must pass a clean preempt-and-rerun and name itself when its
rule is broken; plus the task's timed marks written by the real shell and the plan's
waves."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from chaos import invariants as inv
from chaos.invariants import Acked
from chaos.journals import JournalData, TransitionEvent
from chaos.schedule import make_plan
from chaos.suites import find
from chaos.workload import read_executions, read_marks, timed_task_argv
from swarm import model as m

T0 = 1_000_000.0
CAUSE = "preempted by t9 (priority high > low)"
Ev = tuple[float, str, str | None, str, str]  # at, task, src, dst, cause


def journal(node: str, events: list[Ev]) -> JournalData:
    """A node's journal with these transition events (the writer is `node`)."""
    evs = tuple(
        TransitionEvent(k, at, tid, node, src, dst, cause)
        for k, (at, tid, src, dst, cause) in enumerate(events, 1)
    )
    return JournalData(node, {}, evs, ())


def run(
    node: str, attempt: int, start: float, end: float | None, stopped: bool = False
) -> inv.Execution:
    return inv.Execution(node, attempt, T0 + start, None if end is None else T0 + end, stopped)


def preempted_and_rerun(node: str = "n2") -> tuple[dict[str, JournalData], list[inv.Execution]]:
    """t1 runs on `node`, is preempted at +2 s (its shell stopped at +2.05), runs again
    from +3 to +6: what the executor journals and what the task's marks say."""
    j = journal(
        node,
        [
            (T0 + 0.0, "t1", "queued", "running", "started"),
            (T0 + 2.1, "t1", "running", "queued", CAUSE),
            (T0 + 3.0, "t1", "queued", "running", "started"),
            (T0 + 6.0, "t1", "running", "succeeded", "exited 0"),
        ],
    )
    return {node: j}, [run(node, 1, 0.0, 2.05, stopped=True), run(node, 2, 3.0, 6.0)]


def kill(node: str, start: float, end: float) -> inv.FaultWindow:
    return inv.FaultWindow("kill", frozenset({node}), T0 + start, T0 + end)


def test_a_preempted_task_that_ran_again_passes_every_check() -> None:
    journals, runs = preempted_and_rerun()
    execs, homes = {"t1": runs}, {"t1": "n2"}
    assert inv.check_one_at_a_time(execs, homes, []) == []
    assert inv.check_recorded(execs, journals, []) == []
    violations, why = inv.check_reruns(execs, journals, homes, [])
    assert violations == [] and why == {"preempted": 1}
    logged = [inv.LoggedPreemption("n2", T0 + 2.0, "t1", "t9")]
    assert inv.check_preemptions_recorded(logged, journals, []) == []
    assert inv.check_preemption_happened(journals) == []


def test_a_guest_task_preempted_is_found_in_the_guests_journal_not_the_homes() -> None:
    journals, runs = preempted_and_rerun("n3")
    # the home's record shows the handoff and the final outcome only (no preemption)
    journals["n1"] = journal(
        "n1",
        [
            (T0 - 1.0, "t1", None, "queued", "submitted"),
            (T0 - 0.5, "t1", "queued", "transferring", "offered to n3"),
            (T0 - 0.4, "t1", "transferring", "queued", "handed off to n3"),
            (T0 + 6.1, "t1", "queued", "succeeded", "exited 0"),
        ],
    )
    violations, why = inv.check_reruns({"t1": runs}, journals, {"t1": "n1"}, [])
    assert violations == [] and why["preempted"] == 1
    assert [e.node for e in inv.preemptions(journals)] == ["n3"]


def test_a_rerun_no_journal_says_was_preempted_breaks_rerun_explained() -> None:
    journals, runs = preempted_and_rerun()
    j = journals["n2"]
    # the same re-run, but the executor journaled the re-queue without the preemption
    silent = tuple(
        e if not e.cause.startswith("preempted") else TransitionEvent(
            e.seq, e.at, e.task_id, e.node, e.src, e.dst, "re-queued"
        )
        for e in j.transitions
    )  # fmt: skip
    journals["n2"] = JournalData("n2", {}, silent, ())
    violations, _ = inv.check_reruns({"t1": runs}, journals, {"t1": "n2"}, [])
    assert [v.invariant for v in violations] == [inv.RERUN]
    assert "task t1 ran again" in str(violations[0]) and str(violations[0]).startswith(
        "rerun-explained"
    )
    assert inv.check_preemption_happened(journals)[0].invariant == inv.PREEMPTED
    # a kill of the executor between the two runs explains it
    ok, why = inv.check_reruns({"t1": runs}, journals, {"t1": "n2"}, [kill("n2", 2.0, 2.9)])
    assert ok == [] and why == {"fault": 1}
    # a kill long before, or of an uninvolved node, does not
    far = [kill("n2", -60.0, -50.0), kill("n5", 2.0, 2.9)]
    assert len(inv.check_reruns({"t1": runs}, journals, {"t1": "n2"}, far)[0]) == 1


def test_one_preemption_explains_one_rerun_only() -> None:
    journals, runs = preempted_and_rerun()
    third = run("n2", 3, 6.5, 8.0)
    journals["n2"] = journal(
        "n2",
        [(e.at, e.task_id, e.src, e.dst, e.cause) for e in journals["n2"].transitions]
        + [(T0 + 6.5, "t1", "queued", "running", "started")],
    )
    violations, why = inv.check_reruns({"t1": [*runs, third]}, journals, {"t1": "n2"}, [])
    assert why == {"preempted": 1} and [v.invariant for v in violations] == [inv.RERUN]


def test_an_execution_no_journal_started_breaks_execution_recorded() -> None:
    journals, runs = preempted_and_rerun()
    extra = run("n2", 2, 6.5, 7.0)
    violations = inv.check_recorded({"t1": [*runs, extra]}, journals, [])
    assert [v.invariant for v in violations] == [inv.RECORDED]
    assert "3 executions there" in violations[0].detail
    # a kill -9 right after that start may have lost the queued write: excused
    assert inv.check_recorded({"t1": [*runs, extra]}, journals, [kill("n2", 7.0, 9.0)]) == []
    # so may a kill that began just before it: the task's supervisor outlives its agent
    # and may start the process after the agent died (home-loss, seed 1031)
    elsewhere = run("n4", 1, 6.5, None)  # n4's journal has no start of t1
    assert inv.check_recorded({"t1": [elsewhere]}, journals, [kill("n4", 5.0, 9.0)]) == []
    early = inv.check_recorded({"t1": [elsewhere]}, journals, [kill("n4", 4.0, 9.0)])
    assert [v.invariant for v in early] == [inv.RECORDED]  # 2.5 s before: not that


def test_two_executions_at_once_break_one_execution_at_a_time() -> None:
    # the preempted process was never stopped: it ran on while the task started again
    overlapping = [run("n2", 1, 0.0, 4.0), run("n2", 2, 3.0, 6.0)]
    violations = inv.check_one_at_a_time({"t1": overlapping}, {"t1": "n2"}, [])
    assert [v.invariant for v in violations] == [inv.ONE_AT_A_TIME]
    assert "ran twice at once" in violations[0].detail
    # an orphan of a killed agent (no end: SIGKILLed at the restart) is explained
    orphan = [run("n2", 1, 0.0, None), run("n3", 2, 3.0, 6.0)]
    assert inv.check_one_at_a_time({"t1": orphan}, {"t1": "n1"}, [kill("n2", 1.0, 5.0)]) == []
    assert len(inv.check_one_at_a_time({"t1": orphan}, {"t1": "n1"}, [])) == 1
    # a cut that isolates the guest from its home explains a home's re-placement
    cut = inv.FaultWindow("isolate", frozenset({"n2"}), T0 + 1.0, T0 + 8.0)
    assert inv.check_one_at_a_time({"t1": overlapping}, {"t1": "n1"}, [cut]) == []


def test_a_logged_preemption_missing_from_the_record_breaks_preemption_in_record() -> None:
    logged = [inv.LoggedPreemption("n2", T0 + 2.0, "t1", "t9")]
    failed = {
        "n2": journal(
            "n2",
            [
                (T0, "t1", "queued", "running", "started"),
                (T0 + 2.1, "t1", "running", "failed", "killed by signal 15"),
            ],
        )
    }
    (v,) = inv.check_preemptions_recorded(logged, failed, [])
    assert v.invariant == inv.PREEMPT_RECORDED and "killed by signal 15" in v.detail
    # never left running, and no kill to lose the write
    never = {"n2": journal("n2", [(T0, "t1", "queued", "running", "started")])}
    assert inv.check_preemptions_recorded(logged, never, [])[0].invariant == inv.PREEMPT_RECORDED
    assert inv.check_preemptions_recorded(logged, never, [kill("n2", 2.5, 6.0)]) == []
    # it exited 0 before the stop reached it: a result, not a lie
    done = {
        "n2": journal(
            "n2",
            [
                (T0, "t1", "queued", "running", "started"),
                (T0 + 2.01, "t1", "running", "succeeded", "exited 0"),
            ],
        )
    }
    assert inv.check_preemptions_recorded(logged, done, []) == []


def test_logged_preemptions_are_read_from_the_agents_logfmt() -> None:
    text = (
        "ts=1000.5 level=info event=task.preempted task=t1 by=t9\n"
        'ts=1001.0 level=info event=task.state task=t1 cause="task.preempted"\n'
    )
    assert inv.logged_preemptions("n2", text) == [inv.LoggedPreemption("n2", 1000.5, "t1", "t9")]


def test_timed_marks_of_the_real_shell_show_an_end_a_stop_and_a_kill(tmp_path: Path) -> None:
    env = dict(os.environ, SWARM_NODE="n4", SWARM_TASK_ID="tx")

    def start(attempt: int, seconds: float) -> subprocess.Popen[bytes]:
        e = dict(env, SWARM_ATTEMPT=str(attempt))
        return subprocess.Popen(timed_task_argv(tmp_path, seconds), env=e, start_new_session=True)

    assert start(1, 0.05).wait(10) == 0
    for attempt, sig in ((2, signal.SIGTERM), (3, signal.SIGKILL)):
        p = start(attempt, 30)
        deadline = time.monotonic() + 10
        while f"n4 {attempt} start" not in (tmp_path / "tx").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # as the executor stops a task: the whole group, again until it is gone (a
        # signal that came while sh forked `sleep` missed the child, and sh ran its trap
        # only once `sleep 30` ended: the wait timed out under make test's load)
        for _ in range(10):
            os.killpg(p.pid, sig)
            try:
                p.wait(1.0)
                break
            except subprocess.TimeoutExpired:
                continue
        assert p.poll() is not None, "the shell outlived its signals"
    one, two, three = read_executions(tmp_path)["tx"]
    assert (one.node, one.attempt, one.stopped) == ("n4", 1, False) and one.end is not None
    assert two.stopped and two.end is not None and two.start >= one.end
    assert three.attempt == 3 and three.end is None
    assert read_marks(tmp_path) == {"tx": ["n4", "n4", "n4"]}  # start lines only


def test_the_priority_plan_fills_every_slot_with_low_then_sends_high() -> None:
    sc = find("priority-preempt")
    plan = make_plan(sc, 1015)
    assert {s.priority for s in plan.submits} == {"low", "high"}
    assert plan.faults and {f.kind for f in plan.faults} <= {"kill", "isolate", "split"}
    assert "kill" in {f.kind for f in plan.faults}
    first_wave = [s for s in plan.submits if s.at < 1.0]
    assert all(s.priority == "low" for s in first_wave)
    per_node = {n: sum(1 for s in first_wave if s.node == n) for n in range(1, sc.nodes + 1)}
    assert min(per_node.values()) > sc.slots  # every slot taken, one more queued
    highs = [s for s in plan.submits if s.priority == "high"]
    assert len(highs) >= sc.bursts and min(s.at for s in highs) >= 1.5
    assert max(s.seconds for s in highs) < min(s.seconds for s in plan.submits if s.kind == "low")
    assert all(isinstance(s.seconds, float) for s in plan.submits)
    assert m.TaskState.QUEUED.value == "queued"  # the journal's spelling the checks read


def test_late_binding_a_held_task_run_twice_needs_a_fault_to_explain_it() -> None:
    """Issue 24's check (`late-held-task-ran-once`) on synthetic journals: a task its
    home held for late binding ran at the home and at a puller; with no kill or cut
    between, that breaks the check, named; a kill of the first runner explains it."""
    home = JournalData("n1", {}, (), (), late_held=frozenset({"t1"}))
    runs = {"t1": [run("n1", 1, 0.0, 1.0), run("n2", 1, 2.0, 3.0)]}
    journals = {"n1": home}
    homes = {"t1": "n1"}
    [v], f = inv.check_late_binding(runs, journals, homes, [])
    assert v.invariant == inv.LATE_ONCE and "t1" in v.detail
    assert f == {"held": 1, "at_home": 1, "pulled": 0, "reruns_explained": 0, "never_ran": 0}
    out, f = inv.check_late_binding(runs, journals, homes, [kill("n1", 0.5, 1.5)])
    assert out == [] and f["reruns_explained"] == 1
    # a task it never held is not this check's business; one never run is counted
    out, f = inv.check_late_binding({"t1": [run("n2", 1, 0.0, 1.0)]}, journals, homes, [])
    assert out == [] and f["pulled"] == 1
    out, f = inv.check_late_binding({}, journals, homes, [])
    assert out == [] and f["never_ran"] == 1


def test_backups_check_on_synthetic_journals() -> None:
    """Issue 24's check (`backup-only-idempotent-once-and-ended`): a backup of a task
    not marked --idempotent, a second backup, a backup still running, and a result
    taken from a backup that failed are each named; a sound race passes."""
    S = m.TaskState

    def done(t: m.Task, state: m.TaskState, cause: str, node: str = "n2") -> m.Task:
        t = m.transition(t, S.RUNNING, 1.0, "started", node=node)
        return m.transition(t, state, 2.0, cause, exit_code=0 if state is S.SUCCEEDED else 1)

    def task(tid: str, idem: bool = True, of: str = "") -> m.Task:
        spec = m.TaskSpec(id=tid, argv=("x",), home="n1", idempotent=idem, backup_of=of)
        return m.new_task(spec, 0.0, "n1")

    o = done(task("o1"), S.SUCCEEDED, "backup b1 finished first on n2: its result", "n2")
    b = done(task("b1", of="o1"), S.SUCCEEDED, "exited 0")
    sound = JournalData("n1", {"o1": o, "b1": b}, (), ())
    out, f = inv.check_backups({"n1": sound})
    assert out == [] and f["backups"] == 1 and f["won"] == 1
    plain = done(task("o2", idem=False), S.SUCCEEDED, "exited 0", "n1")
    twice = [task("b2", of="o2"), done(task("b3", of="o2"), S.FAILED, "exited 1")]
    lied = done(task("o3"), S.SUCCEEDED, "backup b4 finished first on n2: its result")
    b4 = done(task("b4", of="o3"), S.FAILED, "exited 1")
    bad = JournalData(
        "n1",
        {t.id: t for t in (plain, *twice, lied, b4)},
        (),
        (),
    )
    out, _ = inv.check_backups({"n1": bad})
    details = " | ".join(v.detail for v in out)
    assert {v.invariant for v in out} == {inv.BACKUP_SOUND}
    assert "o2: 2 backups" in details and "o2 is not --idempotent" in details
    assert "backup b2 of o2 never ended" in details and "o3 took its result from b4" in details
    # a result taken from a backup is backed by the backup's execution
    acked = [inv_acked("o1")]
    assert inv.check_executed(acked, {"n1": sound}, {"b1": ["n2 1"]}) == []
    [v] = inv.check_executed(acked, {"n1": sound}, {})
    assert v.invariant == inv.EXECUTED


def inv_acked(tid: str) -> Acked:
    return Acked(tid, "n1", False, (), False, 0, True)
