"""Home failover in the pure NodeState (node/failover.py): the node that holds a task
adopts it once its home has been SWIM-dead for the grace, finishes it as its home, and
tells the others; a home that comes back lets go and never runs it again."""

from __future__ import annotations

import attrs

from swarm import model as m
from swarm.cluster import handoff as h
from swarm.cluster.succession import Notice, Record
from swarm.node.recovery import ADOPT, GUEST, HOME
from swarm.node.state import Settings

from .node_harness import FakeNet, FakeNode

S = m.TaskState
DEAD, ALIVE, SUSPECT = m.MemberState.DEAD, m.MemberState.ALIVE, m.MemberState.SUSPECT
GRACE = 5.0


def _nodes(*names: str) -> tuple[FakeNode, ...]:
    return tuple(FakeNode(n, settings=Settings(home_grace=GRACE)) for n in names)


def _held_at_b(start: bool = True) -> tuple[FakeNode, FakeNode, FakeNode, FakeNet]:
    """A task submitted at A, committed to B (and started there)."""
    a, b, c = _nodes("A", "B", "C")
    net = FakeNet(a, b, c)
    spec = a.submit(m.TaskSpec(id="t1", argv=("sleep", "60")))
    why, instrs = a.state.offer(spec.id, "B", 0.0, 0.0)
    assert why is None
    a.run(instrs)
    net.settle()
    assert b.state.guest.may_run("t1") and "t1" in b.queue
    if start:
        assert b.try_start("t1") is None
    for n in (a, b, c):  # everybody sees everybody alive
        n.state.members_seen(tuple((x, ALIVE) for x in ("A", "B", "C")), 0.0)
    return a, b, c, net


def _tick(n: FakeNode, now: float) -> None:
    n.state.failover_at = 0.0
    n.run(n.state.tick(now, 1000.0 + now))


def test_the_runner_adopts_after_the_grace_of_a_swim_death_and_not_before() -> None:
    _, b, _, _ = _held_at_b()
    b.state.members_seen((("A", SUSPECT),), 1.0)
    _tick(b, 30.0)
    assert b.state.records.active["t1"].spec.home == "A"  # suspect only: never
    b.state.members_seen((("A", DEAD),), 31.0)
    _tick(b, 35.9)
    assert b.state.records.active["t1"].spec.home == "A"  # dead, not for a grace yet
    _tick(b, 36.0)
    t = b.state.records.active["t1"]
    assert (t.spec.home, t.state, t.node) == ("B", S.RUNNING, "B")
    assert "adopted from A" in t.history[-1].cause
    assert b.kv[ADOPT + "t1"] == ["A", 2] and GUEST + "t1" not in b.kv
    assert b.kv[HOME + "t1"]["where"] == "B" and "t1" not in b.state.guest.entries
    assert "failover.adopted" in b.logs
    assert "adopted as its runner, claim epoch 2" in b.state.explains["t1"][-1]["outcome"]
    # every live member is told, in one message each; the dead home is not
    assert [(s.dest, [n.task_id for n in s.notices]) for s in b.notices_out] == [("C", ["t1"])]
    # with a copy at C: three nodes known, two copies wanted (stop 53: a runner's
    # record names no replicas, and it adopted with none)
    assert b.notices_out[0].notices[0] == Notice("C", "t1", "B", 2, "B", ("C",))


def test_an_adopted_task_ends_here_with_no_report_to_the_dead_home() -> None:
    _, b, _, _ = _held_at_b()
    b.state.members_seen((("A", DEAD),), 1.0)
    _tick(b, 7.0)
    b.outbox.clear()
    b.finish("t1", 0, now=8.0, wall=1008.0)
    assert b.state.records.finished["t1"].state is S.SUCCEEDED
    assert not [s for s in b.outbox if isinstance(s.request, h.Report)]
    assert b.finals == {"t1": 1}


