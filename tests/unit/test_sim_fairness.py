"""The fairness simulator (`swarm sim fairness`), tiny: seconds, not the full sizes."""

from __future__ import annotations

import math
import random
from pathlib import Path

import attrs
import pytest

from swarm.sim import fairsim as fs
from swarm.sim.experiments import Params, mean_ci, run

TINY = fs.FairSimConfig(nodes=8, day=6.0, warmup=1.0, seed=1)


def test_same_seed_same_result_other_seed_other_result() -> None:
    a = fs.run_swarm(TINY)
    b = fs.run_swarm(TINY)
    assert a == b
    assert fs.run_central(TINY) == fs.run_central(TINY)
    other = fs.run_swarm(attrs.evolve(TINY, seed=2))
    assert other.series != a.series
    assert fs.trace(TINY) == fs.trace(TINY)
    assert fs.trace(TINY) != fs.trace(attrs.evolve(TINY, seed=2))


@pytest.mark.parametrize("cap", [0.3, None])
def test_the_central_yardstick_is_at_least_as_fair(cap: float | None) -> None:
    swarm, central = [], []
    for seed in (1, 2, 3):
        cfg = attrs.evolve(TINY, seed=seed, cap_fraction=cap)
        tr = fs.trace(cfg)
        swarm.append(fs.run_swarm(cfg, tr).jain)
        central.append(fs.run_central(cfg, tr).jain)
    assert sum(central) >= sum(swarm)
    assert all(0 < j <= 1 + 1e-9 for j in swarm + central)


def _burst(seed: int) -> list[fs.Arrival]:
    """60 batch tasks at once (on every node) and 60 others over three units."""
    rng = random.Random(seed)
    tasks = [fs.Arrival(0.0, 0, rng.expovariate(1.0)) for _ in range(60)]
    tasks += [fs.Arrival(3 * rng.random(), 1 + rng.randrange(5), 1.0) for _ in range(60)]
    return sorted(tasks, key=lambda a: a.at)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_with_fresh_views_the_quota_gate_holds_the_cap_within_the_floor(seed: int) -> None:
    for floor in (0.0, 1.0):
        cfg = attrs.evolve(TINY, seed=seed, fresh=True, quota_floor=floor, cap_fraction=0.25)
        bound = min(floor, cfg.cap) * cfg.nodes  # each node: its floor
        for r in (fs.run_swarm(cfg, _burst(seed)), fs.run_swarm(cfg)):
            assert r.overshoot_peak * cfg.cap <= bound + 1e-9
            if floor == 0.0:
                assert r.overshoot_peak == 0.0  # no floor, fresh views: never above
            assert r.cap_use > 0  # the group did run


def test_the_central_scheduler_never_exceeds_the_cap_and_serves_everyone() -> None:
    cfg = attrs.evolve(TINY, cap_fraction=0.25)
    tr = fs.trace(cfg)
    c = fs.run_central(cfg, tr)
    s = fs.run_swarm(cfg, tr)
    assert c.overshoot_peak == 0.0 and c.overshoot_mean == 0.0
    # Every task of the window ran to completion in both (the sim drains the queues).
    assert c.tasks == s.tasks > 0
    assert not math.isnan(c.mean_response) and not math.isnan(s.mean_response)
    assert c.mean_response >= 1.0 - 0.5  # at least about one mean service time
    assert all(x >= 0 for x in s.share_by_user)


def test_drf_allocation_is_max_min_fair() -> None:
    # Three users, 10 slots: one wants 2 (gets them), the others split the rest by
    # dominant share (the second's tasks count double, so it gets half as many).
    got = fs.drf_allocation([2, 50, 50], [0.1, 0.2, 0.1], [False] * 3, 10.0, math.inf)
    assert got[0] == pytest.approx(2.0)
    assert got[1] * 0.2 == pytest.approx(got[2] * 0.1, rel=1e-6)
    assert sum(got) == pytest.approx(10.0)
    # A capped user gets at most the cap; the others take what it leaves.
    capped = fs.drf_allocation([50, 50], [0.1, 0.1], [True, False], 10.0, 2.0)
    assert capped[0] == pytest.approx(2.0) and capped[1] == pytest.approx(8.0)
    # Enough room: everyone gets what it wants; nobody wanting: nothing.
    assert fs.drf_allocation([1, 2], [0.1, 0.1], [False, False], 10.0, math.inf) == [1.0, 2.0]
    assert fs.drf_allocation([0, 0], [0.1, 0.1], [False, False], 10.0, math.inf) == [0.0, 0.0]


def test_default_delay_follows_the_measured_points() -> None:
    assert fs.default_delay(100) == pytest.approx(1.67)
    assert fs.default_delay(1000) == pytest.approx(7.98)
    assert fs.default_delay(10) == fs.default_delay(50)
    assert fs.default_delay(100) < fs.default_delay(150) < fs.default_delay(200)
    assert fs.default_delay(5000) == fs.default_delay(1000)


def test_mean_ci() -> None:
    mu, ci = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    assert mu == 3.0
    assert ci == pytest.approx(2.776 * math.sqrt(2.5) / math.sqrt(5), rel=1e-3)
    assert math.isnan(mean_ci([1.0])[1])


def test_the_experiment_writes_its_files_and_checks(tmp_path: Path) -> None:
    o = run("fairness", Params(out=tmp_path, nodes=6, seed=1))
    for name in ("fairness.csv", "fairness_quota.csv", "fairness.md"):
        assert (tmp_path / name).stat().st_size > 0
    for name in ("fairness.png", "fairness_quota.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    table = dict(o.tables)["fairness"]
    assert set(table.column("scheduler")) == {"swarm", "central"}
    assert all(0 < j <= 1 + 1e-9 for j in table.column("Jain (alloc / DRF share)"))
    assert len(o.checks) == 3
