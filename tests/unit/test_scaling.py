"""One elastic pool's controller (issue 25, node/scaling.py), driven with fake members
and a fake clock: the actor seat (listen one ttl, claim, act from the next step),
scale-out with booting nodes, safe scale-in (drain, wait, hook, keep a victim that
receives work), hook retries, hand-over between controllers that hear each other's
announcements, restore from the journal, malformed announcements, and a randomized
cluster of controllers checked against the invariants."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm.cluster.actor import rendezvous_order
from swarm.model import LoadReport
from swarm.node.scalemsgs import MAX_VICTIMS, Announce, Drain, Journal, RunHook, journal_value
from swarm.node.scaling import PoolController
from swarm.policy.scalepool import Member, PoolSpec, parse_pool

TTL = 3.0
DT = 0.5  # a tick
BASE: dict[str, Any] = {
    "scale-out-command": "add.sh",
    "scale-in-command": "remove.sh",
    "selector": ["pool=gpu"],
    "lease-ttl": TTL,
    "min-nodes": 1,
    "max-nodes": 6,
    "max-step": 2,
    "target-utilisation": 0.5,
    "tolerance": 0.1,
    "scale-in-window": "10s",
    "out-cooldown": 5,
    "in-cooldown": 5,
    "hook-retries": 2,
    "hook-backoff": 1,
    "hook-timeout": 30,
    "drain-grace": 60,
    "boot-timeout": 30,
}


def _spec(**kw: Any) -> PoolSpec:
    return parse_pool("gpu", {**BASE, **kw})


SPEC = _spec()
KEY = SPEC.key


@attrs.define
class Node:
    running: int = 0
    queued: int = 0
    slots: int = 4
    shares: int = 1024
    task_seconds: float = 0.0
    pool: str = "gpu"
    homing: int = 0


def _report(n: str, x: Node, version: int = 1) -> LoadReport:
    return LoadReport(
        node=n,
        version=version,
        shares=x.shares,
        running=x.running,
        queued=x.queued,
        slots=x.slots,
        labels=(("pool", x.pool),),
        task_seconds=x.task_seconds,
        homing=x.homing,
    )


class Cluster:
    """Nodes with reports, a consistent live set, and controllers that hear each
    other's announcements at once (gossip without loss)."""

    def __init__(self, spec: PoolSpec, nodes: dict[str, Node], controllers: Iterable[str]) -> None:
        self.spec = spec
        self.nodes = dict(nodes)
        self.live = set(nodes)
        self.ctls = {n: PoolController(n, spec) for n in controllers}
        self.t = 0.0
        self.log: list[tuple[float, str, Any]] = []  # (time, controller, instruction)
        self.state: dict[str, Any] = {}  # each node's latest announcement (push-pull state)
        self.epochs: dict[str, int] = {}  # the newest epoch each holder announced

    def members(self) -> list[Member]:
        return [Member(n, _report(n, self.nodes[n]), 0.0) for n in sorted(self.live)]

    def gossip(self, sender: str, out: Iterable[Any]) -> None:
        for i in out:
            if isinstance(i, Announce):
                self.state[sender] = i.payload
                e = i.payload["lease"]["epoch"]
                self.epochs[sender] = max(self.epochs.get(sender, 0), e)
                for n, c in self.ctls.items():
                    if n != sender and n in self.live:
                        c.on_announce(i.payload, self.t)

    def push_pull(self, to: str) -> None:
        """`to` hears every live node's state (a node that joins, a periodic exchange):
        what runtime/autoscaler.py puts in each push-pull, `announcement()` (the
        holder's claim, or what a node heard, relayed without a lease)."""
        for n, c in sorted(self.ctls.items()):
            payload = c.announcement(self.t) if n in self.live else None
            if n != to and payload is not None:
                self.ctls[to].on_announce(payload, self.t)

    def tick(self) -> dict[str, list[Any]]:
        """One tick of every live controller, then the clock moves on by DT."""
        members, outs = self.members(), {}
        for n, c in sorted(self.ctls.items()):
            if n not in self.live:
                continue  # dead: it ticks no more
            out = c.tick(self.t, members, self.live)
            outs[n] = out
            self.log.extend((self.t, n, i) for i in out)
            self.gossip(n, out)
        self.t += DT
        return outs

    def hook_done(self, n: str, ok: bool, **kw: Any) -> list[Any]:
        out = self.ctls[n].hook_done(self.t, ok=ok, **kw)
        self.log.extend((self.t, n, i) for i in out)
        self.gossip(n, out)
        return out

    def run_until(self, pred: Any, limit: float) -> tuple[str, Any]:
        """Tick until an instruction matches `pred`; that (controller, instruction)."""
        end = self.t + limit
        while self.t < end:
            for n, out in self.tick().items():
                for i in out:
                    if pred(i):
                        return n, i
        raise AssertionError(f"nothing matched by t={self.t}")

    def run_for(self, seconds: float) -> list[tuple[float, str, Any]]:
        start = len(self.log)
        end = self.t + seconds - 1e-9
        while self.t < end:
            self.tick()
        return self.log[start:]

    def owner(self) -> str:
        return rendezvous_order(self.spec.key, self.live)[0]


def _actions(log: Iterable[tuple[float, str, Any]]) -> list[tuple[float, str, Any]]:
    return [x for x in log if isinstance(x[2], RunHook | Drain)]


def _hook(action: str) -> Any:
    return lambda i: isinstance(i, RunHook) and i.action == action


def _names(k: int, prefix: str = "n") -> list[str]:
    return [f"{prefix}{i}" for i in range(1, k + 1)]


# ----------------------------------------------------------------- scale-out


def _busy_cluster() -> Cluster:
    """3 nodes of 4 slots, 10 tasks: at a target of 0.5 the pool wants 5 nodes."""
    nodes = {n: Node(running=3) for n in _names(3)}
    nodes["n1"].queued = 1
    return Cluster(SPEC, nodes, nodes)


def test_the_seat_listens_one_ttl_then_claims_then_acts() -> None:
    c = _busy_cluster()
    me = c.owner()
    ctl = c.ctls[me]
    c.run_for(TTL)  # listening: nothing said, nothing done
    assert not _actions(c.log) and not any(isinstance(x[2], Announce) for x in c.log)
    assert ctl.status(c.t)["seat"].startswith("owner; listening")
    assert ctl.status(c.t)["view_ago"] is None  # no view taken yet
    outs = c.tick()  # t = ttl: claims and announces
    assert [type(i) for i in outs[me]] == [Announce]
    assert not ctl.step or not ctl.step.acting
    assert outs[me][0].payload["lease"] == {"key": KEY, "holder": me, "epoch": 1, "ttl": TTL}
    others = [n for n in c.ctls if n != me]
    assert all(outs[n] == [] for n in others)
    assert all(c.ctls[n].seat.seen[me].lease.epoch == 1 for n in others)
    outs = c.tick()  # acts from the next step
    assert any(isinstance(i, RunHook) for i in outs[me])
    assert ctl.status(c.t)["acting"] and ctl.status(c.t)["epoch"] == 1


