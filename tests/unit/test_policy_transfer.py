"""Adaptive transfer: hysteresis, modes by cluster load, probe bounds, safety, wire."""

from __future__ import annotations

import math
import random
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm import wire
from swarm.model import LoadReport, TaskSpec
from swarm.policy.load import UNIT
from swarm.policy.placement import Needs
from swarm.policy.transfer import (
    PULL,
    PUSH,
    ProbeFor,
    ProbeReply,
    ProbeRequest,
    PushTask,
    QueuedTask,
    Regime,
    Role,
    StealFrom,
    TransferConfig,
    TransferPolicy,
    classify,
    cluster_load,
    probe_reply_from_wire,
    probe_reply_to_wire,
    probe_request_from_wire,
    probe_request_to_wire,
    regime_of,
)
from swarm.policy.view import LoadView, PeerEntry

CFG = TransferConfig()


# ------------------------------------------------------------- hysteresis


def test_role_hysteresis() -> None:
    seq = [2.0, 1.6, 1.5, 1.4, 1.6, 1.9, 2.0, 0.4, 0.8, 0.99, 1.0, 0.8, 0.6, 0.49]
    roles = []
    role = Role.NEUTRAL
    for x in seq:
        role = classify(role, x * UNIT, 0.0, True, CFG)
        roles.append(role)
    S, R, N = Role.SENDER, Role.RECEIVER, Role.NEUTRAL
    assert roles == [S, S, S, N, N, N, S, R, R, R, N, N, N, R]


def test_sender_needs_a_movable_task_and_infinite_load_is_never_a_receiver() -> None:
    assert classify(Role.NEUTRAL, 9 * UNIT, 0.0, False, CFG) is Role.NEUTRAL
    assert classify(Role.SENDER, 9 * UNIT, 0.0, False, CFG) is Role.NEUTRAL
    assert classify(Role.RECEIVER, math.inf, 0.0, False, CFG) is Role.NEUTRAL
    assert classify(Role.NEUTRAL, math.inf, 0.0, True, CFG) is Role.SENDER


def test_thresholds_follow_a_busy_cluster() -> None:
    # mean 8 tasks/node: a node at 5 is a receiver, at 11 a sender
    assert classify(Role.NEUTRAL, 5 * UNIT, 8 * UNIT, False, CFG) is Role.RECEIVER
    assert classify(Role.NEUTRAL, 11 * UNIT, 8 * UNIT, True, CFG) is Role.SENDER
    assert classify(Role.NEUTRAL, 9 * UNIT, 8 * UNIT, True, CFG) is Role.NEUTRAL


def test_regime_hysteresis() -> None:
    seq = [0.5, 0.62, 0.66, 0.7, 0.56, 0.54, 0.8, 0.96, 0.86, 0.84, 0.5]
    out = []
    reg = None
    for x in seq:
        reg = regime_of(reg, x * UNIT, CFG)
        out.append(reg)
    L, M, H = Regime.LOW, Regime.MID, Regime.HIGH
    assert out == [L, L, M, M, M, L, M, H, H, M, L]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 3.0), min_size=2, max_size=60))
def test_regime_never_flaps_inside_a_band(xs: list[float]) -> None:
    reg: Regime | None = None
    for x in xs:
        new = regime_of(reg, x * UNIT, CFG)
        if reg is not None and new is not reg:
            # a change needs the mean beyond a watermark by the band
            lo, hi, b = CFG.wm_low, CFG.wm_high, CFG.wm_band
            m = x * UNIT
            assert m > lo + b or m < lo - b or m > hi + b or m < hi - b
        reg = new


def test_cluster_load_excludes_infinite_and_samples_large_views() -> None:
    v = LoadView()
    v.upsert(LoadReport("a", 1, weight_sum=2.0), 0.0)
    v.upsert(LoadReport("b", 1, shares=0), 0.0)
    c = cluster_load(LoadReport("me", 1), v, random.Random(0))
    assert c.mean == 1.0 * UNIT and c.nodes == 2 and c.infinite == 1
    big = LoadView()
    for i in range(5000):
        big.upsert(LoadReport(f"n{i}", 1, weight_sum=float(i % 3)), 0.0)
    c = cluster_load(LoadReport("me", 1, weight_sum=1.0), big, random.Random(0), 64)
    assert c.nodes == 65
    assert 0.6 * UNIT < c.mean < 1.4 * UNIT


