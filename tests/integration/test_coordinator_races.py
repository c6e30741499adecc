"""Races in the node's driver found under load (real journal, runner and processes)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio

from swarm import model as m
from swarm.cluster import handoff as h
from swarm.cluster.membership import EventKind, MemberEvent
from swarm.node import decide
from swarm.node import placing as placing_mod
from swarm.policy import placement as pl
from tests.integration.test_chaos_regressions import node_with_driver


async def test_holder_declared_dead_while_the_placement_waits_for_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen with 8 loaded agents: the home handed a task to s1, s1 was (falsely)
    declared dead 25 ms later, the task was re-queued at home, but the placement
    coroutine was still between "committed" and its exit, so place_soon() was a no-op
    and nothing placed the task again. It sat queued forever."""
    table, runner, _, coord = node_with_driver(tmp_path, shares=1024, slots=2)
    spec = m.TaskSpec(id="trace1", argv=("true",), home="n1", cwd="/")
    real_place = pl.place
    calls = {"n": 0}

    def place(spec: m.TaskSpec, local: m.LoadReport, *a: Any, **kw: Any) -> pl.Placement:
        calls["n"] += 1
        if calls["n"] == 1:  # first decision: the peer n2
            return pl.Placement(spec.id, "n2", False, (), "chose n2", 1, 1, True)
        return real_place(spec, local, *a, **kw)

    monkeypatch.setattr(placing_mod.pl, "place", place)
    async with trio.open_nursery() as nursery:
        await nursery.start(table.journal.run)
        await nursery.start(runner.run)
        await nursery.start(coord.run)
        await table.add(m.new_task(spec, time.time(), "n1"))
        coord.place_soon(spec.id)
        with trio.fail_after(10):
            while (e := coord.home.entries.get(spec.id)) is None or e.phase is not (
                h.HomePhase.OFFERING
            ):
                await trio.sleep(0.01)
        # the handoff to n2 completes (accepted and committed) ...
        offer_req = h.Offer(spec.id, e.offer_epoch, e.spec)
        now, wall = coord.clock.now(), coord.clock.wall()
        reply = h.Reply(spec.id, offer_req.epoch, True)
        await coord.execute(coord.state.on_reply("n2", offer_req, reply, now, wall))
        assert table.active[spec.id].node == "n2"
        # ... and n2 is declared dead right after, while the placement job winds up
        dead = m.Member(node="n2", addr="127.0.0.1", port=1)
        coord.on_event(MemberEvent(EventKind.DEAD, dead, trio.current_time()))
        with trio.fail_after(30):
            done = await table.wait_terminal(spec.id)
        assert done.state is m.TaskState.SUCCEEDED and done.node == "n1"
        assert any("died: re-queued" in t.cause for t in done.history)
        nursery.cancel_scope.cancel()


def test_the_random_baseline_ignores_load_and_shares(tmp_path: Path) -> None:
    """bench/placement.py compares two choices against this baseline: it must be
    uniform over eligible nodes (an earlier version silently used two choices)."""
    _, _, _, coord = node_with_driver(tmp_path, shares=1024, slots=2)
    for node, shares, weight in (("a", 4096, 0.0), ("b", 512, 40.0), ("c", 1024, 3.0)):
        coord.view.upsert(m.LoadReport(node=node, version=1, shares=shares, weight_sum=weight), 0.0)
    coord.view.upsert(m.LoadReport(node="d", version=1, shares=0), 0.0)  # drained: never
    spec = m.TaskSpec(id="tr", argv=("true",), home="n1")
    local = coord.local_report()
    from collections import Counter

    picks = Counter(
        decide.place_random("n1", spec, local, coord.view, coord.rng, frozenset()).target
        for _ in range(4000)
    )
    assert set(picks) == {"n1", "a", "b", "c"}
    assert all(800 <= n <= 1200 for n in picks.values()), picks