def test_a_burst_scales_out_once_and_counts_booting_nodes_until_they_join() -> None:
    c = _busy_cluster()
    n, hook = c.run_until(_hook("out"), 10.0)
    assert n == c.owner() and c.t - DT == TTL + DT  # the first acting step
    assert hook.command == "add.sh" and hook.timeout == 30.0 and hook.attempt == 0
    assert hook.env == {
        "SWARM_SCALE_POOL": "gpu",
        "SWARM_SCALE_ACTION": "out",
        "SWARM_SCALE_COUNT": "2",
        "SWARM_SCALE_NODES": "",
        "SWARM_SCALE_DESIRED": "5",
        "SWARM_SCALE_EPOCH": "1",
        "SWARM_SCALE_ACTOR": n,
        "SWARM_SCALE_ATTEMPT": "0",
    }
    assert int(hook.env["SWARM_SCALE_COUNT"]) <= SPEC.scale.max_step
    acted_at = c.t - DT
    journal = [i for t, m, i in c.log if isinstance(i, Journal) and t == acted_at]
    assert len(journal) == 1 and journal[0].key == KEY
    assert journal[0].note["action"] == "out" and journal[0].note["count"] == 2
    assert journal[0].note["epoch"] == 1 and journal[0].note["pool"] == "gpu"
    assert journal[0].value == {
        "last": {"a": "out", "c": 2, "ago": 0.0},
        "victims": [],
        "epoch": 1,
        "booting": {"c": 2, "ago": 0.0, "base": ["n1", "n2", "n3"]},
    }
    ctl = c.ctls[n]
    st_ = ctl.status(c.t)
    assert st_["pending"]["running"] and st_["booting"] == 2
    assert st_["decision"]["action"] == "out"
    assert st_["view_ago"] == c.t - acted_at  # the view the decision was taken on

    # the hook runs 2 s, then the out-cooldown passes: the 2 booting nodes cover the demand
    assert not _actions(c.run_for(2.0))
    assert c.hook_done(n, True, rc=0, output="launched", duration=2.0) == []
    assert ctl.status(c.t)["pending"] is None
    assert ctl.history[-1].ok and ctl.history[-1].output == "launched"
    assert not _actions(c.run_for(3 * SPEC.scale.out_cooldown))
    assert ctl.view is not None and ctl.view.booting == 2 and ctl.view.nodes == 3
    assert ctl.decision is not None and ctl.decision.action == "none"

    # they join: booting no more, and the demand is met
    c.nodes["n4"] = Node()
    c.nodes["n5"] = Node()
    c.live |= {"n4", "n5"}
    c.ctls["n4"] = PoolController("n4", SPEC)  # n4 runs an agent too
    log = c.run_for(10.0)
    assert not _actions(log)
    owner_now = c.owner()
    v = c.ctls[n].view if owner_now == n else None
    if v is not None:
        assert (v.nodes, v.booting) == (5, 0)

    # more demand: at most up to max-nodes (6), never past it
    for x in c.nodes.values():
        x.running, x.queued = 4, 20
    _, hook = c.run_until(_hook("out"), 3 * TTL + SPEC.scale.out_cooldown)
    assert hook.env["SWARM_SCALE_COUNT"] == "1"  # max-nodes 6, 5 in the pool
    assert hook.env["SWARM_SCALE_DESIRED"] == "6"


def test_booting_nodes_are_forgotten_after_the_boot_timeout() -> None:
    c = _busy_cluster()
    n, _ = c.run_until(_hook("out"), 10.0)
    started = c.t - DT
    c.hook_done(n, True)
    log = c.run_for(SPEC.boot_timeout - 1.0)
    assert not _actions(log)
    # they never joined: after the boot timeout the pool counts 3 nodes again
    m, hook = c.run_until(_hook("out"), 3.0)
    assert m == n and c.t - DT >= started + SPEC.boot_timeout
    assert hook.env["SWARM_SCALE_COUNT"] == "2"


def test_no_decision_before_acting_and_none_from_non_owners() -> None:
    c = _busy_cluster()
    c.run_for(40.0)
    actors = {m for _, m, _ in _actions(c.log)}
    assert actors == {c.owner()}
    for n, ctl in c.ctls.items():
        if n != c.owner():
            assert ctl.decision is None and not ctl.status(c.t)["acting"]
            assert ctl.status(c.t)["owner"] == c.owner()


# ------------------------------------------------------------------ scale-in


def _idle_cluster(spec: PoolSpec = SPEC) -> tuple[Cluster, str, list[str]]:
    """5 idle-ish nodes (3 tasks on 20 slots); the actor is the cheapest of all, the
    cheapest two others are the victims (returned in order)."""
    names = _names(5)
    order = rendezvous_order(spec.key, names)
    actor, rest = order[0], order[1:]
    nodes = {actor: Node()}
    # cost: task-seconds; the two cheapest non-actors are rest[3] (0) and rest[1] (5)
    costs = {rest[0]: (1, 500.0), rest[1]: (1, 5.0), rest[2]: (1, 50.0), rest[3]: (0, 0.0)}
    for n, (running, ts) in costs.items():
        nodes[n] = Node(running=running, task_seconds=ts)
    return Cluster(spec, nodes, nodes), actor, sorted([rest[3], rest[1]])


def _apply_drains(c: Cluster, out: Iterable[Any], *, finish: bool = True) -> None:
    for i in out:
        if isinstance(i, Drain):
            x = c.nodes[i.node]
            x.shares = 0 if i.on else 1024
            if i.on and finish:
                x.running = x.queued = 0
                x.task_seconds = 0.0