# ----------------------------------------------------------- mini cluster


@attrs.define
class Node:
    name: str
    shares: int = 1024
    running: float = 0.0  # weight of running tasks (they never move here)
    queue: list[QueuedTask] = attrs.field(factory=list)
    policy: TransferPolicy = attrs.field(default=None)

    def report(self) -> LoadReport:
        return LoadReport(
            self.name,
            1,
            shares=self.shares,
            weight_sum=self.running + sum(t.needs.weight for t in self.queue),
            queued=len(self.queue),
            running=1 if self.running else 0,
        )


@attrs.define
class Cluster:
    nodes: dict[str, Node]
    rng: random.Random
    now: float = 0.0
    moves: list[tuple[float, str, str, str, str]] = attrs.field(
        factory=list
    )  # t, how, task, src, dst
    probes_per_round: list[int] = attrs.field(factory=list)

    def view_for(self, me: str) -> LoadView:
        v = LoadView()
        for n in self.nodes.values():
            if n.name != me:
                v.upsert(n.report(), self.now)
        return v

    def move(self, how: str, task_id: str, src: Node, dst: Node) -> None:
        t = next(t for t in src.queue if t.id == task_id)
        src.queue.remove(t)
        dst.queue.append(attrs.evolve(t, arrived_at=self.now))
        self.moves.append((self.now, how, task_id, src.name, dst.name))

    def tick(self) -> None:
        names = list(self.nodes)
        self.rng.shuffle(names)
        for name in names:
            node = self.nodes[name]
            actions = node.policy.step(
                self.now, node.report(), node.queue, self.view_for(name), self.rng
            )
            probes = [a for a in actions if isinstance(a, ProbeFor)]
            if probes:
                self.probes_per_round.append(len(probes))
            self.run(node, actions)
        self.now += 1.0

    def run(self, node: Node, actions: list[Any]) -> None:
        for a in actions:
            if isinstance(a, ProbeFor):
                peer = self.nodes[a.peer]
                reply = peer.policy.on_probe(self.now, a.request, peer.report(), peer.queue)
                more = node.policy.on_probe_reply(self.now, reply, node.report(), node.queue)
                self.run(node, more)
            elif isinstance(a, PushTask):
                self.move(PUSH, a.task_id, node, self.nodes[a.peer])
            elif isinstance(a, StealFrom):
                peer = self.nodes[a.peer]
                tid = peer.policy.on_steal(self.now, a.request, peer.report(), peer.queue)
                if tid is not None:
                    self.move(PULL, tid, peer, node)


def make_cluster(
    spec: list[tuple[int, float, int]], seed: int = 0, cfg: TransferConfig = CFG
) -> Cluster:
    """spec: per node (shares, running weight, queued unit tasks)."""
    nodes = {}
    k = 0
    for i, (shares, running, queued) in enumerate(spec):
        name = f"n{i}"
        q = []
        for _ in range(queued):
            q.append(QueuedTask(f"t{k}", Needs(), queued_at=float(k), arrived_at=-1000.0))
            k += 1
        nodes[name] = Node(name, shares, running, q, TransferPolicy(name, cfg))
    return Cluster(nodes, random.Random(seed))


def test_low_cluster_load_senders_push() -> None:
    # 1 overloaded node, 19 idle: mean = 0.4 tasks/node, low regime
    c = make_cluster([(1024, 1.0, 7)] + [(1024, 0.0, 0)] * 19, seed=1)
    for _ in range(30):
        c.tick()
    assert c.moves and all(how == PUSH for _, how, *_ in c.moves)
    assert len(c.nodes["n0"].queue) <= 1
    assert all(n.policy.regime is Regime.LOW for n in c.nodes.values())


