"""Constraints, labels and soft placement in place() (issue 21), and the labels' trip
through the wire: the load report codecs, gossip's newest-version rule, task fields."""

from __future__ import annotations

import random
from collections.abc import Mapping

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm import codec, wire
from swarm import model as m
from swarm.cluster.membership import LoadUpdated, Membership, MembershipConfig
from swarm.cluster.messages import Codec, LoadUpdate, load_from_compact, load_to_compact
from swarm.model import LoadReport, NodeId, TaskSpec
from swarm.policy import constraints as cons
from swarm.policy.datakeys import DIGEST_BYTES, digest, may_hold
from swarm.policy.placement import (
    NOWHERE,
    PREFER_TASKS,
    Needs,
    Where,
    place,
    refusal,
)
from swarm.policy.view import LoadView, PeerEntry

NOW = 1000.0


def spec(**kw: object) -> TaskSpec:
    return TaskSpec(id="t1", argv=("true",), **kw)  # type: ignore[arg-type]


def rep(node: str, labels: Mapping[str, str] | None = None, /, **kw: object) -> LoadReport:
    slots = int(kw.pop("slots", 1))  # type: ignore[call-overload]
    kw.setdefault("shares", 1024 * slots)
    return LoadReport(
        node=node,
        version=1,
        labels=tuple(sorted((labels or {}).items())),
        slots=slots,
        **kw,  # type: ignore[arg-type]
    )


def view_of(*reports: LoadReport) -> LoadView:
    v = LoadView()
    for r in reports:
        v.put(r.node, PeerEntry(r, NOW))
    return v


DRAINED = {"shares": 0}


def targets(
    s: TaskSpec, local: LoadReport, v: LoadView, where: Where = NOWHERE, seeds: int = 20
) -> set[NodeId | None]:
    return {place(s, local, v, random.Random(i), NOW, where=where).target for i in range(seeds)}


# ------------------------------------------------------------ the filter


def test_refusal_code_constraint() -> None:
    needs = Needs.of(spec(constraints=("rack=r1", "gpu")))
    r = refusal(rep("a", {"rack": "r2", "gpu": "1"}), needs)
    assert r is not None and r.code == "constraint" and r.text == "constraint rack=r1: rack=r2"
    r = refusal(rep("a", {"rack": "r1"}), needs)
    assert r is not None and r.code == "constraint" and "no label gpu" in r.text
    assert refusal(rep("a", {"rack": "r1", "gpu": "1"}), needs) is None
    # constraints come before the other checks: a drained non-matching node says why
    r = refusal(rep("a", {"rack": "r2"}, **DRAINED), needs)
    assert r is not None and r.code == "constraint"


def test_one_matching_node_in_a_large_view_is_found_by_widening() -> None:
    reports = [rep(f"n{i}", {"rack": "r1"}) for i in range(300)]
    reports[137] = rep("n137", {"rack": "r2"}, weight_sum=9.0)
    v = view_of(*reports)
    local = rep("me", {"rack": "r1"})
    for seed in range(10):
        p = place(spec(constraints=("rack=r2",)), local, v, random.Random(seed), NOW)
        assert p.target == "n137" and p.scanned
    reasons = {c.node: c.why_not for c in p.candidates}
    assert reasons["me"] == "constraint rack=r2: rack=r1"
    assert reasons["n0"] == "constraint rack=r2: rack=r1"


def test_no_matching_node_says_why() -> None:
    v = view_of(rep("a", {"rack": "r1"}), rep("b"))
    p = place(spec(constraints=("rack=r9",)), rep("me", {"rack": "r1"}), v, random.Random(1), NOW)
    assert p.target is None
    assert "constraint rack=r9" in p.summary


def test_a_constraint_that_does_not_parse_never_matches() -> None:
    # the codec refuses it; one that slipped through must not match everything
    v = view_of(rep("a", {"rack": "r1"}))
    p = place(spec(constraints=("bad key=1",)), rep("me"), v, random.Random(1), NOW)
    assert p.target is None


