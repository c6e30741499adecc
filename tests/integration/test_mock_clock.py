"""A whole agent on trio's MockClock (issue 18): every part reads time from the one
`Clock` the agent is given, so a test drives it, wall times included.

The agent runs in-process (journal, runner, real processes, the local API socket, the
cluster transport on loopback) under pytest-trio's `mock_clock`: virtual time that
never moves by itself (no autojump), only when the test calls `jump()`. Whatever the
agent does between two jumps (journal writes in worker threads, a task's process, a
client in a thread talking to the API socket) happens at one virtual instant, so the
times it records are exact. Autojump would move the clock whenever every trio task
waits, a worker thread's fsync included, and the instants would depend on the disk.
A real-time limit (a thread timer) stops a hung test, since `trio.fail_after` runs on
the frozen clock.
"""

from __future__ import annotations

import io
import os
import pwd
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from swarm import model as m
from swarm.agent import Agent
from swarm.client import Client
from swarm.cluster import handoff as h
from swarm.config import load_config
from swarm.logs import EventLog
from swarm.node.recovery import TOMB_TTL
from swarm.runtime.clock import Clock

W0 = 1_700_000_000.0  # the fixed clock's wall time at virtual time 0
HOME = "n9"  # a peer home that offers this agent a task (no such process: RPCs by hand)


@asynccontextmanager
async def real_time_limit(seconds: float) -> AsyncIterator[None]:
    """Fail after `seconds` of real time (the test's trio clock never moves alone)."""
    token = trio.lowlevel.current_trio_token()
    with trio.CancelScope() as scope:
        timer = threading.Timer(seconds, lambda: token.run_sync_soon(scope.cancel))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
    if scope.cancelled_caught:
        pytest.fail(f"the agent under MockClock did not finish within {seconds} s (real time)")


async def settle(rounds: int = 5) -> None:
    """Let the agent's tasks and its worker threads (journal writes) run, without
    moving the clock."""
    for _ in range(rounds):
        await trio.testing.wait_all_tasks_blocked()
        await trio.to_thread.run_sync(lambda: threading.Event().wait(0.01))


def _agent(tmp: Path, clock: Clock) -> Agent:
    config = load_config(
        env={},
        flags={
            "node-id": "a1", "state-dir": str(tmp / "state"), "socket": str(tmp / "sock"),
            "port": 0, "bind": "127.0.0.1", "insecure": True, "mdns": False, "slots": 2,
            "profile": "local", "join-wait": 0.0, "allow-root-tasks": True, "nvml": False,
        },
    )  # fmt: skip
    return Agent(config, log=EventLog(stream=io.StringIO()), clock=clock)


async def _handoff(agent: Agent, req: h.Request) -> h.Reply:
    """What a peer home's handoff RPC does at this agent's coordinator."""
    raw = await agent.coord.rpc_handoff({"req": h.request_to_wire(req)}, HOME, None)
    return h.reply_from_wire(raw["reply"])


async def test_agent_on_mock_clock(short_tmp: Path, mock_clock: trio.testing.MockClock) -> None:
    clock = Clock.fixed(W0)
    agent = _agent(short_tmp, clock)
    sock = str(short_tmp / "sock")

    def call(op: str, **fields: Any) -> dict[str, Any]:
        with Client(sock, timeout=30) as c:
            return c.call(op, **fields)

    async with real_time_limit(60), trio.open_nursery() as nursery:
        await nursery.start(agent.run)

        # (a) a local submission: placed, started and finished at one virtual instant,
        # and `swarm explain` says so with the fixed clock's wall time
        mock_clock.jump(12.5)
        t_submit = W0 + 12.5
        with Client(sock, timeout=30) as c:
            tid = await trio.to_thread.run_sync(lambda: c.submit(["true"], cwd="/"))
        done = await agent.table.wait_terminal(m.TaskId(tid))
        assert done.state is m.TaskState.SUCCEEDED
        assert done.started_at == t_submit and done.finished_at == t_submit
        assert [tr.at for tr in done.history[1:]] == [t_submit] * (len(done.history) - 1)
        decisions = (await trio.to_thread.run_sync(lambda: call("explain", id=tid)))["decisions"]
        assert decisions, "no placement decision recorded"
        assert {d["at"] for d in decisions} == {t_submit}, decisions
        assert str(decisions[0]["outcome"]).startswith("runs here"), decisions

        # (b) a guest tombstone: a peer home offers a task, then aborts the offer; the
        # tombstone (a late duplicate of that offer must not bring the task back) is
        # stamped with the clock's wall time and journaled
        mock_clock.jump(100.0 - 12.5)
        t_abort = W0 + 100.0
        me = os.getuid()
        spec = m.TaskSpec(
            id=m.TaskId("tguest"), argv=("true",), cwd="/", home=HOME, uid=me,
            user=pwd.getpwuid(me).pw_name,
        )  # fmt: skip
        assert (await _handoff(agent, h.Offer(spec.id, 1, spec))).ok
        assert (await _handoff(agent, h.Abort(spec.id, 1))).ok
        assert agent.coord.guest.tombstones == {spec.id: 1}
        assert agent.coord.tomb_at == {spec.id: t_abort}
        await agent.journal.commit([], must_land=True)
        assert agent.journal.recover().kv.get("tomb:" + spec.id) == [1, t_abort]
        stale = await _handoff(agent, h.Offer(spec.id, 1, spec))
        assert not stale.ok and "stale" in stale.reason

        # 599 s later (virtual): the handoff loop has looked, the tombstone stays
        mock_clock.jump(TOMB_TTL - 1.0)
        await settle()
        assert agent.coord.tomb_at == {spec.id: t_abort}
        assert spec.id in agent.coord.guest.tombstones
        # past the TTL: forgotten, in memory and in the journal, without waiting 600 s
        mock_clock.jump(2.0)
        await settle()
        assert agent.coord.tomb_at == {}
        assert spec.id not in agent.coord.guest.tombstones
        await agent.journal.commit([], must_land=True)
        assert "tomb:" + spec.id not in agent.journal.recover().kv
        # so an offer of the same epoch is a new offer again
        assert (await _handoff(agent, h.Offer(spec.id, 1, spec))).ok
        assert (await _handoff(agent, h.Abort(spec.id, 1))).ok

        agent.request_stop()
    assert agent.coord.tomb_at == {spec.id: W0 + 100.0 + TOMB_TTL + 1.0}
    # stopped: a task's end that comes now (the runner outlives the driver while the
    # agent stops) starts nothing and raises nothing (chaos agent-restart, stop 52:
    # "Nursery is closed to new arrivals" from its load publication)
    agent.coord.load_changed()
    agent.coord._spawn(trio.sleep, 0)


def test_clock_readings() -> None:
    """The agent builds its system clock before trio.run: it takes its offset inside
    (trio's clock starts anywhere). A fixed clock is its wall at zero plus trio time."""
    system = Clock.system()
    assert not system.synced
    assert abs(system.wall() - time.time()) < 5  # outside trio.run: the system clock
    fixed = Clock.fixed(W0)
    mock = trio.testing.MockClock()

    async def main() -> None:
        assert fixed.now() == 0.0 and fixed.wall() == W0
        mock.jump(7.0)
        assert fixed.wall() == W0 + 7.0
        assert fixed.resync() == 0.0 and fixed.offset == W0  # never follows the system
        assert system.resync() == 0.0 and system.synced  # the first sync moves nothing
        assert abs(system.wall() - time.time()) < 5
        system.offset -= 30.0  # as if the system clock had been stepped 30 s forward
        assert abs(system.resync() - 30.0) < 5

    trio.run(main, clock=mock)