def test_a_queued_task_waiting_for_its_dead_homes_confirmation_runs_after_adoption() -> None:
    """B restarted: its committed entry waits for A's "yours" (CONFIRM), and A is gone
    for good: the task stayed queued forever; now B adopts it and runs it."""
    _, b, _, _ = _held_at_b(start=False)
    entry = b.state.guest.entries["t1"]
    (b2,) = _nodes("B")
    b2.state.records.store(b.state.records.active["t1"])
    b2.state.guest.restore(h.guest_entry_from_wire(h.guest_entry_to_wire(entry)))
    b2.run(b2.state.enqueue_local(b2.state.records.active["t1"], 0.0))
    assert b2.try_start("t1") is not None  # waits for its home's answer
    b2.state.members_seen((("A", DEAD), ("C", ALIVE)), 0.0)
    _tick(b2, 5.0)
    assert b2.state.records.active["t1"].spec.home == "B"
    assert b2.try_start("t1") is None


def test_a_home_that_comes_back_lets_go_and_never_runs_it() -> None:
    a, b, _, _ = _held_at_b()
    b.state.members_seen((("A", DEAD),), 1.0)
    _tick(b, 7.0)
    b.notices_out.clear()
    b.state.members_seen((("A", ALIVE),), 20.0)  # A restarted with its disk
    _tick(b, 21.0)
    (send,) = b.notices_out
    assert send.dest == "A"
    answers, instrs = a.state.on_notices("B", send.notices, 21.0, 1021.0)
    a.run(instrs)
    assert answers == []
    assert "t1" not in a.state.records.active and a.forgotten == ["t1"]
    assert HOME + "t1" not in a.kv and "t1" not in a.state.home.entries
    assert "failover.yielded" in a.logs
    # it answers no more for the task: B's report would not be accepted there either
    reply, _ = a.state.on_request("B", h.Report("t1", 1, "succeeded", 0), 22.0, 1022.0)
    assert not reply.ok


def test_a_smaller_claim_is_answered_with_the_larger_one() -> None:
    _, b, c, _ = _held_at_b()
    b.state.members_seen((("A", DEAD),), 1.0)
    _tick(b, 7.0)
    late = Notice("B", "t1", "A", 1, "B", ())
    answers, _ = b.state.on_notices("A", (late,), 8.0, 1008.0)
    assert answers == [Notice("A", "t1", "B", 2, "B", ("C",))]
    assert b.state.records.active["t1"].spec.home == "B"
    # a bystander that heard the adoption answers the old claim the same way
    (send,) = b.notices_out
    assert c.state.on_notices("B", send.notices, 8.0, 1008.0) == ([], [])
    answers, _ = c.state.on_notices("A", (Notice("C", "t1", "A", 1, "B", ()),), 9.0, 1009.0)
    assert answers == [Notice("A", "t1", "B", 2, "B", ("C",))]


def test_an_undelivered_notice_is_owed_again() -> None:
    _, b, _, _ = _held_at_b()
    b.state.members_seen((("A", DEAD),), 1.0)
    _tick(b, 7.0)
    (send,) = b.notices_out
    b.notices_out.clear()
    _tick(b, 8.0)
    assert b.notices_out == []
    b.state.notices_undelivered(send.notices)
    _tick(b, 9.0)
    assert [s.notices for s in b.notices_out] == [send.notices]


def test_a_copy_running_under_a_smaller_claim_is_stopped_when_the_larger_arrives() -> None:
    """Two nodes adopted one task (a race with a dying home): the larger claim wins and
    the other copy stops; its record stays there as a copy pointing at the winner."""
    _, b, _, _ = _held_at_b()
    b.state.members_seen((("A", DEAD),), 1.0)
    _tick(b, 7.0)
    answers, instrs = b.state.on_notices("Z", (Notice("B", "t1", "Z", 2, "Z", ()),), 8.0, 1008.0)
    b.run(instrs)
    assert answers == [] and b.stopped == ["t1"]
    assert b.state.records.active["t1"].spec.home == "Z"
    assert ADOPT + "t1" not in b.kv and HOME + "t1" not in b.kv