# ------------------------------------------------- property: never wrong

LABEL_KEYS = ("rack", "gpu", "mem", "zone")
LABEL_VALUES = ("r1", "r2", "r3", "1", "64G", "128G", "H200", "")
CONSTRAINTS = (
    "rack=r1",
    "rack!=r2",
    "rack in r1,r3",
    "rack notin r1",
    "gpu",
    "!gpu",
    "zone~^r",
    "mem>=64G",
    "mem<100G",
    "gpu=H200",
    "zone",
)

label_sets = st.dictionaries(st.sampled_from(LABEL_KEYS), st.sampled_from(LABEL_VALUES))


# A node is one integer (cheap to draw for 80 nodes, and it shrinks well): its label
# set, slots, whether drained, and its load. Most nodes share one label set (0), some
# have the set the constraints are drawn to satisfy (1), a few one of three others:
# matching nodes are often rare, and not absent.
node_codes = st.integers(0, (1 << 16) - 1)
SET_OF = (0,) * 10 + (1,) * 2 + (2, 3, 4, 0)


def node_report(name: str, code: int, sets: list[dict[str, str]]) -> LoadReport:
    labels = sets[SET_OF[code & 15]]
    slots = 1 + (code >> 4) % 8
    drained = (code >> 7) % 5 == 0
    weight = float((code >> 10) % 41) / 2
    return rep(name, labels, slots=slots, shares=0 if drained else 1024 * slots, weight_sum=weight)


def _eligible(r: LoadReport, needs: Needs, node: NodeId, where: Where) -> bool:
    labels = dict(r.labels)
    return (
        refusal(r, Needs()) is None
        and all(c.unmet(labels) is None for c in needs.constraints)
        and node not in where.full
    )


@settings(max_examples=200, deadline=None)
@given(
    st.data(),
    st.integers(1, 80),
    st.lists(st.sampled_from(CONSTRAINTS), max_size=3, unique=True),
    st.lists(st.sampled_from(CONSTRAINTS), max_size=2, unique=True),
    st.sampled_from([64, 4, 4]),
    st.integers(1, 3),
)
def test_place_never_chooses_a_non_matching_node_and_never_misses_a_matching_one(
    data: st.DataObject,
    n: int,
    hard: list[str],
    soft: list[str],
    scan_below: int,
    d: int,
) -> None:
    v = LoadView()
    sets = [data.draw(label_sets) for _ in range(5)]
    if data.draw(st.booleans()):  # constraints the "match" set satisfies
        sat = [c for c in CONSTRAINTS if cons.parse_constraint(c).unmet(sets[1]) is None]
        hard = data.draw(st.lists(st.sampled_from(sat), max_size=3, unique=True)) if sat else []
    nodes = data.draw(st.lists(node_codes, min_size=n, max_size=n))
    for i, code in enumerate(nodes):
        v.put(f"n{i}", PeerEntry(node_report(f"n{i}", code, sets), NOW))
    local = node_report("me", data.draw(node_codes), sets)
    if data.draw(st.booleans()):  # often the local node cannot take it either
        local = attrs.evolve(local, shares=0)
    if data.draw(st.booleans()):  # a stale entry of our own in the view is ignored
        v.put("me", PeerEntry(node_report("me", data.draw(node_codes), sets), NOW - 5))
    full = frozenset(data.draw(st.lists(st.sampled_from([*list(v), "me"]), max_size=3)))
    spread_key = data.draw(st.sampled_from(["", "rack"]))
    spread_to = frozenset(data.draw(st.lists(st.sampled_from(["r1", "r2", "r3"]), max_size=2)))
    where = Where(spread_key=spread_key, spread_to=spread_to if spread_key else frozenset())
    where = attrs.evolve(where, full=full)
    s = spec(constraints=tuple(hard), prefer=tuple(soft))
    needs = Needs.of(s)
    rng = random.Random(data.draw(st.integers(0, 1 << 30)))
    max_attempts = data.draw(st.sampled_from([None, 3]))  # few draws: widening must act

    p = place(
        s,
        local,
        v,
        rng,
        NOW,
        d=d,
        scan_below=scan_below,
        max_attempts=max_attempts,
        where=where,
    )

    reports = {k: e.report for k, e in v.items() if k != "me"}
    reports["me"] = local
    ok = {k for k, r in reports.items() if _eligible(r, needs, k, where)}
    if p.target is not None:
        # a non-matching (or drained, or full) node is never chosen
        assert p.target in ok, (p.target, p.summary)
        assert cons.unmet(needs.constraints, dict(reports[p.target].labels)) is None
        assert p.local == (p.target == "me")
    # a matching node is never excluded: small views are scanned, and large ones widen
    # to a scan when constraints or `where` leave fewer than d draws
    if ok and (needs.constraints or where != NOWHERE or len(v) <= scan_below):
        assert p.target is not None, p.summary
    # a spread goes to a least-used value whenever an eligible node (peer or local) has
    # one, soft preferences or not
    if spread_key and any(dict(reports[k].labels).get("rack") in spread_to for k in ok):
        assert p.target is not None
        assert dict(reports[p.target].labels).get("rack") in spread_to, p.summary


