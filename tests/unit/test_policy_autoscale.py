"""The elastic-fleet decision (issue 25, pure part): HPA's recommendation with its
tolerance, the stabilisation windows, cooldowns, max-step, min/max, stale views,
bootstrap from no nodes, failed hooks, and the choice of nodes to remove.

The tables follow Kubernetes' own HPA tests (pkg/controller/podautoscaler): each row is
a pool (nodes, slots, running, queued), a history of recommendations and a time, and
the action, count and desired count it must give."""

from __future__ import annotations

import itertools
import math
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.policy.autoscale import (
    Acted,
    NodeWork,
    PoolView,
    ScaleConfig,
    ScaleDecision,
    ScaleState,
    choose_victims,
    decide,
    explain_victims,
    recommend,
)

# 10-slot nodes, target 0.5: a node is "full" at 5 slots demanded
BASE = ScaleConfig(
    pool="cpu",
    min_nodes=1,
    max_nodes=20,
    target_utilisation=0.5,
    tolerance=0.1,
    scale_out_window=0.0,
    scale_in_window=300.0,
    out_cooldown=60.0,
    in_cooldown=300.0,
    max_step=4,
    max_view_age=30.0,
)
NOW = 1000.0


@attrs.frozen
class Row:
    name: str
    nodes: int
    demand: float  # running slots; queued below
    expect: tuple[str, int, int]  # action, count, desired
    reason: str  # a piece of the reason line
    queued: float = 0.0
    slots: float | None = None  # default 10 a node
    draining: int = 0
    age: float = 1.0
    history: tuple[tuple[float, int], ...] = ()
    since: float | None = None  # default: the first entry of history, else NOW
    last: Acted | None = None
    cfg: dict[str, Any] = attrs.field(factory=dict)