def test_a_copy_holders_claim_over_a_run_that_ended_here_is_claimed_above() -> None:
    """Stop 54 (the copies walks, seed 10823): B ran t1 for A, and it ended; A died
    before taking the report. C, holding a copy, adopted it, naming no runner, before
    B did (B had restarted, and dated A's death from then): B forgot the end, and C ran
    the task again. Now B claims above C's claim, keeping the end, and answers with
    its claim (C yields to it). A claim that names another runner is yielded to."""
    _, b, _, _ = _held_at_b()
    b.finish("t1", 3, now=2.0, wall=1002.0)
    b.state.members_seen((("A", DEAD),), 3.0)
    claim = Notice("B", "t1", "C", 2, None, ("B",))
    answers, instrs = b.state.on_notices("C", (claim,), 4.0, 1004.0)
    b.run(instrs)
    assert [(n.to, n.home, n.epoch, n.runner) for n in answers] == [("C", "B", 3, "B")]
    t = b.state.records.finished["t1"]
    assert (t.state, t.spec.home) == (S.FAILED, "B") and b.stopped == []
    assert b.kv[ADOPT + "t1"] == ["A", 3] and "t1" not in b.state.guest.entries
    assert b.state.succession.record("t1").epoch == 3  # type: ignore[union-attr]
    # another runner named: that run stands, ours is forgotten, as before
    _, b2, _, _ = _held_at_b()
    b2.finish("t1", 3, now=2.0, wall=1002.0)
    claim = Notice("B", "t1", "C", 2, "D", ())
    answers, instrs = b2.state.on_notices("C", (claim,), 4.0, 1004.0)
    b2.run(instrs)
    assert answers == [] and b2.state.records.get_cached("t1") is None


def test_an_adoption_that_ended_here_claims_again_above_a_tie_it_lost() -> None:
    """B adopted t1 as its runner, and it ended; Z, a copy holder, adopted it in the
    same round (epoch 2, and Z > B): B claims again at 3 rather than forget the end.
    Z's own answer, naming itself runner, is no tie: a counter is not countered."""
    _, b, _, _ = _held_at_b()
    b.state.members_seen((("A", DEAD),), 1.0)
    _tick(b, 7.0)
    b.finish("t1", 0, now=8.0, wall=1008.0)
    answers, instrs = b.state.on_notices("Z", (Notice("B", "t1", "Z", 2, None, ()),), 9.0, 9.0)
    b.run(instrs)
    assert [(n.home, n.epoch, n.runner) for n in answers] == [("B", 3, "B")]
    assert b.kv[ADOPT + "t1"] == ["A", 3] and "failover.claimed_again" in b.logs
    assert b.state.records.finished["t1"].state is S.SUCCEEDED
    answers, instrs = b.state.on_notices("Z", (Notice("B", "t1", "Z", 4, "Z", ()),), 9.5, 9.5)
    b.run(instrs)
    assert answers == [] and "failover.yielded" in b.logs


def test_an_adoption_that_ended_names_no_new_replicas_at_every_tick() -> None:
    """Stop 54: once an adopted task ended and its copy was released, its record
    named none, fewer than wanted, so each tick named a new one (a journal write, a
    copy and a notice to every member each second, for as long as the record stayed)."""
    _, b, c, _ = _held_at_b()
    b.state.members_seen((("A", DEAD),), 1.0)
    _tick(b, 7.0)
    b.finish("t1", 0, now=8.0, wall=1008.0)
    for now in (9.0, 10.0, 11.0):
        _tick(b, now)
        while b.replica_out:  # the copy at C, then its release
            i = b.replica_out.pop(0)
            why, instrs = c.state.on_replica("B", i.msg)
            assert why is None, why
            c.run(instrs)
            b.run(b.state.replica_acked(i.dest, i.msg))
    assert "t1" not in b.state.mine and c.state.held["t1"].final is not None
    rec = b.state.succession.record("t1")
    b.notices_out.clear()
    for now in range(12, 20):
        _tick(b, float(now))
    assert b.state.succession.record("t1") == rec and b.notices_out == []
    assert b.replica_out == []