# ---------------------------------------------------------- spread


def test_spread_goes_to_the_least_used_value_when_eligible() -> None:
    v = view_of(
        *[rep(f"a{i}", {"rack": "r1"}) for i in range(5)],
        rep("b0", {"rack": "r2"}, weight_sum=6.0),
        rep("b1", {"rack": "r2"}, **DRAINED),
        rep("c0", {"rack": "r3"}),
    )
    where = Where(spread_key="rack", spread_to=frozenset({"r2"}))
    assert targets(spec(job="j", spread="rack"), rep("me", {"rack": "r1"}), v, where) == {"b0"}
    # a large view: the first round widens to a scan to find the one r2 node
    big = view_of(*[rep(f"a{i}", {"rack": "r1"}) for i in range(200)], rep("b0", {"rack": "r2"}))
    assert targets(spec(job="j"), rep("me", **DRAINED), big, where) == {"b0"}


def test_spread_falls_back_to_any_eligible_node() -> None:
    v = view_of(
        rep("a0", {"rack": "r1"}),
        rep("b0", {"rack": "r2"}, **DRAINED),
        rep("c0", {"rack": "r3"}),
        rep("x"),  # no rack label at all: still eligible in the fallback
    )
    where = Where(spread_key="rack", spread_to=frozenset({"r2"}))
    got = targets(spec(job="j"), rep("me", **DRAINED), v, where, seeds=40)
    assert got == {"a0", "c0", "x"}
    none = view_of(rep("b0", {"rack": "r2"}, **DRAINED))
    assert targets(spec(job="j"), rep("me", **DRAINED), none, where) == {None}


def test_spread_local_node_on_a_least_used_value() -> None:
    where = Where(spread_key="rack", spread_to=frozenset({"r2"}))
    v = view_of(rep("a0", {"rack": "r2"}))
    # local on r2 and idle, the r2 peer too: both are in the round
    assert targets(spec(job="j"), rep("me", {"rack": "r2"}), v, where, seeds=40) == {"me", "a0"}
    # local on r1 while an r2 peer is eligible: local is not in the first round
    assert targets(spec(job="j"), rep("me", {"rack": "r1"}), v, where) == {"a0"}


def test_spread_prefers_the_local_node_when_it_is_the_only_one_on_a_least_used_value() -> None:
    # the peers' first round is empty, yet the local node is in it: no fallback to r1
    where = Where(spread_key="rack", spread_to=frozenset({"r2"}))
    v = view_of(rep("a0", {"rack": "r1"}))
    local = rep("me", {"rack": "r2"}, weight_sum=3.0)
    assert targets(spec(job="j", spread="rack"), local, v, where) == {"me"}


