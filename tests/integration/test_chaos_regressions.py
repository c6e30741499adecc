"""Regression tests for agent bugs the chaos suite found (see docs/chaos.md).

Each drives the real runtime pieces (journal, task table, runner, coordinator,
executor with real processes) in one trio run, without a cluster.
"""

from __future__ import annotations

import io
import itertools
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing

from swarm import model as m
from swarm import wire
from swarm.agent import Agent
from swarm.cluster.membership import EventKind, LoadUpdated, MemberEvent
from swarm.config import load_config
from swarm.logs import EventLog
from swarm.policy.shares import ShareLedger
from swarm.runtime.api import PeerCred
from swarm.runtime.driver import Driver
from swarm.runtime.executor import Executor
from swarm.runtime.journal import Event as JEvent
from swarm.runtime.journal import Journal
from swarm.runtime.runner import LocalRunner
from swarm.runtime.tasks import TaskTable


def _node(tmp: Path, shares: int, slots: int) -> tuple[TaskTable, LocalRunner, ShareLedger]:
    table, runner, ledger, _ = node_with_driver(tmp, shares, slots)
    return table, runner, ledger


def node_with_driver(
    tmp: Path, shares: int, slots: int
) -> tuple[TaskTable, LocalRunner, ShareLedger, Driver]:
    """A node's real parts (journal, table, runner, driver) without a network."""
    journal = Journal(tmp / "journal.db", node="n1")
    table = TaskTable(journal, "n1")
    parts: dict[str, Driver] = {}
    runner = LocalRunner(
        table, Executor(kill_grace=1.0), node="n1", slots=slots, log_dir=tmp / "logs",
        state_dir=tmp,
        can_start=lambda t: parts["driver"].can_start(t),
        on_started=lambda t: parts["driver"].on_started(t),
        on_finished=lambda t: parts["driver"].on_finished(t),
    )  # fmt: skip
    ledger = ShareLedger(shares)
    parts["driver"] = Driver(
        node="n1", table=table, journal=journal, runner=runner, cluster=None, ledger=ledger,
        log=runner.log, clock=table.clock,
    )  # fmt: skip
    return table, runner, ledger, parts["driver"]


async def test_reservations_queued_together_never_oversubscribe(tmp_path: Path) -> None:
    """Found by the chaos canary: two tasks reserving 600 of 1024 shares, queued when
    the runner's dispatch pass came, both passed the start gate in that one pass
    (the ledger learnt of the first start only later, in the task's own coroutine), so
    both ran at once; the second's late ledger.start then failed and its shares were
    never counted, letting later starts oversubscribe further."""
    table, runner, ledger = _node(tmp_path, shares=1024, slots=4)
    peak: list[int] = []
    started = runner.on_started
    assert started is not None

    def watch(task: m.Task) -> None:
        started(task)
        peak.append(ledger.reserved)

    runner.on_started = watch
    specs = [
        m.TaskSpec(id=f"t{i}", argv=("sleep", "0.3"), reserve_shares=600, home="n1", cwd="/")
        for i in range(3)
    ]
    async with trio.open_nursery() as nursery:
        await nursery.start(table.journal.run)
        for s in specs:
            await table.add(m.new_task(s, time.time(), "n1"))
            ledger.add(s)
            runner.queue.append(s.id)  # all queued before the first dispatch pass
        await nursery.start(runner.run)
        with trio.fail_after(30):
            for s in specs:
                await table.wait_terminal(s.id)
        nursery.cancel_scope.cancel()
    done = [table.get_cached(s.id) for s in specs]
    assert all(t is not None and t.state is m.TaskState.SUCCEEDED for t in done)
    spans = sorted((t.started_at or 0.0, t.finished_at or 0.0) for t in done if t is not None)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, f"two 600-share reservations ran at once: {spans}"
    assert peak and max(peak) <= 1024, peak
    assert ledger.reserved == 0 and len(ledger) == 0


def _fields(obj: dict[str, object]) -> wire.Fields:
    return wire.Fields(obj, "test request")