def test_a_runner_knows_its_adopters_claim_from_the_handoff_epoch() -> None:
    """Stop 54 (the copies walks, seed 7460): B runs a task for Z, which adopted it at
    claim 2; B restarts and its view forgets the claim. When Z dies, B adopted at
    claim 2 too, lost the tie to Z's own, and the task was lost to a later loss. An
    adopter's handoff epochs carry its claim (claim << 32), a runner's adoption's too,
    so B holds the record at 2 and adopts at 3."""
    (b,) = _nodes("B")
    spec = m.TaskSpec(id="t1", argv=("x",), home="Z")
    for r in (h.Offer("t1", (2 << 32) + 1, spec), h.Commit("t1", (2 << 32) + 1)):
        reply, instrs = b.state.on_request("Z", r, 0.0, 1000.0)
        assert reply.ok
        b.run(instrs)
    b.state.members_seen((("Z", ALIVE), ("C", ALIVE)), 0.0)
    _tick(b, 1.0)
    assert b.state.succession.record("t1") == Record("Z", 2, "B", ())
    b.state.members_seen((("Z", DEAD),), 2.0)
    _tick(b, 2.0 + GRACE)
    assert b.kv[ADOPT + "t1"] == ["Z", 3]
    assert b.state.home.entries["t1"].epoch >= 3 << 32  # its own offers carry it on


def test_members_never_heard_of_are_taken_as_gone_once_among_peers() -> None:
    """After a restart, a member dead for longer than push-pull carries the dead is
    not in the view at all: a home waited for ever on its lost runner, a runner on
    its lost home. Once the view has named a peer alive for UNHEARD_AFTER, a member
    our entries name and the view never named is taken as gone."""
    a, b, _, _ = _held_at_b()
    (a2,) = _nodes("A")  # A restarted: its record and home entry from the journal
    a2.state.records.store(a.state.records.active["t1"])
    a2.state.home.restore(h.home_entry_from_wire(h.home_entry_to_wire(a.state.home.entries["t1"])))
    (b2,) = _nodes("B")  # and B, the runner, restarted too
    b2.state.records.store(b.state.records.active["t1"])
    b2.state.guest.restore(
        h.guest_entry_from_wire(h.guest_entry_to_wire(b.state.guest.entries["t1"]))
    )
    for n in (a2, b2):
        n.state.members_seen((("C", ALIVE),), 100.0)  # the view names C only
        _tick(n, 109.0)
    assert a2.state.records.active["t1"].node == "B" and not a2.placements
    _tick(a2, 110.0)  # A: B is gone, the task is queued here again and placed
    t = a2.state.records.active["t1"]
    assert (t.state, t.node) == (S.QUEUED, "A") and a2.placements == ["t1"]
    assert "failover.unheard" in a2.logs
    _tick(b2, 110.0)  # B: A is gone from now on; it adopts after the grace
    assert b2.state.records.active["t1"].spec.home == "A"
    _tick(b2, 110.0 + GRACE)
    assert b2.state.records.active["t1"].spec.home == "B"


def test_a_runners_adoption_makes_new_copies_that_outlive_the_runner() -> None:
    """The old home's replicas are unknown to its runner: once it adopts a task it
    makes copies of its own (the closing note of the last stop named this gap)."""
    from swarm.node.replicas import HOLD

    a, b, c, d = _nodes("A", "B", "C", "D")
    net = FakeNet(a, b, c, d)
    a.submit(m.TaskSpec(id="t1", argv=("sleep", "60")))
    why, instrs = a.state.offer("t1", "B", 0.0, 0.0)
    assert why is None
    a.run(instrs)
    net.settle()  # queued at B
    names = ("A", "B", "C", "D")
    for n in (a, b, c, d):
        n.state.members_seen(tuple((x, ALIVE) for x in names), 0.0)
    b.state.members_seen((("A", DEAD),), 1.0)
    _tick(b, 7.0)
    assert b.state.records.active["t1"].spec.home == "B"
    [copy] = [i for i in b.replica_out if i.msg.task_id == "t1"]
    assert copy.msg.kind == HOLD and copy.msg.spec.home == "B"
    r = {"C": c, "D": d}[copy.dest]
    why, instrs = r.state.on_replica("B", copy.msg)
    assert why is None
    r.run(instrs)
    b.run(b.state.replica_acked(copy.dest, copy.msg))
    # B dies too, with the task queued there: its new replica takes it over
    r.state.members_seen((("A", DEAD), ("B", DEAD)), 8.0)
    _tick(r, 8.0 + 2 * GRACE + 0.1)
    t = r.state.records.active["t1"]
    assert t.spec.home == copy.dest and "adopted from B" in t.history[-1].cause


