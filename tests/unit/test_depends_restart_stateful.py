"""A stateful test of dependencies across agent restarts (issue 23: "the home holds a
dependent task until its parents end ... Dependencies survive agent restarts").

One NodeState homes tasks, some submitted `--after ok|any|notok:` earlier ones, and
runs them itself: hypothesis, then long seeded walks, drive placements, starts, ends
(some failing), wakes, the runtime's reads of parents no longer in memory
(`deps_remote` -> `ParentsSeen`, as runtime/groupio.py's loop does from the journal)
and restarts from what the node journaled (node_harness.py `restart`: of the writes
since the last durable one only a prefix lands). After every step:

- a task with parents starts only once each has ended as its condition asks;

and once the walk ends (no more restarts), no task waits for ever: each one with
parents has run (its condition held) or failed saying it never can (it cannot).
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from swarm import model as m
from swarm.node import events as ev

from .node_harness import OneHome, long_walks

S = m.TaskState
CONDS = ("ok", "any", "notok")


class DepsHome(OneHome, RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.init_home(slots=3)
        self.ids = itertools.count()
        self.tasks: list[m.TaskId] = []
        self.after: dict[m.TaskId, tuple[str, tuple[m.TaskId, ...]]] = {}
        self.ran: set[m.TaskId] = set()
        self.seen = dict.fromkeys(("restarts", "ops_lost", "started_after", "never"), 0)

    # ------------------------------------------------------------- rules

    @rule(data=st.data())
    def submit(self, data: st.DataObject) -> None:
        tid = f"t{next(self.ids)}"
        parents: tuple[m.TaskId, ...] = ()
        cond = "ok"
        if self.tasks and data.draw(st.booleans()):
            k = data.draw(st.integers(1, min(3, len(self.tasks))))
            parents = tuple(data.draw(st.permutations(self.tasks))[:k])
            cond = data.draw(st.sampled_from(CONDS))
        self.submit_one(tid, cond, parents)

    def submit_one(self, tid: m.TaskId, cond: str, parents: tuple[m.TaskId, ...]) -> None:
        after = (f"{cond}:{','.join(parents)}",) if parents else ()
        spec = self.node.submit(m.TaskSpec(id=tid, argv=("x",), after=after), self.wall())
        self.tasks.append(tid)
        if parents:
            self.after[tid] = (cond, parents)
            self.node.run(self.ns.handle(ev.DepsSubmitted(self.now, self.wall(), tid, spec.id)))
        else:
            self.node.placements.append(tid)

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0]))
    def wake(self, dt: float) -> None:
        self.now += dt
        self.node.run(self.ns.handle(ev.Wake(self.now, self.wall(), f"w{self.now}")))

    @rule()
    def read_parents(self) -> None:
        """The runtime's look (every second) at parents not in memory."""
        ids = self.ns.deps_remote() if self.ns.deps else []
        states = {}
        for pid in ids:
            t = self.record(pid)
            if t is not None:
                states[pid] = t.state.value
        if states:
            seen = ev.ParentsSeen(self.now, self.wall(), f"r{self.now}", states)
            self.node.run(self.ns.handle(seen))

    @rule()
    def place(self) -> None:
        self.place_here()

    @rule()
    def start(self) -> None:
        node = self.node
        if not node.queue or node.queue[0] not in self.ns.records.active:
            return
        tid = node.queue[0]
        if tid in self.after:
            cond, parents = self.after[tid]
            ends = {p: self.record(p) for p in parents}
            assert all(t is not None and t.state.terminal for t in ends.values()), (tid, ends)
            ok = [t.state is S.SUCCEEDED for t in ends.values() if t is not None]
            held = {"ok": all(ok), "any": True, "notok": not any(ok)}[cond]
            assert held, (tid, cond, {p: t.state.value for p, t in ends.items() if t})
        if node.try_start(tid, self.now, self.wall()) is None:
            self.ran.add(tid)
            self.seen["started_after"] += tid in self.after

    @rule(code=st.sampled_from([0, 0, 1]))
    def finish(self, code: int) -> None:
        if self.node.running:
            self.node.finish(sorted(self.node.running)[0], code, self.now, self.wall())

    @rule(data=st.data(), outlive=st.booleans())
    def restart(self, data: st.DataObject, outlive: bool) -> None:
        self.restart_one(data.draw(st.integers(0, len(self.node.unsynced))), outlive)

    def restart_one(self, keep: int, outlive: bool) -> None:
        lost, _ = self.restart_home(keep, outlive)
        self.seen["restarts"] += 1
        self.seen["ops_lost"] += lost

    def teardown(self) -> None:
        """No more restarts: everything that can run runs; nothing waits for ever."""
        for _ in range(300):
            self.wake(1.0)
            self.read_parents()
            self.place()
            self.start()
            self.finish(0)
        for tid, (cond, parents) in self.after.items():
            t = self.record(tid)
            assert t is not None and t.state.terminal, (tid, cond, parents, t and t.state)
            if tid not in self.ran:
                assert "never satisfied" in t.reason, (tid, t.state, t.reason)
                self.seen["never"] += 1


TestDepsHome = DepsHome.TestCase
TestDepsHome.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)


def test_long_random_walks_keep_dependencies() -> None:
    """Long seeded walks (hypothesis favours short runs): 150 walks of 150 steps."""
    seen = long_walks(DepsHome, _step, 150, 150)
    assert all(v >= 20 for v in seen.values()), seen


def _step(mch: DepsHome, rng: random.Random) -> None:
    def submit() -> None:
        tid = f"t{next(mch.ids)}"
        if mch.tasks and rng.random() < 0.6:
            parents = tuple(rng.sample(mch.tasks, rng.randint(1, min(3, len(mch.tasks)))))
            mch.submit_one(tid, rng.choice(CONDS), parents)
        else:
            mch.submit_one(tid, "ok", ())

    actions: list[Any] = [
        lambda: len(mch.tasks) < 25 and submit(),
        lambda: mch.wake(rng.choice([0.0, 0.5, 1.0])),
        mch.read_parents,
        mch.place,
        mch.start,
        lambda: mch.finish(rng.choice([0, 0, 1])),
        lambda: (
            rng.random() < 0.3
            and mch.restart_one(rng.randint(0, len(mch.node.unsynced)), rng.random() < 0.7)
        ),
    ]
    rng.choice(actions)()