def test_spread_fallback_treats_the_local_node_like_any_peer() -> None:
    # nobody eligible on r2: in the fallback an idle local r1 node beats a busy r1 peer
    where = Where(spread_key="rack", spread_to=frozenset({"r2"}))
    v = view_of(rep("a0", {"rack": "r1"}, weight_sum=5.0))
    assert targets(spec(job="j"), rep("me", {"rack": "r1"}), v, where) == {"me"}


def test_spread_holds_when_the_task_also_has_soft_preferences() -> None:
    where = Where(spread_key="rack", spread_to=frozenset({"r2"}))
    v = view_of(rep("a0", {"rack": "r2"}), rep("b0", {"rack": "r1", "ssd": "yes"}))
    s = spec(job="j", spread="rack", prefer=("ssd=yes",))
    assert targets(s, rep("me", **DRAINED), v, where) == {"a0"}


# -------------------------------------------------- anti-affinity, data


def test_full_nodes_are_never_chosen() -> None:
    v = view_of(*[rep(f"n{i}", weight_sum=0.0 if i < 5 else 9.0) for i in range(10)])
    full = frozenset({"me", "n0", "n1", "n2", "n3", "n4"})
    where = Where(full=full)
    got = targets(spec(job="j", anti_affinity=1), rep("me"), v, where, seeds=40)
    assert got and got.isdisjoint(full)
    p = place(spec(), rep("me"), v, random.Random(1), NOW, where=where)
    reasons = {c.node: c.why_not for c in p.candidates}
    assert reasons["me"].startswith("anti-affinity") and reasons["n0"].startswith("anti-affinity")
    everyone = Where(full=frozenset({*v, "me"}))
    assert targets(spec(), rep("me"), v, everyone) == {None}
    # a large view widens to find the one node that is not full
    big = view_of(*[rep(f"n{i}") for i in range(300)])
    where = Where(full=frozenset(f"n{i}" for i in range(300) if i != 211) | {"me"})
    assert targets(spec(), rep("me"), big, where) == {"n211"}


def test_holders_only_chooses_only_nodes_whose_digest_may_hold_the_data() -> None:
    has, other = digest(["imagenet", "coco"]), digest(["coco"])
    assert may_hold(has, "imagenet") and not may_hold(other, "imagenet")
    v = view_of(
        *[rep(f"o{i}", data=other) for i in range(6)],
        rep("e"),  # no digest: holds nothing
        rep("h0", data=has, weight_sum=8.0),
        rep("h1", data=has, weight_sum=8.0),
    )
    s = spec(data=("imagenet",))
    where = Where(holders_only=True)
    assert targets(s, rep("me", data=other), v, where, seeds=40) == {"h0", "h1"}
    assert targets(s, rep("me", data=has, weight_sum=9.0), v, where, seeds=40) <= {"h0", "h1", "me"}
    assert targets(s, rep("me"), view_of(rep("o", data=other)), where) == {None}
    # without holders_only the data only scores: an idle non-holder may win
    assert targets(s, rep("me", **DRAINED), v, NOWHERE, seeds=40) - {"h0", "h1"}


# ------------------------------------------------------------ prefer


def test_prefer_breaks_ties_between_otherwise_equal_nodes() -> None:
    v = view_of(rep("a", {"ssd": "no"}), rep("b", {"ssd": "yes"}))
    s = spec(prefer=("ssd=yes",))
    assert targets(s, rep("me", **DRAINED), v, seeds=40) == {"b"}
    assert targets(spec(), rep("me", **DRAINED), v, seeds=40) == {"a", "b"}
    # the local node is preferred the same way
    assert targets(s, rep("me", {"ssd": "yes"}), view_of(rep("a")), seeds=40) == {"me"}


