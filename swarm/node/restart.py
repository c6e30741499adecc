"""What a restarted node's state is rebuilt from, and what becomes of each task (pure).

The agent's start (runtime/recovery.py `recover`, runtime/driver.py `restore`) reads
its journal and hands the two rules here the keys and the records; the stateful tests
(tests/unit/test_*_stateful.py, through node_harness.py's `restart`) restart a
NodeState the same way, from what its instructions journaled, so the restart rules the
agent follows are the ones the tests drive.

- `restore_journal`: the node's parts from the journal's keys (handoff sides,
  tombstones, GPU slices, global tasks, adoptions, copies, gang rounds, array
  progress, fair-share usage), and the last `alive_at` heartbeat (doubt.py).
- `restart_plan`: each active record's fate. A guest record with no guest entry left
  moved on while the node was down (forgotten); a task running here that outlived the
  agent under its supervisor is watched again, never run twice; one that did not runs
  again (queued), but a `--no-retry` one at its home fails; a queued guest or global
  task goes back into the run queue. An array's record is left as it is (it runs no
  process; before stop 52 a RUNNING one was re-queued, and a `--no-retry` one failed,
  while its elements went on).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from .. import model as m
from . import events as ev
from . import recovery
from .arrays import restore_array_marks, restore_array_progress
from .doubt import alive_at_of
from .failover import restore_adopted
from .gangs import restore_gang_rounds
from .recovery import USAGE_KEY
from .replicas import restore_replicas

if TYPE_CHECKING:
    from .state import NodeState

S = m.TaskState


def restore_journal(
    state: NodeState, kv: Mapping[str, Any], wall: float
) -> tuple[float | None, list[ev.Instruction]]:
    """Restore `state`'s parts from the journal's keys (its records already loaded):
    the last `alive_at` heartbeat, and what to write or log."""
    kv = dict(kv)
    globals_, out = recovery.restore(kv, wall, state.handoffs, state.records.active, state.gpus)
    if globals_ is not None:
        state.globals = globals_
    state.adopted = restore_adopted(kv)
    copies = restore_replicas(kv)
    state.mine, state.held, state.strays = copies.mine, copies.held, copies.strays
    state.gang_rounds, state.gang_starts = restore_gang_rounds(kv)
    state.array_progress = restore_array_progress(kv)
    state.array_marks = restore_array_marks(kv)
    usage = kv.get(USAGE_KEY)
    if usage is not None:
        try:
            state.restore_usage(usage)
        except (TypeError, ValueError) as e:
            out.append(ev.log("error", "usage.bad_record", error=str(e)))
    return alive_at_of(kv), out


@attrs.frozen
class RestartPlan:
    """Each active record's fate at a restart (`restart_plan`), in journal order."""

    forget: tuple[m.TaskId, ...]  # guest records whose task moved on while down
    watch: tuple[m.TaskId, ...]  # running here, outlived the agent: watched again
    fail: tuple[m.TaskId, ...]  # was running, --no-retry, its home is here: fails
    requeue: tuple[m.TaskId, ...]  # was running (or migrating): queued here again
    enqueue: tuple[m.TaskId, ...]  # queued guest or global tasks: the run queue


def restart_plan(
    node: m.NodeId,
    active: Iterable[m.Task],
    guest_entries: Collection[m.TaskId],
    outlived: Collection[m.TaskId],
) -> RestartPlan:
    """`active`: the journal's active records; `guest_entries`: the guest handoff
    entries restored; `outlived`: tasks whose process outlived the agent (still
    running under its supervisor, or its end known)."""
    forget: list[m.TaskId] = []
    watch: list[m.TaskId] = []
    fail: list[m.TaskId] = []
    requeue: list[m.TaskId] = []
    enqueue: list[m.TaskId] = []
    for t in active:
        guest = t.spec.home != node and not t.spec.is_global
        if guest and t.id not in guest_entries:
            forget.append(t.id)
            continue
        if t.node != node:
            continue  # a home record of a task that lives elsewhere
        if t.spec.array:
            continue  # an array's record runs no process: its elements go on (arrays.py)
        if t.state is S.RUNNING and t.id in outlived:
            watch.append(t.id)
            continue
        state = t.state
        if state in (S.RUNNING, S.MIGRATING):
            if t.spec.no_retry and not guest:
                fail.append(t.id)
                continue
            requeue.append(t.id)
            state = S.QUEUED
        if state is S.QUEUED and (guest or t.spec.is_global):
            enqueue.append(t.id)
    return RestartPlan(tuple(forget), tuple(watch), tuple(fail), tuple(requeue), tuple(enqueue))
