"""Dependencies in the node (issue 23, pure): a task submitted `--after COND:ID` waits
at its home until its parents have ended as the condition asks.

The submit check (runtime) resolves every parent to a task id that exists and that the
submitter may see: a task, a whole array (its record ends when all its elements have),
or one element `ID[INDEX]` (its id, `ID_INDEX`, created lazily: it may not exist yet).
The spec keeps the clauses in that resolved form, so the rule below reads ids only.

- A waiting task is QUEUED at its home and not placed. Every `TICK` seconds the home
  judges it (policy/depends.judge): a parent's final state comes from its record when
  the parent is homed here, and from the runtime's answers (`parents_seen`) for
  parents homed elsewhere (the runtime asks for those in `deps_remote`).
- READY: the task is placed as any other (an array creates its elements, a gang starts
  its rounds). NEVER (`--after ok:P` and P failed): it fails with that reason.
- Nothing is journaled beyond the task's own record: a restarted home finds the task
  QUEUED with its clauses and judges it again (the parents' states are journaled
  where they are).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import model as m
from ..policy import depends as dp
from . import events as ev

S = m.TaskState
TICK = 0.5
KEEP_SEEN = 4096  # remote parents' final states remembered


class Depends:
    """The dependency rules of NodeState (state.py), which holds the fields below."""

    node: m.NodeId
    records: Any
    due: dict[str, float]
    deps: dict[m.TaskId, tuple[dp.After, ...]]  # waiting tasks homed here
    deps_seen: dict[m.TaskId, str]  # remote parents that ended -> their final state
    deps_why: dict[m.TaskId, str]  # why each waits (explain)

    if TYPE_CHECKING:  # provided by the other parts of NodeState

        def array_submitted(
            self, tid: m.TaskId, now: float, wall: float
        ) -> list[ev.Instruction]: ...
        def gang_submitted(
            self, tid: m.TaskId, now: float, wall: float
        ) -> list[ev.Instruction]: ...

    def init_depends(self) -> None:
        self.deps = {}
        self.deps_seen = {}
        self.deps_why = {}

    def deps_remote(self) -> list[m.TaskId]:
        """Parents of waiting tasks that are not homed here and not known to have ended
        (the runtime asks the cluster for their records)."""
        out: set[m.TaskId] = set()
        for after in self.deps.values():
            for p in dp.parents_of(after):
                if p.task_id not in self.deps_seen and self._local_final(p.task_id) is None:
                    t = self.records.get_cached(p.task_id)
                    if t is None or t.spec.home not in ("", self.node):
                        out.add(p.task_id)
        return sorted(out)

    def deps_submitted(self, tid: m.TaskId, now: float, wall: float) -> list[ev.Instruction]:
        t = self.records.active.get(tid)
        if t is None or not t.spec.after or tid in self.deps:
            return []
        try:
            self.deps[tid] = dp.parse_after(t.spec.after)
        except dp.DependencyError as e:  # checked at submit: a record from elsewhere
            new = self.records.apply(tid, S.FAILED, wall, f"cannot wait: {e}")
            return [ev.Record(new, durable=True)]
        return self._judge(tid, now, wall)

    def parents_seen(
        self, states: dict[m.TaskId, str], now: float, wall: float
    ) -> list[ev.Instruction]:
        """Final states of remote parents, from the runtime's reads."""
        for pid, state in states.items():
            if state in dp.FINAL:
                self.deps_seen[pid] = state
        while len(self.deps_seen) > KEEP_SEEN:
            self.deps_seen.pop(next(iter(self.deps_seen)))
        return self.deps_tick(now, wall)

    def deps_tick(self, now: float, wall: float) -> list[ev.Instruction]:
        self.due.pop("deps", None)
        out: list[ev.Instruction] = []
        for tid in list(self.deps):
            out += self._judge(tid, now, wall)
        return out

    # ------------------------------------------------------------------ helpers

    def _local_final(self, pid: m.TaskId) -> str | None:
        t = self.records.get_cached(pid)
        if t is None or not t.state.terminal:
            return None
        return str(t.state.value)

    def _final_of(self, p: dp.Parent) -> str | None:
        return self._local_final(p.task_id) or self.deps_seen.get(p.task_id)

    def _judge(self, tid: m.TaskId, now: float, wall: float) -> list[ev.Instruction]:
        t = self.records.active.get(tid)
        after = self.deps.get(tid)
        if t is None or after is None or t.state is not S.QUEUED:
            self.deps.pop(tid, None)
            self.deps_why.pop(tid, None)
            return []
        verdict, why = dp.judge(after, self._final_of)
        if verdict is dp.Verdict.WAIT:
            self.deps_why[tid] = why
            if "deps" not in self.due:
                self.due["deps"] = now + TICK
                return [ev.WakeAt(now + TICK)]
            return []
        del self.deps[tid]
        self.deps_why.pop(tid, None)
        if verdict is dp.Verdict.NEVER:
            new = self.records.apply(tid, S.FAILED, wall, f"dependency never satisfied: {why}")
            return [ev.Record(new, durable=True)]
        note = ev.log("info", "task.dependencies_met", task=tid)
        if t.spec.array:
            return [note, *self.array_submitted(tid, now, wall)]
        if t.spec.gang is not None:
            return [note, *self.gang_submitted(tid, now, wall)]
        return [note, ev.Place(tid)]
