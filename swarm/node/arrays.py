"""Task arrays in the node (issue 23, pure): one record, elements created lazily.

`swarm submit --array 0-9999%50 -- cmd` journals one *array record* at its home
(`spec.array` set, the canonical `--array` text). It never runs itself: the home
creates its elements as ordinary tasks of its own, a window at a time, and places
each one as it places any task. An element is `ID_INDEX` (`spec.element` names its
array and index), with `SWARM_ARRAY_ID`/`SWARM_ARRAY_INDEX` in its environment and
`{index}` replaced in its argv (policy/arrays.py).

- **The cap.** With `%K`, at most K elements are unfinished at once (created, not
  yet ended): the home creates the next one only when one ends. So never more than K
  run cluster-wide. Without a cap, the home keeps `WINDOW` elements unfinished, so
  that a million-element array is not a million records at once, yet enough are
  placed ahead (queued at the nodes) that the fleet never waits for the home.
  Elements are made CHUNK at a time, the next chunk on the next turn of the driver's
  loop, so a burst of placements never holds the loop (gossip, the API) for long.
- **The record** goes RUNNING with its first elements, and ends when every element
  has ended: SUCCEEDED if all did, CANCELLED after `swarm cancel ID`, FAILED
  otherwise, with the worst (highest) exit code of its elements.
- **Durability.** The elements' records are journaled as they are created, and the
  array's progress (`array:<id>`: the next element, counts, the worst exit) after
  them, so a restarted home goes on from where it was, never creating an element
  twice: an element found among the records past the journaled `next` moves it on.
  Each element also has a mark (`aelem:<id>`) from its creation until the progress
  that counts its end: put and deleted in the progress's own write, so a mark says
  exactly "its end is not in the journaled counts". A restart counts the ended
  elements that still have one (the journal reads their records back, as it reads
  those owed to a home or to copies). Before stop 52 it counted those that ended
  after the progress's wall time, among the records in memory: an element that ended
  just before a crash, its count not yet journaled, was never counted (its record is
  not read back), and the array could end `succeeded` with a failed element
  (found by tests/unit/test_arrays_restart_stateful.py).
- An element's end reaches its array at once: when it ends here, and when its
  runner's report of the end reaches the home (node/location.py). A look at the
  unfinished ones every `TICK` seconds while an array is active (at most K or WINDOW
  records each time) catches the other ways an element ends (cancelled while queued
  here, lost with its node); at 10,000 unfinished elements a look every 0.25 s took
  ~7 % of the home's loop during a burst (issue 23), so it is rare now.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from .. import model as m
from ..policy import arrays as ap
from . import events as ev

S = m.TaskState
ARRAY = "array:"  # journal key: array:<id> -> progress (ArrayState.record)
MARK = "aelem:"  # journal key: aelem:<element id> -> array id, while its end is uncounted
WINDOW = 10_000  # unfinished elements of an array without a cap
CHUNK = 256  # elements created (and placed) per turn: the event loop breathes between
TICK = 2.0  # seconds between looks at an active array's unfinished elements


def element_id(array: m.TaskId, index: int) -> m.TaskId:
    """`job_7~alice` for index 7 of array `job~alice`."""
    base, sep, owner = array.partition("~")
    return f"{base}_{index}{sep}{owner}"


@attrs.define
class ArrayState:
    """One array homed here: how far its elements have come."""

    spec: ap.ArraySpec
    next: int = 0  # the next element to create (by rank: spec.nth)
    live: set[m.TaskId] = attrs.field(factory=set)  # created, not ended
    done: dict[str, int] = attrs.field(factory=dict)  # final state -> elements
    worst: int = 0  # the highest exit status of an element that did not succeed
    cancelled: str = ""  # why, once `swarm cancel ID` came: nothing more is created
    counted: bool = False  # ends counted since the progress was last journaled
    unmarked: set[m.TaskId] = attrs.field(factory=set)  # live, their mark not journaled
    unmark: set[m.TaskId] = attrs.field(factory=set)  # counted, their mark still there

    def record(self, wall: float) -> dict[str, Any]:
        return {
            "next": self.next,
            "done": dict(self.done),
            "worst": self.worst,
            "cancelled": self.cancelled,
            "at": wall,
            "marks": True,  # the elements' marks say which ends are counted (not `at`)
        }

    def progress(self, tid: m.TaskId, wall: float) -> ev.Persist:
        """The progress, with the marks of the elements made and counted since the
        last one, in one write (so a mark is there exactly while its end is not in
        `done`)."""
        ops: list[ev.Put | ev.Delete] = [ev.Put(ARRAY + tid, self.record(wall))]
        ops += [ev.Put(MARK + e, tid) for e in sorted(self.unmarked)]
        ops += [ev.Delete(MARK + e) for e in sorted(self.unmark)]
        self.unmarked.clear()
        self.unmark.clear()
        return ev.Persist(tuple(ops))

    @property
    def limit(self) -> int:
        return self.spec.cap or WINDOW

    def room(self) -> bool:
        """May another element be created now?"""
        return not self.cancelled and self.next < len(self.spec) and len(self.live) < self.limit

    def finished(self) -> bool:
        return not self.live and (self.next >= len(self.spec) or bool(self.cancelled))


class Arrays:
    """The array rules of NodeState (state.py), which holds the fields below."""

    node: m.NodeId
    records: Any
    due: dict[str, float]
    arrays: dict[m.TaskId, ArrayState]
    array_progress: dict[m.TaskId, dict[str, Any]]  # journaled, read at start-up
    array_marks: set[m.TaskId]  # elements whose end the journaled progress has not counted

    def init_arrays(self) -> None:
        self.arrays = {}
        self.array_progress = {}
        self.array_marks = set()

    # ------------------------------------------------------------------ reads

    def array_counts(self, tid: m.TaskId) -> dict[str, int] | None:
        """Elements by state (`swarm ps`, `swarm status`): ended ones by final state,
        unfinished ones by their current state, not yet created as `pending`."""
        a = self.arrays.get(tid)
        if a is None:
            return None
        out = dict(a.done)
        for eid in a.live:
            t = self.records.get_cached(eid)
            if t is not None:
                out[t.state.value] = out.get(t.state.value, 0) + 1
        left = 0 if a.cancelled else len(a.spec) - a.next
        if left:
            out["pending"] = left
        return out

    def array_explain(self, tid: m.TaskId) -> str | None:
        """Where an array homed here stands (`swarm explain`)."""
        a = self.arrays.get(tid)
        if a is None:
            return None
        counts = self.array_counts(tid) or {}
        by_state = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        cap = f"at most {a.spec.cap} at once" if a.spec.cap else f"a window of {WINDOW}"
        text = f"array of {len(a.spec)} elements ({cap}): {by_state}"
        if a.cancelled:
            text += f"; cancelled ({a.cancelled}): no more are created"
        elif not a.room() and a.next < len(a.spec):
            text += f"; the next is created when one of the {len(a.live)} unfinished ends"
        return text

    # ------------------------------------------------------------------ stimuli

    def array_submitted(self, tid: m.TaskId, now: float, wall: float) -> list[ev.Instruction]:
        """An array's record was written here (or found at start-up): its elements come."""
        t = self.records.active.get(tid)
        if t is None or not t.spec.array or tid in self.arrays:
            return []
        a = ArrayState(ap.parse_array(t.spec.array, max_elements=ap.MAX_INDEX + 1))
        saved = self.array_progress.pop(tid, None)
        if saved:
            a.next = int(saved.get("next", 0))
            a.done = {str(k): int(v) for k, v in dict(saved.get("done", {})).items()}
            a.worst = int(saved.get("worst", 0))
            a.cancelled = str(saved.get("cancelled", ""))
        at = float(saved.get("at", 0.0)) if saved else 0.0
        by_marks = bool(saved.get("marks")) if saved else True
        for e in self._elements_of(tid):  # created before a restart
            assert e.spec.element is not None
            a.next = max(a.next, self._rank_after(a.spec, e.spec.element.index))
            marked = e.id in self.array_marks
            self.array_marks.discard(e.id)
            if not e.state.terminal:
                a.live.add(e.id)
                if not marked:
                    a.unmarked.add(e.id)  # its mark was lost with the progress
            elif marked if by_marks else (e.finished_at or 0.0) > at:
                # its end is not in the journaled counts (a journal from before the
                # marks: it ended after the progress was journaled)
                self._count(a, e)
                a.unmark.add(e.id)
        if a.unmarked or a.unmark:
            # journal the progress and the marks at once, not at the next end: a crash
            # before then re-created an element that had run (it was found live here,
            # its mark and progress lost; then it ended, and its record is not read
            # back: the stateful test's walks)
            a.counted = True
        self.arrays[tid] = a
        return self._fill(tid, a, now, wall)

    def array_tick(self, now: float, wall: float) -> list[ev.Instruction]:
        self.due.pop("arrays", None)
        out: list[ev.Instruction] = []
        for tid, a in list(self.arrays.items()):
            ended = [
                t
                for eid in a.live
                if (t := self.records.get_cached(eid)) is not None and t.state.terminal
            ]
            if ended:
                out += self._ended(tid, a, ended, now, wall)
        if self.arrays and "arrays" not in self.due:
            self.due["arrays"] = now + TICK
            out.append(ev.WakeAt(now + TICK))
        return out

    def array_fill(self, now: float, wall: float) -> list[ev.Instruction]:
        """The next chunk of each array with room (no look at the unfinished ones)."""
        self.due.pop("array_fill", None)
        out: list[ev.Instruction] = []
        for tid, a in list(self.arrays.items()):
            if a.room() or a.counted:
                out += self._fill(tid, a, now, wall)
        return out

    def array_element_ended(self, task: m.Task, now: float, wall: float) -> list[ev.Instruction]:
        """An element ended (here, or its runner's report of the end came): the next
        one comes at once, not at the next look."""
        role = task.spec.element
        if role is None or not task.state.terminal:
            return []
        a = self.arrays.get(role.array)
        if a is None or task.id not in a.live:
            return []
        return self._ended(role.array, a, [task], now, wall)

    def array_cancel(
        self, tid: m.TaskId, why: str, wall: float
    ) -> tuple[list[m.TaskId], list[ev.Instruction]]:
        """`swarm cancel ID`: nothing more is created; the unfinished elements to cancel
        (the runtime cancels each as any task); the record ends once they have."""
        a = self.arrays.get(tid)
        if a is None:
            return [], []
        a.cancelled = a.cancelled or why
        out: list[ev.Instruction] = [a.progress(tid, wall)]
        if a.finished():
            out += self._end(tid, a, wall)
        return sorted(a.live), out

    # ------------------------------------------------------------------ helpers

    def _elements_of(self, tid: m.TaskId) -> list[m.Task]:
        found = list(self.records.active.values()) + list(self.records.finished.values())
        return [
            t
            for t in found
            if t.spec.element is not None and t.spec.element.array == tid and not t.spec.backup_of
        ]

    @staticmethod
    def _rank_after(spec: ap.ArraySpec, index: int) -> int:
        """The rank of the element after `index` (binary search over ranks)."""
        lo, hi = 0, len(spec)
        while lo < hi:
            mid = (lo + hi) // 2
            if spec.nth(mid) <= index:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _ended(
        self, tid: m.TaskId, a: ArrayState, ended: Iterable[m.Task], now: float, wall: float
    ) -> list[ev.Instruction]:
        """Count the ends; the next elements come (and the progress is journaled) at
        the loop's next turn, one CHUNK per turn: filling at each end made a batch of
        reports create thousands of elements in one step (issue 23: the placed rate
        halved)."""
        for t in ended:
            a.live.discard(t.id)
            self._count(a, t)
            if t.id in a.unmarked:
                a.unmarked.discard(t.id)  # its mark was never written
            else:
                a.unmark.add(t.id)
        a.counted = True
        if a.finished():
            return self._fill(tid, a, now, wall)
        if "array_fill" in self.due:
            return []
        self.due["array_fill"] = now
        return [ev.WakeAt(now)]

    @staticmethod
    def _count(a: ArrayState, t: m.Task) -> None:
        a.done[t.state.value] = a.done.get(t.state.value, 0) + 1
        if t.state is not S.SUCCEEDED:
            known = t.exit_code is not None or t.signal is not None
            a.worst = max(a.worst, (m.exit_status(t.exit_code, t.signal) if known else 1) or 1)

    def _fill(self, tid: m.TaskId, a: ArrayState, now: float, wall: float) -> list[ev.Instruction]:
        """Create elements up to the cap (or the window); journal the progress after
        them; end the record when every element has ended."""
        rec = self.records.active.get(tid)
        if rec is None:
            return []
        out: list[ev.Instruction] = []
        made: list[m.TaskId] = []
        while a.room() and len(made) < CHUNK:
            index = a.spec.nth(a.next)
            a.next += 1
            eid = element_id(tid, index)
            if self.records.get_cached(eid) is not None:
                continue  # made before a restart whose progress was not journaled
            spec = attrs.evolve(
                rec.spec,
                id=eid,
                argv=ap.element_argv(rec.spec.argv, index),
                env={**rec.spec.env, **ap.element_env(tid, index)},
                array="",
                element=m.ArrayRole(tid, index),
                after=(),  # the array waited for its parents already
                submitted_at=wall,
            )
            task = m.new_task(spec, wall, self.node, f"element {index} of array {tid}")
            self.records.store(task)
            a.live.add(eid)
            a.unmarked.add(eid)
            made.append(eid)
            out.append(ev.Record(task))
        if made:
            out.append(ev.PlaceMany(tuple(made)))
        if made or a.counted:
            a.counted = False
            out.append(a.progress(tid, wall))
        if made and rec.state is S.QUEUED:
            new = self.records.apply(tid, S.RUNNING, wall, "elements placed", node=self.node)
            out.insert(0, ev.Record(new))
        if a.finished():
            out += self._end(tid, a, wall)
        else:
            if a.room():  # the next chunk on the loop's next turn
                self.due["array_fill"] = now
                out.append(ev.WakeAt(now))
            if "arrays" not in self.due:
                self.due["arrays"] = now + TICK
                out.append(ev.WakeAt(now + TICK))
        return out

    def _end(self, tid: m.TaskId, a: ArrayState, wall: float) -> list[ev.Instruction]:
        del self.arrays[tid]
        t = self.records.active.get(tid)
        marks = [ev.Delete(MARK + e) for e in sorted(a.unmark)]
        out: list[ev.Instruction] = [ev.Persist((ev.Delete(ARRAY + tid), *marks))]
        if t is None:
            return out
        total = sum(a.done.values())
        counts = ", ".join(f"{n} {s}" for s, n in sorted(a.done.items()))
        if a.cancelled:
            dst, why = S.CANCELLED, f"{a.cancelled} ({counts})"
        elif a.done.get(S.SUCCEEDED.value, 0) == total:
            dst, why = S.SUCCEEDED, f"all {total} elements succeeded"
        else:
            dst, why = S.FAILED, f"elements: {counts}"
        code = 0 if dst is S.SUCCEEDED else a.worst
        if t.state is S.QUEUED and dst is not S.CANCELLED:
            t = self.records.apply(tid, S.RUNNING, wall, "elements placed", node=self.node)
            out.append(ev.Record(t))
        new = self.records.apply(tid, dst, wall, why, exit_code=code)
        return [*out, ev.Record(new, durable=True)]


def restore_array_marks(kv: dict[str, Any]) -> set[m.TaskId]:
    """The elements whose end the journaled progress has not counted (keys aelem:)."""
    return {k[len(MARK) :] for k in kv if k.startswith(MARK)}


def restore_array_progress(kv: dict[str, Any]) -> dict[m.TaskId, dict[str, Any]]:
    """Each array's journaled progress (keys array:<id>)."""
    return {
        k[len(ARRAY) :]: v for k, v in kv.items() if k.startswith(ARRAY) and isinstance(v, dict)
    }
