"""Balls, the Flex and GPU simulators, the report writer and `swarm sim` plumbing.

The experiments themselves are exercised at full size by `make experiments`; here
they run tiny, only to show that every path works and writes what it promises.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import attrs
import pytest

from swarm.sim import balls
from swarm.sim.cmd import run_command
from swarm.sim.experiments import (
    Params,
    _crossover,
    _interp,
    mm1_mean,
    mmc_mean,
    supermarket_mean,
)
from swarm.sim.flexsim import FLEX, LRF, FlexSimConfig, flex_config, run_flex
from swarm.sim.gpusim import GpuSimConfig, run_gpu
from swarm.sim.report import Outcome, Table, doc_page, fmt


def test_balls_two_choices_beat_one() -> None:
    one = balls.throw(2000, 2000, 1, random.Random(1))
    two = balls.throw(2000, 2000, 2, random.Random(1))
    assert sum(two.histogram) == 2000
    assert sum(i * c for i, c in enumerate(two.histogram)) == 2000
    assert two.max_load <= balls.theory_d(2000, 2) + 1
    assert one.max_load > two.max_load
    with pytest.raises(ValueError):
        balls.throw(0, 1, 1, random.Random(1))


def test_closed_forms() -> None:
    assert mm1_mean(0.5) == pytest.approx(2.0)
    assert mmc_mean(0.5, 1) == pytest.approx(2.0)  # M/M/1 is M/M/c with c = 1
    assert 1.0 < mmc_mean(0.9, 32) < mm1_mean(0.9)
    # Supermarket fixed point: d = 1 gives back M/M/1's 1 / (1 - lambda).
    assert supermarket_mean(0.5, d=2) < mm1_mean(0.5)
    assert supermarket_mean(0.9, d=2) == pytest.approx(2.6, abs=0.05)


def test_crossover_and_interpolation() -> None:
    xs = [0.1, 0.5, 0.9]
    assert _crossover(xs, [1.0, 2.0, 3.0], [1.5, 2.0, 2.0]) == pytest.approx(0.5)
    assert _crossover(xs, [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]) is None
    assert _interp(0.3, [0.1, 0.5], [1.0, 3.0]) == pytest.approx(2.0)
    assert _interp(9.0, [0.1, 0.5], [1.0, 3.0]) == 3.0


def test_flex_sim_small() -> None:
    small = FlexSimConfig(nodes=4, horizon=150, warmup=30, seed=1)
    lf = run_flex(small)
    ov = run_flex(attrs.evolve(small, oversub=2.0))
    fx = run_flex(attrs.evolve(small, admission=FLEX, order=LRF, flex=flex_config(1.25)))
    for r in (lf, ov, fx):
        assert 0.0 <= r.utilisation <= 1.0 and 0.0 <= r.violation_pct <= 100.0
        assert r.admitted > 0
    assert lf.requested <= 1.0 + 1e-9  # least-fit never commits more than capacity
    assert ov.requested <= 2.0 + 1e-9
    assert fx.label == "flex Pmin=1.25 LRF" and lf.label == "least-fit"
    with pytest.raises(ValueError):
        FlexSimConfig(admission="magic")


def test_gpu_sim_small() -> None:
    for pol in ("binpack", "spread"):
        r = run_gpu(GpuSimConfig(policy=pol, nodes=3, horizon=60.0, warmup=10.0, seed=2))
        assert 0.0 < r.allocation <= 1.0
        assert 0.0 <= r.fragmentation <= r.frag_of_free <= 1.0
        assert 0.0 <= r.whole_blocked <= 1.0
        assert r.placed > 0


def test_table_and_fmt() -> None:
    t = Table.of(["a", "b"], [(1, 0.12345), (2, float("nan"))])
    assert t.markdown().splitlines()[2] == "| 1 | 0.123 |"
    assert "| 2 | - |" in t.markdown()
    assert t.csv().splitlines()[1] == "1,0.12345"
    assert t.column("a") == [1, 2]
    assert fmt(True) == "yes" and fmt(math.inf) == "inf" and fmt(12345.6) == "1.23e+04"


def test_outcome_writes_and_doc_page(tmp_path: Path) -> None:
    o = Outcome(
        name="x",
        title="X",
        setup="setup",
        tables=[("x", Table.of(["a"], [(1,)]))],
        figures=[("x.png", "caption")],
        findings="found",
        checks={"it holds": True, "it fails": False},
    )
    files = o.write(tmp_path)
    assert {f.name for f in files} == {"x.csv", "x.md"}
    page = doc_page([o], "experiments", "# Intro")
    assert "![caption](experiments/x.png)" in page
    assert "- [x] it holds" in page and "- [ ] it fails" in page


def test_swarm_sim_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command("nope", out=tmp_path) == 2
    assert run_command("balls", out=tmp_path, doc=tmp_path / "d.md") == 2
    assert run_command("balls", out=tmp_path, nodes=0) == 2
    out = tmp_path / "figs"
    rc = run_command("balls", nodes=100, out=out)
    assert rc == 0
    for name in ("balls.csv", "balls.png", "balls.md"):
        assert (out / name).stat().st_size > 0
    assert "ok" in capsys.readouterr().err


def test_cli_dispatches_to_the_simulator(tmp_path: Path) -> None:
    from swarm.cli import main

    assert main(["sim", "balls", "--nodes", "100", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "balls.csv").exists()
    assert main(["sim", "nope"]) == 2


def test_params_defaults() -> None:
    p = Params(out=Path("x"))
    assert p.nodes is None and p.tasks is None and p.seed == 1


def test_gossip_age_calibration_on_the_real_membership_core() -> None:
    from swarm.sim.calibrate import measure_load_age

    a = measure_load_age(12, duration=10.0, warmup=4.0, observers=4, report_interval=1.0)
    assert a.coverage == 1.0 and a.samples > 100
    # A report is at least as old as the time since it was made: between 0 and the
    # interval plus a few gossip rounds; on average about half the interval or more.
    assert 0.0 <= a.p50 <= a.p99 <= a.max < 10.0
    assert a.mean >= 0.4 * a.report_interval
    assert a.dissemination == a.mean - 0.5
