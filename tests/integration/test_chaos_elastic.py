"""The elastic scenario (issue 25: scale-in while a split cuts the cluster in two).

Its checks (chaos/invariants.py, elastic section) on synthetic hook calls and journals:
`scale-double-action` counts the nodes named by scale-in hook calls in each in-cooldown
window against `bound_double_action(max_step, sides in force)` and names a planted
excess; `scale-in-victim-idle` names a victim that was running or holding work when
its hook ran. The recorder and the agents' config are checked as the agents use them,
and the scenario itself runs once on real agents (netns when root)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio

from chaos import elastic as el
from chaos import invariants as inv
from chaos.journals import JournalData, ScaleEvent, TransitionEvent, read_journal
from chaos.schedule import make_plan
from chaos.suites import FULL, SMOKE, find
from swarm.cluster.actor import bound_double_action
from swarm.config import load_config
from swarm.runtime.journal import Event, Journal
from swarm.runtime.scalehooks import run_hook

REPO = Path(__file__).resolve().parents[2]
T0 = 1_000_000.0
C = 8.0  # in-cooldown of the synthetic runs
SPLIT = inv.FaultWindow("split", frozenset(), T0 + 10.0, T0 + 30.0)
SEED = 1000 + len(FULL) - 1  # the seed `make chaos` gives the scenario (it is the last)


def call(
    at: float, nodes: tuple[str, ...], actor: str = "n1", epoch: int = 1, attempt: int = 0
) -> inv.HookCall:
    return inv.HookCall(T0 + at, "in", nodes, actor, epoch, attempt)


def decided(node: str, at: float, victims: tuple[str, ...], epoch: int = 1) -> ScaleEvent:
    return ScaleEvent(0, T0 + at, node, "chaos", "in", len(victims), victims, epoch, "decide")


def journals(*events: ScaleEvent) -> dict[str, JournalData]:
    out: dict[str, list[ScaleEvent]] = {}
    for e in events:
        out.setdefault(e.node, []).append(e)
    return {n: JournalData(n, {}, (), (), scale=tuple(es)) for n, es in out.items()}


def double(
    calls: list[inv.HookCall],
    js: dict[str, JournalData],
    cuts: Sequence[inv.FaultWindow] = (),
) -> inv.DoubleOutcome:
    return inv.check_double_action(calls, js, list(cuts), in_cooldown=C, max_step=1, slack=4.0)


# ------------------------------------------------------------ double action


def test_one_removal_per_cooldown_passes_and_the_bound_is_the_stated_one() -> None:
    calls = [call(1, ("n2",)), call(9.6, ("n3",)), call(18, ("n4",))]
    out = double(calls, {})
    assert out.violations == () and out.peak == {1: 1} and out.doubles == 0
    assert [r.node for r in out.removals] == ["n2", "n3", "n4"]
    assert bound_double_action(1, 2) == 2 and bound_double_action(4, 1) == 4


def test_a_planted_third_victim_in_one_window_breaks_the_bound_of_a_split() -> None:
    # during the split each side's actor removed one node: the stated double action
    calls = [call(12, ("n2",), "n1"), call(14, ("n4",), "n5", 2)]
    ok = double(calls, {}, [SPLIT])
    assert ok.violations == () and ok.peak == {2: 2} and ok.doubles >= 1
    # a fake hook log with a third victim in the same window: bound 2, got 3
    bad = double([*calls, call(15, ("n3",), "n5", 2)], {}, [SPLIT])
    (v,) = bad.violations
    assert v.invariant == inv.SCALE_DOUBLE == "scale-double-action"
    assert "3 nodes removed within 8 s" in v.detail and "bound 2" in v.detail
    assert "2 side(s)" in v.detail and all(n in v.detail for n in ("n2", "n3", "n4"))


def test_two_removals_in_one_window_without_a_split_break_the_bound_of_one() -> None:
    calls = [call(1, ("n2",)), call(5, ("n3",), "n4", 2)]
    (v,) = double(calls, {}).violations
    assert v.invariant == inv.SCALE_DOUBLE and "bound 1" in v.detail and "1 side(s)" in v.detail
    # the same two while split, or just after its heal (slack), are the stated double
    assert double(calls, {}, [inv.FaultWindow("split", frozenset(), T0, T0 + 2)]).violations == ()
    late = inv.FaultWindow("split", frozenset(), T0 - 20, T0 - 4.5)
    assert double(calls, {}, [late]).violations != ()


def test_removals_count_at_their_decision_and_retries_count_once() -> None:
    # one actor decides a cooldown apart; the first victim drained slowly, so the two
    # hooks ran 3 s apart: judged by the decisions, that is one removal per cooldown
    js = journals(decided("n1", 1, ("n2",)), decided("n1", 9.5, ("n3",)))
    calls = [call(7, ("n2",)), call(7.5, ("n2",), attempt=1), call(10, ("n3",))]
    out = double(calls, js)
    assert out.violations == ()
    assert [(r.node, r.at - T0, r.decided_by) for r in out.removals] == [
        ("n2", 1.0, "n1"),
        ("n3", 9.5, "n1"),
    ]
    # without the journals the hooks' own times are used: 3 s apart, a violation
    assert double(calls, {}).violations != ()


def test_a_node_named_again_counts_once_and_is_reported() -> None:
    js = journals(decided("n5", 12, ("n4",), 2))
    calls = [call(12.5, ("n4",), "n5", 2), call(16, ("n4",), "n1", 3)]
    out = double(calls, js)
    assert out.violations == () and out.repeated == ("n4",) and out.peak == {1: 1}


def test_a_run_without_a_scale_in_proves_nothing() -> None:
    out = double([inv.HookCall(T0, "out", (), "n1", 1)], {})
    (v,) = out.violations
    assert v.invariant == inv.SCALE_DOUBLE and "nothing to judge" in v.detail


def test_sides_in_force() -> None:
    assert inv.partitions_in_force([], T0, T0 + C, 4.0) == 1
    assert inv.partitions_in_force([SPLIT], T0 + 5, T0 + 13, 4.0) == 2
    assert inv.partitions_in_force([SPLIT], T0 + 33, T0 + 41, 4.0) == 2  # healed < 4 s ago
    assert inv.partitions_in_force([SPLIT], T0 + 35, T0 + 43, 4.0) == 1
    kill = inv.FaultWindow("kill", frozenset({"n1"}), T0, T0 + 50)
    assert inv.partitions_in_force([kill], T0, T0 + C, 4.0) == 1


# ------------------------------------------------------------- idle victims


def victim_journal(moves: list[tuple[float, str, str, str | None, str, str]]) -> JournalData:
    """n3's journal: (at, task, node, src, dst, cause) transition events."""
    evs = tuple(
        TransitionEvent(k + 1, T0 + at, tid, node, src, dst, cause)
        for k, (at, tid, node, src, dst, cause) in enumerate(moves)
    )
    return JournalData("n3", {}, evs, ())