def test_high_cluster_load_receivers_pull() -> None:
    # most nodes busy with queues, two idle: high regime, idle ones steal
    spec = [(1024, 1.0, 3)] * 18 + [(1024, 0.0, 0)] * 2
    c = make_cluster(spec, seed=2)
    for _ in range(30):
        c.tick()
    assert c.moves and all(how == PULL for _, how, *_ in c.moves)
    assert all(dst in ("n18", "n19") for *_, dst in c.moves)
    assert all(n.policy.regime is Regime.HIGH for n in c.nodes.values())
    # the oldest queued task of a victim is what was stolen
    first = c.moves[0]
    victim = int(first[3][1:])
    assert first[2] == f"t{victim * 3}"


def test_no_moves_at_low_imbalance() -> None:
    for spec in (
        [(1024, 1.0, 0)] * 10,  # everyone busy, nobody queued
        [(1024, 1.0, 1)] * 10,  # everyone one queued
        [(1024, 1.0, 1)] * 5 + [(1024, 1.0, 0)] * 5,  # small spread
        [(2048, 1.0, 2)] * 5 + [(1024, 1.0, 0)] * 5,  # equal load, unequal shares
    ):
        c = make_cluster(spec, seed=3)
        for _ in range(20):
            c.tick()
        assert c.moves == [], spec


def test_symmetric_mode_in_between() -> None:
    # mean 0.7 tasks/node: between the watermarks, both sides initiate
    spec = [(1024, 1.0, 2)] * 2 + [(1024, 1.0, 0)] + [(1024, 0.0, 0)] * 7
    hows: set[str] = set()
    for seed in range(6):
        c = make_cluster(spec, seed=seed)
        for _ in range(3):
            c.tick()
        assert all(n.policy.regime is Regime.MID for n in c.nodes.values())
        assert c.moves
        hows |= {how for _, how, *_ in c.moves}
    assert hows == {PUSH, PULL}


@st.composite
def clusters(draw: st.DrawFn) -> list[tuple[int, float, int]]:
    n = draw(st.integers(2, 12))
    return [
        (
            draw(st.sampled_from([0, 0, 512, 1024, 2048])),
            draw(st.sampled_from([0.0, 1.0, 2.0])),
            draw(st.integers(0, 6)),
        )
        for _ in range(n)
    ]


@settings(max_examples=60, deadline=None)
@given(clusters(), st.integers(0, 1000), st.integers(1, 4))
def test_safety_over_random_clusters(
    spec: list[tuple[int, float, int]], seed: int, lp: int
) -> None:
    cfg = attrs.evolve(CFG, probe_limit=lp, task_cooldown=5.0)
    c = make_cluster(spec, seed=seed, cfg=cfg)
    for _ in range(25):
        c.tick()
    drained = {n.name for n in c.nodes.values() if n.shares <= 0}
    for t, _how, task, src, dst in c.moves:
        assert dst not in drained  # a drained node never receives a task
        assert src != dst
        # no ping-pong: the same task is not moved again within its cooldown
        later = [m for m in c.moves if m[2] == task and m[0] > t]
        assert all(m[0] - t >= cfg.task_cooldown for m in later)
    assert all(p <= lp for p in c.probes_per_round)
    # tasks are conserved
    assert sum(len(n.queue) for n in c.nodes.values()) == sum(q for *_, q in spec)


def test_drained_node_pushes_its_queue_out_even_at_high_load() -> None:
    spec = [(0, 0.0, 3)] + [(1024, 1.0, 3)] * 8 + [(1024, 0.0, 0)] * 3
    c = make_cluster(spec, seed=5)
    for _ in range(40):
        c.tick()
    assert c.nodes["n0"].queue == []
    assert any(how == PUSH and src == "n0" for _, how, _t, src, _d in c.moves)


def test_probes_are_bounded_and_one_round_at_a_time() -> None:
    pol = TransferPolicy("me", attrs.evolve(CFG, probe_limit=3))
    v = LoadView({f"p{i}": PeerEntry(LoadReport(f"p{i}", 1), 0.0) for i in range(500)})
    q = [QueuedTask(f"t{i}", Needs(), float(i), -1000.0) for i in range(5)]
    me = LoadReport("me", 1, weight_sum=6.0, queued=5)
    rng = random.Random(0)
    acts = pol.step(0.0, me, q, v, rng)
    assert len(acts) == 3 and all(isinstance(a, ProbeFor) and a.kind == PUSH for a in acts)
    assert pol.step(0.1, me, q, v, rng) == []  # round in flight
    assert pol.step(0.6, me, q, v, rng) == []  # timed out; rate limit until 1.6
    assert pol.stats.timeouts == 1
    assert len(pol.step(1.6, me, q, v, rng)) == 3


