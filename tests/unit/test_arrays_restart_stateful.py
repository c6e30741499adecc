"""A stateful test of arrays across agent restarts (issue 23: "a restarted home goes on
from its journaled progress without creating any twice", and "never more than K
running"), with a journal that loses what it had not written yet.

One NodeState homes arrays with caps (`0-N%K`) and runs their elements itself:
hypothesis, then long seeded walks, drive placements, starts, ends (some failing),
wakes at the same or a later time, cancels, and restarts of the agent from what it
journaled (node_harness.py `restart`: of the ops written since the last durable
write only a prefix lands; its processes outlive it under their supervisor, or die
with it: a host's reboot). After every step:

- never more than K elements of an array unfinished (created, not ended), by the
  records and by the journal;
- an element runs at most once, unless its process died with a reboot (then it
  runs again, as any task): no element created twice and run twice;

and once the walk ends (no more restarts), every array's record ends, with every
element counted once: succeeded only when each did, else failed with the worst
exit status (cancelled when cancelled).
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from swarm import model as m
from swarm.node import events as ev

from .node_harness import OneHome, long_walks

S = m.TaskState


class ArrayHome(OneHome, RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.init_home(slots=3)
        self.ids = itertools.count()
        self.arrays: dict[m.TaskId, tuple[int, int]] = {}  # id -> (elements, cap)
        self.codes: dict[m.TaskId, int] = {}  # element -> exit code of its last run
        self.starts: dict[m.TaskId, int] = {}  # element -> runs started
        self.reruns: dict[m.TaskId, int] = {}  # element -> runs a reboot killed
        self.cancelled: set[m.TaskId] = set()
        self.seen = dict.fromkeys(("restarts", "ops_lost", "reboots", "ended", "cancels"), 0)

    # ------------------------------------------------------------- rules

    @rule(n=st.integers(1, 12), cap=st.integers(1, 4))
    def submit(self, n: int, cap: int) -> None:
        tid = f"arr{next(self.ids)}"
        spec = self.node.submit(
            m.TaskSpec(id=tid, argv=("x", "{index}"), array=f"0-{n - 1}%{cap}"), self.wall()
        )
        self.arrays[spec.id] = (n, cap)
        self.node.run(self.ns.handle(ev.ArraySubmitted(self.now, self.wall(), "s", spec.id)))

    @rule(dt=st.sampled_from([0.0, 0.0, 0.5, 2.0]))
    def wake(self, dt: float) -> None:
        """Time passes (or not: two events at the same wall time), the node's timers."""
        self.now += dt
        self.node.run(self.ns.handle(ev.Wake(self.now, self.wall(), f"w{self.now}")))

    @rule()
    def place(self) -> None:
        self.place_here()

    @rule()
    def start(self) -> None:
        node = self.node
        if node.queue and node.queue[0] in self.ns.records.active:
            tid = node.queue[0]
            if node.try_start(tid, self.now, self.wall()) is None:
                self.starts[tid] = self.starts.get(tid, 0) + 1

    @rule(code=st.sampled_from([0, 0, 0, 3, 7]))
    def finish(self, code: int) -> None:
        if self.node.running:
            tid = sorted(self.node.running)[0]
            self.node.finish(tid, code, self.now, self.wall())
            self.codes[tid] = code
            self.seen["ended"] += 1

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        """`swarm cancel` of a whole array: nothing more is created, the unfinished
        elements are cancelled (the runtime cancels each: here, a queued one at once,
        a running one by its end)."""
        live = sorted(t for t in self.arrays if t in self.ns.arrays)
        if not live:
            return
        tid = data.draw(st.sampled_from(live))
        self.cancel_one(tid)

    def cancel_one(self, tid: m.TaskId) -> None:
        self.cancelled.add(tid)
        self.seen["cancels"] += 1
        ids, out = self.ns.array_cancel(tid, "cancelled", self.wall())
        self.node.run(out)
        for eid in ids:
            t = self.ns.records.active.get(eid)
            if t is not None and t.state is S.QUEUED:
                if eid in self.node.queue:
                    self.node.queue.remove(eid)
                self.ns.ledger.remove(eid)
                done = self.ns.records.apply(eid, S.CANCELLED, self.wall(), "cancelled")
                self.node.run([ev.Record(done)])
                self.node.run(self.ns.on_ended(done, self.now, self.wall()))

    @rule(data=st.data(), outlive=st.booleans())
    def restart(self, data: st.DataObject, outlive: bool) -> None:
        self.restart_one(data.draw(st.integers(0, len(self.node.unsynced))), outlive)

    def restart_one(self, keep: int, outlive: bool) -> None:
        lost, killed = self.restart_home(keep, outlive)
        self.seen["restarts"] += 1
        self.seen["ops_lost"] += lost
        for tid in killed:  # its process died with the agent
            self.reruns[tid] = self.reruns.get(tid, 0) + 1
            self.seen["reboots"] += 1

    # -------------------------------------------------------- invariants

    def _elements(self, records: Any, array: m.TaskId) -> list[m.Task]:
        return [t for t in records if t.spec.element is not None and t.spec.element.array == array]

    @invariant()
    def never_more_than_the_cap_unfinished(self) -> None:
        for tid, (_, cap) in self.arrays.items():
            live = self._elements(self.ns.records.active.values(), tid)
            assert len(live) <= cap, (tid, cap, sorted(t.id for t in live))
            landed = self.node.landed_tasks.values()
            journaled = [t for t in self._elements(landed, tid) if not t.state.terminal]
            assert len(journaled) <= cap, (tid, cap, sorted(t.id for t in journaled))

    @invariant()
    def an_element_runs_once_unless_a_reboot_killed_it(self) -> None:
        for eid, n in self.starts.items():
            assert n <= 1 + self.reruns.get(eid, 0), (eid, n, self.reruns.get(eid, 0))

    def teardown(self) -> None:
        """No more restarts: everything runs to its end, and each array's record
        ends with every element counted once."""
        for _ in range(400):
            if not any(t in self.ns.arrays for t in self.arrays):
                break
            self.wake(2.0)
            self.place()
            self.start()
            self.finish(0)
        self.node.sync()
        for tid, (n, _) in self.arrays.items():
            rec = self.record(tid)
            assert rec is not None and rec.state.terminal, (tid, rec and rec.state)
            known = {**self.node.landed_tasks, **self.ns.records.active, **self.ns.records.finished}
            els = self._elements(known.values(), tid)
            if tid in self.cancelled:
                assert rec.state in (S.CANCELLED, S.SUCCEEDED, S.FAILED), rec.state
                continue
            assert sorted(t.spec.element.index for t in els if t.spec.element) == list(range(n))
            worst = max((self.codes.get(t.id, 0) for t in els), default=0)
            want = S.SUCCEEDED if worst == 0 else S.FAILED
            assert (rec.state, rec.exit_code) == (want, worst), (tid, rec.state, rec.reason)
            counted = sum(int(x) for x in rec.reason.split() if x.isdigit())
            assert counted == n or rec.reason == f"all {n} elements succeeded", rec.reason