def removal(hook_at: float, at: float = 1.0) -> inv.Removal:
    return inv.Removal("n3", T0 + at, T0 + hook_at, "n1", 1, "n1")


CLEAN = [
    (0.5, "t1", "n3", None, "queued", "submitted"),
    (0.6, "t1", "n3", "queued", "running", "started"),
    (2.0, "t1", "n3", "running", "succeeded", "exited 0"),
    (2.5, "t2", "n3", None, "queued", "submitted"),
    (2.5, "t2", "n3", "queued", "transferring", "offering to n4"),
    (2.6, "t2", "n4", "transferring", "queued", "handed off to n4"),
    (2.7, "t3", "n3", None, "queued", "submitted"),
    (2.8, "t3", "n5", "queued", "running", "started on n5"),
]


def test_a_victim_whose_work_ended_or_moved_passes() -> None:
    out = inv.check_victims_idle([removal(3.0)], {"n3": victim_journal(CLEAN)}, drain_grace=60)
    assert out.violations == () and out.judged == 1
    assert out.homed_elsewhere == 1  # t3 runs on n5; t2 was handed off


def test_a_victim_still_running_a_task_at_its_hook_is_named() -> None:
    j = victim_journal(CLEAN)
    (v,) = inv.check_victims_idle([removal(1.5)], {"n3": j}, drain_grace=60).violations
    assert v.invariant == inv.SCALE_IDLE == "scale-in-victim-idle" and v.node == "n3"
    assert "running t1" in v.detail and "0.5s after the decision" in v.detail
    # the same hook after the drain grace is the design's limit: counted, not a violation
    out = inv.check_victims_idle([removal(1.5, at=-70)], {"n3": j}, drain_grace=60)
    assert out.violations == () and out.after_grace == 1


def test_a_victim_holding_a_queued_or_offered_task_at_its_hook_is_named() -> None:
    j = victim_journal(CLEAN)
    (v,) = inv.check_victims_idle([removal(2.55)], {"n3": j}, drain_grace=60).violations
    assert "holding t2 (transferring)" in v.detail
    (v,) = inv.check_victims_idle([removal(2.75)], {"n3": j}, drain_grace=60).violations
    assert "holding t3 (queued)" in v.detail
    (v,) = inv.check_victims_idle([removal(3)], {}, drain_grace=60).violations
    assert "no journal" in v.detail


# -------------------------------------------------- recorder, config, journal