def _agent(tmp: Path, slots: int = 1) -> Agent:
    config = load_config(
        env={},
        flags={
            "node-id": "a1", "state-dir": str(tmp / "state"), "socket": str(tmp / "sock"),
            "port": 0, "bind": "127.0.0.1", "insecure": True, "mdns": False, "slots": slots,
            "profile": "local", "join-wait": 0.0, "allow-root-tasks": True,
        },
    )  # fmt: skip
    return Agent(config, log=EventLog(stream=io.StringIO()))


def _hold_share_writes(agent: Agent) -> tuple[trio.Event, trio.Event]:
    """Make the journal write of the next shares change wait: (in flight, release)."""
    in_flight, release = trio.Event(), trio.Event()
    real_commit = agent.journal.commit

    async def slow_commit(ops: Iterable[Any], **kw: Any) -> None:
        ops = list(ops)
        if not in_flight.is_set() and any(
            isinstance(o, JEvent) and o.kind == "shares" for o in ops
        ):
            in_flight.set()
            await release.wait()
        await real_commit(ops, **kw)

    agent.journal.commit = slow_commit  # type: ignore[method-assign]
    return in_flight, release


CRED = PeerCred(os.getpid(), os.getuid(), os.getgid())


async def test_a_drain_is_in_force_while_its_journal_write_is_in_flight(short_tmp: Path) -> None:
    """Found by the chaos canary: `swarm drain` journaled the change (stamped before the
    write) and only then set the shares, so a task could start during the write, after
    the time the journal gives the drain: a start on a drained node, in the journal."""
    agent = _agent(short_tmp)
    async with trio.open_nursery() as nursery:
        await nursery.start(agent.run)
        in_flight, release = _hold_share_writes(agent)
        blocker = await agent.ops.op_submit(_fields({"argv": ["sleep", "0.5"], "cwd": "/"}), CRED)
        waiting = await agent.ops.op_submit(_fields({"argv": ["true"], "cwd": "/"}), CRED)
        with trio.fail_after(30):
            while (b := agent.table.get_cached(blocker["id"])) is None or (
                b.state is not m.TaskState.RUNNING
            ):
                await trio.sleep(0.02)
        drained = trio.Event()

        async def drain() -> None:
            await agent.ops.shares.op_shares(_fields({"drain": True}), CRED)
            drained.set()

        nursery.start_soon(drain)
        await in_flight.wait()
        # the only slot frees up while the drain's journal write is in flight
        await agent.table.wait_terminal(blocker["id"])
        await trio.sleep(0.5)  # the runner's chance to start the waiting task (it must not)
        t = agent.table.get_cached(waiting["id"])
        assert t is not None and t.state is m.TaskState.QUEUED, t
        release.set()
        await drained.wait()
        await agent.ops.shares.op_shares(_fields({"undrain": True}), CRED)
        with trio.fail_after(30):
            done = await agent.table.wait_terminal(waiting["id"])
        assert done.state is m.TaskState.SUCCEEDED
        agent.request_stop()


async def test_a_slow_drain_does_not_land_after_the_undrain_that_followed_it(
    short_tmp: Path,
) -> None:
    """Found while writing the test above: two share changes ran concurrently, so a
    drain whose write was slow finished after the undrain that followed it. The node
    stayed drained in memory while its journal said undrained (and would say so after
    a restart). Changes are now serialized: the last one asked for is the one in force."""
    agent = _agent(short_tmp)
    async with trio.open_nursery() as nursery:
        await nursery.start(agent.run)
        in_flight, release = _hold_share_writes(agent)
        async with trio.open_nursery() as ops:
            ops.start_soon(agent.ops.shares.op_shares, _fields({"drain": True}), CRED)
            await in_flight.wait()
            ops.start_soon(agent.ops.shares.op_shares, _fields({"undrain": True}), CRED)
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        assert agent.ledger.shares == 1024
        assert agent.journal.recover().kv.get("shares") == agent.ledger.shares
        agent.request_stop()


async def _settle_until(done: Callable[[], bool], wall: float = 30.0) -> None:
    """Settle until `done()` or `wall` real seconds (a loaded machine may take seconds
    for the journal's thread work; a count of rounds was a flake under load)."""
    end = time.monotonic() + wall
    while not done() and time.monotonic() < end:
        await _settle_threads(1)