def test_first_yes_wins_and_late_replies_are_ignored() -> None:
    pol = TransferPolicy("me")
    v = LoadView({f"p{i}": PeerEntry(LoadReport(f"p{i}", 1), 0.0) for i in range(3)})
    q = [QueuedTask("t1", Needs(), 0.0, -1000.0), QueuedTask("t2", Needs(), 1.0, -1000.0)]
    me = LoadReport("me", 1, weight_sum=3.0, queued=2)
    acts = [a for a in pol.step(0.0, me, q, v, random.Random(0)) if isinstance(a, ProbeFor)]
    assert len(acts) == 3
    rnd = acts[0].request.round
    assert acts[0].request.task_id == "t1"
    no = ProbeReply(rnd, PUSH, acts[0].peer, False, "busy")
    assert pol.on_probe_reply(0.1, no, me, q) == []
    yes = ProbeReply(rnd, PUSH, acts[1].peer, True)
    assert pol.on_probe_reply(0.1, yes, me, q) == [PushTask(acts[1].peer, "t1")]
    late = ProbeReply(rnd, PUSH, acts[2].peer, True)
    assert pol.on_probe_reply(0.2, late, me, q) == []


def test_on_probe_uses_fresh_state() -> None:
    pol = TransferPolicy("r")
    giver = LoadReport("s", 1, weight_sum=4.0, queued=3)
    req = ProbeRequest(1, PUSH, giver, "t1", Needs())
    assert pol.on_probe(0.0, req, LoadReport("r", 1), []).ok
    pol2 = TransferPolicy("r")
    busy = LoadReport("r", 1, weight_sum=3.0)
    assert not pol2.on_probe(0.0, req, busy, []).ok
    drained = LoadReport("r", 1, shares=0)
    r = TransferPolicy("r").on_probe(0.0, req, drained, [])
    assert not r.ok and "drained" in r.reason
    # a node that just said yes holds off other pushes for accept_hold
    assert not pol.on_probe(0.1, attrs.evolve(req, round=2), LoadReport("r", 1), []).ok


def test_steal_gives_oldest_movable_not_pinned_global_or_just_arrived() -> None:
    pol = TransferPolicy("s")
    now = 100.0
    q = [
        QueuedTask("pinned", Needs(), 0.0, 0.0, pinned=True),
        QueuedTask("global", Needs(is_global=True), 1.0, 0.0),
        QueuedTask("fresh", Needs(), 2.0, now - 1.0),
        QueuedTask("big", Needs(reserve_shares=4000), 3.0, 0.0),
        QueuedTask("old", Needs(), 4.0, 0.0),
        QueuedTask("young", Needs(), 5.0, 0.0),
    ]
    me = LoadReport("s", 1, weight_sum=7.0, queued=6)
    thief = LoadReport("r", 1)
    req = ProbeRequest(9, PULL, thief)
    assert pol.on_probe(now, req, me, q).ok
    assert pol.on_steal(now, req, me, q) == "old"
    # a drained thief gets nothing
    assert (
        TransferPolicy("s").on_steal(
            now, ProbeRequest(9, PULL, attrs.evolve(thief, shares=0)), me, q
        )
        is None
    )


def test_a_node_does_not_push_and_pull_at_once() -> None:
    pol = TransferPolicy("x")
    q = [QueuedTask("t1", Needs(), 0.0, -1000.0)]
    me = LoadReport("x", 1, weight_sum=5.0, queued=1)
    # x just took a push: it will not give work away during switch_cooldown
    pol.on_probe(
        0.0,
        ProbeRequest(1, PUSH, LoadReport("s", 1, weight_sum=9.0), "t9", Needs()),
        LoadReport("x", 1),
        [],
    )
    assert not pol.on_probe(1.0, ProbeRequest(2, PULL, LoadReport("r", 1)), me, q).ok
    v = LoadView({f"p{i}": PeerEntry(LoadReport(f"p{i}", 1), 0.0) for i in range(10)})
    assert pol.step(1.0, me, q, v, random.Random(0)) == []
    assert pol.step(11.0, me, q, v, random.Random(0)) != []


