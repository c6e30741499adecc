"""The placement machine of NodeState: the fast path, offers, refusals, back-off and
wake-ups, and the benchmark's random rule (commit 7edd1a8: it was never wired)."""

from __future__ import annotations

import random

from swarm import model as m
from swarm.node import events as ev
from swarm.node.state import NodeState, Settings
from swarm.policy import shares as sh

from .node_harness import FakeNet, FakeNode, busy, gossip

S = m.TaskState


def _flatten(instrs: list[ev.Instruction]) -> list[ev.Instruction]:
    out: list[ev.Instruction] = []
    for i in instrs:
        out += _flatten(list(i.instructions)) if isinstance(i, ev.Later) else [i]
    return out


def test_alone_a_task_runs_here_at_once_with_no_job() -> None:
    a = FakeNode("A")
    a.submit(m.TaskSpec(id="t1", argv=("x",)))
    out = a.state.place("t1", 0.0, 5.0)
    assert "t1" not in a.state.jobs
    assert ev.Enqueue("t1") in out
    (explain,) = [i for i in out if isinstance(i, ev.Explain)]
    assert explain.record["outcome"].startswith("runs here") and explain.record["at"] == 5.0


def test_a_busier_home_offers_to_an_idle_peer_and_the_job_ends_when_it_is_handed() -> None:
    a, b = FakeNode("A"), FakeNode("B")
    net = FakeNet(a, b)
    busy(a, 6)
    gossip(a, b)
    a.submit(m.TaskSpec(id="t2", argv=("x",)))
    a.run(a.state.place("t2", 0.0, 0.0))
    assert a.state.jobs["t2"].offered is not None
    assert a.state.records.active["t2"].state is S.TRANSFERRING
    net.deliver("A")  # the offer; its acceptance decides the job
    assert "t2" not in a.state.jobs
    assert a.state.records.active["t2"].node == "B"
    assert a.state.explains["t2"][-1]["outcome"] == "handed to B"


def test_a_refusal_is_recorded_and_the_next_choice_excludes_the_refuser() -> None:
    a, b = FakeNode("A"), FakeNode("B")
    busy(a, 6)
    gossip(a, b)
    a.submit(m.TaskSpec(id="t3", argv=("x",)))
    a.run(a.state.place("t3", 0.0, 0.0))
    send = a.outbox.popleft()
    reply, instrs = b.state.on_request("A", send.request, 0.0, 0.0, refusal="no room")
    b.run(instrs)
    a.run(a.state.on_reply("B", send.request, reply, 0.0, 0.0))
    outcomes = [r["outcome"] for r in a.state.explains["t3"]]
    assert "B refused: no room" in outcomes
    # B excluded: the only other choice is here, where admission agrees
    assert outcomes[-1].startswith("runs here")
    assert "t3" in a.queue and "t3" not in a.state.jobs


def test_no_eligible_node_backs_off_and_a_wake_after_the_back_off_places_it() -> None:
    a = FakeNode("A", shares=1024)
    a.ledger.set_shares(0)  # drained: nowhere to run, not even here
    a.submit(m.TaskSpec(id="t4", argv=("x",)))
    out = _flatten(a.state.place("t4", 0.0, 0.0))
    (wake,) = [i for i in out if isinstance(i, ev.WakeAt)]
    assert wake.at > 0.0 and a.state.explains["t4"][-1]["outcome"].startswith("waiting")
    assert a.state.wake(wake.at / 2, 0.0) == [ev.WakeAt(wake.at)]  # too early: same deadline
    a.ledger.set_shares(1024)
    out = a.state.wake(wake.at, 1.0)
    assert ev.Enqueue("t4") in out and "t4" not in a.state.jobs


def test_7edd1a8_the_random_rule_is_the_one_that_decides() -> None:
    state = NodeState(
        "A",
        ledger=sh.ShareLedger(),
        settings=Settings(placement_rule="random"),
        rng=random.Random(3),
    )
    state.records.store(m.new_task(m.TaskSpec(id="t5", argv=("x",), home="A"), 0.0, "A"))
    out = state.place("t5", 0.0, 0.0)
    (explain,) = [i for i in out if isinstance(i, ev.Explain)]
    assert "random" in str(explain.record)


def test_a_task_whose_checkpoint_is_here_runs_here_and_is_pinned() -> None:
    """The runtime tells the state where checkpoints are (note_state); placement and
    transfer read that, never the disk."""
    a, b = FakeNode("A"), FakeNode("B")
    busy(a, 6)
    gossip(a, b)
    spec = a.submit(m.TaskSpec(id="ck", argv=("x",), migrate=m.MigrateMode.CHECKPOINT))
    a.state.note_state(spec.id, True)
    out = _flatten(a.state.place("ck", 0.0, 0.0))
    a.run(out)
    assert ev.Enqueue("ck") in out
    assert a.state.explains["ck"][-1]["outcome"] == "runs here: its checkpoint is here"
    (q,) = [q for q in a.state.queue_view(0.0) if q.id == "ck"]
    assert q.pinned
    a.state.note_state(spec.id, False)  # its state went: it is placed like any task
    assert not next(q for q in a.state.queue_view(0.0) if q.id == "ck").pinned


