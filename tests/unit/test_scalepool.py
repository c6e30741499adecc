"""Elastic pools as the agent reads and sees them (issue 25, policy/scalepool.py):
`[scale.NAME]` tables parsed key by key with errors naming `scale.NAME.key`, the
`PoolView` summed from gossiped reports, and what removing one node costs."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.model import LoadReport
from swarm.policy import autoscale as asc
from swarm.policy import scalepool as sp
from swarm.policy.scalepool import Member, PoolConfigError, node_work, parse_pool, parse_pools

BASE = {"scale-out-command": "add-nodes", "scale-in-command": "remove-nodes"}


def _pool(**extra: Any) -> sp.PoolSpec:
    return parse_pool("gpu", {**BASE, **extra})


def _error(table: Any, name: str = "gpu") -> str:
    with pytest.raises(PoolConfigError) as e:
        parse_pool(name, table)
    return str(e.value)


# ------------------------------------------------------------------- parse_pool


def test_minimal_table_takes_the_defaults() -> None:
    spec = parse_pool("gpu", dict(BASE))
    assert spec.name == "gpu" and spec.key == "scale.gpu"
    assert spec.scale == asc.ScaleConfig(pool="gpu")
    assert spec.out_command == "add-nodes" and spec.in_command == "remove-nodes"
    assert spec.selector_text == () and spec.selector == ()
    assert (spec.hook_timeout, spec.hook_retries, spec.hook_backoff) == (300.0, 3, 10.0)
    assert (spec.drain_grace, spec.boot_timeout, spec.lease_ttl) == (600.0, 600.0, 15.0)
    assert spec.holds({}) and spec.holds({"any": "thing"})


# key -> (a value as written, where it lands, what it becomes)
EVERY_KEY: dict[str, tuple[Any, str, Any]] = {
    "min-nodes": (2, "scale.min_nodes", 2),
    "max-nodes": (9, "scale.max_nodes", 9),
    "target-utilisation": (0.8, "scale.target_utilisation", 0.8),
    "tolerance": (0, "scale.tolerance", 0.0),
    "scale-out-window": ("30s", "scale.scale_out_window", 30.0),
    "scale-in-window": ("5m", "scale.scale_in_window", 300.0),
    "out-cooldown": (45, "scale.out_cooldown", 45.0),
    "in-cooldown": ("1h", "scale.in_cooldown", 3600.0),
    "max-step": (2, "scale.max_step", 2),
    "max-view-age": (12.5, "scale.max_view_age", 12.5),
    "slots-per-node": (8, "scale.slots_per_node", 8.0),
    "scale-in-utilisation": (0.4, "scale.scale_in_utilisation", 0.4),
    "selector": (
        ["pool=gpu", "arch in x86_64,arm64"],
        "selector_text",
        ("pool=gpu", "arch in x86_64,arm64"),
    ),
    "scale-out-command": (
        "add.sh --n $SWARM_SCALE_COUNT",
        "out_command",
        "add.sh --n $SWARM_SCALE_COUNT",
    ),
    "scale-in-command": ("rm.sh $SWARM_SCALE_NODES", "in_command", "rm.sh $SWARM_SCALE_NODES"),
    "hook-timeout": ("2m", "hook_timeout", 120.0),
    "hook-retries": (0, "hook_retries", 0),
    "hook-backoff": ("1.5s", "hook_backoff", 1.5),
    "drain-grace": ("1d", "drain_grace", 86400.0),
    "boot-timeout": (" 10M ", "boot_timeout", 600.0),
    "lease-ttl": ("3", "lease_ttl", 3.0),
}


def test_every_known_key_is_in_the_table_above() -> None:
    known = {*sp._SCALE_KEYS, *sp._POOL_KEYS}
    # a key the parser does not know yet (another change adds it) is skipped below
    assert known <= set(EVERY_KEY), f"keys without a test: {sorted(known - set(EVERY_KEY))}"


@pytest.mark.parametrize("key", sorted(EVERY_KEY))
def test_each_key_lands_in_its_field(key: str) -> None:
    if key not in {*sp._SCALE_KEYS, *sp._POOL_KEYS}:
        pytest.skip(f"{key} is not a key of this version")
    written, where, want = EVERY_KEY[key]
    spec = parse_pool("gpu", {**BASE, key: written})
    obj: Any = spec
    for part in where.split("."):
        obj = getattr(obj, part)
    assert obj == want
    assert type(obj) is type(want)


def test_all_keys_at_once() -> None:
    table = {k: v for k, (v, _, _) in EVERY_KEY.items() if k in {*sp._SCALE_KEYS, *sp._POOL_KEYS}}
    spec = parse_pool("gpu.big-1", table)
    assert spec.name == "gpu.big-1" and spec.key == "scale.gpu.big-1"
    assert spec.scale.min_nodes == 2 and spec.scale.max_nodes == 9
    assert spec.holds({"pool": "gpu", "arch": "arm64"})
    assert not spec.holds({"pool": "gpu", "arch": "riscv"})
    assert not spec.holds({"arch": "arm64"})


@pytest.mark.parametrize(
    ("written", "seconds"),
    [
        (30, 30.0),
        (0, 0.0),
        (1.5, 1.5),
        ("30", 30.0),
        ("30s", 30.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("0.5m", 30.0),
        ("1e2s", 100.0),
        (" 5M ", 300.0),
    ],
)
def test_durations(written: Any, seconds: float) -> None:
    assert _pool(**{"drain-grace": written}).drain_grace == seconds


@pytest.mark.parametrize(
    "written",
    [
        "",
        "  ",
        "s",
        "5x",
        "five",
        "-1",
        -1,
        "-5s",
        "inf",
        "nan",
        float("inf"),
        True,
        None,
        [30],
        {"s": 1},
    ],
)
def test_bad_durations_name_the_key(written: Any) -> None:
    msg = _error({**BASE, "drain-grace": written})
    assert msg.startswith("scale.gpu.drain-grace: ")


def test_slots_per_node_zero_means_the_pools_mean() -> None:
    assert _pool(**{"slots-per-node": 0}).scale.slots_per_node is None
    assert _pool(**{"slots-per-node": 2.5}).scale.slots_per_node == 2.5


# (table changes, the key the single error names)
BAD: list[tuple[dict[str, Any], str]] = [
    ({"colour": "blue"}, "colour"),
    ({"min_nodes": 1}, "min_nodes"),  # the TOML spelling is with dashes
    ({"scale-out-command": None}, "scale-out-command"),
    ({"scale-out-command": ""}, "scale-out-command"),
    ({"scale-out-command": "   "}, "scale-out-command"),
    ({"scale-out-command": ["add"]}, "scale-out-command"),
    ({"scale-in-command": "a\0b"}, "scale-in-command"),
    ({"scale-in-command": "x" * (sp.MAX_COMMAND + 1)}, "scale-in-command"),
    ({"min-nodes": "3"}, "min-nodes"),
    ({"min-nodes": 1.0}, "min-nodes"),
    ({"min-nodes": True}, "min-nodes"),
    ({"min-nodes": -1}, "min-nodes"),
    ({"max-nodes": 2, "min-nodes": 3}, "max-nodes"),
    ({"max-nodes": -1}, "max-nodes"),
    ({"target-utilisation": "high"}, "target-utilisation"),
    ({"target-utilisation": 0}, "target-utilisation"),
    ({"target-utilisation": 1.5}, "target-utilisation"),
    ({"target-utilisation": False}, "target-utilisation"),
    ({"tolerance": 1}, "tolerance"),
    ({"tolerance": -0.1}, "tolerance"),
    ({"max-step": 0}, "max-step"),
    ({"max-step": 2.5}, "max-step"),
    ({"max-view-age": 0}, "max-view-age"),
    ({"slots-per-node": -1}, "slots-per-node"),
    ({"scale-out-window": "soon"}, "scale-out-window"),
    ({"in-cooldown": -3}, "in-cooldown"),
    ({"selector": 5}, "selector"),
    ({"selector": [1, 2]}, "selector"),
    ({"selector": {"pool": "gpu"}}, "selector"),
    ({"selector": ["a b c d"]}, "selector"),
    ({"selector": ["x~(a)"]}, "selector"),
    ({"selector": [""]}, "selector"),
    ({"selector": ["size>big"]}, "selector"),
    ({"selector": [f"k{i}" for i in range(20)]}, "selector"),
    ({"hook-timeout": 0}, "hook-timeout"),
    ({"hook-retries": -1}, "hook-retries"),
    ({"hook-retries": 101}, "hook-retries"),
    ({"hook-retries": "3"}, "hook-retries"),
    ({"hook-backoff": "x"}, "hook-backoff"),
    ({"boot-timeout": []}, "boot-timeout"),
    ({"lease-ttl": 0.01}, "lease-ttl"),
    ({"lease-ttl": "2h"}, "lease-ttl"),
]


@pytest.mark.parametrize(("change", "key"), BAD)
def test_one_error_naming_the_key(change: dict[str, Any], key: str) -> None:
    table = {**BASE, **change}
    table = {k: v for k, v in table.items() if v is not None}
    msg = _error(table)
    assert msg.startswith(f"scale.gpu.{key}: "), msg
    assert msg.count("scale.gpu.") == 1  # one error, one key


@pytest.mark.parametrize("missing", ["scale-out-command", "scale-in-command"])
def test_both_commands_are_required(missing: str) -> None:
    table = {k: v for k, v in BASE.items() if k != missing}
    assert _error(table).startswith(f"scale.gpu.{missing}: required")


def test_unknown_key_lists_the_known_ones() -> None:
    msg = _error({**BASE, "max-nodez": 3})
    assert msg.startswith("scale.gpu.max-nodez: unknown key (known: ")
    assert "max-nodes" in msg and "lease-ttl" in msg


def test_bad_selector_keeps_the_constraint_error() -> None:
    msg = _error({**BASE, "selector": ["pool=gpu", "rack in"]})
    assert msg.startswith("scale.gpu.selector: ")
    assert "rack in" in msg


def test_a_selector_may_be_one_string() -> None:
    spec = _pool(selector="pool=gpu")
    assert spec.selector_text == ("pool=gpu",)
    assert spec.holds({"pool": "gpu"}) and not spec.holds({"pool": "cpu"}) and not spec.holds({})


@pytest.mark.parametrize("name", ["", "Gpu", "-gpu", "_gpu", "a b", "x" * 64, "gpu/1"])
def test_bad_pool_names(name: str) -> None:
    assert _error(dict(BASE), name).startswith(f"scale.{name}: a pool name")


@pytest.mark.parametrize("table", [None, 3, "add", ["a"]])
def test_a_pool_must_be_a_table(table: Any) -> None:
    assert _error(table).startswith("scale.gpu: must be a table")


def test_parse_pools() -> None:
    assert parse_pools(None) == ()
    assert parse_pools({}) == ()
    specs = parse_pools({"web": dict(BASE), "gpu": {**BASE, "max-nodes": 3}})
    assert [s.name for s in specs] == ["gpu", "web"]
    assert specs[0].scale.max_nodes == 3
    with pytest.raises(PoolConfigError, match=r"^scale: must be a set"):
        parse_pools([dict(BASE)])
    with pytest.raises(PoolConfigError, match=r"^scale: at most 16 pools"):
        parse_pools({f"p{i}": dict(BASE) for i in range(sp.MAX_POOLS + 1)})
    with pytest.raises(PoolConfigError, match=r"^scale\.web\.max-step: "):
        parse_pools({"gpu": dict(BASE), "web": {**BASE, "max-step": 0}})


def test_retry_delay_doubles_and_is_bounded() -> None:
    spec = _pool(**{"hook-backoff": 2})
    assert [spec.retry_delay(a) for a in (0, 1, 2, 3, 4)] == [2.0, 2.0, 4.0, 8.0, 16.0]
    assert spec.retry_delay(1000) == 2.0 * 2**10


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(sorted({*sp._SCALE_KEYS, *sp._POOL_KEYS, "bogus"})),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-5, 5000),
            st.floats(allow_nan=True, allow_infinity=True),
            st.text(max_size=8),
            st.lists(st.text(max_size=6), max_size=3),
        ),
    )
)
def test_any_table_parses_or_raises_one_config_error(table: dict[str, Any]) -> None:
    try:
        spec = parse_pool("gpu", {**BASE, **table})
    except PoolConfigError as e:
        assert str(e).startswith("scale.gpu.")
    else:
        assert spec.scale.min_nodes <= spec.scale.max_nodes
        assert spec.lease_ttl >= 0.05 and spec.hook_timeout > 0


# -------------------------------------------------------------------- the view


def _report(
    node: str,
    *,
    running: int = 0,
    queued: int = 0,
    slots: int = 4,
    shares: int = 1024,
    labels: dict[str, str] | None = None,
    task_seconds: float = 0.0,
    unmovable_seconds: float = 0.0,
) -> LoadReport:
    return LoadReport(
        node=node,
        version=1,
        shares=shares,
        running=running,
        queued=queued,
        slots=slots,
        labels=tuple(sorted((labels if labels is not None else {"pool": "gpu"}).items())),
        task_seconds=task_seconds,
        unmovable_seconds=unmovable_seconds,
    )


GPU = _pool(selector=["pool=gpu"])


def test_view_sums_the_pool_nodes_selected_by_label() -> None:
    members = [
        Member("a", _report("a", running=3, queued=1, slots=4), 1.0),
        Member("b", _report("b", running=2, slots=8), 4.0),
        Member("c", _report("c", running=5, queued=5, labels={"pool": "cpu"}), 9.0),
        Member("d", _report("d", running=1, labels={}), 20.0),
    ]
    v = sp.pool_view(GPU, members)
    assert v == asc.PoolView(nodes=2, slots=12.0, running=5.0, queued=1.0, age=4.0)
    # no selector: every node with a report
    v = sp.pool_view(_pool(), members)
    assert (v.nodes, v.slots, v.running, v.queued, v.age) == (4, 20.0, 11.0, 6.0, 20.0)


def test_members_without_a_report_are_left_out() -> None:
    members = [Member("a", _report("a", slots=4), 2.0), Member("new", None, 99.0)]
    assert sp.pool_view(GPU, members) == asc.PoolView(nodes=1, slots=4.0, age=2.0)
    assert not sp.in_pool(GPU, Member("new", None))
    assert sp.pool_view(GPU, []) == asc.PoolView(nodes=0, slots=0.0)


def test_an_operator_drained_node_is_neither_capacity_nor_draining() -> None:
    members = [
        Member("a", _report("a", running=2, slots=4)),
        Member("op", _report("op", running=3, queued=1, slots=4, shares=0), 7.0),
    ]
    v = sp.pool_view(GPU, members)
    # its demand still counts (its running work needs to finish or move), its age too
    assert v == asc.PoolView(nodes=1, slots=4.0, running=5.0, queued=1.0, age=7.0, draining=0)


def test_victims_count_as_draining_with_their_demand() -> None:
    members = [
        Member("a", _report("a", running=2, slots=4)),
        Member("v1", _report("v1", running=1, queued=2, slots=4, shares=0)),
        # a victim whose report does not show the drain yet: draining all the same
        Member("v2", _report("v2", running=3, slots=4)),
        Member("x", _report("x", running=9, labels={"pool": "cpu"})),
    ]
    v = sp.pool_view(GPU, members, draining=["v1", "v2", "x", "gone"], booting=2)
    assert v == asc.PoolView(
        nodes=1, slots=4.0, running=6.0, queued=2.0, age=0.0, draining=2, booting=2
    )


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 8),  # running
            st.integers(0, 8),  # queued
            st.integers(0, 16),  # slots
            st.booleans(),  # drained by the operator
            st.booleans(),  # in the pool
            st.booleans(),  # a victim
            st.floats(0, 100),  # age
        ),
        max_size=8,
    )
)
def test_view_partitions_the_pool(
    rows: list[tuple[int, int, int, bool, bool, bool, float]],
) -> None:
    members = []
    victims = []
    for i, (run, q, slots, drained, inpool, victim, age) in enumerate(rows):
        n = f"n{i}"
        labels = {"pool": "gpu" if inpool else "cpu"}
        members.append(
            Member(
                n,
                _report(
                    n, running=run, queued=q, slots=slots, shares=0 if drained else 9, labels=labels
                ),
                age,
            )
        )
        if victim:
            victims.append(n)
    v = sp.pool_view(GPU, members, draining=victims)
    pool = [r for r in rows if r[4]]
    assert v.running == sum(r[0] for r in pool) and v.queued == sum(r[1] for r in pool)
    assert v.draining == sum(1 for r in pool if r[5])
    assert v.nodes == sum(1 for r in pool if not r[5] and not r[3])
    assert v.slots == sum(r[2] for r in pool if not r[5] and not r[3])
    assert v.age == max((r[6] for r in pool), default=0.0)


# -------------------------------------------------------------------- node_work


def test_node_work_ages_the_running_seconds() -> None:
    r = _report("a", running=3, queued=2, task_seconds=100.0)
    assert node_work(r) == asc.NodeWork("a", 100.0, 2, 0.0, False)
    # 10 s later each of the 3 running tasks has run 10 s more
    assert node_work(r, 10.0) == asc.NodeWork("a", 130.0, 2, 0.0, False)
    assert node_work(r, -5.0) == node_work(r)  # a negative age is none
    assert node_work(r, 1.0, pinned=True).pinned


def test_node_work_ages_the_unmovable_task_only_when_there_is_one() -> None:
    r = _report("a", running=2, task_seconds=50.0, unmovable_seconds=40.0)
    w = node_work(r, 30.0)
    assert (w.task_seconds, w.unmovable_seconds) == (110.0, 70.0)
    idle = _report("b", running=0, task_seconds=0.0)
    assert node_work(idle, 1000.0) == asc.NodeWork("b", 0.0, 0, 0.0, False)
    # an aged unmovable task can pin its node past the drain grace
    spec = _pool(**{"drain-grace": 60})
    fresh, aged = node_work(r, 0.0), node_work(r, 30.0)
    assert asc.pinned_because(fresh, spec.drain_grace) is None
    assert asc.pinned_because(aged, spec.drain_grace) is not None
    assert asc.choose_victims([aged, node_work(idle)], 2, long_task=spec.drain_grace) == ["b"]


def test_member_defaults() -> None:
    mb = Member("a", None)
    assert mb.age == 0.0
    assert attrs.evolve(mb, age=3.0).age == 3.0
