"""A stateful hypothesis test of NodeState over three nodes and a fake network.

Hypothesis drives submissions, offers, deliveries (some lost), retry ticks, starts,
ends, drains, agent restarts (from the journal, through node/restart.py's rules; a
prefix of what was written since the last durable write lands: node_harness.py) and
the permanent loss of a node, in any order. After every step the global invariants
hold:
- each task is queued or running in at most one place (among live nodes);
- each task's home journals at most one final result for it;
- no share ledger is overbooked by a start, and a drained node starts nothing;
- no GPU's core or memory is given out twice;
- no task is stranded: a task queued at its home is in its run queue, or waits for
  a placement, or for the outcome of an offer, or for a restart's doubt to end.

The restarts found a stranded task at stop 52 (node/doubt.py `_ours_queued`: a
doubted task whose runner died during the doubt, with no copies, was never placed).
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import hypothesis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from swarm import model as m
from swarm.cluster import handoff as h
from swarm.node import events as ev
from swarm.policy import gpu as gpupol

from .node_harness import FakeNet, FakeNode

S = m.TaskState
NAMES = ("A", "B", "C")
GPU = gpupol.GpuDevice(index=0, uuid="GPU-0", minor=0, memory_bytes=8 << 30)


class ThreeNodes(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.nodes = {n: FakeNode(n, shares=1024, gpu_devices=(GPU,)) for n in NAMES}
        for node in self.nodes.values():
            node.retry_failed_offers = True
        self.net = FakeNet(*self.nodes.values())
        self.now = 0.0
        self.ids = itertools.count()
        self.killed = False
        self.ended = {True: 0, False: 0}  # tasks ended away from / at their home
        self.restarts = 0
        self.caps: dict[m.TaskId, tuple[str, int]] = {}  # arrays: home, cap

    def _live(self) -> list[FakeNode]:
        return [n for n in self.nodes.values() if n.name not in self.net.dead]

    # ------------------------------------------------------------- rules

    @initialize(homes=st.lists(st.sampled_from(NAMES), min_size=2, max_size=6))
    def some_work(self, homes: list[str]) -> None:
        for home in homes:
            self.submit(home, 0, False, False)

    @rule(
        home=st.sampled_from(NAMES),
        reserve=st.sampled_from([0, 0, 300, 700]),
        gpu=st.booleans(),
        no_retry=st.booleans(),
    )
    def submit(self, home: str, reserve: int, gpu: bool, no_retry: bool) -> None:
        node = self.nodes[home]
        if home in self.net.dead:
            return
        spec = m.TaskSpec(
            id=f"t{next(self.ids)}",
            argv=("true",),
            reserve_shares=reserve,
            no_retry=no_retry,
            gpu=m.GpuRequest(core=50, memory_ratio=50) if gpu else None,
        )
        node.submit(spec, wall=self.now)
        node.placements.append(spec.id)

    @rule(home=st.sampled_from(NAMES), n=st.integers(1, 6), cap=st.integers(1, 3))
    def submit_array(self, home: str, n: int, cap: int) -> None:
        """An array (issue 23): its home creates the elements up to the cap and places
        each as any task, here or at a peer (whose report ends it at the home)."""
        node = self.nodes[home]
        if home in self.net.dead:
            return
        tid = f"a{next(self.ids)}"
        spec = m.TaskSpec(id=tid, argv=("true",), array=f"0-{n - 1}%{cap}")
        node.submit(spec, wall=self.now)
        self.caps[tid] = (home, cap)
        node.run(node.state.handle(ev.ArraySubmitted(self.now, self.now, f"s{tid}", tid)))

    @rule(data=st.data())
    def place(self, data: st.DataObject) -> None:
        """A node's placement decides for one task it must place: here, or offer."""
        live = [n for n in self._live() if n.placements]
        if live:
            node = data.draw(st.sampled_from(live))
            self.place_one(node, data.draw(st.sampled_from(NAMES)))

    def place_one(self, node: FakeNode, target: str) -> None:
        tid = node.placements.pop(0)
        t = node.state.records.active.get(tid)
        e = node.state.home.entries.get(tid)
        if t is None or t.state is not S.QUEUED or t.node != node.name:
            return
        if e is not None and e.phase is not h.HomePhase.LOCAL:
            return
        if tid in node.queue or tid in node.running:
            return
        if node.state.in_doubt_here(tid, self.now):  # placing.py's first look
            node.run(node.state.defer_in_doubt(tid, self.now))
            return
        if target == node.name:
            node.run_here(tid, self.now)
            return
        why, instrs = node.state.offer(tid, target, self.now, self.now)
        assert why is None
        node.run(instrs)

    @rule(src=st.sampled_from(NAMES), lose=st.booleans())
    def deliver(self, src: str, lose: bool) -> None:
        self.net.deliver(src, lose=lose, now=self.now, wall=self.now)

    @rule()
    def settle(self) -> None:
        """Every message in flight is delivered (a quiet network for a while)."""
        for _ in range(3):
            for node in self._live():
                while self.net.deliver(node.name, now=self.now, wall=self.now):
                    pass

    @rule(name=st.sampled_from(NAMES), dt=st.floats(0.1, 30.0))
    def tick(self, name: str, dt: float) -> None:
        self.now += dt
        node = self.nodes[name]
        if name not in self.net.dead:
            node.run(node.state.tick(self.now, self.now))

    @rule(name=st.sampled_from(NAMES))
    def start(self, name: str) -> None:
        node = self.nodes[name]
        if name in self.net.dead or not node.queue:
            return
        tid = node.queue[0]
        draining = node.ledger.draining
        spec = node.state.records.active[tid].spec
        why = node.try_start(tid, self.now, self.now)
        if why is None:
            assert not (draining and not spec.is_global), "a drained node started a task"
            assert node.ledger.reserved <= node.ledger.shares, "ledger overbooked by a start"
        else:
            _event("a start was refused: " + why.split(" (")[0][:30])

    @rule(name=st.sampled_from(NAMES), code=st.sampled_from([0, 1]))
    def finish(self, name: str, code: int) -> None:
        node = self.nodes[name]
        if name in self.net.dead or not node.running:
            return
        tid = sorted(node.running)[0]
        remote = node.state.records.active[tid].spec.home != name
        node.finish(tid, code, self.now, self.now)
        self.ended[remote] += 1
        _event("a task ended " + ("away from its home" if remote else "at its home"))

    @rule(name=st.sampled_from(NAMES), shares=st.sampled_from([0, 1024]))
    def set_shares(self, name: str, shares: int) -> None:
        self.nodes[name].ledger.set_shares(shares)

    @rule(name=st.sampled_from(NAMES), data=st.data())
    def restart(self, name: str, data: st.DataObject) -> None:
        """`name`'s agent is killed and starts again from its journal at once (of what
        it wrote since its last durable write, a prefix landed; its processes ran on
        under their supervisor: node_harness.py `restart`)."""
        node = self.nodes[name]
        if name not in self.net.dead:
            keep = data.draw(st.integers(0, len(node.unsynced)))
            self.restart_one(name, keep, data.draw(st.booleans()))

    def restart_one(self, name: str, keep: int, outlive: bool = True) -> None:
        members = tuple(
            (n, m.MemberState.DEAD if n in self.net.dead else m.MemberState.ALIVE) for n in NAMES
        )
        self.nodes[name].restart(keep, members, self.now, self.now, outlive)
        self.restarts += 1
        _event("a node restarted")

    @precondition(lambda self: not self.killed)
    @rule(name=st.sampled_from(NAMES))
    def kill(self, name: str) -> None:
        self.killed = True
        self.net.kill(name, self.now, self.now)
        for node in self._live():  # the others' membership says so: runners adopt
            node.state.members_seen(((name, m.MemberState.DEAD),), self.now)
        _event("a node was lost")

    # -------------------------------------------------------- invariants

    @invariant()
    def one_place_per_task(self) -> None:
        seen: dict[m.TaskId, str] = {}
        for node in self._live():
            for tid in [*node.queue, *node.running]:
                assert tid not in seen, f"{tid} is at {seen[tid]} and at {node.name}"
                seen[tid] = node.name

    @invariant()
    def one_final_result(self) -> None:
        """(A runner that adopts a task whose home is lost journals its end again as
        its new home: the one it journaled as the runner does not count.)"""
        for node in self.nodes.values():
            for tid, n in node.home_finals.items():
                assert n <= 1, f"{tid}: {n} final results at its home {node.name}"

    @invariant()
    def an_array_never_has_more_than_its_cap_unfinished(self) -> None:
        for tid, (home, cap) in self.caps.items():
            node = self.nodes[home]
            if home in self.net.dead:
                continue
            live = [
                t.id
                for t in node.state.records.active.values()
                if t.spec.element is not None and t.spec.element.array == tid
            ]
            assert len(live) <= cap, (tid, cap, live)

    @invariant()
    def gpu_never_double_allocated(self) -> None:
        for node in self._live():
            core = sum(p.core for a in node.state.gpus.allocations() for p in a.parts)
            mem = sum(p.memory for a in node.state.gpus.allocations() for p in a.parts)
            assert core <= 100 and mem <= GPU.memory_bytes

    @invariant()
    def no_task_stranded_at_home(self) -> None:
        for node in self._live():
            for t in node.state.records.active.values():
                if t.spec.home != node.name or t.node != node.name or t.state is not S.QUEUED:
                    continue
                if t.spec.array:
                    continue  # an array's record is never placed: its elements are
                e = node.state.home.entries.get(t.id)
                responsible = (
                    t.id in node.queue
                    or t.id in node.placements
                    or t.id in node.state.awaiting_offer
                    or (e is not None and e.phase is h.HomePhase.OFFERING)
                    or t.id in node.state.deferred  # doubt.py: placed when it ends
                )
                assert responsible, f"{t.id} is queued at its home {node.name} and nobody places it"