def test_idle_after_the_scale_in_window_drains_the_cheapest_others_then_removes_them() -> None:
    c, actor, victims = _idle_cluster()
    m, _ = c.run_until(lambda i: isinstance(i, Drain), 30.0)
    at = c.t - DT
    assert m == actor
    # not before the whole scale-in window was recorded (acting from ttl + one step)
    assert at >= TTL + DT + SPEC.scale.scale_in_window
    drains = [i for t, n, i in c.log if t == at and isinstance(i, Drain)]
    assert sorted(d.node for d in drains) == victims and all(d.on for d in drains)
    assert actor not in {d.node for d in drains}
    assert all(d.pool == "gpu" and "scale-in" in d.reason for d in drains)
    journal = [i for t, n, i in c.log if t == at and isinstance(i, Journal)]
    assert len(journal) == 1 and journal[0].note["action"] == "in"
    # the note names them in the order of removal (cheapest first), the record sorted
    assert sorted(journal[0].note["nodes"]) == victims and journal[0].value["victims"] == victims
    ctl = c.ctls[actor]
    assert sorted(ctl.victims) == victims

    # the drains not shown yet: asked again after a ttl, no hook
    log = c.run_for(TTL + DT)
    again = [i for _, _, i in log if isinstance(i, Drain)]
    assert sorted(d.node for d in again) == victims and all(
        "asked again" in d.reason for d in again
    )
    assert not [i for _, _, i in log if isinstance(i, RunHook)]
    assert ctl.view is not None and ctl.view.draining == 2 and ctl.view.nodes == 3

    # the victims' reports show the drain and no work: the scale-in hook
    _apply_drains(c, drains)
    m, hook = c.run_until(_hook("in"), 2.0)
    assert m == actor and hook.command == "remove.sh"
    assert hook.env["SWARM_SCALE_NODES"] == " ".join(victims)
    assert hook.env["SWARM_SCALE_COUNT"] == "2" and hook.env["SWARM_SCALE_DESIRED"] == "3"
    assert hook.env["SWARM_SCALE_ACTION"] == "in" and hook.env["SWARM_SCALE_ACTOR"] == actor
    out = c.hook_done(actor, True, rc=0)
    assert [type(i) for i in out] == [Journal, Announce]
    assert out[0].note["action"] == "in" and out[0].note["nodes"] == victims
    assert out[0].value["victims"] == []
    assert out[1].payload["victims"] == []  # said at once: nobody adopts them any more
    assert ctl.victims == {} and set(ctl.removed) == set(victims)
    # still live (the machines go away later), never in the view again
    c.run_for(DT)
    assert ctl.view is not None and (ctl.view.nodes, ctl.view.draining) == (3, 0)
    c.live -= set(victims)
    c.run_for(DT)
    assert ctl.removed == {}


def test_a_victim_that_receives_work_after_its_drain_showed_is_undrained_and_kept() -> None:
    c, actor, victims = _idle_cluster()
    c.run_until(lambda i: isinstance(i, Drain), 30.0)
    x, y = victims
    ctl = c.ctls[actor]
    # x shows the drain with one task still running; y not yet
    c.nodes[x].shares, c.nodes[x].running = 0, 1
    c.run_for(DT)
    assert ctl.victims[x].seen_drained and ctl.victims[x].work == 1
    c.run_for(2.0)
    assert x in ctl.victims  # waits for its task
    # work arrives (a submitter named it): kept
    c.nodes[x].queued = 1
    outs = c.tick()[actor]
    undo = [i for i in outs if isinstance(i, Drain) and i.node == x]
    assert [(d.node, d.on) for d in undo] == [(x, False)]
    assert "received work while draining (1 -> 2 tasks)" in undo[0].reason
    assert x not in ctl.victims and any(x in note for note in ctl.notes)
    # y goes on: drained and idle, removed alone
    c.nodes[y].shares = 0
    c.nodes[y].running = 0
    c.nodes[x].shares = 1024
    _, hook = c.run_until(_hook("in"), 2.0)
    assert hook.env["SWARM_SCALE_NODES"] == y and hook.env["SWARM_SCALE_COUNT"] == "1"


def test_a_victim_undrained_by_someone_else_is_dropped_and_one_past_the_grace_removed() -> None:
    spec = _spec(**{"drain-grace": 8})
    c, actor, victims = _idle_cluster(spec)
    c.run_until(lambda i: isinstance(i, Drain), 30.0)
    x, y = victims
    ctl = c.ctls[actor]
    c.nodes[x].shares, c.nodes[y].shares = 0, 0
    c.nodes[x].running = c.nodes[y].running = 1
    c.run_for(DT)
    c.nodes[x].shares = 1024  # an operator undrained it
    c.run_for(DT)
    assert x not in ctl.victims and any("undrained by someone else" in s for s in ctl.notes)
    # y keeps its task past the drain grace: removed all the same
    _, hook = c.run_until(_hook("in"), spec.drain_grace + 1.0)
    assert hook.env["SWARM_SCALE_NODES"] == y
    assert any("drain grace 8 s over with 1 tasks left" in s for s in ctl.notes)


def test_a_victim_that_leaves_is_dropped() -> None:
    c, actor, victims = _idle_cluster()
    c.run_until(lambda i: isinstance(i, Drain), 30.0)
    c.live.discard(victims[0])
    c.run_for(DT)
    assert sorted(c.ctls[actor].victims) == victims[1:]


# -------------------------------------------------------------- hook failures


def test_a_failing_scale_out_hook_is_retried_with_backoff_doubled_then_given_up() -> None:
    c = _busy_cluster()
    n, hook = c.run_until(_hook("out"), 10.0)
    ctl = c.ctls[n]
    attempts = [(c.t - DT, hook.attempt)]
    for _ in range(SPEC.hook_retries):
        assert c.hook_done(n, False, rc=1, error="exit status 1") == []
        failed_at = c.t
        st_ = ctl.status(c.t)["pending"]
        assert not st_["running"] and st_["retry_in"] == SPEC.retry_delay(st_["attempt"])
        _, hook = c.run_until(_hook("out"), 10.0)
        attempts.append((c.t - DT, hook.attempt))
        assert c.t - DT >= failed_at + SPEC.retry_delay(hook.attempt)
        assert c.t - DT < failed_at + SPEC.retry_delay(hook.attempt) + DT
        assert hook.env["SWARM_SCALE_ATTEMPT"] == str(hook.attempt)
    assert [a for _, a in attempts] == [0, 1, 2]
    assert SPEC.retry_delay(2) == 2 * SPEC.retry_delay(1)
    # the last attempt fails: given up, journaled, the booting nodes forgotten
    out = c.hook_done(n, False, rc=2, error="exit status 2")
    assert [type(i) for i in out] == [Journal, Announce]
    assert out[1].payload["last"] is None  # the action forgotten, said at once
    assert (
        out[0].note["action"] is None
        and "out hook given up: exit status 2" in out[0].note["reason"]
    )
    assert ctl.pending is None and ctl.launches == [] and ctl.state.last is None
    assert len(ctl.history) == 3 and not any(h.ok for h in ctl.history)
    # its cooldown does not hold the next decision
    _, hook = c.run_until(_hook("out"), 2.0)
    assert hook.attempt == 0