def test_an_old_home_back_refuses_the_adopted_task_until_it_yields() -> None:
    """Chaos home-loss, seed 1018 (stop 46): a restarted old home ran its queued task,
    then took the adopted task's transfer back as the new home's guest; the run and the
    guest entry shared one record, and the result never reached the new home. Such an
    offer is refused now, until the adopter's notice makes the old home yield."""
    (a,) = _nodes("A")
    spec = a.submit(m.TaskSpec(id="t1", argv=("x",)))
    a.run_here(spec.id)
    assert a.try_start(spec.id) is None  # back, and running it as its home
    adopted = attrs.evolve(spec, home="B")
    why = a.state.admission_refusal(adopted)
    assert why is not None and "older claim of t1" in why
    assert a.state.admission_refusal(spec) is None  # its own task, moving back home
    assert a.state.admission_refusal(attrs.evolve(spec, id="t2", home="B")) is None
    reply, _ = a.state.on_request("B", h.Offer("t1", 2, adopted), 0.0, 0.0, refusal=why)
    assert reply is not None and not reply.ok and "older claim" in reply.reason
    a.finish(spec.id, wall=5.0)
    assert a.state.admission_refusal(adopted) is None  # ended here: nothing to share


def _copied_at_a() -> tuple[FakeNode, FakeNode]:
    """Task t1 queued at its home A (not placed yet), its copy held at B."""
    a, b = _nodes("A", "B")
    spec = a.submit(m.TaskSpec(id="t1", argv=("x",)))
    why, instrs = b.state.on_replica("A", a.state.hold_msg(spec, ("B",)))
    assert why is None
    b.run(instrs)
    a.run(a.state.replicas_chosen("t1", ("B",)))
    return a, b


def test_a_home_back_after_its_grace_places_no_task_a_peer_may_have_taken_over() -> None:
    """The left item of stops 44-46: a restarted home placed its queued tasks from its
    journal at once, before any peer could tell it that it had adopted them. Down for
    the grace or more (its last `alive_at` against now), it waits max(grace, 10 s)."""
    from swarm.node.doubt import DOUBT_MIN
    from swarm.node.recovery import ALIVE_AT

    a, _ = _copied_at_a()
    a.run(a.state.restarted_after(100.0, 1100.0, alive_at=1000.0))  # down 100 s
    # in doubt: no heartbeat until it is over (a restart meanwhile doubts again)
    assert ALIVE_AT not in a.kv and any("restart_doubt" in x for x in a.logs)
    a.run(a.state.place("t1", 100.0, 1100.0))
    assert "t1" not in a.queue and "t1" in a.state.deferred
    assert "restarted after its grace" in a.state.explains["t1"][-1]["outcome"]
    _tick(a, 100.0 + DOUBT_MIN - 0.5)
    assert a.placements == []  # still in doubt
    _tick(a, 100.0 + DOUBT_MIN)
    assert a.placements == ["t1"] and not a.state.deferred
    a.run(a.state.place("t1", 111.0, 1111.0))  # the effect of Place: placed now
    assert "t1" in a.queue


def test_a_home_back_after_a_short_absence_places_at_once() -> None:
    a, _ = _copied_at_a()
    a.run(a.state.restarted_after(100.0, 1100.0, alive_at=1100.0 - GRACE + 0.5))
    a.run(a.state.place("t1", 100.0, 1100.0))
    assert "t1" in a.queue and not a.state.deferred