def test_the_agents_config_parses_and_the_recorder_records_what_a_hook_is_told(
    tmp_path: Path,
) -> None:
    spec = el.ElasticSpec()
    files = el.write_files(tmp_path, spec)
    cfg = load_config(file=files.config, env={}, flags={"node-id": "n1"})
    (pool,) = cfg.pools
    assert pool.name == "chaos" and pool.scale.max_step == 1 and pool.lease_ttl == 2.0
    assert pool.scale.min_nodes == 1 and pool.scale.scale_in_window == 4.0
    assert pool.scale.in_cooldown == 8.0 and pool.drain_grace == 60.0
    assert pool.in_command == pool.out_command and str(files.calls) in pool.in_command
    env = {
        "SWARM_SCALE_POOL": "chaos",
        "SWARM_SCALE_ACTION": "in",
        "SWARM_SCALE_COUNT": "2",
        "SWARM_SCALE_NODES": "n3 n4",
        "SWARM_SCALE_DESIRED": "3",
        "SWARM_SCALE_EPOCH": "7",
        "SWARM_SCALE_ACTOR": "n1",
        "SWARM_SCALE_ATTEMPT": "1",
    }
    before = time.time()
    # as the agent runs it: /bin/sh -c, a minimal environment
    res = trio.run(run_hook, pool.in_command, env, 20.0)
    assert res.ok, res
    assert "recorded in 2 n3 n4" in res.output
    (c,) = el.read_calls(files.calls)
    assert before <= c.at <= time.time()
    assert (c.action, c.nodes, c.actor, c.epoch, c.attempt, c.count, c.pool) == (
        "in",
        ("n3", "n4"),
        "n1",
        7,
        1,
        2,
        "chaos",
    )
    with files.calls.open("a") as f:
        f.write("not json\n")
    assert len(el.read_calls(files.calls)) == 1


async def test_read_journal_decodes_the_scale_events_the_agent_writes(tmp_path: Path) -> None:
    j = Journal(tmp_path / "journal.db", node="n2")
    note = {
        "pool": "chaos",
        "action": "in",
        "count": 1,
        "nodes": ["n4"],
        "epoch": 3,
        "reason": "scale in by 1",
    }
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run)
        await j.commit([Event(time.time(), "scale", None, "n2", note)])
        await j.commit([Event(time.time(), "scale", None, "n2", {**note, "reason": inv.HOOK_DONE})])
        await j.commit([Event(time.time(), "scale", None, "n2", {**note, "action": None})])
        nursery.cancel_scope.cancel()
    j.close()
    data = read_journal("n2", tmp_path / "journal.db")
    assert data.bad_records == 0
    assert [(e.node, e.action, e.nodes, e.epoch) for e in data.scale] == [
        ("n2", "in", ("n4",), 3),
        ("n2", "in", ("n4",), 3),
        ("n2", None, ("n4",), 3),
    ]
    (d,) = inv.scale_decisions({"n2": data})
    assert d.reason == "scale in by 1"


def test_the_elastic_scenario_is_appended_to_the_full_suite_with_one_split() -> None:
    sc = find("elastic")
    # appended after `constrained`; only `home-loss` and issue 19's later scenarios
    # came after it (seeds by index)
    at = FULL.index(sc)
    assert FULL[at - 1].name == "constrained" and sc not in SMOKE
    assert FULL[at + 1].name == "home-loss"
    assert sc.elastic and not sc.drains and [s.name for s in FULL if s.elastic] == ["elastic"]
    for seed in (1000, 1017, 1018):
        plan = make_plan(sc, seed)
        (f,) = plan.faults
        assert f.kind == "split" and len(f.targets) == sc.nodes // 2
        assert 4.0 <= f.start <= 6.0 and f.end - f.start >= 16.0 and not plan.drains


# ---------------------------------------------------------------- the run


@pytest.mark.slow
def test_the_elastic_scenario_passes_on_real_agents(tmp_path: Path) -> None:
    """About 40 s: 5 agents scale their pool in every cooldown while a split cuts them
    in two; nothing lost, the double action within its bound, victims idle."""
    env = dict(os.environ)
    env.pop("SWARM_TEST_BREAK", None)
    env.pop("SWARM_TEST_MODE", None)
    out = tmp_path / "report"
    argv = ["--scenario", "elastic", "--seed", str(SEED), "--out", str(out)]
    p = subprocess.run(
        [sys.executable, "-m", "chaos.run", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads((out / "report.json").read_text())
    (sc,) = report["scenarios"]
    detail = "\n".join([*sc["violations"], sc["error"], *sc["notes"], p.stderr[-3000:]])
    assert p.returncode == 0 and report["passed"], detail
    assert sc["acked"] >= 30 and sc["completed"] == sc["acked"] and sc["lost"] == 0, detail
    scale = sc["scale"]
    assert scale["removals"] >= 2 and scale["victims_judged"] == len(scale["removed"])
    for sides, peak in scale["peak_by_sides"].items():
        assert peak <= scale["bound_by_sides"][sides], detail
    if report["mode"] == "netns":  # the split needs the namespace LAN
        assert sc["faults"] and sc["faults"][0]["kind"] == "split", detail
        assert scale["removed_while_split"] >= 1, detail
    md = (out / "report.md").read_text()
    assert "elastic: " in md and "scale-double-action" in md
