"""What a load report says of the work running on its node (issue 25: scale-in picks
the node whose removal loses least work): task_seconds, unmovable_seconds, how the
node computes them and how they travel."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarm import codec, wire
from swarm import limits as lim
from swarm import model as m
from swarm.cluster.messages import load_from_compact, load_to_compact
from swarm.node.loadstate import (
    REFRESH_MAX,
    REFRESH_MIN,
    REFRESH_TASKS,
    changed_meaningfully,
    refresh_period,
)
from swarm.node.moves import never_moves
from swarm.node.state import Settings

from .node_harness import FakeNode

MM = m.MigrateMode


def spec(tid: str, migrate: MM, **kw: Any) -> m.TaskSpec:
    return m.TaskSpec(id=tid, argv=("true",), user="alice", uid=1000, migrate=migrate, **kw)


def node(slots: int = 4, criu: bool = False) -> FakeNode:
    n = FakeNode("n1", settings=Settings(slots=slots))
    n.state.criu = criu
    return n


def start(n: FakeNode, s: m.TaskSpec, wall: float) -> None:
    n.submit(s, wall)
    n.run_here(s.id)
    assert n.try_start(s.id, now=wall, wall=wall) is None


def run_two(old: MM, young: MM, criu: bool = False) -> m.LoadReport:
    """Two tasks running, started 10 s and 4 s before the report (wall 100)."""
    n = node(criu=criu)
    start(n, spec("old", old), wall=90.0)
    start(n, spec("young", young), wall=96.0)
    return n.state.local_report(100.0)


# ------------------------------------------------------------------ the figures


def test_two_running_tasks_sum_their_run_so_far() -> None:
    r = run_two(MM.CHECKPOINT, MM.RESTART)
    assert r.running == 2
    assert r.task_seconds == pytest.approx(14.0)
    assert r.unmovable_seconds == 0.0  # both may move


@pytest.mark.parametrize(
    ("old", "young", "criu", "unmovable"),
    [
        (MM.NEVER, MM.CHECKPOINT, False, 10.0),  # the longest unmovable run
        (MM.CHECKPOINT, MM.NEVER, False, 4.0),  # only the young one cannot move
        (MM.NEVER, MM.NEVER, False, 10.0),  # the longest, not the sum
        (MM.CRIU, MM.RESTART, False, 10.0),  # CRIU without CRIU here: stuck
        (MM.CRIU, MM.RESTART, True, 0.0),  # with CRIU here it may move
    ],
)
def test_unmovable_seconds_is_the_longest_run_that_cannot_migrate(
    old: MM, young: MM, criu: bool, unmovable: float
) -> None:
    r = run_two(old, young, criu)
    assert r.task_seconds == pytest.approx(14.0)
    assert r.unmovable_seconds == pytest.approx(unmovable)


def test_queued_and_ended_tasks_do_not_count() -> None:
    n = node(slots=1)
    start(n, spec("a", MM.NEVER), wall=90.0)
    n.submit(spec("b", MM.NEVER), 91.0)
    n.run_here("b")  # queued behind a (one slot)
    r = n.state.local_report(100.0)
    assert (r.running, r.queued) == (1, 1)
    assert (r.task_seconds, r.unmovable_seconds) == (pytest.approx(10.0), pytest.approx(10.0))
    n.finish("a", now=100.0, wall=100.0)
    r = n.state.local_report(101.0)
    assert (r.task_seconds, r.unmovable_seconds) == (0.0, 0.0)


def test_a_clock_stepped_back_counts_no_negative_run_and_the_figures_are_capped() -> None:
    n = node()
    start(n, spec("a", MM.NEVER), wall=100.0)
    r = n.state.local_report(50.0)
    assert (r.task_seconds, r.unmovable_seconds) == (0.0, 0.0)
    n.state.share_cache = None
    assert n.state.work_fields(2e12) == {
        "task_seconds": lim.MAX_REPORT_SECONDS,
        "unmovable_seconds": lim.MAX_REPORT_SECONDS,
        "homing": 1,  # the running task is homed here
    }


def test_the_figures_are_cached_with_the_share_fields() -> None:
    n = node()
    start(n, spec("a", MM.CHECKPOINT), wall=90.0)
    first = n.state.local_report(100.0)
    assert n.state.local_report(100.1).task_seconds == first.task_seconds  # cached
    assert n.state.local_report(100.5).task_seconds == pytest.approx(10.5)


def test_with_thousands_of_records_the_figures_are_kept_longer() -> None:
    """Refreshing reads every record (~1 us each): the quarter second grows with the
    count, up to REFRESH_MAX (issue 23: a home with an array's 10,000 elements)."""
    assert refresh_period(10) == refresh_period(REFRESH_TASKS) == REFRESH_MIN
    assert refresh_period(4 * REFRESH_TASKS) == pytest.approx(4 * REFRESH_MIN)
    assert refresh_period(10**6) == REFRESH_MAX
    n = node(slots=4)
    start(n, spec("a", MM.CHECKPOINT), wall=90.0)
    for i in range(4 * REFRESH_TASKS):  # queued here, never started
        n.submit(spec(f"q{i}", MM.CHECKPOINT), 90.0)
    first = n.state.local_report(100.0)
    assert first.homing == 4 * REFRESH_TASKS + 1
    assert n.state.local_report(100.9).task_seconds == first.task_seconds  # kept ~1 s
    assert n.state.local_report(101.1).task_seconds == pytest.approx(11.1)


def test_never_moves_rule() -> None:
    assert never_moves(spec("a", MM.NEVER), criu_here=True)
    assert never_moves(spec("a", MM.CHECKPOINT, is_global=True), criu_here=True)
    assert never_moves(spec("a", MM.CRIU), criu_here=False)
    assert not never_moves(spec("a", MM.CRIU), criu_here=True)
    assert not never_moves(spec("a", MM.CHECKPOINT), criu_here=False)
    assert not never_moves(spec("a", MM.RESTART), criu_here=False)


def test_growing_work_figures_alone_are_not_news() -> None:
    base = m.LoadReport("n", 1, running=2, task_seconds=14.0, unmovable_seconds=10.0)
    later = attrs.evolve(base, version=2, task_seconds=1e6, unmovable_seconds=5e5)
    assert not changed_meaningfully(base, later)
    assert changed_meaningfully(base, attrs.evolve(later, running=1))


# ------------------------------------------------------------------ on the wire


def test_codec_and_compact_round_trip_with_short_keys() -> None:
    r = m.LoadReport("n1", 7, running=2, task_seconds=14.25, unmovable_seconds=10.0)
    assert codec.load_report_from_wire(wire.unpack(wire.pack(codec.load_report_to_wire(r)))) == r
    compact = load_to_compact(r)
    assert compact["ts"] == 14.25 and compact["um"] == 10.0
    assert load_from_compact(wire.unpack(wire.pack(compact))) == r


def test_a_report_without_them_still_decodes() -> None:
    old = {"n": "n1", "v": 7, "u": 1}  # an agent that predates issue 25
    r = load_from_compact(old)
    assert (r.task_seconds, r.unmovable_seconds) == (0.0, 0.0)
    assert "ts" not in load_to_compact(r) and "um" not in load_to_compact(r)
    full = codec.load_report_to_wire(r)
    del full["task_seconds"], full["unmovable_seconds"]
    assert codec.load_report_from_wire(full) == r


@pytest.mark.parametrize("field", ["task_seconds", "unmovable_seconds"])
@pytest.mark.parametrize("bad", [-1.0, math.inf, -math.inf, math.nan, 2e12, "14", True, [1.0]])
def test_a_bad_figure_is_refused_naming_its_field(field: str, bad: Any) -> None:
    obj = codec.load_report_to_wire(m.LoadReport("n1", 7)) | {field: bad}
    with pytest.raises(wire.SchemaError, match=field):
        codec.load_report_from_wire(obj)
    short = {"task_seconds": "ts", "unmovable_seconds": "um"}[field]
    with pytest.raises(wire.SchemaError, match=field):
        load_from_compact({"n": "n1", "v": 7, short: bad})


def test_an_integer_figure_is_read_as_seconds() -> None:
    r = load_from_compact({"n": "n1", "v": 7, "ts": 14, "um": 0})
    assert r.task_seconds == 14.0 and isinstance(r.task_seconds, float)


seconds = st.floats(0.0, lim.MAX_REPORT_SECONDS, allow_nan=False, allow_infinity=False)
reports = st.builds(
    m.LoadReport,
    node=st.from_regex(r"[a-z0-9-]{1,20}", fullmatch=True),
    version=st.integers(0, 1 << 62),
    shares=st.integers(-4096, 4096),
    queued=st.integers(0, 1000),
    running=st.integers(0, 1000),
    slots=st.integers(0, 256),
    cpu_util=st.floats(0.0, 1.0),
    psi_mem=st.floats(0.0, 100.0),
    criu=st.booleans(),
    task_seconds=seconds,
    unmovable_seconds=seconds,
)


@given(reports)
def test_any_report_round_trips_through_both_forms(r: m.LoadReport) -> None:
    assert codec.load_report_from_wire(wire.unpack(wire.pack(codec.load_report_to_wire(r)))) == r
    assert load_from_compact(wire.unpack(wire.pack(load_to_compact(r)))) == r


def test_homing_counts_unfinished_tasks_homed_here_and_is_news() -> None:
    """A scale-in victim must not be the home of unfinished work (issue 25): the
    report counts it, and a change of the count is gossiped at once."""
    n = node()
    start(n, spec("a", MM.CHECKPOINT), wall=100.0)
    r = n.state.local_report(101.0)
    assert r.homing == 1
    assert changed_meaningfully(r, attrs.evolve(r, homing=0))
    back = load_from_compact(load_to_compact(r))
    assert back.homing == 1
