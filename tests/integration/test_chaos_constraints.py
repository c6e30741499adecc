"""The labelled scenario's check (chaos/invariants.py, `constraint-respected`) on
synthetic journals and marks: a clean run passes, an execution on a node whose labels
miss the task's constraints is named, whichever evidence shows it; plus the plan's
labels and constraint sets."""

from __future__ import annotations

from chaos import invariants as inv
from chaos.cluster import label_args
from chaos.journals import JournalData, TransitionEvent
from chaos.schedule import CONSTRAINT_MENU, make_plan, node_labels
from chaos.suites import FULL, find
from swarm import model as m
from swarm.policy.constraints import parse_constraints, unmet

T0 = 1_000_000.0
S = m.TaskState
LABELS = {f"n{i}": kv for i, kv in node_labels(find("constrained")).items()}


def spec(tid: str, constraints: tuple[str, ...], home: str = "n1") -> m.TaskSpec:
    return m.TaskSpec(id=tid, argv=("true",), home=home, constraints=constraints)


def journal(node: str, runs: list[tuple[m.TaskSpec, str]]) -> JournalData:
    """`node`'s journal: each task submitted here, started on the node named (as a home
    records a guest's start: `started on nX`) and succeeded."""
    tasks: dict[str, m.Task] = {}
    evs: list[TransitionEvent] = []
    for k, (sp, where) in enumerate(runs):
        at = T0 + k
        t = m.new_task(sp, at, node)
        t = m.transition(t, S.RUNNING, at + 0.1, f"started on {where}", node=where)
        t = m.transition(t, S.SUCCEEDED, at + 0.5, "exited 0", node=where)
        tasks[sp.id] = t
        for h in t.history:
            src = None if h.src is None else h.src.value
            evs.append(TransitionEvent(len(evs) + 1, h.at, sp.id, h.node, src, h.dst.value, "x"))
    return JournalData(node, tasks, tuple(evs), ())


def clean() -> tuple[dict[str, JournalData], dict[str, list[str]], list[inv.Acked]]:
    a, b, c = spec("t1", ("pool=a",)), spec("t2", ("rack in r1,r2",)), spec("t3", ())
    journals = {"n1": journal("n1", [(a, "n3"), (b, "n4"), (c, "n2")])}
    journals["n3"] = journal("n3", [(a, "n3")])  # the guest's copy of t1
    marks = {"t1": ["n3"], "t2": ["n4"], "t3": ["n2"]}
    acked = [
        inv.Acked("t1", "n1", False, a.constraints),
        inv.Acked("t2", "n1", False, b.constraints),
    ]
    acked.append(inv.Acked("t3", "n1"))
    return journals, marks, acked


def test_executions_on_nodes_that_meet_the_constraints_pass() -> None:
    journals, marks, acked = clean()
    out = inv.check_constraints(journals, LABELS, marks, acked)
    assert out.violations == ()
    # t1 and t2 are constrained; only t1's guest journal is here: one executor's start
    assert (out.tasks, out.starts, out.marks) == (2, 1, 2)


def test_a_start_on_a_node_missing_the_label_value_is_named() -> None:
    journals, marks, acked = clean()
    bad = spec("t4", ("pool=a",))
    journals["n1"] = journal(
        "n1", [*[(t.spec, t.node) for t in journals["n1"].tasks.values()], (bad, "n2")]
    )
    marks["t4"] = ["n2"]
    acked.append(inv.Acked("t4", "n1", False, bad.constraints))
    out = inv.check_constraints(journals, LABELS, marks, acked)
    assert len(out.violations) == 1
    (v,) = out.violations
    assert v.invariant == inv.CONSTRAINT == "constraint-respected" and v.node == "n2"
    assert "t4" in v.detail and "pool=a" in v.detail and "pool=b" in v.detail
    assert "n1's record" in v.detail and "its marks" in v.detail
    assert str(v).startswith("constraint-respected [n2]: task t4")


def test_an_execution_only_the_marks_show_is_judged_too() -> None:
    journals, marks, acked = clean()
    marks["t2"] = ["n4", "n5"]  # n5 is rack r3: a second run the journals do not show
    (v,) = inv.check_constraints(journals, LABELS, marks, acked).violations
    assert v.node == "n5" and "t2" in v.detail and "rack=r3" in v.detail
    assert v.detail.endswith("seen in its marks")


def test_a_record_that_lost_its_constraints_cannot_pass_by_having_none() -> None:
    journals, marks, acked = clean()
    stripped = spec("t1", ())
    journals["n3"] = journal("n3", [(stripped, "n2")])  # the guest's copy: none, ran on n2
    out = inv.check_constraints(journals, LABELS, marks, acked)
    details = sorted(v.detail for v in out.violations)
    assert {v.invariant for v in out.violations} == {inv.CONSTRAINT}
    assert any("submitted with constraints ['pool=a']" in d and "has []" in d for d in details)
    assert any(d.startswith("task t1 ['pool=a'] ran on n2") for d in details)


def test_a_node_the_scenario_does_not_know_is_a_violation() -> None:
    journals, marks, acked = clean()
    marks["t1"] = ["n3", "n9"]
    (v,) = inv.check_constraints(journals, LABELS, marks, acked).violations
    assert v.node == "n9" and "does not know" in v.detail


def test_a_run_without_any_constrained_execution_proves_nothing() -> None:
    journals = {"n1": journal("n1", [(spec("t3", ()), "n2")])}
    (v,) = inv.check_constraints(journals, LABELS, {"t3": ["n2"]}).violations
    assert v.invariant == inv.CONSTRAINT and "no execution" in v.detail


# ---------------------------------------------------------------- the plan


def test_the_labelled_scenario_is_last_and_its_plan_constrains_most_tasks() -> None:
    # appended after priority-preempt (only `elastic`, `home-loss` and issue 19's
    # restart, skew and loss scenarios came after it)
    names = [s.name for s in FULL]
    at = names.index("priority-preempt")
    assert names[at : at + 4] == ["priority-preempt", "constrained", "elastic", "home-loss"]
    assert [sc.name for sc in FULL if sc.labels] == ["constrained"]
    sc = find("constrained")
    plan = make_plan(sc, 1016)
    ordinary = [s for s in plan.submits if s.kind != "global"]
    constrained = [s for s in ordinary if s.constraints]
    assert len(constrained) > 0.7 * len(ordinary)
    assert all(not s.constraints for s in plan.submits if s.kind == "global")
    assert {s.constraints for s in constrained} <= set(CONSTRAINT_MENU)
    assert {f.kind for f in plan.faults} <= {"kill", "pause", "isolate", "split"}
    assert {f.lane for f in plan.faults} == {1, 2}
    for other in (o for o in FULL if o is not sc):
        assert all(not s.constraints for s in make_plan(other, 1000).submits), other.name


def test_every_constraint_set_fits_some_nodes_but_not_all() -> None:
    sc = find("constrained")
    labels = node_labels(sc)
    assert labels[1] == {"rack": "r2", "pool": "a"} and labels[6] == {"rack": "r1", "pool": "b"}
    for texts in CONSTRAINT_MENU:
        cs = parse_constraints(texts)
        fit = [i for i, kv in labels.items() if unmet(cs, kv) is None]
        assert 2 <= len(fit) < sc.nodes, (texts, fit)
    assert label_args(labels)[3] == ["--labels", "pool=a,rack=r1"]
    assert label_args({}) == {} and node_labels(FULL[0]) == {}