def test_stimuli_through_handle_give_the_methods_instructions_in_order() -> None:
    """The driver feeds NodeState.handle(*stimuli); several stimuli at once give each
    one's instructions in turn."""
    a = FakeNode("A")
    for tid in ("h1", "h2"):
        a.submit(m.TaskSpec(id=tid, argv=("x",)))
    out = a.state.handle(ev.PlaceTask(0.0, 1.0, "A/1", "h1"), ev.PlaceTask(0.0, 1.0, "A/2", "h2"))
    assert [i for i in out if isinstance(i, ev.Enqueue)] == [ev.Enqueue("h1"), ev.Enqueue("h2")]
    assert a.state.handle(ev.PlaceTask(0.0, 1.0, "A/3", "nope")) == []  # nothing to place


def test_late_binding_holds_a_task_at_a_busy_home_and_cancels_when_it_starts_there() -> None:
    """Issue 24: with late binding on, a home with no room keeps the task in its own
    queue and sends reservations to peers (policy/latebind.py); when it starts at home,
    the reservations are cancelled. A home with room places as before."""
    from swarm.policy.latebind import Cancel, LateConfig, Reserve

    late = Settings(late=LateConfig(d=2, sample=4))
    a, b, c = (FakeNode(n, settings=late) for n in ("A", "B", "C"))
    a.submit(m.TaskSpec(id="t0", argv=("x",)))
    out = _flatten(a.state.place("t0", 0.0, 0.0))  # room here: no hold
    assert not [i for i in out if isinstance(i, ev.SendLate)] and ev.Enqueue("t0") in out
    busy(a, 1)
    gossip(a, b, c)
    a.submit(m.TaskSpec(id="t6", argv=("x",)))
    out = _flatten(a.state.place("t6", 0.0, 0.0))
    assert ev.Enqueue("t6") in out and "t6" not in a.state.jobs
    (send,) = [i for i in out if isinstance(i, ev.SendLate)]
    assert sorted(send.msgs, key=lambda x: x.peer) == [Reserve("B", "t6"), Reserve("C", "t6")]
    assert "held here (late binding)" in a.state.explains["t6"][-1]["outcome"]
    assert a.state.late is not None and a.state.late.is_held("t6")
    task = a.state.records.active["t6"]
    out = a.state.handle(ev.TaskStarted(1.0, 1.0, "s1", task))
    (send,) = [i for i in out if isinstance(i, ev.SendLate)]
    assert sorted(send.msgs, key=lambda x: x.peer) == [Cancel("B", "t6"), Cancel("C", "t6")]
    assert not a.state.late.is_held("t6")
    assert a.state.explains["t6"][-1]["outcome"].startswith("started here before")
    assert a.state.counters["late_held"] == 1


def test_late_binding_leaves_data_and_gpu_tasks_to_placement() -> None:
    from swarm.policy.latebind import LateConfig

    a, b = (FakeNode(n, settings=Settings(late=LateConfig(d=1, sample=1))) for n in ("A", "B"))
    busy(a, 1)
    gossip(a, b)
    a.submit(m.TaskSpec(id="t7", argv=("x",), data=("k1",)))
    out = _flatten(a.state.place("t7", 0.0, 0.0))
    assert not [i for i in out if isinstance(i, ev.SendLate)]
    assert a.state.late is not None and not a.state.late.is_held("t7")


def test_a_peers_report_made_before_it_took_our_offers_does_not_wipe_their_charges() -> None:
    """Issue 23: each offer stays counted in the home's view of its target until a
    report the target made after taking it arrives (the target stamps its "yes" with
    its reports' clock). A report that left before (gossip is a few hundred ms behind
    a burst) used to wipe them, and the next placements piled onto that peer."""
    a, b = FakeNode("A"), FakeNode("B")
    net = FakeNet(a, b)
    busy(a, 6)
    gossip(a, b, at=1.0)
    stale = b.state.local_report(1.5)  # B's next report, made before the offers came
    for k in range(3):
        a.submit(m.TaskSpec(id=f"c{k}", argv=("x",)))
        a.run(a.state.place(f"c{k}", 0.0, 2.0))
    net.settle(wall=2.0)  # B takes all three at its 2,000 ms
    assert all(a.state.records.active[f"c{k}"].node == "B" for k in range(3))
    assert a.state.view["B"].report.queued == 3  # charged once each (offer, not commit)
    a.run(a.state.on_peer_report(stale, 1.6, 0.1, 2.1))
    assert a.state.view["B"].report.queued == 3  # stale 0 + the 3 it lacks
    fresh = b.state.local_report(2.5)
    assert fresh.queued == 3
    a.run(a.state.on_peer_report(fresh, 2.6, 0.2, 2.6))
    assert a.state.view["B"].report.queued == 3  # B's own count, never twice
    assert a.state.charges.pending("B") == 0


def test_a_push_is_charged_when_taken_and_a_report_made_after_replaces_the_charge() -> None:
    """An offer not made by a placement (a transfer's push, a move) is charged when the
    peer takes it, with the peer's stamp, so a report made after replaces it at once
    (it used to be charged at the commit, unstamped, and would have stood 10 s)."""
    a, b = FakeNode("A"), FakeNode("B")
    net = FakeNet(a, b)
    gossip(a, b, at=1.0)
    spec = a.submit(m.TaskSpec(id="p1", argv=("x",)))
    a.run_here(spec.id)
    a.run(a.state.offer(spec.id, "B", 0.0, 2.0)[1])  # a push: no placement charged it
    assert a.state.charges.pending("B") == 0
    net.settle(wall=2.0)
    assert a.state.records.active["p1"].node == "B"
    assert a.state.view["B"].report.queued == 1 and a.state.charges.pending("B") == 1
    fresh = b.state.local_report(2.5)
    a.run(a.state.on_peer_report(fresh, 2.6, 0.2, 2.6))
    assert a.state.view["B"].report.queued == 1 and a.state.charges.pending("B") == 0