def test_a_failing_scale_in_hook_given_up_undrains_its_victims() -> None:
    c, actor, victims = _idle_cluster()
    _, _ = c.run_until(lambda i: isinstance(i, Drain), 30.0)
    for v in victims:
        c.nodes[v].shares, c.nodes[v].running = 0, 0
    c.run_until(_hook("in"), 2.0)
    ctl = c.ctls[actor]
    for _ in range(SPEC.hook_retries):
        c.hook_done(actor, False, error="boom")
        _, hook = c.run_until(_hook("in"), 10.0)
        assert hook.env["SWARM_SCALE_NODES"] == " ".join(victims)
    out = c.hook_done(actor, False, error="boom")
    undo = [i for i in out if isinstance(i, Drain)]
    assert sorted(d.node for d in undo) == victims and not any(d.on for d in undo)
    assert all("failed 3 times: kept" in d.reason for d in undo)
    assert [type(i) for i in out[len(undo) :]] == [Journal, Announce]
    assert "in hook given up" in out[len(undo)].note["reason"]
    assert out[-1].payload["victims"] == []
    assert ctl.victims == {} and ctl.removed == {} and ctl.pending is None


def test_hook_done_without_a_running_hook_is_ignored() -> None:
    ctl = PoolController("n1", SPEC)
    assert ctl.hook_done(1.0, ok=True) == []
    assert ctl.hook_done(1.0, ok=False) == []


# ------------------------------------------------------------ two controllers


def test_two_controllers_only_the_owner_acts_and_the_other_takes_over_when_it_dies() -> None:
    spec = _spec(**{"out-cooldown": 20})
    nodes = {n: Node(running=3) for n in _names(3)}
    nodes["n1"].queued = 1
    order = rendezvous_order(spec.key, nodes)
    a, b = order[0], order[1]
    c = Cluster(spec, nodes, [a, b])
    _, hook = c.run_until(_hook("out"), 10.0)
    acted_at = c.t - DT
    c.hook_done(a, True)
    c.run_for(2.0)
    assert {m for _, m, _ in _actions(c.log)} == {a}
    # b heard the lease and the action
    heard = c.ctls[b].state.heard
    assert heard is not None and heard.action == "out"
    # a dies (its booted nodes never come): b takes over within ttl + grace (+ a step)
    died = c.t
    c.live.discard(a)
    t_acting = None
    while c.t < died + 4 * TTL:
        c.tick()
        st_ = c.ctls[b].step
        if st_ is not None and st_.acting:
            t_acting = c.t - DT
            break
    assert t_acting is not None and t_acting <= died + TTL + TTL + 2 * DT
    step = c.ctls[b].step
    assert step is not None and step.epoch == 2
    # the demand is still there, but not before out_cooldown after a's action
    _, hook = c.run_until(_hook("out"), 60.0)
    assert c.t - DT >= acted_at + spec.scale.out_cooldown
    assert {m for t, m, _ in _actions(c.log) if t > died} == {b}
    assert hook.env["SWARM_SCALE_EPOCH"] == "2" and hook.env["SWARM_SCALE_ACTOR"] == b


def _two_with_victims(spec: PoolSpec) -> tuple[Cluster, str, str, list[str]]:
    names = _names(6)
    order = rendezvous_order(spec.key, names)
    a, b = order[0], order[1]
    nodes = {a: Node(), b: Node(running=1, task_seconds=1000.0)}
    # the cheapest (victims) are order[2], order[3]; the others are busy
    for i, n in enumerate(order[2:]):
        nodes[n] = Node(running=1 if i >= 2 else 0, task_seconds=100.0 * i)
    victims = sorted(order[2:4])
    return Cluster(spec, nodes, [a, b]), a, b, victims


@pytest.mark.parametrize("lives_on", [0.0, 5.0])
def test_the_new_actor_adopts_the_victims_the_old_one_announced(lives_on: float) -> None:
    """`lives_on` 0: the actor dies in the very tick it began the drains."""
    spec = _spec()
    c, a, b, victims = _two_with_victims(spec)
    m, _ = c.run_until(lambda i: isinstance(i, Drain), 30.0)
    assert m == a and sorted(c.ctls[a].victims) == victims
    c.run_for(lives_on)
    c.live.discard(a)
    died = c.t
    c.run_for(2 * TTL + 2 * DT)
    ctl = c.ctls[b]
    assert ctl.step is not None and ctl.step.acting
    assert sorted(ctl.victims) == victims
    # b finishes the drains: asks again (not shown yet), then removes them
    log = c.run_for(TTL + DT)
    assert sorted({i.node for t, _, i in log if isinstance(i, Drain) and i.on}) == victims
    for v in victims:
        c.nodes[v].shares = 0
    m, hook = c.run_until(_hook("in"), 2.0)
    assert m == b and hook.env["SWARM_SCALE_NODES"] == " ".join(victims)
    assert all(t < died or n == b for t, n, _ in _actions(c.log))


def test_an_action_is_announced_at_once() -> None:
    """The renewal comes a third of a ttl later: a holder that dies meanwhile must
    not leave its drains orphaned nor its cooldown unknown."""
    c = _busy_cluster()
    outs: dict[str, list[Any]] = {}
    while not any(isinstance(i, RunHook) for out in outs.values() for i in out):
        outs = c.tick()
    n = c.owner()
    ann = [i for i in outs[n] if isinstance(i, Announce)]
    assert len(ann) == 1 and ann[0].payload["last"] == {"a": "out", "c": 2, "ago": 0.0}
    for m, ctl in c.ctls.items():
        if m != n:
            assert ctl.state.heard is not None and ctl.state.heard.action == "out"


def test_an_actor_that_was_a_victim_of_its_predecessor_undrains_itself() -> None:
    spec = _spec()
    names = _names(5)
    order = rendezvous_order(spec.key, names)
    a, b = order[0], order[1]
    # b is the cheapest other node: a drains it, then a dies and b takes over
    nodes = {a: Node(), b: Node()}
    for i, n in enumerate(order[2:]):
        nodes[n] = Node(running=1, task_seconds=100.0 * (i + 1))
    c = Cluster(spec, nodes, [a, b])
    m, _ = c.run_until(lambda i: isinstance(i, Drain), 30.0)
    assert m == a and b in c.ctls[a].victims
    c.run_for(2.0)
    c.nodes[b].shares = 0
    c.live.discard(a)
    c.run_for(2 * TTL + 2 * DT)
    ctl = c.ctls[b]
    assert ctl.step is not None and ctl.step.acting
    undo = [i for _, n, i in c.log if n == b and isinstance(i, Drain)]
    assert [(i.node, i.on) for i in undo] == [(b, False)]
    assert b not in ctl.victims


# ------------------------------------------------------- booting and the floor


