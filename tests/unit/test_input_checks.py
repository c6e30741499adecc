"""Bad input never reaches the terminal raw or as a traceback (issue 17, item 12):
terminal escaping, the client's checks before sending, and the pure "could any node
ever run this" check at submit."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm import cli, client, limits, wire
from swarm import model as m
from swarm.fmt import table_lines, term_safe
from swarm.policy.feasible import NodeCapacity, unsatisfiable, why_not

# ------------------------------------------------------------------ terminal


def test_term_safe_escapes_controls_visibly() -> None:
    assert term_safe("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert term_safe("x\ny\tz\r") == "x\\ny\\tz\\r"
    assert term_safe("\x9b31m\x7f\x00") == "\\x9b31m\\x7f\\x00"
    assert term_safe("abc\u202edef") == "abc\\u202edef"  # bidi override
    assert term_safe("héllo wörld €") == "héllo wörld €"  # printable text untouched


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_term_safe_leaves_no_control_character_and_is_idempotent(s: str) -> None:
    out = term_safe(s)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in out)
    assert term_safe(out) == out


def test_tables_escape_cells_before_measuring() -> None:
    lines = table_lines([["a\x1bb", "x"]], ["H1", "H2"])
    assert lines[1] == "a\\x1bb  x"
    assert "\x1b" not in "".join(lines)


def _task(**spec: Any) -> dict[str, Any]:
    s = {"id": "t1", "argv": ["echo"], "name": "", "weight": 1.0, "home": "n1", "uid": 1}
    s.update(spec)
    return {"spec": s, "state": "queued", "history": [], "attempts": 0}


def test_status_output_escapes_every_field() -> None:
    t = _task(name="n\x1b]0;x\x07", argv=["a\nb"], user="u\x1b[2J")
    t["reason"] = "why\x1b"
    t["history"] = [{"at": 1.0, "src": None, "dst": "queued", "cause": "c\x1b", "node": "n\x07"}]
    mg = [{"started_at": 1.0, "from": "a\x1b", "to": "b", "reason": "r\x1b[1m"}]
    out = cli.format_status(t, mg)
    assert "\x1b" not in out and "\x07" not in out
    assert "a\\nb" in out and out.count("\n") == len(out.splitlines()) - 1


# ------------------------------------------------------------------ client


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"mem": 10**30}, "mem"),
        ({"mem": 0}, "mem"),
        ({"reserve_shares": 10**30}, "reserve_shares"),
        ({"reserve_shares": -1}, "reserve_shares"),
        ({"cpu": float("inf")}, "cpu"),
        ({"cpu": 1e6}, "cpu"),
        ({"weight": float("nan")}, "weight"),
        ({"weight": 10**400}, "weight"),
        ({"expected_runtime": 1e300}, "expected_runtime"),
        ({"gpu": {"core": 10, "memory_bytes": 10**40}}, "gpu memory_bytes"),
        ({"argv": ["x" * (limits.MAX_ARGV_BYTES + 1)]}, "argv"),
        ({"mem": True}, "mem"),
    ],
)
def test_client_refuses_out_of_bounds_fields_before_sending(
    fields: dict[str, Any], names: str
) -> None:
    req = {"argv": ["true"], **fields}
    with pytest.raises(client.InvalidRequest) as e:
        client.check_submit(req)
    assert e.value.message.startswith(f"submit: {names} ") and e.value.code == "invalid"
    assert len(e.value.message) < 200 and "\n" not in e.value.message


def test_client_accepts_the_bounds_themselves() -> None:
    client.check_submit(
        {
            "argv": ["x" * limits.MAX_ARGV_BYTES],
            "mem": limits.MAX_MEM,
            "cpu": limits.MAX_CPU,
            "weight": limits.MAX_WEIGHT,
            "reserve_shares": limits.MAX_RESERVE_SHARES,
        }
    )


def test_a_request_over_the_frame_limit_names_its_largest_field() -> None:
    req = {"op": "submit", "argv": ["true"], "env": {"A": "x" * wire.MAX_FRAME}}
    with pytest.raises(client.InvalidRequest, match="field 'env' alone is"):
        client.encode_request(req)


def test_a_field_that_cannot_be_encoded_is_named() -> None:
    with pytest.raises(client.InvalidRequest, match="field 'limit' cannot be sent"):
        client.encode_request({"op": "list", "limit": 1 << 70})
    with pytest.raises(client.InvalidRequest, match="field 'x' cannot be sent"):
        client.encode_request({"op": "list", "x": object()})


def test_client_and_agent_share_the_bounds() -> None:
    from swarm import request_checks as requests

    assert requests.MAX_ARGV_BYTES == limits.MAX_ARGV_BYTES
    assert wire.MAX_FRAME == limits.MAX_FRAME


# ------------------------------------------------------------------ feasible

GIB = 1 << 30


def _spec(**kw: Any) -> m.TaskSpec:
    return m.TaskSpec(id="t1", argv=("true",), **kw)


def _gpu(total_mem: int = 16 * GIB, index: int = 0) -> m.GpuDeviceFree:
    return m.GpuDeviceFree(index=index, free_core=0, free_mem=0, total_mem=total_mem)


SMALL = NodeCapacity("a", cpus=4, mem_total=8 * GIB)
BIG = NodeCapacity("b", cpus=64, mem_total=512 * GIB, gpus=(_gpu(), _gpu(index=1)))


def test_nothing_asked_is_always_possible() -> None:
    assert unsatisfiable(_spec(), SMALL, []) is None


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        (_spec(cpu=8.0), "wants 8 cores, has 4"),
        (_spec(mem=16 * GIB), "bytes of memory, has"),
        (_spec(gpu=m.GpuRequest(core=100, memory_ratio=100)), "has no GPUs"),
    ],
)
def test_refused_when_no_known_node_could_ever_fit(spec: m.TaskSpec, text: str) -> None:
    why = unsatisfiable(spec, SMALL, [attrs_evolve(SMALL, node="c")])
    assert why is not None and text in why and "a:" in why and "c:" in why


def attrs_evolve(c: NodeCapacity, **kw: Any) -> NodeCapacity:
    import attrs

    return attrs.evolve(c, **kw)


def test_a_peer_that_fits_makes_it_possible() -> None:
    for spec in (
        _spec(cpu=8.0),
        _spec(mem=16 * GIB),
        _spec(gpu=m.GpuRequest(core=200, memory_ratio=200)),
        _spec(gpu=m.GpuRequest(core=50, memory_bytes=12 * GIB)),
    ):
        assert unsatisfiable(spec, SMALL, [BIG]) is None, spec
        assert unsatisfiable(spec, BIG, [SMALL]) is None, spec  # its own capacity counts


def test_capacity_not_current_load_decides() -> None:
    # BIG's GPUs are fully allocated right now (free 0): they free up, so it fits
    assert why_not(_spec(gpu=m.GpuRequest(core=100, memory_ratio=100)), BIG) is None


def test_more_gpus_or_gpu_memory_than_any_node_is_refused() -> None:
    assert unsatisfiable(_spec(gpu=m.GpuRequest(core=300, memory_ratio=300)), BIG, []) is not None
    big_mem = m.GpuRequest(core=50, memory_bytes=32 * GIB)
    assert unsatisfiable(_spec(gpu=big_mem), BIG, []) is not None


def test_an_unknown_live_member_might_fit() -> None:
    assert unsatisfiable(_spec(cpu=8.0), SMALL, [None]) is None
    assert unsatisfiable(_spec(cpu=8.0), SMALL, [attrs_evolve(SMALL, node="c"), None]) is None


def test_an_unreported_capacity_might_fit() -> None:
    unreported = NodeCapacity("u")  # cpus 0, mem_total 0: not reported
    assert unsatisfiable(_spec(cpu=1e4, mem=1 << 50), unreported, []) is None


def test_global_tasks_are_not_checked() -> None:
    assert unsatisfiable(_spec(cpu=1e4, is_global=True), SMALL, []) is None


def test_the_reason_stays_short_on_a_large_cluster() -> None:
    peers = [attrs_evolve(SMALL, node=f"n{i}") for i in range(1000)]
    why = unsatisfiable(_spec(cpu=8.0), SMALL, peers)
    assert why is not None and "1001 known node(s)" in why and "and 998 more" in why
    assert len(why) < 300


def test_of_report_reads_the_capacity_fields() -> None:
    r = m.LoadReport(node="x", version=1, cpus=3.0, mem_total=7, gpus=(_gpu(),))
    assert NodeCapacity.of(r) == NodeCapacity("x", 3.0, 7, (_gpu(),))


# ------------------------------------------------------ where it may run (issue 21)

BAD_WHERE = [
    ({"constraints": ["a~(x+)+"]}, "submit: constraint: 'a~(x+)+'"),
    ({"constraints": ["rack"] * 17}, "constraints"),
    ({"prefer": ["=x"]}, "submit: prefer:"),
    ({"job": "a b"}, "submit: job 'a b'"),
    ({"job": "j", "spread": "../rack"}, "submit: spread: label key '../rack'"),
    ({"job": "j", "anti_affinity": -1}, "anti_affinity"),
    ({"data": ["/a/../etc"]}, "submit: data: key '/a/../etc'"),
    ({"spread": "rack"}, "within a --job"),
    ({"anti_affinity": 2}, "within a --job"),
    ({"is_global": True, "constraints": ["pool=a"]}, "a global task runs on every node"),
]


@pytest.mark.parametrize(("fields", "text"), BAD_WHERE)
def test_bad_placement_fields_are_refused_naming_the_field(
    fields: dict[str, Any], text: str
) -> None:
    from swarm import request_checks

    f = wire.Fields({"argv": ["true"], **fields}, "submit")
    with pytest.raises(wire.SchemaError) as e:
        request_checks.submit_spec(f, uid=1000, user="alice", home="n1", now=0.0)
    assert text in str(e.value)


def test_good_placement_fields_make_the_spec() -> None:
    from swarm import request_checks

    f = wire.Fields(
        {
            "argv": ["true"],
            "constraints": ["pool=a", "mem>=8G"],
            "prefer": ["rack=r1"],
            "job": "j1",
            "spread": "rack",
            "anti_affinity": 2,
            "data": ["imagenet"],
            "cwd_any": True,
        },
        "submit",
    )
    spec = request_checks.submit_spec(f, uid=1000, user="alice", home="n1", now=0.0)
    assert spec.constraints == ("pool=a", "mem>=8G") and spec.prefer == ("rack=r1",)
    assert (spec.job, spec.spread, spec.anti_affinity) == ("j1", "rack", 2)
    assert spec.data == ("imagenet",) and spec.cwd_any


def test_the_client_turns_gang_options_into_one_gang_map() -> None:
    extra: dict[str, object] = {"gang": 4}
    client.gang_request(extra)
    assert extra == {"gang": {"size": 4}}
    extra = {"gang": 8, "gang_mode": "nonstrict", "gang_restart": True, "gang_timeout": 60.0}
    client.gang_request(extra)
    assert extra == {
        "gang": {
            "size": 8,
            "mode": "nonstrict",
            "min_available": 8,
            "restart": True,
            "timeout": 60.0,
        }
    }
    extra = {"gang": 8, "gang_mode": "nonstrict", "min_available": 6}
    client.gang_request(extra)
    assert extra["gang"] == {"size": 8, "mode": "nonstrict", "min_available": 6}
    with pytest.raises(client.InvalidRequest, match="min_available without gang=N"):
        client.gang_request({"min_available": 2})
    with pytest.raises(client.InvalidRequest, match="gang must be a number"):
        client.gang_request({"gang": "4"})
    with pytest.raises(client.InvalidRequest, match="gang must be a number"):
        client.gang_request({"gang": True})
