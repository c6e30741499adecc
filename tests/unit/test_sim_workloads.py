"""Workload generators and trace replay."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.policy.gpu import validate
from swarm.sim.workloads import (
    GPU_MIX,
    TRACE_COLUMNS,
    BoundedPareto,
    Exponential,
    GoogleLikeConfig,
    Job,
    google_like,
    gpu_jobs,
    gpu_request,
    hetero_nodes,
    mean_gpu_core,
    parse_trace,
    poisson,
    write_trace,
)


def test_bounded_pareto_has_the_requested_mean_and_bounds() -> None:
    d = BoundedPareto(alpha=1.1, ratio=1000.0, mean=2.0)
    rng = random.Random(1)
    xs = [d.draw(rng) for _ in range(200_000)]
    assert min(xs) >= d.lo and max(xs) <= d.hi
    assert d.hi == pytest.approx(1000.0 * d.lo)
    assert sum(xs) / len(xs) == pytest.approx(2.0, rel=0.05)
    assert BoundedPareto(alpha=1.0).lo > 0  # the alpha = 1 special case


def test_poisson_rate_count_until_and_reservations() -> None:
    jobs = list(poisson(10.0, Exponential(1.0), random.Random(2), count=20_000))
    assert len(jobs) == 20_000
    assert all(a.t <= b.t for a, b in itertools.pairwise(jobs))
    assert jobs[-1].t == pytest.approx(2000.0, rel=0.05)
    short = list(poisson(10.0, Exponential(1.0), random.Random(2), until=5.0))
    assert short and all(j.t < 5.0 for j in short)
    res = list(poisson(1.0, Exponential(), random.Random(3), count=10_000, reserve=((256, 0.2),)))
    frac = sum(1 for j in res if j.reserve == 256) / len(res)
    assert frac == pytest.approx(0.2, abs=0.02)
    with pytest.raises(ValueError):
        next(poisson(0.0, Exponential(), random.Random(1), count=1))
    with pytest.raises(ValueError):
        next(poisson(1.0, Exponential(), random.Random(1)))


def test_hetero_nodes_follow_the_mix_with_shares_per_core() -> None:
    nodes = hetero_nodes(100, random.Random(1))
    assert len(nodes) == 100
    assert all(n.shares == round(1024 * n.cores) for n in nodes)
    counts = {s: sum(1 for n in nodes if n.shares == s) for s in (512, 1024, 2048, 4096)}
    assert counts == {512: 25, 1024: 40, 2048: 25, 4096: 10}
    assert len(hetero_nodes(7, random.Random(1))) == 7


def test_google_like_usage_is_far_below_request_with_some_peaks() -> None:
    cfg = GoogleLikeConfig()
    jobs = list(google_like(5.0, random.Random(4), until=2000.0, config=cfg))
    cpu_ratio = sum(j.cpu_use for j in jobs) / sum(j.cpu or 0 for j in jobs)
    mem_ratio = sum(j.mem_use for j in jobs) / sum(j.mem or 0 for j in jobs)
    assert 0.25 < cpu_ratio < 0.5
    assert 0.4 < mem_ratio < 0.65
    prod = [j for j in jobs if j.klass == "prod"]
    batch = [j for j in jobs if j.klass == "batch"]
    assert len(prod) / len(jobs) == pytest.approx(0.3, abs=0.03)
    assert sum(j.duration for j in prod) / len(prod) > 3 * sum(j.duration for j in batch) / len(
        batch
    )
    with pytest.raises(ValueError):
        GoogleLikeConfig(classes=cfg.classes[:1])


def test_gpu_requests_are_valid_and_mostly_fractional() -> None:
    rng = random.Random(5)
    reqs = [gpu_request(rng) for _ in range(5000)]
    for r in reqs:
        validate(r)
    frac = sum(1 for r in reqs if r.core < 100) / len(reqs)
    assert 0.55 < frac < 0.75
    assert sum(p for _, p in GPU_MIX) == pytest.approx(1.0)
    assert 50 < mean_gpu_core() < 150
    jobs = list(gpu_jobs(2.0, random.Random(6), until=100.0))
    assert jobs and all(j.gpu is not None and j.weight == j.gpu.core / 100 for j in jobs)


def test_trace_replay_parses_skips_and_counts() -> None:
    text = "\n".join(
        [
            ",".join(TRACE_COLUMNS),
            "# a comment",
            "5,10,2,4,0.5,1.5",
            "1,2,1,1,0.2,0.3",
            "",
            "x,1,1,1,1,1",  # not a number
            "2,0,1,1,1,1",  # zero duration
            "3,1,-1,1,1,1",  # negative
            "4,1,1",  # too few columns
            "6,1,1,1,nan,1",  # not finite
            "7,3,2,2,1,1,extra",  # extra columns are ignored
        ]
    )
    tr = parse_trace(text.splitlines())
    assert [j.t for j in tr.jobs] == [1.0, 5.0, 7.0]  # sorted by arrival
    assert tr.dropped == 5 and len(tr.problems) == 5
    j = tr.jobs[1]
    assert (j.duration, j.cpu, j.mem, j.cpu_use, j.mem_use) == (10.0, 2.0, 4.0, 0.5, 1.5)
    again = parse_trace(write_trace(tr.jobs).splitlines())
    assert [(x.t, x.duration, x.cpu) for x in again.jobs] == [
        (x.t, x.duration, x.cpu) for x in tr.jobs
    ]
    assert again.dropped == 0


def test_trace_file_round_trip(tmp_path: object) -> None:
    from pathlib import Path

    from swarm.sim.workloads import read_trace

    path = Path(str(tmp_path)) / "t.csv"
    jobs = [Job(float(i), 1.0 + i, cpu=1.0, mem=2.0, cpu_use=0.5, mem_use=1.0) for i in range(5)]
    path.write_text(write_trace(jobs), encoding="utf-8")
    tr = read_trace(path)
    assert len(tr) == 5 and tr.dropped == 0


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300))
def test_trace_parser_never_crashes(text: str) -> None:
    tr = parse_trace(text.splitlines())
    assert tr.dropped >= 0
    assert all(j.duration > 0 and j.t >= 0 for j in tr.jobs)


def test_trace_parser_drops_oversized_fields() -> None:
    tr = parse_trace(["1,1,1,1,1,1", "x" * 200_000])
    assert len(tr) == 1 and tr.dropped == 1
