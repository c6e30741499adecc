"""Power-of-d placement, filters, explain, admission and the origin's retry state."""

from __future__ import annotations

import random
from collections.abc import Iterator

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.model import GpuDeviceFree, GpuRequest, LoadReport, NodeId, TaskSpec
from swarm.policy.load import Capacity, FlexState, Usage, report_load
from swarm.policy.placement import (
    Needs,
    PlacementRetry,
    RetryPolicy,
    admit,
    place,
    refusal,
)
from swarm.policy.shares import ShareLedger
from swarm.policy.view import LoadView, PeerEntry, PeerInfo

NOW = 1000.0
GIB = 1 << 30


def spec(i: int = 0, **kw: object) -> TaskSpec:
    return TaskSpec(id=f"t{i}", argv=("true",), **kw)  # type: ignore[arg-type]


def rep(node: str, **kw: object) -> LoadReport:
    return LoadReport(node=node, version=1, **kw)  # type: ignore[arg-type]


def view_of(*reports: LoadReport, age: float = 1.0) -> LoadView:
    v = LoadView()
    for r in reports:
        v.upsert(r, NOW - age)
    return v


# ---------------------------------------------------------------- filters


def test_refusal_rules() -> None:
    n = Needs()
    assert refusal(rep("a", shares=0), n) is not None
    assert refusal(rep("a", shares=0), Needs(is_global=True)) is None
    assert refusal(rep("a", shares=1024, reserved_shares=1024), n) is not None
    assert refusal(rep("a", reserved_shares=512), Needs(reserve_shares=513)) is not None
    assert refusal(rep("a", reserved_shares=512), Needs(reserve_shares=512)) is None
    assert refusal(rep("a", cpus=4.0), Needs(cpu=8.0)) is not None
    assert refusal(rep("a", cpus=4.0, cpu_util=0.75), Needs(cpu=2.0)) is not None
    assert refusal(rep("a", cpus=4.0, cpu_util=0.25), Needs(cpu=2.0)) is None
    assert refusal(rep("a"), Needs(cpu=64.0)) is None  # capacity not reported
    assert refusal(rep("a", mem_total=8 * GIB, mem_available=GIB), Needs(mem=2 * GIB)) is not None
    assert refusal(rep("a", mem_total=8 * GIB, mem_available=4 * GIB), Needs(mem=2 * GIB)) is None


def test_gpu_requests_go_only_where_the_summary_fits() -> None:
    gpu = GpuRequest(core=50, memory_bytes=4 * GIB)
    full = (GpuDeviceFree(0, 10, GIB, 16 * GIB),)
    free = (GpuDeviceFree(0, 100, 16 * GIB, 16 * GIB),)
    v = view_of(rep("a", gpus=full), rep("b", gpus=free), rep("c"))
    for seed in range(20):
        p = place(spec(gpu=gpu), rep("me"), v, random.Random(seed), NOW)
        assert p.target == "b"
    reasons = {c.node: c.why_not for c in p.candidates}
    assert "gpu request" in reasons["a"] and "gpu request" in reasons["c"]


# ------------------------------------------------------------------ basics


def test_picks_lower_projected_load_and_explains_every_candidate() -> None:
    v = view_of(rep("a", weight_sum=5.0), rep("b", weight_sum=1.0), rep("c", shares=0))
    p = place(spec(), rep("me", weight_sum=3.0), v, random.Random(1), NOW, d=3)
    assert p.ok and p.target == "b" and not p.local
    assert {c.node for c in p.candidates} == {"me", "a", "b", "c"}
    by = {c.node: c for c in p.candidates}
    assert by["c"].why_not.startswith("drained") and by["c"].score is None
    assert by["b"].score == 2.0 / 1024 and by["b"].age == 1.0
    assert by["me"].local and by["me"].age == 0.0
    assert "chose b" in p.summary
    ex = p.explain()
    assert ex["target"] == "b" and len(ex["candidates"]) == 4


def test_local_node_is_a_candidate() -> None:
    v = view_of(rep("a", weight_sum=5.0), rep("b", weight_sum=4.0))
    p = place(spec(), rep("me"), v, random.Random(0), NOW)
    assert p.target == "me" and p.local


def test_ties_are_broken_at_random_but_deterministically() -> None:
    v = view_of(*(rep(f"n{i}") for i in range(5)))
    picks = {place(spec(), rep("me"), v, random.Random(s), NOW, d=5).target for s in range(40)}
    assert len(picks) > 2
    a = place(spec(), rep("me"), v, random.Random(7), NOW)
    b = place(spec(), rep("me"), v, random.Random(7), NOW)
    assert a == b