ROWS = [
    # the tolerance band: |ratio - 1| <= 0.1 changes nothing
    Row("inside the band", 4, 21, ("none", 0, 4), "at desired 4"),
    Row("on the band's edge", 4, 22, ("none", 0, 4), "recommends 4"),
    Row("just above the band", 4, 22.5, ("out", 1, 5), "scale out by 1 to 5"),
    Row("below the band, the ceiling keeps the count", 4, 17.5, ("none", 0, 4), "at desired 4"),
    Row("a quarter idle", 4, 14, ("in", 1, 3), "scale in by 1 to 3", since=0.0),
    # queued work counts as demand
    Row("queued counts", 4, 10, ("out", 2, 6), "(10 running + 20 queued)", queued=20),
    # scale-out: the demand's nodes, at most max_step at a time, never above max_nodes
    Row("double the demand", 4, 40, ("out", 4, 8), "scale out by 4 to 8"),
    Row("capped by max_step", 4, 100, ("out", 4, 20), "max_step 4"),
    Row("capped by max_nodes", 4, 100, ("out", 2, 6), "to 6", cfg={"max_nodes": 6}),
    Row(
        "max_nodes counts draining nodes",
        4,
        100,
        ("none", 0, 6),
        "max_nodes 6 reached counting 2 draining",
        draining=2,
        cfg={"max_nodes": 6},
    ),
    Row(
        "a new node's size is configured",
        4,
        40,
        ("out", 2, 6),
        "to 6",
        cfg={"slots_per_node": 20.0},
    ),
    # bootstrap: no nodes, some demand
    Row(
        "bootstrap from no nodes",
        0,
        12,
        ("out", 3, 3),
        "utilisation inf",
        cfg={"slots_per_node": 8.0, "min_nodes": 0},
    ),
    Row(
        "bootstrap with no node size grows by one",
        0,
        12,
        ("out", 1, 1),
        "scale out by 1 to 1",
        cfg={"min_nodes": 0},
    ),
    Row("nodes without slots", 2, 12, ("out", 1, 3), "/ 0 slots", slots=0.0),
    Row("below min_nodes with nothing to do", 0, 0, ("out", 2, 2), "to 2", cfg={"min_nodes": 2}),
    # scale-in: only after the whole window shows a lower recommendation
    Row(
        "zero demand for the whole window: to min",
        4,
        0,
        ("in", 3, 1),
        "scale in by 3 to 1",
        history=((700.0, 1), (800.0, 1), (900.0, 1)),
    ),
    Row(
        "a dip inside the window removes nothing",
        4,
        0,
        ("none", 0, 4),
        "highest recommendation of the last 300 s is 4",
        history=((701.0, 4), (800.0, 1), (900.0, 1)),
        since=0.0,
    ),
    Row(
        "the window's highest is the target",
        6,
        0,
        ("in", 3, 3),
        "highest recommendation of the last 300 s: 3",
        history=((701.0, 3), (800.0, 1)),
        since=0.0,
    ),
    Row(
        "a recommendation exactly a window old has left it",
        4,
        0,
        ("in", 3, 1),
        "scale in by 3",
        history=((700.0, 4), (800.0, 1)),
        since=0.0,
    ),
    Row(
        "scale-in needs a whole window recorded",
        4,
        0,
        ("none", 0, 1),
        "recorded for 100 s of the 300 s",
        history=((900.0, 1),),
    ),
    Row(
        "scale-in capped by max_step",
        12,
        0,
        ("in", 4, 1),
        "scale in by 4 to 8",
        history=((700.0, 1),),
    ),
    Row(
        "nodes draining count against the step",
        6,
        0,
        ("in", 2, 1),
        "2 already draining",
        draining=2,
        history=((700.0, 1),),
    ),
    Row(
        "no further scale-in while the step is draining",
        6,
        0,
        ("none", 0, 1),
        "4 nodes already draining",
        draining=4,
        history=((700.0, 1),),
    ),
    Row(
        "above max_nodes: back to max after the window",
        25,
        250,
        ("in", 4, 20),
        "scale in by 4 to 21",
        history=((700.0, 20),),
    ),
    # the scale-out window: the lowest recommendation in it
    Row(
        "a scale-out window follows the lowest",
        4,
        40,
        ("out", 1, 5),
        "lowest recommendation of the last 60 s: 5",
        history=((950.0, 5), (980.0, 8)),
        cfg={"scale_out_window": 60.0},
    ),
    Row(
        "a scale-out window holds on a recent low",
        4,
        40,
        ("none", 0, 4),
        "lowest recommendation of the last 60 s is 4",
        history=((950.0, 4), (980.0, 8)),
        cfg={"scale_out_window": 60.0},
    ),
    # cooldowns, from the last action in either direction
    Row(
        "out_cooldown after an out",
        4,
        40,
        ("none", 0, 8),
        "out_cooldown 30 s left after out 2 at 970",
        last=Acted("out", 2, 970.0),
    ),
    Row(
        "out_cooldown after an in",
        4,
        40,
        ("none", 0, 8),
        "out_cooldown 10 s left after in 1 at 950",
        last=Acted("in", 1, 950.0),
    ),
    Row("out_cooldown over", 4, 40, ("out", 4, 8), "scale out", last=Acted("out", 2, 940.0)),
    Row(
        "in_cooldown after an out",
        4,
        0,
        ("none", 0, 1),
        "in_cooldown 100 s left after out 1 at 800",
        history=((700.0, 1),),
        last=Acted("out", 1, 800.0),
    ),
    # a stale view decides nothing
    Row("a view too old", 4, 100, ("none", 0, 4), "view too old (31 s > max 30 s)", age=31.0),
    # scale_in_utilisation (0.5) below the target (0.7): the band is [0.63, 0.77]
    Row(
        "below the band but above scale_in_utilisation: holds",
        10,
        60,
        ("none", 0, 10),
        "target 0.70 (scale-in to 0.50); recommends 10",  # HPA: ceil(10 * 0.6 / 0.7) = 9
        history=((700.0, 10),),
        cfg={"target_utilisation": 0.7},
    ),
    Row(
        "below scale_in_utilisation: in to where the demand sits at it",
        10,
        40,
        ("in", 2, 8),
        "recommends 8; scale in by 2 to 8",  # ceil(40 / (10 * 0.5))
        history=((700.0, 8),),
        cfg={"target_utilisation": 0.7},
    ),
    Row(
        "scale_in_utilisation at the target is HPA's scale-in",
        10,
        40,
        ("in", 4, 6),
        "target 0.70; recommends 6",  # ceil(10 * 0.4 / 0.7)
        history=((700.0, 6),),
        cfg={"target_utilisation": 0.7, "scale_in_utilisation": 0.7},
    ),
    Row(
        "scale_in_utilisation above the target acts as the target",
        10,
        40,
        ("in", 4, 6),
        "recommends 6",
        history=((700.0, 6),),
        cfg={"target_utilisation": 0.7, "scale_in_utilisation": 0.9},
    ),
    Row(
        "scale-out is HPA's at the target whatever scale_in_utilisation",
        10,
        80,
        ("out", 2, 12),
        "scale out by 2 to 12",  # ceil((80 / 0.7 - 100) / 10)
        cfg={"target_utilisation": 0.7, "scale_in_utilisation": 0.3},
    ),
]