async def _settle_threads(rounds: int = 5) -> None:
    """Let worker threads (journal writes) and the tasks waiting on them run, without
    touching trio's clock (the test runs on a clock that never moves)."""
    for _ in range(rounds):
        await trio.testing.wait_all_tasks_blocked()
        await trio.to_thread.run_sync(time.sleep, 0.02)


async def test_global_tasks_held_by_a_drained_cluster_start_at_the_undrain(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """Found by the chaos canary: a global task submitted while every node was drained
    waited for the globals loop's timer (10 s) after the undrain, on every node. Now a
    local or a peer's undrain starts it at once. The clock here never moves, so only
    the undrain itself can start it."""
    table, runner, _, coord = node_with_driver(tmp_path, shares=0, slots=2)
    spec = m.TaskSpec(id="tglobal", argv=("true",), is_global=True, home="n1", cwd="/")
    peer = m.LoadReport(node="n2", version=1, shares=0)
    async with trio.open_nursery() as nursery:
        try:
            await nursery.start(table.journal.run)
            await nursery.start(runner.run)
            await nursery.start(coord.run)
            coord.on_event(LoadUpdated(peer, 0.0))
            await coord.globals_io.add(spec)
            await _settle_threads()
            assert table.get_cached(spec.id) is None  # no node has shares: held back
            # a peer undrains: its report says so
            coord.on_event(LoadUpdated(attrs.evolve(peer, version=2, shares=1024), 0.0))
            await _settle_until(lambda: table.get_cached(spec.id) is not None)
            t = table.get_cached(spec.id)
            assert t is not None, "the global task did not start when a peer undrained"
        finally:
            # this clock never moves by itself: let the shutdown's timers run, or a
            # failed assertion above would hang the cancel for ever
            mock_clock.autojump_threshold = 0
            nursery.cancel_scope.cancel()


async def test_a_local_undrain_starts_held_global_tasks(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    table, runner, ledger, coord = node_with_driver(tmp_path, shares=0, slots=2)
    spec = m.TaskSpec(id="tglobal2", argv=("true",), is_global=True, home="n1", cwd="/")
    async with trio.open_nursery() as nursery:
        try:
            await nursery.start(table.journal.run)
            await nursery.start(runner.run)
            await nursery.start(coord.run)
            await coord.globals_io.add(spec)
            await _settle_threads()
            assert table.get_cached(spec.id) is None
            ledger.set_shares(1024)
            coord.shares_changed()  # what `swarm undrain` calls
            await _settle_until(lambda: table.get_cached(spec.id) is not None)
            assert table.get_cached(spec.id) is not None, "not started at the local undrain"
        finally:
            mock_clock.autojump_threshold = 0  # as above: never hang the cancel
            nursery.cancel_scope.cancel()


async def test_a_home_that_restarted_mid_offer_places_the_task_again_when_it_fails(
    tmp_path: Path,
) -> None:
    """Found by the chaos suite (flapping: acked-task-terminal): the home was killed
    while offering a task to n1; after the restart the handoff core resumed the offer,
    n1 then died, the offer failed and the task went back to QUEUED at its home, where
    nothing placed it again (only a placement coroutine of the previous life had been
    waiting for that outcome). It never ran."""
    table, runner, _, coord = node_with_driver(tmp_path, shares=1024, slots=2)
    spec = m.TaskSpec(id="toffer", argv=("true",), home="n1", cwd="/")
    # what the journal of the previous life holds: the task TRANSFERRING, the home's
    # handoff entry OFFERING it to n2, and nobody in this life waiting for the outcome
    task = m.new_task(spec, time.time(), "n1")
    task = m.transition(task, m.TaskState.TRANSFERRING, time.time(), "offering to n2")
    table.load([task])
    coord.home.offer(spec, "n2", 0.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(table.journal.run)
        await nursery.start(runner.run)
        await nursery.start(coord.run)
        n2 = m.Member(node="n2", addr="127.0.0.1", port=1)
        coord.on_event(MemberEvent(EventKind.DEAD, n2, trio.current_time()))
        with trio.fail_after(30):
            done = await table.wait_terminal(spec.id)
        assert done.state is m.TaskState.SUCCEEDED and done.node == "n1"
        nursery.cancel_scope.cancel()