def test_a_home_in_doubt_lets_an_adopted_task_go_and_never_places_it() -> None:
    a, _ = _copied_at_a()
    a.run(a.state.restarted_after(100.0, 1100.0, alive_at=None))  # no heartbeat: long
    a.run(a.state.place("t1", 100.0, 1100.0))
    assert "t1" in a.state.deferred
    # B adopted it while A was down, and says so once it sees A again
    _, instrs = a.state.on_notices("B", (Notice("A", "t1", "B", 2, "B", ()),), 101.0, 1101.0)
    a.run(instrs)
    assert any("failover.yielded" in x for x in a.logs)
    for now in (102.0, 130.0):
        _tick(a, now)
    assert a.placements == [] and not a.state.deferred and "t1" not in a.queue


def test_a_home_that_lets_a_task_go_forgets_its_record_before_its_keys() -> None:
    """Stop 52 (the copies stateful test): the record's forget came after the durable
    write that deletes the home's keys; a crash between them left a record of ours with
    no home entry, which the restart took for an interrupted offer and ran again."""
    from swarm.node import events as ev

    a, _ = _copied_at_a()
    _, instrs = a.state.on_notices("B", (Notice("A", "t1", "B", 2, "B", ()),), 101.0, 1101.0)
    kinds = [type(i).__name__ for i in instrs]
    keys = next(
        k
        for k, i in enumerate(instrs)
        if isinstance(i, ev.Persist) and i.durable and ev.Delete(HOME + "t1") in i.ops
    )
    assert "Forget" in kinds and kinds.index("Forget") < keys, kinds


def test_a_task_nobody_could_take_over_is_placed_at_once_after_a_long_absence() -> None:
    """No copy, not held elsewhere: no succession record, nothing to doubt."""
    (a,) = _nodes("A")
    a.submit(m.TaskSpec(id="t1", argv=("x",)))
    a.run(a.state.restarted_after(100.0, 1100.0, alive_at=0.0))
    a.run(a.state.place("t1", 100.0, 1100.0))
    assert "t1" in a.queue


def test_a_doubted_task_whose_runner_dies_during_the_doubt_is_placed_at_its_end() -> None:
    """Found by the stateful test's restarts (stop 52): a home back after its grace,
    its task queued at its runner with no copies (--replicas 1, or two nodes), the
    runner dead during the doubt: the task came back home, its placement waited for
    the doubt's end, the failover tick released its succession record (nothing else
    could take it over now), and the doubt's end dropped the placement: queued at its
    home for ever."""
    from swarm.node.doubt import DOUBT_MIN

    a, *_ = _held_at_b(start=False)
    a.run(a.state.restarted_after(100.0, 1100.0, alive_at=0.0))  # down long
    assert "t1" in a.state.doubted
    a.run(a.state.on_node_dead("B", 101.0, 1101.0))  # back home, to be placed
    assert a.placements == ["t1"] and a.state.records.active["t1"].node == "A"
    a.placements.clear()
    a.run(a.state.place("t1", 101.0, 1101.0))
    assert "t1" in a.state.deferred
    _tick(a, 102.0)  # releases the record: nothing elsewhere holds it now
    assert a.state.succession.record("t1") is None
    _tick(a, 100.0 + DOUBT_MIN)
    assert a.placements == ["t1"] and not a.state.deferred
    a.run(a.state.place("t1", 111.0, 1111.0))
    assert "t1" in a.queue


def test_a_task_moved_back_home_during_the_doubt_waits_for_its_end() -> None:
    """Found by the copies walks (stop 53): B asked to move A's task back home while
    A was down; B adopted it once A had been dead for the grace, and A, back after
    its grace, took the move that had been on its way and ran the task at once (the
    doubt gated placements only): two runs. The task now waits, as a placement does."""
    from swarm.node import events as ev
    from swarm.node.doubt import DOUBT_MIN

    a, b, _, net = _held_at_b(start=False)
    outs = b.state.guest.request_move("t1", "A", 1.0)
    assert outs
    b.queue.remove("t1")
    b.run(b.state.handle(ev.HandoffOutputs(1.0, 1001.0, 1, tuple(outs), ("t1",))))
    a.run(a.state.restarted_after(100.0, 1100.0, alive_at=0.0))  # down long
    assert "t1" in a.state.doubted
    net.settle(100.5, 1100.5)  # the move B sent before A died reaches it now
    t = a.state.records.active["t1"]
    assert (t.state, t.node) == (S.QUEUED, "A") and "back home" in t.history[-1].cause
    assert "t1" not in a.queue and "t1" in a.state.deferred
    _tick(a, 100.0 + DOUBT_MIN)  # no notice came: nobody took it over
    assert a.placements == ["t1"] and not a.state.deferred