def _run(row: Row) -> tuple[ScaleState, ScaleDecision]:
    cfg = attrs.evolve(BASE, **row.cfg)
    slots = 10.0 * row.nodes if row.slots is None else row.slots
    view = PoolView(row.nodes, slots, row.demand, row.queued, row.age, row.draining)
    since = row.since if row.since is not None else (row.history[0][0] if row.history else None)
    state = ScaleState(history=row.history, since=since, last=row.last)
    return decide(state, view, cfg, NOW)


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_decision_table(row: Row) -> None:
    _, d = _run(row)
    assert (d.action, d.count, d.desired) == row.expect, d.reason
    assert row.reason in d.reason
    assert "\n" not in d.reason


def test_the_reason_carries_the_numbers() -> None:
    _, d = _run(Row("", 4, 10, ("out", 2, 6), "", queued=20))
    assert d.reason.startswith(
        "pool cpu: 4 nodes, utilisation 0.75 = (10 running + 20 queued) / 40 slots,"
        " target 0.50; recommends 6; scale out by 2 to 6"
    )


def test_an_action_is_recorded_and_a_stale_view_is_not() -> None:
    view = PoolView(4, 40.0, 40.0)
    state, d = decide(ScaleState(), view, BASE, NOW)
    assert d.action == "out" and state.last == Acted("out", 4, NOW)
    assert state.history == ((NOW, 8),) and state.since == NOW
    stale = attrs.evolve(view, age=BASE.max_view_age + 1)
    assert decide(state, stale, BASE, NOW + 1)[0] == state


def test_a_failed_hook_allows_a_retry_at_once() -> None:
    view = PoolView(4, 40.0, 40.0)
    state, d = decide(ScaleState(), view, BASE, NOW)
    assert d.action == "out"
    held, d = decide(state, view, BASE, NOW + 10)
    assert d.action == "none" and "out_cooldown" in d.reason  # the hook may still run
    failed = held.failed(NOW + 10)
    assert failed.failed(NOW + 10) == failed  # idempotent
    again, d = decide(failed, view, BASE, NOW + 10)
    assert (d.action, d.count) == ("out", 4)
    assert again.last == Acted("out", 4, NOW + 10) and again.failed_at == NOW + 10


def test_after_a_failure_the_cooldowns_count_from_the_action_before() -> None:
    view = PoolView(4, 40.0, 40.0)
    state, _ = decide(ScaleState(), view, BASE, 950.0)
    state, d = decide(state, view, BASE, 1010.0)
    assert d.action == "out"
    _, d = decide(state.failed(1011.0), view, BASE, 1005.0 + 1)
    assert d.action == "none" and "out_cooldown 4 s left after out 4 at 950" in d.reason
    _, d = decide(state.failed(1011.0), view, BASE, 1010.0)
    assert d.action == "out"


def test_the_history_is_bounded_by_the_longest_window() -> None:
    state = ScaleState()
    view = PoolView(4, 40.0, 20.0)
    for i in range(200):
        state, _ = decide(state, view, BASE, i * 10.0)
    assert len(state.history) == 30  # 300 s window, one every 10 s
    assert state.history[0][0] == 1990.0 - 290.0