ThreeNodes.TestCase.settings = settings(max_examples=200, stateful_step_count=80, deadline=None)
TestThreeNodes = ThreeNodes.TestCase


def _event(what: str) -> None:
    """hypothesis.event inside a hypothesis test; nothing in the random walks below."""
    try:
        hypothesis.event(what)
    except hypothesis.errors.InvalidArgument:
        pass


def test_random_walks_keep_the_invariants() -> None:
    """Long seeded walks (hypothesis favours short runs): the same rules, the same
    invariants after every step, 200 walks of 120 steps, a node lost in some (its
    tasks adopted by their runners), nodes restarted in most."""
    ended = {True: 0, False: 0}
    restarts = adoptions = 0
    for seed in range(200):
        rng = random.Random(seed)
        mch = ThreeNodes()
        for _ in range(4):
            mch.submit(rng.choice(NAMES), 0, False, False)
        for _ in range(120):
            _step(mch, rng)
            mch.one_place_per_task()
            mch.one_final_result()
            mch.gpu_never_double_allocated()
            mch.no_task_stranded_at_home()
            mch.an_array_never_has_more_than_its_cap_unfinished()
        mch.teardown()
        for k in ended:
            ended[k] += mch.ended[k]
        restarts += mch.restarts
        adoptions += sum(n.logs.count("failover.adopted") for n in mch.nodes.values())
    assert ended[True] > 50 and ended[False] > 50, ended  # the walks reach both kinds
    assert restarts > 100 and adoptions > 5, (restarts, adoptions)  # (594 and 25)


