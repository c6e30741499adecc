"""node/restart.py's `restart_plan`: each active record's fate when the agent starts
again (the rules runtime/recovery.py carries out, and the stateful copies test's
restarts follow)."""

from __future__ import annotations

import attrs

from swarm import model as m
from swarm.node.restart import restart_plan

S = m.TaskState
ME = "a"


def task(tid: str, state: S, *, home: str = ME, node: str = ME, **spec: object) -> m.Task:
    t = m.new_task(m.TaskSpec(id=tid, argv=("x",), home=home, **spec), 0.0, node)  # type: ignore[arg-type]
    return attrs.evolve(t, state=state, node=node)


def test_each_record_gets_its_fate() -> None:
    active = [
        task("gone", S.QUEUED, home="b"),  # a guest whose entry is gone: it moved on
        task("guest-q", S.QUEUED, home="b"),  # a queued guest: back into the run queue
        task("guest-run", S.RUNNING, home="b", no_retry=True),  # its home decides: runs again
        task("mine-run", S.RUNNING),  # ours, its process died with the agent: runs again
        task("mine-once", S.RUNNING, no_retry=True),  # ... but --no-retry: fails
        task("outlived", S.RUNNING),  # its process outlived the agent: watched again
        task("moving", S.MIGRATING),  # a migration cut short: queued again
        task("mine-q", S.QUEUED),  # ours, queued: placement's (driver.run), not the queue's
        task("away", S.RUNNING, node="c"),  # ours, running elsewhere: nothing here
        task("global", S.QUEUED, is_global=True),  # a global task's copy: the run queue
    ]
    plan = restart_plan(ME, active, {"guest-q", "guest-run"}, {"outlived", "away"})
    assert plan.forget == ("gone",)
    assert plan.watch == ("outlived",)
    assert plan.fail == ("mine-once",)
    assert plan.requeue == ("guest-run", "mine-run", "moving")
    assert plan.enqueue == ("guest-q", "guest-run", "global")


def test_an_outlived_process_of_a_record_not_running_is_not_watched() -> None:
    """Its record says queued (the RUNNING write was lost): nobody would watch the
    process, so the runtime kills it, and the task runs again from the queue."""
    plan = restart_plan(ME, [task("g", S.QUEUED, home="b")], {"g"}, {"g"})
    assert plan.watch == () and plan.enqueue == ("g",)


def test_an_array_record_is_left_as_it_is() -> None:
    """It runs no process (its elements go on from its progress, arrays.py): before
    stop 52 a RUNNING one was re-queued, and a --no-retry one failed."""
    active = [
        task("arr", S.RUNNING, array="0-9%2"),
        task("once", S.RUNNING, array="0-3", no_retry=True),
    ]
    plan = restart_plan(ME, active, set(), set())
    assert plan == restart_plan(ME, [], set(), set())