def test_prefer_is_soft() -> None:
    s = spec(prefer=("ssd=yes",))
    # a preferred node busier by more than PREFER_TASKS tasks per slot loses
    busy = PREFER_TASKS + 1.0
    v = view_of(rep("a"), rep("b", {"ssd": "yes"}, weight_sum=busy))
    assert targets(s, rep("me", **DRAINED), v) == {"a"}
    # and no node needs to match a preference at all
    assert targets(s, rep("me", **DRAINED), view_of(rep("a"))) == {"a"}


# ------------------------------------------------- labels on the wire

LABELS = (("gpu.model", "NVIDIA-H200"), ("mem", "64G"), ("rack", "r1"))
DIGEST = digest(["imagenet", "/data/coco"])


def test_load_report_labels_and_digest_round_trip() -> None:
    r = rep("n1", dict(LABELS), data=DIGEST, weight_sum=2.5)
    compact = load_to_compact(r)
    assert compact["lb"] == [list(x) for x in LABELS] and compact["dk"] == DIGEST
    assert load_from_compact(compact) == r
    assert codec.load_report_from_wire(codec.load_report_to_wire(r)) == r
    # through msgpack too, as gossip sends it
    c = Codec()
    (msg,) = c.decode_packet(
        c.encode_packet("c", [c.encode(LoadUpdate(r))]), max_size=65507, cluster="c"
    ).messages
    assert isinstance(msg, LoadUpdate) and msg.report == r
    # a report without labels or data leaves both out of the compact form
    bare = load_to_compact(rep("n2"))
    assert "lb" not in bare and "dk" not in bare
    assert load_from_compact(bare).labels == () and load_from_compact(bare).data == b""


def test_wire_labels_are_sorted_on_decode() -> None:
    obj = codec.load_report_to_wire(rep("n1"))
    obj["labels"] = [["z", "1"], ["a", "2"]]
    assert codec.load_report_from_wire(obj).labels == (("a", "2"), ("z", "1"))


BAD_LABELS = [
    ([[f"k{i}", "v"] for i in range(cons.MAX_LABELS + 1)], f"more than {cons.MAX_LABELS}"),
    ([["bad key", "v"]], "key 'bad key'"),
    ([["-k", "v"]], "key '-k'"),
    ([["rack", "r 1"]], "rack: value 'r 1'"),
    ([["rack", "r1"], ["rack", "r2"]], "a key is repeated"),
    ([["rack", 5]], "rack: value 5"),
    ([[5, "v"]], "key 5"),
    ([["rack", None]], "rack: value None"),
    ([["rack"]], "expected [key, value]"),
    ([["a", "b", "c"]], "expected [key, value]"),
    (["rack=r1"], "expected [key, value]"),
    ([[f"k{i:02d}", "v" * 30] for i in range(12)], f"more than {cons.LABELS_BYTES} characters"),
]


@pytest.mark.parametrize(("labels", "fragment"), BAD_LABELS)
def test_malformed_labels_are_schema_errors_naming_the_field(labels: object, fragment: str) -> None:
    full = codec.load_report_to_wire(rep("n1"))
    full["labels"] = labels
    with pytest.raises(wire.SchemaError) as ei:
        codec.load_report_from_wire(full)
    assert "load report: labels" in str(ei.value) and fragment in str(ei.value)
    compact = {**load_to_compact(rep("n1")), "lb": labels}
    with pytest.raises(wire.SchemaError, match="load report: labels"):
        load_from_compact(compact)


def test_labels_that_are_not_a_list_are_schema_errors() -> None:
    full = codec.load_report_to_wire(rep("n1"))
    full["labels"] = {"rack": "r1"}
    with pytest.raises(wire.SchemaError, match="'labels'"):
        codec.load_report_from_wire(full)


def test_an_unhashable_label_key_is_a_schema_error_on_the_gossip_path() -> None:
    compact = {**load_to_compact(rep("n1")), "lb": [[["k"], "v"]]}
    with pytest.raises(wire.SchemaError):
        load_from_compact(compact)