def test_the_new_actor_counts_the_nodes_its_predecessor_launched() -> None:
    """a launches 2 nodes and dies; they boot on. b must not launch them again when
    the out-cooldown is over (it would pass max-nodes), only after the boot timeout."""
    names = _names(3)
    order = rendezvous_order(KEY, names)
    a, b = order[0], order[1]
    nodes = {n: Node(running=4) for n in names}
    nodes[a].running = 2  # 10 tasks on 12 slots: 5 nodes wanted
    c = Cluster(SPEC, nodes, [a, b])
    m, hook = c.run_until(_hook("out"), 10.0)
    assert m == a and hook.env["SWARM_SCALE_COUNT"] == "2"
    c.hook_done(a, True)
    launched = c.t
    p = c.ctls[a].announcement(c.t)
    assert p is not None and p["booting"] == {"c": 2, "ago": 0.0}
    c.run_for(2.0)
    c.live.discard(a)  # 8 tasks on 2 nodes + 2 booting: at the target
    died = c.t
    log = c.run_for(SPEC.boot_timeout - (c.t - launched) - DT)
    ctl = c.ctls[b]
    assert ctl.step is not None and ctl.step.acting and ctl.step.epoch == 2
    assert ctl.view is not None and (ctl.view.nodes, ctl.view.booting) == (2, 2)
    assert not [x for x in _actions(log) if x[0] > died]
    # they never came: after the boot timeout b launches them again
    m, hook = c.run_until(_hook("out"), 2.0)
    assert m == b and hook.env["SWARM_SCALE_COUNT"] == "2"
    assert c.t - DT >= launched + SPEC.boot_timeout


def test_booting_counts_from_the_hooks_success_not_the_decision() -> None:
    c = _busy_cluster()
    n, _ = c.run_until(_hook("out"), 10.0)
    c.run_for(SPEC.boot_timeout + 5.0)  # a slow hook: longer than the boot timeout
    c.hook_done(n, True, duration=SPEC.boot_timeout + 5.0)
    log = c.run_for(SPEC.scale.out_cooldown + 5.0)
    assert not _actions(log)
    ctl = c.ctls[n]
    assert ctl.view is not None and ctl.view.booting == 2


def test_booting_is_counted_from_the_newest_launch() -> None:
    """Two launches; the first's nodes join, then it times out: the second's node is
    still booting (not taken for one of the first's)."""
    nodes = {n: Node(running=4, queued=1) for n in _names(3)}
    nodes["n1"].queued = 0  # 14 tasks on 12 slots: 7 nodes wanted, 6 at most
    c = Cluster(SPEC, nodes, nodes)
    n, hook = c.run_until(_hook("out"), 10.0)
    assert hook.env["SWARM_SCALE_COUNT"] == "2"
    c.hook_done(n, True)
    first = c.t
    m, hook = c.run_until(_hook("out"), SPEC.scale.out_cooldown + 1.0)
    assert m == n and hook.env["SWARM_SCALE_COUNT"] == "1"  # up to max-nodes 6
    c.hook_done(n, True)
    second = c.t
    c.run_for(1.0)
    # the first launch's nodes join (named so that n stays the owner: the hand-over is
    # tested above)
    joiners = [j for j in _names(20, "j") if rendezvous_order(KEY, [n, j])[0] == n][:2]
    for j in joiners:
        c.nodes[j] = Node()
        c.live.add(j)
    assert c.owner() == n
    c.run_for(DT)
    ctl = c.ctls[n]
    assert ctl.view is not None and (ctl.view.nodes, ctl.view.booting) == (5, 1)
    log = c.run_for(second + SPEC.boot_timeout - c.t - DT)
    assert c.t > first + SPEC.boot_timeout  # the first launch timed out meanwhile
    assert not _actions(log)
    assert ctl.view.booting == 1 and ctl.status(c.t)["booting"] == 1


def test_a_death_while_draining_keeps_victims_for_min_nodes() -> None:
    spec = _spec(**{"min-nodes": 2})
    names = _names(4)
    order = rendezvous_order(spec.key, names)
    actor = order[0]
    nodes = {n: Node() for n in names}
    nodes[order[3]].running, nodes[order[3]].task_seconds = 1, 100.0  # kept: costliest
    c = Cluster(spec, nodes, [actor])
    c.run_until(lambda i: isinstance(i, Drain), 30.0)
    ctl = c.ctls[actor]
    victims = sorted(ctl.victims)
    assert victims == sorted(order[1:3])
    # the busy node dies: removing both victims would leave only the actor
    c.live.discard(order[3])
    out = c.tick()[actor]
    undo = [i for i in out if isinstance(i, Drain)]
    assert len(undo) == 1 and not undo[0].on and undo[0].node in victims
    assert "below min_nodes 2" in undo[0].reason
    kept = undo[0].node
    (other,) = set(victims) - {kept}
    assert set(ctl.victims) == {other}
    # the other is drained and idle: removed alone, the pool keeps 2 nodes
    c.nodes[other].shares = 0
    _, hook = c.run_until(_hook("in"), 2.0)
    assert hook.env["SWARM_SCALE_NODES"] == other


def test_no_scale_in_below_min_nodes_counting_booting_nodes() -> None:
    """The nodes b heard were booting count for decide, not for the floor: b does
    not drain the nodes present down to less than min_nodes while waiting for them."""
    spec = _spec(**{"min-nodes": 2, "scale-in-window": 4, "in-cooldown": 2})
    names = _names(3)
    order = rendezvous_order(spec.key, names)
    a, b = order[0], order[1]
    nodes = {n: Node() for n in names}
    nodes[a].running, nodes[a].queued = 4, 8
    c = Cluster(spec, nodes, [a, b])
    c.run_until(_hook("out"), 10.0)
    c.hook_done(a, True)
    c.run_for(1.0)
    c.live.discard(a)  # the demand dies with it; 2 idle nodes and 2 booting remain
    log = c.run_for(20.0)
    ctl = c.ctls[b]
    assert ctl.step is not None and ctl.step.acting
    assert ctl.view is not None and (ctl.view.nodes, ctl.view.booting) == (2, 2)
    assert not _actions(log)
    # decide itself holds a scale-in while nodes boot (policy/autoscale.py)
    assert ctl.decision is not None and "2 nodes still booting" in ctl.decision.reason


def test_a_joiner_that_never_heard_the_dead_actor_keeps_its_cooldown() -> None:
    """The survivors relay what they heard in their push-pull state (no lease): a
    node that joins after the actor died learns the spent epoch and the cooldown."""
    spec = _spec(**{"out-cooldown": 30})
    names = _names(3)
    a = rendezvous_order(spec.key, names)[0]
    nodes = {n: Node(running=4) for n in names}
    c = Cluster(spec, nodes, names)
    _, hook = c.run_until(_hook("out"), 10.0)
    acted_at = c.t - DT
    c.hook_done(a, True)
    c.live.discard(a)
    # one of the nodes it launched joins, hashes highest, and hears the others' states
    j = next(x for x in _names(50, "j") if rendezvous_order(spec.key, [*names, x])[0] == x)
    c.nodes[j] = Node()
    c.live.add(j)
    c.ctls[j] = PoolController(j, spec)
    c.push_pull(j)
    m, hook = c.run_until(_hook("out"), 60.0)
    assert m == j
    assert int(hook.env["SWARM_SCALE_EPOCH"]) > 1  # epochs grow along the holders
    assert c.t - DT >= acted_at + spec.scale.out_cooldown