def test_exclude_and_max_age() -> None:
    v = LoadView()
    v.upsert(rep("old"), NOW - 100.0)
    v.upsert(rep("ref"), NOW)
    v.upsert(rep("ok", weight_sum=9.0), NOW)
    me = rep("me", shares=0)
    p = place(spec(), me, v, random.Random(0), NOW, d=3, exclude={"ref"}, max_age=10.0)
    assert p.target == "ok"
    by = {c.node: c.why_not for c in p.candidates}
    assert by["ref"] == "refused earlier"
    assert by["old"].startswith("report too old")


def test_no_eligible_node_names_the_closest_miss() -> None:
    v = view_of(
        rep("n1", reserved_shares=900),
        rep("n2", shares=0),
        rep("n3", reserved_shares=512),
        rep("n4", shares=256),
    )
    p = place(spec(reserve_shares=600), rep("me", reserved_shares=1000), v, random.Random(0), NOW)
    assert not p.ok and p.target is None
    assert "reservation of 600 shares fits nowhere: largest free is 512 on n3" in p.summary
    assert "drained" in p.summary
    assert {c.node for c in p.candidates} == {"me", "n1", "n2", "n3", "n4"}


def test_large_views_are_sampled_not_scanned() -> None:
    class Counting(LoadView):
        gets = 0

        def __getitem__(self, node: NodeId) -> PeerInfo:
            Counting.gets += 1
            return super().__getitem__(node)

        def __iter__(self) -> Iterator[NodeId]:
            raise AssertionError("placement iterated the whole view")

    v = Counting()
    for i in range(10_000):
        v.upsert(rep(f"n{i}", weight_sum=float(i % 7)), NOW)
    p = place(spec(), rep("me"), v, random.Random(3), NOW)
    assert p.ok and not p.scanned
    assert p.examined == 2 and len(p.candidates) == 3
    assert Counting.gets < 20


# -------------------------------------------------------------- properties