# -------------------------------------------------------------------- wire


def test_probe_wire_round_trip() -> None:
    from swarm.model import GpuRequest

    req = ProbeRequest(
        7,
        PUSH,
        LoadReport("a", 3, weight_sum=2.0),
        "t1",
        Needs(2.0, 100, False, 1.5, 1 << 20, GpuRequest(core=50)),
    )
    obj = wire.unpack(wire.pack(probe_request_to_wire(req)))
    assert probe_request_from_wire(obj) == req
    pull = ProbeRequest(8, PULL, LoadReport("b", 1))
    assert probe_request_from_wire(probe_request_to_wire(pull)) == pull
    rep = ProbeReply(7, PUSH, "b", True, "receiver", math.inf)
    assert probe_reply_from_wire(probe_reply_to_wire(rep)) == rep
    rep2 = ProbeReply(7, PULL, "b", False, "x", 0.25)
    assert probe_reply_from_wire(probe_reply_to_wire(rep2)) == rep2
    with pytest.raises(wire.SchemaError):
        probe_request_from_wire({**probe_request_to_wire(req), "kind": "yank"})
    with pytest.raises(wire.SchemaError):
        probe_request_from_wire({**probe_request_to_wire(req), "needs": None})


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.floats(),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=12,
    )
)
def test_probe_decoders_never_crash(obj: Any) -> None:
    base_req = probe_request_to_wire(ProbeRequest(1, PUSH, LoadReport("a", 1), "t", Needs()))
    base_rep = probe_reply_to_wire(ProbeReply(1, PUSH, "a", True))
    for dec, base in ((probe_request_from_wire, base_req), (probe_reply_from_wire, base_rep)):
        for cand in [obj] + [{**base, k: obj} for k in base]:
            try:
                dec(cand)
            except wire.WireError:
                pass


def test_queued_task_of_spec() -> None:
    s = TaskSpec(id="t", argv=("x",), weight=2.0, submitted_at=5.0)
    q = QueuedTask.of(s, arrived_at=7.0)
    assert q.needs.weight == 2.0 and q.queued_at == 5.0 and q.arrived_at == 7.0
    assert not q.movable(8.0, 30.0) and q.movable(37.0, 30.0)


def test_a_task_that_fits_nowhere_does_not_block_the_queue() -> None:
    pol = TransferPolicy("me")
    v = LoadView({f"p{i}": PeerEntry(LoadReport(f"p{i}", 1), 0.0) for i in range(10)})
    q = [
        QueuedTask("huge", Needs(reserve_shares=5000), 0.0, -1000.0),
        QueuedTask("small", Needs(), 1.0, -1000.0),
    ]
    me = LoadReport("me", 1, weight_sum=3.0, queued=2)
    rng = random.Random(0)
    assert pol.step(0.0, me, q, v, rng) == []  # "huge" fits no peer: no probe sent
    acts = [a for a in pol.step(1.0, me, q, v, rng) if isinstance(a, ProbeFor)]
    assert acts and all(a.request.task_id == "small" for a in acts)


def test_a_task_offered_in_a_push_round_is_not_also_stolen() -> None:
    pol = TransferPolicy("me")
    v = LoadView({f"p{i}": PeerEntry(LoadReport(f"p{i}", 1), 0.0) for i in range(10)})
    q = [QueuedTask("a", Needs(), 0.0, -1000.0), QueuedTask("b", Needs(), 1.0, -1000.0)]
    me = LoadReport("me", 1, weight_sum=4.0, queued=2)
    acts = [a for a in pol.step(0.0, me, q, v, random.Random(0)) if isinstance(a, ProbeFor)]
    assert acts[0].request.task_id == "a"
    thief = ProbeRequest(1, PULL, LoadReport("r", 1))
    assert pol.on_steal(0.1, thief, me, q) == "b"
