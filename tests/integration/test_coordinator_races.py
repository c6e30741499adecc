"""Races in the coordinator found under load (real journal, runner and processes)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio

from swarm import model as m
from swarm.cluster import handoff as h
from swarm.cluster.membership import EventKind, MemberEvent
from swarm.policy import placement as pl
from swarm.runtime import coordinator as coord_mod
from swarm.runtime.coordinator import Coordinator
from tests.integration.test_chaos_regressions import _node


async def test_holder_declared_dead_while_the_placement_waits_for_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen with 8 loaded agents: the home handed a task to s1, s1 was (falsely)
    declared dead 25 ms later, the task was re-queued at home, but the placement
    coroutine was still between "committed" and its exit, so place_soon() was a no-op
    and nothing placed the task again. It sat queued forever."""
    table, runner, _ = _node(tmp_path, shares=1024, slots=2)
    coord = runner.can_start.__self__  # type: ignore[union-attr]
    assert isinstance(coord, Coordinator)
    spec = m.TaskSpec(id="trace1", argv=("true",), home="n1", cwd="/")
    real_place = pl.place
    calls = {"n": 0}

    def place(spec: m.TaskSpec, local: m.LoadReport, *a: Any, **kw: Any) -> pl.Placement:
        calls["n"] += 1
        if calls["n"] == 1:  # first decision: the peer n2
            return pl.Placement(spec.id, "n2", False, (), "chose n2", 1, 1, True)
        return real_place(spec, local, *a, **kw)

    async def offer(tid: m.TaskId, target: m.NodeId) -> tuple[bool, str]:
        # the handoff to n2 completes (accepted and committed) ...
        table.change(tid, m.TaskState.TRANSFERRING, f"offering to {target}", node="n1")
        outs = coord.home.offer(spec, target, trio.current_time())
        offer_req = next(o.request for o in outs if isinstance(o, h.Send))
        assert isinstance(offer_req, h.Offer)
        done = coord.home.on_offer_reply(
            offer_req, h.Reply(tid, offer_req.epoch, True), trio.current_time()
        )
        for o in done:
            if not isinstance(o, h.Send):
                await coord._decide(o)
        assert table.active[tid].node == target
        # ... and n2 is declared dead before this coroutine returns
        dead = m.Member(node=target, addr="127.0.0.1", port=1)
        coord.on_event(MemberEvent(EventKind.DEAD, dead, trio.current_time()))
        await trio.sleep(0.05)
        return True, ""

    monkeypatch.setattr(coord_mod.pl, "place", place)
    monkeypatch.setattr(coord, "offer_home_task", offer)
    async with trio.open_nursery() as nursery:
        await nursery.start(table.journal.run)
        await nursery.start(runner.run)
        await nursery.start(coord.run)
        await table.add(m.new_task(spec, time.time(), "n1"))
        coord.place_soon(spec.id)
        with trio.fail_after(30):
            done = await table.wait_terminal(spec.id)
        assert done.state is m.TaskState.SUCCEEDED and done.node == "n1"
        assert any("died: re-queued" in t.cause for t in done.history)
        nursery.cancel_scope.cancel()


def test_the_random_baseline_ignores_load_and_shares(tmp_path: Path) -> None:
    """bench/placement.py compares two choices against this baseline: it must be
    uniform over eligible nodes (an earlier version silently used two choices)."""
    _, runner, _ = _node(tmp_path, shares=1024, slots=2)
    coord = runner.can_start.__self__  # type: ignore[union-attr]
    assert isinstance(coord, Coordinator)
    coord.placement_rule = "random"
    for node, shares, weight in (("a", 4096, 0.0), ("b", 512, 40.0), ("c", 1024, 3.0)):
        coord.view.upsert(m.LoadReport(node=node, version=1, shares=shares, weight_sum=weight), 0.0)
    coord.view.upsert(m.LoadReport(node="d", version=1, shares=0), 0.0)  # drained: never
    spec = m.TaskSpec(id="tr", argv=("true",), home="n1")
    local = coord.local_report()
    from collections import Counter

    picks = Counter(coord._place_random(spec, local, 0.0, frozenset()).target for _ in range(4000))
    assert set(picks) == {"n1", "a", "b", "c"}
    assert all(800 <= n <= 1200 for n in picks.values()), picks