def test_no_heartbeat_while_in_doubt_so_a_restart_during_it_doubts_again() -> None:
    """Found by the copies walks (stop 53): a home back after its grace restarted
    again at once; the second start read the first's heartbeat (a short absence),
    was in doubt about nothing, and sent its copies over an adopter's."""
    from swarm.node.doubt import DOUBT_MIN
    from swarm.node.recovery import ALIVE_AT

    a, _ = _copied_at_a()
    a.kv.pop(ALIVE_AT, None)
    a.run(a.state.restarted_after(100.0, 1100.0, alive_at=0.0))  # down long
    assert "t1" in a.state.doubted and ALIVE_AT not in a.kv
    _tick(a, 101.0)
    assert ALIVE_AT not in a.kv  # in doubt: the old heartbeat stands
    _tick(a, 100.0 + DOUBT_MIN)
    assert a.kv[ALIVE_AT] == 1100.0 + DOUBT_MIN  # over: beating again


def test_a_home_in_doubt_sends_its_copies_nothing_until_the_doubt_ends() -> None:
    """Found by the copies walks (stop 53): a home back after its grace sent its
    copies again at once (a restart knows of none held); one went over the copy of
    the node that had adopted the task, out of date, and the old home, told of the
    adoption, let the task go and never released it. None is sent while in doubt."""
    from swarm.node.doubt import DOUBT_MIN

    a, _ = _copied_at_a()
    a.state.sent.clear()  # as after a restart: no copy known to be held
    a.run(a.state.restarted_after(100.0, 1100.0, alive_at=0.0))
    assert "t1" in a.state.doubted and a.state.replica_update("t1") == []
    _tick(a, 101.0)
    assert a.replica_out == []
    _tick(a, 100.0 + DOUBT_MIN)  # over: looked at again at the next tick
    _tick(a, 101.0 + DOUBT_MIN)
    assert [(i.dest, i.msg.kind) for i in a.replica_out] == [("B", "hold")]


def test_an_adopters_copy_is_refused_by_the_old_home_until_it_lets_go() -> None:
    """Found by the copies walks (stop 53): an adopter's copy reached the old home,
    back, before the notice that makes it let go: taken as none (it is the home),
    it was answered as held, and nobody held it. Refused now (sent again later);
    the same copy at the old home's own claim, or an old one, is still none."""
    from swarm.node.replicas import HOLD, ReplicaMsg

    a, _ = _copied_at_a()
    spec = attrs.evolve(a.state.records.active["t1"].spec, home="B")
    copy = ReplicaMsg(HOLD, "t1", "B", None, ("A",), spec, epoch=2)
    why, instrs = a.state.on_replica("B", copy)
    assert why is not None and "held here as its home" in why and instrs == []
    assert "t1" not in a.state.held
    _, instrs = a.state.on_notices("B", (Notice("A", "t1", "B", 2, None, ("A",)),), 1.0, 1001.0)
    a.run(instrs)  # told: A lets it go, then takes the copy
    why, instrs = a.state.on_replica("B", copy)
    assert why is None
    a.run(instrs)
    assert a.state.held["t1"].home == "B" and a.state.held["t1"].epoch == 2