# -------------------------------------------------------------------- restore


def test_restore_keeps_the_cooldown_and_the_victims() -> None:
    c, actor, victims = _idle_cluster()
    c.run_until(lambda i: isinstance(i, Drain), 30.0)
    journal = [i for t, n, i in c.log if isinstance(i, Journal)][-1]
    wall_then = 1_000_000.0
    record = journal_value(journal, wall_then)
    assert record["last"] == {"a": "in", "c": 2, "wall": wall_then}
    assert record["victims"] == victims and record["epoch"] == 1

    # the agent restarts 2 s later (wall clock), its monotonic clock from 0
    spec = c.spec
    fresh = Cluster(spec, c.nodes, [actor])
    ctl = fresh.ctls[actor]
    ctl.restore(record, 0.0, wall_then + 2.0)
    assert ctl.state.latest is not None and ctl.state.latest.at == -2.0
    assert ctl.state.latest.action == "in"
    assert ctl.bad_announcements == 0
    fresh.run_for(TTL + 2 * DT)
    assert (
        ctl.step is not None and ctl.step.acting and ctl.step.epoch == 2
    )  # past the journaled one
    assert sorted(ctl.victims) == victims
    # their reports show the drain: removed; no new drains before in_cooldown (from -2)
    for v in victims:
        fresh.nodes[v].shares, fresh.nodes[v].running = 0, 0
    _, hook = fresh.run_until(_hook("in"), 2.0)
    assert hook.env["SWARM_SCALE_NODES"] == " ".join(victims)


def test_restore_keeps_the_out_cooldown() -> None:
    spec = _spec(**{"out-cooldown": 30})
    c = _busy_cluster()
    c = Cluster(spec, c.nodes, c.nodes)
    n, _ = c.run_until(_hook("out"), 10.0)
    journal = [i for _, _, i in c.log if isinstance(i, Journal)][-1]
    record = journal_value(journal, 500.0)
    fresh = Cluster(spec, c.nodes, [n])
    fresh.ctls[n].restore(record, 0.0, 510.0)  # 10 s later
    fresh.run_until(_hook("out"), 40.0)
    assert fresh.t - DT >= 20.0  # 30 s of cooldown, 10 already gone


def test_a_restarted_actor_counts_the_nodes_it_launched() -> None:
    c = _busy_cluster()
    n, _ = c.run_until(_hook("out"), 10.0)
    c.hook_done(n, True)
    journal = [i for _, m, i in c.log if m == n and isinstance(i, Journal)][-1]
    record = journal_value(journal, 5000.0)
    assert record["booting"] == {"c": 2, "wall": 5000.0, "base": ["n1", "n2", "n3"]}
    # restarted 5 s later (past the out-cooldown); one of the 2 has joined meanwhile
    c.nodes["n9"] = Node()
    c.live.add("n9")
    fresh = Cluster(SPEC, c.nodes, [n])
    fresh.live = set(c.live)
    ctl = fresh.ctls[n]
    ctl.restore(record, 0.0, 5005.0)
    log = fresh.run_for(SPEC.boot_timeout - 5.0 - DT)
    assert ctl.step is not None and ctl.step.acting
    assert ctl.view is not None and (ctl.view.nodes, ctl.view.booting) == (4, 1)
    assert not _actions(log)


@pytest.mark.parametrize(
    "record",
    [
        None,
        [],
        {"last": {"a": "out", "c": 1}},
        {"last": {"a": "out", "c": 1, "wall": "x"}},
        {"victims": "n1"},
        {"epoch": -1},
        {"epoch": True},
        {"bogus": 1},
        {"last": 3},
        {"booting": {"c": 1, "wall": 5.0, "base": "n1"}},
        {"booting": {"c": 1, "ago": 5.0}},  # an announcement's form
        {"booting": {"c": -1, "wall": 5.0}},
    ],
)
def test_restore_of_a_bad_record_is_counted_and_changes_nothing(record: Any) -> None:
    ctl = PoolController("n1", SPEC)
    ctl.restore(record, 0.0, 100.0)
    assert ctl.bad_announcements == 1
    assert ctl.state.latest is None and ctl.heard_victims == set() and ctl.seat.max_epoch == 0


def test_restore_ignores_an_unknown_action_and_a_clock_that_went_back() -> None:
    ctl = PoolController("n1", SPEC)
    ctl.restore({"last": {"a": "up", "c": 1, "wall": 5.0}, "victims": ["n2"], "epoch": 7}, 0.0, 9.0)
    assert ctl.state.latest is None and ctl.heard_victims == {"n2"} and ctl.seat.max_epoch == 7
    ctl.restore({"last": {"a": "out", "c": 1, "wall": 50.0}}, 100.0, 9.0)  # wall went back
    assert ctl.state.latest is not None and ctl.state.latest.at == 100.0


# ------------------------------------------------------------- announcements


def _good_payload(holder: str = "n9", epoch: int = 3) -> dict[str, Any]:
    return {
        "lease": {"key": KEY, "holder": holder, "epoch": epoch, "ttl": TTL},
        "last": {"a": "out", "c": 2, "ago": 1.5},
        "victims": ["n7", "n8"],
    }


def test_a_good_announcement_is_heard() -> None:
    ctl = PoolController("n1", SPEC)
    assert ctl.on_announce(_good_payload(), 10.0)
    assert ctl.seat.max_epoch == 3 and ctl.seat.seen["n9"].lease.epoch == 3
    assert ctl.state.heard is not None and ctl.state.heard.at == 8.5
    assert ctl.heard_victims == {"n7", "n8"} and ctl.bad_announcements == 0
    # an older epoch of the same holder does not replace the victims
    older = {**_good_payload(epoch=2), "victims": ["n1"]}
    assert ctl.on_announce(older, 11.0)
    assert ctl.heard_victims == {"n7", "n8"}
    # another pool's announcement is none of ours
    other = _good_payload()
    other["lease"] = {**other["lease"], "key": "scale.web", "epoch": 40}
    assert ctl.on_announce(other, 12.0)
    assert ctl.seat.max_epoch == 3
    # our own previous life: its epoch only
    mine = {**_good_payload(holder="n1", epoch=9), "victims": ["n5"]}
    assert ctl.on_announce(mine, 13.0)
    assert ctl.seat.max_epoch == 9 and ctl.heard_victims == {"n7", "n8"}
    assert ctl.bad_announcements == 0