def test_an_unhashable_label_key_is_a_schema_error_in_the_codec() -> None:
    full = codec.load_report_to_wire(rep("n1"))
    full["labels"] = [[["k"], "v"]]
    with pytest.raises(wire.SchemaError, match="load report: labels"):
        codec.load_report_from_wire(full)


@pytest.mark.parametrize("size", [1, DIGEST_BYTES - 1, DIGEST_BYTES + 1, 2 * DIGEST_BYTES])
def test_a_wrong_length_digest_is_a_schema_error(size: int) -> None:
    full = codec.load_report_to_wire(rep("n1"))
    full["data"] = b"\x01" * size
    with pytest.raises(wire.SchemaError, match=f"load report: data: a digest is {DIGEST_BYTES}"):
        codec.load_report_from_wire(full)
    with pytest.raises(wire.SchemaError, match="load report: data"):
        load_from_compact({**load_to_compact(rep("n1")), "dk": b"\x01" * size})
    full["data"] = "x" * DIGEST_BYTES  # text, not bytes
    with pytest.raises(wire.SchemaError, match="'data'"):
        codec.load_report_from_wire(full)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text("abcxyz", min_size=1, max_size=3).map(lambda k: "k" + k.replace("x", "./_-")),
        st.text("AZaz09_.:+/@,-", max_size=12),
        max_size=cons.MAX_LABELS,
    ),
    st.lists(st.text("abc_19", min_size=1, max_size=8).map("d".__add__), max_size=5),
)
def test_any_valid_labels_round_trip(labels: dict[str, str], keys: list[str]) -> None:
    r = rep("n1", labels, data=digest(keys))
    assert load_from_compact(load_to_compact(r)) == r
    assert codec.load_report_from_wire(codec.load_report_to_wire(r)) == r


# ------------------------------------------- gossip: the newest report wins

CLUSTER = "c"
CODEC = Codec()


def _member(i: int) -> m.Member:
    return m.Member(f"n{i}", f"10.0.0.{i}", 7946, cluster=CLUSTER)


def _send(ms: Membership, r: LoadReport, at: float) -> None:
    ms.receive(
        (f"10.0.0.{r.node[1:]}", 7946),
        CODEC.encode_packet(CLUSTER, [CODEC.encode(LoadUpdate(r))]),
        at,
    )


def test_gossip_keeps_the_newest_versions_labels() -> None:
    ms = Membership(MembershipConfig.local(indirect_checks=1), _member(1), random.Random(1), 0.0)
    ms.bootstrap([_member(2)], 0.0)
    ms.poll_events()
    view = LoadView()

    def apply() -> None:
        for ev in ms.poll_events():
            if isinstance(ev, LoadUpdated):
                view.upsert(ev.report, ev.at)

    r4 = attrs.evolve(rep("n2", {"rack": "r1"}, data=DIGEST), version=4)
    _send(ms, r4, 1.0)
    apply()
    assert dict(ms.load_view()["n2"].report.labels) == {"rack": "r1"}
    assert dict(view["n2"].report.labels) == {"rack": "r1"}

    r5 = attrs.evolve(rep("n2", {"rack": "r2", "gpu": "1"}), version=5)  # labels changed
    _send(ms, r5, 2.0)
    apply()
    assert ms.load_view()["n2"].report == r5
    assert dict(view["n2"].report.labels) == {"gpu": "1", "rack": "r2"}
    assert view["n2"].report.data == b""  # the digest went with the old version

    stale = ms.stats["load.stale"]
    for old in (3, 5):  # older, and the same version again: ignored
        _send(ms, attrs.evolve(rep("n2", {"rack": "r9"}), version=old), 3.0)
        apply()
    assert ms.stats["load.stale"] == stale + 2
    assert ms.load_view()["n2"].report == r5
    assert dict(view["n2"].report.labels) == {"gpu": "1", "rack": "r2"}