TestArrayHome = ArrayHome.TestCase
TestArrayHome.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)


def test_long_random_walks_keep_arrays_whole() -> None:
    """Long seeded walks (hypothesis favours short runs): 150 walks of 150 steps."""

    def checks(mch: ArrayHome) -> None:
        mch.never_more_than_the_cap_unfinished()
        mch.an_element_runs_once_unless_a_reboot_killed_it()

    seen = long_walks(ArrayHome, _step, 150, 150, checks)
    assert all(v >= 20 for v in seen.values()), seen


def _step(mch: ArrayHome, rng: random.Random) -> None:
    actions: list[Any] = [
        lambda: len(mch.arrays) < 4 and mch.submit(rng.randint(1, 12), rng.randint(1, 4)),
        lambda: mch.wake(rng.choice([0.0, 0.0, 0.5, 2.0])),
        mch.place,
        mch.start,
        mch.start,
        lambda: mch.finish(rng.choice([0, 0, 0, 3, 7])),
        lambda: mch.finish(0),
        lambda: rng.random() < 0.05 and _cancel_some(mch, rng),
        lambda: (
            rng.random() < 0.3
            and mch.restart_one(rng.randint(0, len(mch.node.unsynced)), rng.random() < 0.7)
        ),
    ]
    rng.choice(actions)()


def _cancel_some(mch: ArrayHome, rng: random.Random) -> None:
    live = sorted(t for t in mch.arrays if t in mch.ns.arrays)
    if live:
        mch.cancel_one(rng.choice(live))