def test_the_push_pull_announcement_is_the_current_claim() -> None:
    c = _busy_cluster()
    me = c.owner()
    assert c.ctls[me].announcement(0.0) is None
    c.run_for(TTL + DT)
    p = c.ctls[me].announcement(c.t)
    assert p is not None and p["lease"]["holder"] == me and p["lease"]["epoch"] == 1
    other = PoolController("zz", SPEC)
    assert other.on_announce(p, c.t) and other.seat.max_epoch == 1


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.binary(max_size=4),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)


def _mutations() -> st.SearchStrategy[Any]:
    """A good payload with one part replaced by junk."""
    paths = [
        (),
        ("lease",),
        ("lease", "key"),
        ("lease", "holder"),
        ("lease", "epoch"),
        ("lease", "ttl"),
        ("last",),
        ("last", "a"),
        ("last", "c"),
        ("last", "ago"),
        ("victims",),
        ("extra",),
    ]

    def put(path: tuple[str, ...], junk: Any) -> Any:
        p = _good_payload()
        if not path:
            return junk
        obj: Any = p
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = junk
        return p

    return st.builds(put, st.sampled_from(paths), _json)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_json, _mutations()))
def test_malformed_announcements_never_raise_and_are_counted(payload: Any) -> None:
    ctl = PoolController("n1", SPEC)
    ok = ctl.on_announce(payload, 100.0)
    assert ctl.bad_announcements == (0 if ok else 1)
    # a controller that heard it still ticks
    members = [Member("n1", _report("n1", Node()))]
    ctl.tick(101.0, members, ["n1"])
    ctl.restore(payload, 100.0, 1000.0)
    ctl.status(101.0)


def test_too_many_victims_is_malformed() -> None:
    ctl = PoolController("n1", SPEC)
    p = _good_payload()
    p["victims"] = [f"v{i}" for i in range(MAX_VICTIMS + 1)]
    assert not ctl.on_announce(p, 1.0) and ctl.bad_announcements == 1
    p["victims"] = ["ok", ""]
    assert not ctl.on_announce(p, 1.0) and ctl.bad_announcements == 2
    p["victims"] = []
    p["last"] = {"a": "sideways", "c": 1, "ago": 0}
    assert not ctl.on_announce(p, 1.0) and ctl.bad_announcements == 3


# ------------------------------------------------------- a randomized cluster


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("load"), st.integers(0, 20), st.integers(0, 6), st.integers(0, 12)),
        st.tuples(st.just("idle"), st.integers(1, 30)),
        st.tuples(st.just("hook"), st.booleans(), st.integers(0, 3)),
        st.tuples(st.just("kill"), st.integers(0, 20)),
        st.tuples(st.just("finish"), st.integers(0, 20)),
        st.tuples(st.just("restart"), st.integers(0, 20)),
    ),
    min_size=5,
    max_size=40,
)


class World(Cluster):
    """A cluster whose hooks do what they say: a scale-out's nodes join `boot` s after
    the hook succeeds (they run controllers too), a scale-in's nodes go away."""

    def __init__(self, spec: PoolSpec, n: int, boot: float = 2.0) -> None:
        nodes = {x: Node() for x in _names(n, "w")}
        super().__init__(spec, nodes, nodes)
        self.boot = boot  # s from a scale-out hook's success to its nodes joining
        self.serial = n
        self.hooks: dict[str, RunHook] = {}  # running, by controller
        self.joining: list[tuple[float, int]] = []  # (when, how many)
        self.actions: list[tuple[float, str, Any]] = []
        # an actor that never heard the newest lease (it claims an epoch another holder
        # already announced): see test_a_joiner_that_never_heard_the_dead_actor; once
        # one acted, the pool's size is no longer ours to bound
        self.deaf: list[tuple[float, str]] = []

    def heard_everything(self, who: str) -> bool:
        step = self.ctls[who].step
        e = step.epoch if step is not None else 0
        return all(x < e for n, x in self.epochs.items() if n != who)

    def booting(self) -> int:
        """Nodes launched and not joined yet, and those a live node's scale-out (running
        or waiting for a retry) will launch (a dead node's hook launches nothing)."""
        pending = [self.ctls[n].pending for n in self.live if n in self.ctls]
        return sum(k for _, k in self.joining) + sum(
            p.count for p in pending if p is not None and p.action == "out"
        )

    def pool_count(self) -> int:
        return sum(1 for n in self.live if self.nodes[n].pool == "gpu") + self.booting()

    def check(self, when: float, who: str, out: list[Any], *, ticked: bool = True) -> None:
        spec = self.spec
        acts = [i for i in out if isinstance(i, RunHook | Drain)]
        if acts and ticked and not self.heard_everything(who):
            self.deaf.append((when, who))
        for i in out:
            if isinstance(i, Drain):
                assert not (i.on and i.node == who), f"{who} drained itself"
                self.actions.append((when, who, i))
                if i.node in self.live:
                    self.nodes[i.node].shares = 0 if i.on else 1024
            elif isinstance(i, RunHook):
                self.actions.append((when, who, i))
                count = int(i.env["SWARM_SCALE_COUNT"])
                assert 1 <= count <= spec.scale.max_step
                assert who not in self.hooks, "two hooks at once"
                if i.action == "out" and not self.deaf:
                    # the count includes this scale-out (pending on its controller)
                    assert self.pool_count() <= spec.scale.max_nodes, (
                        f"{who} scales out by {count} to {self.pool_count()} nodes at t={when}"
                    )
                if i.action == "in":
                    gone = i.env["SWARM_SCALE_NODES"].split()
                    assert who not in gone and len(gone) == count
                    left = len(self.live - set(gone))
                    assert left >= spec.scale.min_nodes, (
                        f"{who} scales in {gone} to {left} nodes at t={when}"
                    )
                self.hooks[who] = i
        drained = sorted(n for n in self.live if self.nodes[n].shares == 0)
        if not self.deaf:
            assert len(drained) <= spec.scale.max_step, f"{drained} drained at t={when}"

    def tick(self) -> dict[str, list[Any]]:
        for when, k in [j for j in self.joining if j[0] <= self.t]:
            self.joining.remove((when, k))
            for _ in range(k):
                self.serial += 1
                n = f"w{self.serial}"
                self.nodes[n] = Node()
                self.live.add(n)
                self.ctls[n] = PoolController(n, self.spec)
                self.push_pull(n)
        if self.t % 5.0 == 0:
            for n in sorted(self.live):
                self.push_pull(n)
        t = self.t
        outs = super().tick()
        for who, out in outs.items():
            self.check(t, who, out)
        # everybody hears everybody: at most one acts in a tick
        acting = {
            who for who, out in outs.items() if any(isinstance(i, RunHook | Drain) for i in out)
        }
        assert len(acting) <= 1, f"{acting} act at once at t={t}"
        return outs

    def finish_hook(self, ok: bool, which: int) -> None:
        if not self.hooks:
            return
        who = sorted(self.hooks)[which % len(self.hooks)]
        h = self.hooks.pop(who)
        if who not in self.live:
            return
        out = self.hook_done(who, ok)
        if ok and h.action == "out":
            self.joining.append((self.t + self.boot, int(h.env["SWARM_SCALE_COUNT"])))
        if ok and h.action == "in":
            for n in h.env["SWARM_SCALE_NODES"].split():
                self.live.discard(n)
        self.check(self.t, who, out, ticked=False)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 5), st.sampled_from([2.0, 8.0]), OPS)