def _step(mch: ThreeNodes, rng: random.Random) -> None:
    n = rng.choice(NAMES)
    r = rng.randrange(10)
    actions: list[Any] = [
        lambda: (
            mch.submit_array(n, rng.randint(1, 6), rng.randint(1, 3))
            if rng.random() < 0.2
            else mch.submit(n, rng.choice([0, 300, 700]), rng.random() < 0.3, rng.random() < 0.5)
        ),
        lambda: _place(mch, rng),
        lambda: mch.deliver(n, rng.random() < 0.3),
        lambda: mch.tick(n, rng.uniform(0.1, 30.0)),
        lambda: mch.start(n),
        lambda: mch.finish(n, rng.choice([0, 1])),
        mch.settle,
        lambda: rng.random() < 0.2 and mch.set_shares(n, rng.choice([0, 1024])),
        lambda: rng.random() < 0.05 and not mch.killed and mch.kill(n),
        lambda: (
            rng.random() < 0.3
            and n not in mch.net.dead
            and mch.restart_one(n, rng.randint(0, len(mch.nodes[n].unsynced)), rng.random() < 0.7)
        ),
    ]
    actions[r]()


def _place(mch: ThreeNodes, rng: random.Random) -> None:
    live = [x for x in mch._live() if x.placements]
    if live:
        mch.place_one(rng.choice(live), rng.choice(NAMES))
