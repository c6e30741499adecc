"""Speculative backups' pure core (policy/hedge.py) and its simulator (sim/hedgesim.py)."""

from __future__ import annotations

import math

import attrs
import pytest

from swarm.policy.hedge import HedgeConfig, Hedger, Running
from swarm.sim.hedgesim import HedgeSimConfig, run_hedge

CFG = HedgeConfig(quantile=0.9, min_history=10, slack=1.0, budget=0.05)


def _trained(runtime: float = 1.0, n: int = 100) -> Hedger:
    h = Hedger(CFG)
    for _ in range(n):
        h.finished("c", runtime)
    return h


def test_no_backup_without_enough_history() -> None:
    h = Hedger(CFG)
    for _ in range(9):
        h.finished("c", 1.0)
    assert h.threshold("c") == math.inf
    assert h.due(100.0, [Running("t1", "c", 0.0, idempotent=True)], room=4) == []
    h.finished("c", 1.0)
    assert h.threshold("c") == 1.0


def test_late_idempotent_tasks_are_backed_up_most_overdue_first() -> None:
    h = _trained()
    running = [
        Running("t1", "c", 8.0, idempotent=True),  # 2 s in: late
        Running("t2", "c", 5.0, idempotent=True),  # 5 s in: later
        Running("t3", "c", 9.5, idempotent=True),  # 0.5 s in: on time
        Running("t4", "c", 0.0, idempotent=False),  # never: not idempotent
        Running("t5", "c", 0.0, idempotent=True, backed_up=True),  # has one already
    ]
    assert h.due(10.0, running, room=4) == ["t2", "t1"]
    assert h.due(10.0, running, room=1)[:1] == ["t2"]
    assert h.stats.refused_room >= 1


def test_the_budget_bounds_backups_and_is_released_when_they_end() -> None:
    h = _trained(n=20)  # 20 task-seconds of work: 1 s of budget at 5 %
    running = [Running(f"t{i}", "c", 0.0, idempotent=True) for i in range(5)]
    first = h.due(10.0, running, room=5)
    assert first == ["t0"]  # each charged the class's quantile (1 s) up front
    assert h.stats.refused_budget == 4
    assert h.due(10.0, running[1:], room=5) == []  # the charge holds while it runs
    h.backup_ended("t0", 0.4, won=True)
    assert h.stats.won == 1 and h.budget_left() == pytest.approx(0.6)
    for _ in range(20):
        h.finished("c", 1.0)
    assert h.due(10.0, running[1:], room=5) == ["t1"]


def test_config_validation() -> None:
    for bad in ({"quantile": 1.0}, {"min_history": 0}, {"budget": -0.1}, {"slack": 0.5}):
        with pytest.raises(ValueError):
            HedgeConfig(**bad)  # type: ignore[arg-type]


def test_the_simulator_runs_every_job_and_backups_cut_the_straggler_tail() -> None:
    base = HedgeSimConfig(nodes=40, slow_fraction=0.05, utilisation=0.5, jobs=3000, seed=2)
    off = run_hedge(attrs.evolve(base, hedge=None))
    on = run_hedge(base)
    assert off.jobs == on.jobs == 2700
    assert off.backups == 0 and on.backups > 0 and 0 < on.won <= on.backups
    assert 0.0 < off.straggled < 1.0
    assert on.p999 < 0.7 * off.p999
    assert 0.0 < on.extra <= 0.05 + 1e-9  # within the budget
    assert run_hedge(base) == on  # deterministic
