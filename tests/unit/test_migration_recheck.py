"""The target's re-check of a migration and the duration estimator (policy.migration)."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.model import GpuDeviceFree, GpuRequest, LoadReport, MigrateMode
from swarm.policy import migration as mig
from swarm.policy.migration import DurationEstimator, MigrationConfig, RunningTask

CFG = MigrationConfig(max_per_node=2)


def report(node: str, running: int = 0, **kw: Any) -> LoadReport:
    return LoadReport(node=node, version=1, running=running, cpus=4.0, **kw)


def task(**kw: Any) -> RunningTask:
    base: dict[str, Any] = {"mode": MigrateMode.CHECKPOINT, "age": 100.0}
    base.update(kw)
    return RunningTask(task_id="t", **base)


def test_accepts_a_move_that_is_still_worth_it() -> None:
    assert (
        mig.recheck_at_target(
            task(), report("src", 40), report("dst", 0), config=CFG, bandwidth=1e8
        )
        is None
    )


def test_refuses_when_its_fresh_load_makes_the_move_pointless() -> None:
    # the source saw us idle, but we are as busy as the source now
    why = mig.recheck_at_target(
        task(), report("src", 40), report("dst", 40), config=CFG, bandwidth=1e8
    )
    assert why is not None and "not worth it" in why


def test_refuses_a_huge_state_on_a_slow_link() -> None:
    big = task(state_bytes=10**9)
    why = mig.recheck_at_target(big, report("src", 40), report("dst", 0), config=CFG, bandwidth=1e3)
    assert why is not None and "not worth it" in why


def test_refuses_when_draining_without_criu_or_gpu_room_or_at_its_limit() -> None:
    src = report("src", 40)
    drained = report("dst", shares=0)
    assert "draining" in (
        mig.recheck_at_target(task(), src, drained, config=CFG, bandwidth=1e8) or ""
    )
    criu = task(mode=MigrateMode.CRIU)
    assert "CRIU" in (
        mig.recheck_at_target(criu, src, report("dst"), config=CFG, bandwidth=1e8) or ""
    )
    assert (
        mig.recheck_at_target(criu, src, report("dst", criu=True), config=CFG, bandwidth=1e8)
        is None
    )
    gpu = task(gpu=GpuRequest(core=100))
    full = report("dst", gpus=(GpuDeviceFree(0, 10, 1 << 30, 1 << 34),))
    assert "GPU" in (mig.recheck_at_target(gpu, src, full, config=CFG, bandwidth=1e8) or "")
    busy = mig.recheck_at_target(task(), src, report("dst"), config=CFG, bandwidth=1e8, incoming=2)
    assert busy is not None and "in flight" in busy
    never = task(mode=MigrateMode.NEVER)
    assert mig.recheck_at_target(never, src, report("dst"), config=CFG, bandwidth=1e8) is not None


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 64),
    st.integers(0, 64),
    st.floats(0, 1e4),
    st.integers(0, 10**10),
    st.floats(1e3, 1e10),
)
def test_the_recheck_is_the_policy_rule_with_the_targets_load(
    here: int, there: int, age: float, size: int, bw: float
) -> None:
    t = task(age=age, state_bytes=size)
    src, dst = report("src", here), report("dst", there)
    cb = mig.cost_benefit(t, src, dst, config=CFG, bandwidth=bw)
    ok = mig.recheck_at_target(t, src, dst, config=CFG, bandwidth=bw) is None
    assert ok == cb.worth_it(CFG.margin)


def test_duration_estimator_smooths_and_drops_nonsense() -> None:
    d = DurationEstimator(alpha=0.5)
    assert d.estimate("checkpoint", 2.0) == 2.0
    d = d.observe("checkpoint", 1.0).observe("checkpoint", 3.0)
    assert math.isclose(d.estimate("checkpoint", 0.0), 2.0)
    d = d.observe("checkpoint", float("nan")).observe("checkpoint", -1.0)
    assert d.dropped == 2 and math.isclose(d.estimate("checkpoint", 0.0), 2.0)
    assert d.estimate("restart", 7.0) == 7.0