def test_random_cluster_keeps_the_invariants(
    start: int, boot: float, ops: list[tuple[Any, ...]]
) -> None:
    spec = _spec(
        **{
            "max-nodes": 6,
            "min-nodes": 2,
            "scale-in-window": 4,
            "out-cooldown": 4,
            "in-cooldown": 3,
        }
    )
    w = World(spec, start, boot)
    w.run_for(TTL + DT)
    for op in ops:
        live = sorted(w.live)
        if op[0] == "load":
            n = live[op[1] % len(live)]
            w.nodes[n].running, w.nodes[n].queued = op[2], op[3]
            w.nodes[n].task_seconds = 10.0 * op[2]
        elif op[0] == "idle":
            w.run_for(op[1] * DT)
        elif op[0] == "hook":
            w.finish_hook(op[1], op[2])
        elif op[0] == "kill" and len(live) > 1:
            w.live.discard(live[op[1] % len(live)])
        elif op[0] == "restart":
            # the agent restarts: a fresh controller restored from its journal record
            n = live[op[1] % len(live)]
            w.hooks.pop(n, None)  # its hook is killed with it
            w.ctls[n] = PoolController(n, spec)
            records = [i for _, m, i in w.log if m == n and isinstance(i, Journal)]
            if records:
                w.ctls[n].restore(journal_value(records[-1], 1000.0), w.t, 1000.0)
            w.push_pull(n)
        elif op[0] == "finish":
            n = live[op[1] % len(live)]
            if w.nodes[n].shares == 0:
                w.nodes[n].running = w.nodes[n].queued = 0
        w.run_for(DT)


# ------------------------------------------------ victims: homes, lost drains, staleness


def test_a_drained_victim_that_is_still_a_home_waits_for_its_tasks() -> None:
    """A victim that homes unfinished tasks (running elsewhere) is not removed: its
    removal would strand their results (issue 19); the hook runs once it homes none."""
    c, actor, victims = _idle_cluster()
    c.run_until(lambda i: isinstance(i, Drain), 30.0)
    drains = [i for t, n, i in c.log if t == c.t - DT and isinstance(i, Drain)]
    _apply_drains(c, drains)
    c.nodes[victims[0]].homing = 3
    log = c.run_for(4 * TTL)
    hooks = [i for _, _, i in log if isinstance(i, RunHook)]
    assert all(victims[0] not in h.env["SWARM_SCALE_NODES"].split() for h in hooks)
    assert victims[0] in c.ctls[actor].victims
    if hooks:  # the other victim, alone: done
        assert hooks[0].env["SWARM_SCALE_NODES"] == victims[1]
        c.hook_done(actor, True)
    c.nodes[victims[0]].homing = 0
    m, _ = c.run_until(
        lambda i: isinstance(i, RunHook) and victims[0] in i.env["SWARM_SCALE_NODES"].split(),
        2.0 + 4 * TTL,
    )
    assert m == actor


def test_a_victim_whose_drain_never_shows_is_kept_after_the_grace() -> None:
    """Asked again every ttl, but the grace counts from the first request: one that
    never shows the drain (its agent refuses it, say) is kept, never removed."""
    spec = _spec(**{"drain-grace": 8})
    c, actor, victims = _idle_cluster(spec)
    c.run_until(lambda i: isinstance(i, Drain), 30.0)
    start = c.t - DT
    log = c.run_for(spec.drain_grace + 2 * DT)
    ctl = c.ctls[actor]
    assert not (set(victims) & set(ctl.victims))
    undrained = [i for t, _, i in log if isinstance(i, Drain) and not i.on]
    assert sorted(d.node for d in undrained) == victims
    # and they are not chosen again at once (spared for a grace)
    assert not [i for t, _, i in log if isinstance(i, Drain) and i.on and t > start + 3 * TTL]
    assert set(ctl.spared) == set(victims)
    assert all("not seen within" in d.reason for d in undrained)
    assert not [i for _, _, i in log if isinstance(i, RunHook) and i.action == "in"]
    asked = [t for t, _, i in log if isinstance(i, Drain) and i.on and i.node in victims]
    assert max(asked) < start + spec.drain_grace


def test_an_older_state_of_the_same_epoch_does_not_bring_victims_back() -> None:
    """Announcements are ordered by (epoch, seq): a push-pull from before a partition
    healed, delivered late, must not bring back victims removed since (found by the
    chaos suite's elastic scenario)."""
    ctl = PoolController("n1", SPEC)
    lease = {"key": KEY, "holder": "n9", "epoch": 4, "ttl": TTL}
    new = {"lease": lease, "epoch": 4, "seq": 9, "victims": [], "removed": ["n7"]}
    old = {"lease": lease, "epoch": 4, "seq": 3, "victims": ["n7", "n8"]}
    assert ctl.on_announce(new, 1.0) and ctl.on_announce(old, 2.0)
    assert ctl.heard_victims == set() and ctl.heard_at == (4, 9)
    assert "n7" in ctl.removed  # a removal is a fact, whatever its order


def test_a_relay_spends_the_epoch_and_renews_no_lease() -> None:
    ctl = PoolController("n1", SPEC)
    relay = {"epoch": 7, "seq": 2, "last": {"a": "out", "c": 1, "ago": 2.0}, "victims": ["n4"]}
    assert ctl.on_announce(relay, 10.0)
    assert ctl.seat.max_epoch == 7 and ctl.seat.seen == {}
    assert ctl.state.heard is not None and ctl.state.heard.at == 8.0
    assert ctl.heard_victims == {"n4"}
    # a relay without its epoch is malformed
    assert not ctl.on_announce({"seq": 1}, 11.0) and ctl.bad_announcements == 1
    # and it carries it on, relayed (no lease), for nodes that join later
    said = ctl.announcement(12.0)
    assert said is not None and "lease" not in said and said["epoch"] == 7