def test_a_move_on_to_another_node_is_refused_during_the_doubt() -> None:
    """Found by the copies walks (stop 53): a move the runner asked for while the home
    was down reached the home, back after its grace, and went through; the runner had
    adopted the task meanwhile, and it ran at both. Refused while in doubt."""
    from swarm.node import events as ev

    a, b, c, net = _held_at_b(start=False)
    outs = b.state.guest.request_move("t1", "C", 1.0)
    b.queue.remove("t1")
    b.run(b.state.handle(ev.HandoffOutputs(1.0, 1001.0, 1, tuple(outs), ("t1",))))
    a.run(a.state.restarted_after(100.0, 1100.0, alive_at=0.0))  # down long
    net.settle(100.5, 1100.5)
    he = a.state.home.entries["t1"]
    assert (he.phase, he.where) == (h.HomePhase.REMOTE, "B")
    assert "t1" not in c.state.guest.entries and "t1" in b.state.guest.entries
    assert "move to C refused" in a.state.explains["t1"][-1]["outcome"]


def test_a_runner_holding_the_copy_of_a_task_it_ran_adopts_it_as_ended() -> None:
    """Found by the copies test with lost homes that come back (stop 52): B ran A's
    task and held its copy; A took B's report of the end, then died before its
    release reached B. B adopted the copy as a new queued task and ran it again; it
    now adopts it as it ended (its own record of the run)."""
    a, b, _, net = _held_at_b()
    why, instrs = b.state.on_replica(
        "A", a.state.hold_msg(a.state.records.active["t1"].spec, ("B",))
    )
    assert why is None
    b.run(instrs)
    a.run(a.state.replicas_chosen("t1", ("B",)))
    b.finish("t1", 1, 1.0, 1001.0)
    net.settle(1.0, 1001.0)  # the report, taken at A (its release to B never goes)
    assert a.state.records.get_cached("t1").state is S.FAILED  # type: ignore[union-attr]
    assert b.state.held["t1"].final is None and "t1" not in b.state.guest.entries
    b.state.members_seen((("A", DEAD),), 2.0)
    for k in range(1, 6):  # a copy's holder adopts a few graces after the home's death
        _tick(b, 2.0 + k * GRACE)
    t = b.state.records.get_cached("t1")
    assert t is not None and (t.spec.home, t.state) == ("B", S.FAILED), t
    assert "adopted from A" in t.history[-1].cause
    assert "t1" not in b.queue and "t1" not in b.placements and "failover.adopted" in b.logs


def test_the_heartbeat_is_journaled_every_few_seconds_while_a_task_is_active() -> None:
    from swarm.node.doubt import ALIVE_EVERY
    from swarm.node.recovery import ALIVE_AT

    (a,) = _nodes("A")
    _tick(a, 1.0)
    assert ALIVE_AT not in a.kv  # idle: nothing a restart could doubt, no write
    a.submit(m.TaskSpec(id="t1", argv=("x",)))
    _tick(a, 2.0)
    assert a.kv[ALIVE_AT] == 1002.0
    _tick(a, 2.0 + ALIVE_EVERY / 2)
    assert a.kv[ALIVE_AT] == 1002.0
    _tick(a, 2.0 + ALIVE_EVERY)
    assert a.kv[ALIVE_AT] == 1002.0 + ALIVE_EVERY
    a.run_here("t1")
    assert a.try_start("t1", wall=1009.0) is None
    a.finish("t1", wall=1010.0)
    _tick(a, 2.0 + 3 * ALIVE_EVERY)
    assert a.kv[ALIVE_AT] == 1002.0 + ALIVE_EVERY  # idle again: the last beat stays


def test_a_malformed_heartbeat_in_the_journal_counts_as_none() -> None:
    """`alive_at` is read back from the journal: anything but a number is no heartbeat
    (the home is then taken to have been down long: it waits, never runs twice)."""
    from swarm.node.doubt import alive_at_of
    from swarm.node.recovery import ALIVE_AT

    assert alive_at_of({ALIVE_AT: 1100}) == 1100.0
    assert alive_at_of({ALIVE_AT: 1100.5}) == 1100.5
    for bad in ("1100", True, None, [1100], {"at": 1}):
        assert alive_at_of({ALIVE_AT: bad}) is None, bad
    assert alive_at_of({}) is None