def test_demand_oscillating_faster_than_the_window_never_scales_in() -> None:
    """A square wave of 60 s busy, 60 s idle against the 300 s scale-in window: the
    pool grows to the peak and stays; when the load stops, it shrinks after the
    window."""
    cfg, state, nodes = BASE, ScaleState(), 1
    actions: list[tuple[float, str, int]] = []
    for tick in range(200):
        now = tick * 10.0
        busy = tick < 120 and (tick // 6) % 2 == 0
        view = PoolView(nodes, 10.0 * nodes, 30.0 if busy else 0.0)
        state, d = decide(state, view, cfg, now)
        if d.action != "none":
            actions.append((now, d.action, d.count))
            nodes += d.count if d.action == "out" else -d.count
    outs = [a for a in actions if a[1] == "out"]
    ins = [a for a in actions if a[1] == "in"]
    assert sum(c for _, _, c in outs) == 5 and all(t < 1200 for t, _, _ in outs)
    assert ins and all(t >= 1130 + 300 for t, _, _ in ins)  # a window after the last peak
    assert nodes == 1


def test_config_errors_name_the_field() -> None:
    bad: list[tuple[dict[str, Any], str]] = [
        ({"min_nodes": -1}, "min_nodes"),
        ({"min_nodes": 3, "max_nodes": 2}, "max_nodes"),
        ({"target_utilisation": 0.0}, "target_utilisation"),
        ({"target_utilisation": 1.5}, "target_utilisation"),
        ({"tolerance": 1.0}, "tolerance"),
        ({"scale_in_window": -1.0}, "scale_in_window"),
        ({"out_cooldown": float("nan")}, "out_cooldown"),
        ({"max_step": 0}, "max_step"),
        ({"max_view_age": 0.0}, "max_view_age"),
        ({"slots_per_node": 0.0}, "slots_per_node"),
        ({"pool": ""}, "pool"),
        ({"max_nodes": True}, "max_nodes"),
        ({"scale_in_utilisation": 0.0}, "scale_in_utilisation"),
        ({"scale_in_utilisation": 1.5}, "scale_in_utilisation"),
        ({"scale_in_utilisation": float("nan")}, "scale_in_utilisation"),
        ({"scale_in_utilisation": "0.5"}, "scale_in_utilisation"),
    ]
    for kw, field in bad:
        with pytest.raises(ValueError, match=rf"^{field}: "):
            ScaleConfig(**kw)
    with pytest.raises(ValueError, match=r"^running: "):
        PoolView(1, 10.0, -1.0)
    with pytest.raises(ValueError, match=r"^nodes: "):
        PoolView(-1, 10.0)


def test_recommend_is_hpa_driven_by_demand() -> None:
    cfg = attrs.evolve(BASE, min_nodes=0)
    assert recommend(PoolView(4, 40.0, 0.0), cfg) == 0
    assert recommend(PoolView(4, 40.0, 10.0), cfg) == 2  # ceil(4 * 0.25 / 0.5)
    assert recommend(PoolView(4, 40.0, 35.0), cfg) == 7  # exact: no float round-up
    assert recommend(PoolView(3, 30.0, 0.7 * 3 * 10 * 0.5 / 0.7), cfg) == 3


def test_scale_in_utilisation_default_and_bounds() -> None:
    """The cluster autoscaler's scale-down-utilization-threshold by default; never above
    the target, where it is HPA's own scale-in."""
    assert ScaleConfig().scale_in_utilisation == 0.5
    assert ScaleConfig().in_utilisation == 0.5
    assert ScaleConfig(target_utilisation=0.4).in_utilisation == 0.4
    assert ScaleConfig(scale_in_utilisation=1.0).in_utilisation == 0.7
    hpa = attrs.evolve(BASE, target_utilisation=0.7, scale_in_utilisation=0.7, min_nodes=0)
    ca = attrs.evolve(hpa, scale_in_utilisation=0.5)
    # 10 nodes of 10 slots: demand 45 is 0.45, below both
    assert recommend(PoolView(10, 100.0, 45.0), hpa) == 7  # ceil(10 * 0.45 / 0.7)
    assert recommend(PoolView(10, 100.0, 45.0), ca) == 9  # ceil(45 / 5)
    # between 0.5 and the band's lower edge 0.63 the default holds; HPA removes
    assert recommend(PoolView(10, 100.0, 55.0), ca) == 10
    assert recommend(PoolView(10, 100.0, 55.0), hpa) == 8
    # booting nodes count in the count held, not as a reason to add
    assert recommend(PoolView(6, 48.0, 30.0, booting=2), attrs.evolve(ca, max_nodes=20)) == 8


def test_a_dip_then_a_rise_flaps_with_hpa_landing_only() -> None:
    """6 nodes of 8 slots at the target (demand 33 of 48, 0.69). (a) The demand dips to
    26 (0.54) for 400 s, then comes back to 33: HPA's scale-in lands at 5 nodes
    (ceil(6 * 0.54 / 0.7)), where 33 is 0.83, above the band, and it scales out again
    within the window (a flap); with scale_in_utilisation 0.5 the dip is above 0.5 and
    nothing moves. (b) A deeper dip, to 16 (0.33), then a rise by half, to 24: HPA
    lands at 3 nodes (ceil(6 * 0.33 / 0.7)), where 24 is 1.0, and scales out again; the
    default lands at 4 (16 at 0.5), where 24 is 0.75, inside the band: it stays."""
    cfg = attrs.evolve(BASE, target_utilisation=0.7, min_nodes=1)
    hpa = attrs.evolve(cfg, scale_in_utilisation=0.7)

    def trace(dip: float, after: float) -> list[float]:
        return [33.0] * 27 + [dip] * 27 + [after] * 60  # 15 s ticks

    for dip, after, flap in (
        (26.0, 33.0, [("in", 1), ("out", 1)]),
        (16.0, 24.0, [("in", 3), ("out", 2)]),
    ):
        actions, _, _ = _simulate(hpa, 8.0, 6, trace(dip, after))
        assert [(a, c) for _, a, c in actions] == flap
        assert actions[1][0] - actions[0][0] < hpa.scale_in_window
    actions, final, _ = _simulate(cfg, 8.0, 6, trace(26.0, 33.0))
    assert actions == [] and final == 6
    actions, final, _ = _simulate(cfg, 8.0, 6, trace(16.0, 24.0))
    assert [(a, c) for _, a, c in actions] == [("in", 2)] and final == 4


# ----------------------------------------------------------------- properties

configs = st.builds(
    lambda lo, span, target, tol, win_out, win_in, cd_out, cd_in, step, spn, u_in: ScaleConfig(
        min_nodes=lo,
        max_nodes=lo + span,
        target_utilisation=target,
        tolerance=tol,
        scale_out_window=win_out,
        scale_in_window=win_in,
        out_cooldown=cd_out,
        in_cooldown=cd_in,
        max_step=step,
        slots_per_node=spn,
        scale_in_utilisation=u_in,
    ),
    st.integers(0, 5),
    st.integers(0, 30),
    st.floats(0.2, 1.0),
    st.floats(0.0, 0.5),
    st.sampled_from([0.0, 30.0, 120.0]),
    st.sampled_from([0.0, 60.0, 300.0]),
    st.sampled_from([0.0, 30.0, 60.0]),
    st.sampled_from([0.0, 60.0, 300.0]),
    st.integers(1, 6),
    st.none() | st.integers(1, 16).map(float),
    st.sampled_from([0.5, 1.0]) | st.floats(0.05, 1.0),
)
views = st.builds(
    PoolView,
    st.integers(0, 40),
    st.integers(0, 400).map(float),
    st.integers(0, 500).map(float),
    st.integers(0, 500).map(float),
    st.floats(0.0, 40.0),
    st.integers(0, 6),
)
states = st.builds(
    ScaleState,
    st.lists(st.tuples(st.floats(0.0, NOW), st.integers(0, 60)), max_size=8).map(
        lambda h: tuple(sorted(h))
    ),
    st.none() | st.floats(0.0, NOW),
    st.none()
    | st.builds(Acted, st.sampled_from(["out", "in"]), st.integers(1, 6), st.floats(0, NOW)),
)


@settings(max_examples=300)
@given(states, views, configs)
def test_desired_stays_in_bounds_and_steps_are_bounded(
    state: ScaleState, view: PoolView, cfg: ScaleConfig
) -> None:
    assert cfg.min_nodes <= recommend(view, cfg) <= cfg.max_nodes
    if state.history and state.since is None:
        state = attrs.evolve(state, since=state.history[0][0])
    after, d = decide(state, view, cfg, NOW)
    assert cfg.min_nodes <= d.desired <= cfg.max_nodes or d.reason.endswith("no decision")
    assert 0 <= d.count <= cfg.max_step
    assert (d.action == "none") == (d.count == 0)
    if d.action == "out":
        assert view.nodes + d.count <= d.desired
        assert view.nodes + view.draining + d.count <= cfg.max_nodes
    if d.action == "in":
        assert view.nodes - d.count >= d.desired >= cfg.min_nodes
        assert view.draining + d.count <= cfg.max_step
    if d.action != "none":
        assert after.last == Acted(d.action, d.count, NOW)
    if view.age > cfg.max_view_age:
        assert after == state  # a stale view is not recorded
    else:
        assert all(NOW - t < cfg.horizon for t, _ in after.history[:-1])


@settings(max_examples=300)
@given(
    configs,
    st.integers(1, 40),
    st.integers(1, 16).map(float),
    st.integers(1, 1000),
)
def test_a_scale_in_lands_at_or_below_scale_in_utilisation_and_stays(
    cfg: ScaleConfig, nodes: int, size: float, permille: int
) -> None:
    """A recommendation below the count leaves the demand at or below
    `in_utilisation` on the nodes kept (of the pool's mean size), and a pool of that
    many nodes with the same demand recommends itself: no scale-out follows unless the
    demand rises."""
    cfg = attrs.evolve(cfg, min_nodes=0, max_nodes=max(cfg.max_nodes, nodes))
    demand = nodes * size * permille / 1000
    r = recommend(PoolView(nodes, nodes * size, demand), cfg)
    assert r <= nodes or demand > nodes * size * cfg.target_utilisation
    if r >= nodes:
        return
    assert demand <= r * size * cfg.in_utilisation * (1 + 1e-9)
    assert r == 0 or recommend(PoolView(r, r * size, demand), cfg) == r


def _simulate(
    cfg: ScaleConfig, size: float, nodes: int, demand: list[float], tick: float = 15.0
) -> tuple[list[tuple[float, str, int]], int, ScaleState]:
    """A pool of nodes of `size` slots that follows every decision at once (a drained
    node leaves at once), with the demand of each tick in turn."""
    state = ScaleState()
    actions: list[tuple[float, str, int]] = []
    for i, dem in enumerate(demand):
        now = i * tick
        state, d = decide(state, PoolView(nodes, size * nodes, dem), cfg, now)
        if d.action != "none":
            actions.append((now, d.action, d.count))
            nodes += d.count if d.action == "out" else -d.count
    return actions, nodes, state


@settings(max_examples=150, deadline=None)
@given(configs, st.integers(1, 16).map(float), st.integers(0, 40), st.integers(0, 400))
def test_no_flapping_with_a_constant_demand(
    cfg: ScaleConfig, size: float, start: int, demand: int
) -> None:
    """Constant demand: every action goes the same way, each a full step but the
    last, and once the pool stops moving it never moves again."""
    if cfg.slots_per_node is not None:
        size = cfg.slots_per_node
    ticks = 1500  # 6 h of 15 s: room for 40 steps of the longest cooldown and window
    actions, final, _ = _simulate(cfg, size, start, [float(demand)] * ticks)
    assert len({a for _, a, _ in actions}) <= 1
    if actions and not (start == 0 and cfg.slots_per_node is None):
        assert len(actions) == math.ceil(abs(final - start) / cfg.max_step)
    if actions:
        assert actions[-1][0] < (ticks - 100) * 15.0  # converged well before the end
    after, final2, _ = _simulate(cfg, size, final, [float(demand)] * 100)
    assert after == [] and final2 == final  # a settled pool stays settled
    if demand == 0:
        assert final == cfg.min_nodes


@settings(max_examples=150, deadline=None)
@given(
    configs,
    st.integers(1, 16).map(float),
    st.integers(0, 20),
    st.lists(st.integers(0, 300).map(float), min_size=1, max_size=12),
)
def test_oscillating_demand_acts_at_most_once_a_cooldown(
    cfg: ScaleConfig, size: float, start: int, wave: list[float]
) -> None:
    cfg = attrs.evolve(cfg, out_cooldown=max(cfg.out_cooldown, 10.0))
    cfg = attrs.evolve(cfg, in_cooldown=max(cfg.in_cooldown, 10.0))
    trace = (wave * (400 // len(wave) + 1))[:400]
    actions, _, _ = _simulate(cfg, size, start, trace, tick=5.0)
    duration = len(trace) * 5.0
    assert len(actions) <= duration / min(cfg.out_cooldown, cfg.in_cooldown) + 1
    times = [t for t, _, _ in actions]
    assert all(
        b - a >= min(cfg.out_cooldown, cfg.in_cooldown) for a, b in itertools.pairwise(times)
    )


# --------------------------------------------------------------- safe scale-in


def test_victims_lose_least_work_and_skip_pinned_nodes() -> None:
    nodes = [
        NodeWork("busy", task_seconds=500.0),
        NodeWork("idle-b"),
        NodeWork("idle-a"),
        NodeWork("queued", queued=3),
        NodeWork("long", unmovable_seconds=3600.0),
        NodeWork("short", task_seconds=10.0, unmovable_seconds=60.0),
        NodeWork("replica", pinned=True),
    ]
    assert choose_victims(nodes, 2) == ["idle-a", "idle-b"]
    assert choose_victims(nodes, 4) == ["idle-a", "idle-b", "queued", "short"]
    assert choose_victims(nodes, 10) == ["idle-a", "idle-b", "queued", "short", "busy"]
    assert choose_victims(nodes, 0) == []
    assert "long" in choose_victims(nodes, 10, long_task=7200.0)
    why = {n: (c, r) for n, c, r in explain_victims(nodes, 2)}
    assert why["idle-a"] == (True, "chosen 1 of 2: 0 task-seconds lost, 0 queued to move")
    assert why["long"] == (False, "pinned (a task that cannot migrate runs 3600 s > 600 s)")
    assert why["replica"][0] is False and why["replica"][1].startswith("pinned")
    assert why["busy"][1].startswith("kept: 500 task-seconds")
    with pytest.raises(ValueError, match="twice"):
        choose_victims([NodeWork("a"), NodeWork("a", queued=1)], 1)
    with pytest.raises(ValueError, match=r"^count: "):
        choose_victims(nodes, -1)


work = st.lists(
    st.builds(
        NodeWork,
        st.text("abcdefgh", min_size=1, max_size=3),
        st.integers(0, 50).map(float),
        st.integers(0, 3),
        st.sampled_from([0.0, 100.0, 1000.0]),
        st.booleans(),
    ),
    max_size=10,
    unique_by=lambda n: n.node,
)


@given(work, st.integers(0, 12), st.randoms(use_true_random=False))
def test_victims_are_unpinned_cheapest_and_order_independent(
    nodes: list[NodeWork], count: int, rng: Any
) -> None:
    chosen = choose_victims(nodes, count, long_task=600.0)
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    assert choose_victims(shuffled, count, long_task=600.0) == chosen
    free = [n for n in nodes if not n.pinned and n.unmovable_seconds <= 600.0]
    assert len(chosen) == min(count, len(free))
    by = {n.node: n for n in nodes}
    assert all(by[c] in free for c in chosen)  # never a pinned node
    key = [(by[c].task_seconds, by[c].queued, c) for c in chosen]
    assert key == sorted(key)
    rest = [(n.task_seconds, n.queued, n.node) for n in free if n.node not in chosen]
    assert not key or not rest or max(key) < min(rest)


# ------------------------------------------------ hand-over: epochs, learned actions


def _warm(state: ScaleState, view: PoolView, start: float, end: float, epoch: int) -> ScaleState:
    t = start
    while t <= end:
        state, d = decide(state, view, BASE, t, epoch=epoch)
        assert d.action == "none"
        t += 10.0
    return state


def test_a_node_that_wins_the_seat_back_warms_up_again() -> None:
    """Acted in epoch 1, lost the seat, won it back in epoch 3 long after: its old
    `since` must not let it scale in on the first sample of the new epoch."""
    idle = PoolView(4, 40.0, 5.0)  # wants 1 node
    busy = PoolView(4, 40.0, 20.0)  # at the target: holds 4
    state = _warm(ScaleState(), busy, 0.0, 400.0, epoch=1)
    assert state.since == 0.0 and state.epoch == 1
    # without an epoch the old state would scale in at once (the old behaviour)
    _, d = decide(state, idle, BASE, 5000.0)
    assert d.action == "in"
    back, d = decide(state, idle, BASE, 5000.0, epoch=3)
    assert d.action == "none" and "recorded for 0 s" in d.reason
    assert back.epoch == 3 and back.since == 5000.0 and back.history == ((5000.0, 1),)
    # the same epoch keeps its state; the warm-up ends a window later
    back = _warm(back, idle, 5010.0, 5290.0, epoch=3)
    _, d = decide(back, idle, BASE, 5300.0, epoch=3)
    assert (d.action, d.count) == ("in", 3)


def test_for_epoch_keeps_the_actions_known_and_is_a_no_op_in_the_same_epoch() -> None:
    s = ScaleState(history=((1.0, 3),), since=1.0, last=Acted("out", 2, 1.0), epoch=2).learn(
        Acted("in", 1, 5.0)
    )
    assert s.for_epoch(2) is s
    f = s.for_epoch(3)
    assert (f.history, f.since, f.epoch) == ((), None, 3)
    assert (f.last, f.heard, f.latest) == (s.last, s.heard, Acted("in", 1, 5.0))
    with pytest.raises(ValueError, match="epoch"):
        ScaleState(epoch=-1)


def test_a_new_actor_that_learned_of_an_out_does_not_scale_out_again_in_the_cooldown() -> None:
    view = PoolView(4, 40.0, 40.0)  # wants 8
    _, d = decide(ScaleState(), view, BASE, NOW, epoch=5)
    assert d.action == "out"  # nothing known: acts at once
    told = ScaleState().learn(Acted("out", 4, NOW - 10.0))  # gossiped with the lease
    state, d = decide(told, view, BASE, NOW, epoch=5)
    assert d.action == "none" and "out_cooldown 50 s left after out 4 at 990" in d.reason
    _, d = decide(state, view, BASE, NOW + 50.0, epoch=5)
    assert d.action == "out"
    # and the in_cooldown counts from it too, after the warm-up
    idle = PoolView(8, 80.0, 5.0)
    s = _warm(ScaleState().learn(Acted("out", 4, 500.0)), idle, 0.0, 290.0, epoch=1)
    _, d = decide(s, idle, BASE, 300.0, epoch=1)
    assert d.action == "none" and "in_cooldown" in d.reason


def test_learn_keeps_the_newest_action_idempotent_and_commutative() -> None:
    acts = [
        Acted("out", 2, 10.0),
        Acted("in", 1, 30.0),
        Acted("out", 1, 20.0),
        Acted("out", 3, 30.0),
    ]
    results = set()
    for order in itertools.permutations(acts):
        s = ScaleState()
        for a in order:
            s = s.learn(a).learn(a)
        results.add(s)
    assert len(results) == 1
    (s,) = results
    assert s.heard is not None and s.heard.at == 30.0
    # an own action newer than the learned one is the cooldowns' base
    own = s.acting(40.0, "in", 1)
    assert own.latest == Acted("in", 1, 40.0)
    assert own.failed(41.0).latest == s.heard  # the own action undone: the learned one


def test_booting_nodes_count_as_nodes_not_slots() -> None:
    # 4 live nodes, 40 slots, demand 40 at target 0.5: wants 8; 4 already booting
    view = PoolView(4, 40.0, 40.0, booting=4)
    _, d = decide(ScaleState(), view, BASE, NOW)
    assert d.action == "none" and d.desired == 8
    assert d.reason.startswith("pool cpu: 4 nodes (+4 booting), utilisation 1.00")
    # 2 booting: only the 2 missing are added
    _, d = decide(ScaleState(), attrs.evolve(view, booting=2), BASE, NOW)
    assert (d.action, d.count, d.desired) == ("out", 2, 8)
    # booting nodes count against max_nodes
    cfg = attrs.evolve(BASE, max_nodes=7)
    _, d = decide(ScaleState(), attrs.evolve(view, booting=2), cfg, NOW)
    assert (d.action, d.count, d.desired) == ("out", 1, 7)
    _, d = decide(ScaleState(), attrs.evolve(view, booting=2, draining=1), cfg, NOW)
    assert d.action == "none" and "max_nodes 7 reached counting 1 draining" in d.reason
    with pytest.raises(ValueError, match="booting"):
        PoolView(1, 10.0, booting=-1)


def test_a_boot_longer_than_the_out_cooldown_does_not_add_nodes_twice() -> None:
    """Demand for 8 nodes on 4; the launched nodes boot for 150 s > out_cooldown 60 s."""
    state, live, booting, added = ScaleState(), 4, 0, 0
    boots: list[float] = []
    for tick in range(40):
        now = tick * 15.0
        while boots and boots[0] <= now:
            boots.pop(0)
            booting -= 1
            live += 1
        view = PoolView(live, 10.0 * live, 40.0, booting=booting)
        state, d = decide(state, view, BASE, now)
        if d.action == "out":
            added += d.count
            booting += d.count
            boots += [now + 150.0] * d.count
    assert added == 4 and live == 8 and booting == 0


def test_the_tolerance_band_counts_booting_nodes_at_no_work() -> None:
    """10 live nodes and 1 booting for demand of 11.5 nodes: 1.045 of the pool's 11
    is within the band (no change); over the live slots alone it is 1.15, which would
    add a node the booting one nearly covers."""
    view = PoolView(10, 100.0, 57.5, booting=1)
    assert recommend(view, BASE) == 11
    _, d = decide(ScaleState(), view, BASE, NOW)
    assert (d.action, d.desired) == ("none", 11)
    assert recommend(attrs.evolve(view, booting=0), BASE) == 12


def test_no_scale_in_while_nodes_boot() -> None:
    """A live node is never drained to make room for one still booting: 1 live node at
    utilisation 1.0 with 2 booting recommends 2 of the 3; the scale-in waits."""
    cfg = attrs.evolve(BASE, min_nodes=1, scale_in_window=0.0, in_cooldown=0.0)
    view = PoolView(1, 2.0, 2.0, booting=2)
    _, d = decide(ScaleState(), view, cfg, NOW)
    assert d.action == "none" and "2 nodes still booting" in d.reason
    _, d = decide(ScaleState(), attrs.evolve(view, booting=0, nodes=3, slots=6.0), cfg, NOW)
    assert d.action == "in"