REPORTS = st.builds(
    lambda shares, reserved, ws, gpus: (shares, reserved, ws, gpus),
    st.sampled_from([0, 0, 256, 1024, 2048]),
    st.sampled_from([0, 0, 100, 512, 1024]),
    st.floats(0.0, 50.0),
    st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(
    peers=st.lists(REPORTS, max_size=90),
    me=REPORTS,
    reserve=st.sampled_from([0, 0, 128, 600, 1500]),
    d=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
    is_global=st.booleans(),
)
def test_placement_never_drains_never_oversubscribes(
    peers: list[tuple[int, int, float, bool]],
    me: tuple[int, int, float, bool],
    reserve: int,
    d: int,
    seed: int,
    is_global: bool,
) -> None:
    def mk(name: str, t: tuple[int, int, float, bool]) -> LoadReport:
        return rep(name, shares=t[0], reserved_shares=t[1], weight_sum=t[2])

    v = view_of(*(mk(f"n{i}", t) for i, t in enumerate(peers)))
    local = mk("me", me)
    s = spec(reserve_shares=reserve, is_global=is_global)
    p = place(s, local, v, random.Random(seed), NOW, d=d)
    if p.target is None:
        assert p.summary.startswith("no eligible node")
        if len(v) <= 64 and not is_global:
            eligible = [
                r
                for r in [local] + [e.report for e in v.values()]
                if refusal(r, Needs.of(s)) is None
            ]
            assert eligible == []
        return
    target = local if p.local else v[p.target].report
    if not is_global:
        assert target.shares > 0
        assert target.shares - target.reserved_shares >= reserve
        assert target.shares - target.reserved_shares > 0
    # explain: every peer of a small view, plus the local node, appears exactly once
    names = [c.node for c in p.candidates]
    assert len(names) == len(set(names))
    if len(v) <= 64:
        assert set(names) == set(v) | {"me"}
    scores = {c.node: c.score for c in p.candidates if c.score is not None}
    assert len([n for n in scores if n != "me"]) <= d
    assert scores[p.target] == min(scores.values())


# ------------------------------------------------------------- statistics


def _balls_into_bins(n: int, m: int, d: int, seed: int) -> int:
    """Place m unit tasks on n equal peers from a drained origin with fresh reports;
    return the max tasks on one peer."""
    rng = random.Random(seed)
    v = LoadView()
    counts = [0] * n
    for i in range(n):
        v.upsert(rep(f"n{i}"), NOW)
    origin = rep("origin", shares=0)
    for j in range(m):
        p = place(spec(j), origin, v, rng, NOW, d=d)
        assert p.target is not None
        k = int(p.target[1:])
        counts[k] += 1
        v.upsert(rep(p.target, weight_sum=float(counts[k])), NOW)
    return max(counts)


def test_two_choices_beat_one_on_max_load() -> None:
    n = 2000
    one = [_balls_into_bins(n, n, 1, s) for s in (1, 2)]
    two = [_balls_into_bins(n, n, 2, s) for s in (1, 2)]
    # theory: one choice ~ ln n / ln ln n (about 5-7 here), two ~ ln ln n / ln 2 + O(1) (3)
    assert max(two) <= 4
    assert min(one) >= 5
    assert max(two) < min(one)


def test_shares_weight_the_distribution() -> None:
    rng = random.Random(11)
    v = LoadView()
    shares = {f"n{i}": (2048 if i % 2 else 1024) for i in range(100)}
    counts = dict.fromkeys(shares, 0)
    for node, sh in shares.items():
        v.upsert(rep(node, shares=sh), NOW)
    origin = rep("origin", shares=0)
    for j in range(6000):
        p = place(spec(j), origin, v, rng, NOW)
        assert p.target is not None
        counts[p.target] += 1
        v.upsert(rep(p.target, shares=shares[p.target], weight_sum=float(counts[p.target])), NOW)
    big = sum(c for n, c in counts.items() if shares[n] == 2048) / 50
    small = sum(c for n, c in counts.items() if shares[n] == 1024) / 50
    assert 1.8 <= big / small <= 2.2
    loads = [report_load(e.report) for e in v.values()]
    # two choices keep the spread at a few tasks' worth: ln ln n / ln 2 + O(1) (about
    # 2.2 + O(1) for n = 100; random placement would be ~log n / log log n times more)
    assert max(loads) - min(loads) <= 4 / 1024


# -------------------------------------------------------------- admission


def test_admit_rechecks_fresh_state() -> None:
    flex = FlexState(p=1.5)
    cap = Capacity(cpu=8.0, mem=16 * GIB)
    idle = Usage(1.0, GIB)
    led = ShareLedger(1024)
    assert admit(spec(1), led, flex, idle, cap).ok
    assert not admit(spec(2, cpu=7.0), led, flex, idle, cap).ok  # 1.5*1 + 7 > 8
    assert admit(spec(3, cpu=6.0), led, flex, idle, cap).ok
    busy = Usage(6.0, GIB)
    r = admit(spec(4, cpu=0.5), led, flex, busy, cap)  # 1.5*6 + 0.5 > 8
    assert not r.ok and r.reason.startswith("cpu")
    # Flex guards declared resources only: an undeclared task still lands on a busy node
    assert admit(spec(41), led, flex, busy, cap).ok
    led.add(spec(5, reserve_shares=1000))
    led.start("t5")
    r = admit(spec(6, reserve_shares=100), led, flex, idle, cap)
    assert not r.ok and "reservation" in r.reason
    assert admit(spec(5), led, flex, idle, cap).reason == "already here"
    drained = ShareLedger(0)
    assert not admit(spec(7), drained, flex, idle, cap).ok
    assert admit(spec(8, is_global=True), drained, flex, busy, cap).ok
    gpu = GpuRequest(core=50)
    none_free = (GpuDeviceFree(0, 20, GIB, GIB),)
    assert not admit(spec(9, gpu=gpu), led, flex, idle, cap, gpus=none_free).ok


# ------------------------------------------------------------------- retry


def test_retry_excludes_refusers_then_backs_off_exponentially() -> None:
    pol = RetryPolicy(max_tries=3, base=1.0, factor=2.0, max_backoff=10.0, jitter=0.0)
    rng = random.Random(0)
    r = PlacementRetry()
    r = r.on_refusal("a", 0.0, pol, rng)
    assert r.exclude == {"a"} and r.ready(0.0)
    r = r.on_refusal("b", 0.0, pol, rng)
    assert r.exclude == {"a", "b"}
    r = r.on_refusal("c", 0.0, pol, rng)  # third refusal: back off, clean slate
    assert r.exclude == frozenset() and r.not_before == 1.0 and not r.ready(0.5)
    waits = []
    for _ in range(6):
        t = r.not_before
        r = r.on_no_target(t, pol, rng)
        waits.append(r.not_before - t)
    assert waits == [2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 30))
def test_retry_backoff_is_bounded_and_deterministic(seed: int, rounds: int) -> None:
    pol = RetryPolicy()
    r1 = attrs.evolve(PlacementRetry(), rounds=rounds).on_no_target(5.0, pol, random.Random(seed))
    r2 = attrs.evolve(PlacementRetry(), rounds=rounds).on_no_target(5.0, pol, random.Random(seed))
    assert r1 == r2
    assert 5.0 < r1.not_before <= 5.0 + pol.max_backoff * (1 + pol.jitter)


def test_view_entries_may_be_any_peer_info() -> None:
    @attrs.frozen
    class Other:
        report: LoadReport
        received_at: float
        extra: int = 0

    v: dict[NodeId, PeerInfo] = {"a": Other(rep("a"), NOW), "me": PeerEntry(rep("me"), NOW)}
    p = place(spec(), rep("me", weight_sum=3.0), v, random.Random(0), NOW)
    assert p.target == "a" and p.view_size == 1
