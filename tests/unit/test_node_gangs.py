"""Gangs in the pure NodeState (node/gangs.py): the protocol core on real records.

Several NodeStates on a fake network that delivers the gang messages (`SendGang`) and
starts members (`StartNow`) as the runtime would: a strict gang's members start with
their ranks and environment, the gang's record follows them (RUNNING, then the worst
exit), a held slot keeps single tasks out and counts in the load report, a member is
never a preemption victim, a gang without room holds nothing and waits, cancel and a
failed member stop the others, and a restarted home numbers its next round after the
journaled one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest

from swarm import codec, wire
from swarm import model as m
from swarm.cluster import gang as g
from swarm.cluster import gangwire
from swarm.node import events as ev
from swarm.node.gangs import GANG, Commitment, member_id, restore_gang_rounds
from swarm.node.state import Settings
from swarm.policy.sharing import parse
from swarm.runtime.gangio import gang_request_from_wire

from .node_harness import FakeNode, gossip

S = m.TaskState


class GangNode(FakeNode):
    """A FakeNode whose runtime also sends gang messages and starts members."""

    def __init__(self, name: str, slots: int = 1, **kw: Any) -> None:
        super().__init__(name, settings=Settings(slots=slots), **kw)
        self.gang_out: list[ev.SendGang] = []
        self.refused_start: dict[m.TaskId, str] = {}

    def run(self, instrs: list[ev.Instruction]) -> None:
        rest: list[ev.Instruction] = []
        for i in instrs:
            if isinstance(i, ev.SendGang):
                self.gang_out.append(i)
            elif isinstance(i, ev.StartNow):
                self.start_now(i.task_id)
            else:
                rest.append(i)
        super().run(rest)

    def start_now(self, tid: m.TaskId, now: float = 0.0, wall: float = 0.0) -> None:
        t = self.state.records.active[tid]
        why, instrs = self.state.can_start(t, None, now)
        self.run(instrs)
        if why is not None:
            self.refused_start[tid] = why
            return
        self.running.add(tid)
        started = self.state.records.apply(tid, S.RUNNING, wall, "started", node=self.name)
        self.run(self.state.on_started(started, now, wall))

    def members(self) -> list[m.Task]:
        return [t for t in self.state.records.active.values() if t.spec.member is not None]


class GangNet:
    def __init__(self, *nodes: GangNode) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.now = 0.0
        self.ports = 5000
        self.drop: Callable[[str, ev.SendGang], bool] = lambda src, i: False

    def settle(self, limit: int = 500) -> None:
        for _ in range(limit):
            moved = False
            for n in list(self.nodes.values()):
                while n.gang_out:
                    i = n.gang_out.pop(0)
                    moved = True
                    self.deliver(n.name, i)
            if not moved:
                return
        raise AssertionError("the gang messages never settle")

    def deliver(self, src: str, i: ev.SendGang) -> None:
        dest = self.nodes.get(i.dest)
        if dest is None or self.drop(src, i):
            return  # dead, or lost
        msg = gangwire.from_wire(gangwire.to_wire(i.msg))  # as the wire carries it
        commitment = None
        if i.spec is not None:
            master = f"10.0.0.{ord(i.msg.master[-1])}" if isinstance(i.msg, g.Commit) else ""
            commitment = Commitment(i.spec, i.run, master)
        self.ports += 1
        s = ev.GangMessage(self.now, 1000.0 + self.now, "x", src, msg, commitment, self.ports)
        dest.run(dest.state.handle(s))

    def tick(self, dt: float) -> None:
        self.now += dt
        for n in self.nodes.values():
            n.run(n.state.handle(ev.Wake(self.now, 1000.0 + self.now, "w")))
        self.settle()

    def finish(self, tid: m.TaskId, code: int = 0) -> None:
        for n in self.nodes.values():
            if tid in n.running:
                n.finish(tid, code, now=self.now, wall=1000.0 + self.now)
                self.settle()
                return
        raise AssertionError(f"{tid} runs nowhere")


def _cluster(names: str = "ABCD", slots: int = 1) -> tuple[GangNet, list[GangNode]]:
    nodes = [GangNode(n, slots=slots) for n in names]
    for n in nodes:
        n.run(n.state.start_timers(0.0))
    gossip(*nodes)
    return GangNet(*nodes), nodes


def _submit(home: GangNode, net: GangNet, size: int = 4, **gang: Any) -> m.TaskSpec:
    req = m.GangRequest(size=size, **gang)
    spec = home.submit(
        m.TaskSpec(
            id="job~alice", argv=("train",), env={"A": "1"}, uid=1000, user="alice", gang=req
        )
    )
    home.run(home.state.handle(ev.GangSubmitted(net.now, 1000.0, "s", spec.id)))
    net.settle()
    return spec


def test_a_strict_gang_starts_its_members_with_ranks_and_the_rendezvous() -> None:
    net, nodes = _cluster()
    a = nodes[0]
    spec = _submit(a, net)
    members = [t for n in nodes for t in n.members()]
    assert sorted(t.spec.member.rank for t in members if t.spec.member) == [0, 1, 2, 3]
    assert {t.node for t in members} == {"A", "B", "C", "D"}  # one slot each
    assert all(t.state is S.RUNNING for t in members)
    ids = sorted(t.id for t in members)
    assert (
        ids
        == [member_id(spec.id, r, 1) for r in range(4)]
        == [
            "job.0~alice",
            "job.1~alice",
            "job.2~alice",
            "job.3~alice",
        ]
    )
    (zero,) = [t for t in members if t.spec.member and t.spec.member.rank == 0]
    for t in members:
        env = t.spec.env
        assert env["A"] == "1" and env["SWARM_GANG_ID"] == spec.id
        assert env["SWARM_WORLD_SIZE"] == "4" and env["SWARM_LOCAL_RANK"] == "0"
        assert env["MASTER_ADDR"] == f"10.0.0.{ord(zero.node[-1])}"
        assert env["MASTER_PORT"] == zero.spec.env["MASTER_PORT"] != "0"
        assert t.spec.home == t.node and t.spec.member and t.spec.member.home == "A"
        assert t.spec.user == "alice" and t.spec.no_retry
    assert a.kv[GANG + spec.id] == {"round": 1, "starts": 1}
    net.tick(0.1)
    assert a.state.records.active[spec.id].state is S.RUNNING
    # a member's run lease is what its supervisor gets
    b = nodes[1]
    (bm,) = b.members()
    lease = b.state.gang_deadline(bm.id)
    assert lease is not None and lease > net.now
    # the home renews while the gang is whole: the lease moves, the supervisor hears
    for _ in range(8):
        net.tick(1.0)
    assert b.renewals and b.renewals[-1].task_id == bm.id
    assert (b.state.gang_deadline(bm.id) or 0) > lease
    for t in members:
        net.finish(t.id, 0)
    net.tick(0.1)
    done = a.state.records.get_cached(spec.id)
    assert done is not None and done.state is S.SUCCEEDED and done.exit_code == 0
    assert GANG + spec.id not in a.kv and not a.state.gang_coords
    assert all(n.state.gang_held() == 0 for n in nodes)


def test_a_failed_member_fails_a_strict_gang_and_stops_the_others() -> None:
    net, nodes = _cluster()
    a = nodes[0]
    spec = _submit(a, net)
    net.tick(0.1)
    members = {t.spec.member.rank: t for n in nodes for t in n.members() if t.spec.member}
    net.finish(members[2].id, 3)
    net.tick(0.1)
    done = a.state.records.get_cached(spec.id)
    assert done is not None and done.state is S.FAILED and done.exit_code == 3
    assert "rank 2 exited 3" in done.reason
    stopped = {tid for n in nodes for tid in n.stopped}
    assert stopped == {members[r].id for r in (0, 1, 3)}


def test_a_nonstrict_gang_runs_on_without_one_member() -> None:
    net, nodes = _cluster()
    a = nodes[0]
    spec = _submit(a, net, size=4, mode="nonstrict", min_available=2)
    net.tick(0.1)
    members = {t.spec.member.rank: t for n in nodes for t in n.members() if t.spec.member}
    victim = next(t for t in members.values() if t.node != "A")
    del net.nodes[victim.node]  # its node dies
    a.run(a.state.handle(ev.NodeDead(net.now, 1000.0, "d", victim.node)))
    for _ in range(20):
        net.tick(1.0)
    assert a.state.records.active[spec.id].state is S.RUNNING
    assert not [tid for n in net.nodes.values() for tid in n.stopped]


def test_held_slots_keep_single_tasks_out_and_count_as_load() -> None:
    _net, nodes = _cluster("AB", slots=2)
    b = nodes[1]
    gspec = m.TaskSpec(id="gg", argv=("x",), home="A", gang=m.GangRequest(size=2))
    prep = g.Prepare("gg", 1, (0,), 5.0)
    b.run(b.state.handle(ev.GangMessage(0.0, 1000.0, "p", "A", prep, Commitment(gspec, 0, ""), 7)))
    assert b.state.gang_held() == 1
    assert b.state.gang_room(gspec) == 1  # two slots, one held
    r = b.state.local_report(1000.0)
    assert r.running == 1 and r.slots == 2
    (sent,) = b.gang_out
    assert isinstance(sent.msg, g.Granted) and sent.msg.port == 7
    # a drained node has no room for members
    b.ledger.set_shares(0)
    assert b.state.gang_room(gspec) == 0
    # the hold lapses by itself
    b.run(b.state.handle(ev.Wake(6.0, 1006.0, "w")))
    assert b.state.gang_held() == 0


def test_a_member_is_never_preempted() -> None:
    net, nodes = _cluster("AB")
    for n in nodes:  # preemption on (the default sharing tables), one slot each
        n.state.sharing = parse(None, None)
    a = nodes[0]
    _submit(a, net, size=2)
    assert [t.state for t in a.members()] == [S.RUNNING]
    hi = a.submit(m.TaskSpec(id="hi", argv=("x",), priority=1000, uid=1000, user="bob"))
    a.run_here(hi.id)
    assert a.state.preempt_for(hi.id, now=1.0, wall=1001.0) == []
    # the same with a single low task in the slot: it is the victim (the rule works)
    b = nodes[1]
    b.running.clear()
    low = b.submit(m.TaskSpec(id="low", argv=("x",), priority=10, uid=1000, user="al"))
    b.run_here(low.id)
    assert b.try_start(low.id, wall=1000.0) is None
    hi2 = b.submit(m.TaskSpec(id="hi2", argv=("x",), priority=1000, uid=1000, user="bob"))
    b.run_here(hi2.id)
    assert [
        p.task_id for p in b.state.preempt_for(hi2.id, 1.0, 1001.0) if isinstance(p, ev.Preempt)
    ] == ["low"]


def test_a_gang_without_room_holds_nothing_and_waits() -> None:
    net, nodes = _cluster("AB")
    for n in nodes:
        n.running.add(f"{n.name}-busy")  # every slot taken
    gossip(*nodes)
    a = nodes[0]
    spec = _submit(a, net, size=2)
    for _ in range(5):
        net.tick(0.5)
    assert a.state.records.active[spec.id].state is S.QUEUED
    assert all(n.state.gang_held() == 0 and not n.members() for n in nodes)
    why = a.state.gang_explain(spec.id) or ""
    assert "no placement: room for 1 of 2" in why, why  # B's report shows a slot
    # room comes (a report shows it): the gang looks again at once and runs
    for n in nodes:
        n.running.clear()
    gossip(*nodes)
    b = nodes[1]
    a.run(a.state.handle(ev.PeerReport(net.now, 1000.0, "r", b.state.local_report(1.0), net.now)))
    net.settle()
    for _ in range(20):
        net.tick(0.5)
        if len([t for n in nodes for t in n.members()]) == 2:
            break
    assert len([t for n in nodes for t in n.members()]) == 2


def test_cancel_ends_the_gang_cancelled_and_stops_its_members() -> None:
    net, nodes = _cluster()
    a = nodes[0]
    spec = _submit(a, net)
    a.run(a.state.handle(ev.GangCancel(net.now, 1000.0, "c", spec.id, "cancelled by uid 0")))
    net.settle()
    done = a.state.records.get_cached(spec.id)
    assert done is not None and done.state is S.CANCELLED
    assert len({tid for n in nodes for tid in n.stopped}) == 4


def test_a_restarted_home_numbers_its_next_round_after_the_journaled_one() -> None:
    kv = {GANG + "job~alice": {"round": 7, "starts": 2}, "other": 1}
    assert restore_gang_rounds(kv) == ({"job~alice": 7}, {"job~alice": 2})
    net, nodes = _cluster()
    a = nodes[0]
    a.state.gang_rounds, a.state.gang_starts = {"job~alice": 7}, {"job~alice": 2}
    spec = _submit(a, net)
    assert a.kv.get(GANG + spec.id) is None  # it waits for the old round's leases first
    for _ in range(40):
        net.tick(0.5)
        if a.kv.get(GANG + spec.id):
            break
    assert a.kv[GANG + spec.id]["round"] == 8
    for _ in range(10):
        net.tick(0.5)
    # its third start: the members' ids say so (the first two may still exist somewhere)
    members = sorted(t.id for n in nodes for t in n.members())
    assert members == [f"job.{r}.3~alice" for r in range(4)], members
    assert a.kv[GANG + spec.id] == {"round": 8, "starts": 3}


def test_the_gang_op_is_decoded_strictly() -> None:
    spec = m.TaskSpec(id="gg", argv=("x",), home="A", gang=m.GangRequest(size=2))
    commit = g.Commit("gg", 1, {0: 0, 1: 1}, 2, "A", 4000, 15.0)
    req = {
        "op": "gang",
        "msg": gangwire.to_wire(commit),
        "spec": codec.task_spec_to_wire(spec),
        "run": 1,
        "master_addr": "10.0.0.1",
    }
    msg, c = gang_request_from_wire(req)
    assert msg == commit and c == Commitment(spec, 1, "10.0.0.1")
    other = attrs.evolve(spec, id="other")
    for bad in (
        {**req, "spec": codec.task_spec_to_wire(other)},  # not the gang's spec
        {**req, "spec": codec.task_spec_to_wire(attrs.evolve(spec, gang=None))},
        {**req, "extra": 1},
        {**req, "run": -1},
        {**req, "msg": {"t": "nope"}},
    ):
        with pytest.raises(wire.WireError):
            gang_request_from_wire(bad)


@pytest.mark.parametrize(
    ("gang", "why"),
    [
        ({"size": 0}, "size must be 1..4096"),
        ({"size": 4, "mode": "nonstrict", "min_available": 5}, "min-available must be 1..4"),
        ({"size": 4, "mode": "odd"}, "mode must be strict or nonstrict"),
        ({"size": 4, "min_available": 2}, "applies to --gang-mode nonstrict only"),
        ({"size": 4, "timeout": -1}, "timeout"),
    ],
)
def test_bad_gang_requests_name_the_field(gang: dict[str, Any], why: str) -> None:
    from swarm.request_checks import submit_spec

    f = wire.Fields({"argv": ["x"], "gang": gang}, "submit")
    with pytest.raises(wire.WireError, match=why):
        submit_spec(f, uid=0, user="root", home="A", now=0.0)


def test_a_start_that_failed_half_way_gives_the_next_start_new_member_ids() -> None:
    net, nodes = _cluster()
    a = nodes[0]
    # every commit to D is lost: the round starts members elsewhere, then fails
    net.drop = lambda src, i: i.dest == "D" and isinstance(i.msg, g.Commit)
    spec = _submit(a, net)
    first = sorted(t.id for n in nodes for t in n.members())
    assert first and all(t.count(".") == 1 for t in first)  # job.R~alice: start 1
    for _ in range(6):
        net.tick(0.5)
    # the round failed: the members that started were told to stop
    assert sorted(tid for n in nodes for tid in n.stopped) == first
    net.drop = lambda src, i: False
    for n in nodes:  # the stopped members end
        for tid in list(n.running):
            n.finish(tid, 143, now=net.now, wall=1000.0 + net.now)
    for _ in range(60):
        net.tick(0.5)
        if a.state.records.active[spec.id].state is S.RUNNING:
            break
    second = sorted(t.id for n in nodes for t in n.members())
    assert second == [f"job.{r}.2~alice" for r in range(4)], second