def test_load_view_upsert_replaces_the_labels() -> None:
    v = LoadView()
    v.upsert(attrs.evolve(rep("a", {"rack": "r1"}), version=1), NOW)
    v.upsert(attrs.evolve(rep("a", {"rack": "r2"}), version=2), NOW + 1)
    assert len(v) == 1 and dict(v["a"].report.labels) == {"rack": "r2"}
    p = place(spec(constraints=("rack=r1",)), rep("me", **DRAINED), v, random.Random(1), NOW)
    assert p.target is None


# --------------------------------------------------------- task fields

NEW_FIELDS = ("constraints", "prefer", "job", "spread", "anti_affinity", "data", "cwd_any")


def test_a_spec_without_the_new_fields_sends_none_of_them() -> None:
    s = spec(cwd="/tmp", cpu=1.0)
    obj = codec.task_spec_to_wire(s)
    assert not set(NEW_FIELDS) & set(obj)
    assert codec.task_spec_from_wire(obj) == s


def test_a_spec_with_the_new_fields_round_trips() -> None:
    s = spec(
        constraints=("rack in r1,r2", "mem>=64G", "gpu.model~H100|H200", "!maintenance"),
        prefer=("ssd=yes", "zone==eu"),
        job="train-42",
        spread="rack",
        anti_affinity=2,
        data=("imagenet", "/data/coco"),
        cwd_any=True,
    )
    obj = codec.task_spec_to_wire(s)
    assert set(NEW_FIELDS) <= set(obj)
    assert codec.task_spec_from_wire(obj) == s
    one = codec.task_spec_to_wire(spec(job="j"))
    assert {k for k in NEW_FIELDS if k in one} == {"job"}
    assert Needs.of(codec.task_spec_from_wire(obj)).constraints[1].op == ">="


BAD_FIELDS = [
    ({"constraints": ["bad key=1"]}, "task: constraint: 'bad key=1'"),
    ({"constraints": ["mem>=big"]}, "task: constraint: 'mem>=big'"),
    ({"constraints": ["x~(a)"]}, "task: constraint: 'x~(a)'"),
    ({"constraints": [""]}, "task: constraint: empty constraint"),
    ({"constraints": [5]}, "'constraints'"),
    ({"constraints": "rack=r1"}, "'constraints'"),
    ({"constraints": ["k"] * (cons.MAX_CONSTRAINTS + 1)}, "'constraints' has more than"),
    ({"prefer": ["=x"]}, "task: prefer: '=x'"),
    ({"prefer": ["ok"] * (cons.MAX_CONSTRAINTS + 1)}, "'prefer' has more than"),
    ({"job": "a b"}, "task: job 'a b'"),
    ({"job": "-j"}, "task: job '-j'"),
    ({"job": "j" * 129}, "'job'"),
    ({"spread": "-x"}, "task: spread: label key '-x'"),
    ({"spread": "a b"}, "task: spread: label key 'a b'"),
    ({"data": ["../x"]}, "task: data: key '../x'"),
    ({"data": ["/a/../b"]}, "task: data: key '/a/../b'"),
    ({"data": ["/a//b"]}, "task: data: key '/a//b'"),
    ({"data": [""]}, "task: data: key ''"),
    ({"anti_affinity": -1}, "'anti_affinity'"),
    ({"cwd_any": "yes"}, "'cwd_any'"),
]


@pytest.mark.parametrize(("fields", "fragment"), BAD_FIELDS)
def test_task_spec_from_wire_rejects_bad_fields_naming_them(
    fields: dict[str, object], fragment: str
) -> None:
    obj = {**codec.task_spec_to_wire(spec()), **fields}
    with pytest.raises(wire.SchemaError) as ei:
        codec.task_spec_from_wire(obj)
    assert fragment in str(ei.value)
