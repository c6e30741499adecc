"""Load index, usage estimator and Flex penalty dynamics / admission rule."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.model import LoadReport, TaskSpec
from swarm.policy.load import (
    UNIT,
    Capacity,
    FlexConfig,
    FlexState,
    PeakEstimator,
    Usage,
    flex_refusal,
    flex_update,
    load_index,
    projected_load,
    qos_holds,
    report_load,
    report_projected,
)

CFG = FlexConfig()


def test_load_index_is_the_fleet_formula() -> None:
    assert load_index(3.0, 1024, 0) == 3.0 / 1024
    assert load_index(3.0, 2048, 1024) == 3.0 / 1024
    assert load_index(1.0, 1024, 0) == UNIT


def test_no_unreserved_share_is_infinite_load() -> None:
    assert math.isinf(load_index(0.0, 0, 0))  # drained
    assert math.isinf(load_index(1.0, 1024, 1024))  # all reserved
    assert math.isinf(load_index(1.0, 100, 300))  # global tasks pushed below zero


def test_projected_load_adds_weight_and_reservation() -> None:
    assert projected_load(2.0, 1024, 0, 1.0, 512) == 3.0 / 512
    assert math.isinf(projected_load(0.0, 1024, 0, 1.0, 1024))
    r = LoadReport("n", 1, shares=2048, reserved_shares=1024, weight_sum=1.0)
    spec = TaskSpec(id="t", argv=("x",), weight=2.0, reserve_shares=24)
    assert report_load(r) == 1.0 / 1024
    assert report_projected(r, spec) == 3.0 / 1000


# ---------------------------------------------------------------------- Flex


def test_flex_starts_at_p_init() -> None:
    assert FlexState.initial(CFG).p == 1.5


def test_violation_at_the_floor_still_raises_p() -> None:
    s = FlexState(p=CFG.p_min)
    s2 = flex_update(s, CFG, qos_ok=False)
    assert s2.p > CFG.p_min
    assert s2.p == CFG.p_min + CFG.beta * CFG.min_rise
    assert s2.violated


def test_violation_rule_above_the_floor() -> None:
    s = FlexState(p=2.0)
    assert flex_update(s, CFG, qos_ok=False).p == 2.0 + 1.0 * (2.0 - 1.0)


def test_p_decays_to_the_floor_and_stays() -> None:
    s = FlexState(p=3.0)
    ps = []
    for _ in range(200):
        s = flex_update(s, CFG, qos_ok=True)
        ps.append(s.p)
    assert all(a >= b for a, b in itertools.pairwise(ps))
    assert ps[-1] == CFG.p_min
    assert flex_update(s, CFG, qos_ok=True).p == CFG.p_min


@settings(max_examples=200, deadline=None)
@given(
    p0=st.floats(min_value=1.0, max_value=16.0),
    qos=st.lists(st.booleans(), max_size=300),
)
def test_p_dynamics_properties(p0: float, qos: list[bool]) -> None:
    s = FlexState(p=p0)
    for ok in qos:
        nxt = flex_update(s, CFG, qos_ok=ok)
        assert CFG.p_min <= nxt.p <= CFG.p_max
        if ok:
            assert nxt.p <= s.p  # never rises while QoS holds
            assert nxt.p == max(CFG.p_min, CFG.alpha * s.p)
        elif s.p < CFG.p_max:
            assert nxt.p > s.p  # always rises on violation, floor included
        s = nxt


def test_qos_holds_is_psi_under_targets() -> None:
    assert qos_holds(5.0, 1.0, CFG)
    assert not qos_holds(CFG.psi_cpu_target, 0.0, CFG)
    assert not qos_holds(0.0, CFG.psi_mem_target + 1, CFG)


@settings(max_examples=300, deadline=None)
@given(
    p=st.floats(min_value=1.0, max_value=16.0),
    ucpu=st.floats(min_value=0.0, max_value=128.0),
    umem=st.integers(min_value=0, max_value=1 << 40),
    rcpu=st.floats(min_value=0.0, max_value=64.0),
    rmem=st.integers(min_value=0, max_value=1 << 38),
    ccpu=st.floats(min_value=0.0, max_value=128.0),
    cmem=st.integers(min_value=0, max_value=1 << 40),
)
def test_admission_rule_is_p_usage_plus_request_within_capacity(
    p: float, ucpu: float, umem: int, rcpu: float, rmem: int, ccpu: float, cmem: int
) -> None:
    why = flex_refusal(p, Usage(ucpu, umem), Capacity(ccpu, cmem), rcpu, rmem)
    cpu_ok = ccpu <= 0 or p * ucpu + rcpu <= ccpu
    mem_ok = cmem <= 0 or p * umem + rmem <= cmem
    assert (why is None) == (cpu_ok and mem_ok)
    if not cpu_ok:
        assert why is not None and why.startswith("cpu")
    elif not mem_ok:
        assert why is not None and why.startswith("memory")


def test_admission_example() -> None:
    cap = Capacity(cpu=8.0, mem=16 << 30)
    assert flex_refusal(1.5, Usage(4.0, 4 << 30), cap, 2.0, 1 << 30) is None
    why = flex_refusal(1.5, Usage(4.0, 4 << 30), cap, 2.5, 1 << 30)
    assert why is not None and "1.50*4.00 + 2.50 = 8.50 > capacity 8.00" in why


# ------------------------------------------------------------ usage estimate


def test_peak_follows_rises_at_once_and_decays_by_half_life() -> None:
    e = PeakEstimator(half_life=10.0).update(0.0, Usage(1.0, 100))
    e = e.update(1.0, Usage(4.0, 400))
    assert e.estimate == Usage(4.0, 400)
    e = e.update(11.0, Usage(0.0, 0))
    assert math.isclose(e.cpu, 2.0)
    assert e.estimate.mem == 200
    e = e.update(11.0, Usage(3.0, 10))
    assert e.cpu == 3.0


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 100.0), st.floats(0.0, 64.0), st.integers(0, 1 << 40)),
        min_size=1,
        max_size=40,
    )
)
def test_peak_estimate_never_below_latest_sample(
    samples: list[tuple[float, float, int]],
) -> None:
    e = PeakEstimator(half_life=30.0)
    t = 0.0
    for dt, cpu, mem in samples:
        t += dt
        e = e.update(t, Usage(cpu, mem))
        assert e.cpu >= cpu
        assert e.estimate.mem >= mem
