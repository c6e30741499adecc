"""The node's periodic work on one deadline, and the global-task wake-up on a peer's
undrain (commit 2abae3e: held global tasks waited for the 10 s timer)."""

from __future__ import annotations

from swarm import model as m
from swarm.node import events as ev
from swarm.node.state import NodeState, Settings
from swarm.policy import shares as sh


def _state(transfer: float | None = 0.5) -> NodeState:
    return NodeState(
        "A",
        ledger=sh.ShareLedger(),
        settings=Settings(report_interval=1.0, transfer_interval=transfer),
    )


def _kinds(instrs: list[ev.Instruction]) -> list[str]:
    return [type(i).__name__ for i in instrs]


def test_one_deadline_serves_every_mechanism_in_turn() -> None:
    s = _state()
    assert s.start_timers(100.0) == [ev.WakeAt(100.0)]  # a report at once
    out = s.wake_all(100.0, 0.0)
    assert _kinds(out) == ["Sample", "WakeAt"]
    assert out[-1] == ev.WakeAt(100.5)  # the next transfer round comes first
    out = s.wake_all(100.5, 0.0)
    assert _kinds(out) == ["TransferRound", "WakeAt"] and out[-1] == ev.WakeAt(101.0)
    out = s.wake_all(101.0, 0.0)  # the report, the transfer round and an idle handoff tick
    assert _kinds(out) == ["Sample", "TransferRound", "WakeAt"]
    out = s.wake_all(130.0, 0.0)  # late: everything due runs once, then a fresh deadline
    assert _kinds(out) == ["Sample", "TransferRound", "SyncGlobals", "WakeAt"]
    assert out[-1] == ev.WakeAt(130.5)


def test_without_transfer_no_round_is_ever_due() -> None:
    s = _state(transfer=None)
    s.start_timers(0.0)
    for t in (0.0, 1.0, 2.0, 31.0):
        assert "TransferRound" not in _kinds(s.wake_all(t, 0.0))


def test_handoff_retries_come_due_faster_while_something_is_in_flight() -> None:
    s = _state(transfer=None)
    s.start_timers(0.0)
    spec = m.TaskSpec(id="t1", argv=("x",), home="A")
    s.records.store(m.new_task(spec, 0.0, "A"))
    why, out = s.offer("t1", "B", 0.0, 0.0)
    assert why is None and any(isinstance(i, ev.SendHandoff) for i in out)
    out = s.wake_all(1.0, 0.0)  # the idle period ran out: the tick resends the offer
    assert any(isinstance(i, ev.SendHandoff) for i in out)
    assert s.due["handoff"] == 1.0 + 0.2  # busy now: the next tick sooner


def test_2abae3e_a_peer_that_undrains_wakes_the_global_tasks_at_once() -> None:
    s = _state()
    drained = m.LoadReport(node="B", version=1, shares=0)
    assert "SyncGlobals" not in _kinds(s.on_peer_report(drained, 0.0, 0.0, 0.0))
    still = m.LoadReport(node="B", version=2, shares=0)
    assert "SyncGlobals" not in _kinds(s.on_peer_report(still, 0.0, 0.0, 0.0))
    back = m.LoadReport(node="B", version=3, shares=1024)
    assert _kinds(s.on_peer_report(back, 0.0, 0.0, 0.0)) == ["SyncGlobals"]
    again = m.LoadReport(node="B", version=4, shares=1024)
    assert "SyncGlobals" not in _kinds(s.on_peer_report(again, 0.0, 0.0, 0.0))


def test_a_local_share_change_publishes_and_wakes_the_global_tasks() -> None:
    assert _state().shares_changed() == [ev.PublishLoad(), ev.SyncGlobals()]


def test_migration_rounds_come_due_on_the_same_deadline() -> None:
    s = NodeState(
        "A",
        ledger=sh.ShareLedger(),
        settings=Settings(report_interval=1.0, migration_period=5.0),
    )
    s.start_timers(0.0)
    assert "MigrationRound" not in _kinds(s.wake_all(0.0, 0.0))
    assert "MigrationRound" in _kinds(s.wake_all(5.0, 0.0))
    assert "MigrationRound" not in _kinds(s.wake_all(6.0, 0.0))
    assert "MigrationRound" in _kinds(s.wake_all(10.0, 0.0))
