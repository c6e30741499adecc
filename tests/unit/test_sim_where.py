"""Experiments 8 and 9 (issue 21): the `wheresim` engine and its two sweeps, small.

Every run is seeded and small (a few hundred tasks), so the whole file takes seconds.
"""

from __future__ import annotations

import math
from pathlib import Path

import attrs
import pytest

from swarm.sim import constraintsim, localitysim
from swarm.sim.cmd import NAMES
from swarm.sim.experiments import EXPERIMENTS
from swarm.sim.wheresim import (
    BLIND,
    JSQ,
    PROBE,
    SWARM,
    WhereConfig,
    WhereResult,
    WhereSim,
    run_where,
)
from swarm.sim.workloads import Exponential

CONSTRAINED = WhereConfig(nodes=40, labelled=4, constraints=("pool=x",), tasks=400, seed=3)
DATA = WhereConfig(
    nodes=30,
    slots=4,
    datasets=30,
    load=0.5,
    remote=0.2,
    period=1.0,
    gossip_delay=1.5,
    service=Exponential(10.0),
    tasks=500,
    seed=2,
)


@pytest.mark.parametrize("method", [SWARM, JSQ, PROBE])
def test_constrained_tasks_run_only_on_eligible_nodes(method: str) -> None:
    sim = WhereSim(attrs.evolve(CONSTRAINED, method=method))
    r = sim.run()
    assert r.violations == 0
    assert r.measured == 360  # the first 10 % are warm-up
    used = [n for n in sim.nodes if n.busy > 0]
    assert used and all(n.labels == (("pool", "x"),) for n in used)
    assert len(sim.eligible) == 4


def test_swarm_widens_to_a_scan_when_few_nodes_are_eligible() -> None:
    """40 nodes is under place()'s scan threshold: every placement reads the view."""
    one = run_where(attrs.evolve(CONSTRAINED, labelled=1, tasks=200))
    assert one.backoffs == 0 and one.scanned == 1.0 and one.examined == 39
    big = attrs.evolve(CONSTRAINED, nodes=120, labelled=2, tasks=200)
    r = run_where(big)  # over the threshold: rejection sampling, then a scan
    assert r.backoffs == 0 and 0 < r.scanned <= 1.0


def test_probing_without_the_constraint_costs_probes_and_back_offs() -> None:
    cfg = attrs.evolve(CONSTRAINED, nodes=100, labelled=1, tasks=150, method=PROBE)
    probe, jsq = run_where(cfg), run_where(attrs.evolve(cfg, method=JSQ))
    assert probe.probes > 16 and probe.backoffs > 0
    assert probe.mean > 2 * jsq.mean


def test_jsq_is_no_worse_than_swarm() -> None:
    cfg = attrs.evolve(CONSTRAINED, labelled=40, tasks=1500)
    swarm, jsq = run_where(cfg), run_where(attrs.evolve(cfg, method=JSQ))
    assert jsq.mean <= swarm.mean
    assert jsq.p99 <= swarm.p99 * 1.1


def test_delay_scheduling_raises_locality() -> None:
    blind = run_where(attrs.evolve(DATA, method=BLIND))
    zero = run_where(DATA)
    wait = run_where(attrs.evolve(DATA, delay=2.0))
    assert blind.local < zero.local < wait.local
    assert wait.local > 0.95
    assert zero.held == 0.0 and wait.attempts >= 1.0


def test_a_task_waits_for_a_holder_while_it_has_waited_less_than_d() -> None:
    """With D longer than the run, no task is ever sent to a node without its data."""
    r = run_where(attrs.evolve(DATA, delay=1e6))
    assert r.local == 1.0 and r.gave_up == 0.0


def test_same_seed_same_run() -> None:
    cfg = attrs.evolve(DATA, delay=1.0, tasks=300)
    a, b = run_where(cfg), run_where(cfg)
    assert _values(a) == _values(b)
    c = run_where(attrs.evolve(cfg, seed=cfg.seed + 1))
    assert _values(a) != _values(c)


def _values(r: WhereResult) -> tuple[object, ...]:
    return tuple("nan" if isinstance(x, float) and math.isnan(x) else x for x in attrs.astuple(r))


def test_config_is_checked() -> None:
    with pytest.raises(ValueError):
        WhereConfig(method="central")
    with pytest.raises(ValueError):
        WhereSim(WhereConfig(nodes=5, labelled=0, constraints=("pool=x",)))


def test_both_experiments_are_registered_and_run_small(tmp_path: Path) -> None:
    assert {"constraints", "locality"} <= set(EXPERIMENTS) and "locality" in NAMES
    c = constraintsim.constraints_outcome(tmp_path, nodes=10, tasks=100, seed=1)
    assert all(c.checks.values())
    assert (tmp_path / "constraints.png").exists()
    table = c.tables[0][1]
    assert set(table.column("placer")) == {SWARM, JSQ, PROBE}
    loc = localitysim.locality_outcome(tmp_path, nodes=10, tasks=100, seed=1)
    assert (tmp_path / "locality.png").exists()
    assert "9. Data locality" in loc.section()
    assert len(loc.tables[0][1].rows) == len(localitysim.LOADS) * (1 + len(localitysim.DELAYS))
