"""The simulator's engine against closed forms, and its invariants.

Sizes are chosen so each test runs in a couple of seconds; every run is seeded, so a
passing tolerance stays passing.
"""

from __future__ import annotations

import random

import attrs
import pytest

from swarm.model import LoadReport, TaskSpec
from swarm.node import decide
from swarm.node.state import NodeState, Settings
from swarm.policy import migration as mig
from swarm.policy.shares import ShareLedger
from swarm.policy.transfer import TransferConfig
from swarm.policy.view import PeerEntry
from swarm.sim.engine import (
    FRONTEND,
    NODE,
    Board,
    ClusterSim,
    Fresh,
    GossipAge,
    Jsq,
    LeastLoaded,
    MigrationSpec,
    PlaceRandom,
    PowerOfD,
    SimConfig,
    SimError,
    SimTask,
    quantile,
    simulate,
)
from swarm.sim.workloads import (
    BoundedPareto,
    Exponential,
    Job,
    hetero_nodes,
    poisson,
    uniform_nodes,
)


def _jobs(rate: float, count: int, seed: int = 3, service: object = None) -> list[Job]:
    dist = service if service is not None else Exponential(1.0)
    return list(poisson(rate, dist, random.Random(seed), count=count))  # type: ignore[arg-type]


@pytest.mark.parametrize("slots", [1, 1000])  # FIFO single server; processor sharing
def test_random_placement_is_mm1(slots: int) -> None:
    """Uniform random placement splits Poisson arrivals into independent M/M/1 queues
    (FIFO or processor sharing): mean time in system 1 / (1 - rho)."""
    n, rho = 80, 0.5
    cfg = SimConfig(
        nodes=uniform_nodes(n, slots=slots),
        placement=PowerOfD(1),
        staleness=Fresh(),
        seed=2,
        warmup=20.0,
    )
    r = simulate(cfg, _jobs(rho * n, 12_000))
    assert r.measured > 10_000
    assert r.mean == pytest.approx(1.0 / (1.0 - rho), rel=0.05)


def test_two_choices_approach_supermarket_fixed_point() -> None:
    """d = 2 with fresh information: the fraction of queues with >= i tasks tends to
    lambda^(2^i - 1) (Mitzenmacher's supermarket model) as n grows."""
    n, lam, until = 200, 0.7, 110.0
    cfg = SimConfig(nodes=uniform_nodes(n), placement=PowerOfD(2), seed=3, warmup=20.0, levels=True)
    jobs = poisson(lam * n, Exponential(1.0), random.Random(3), until=until)
    r = ClusterSim(cfg, jobs).run(until=until)
    assert r.levels[0] == pytest.approx(1.0)
    for i in range(1, 5):
        assert r.levels[i] == pytest.approx(lam ** (2**i - 1), abs=0.015), i


def test_every_task_finishes_exactly_once_with_transfer_and_migration() -> None:
    tc = TransferConfig(
        round_interval=0.3,
        probe_timeout=0.05,
        task_cooldown=0.2,
        switch_cooldown=0.1,
        accept_hold=0.02,
    )
    mc = mig.MigrationConfig(cooldown=0.5, rate=2.0, burst=4.0, max_report_age=5.0)
    nodes = hetero_nodes(16, random.Random(1), slots_per_core=2)
    cfg = SimConfig(
        nodes=nodes,
        placement=PowerOfD(2),
        origin=NODE,
        staleness=GossipAge(0.5, 0.02),
        net_delay=0.01,
        transfer=tc,
        transfer_cost=0.02,
        probe_cpu=0.001,
        migration=MigrationSpec(mc, interval=0.3, pause=0.02),
        seed=4,
    )
    total_cores = sum(s.cores for s in nodes)
    jobs = list(
        poisson(
            0.9 * total_cores,
            BoundedPareto(1.1, 1000.0),
            random.Random(4),
            count=3000,
            reserve=((256, 0.2),),
        )
    )
    sim = ClusterSim(cfg, jobs)
    r = sim.run()
    assert r.arrivals == r.completions == len(jobs) == len(sim.finished)
    assert set(sim.finished) == {1}
    assert r.transfers > 0 and r.migrations > 0  # the paths under test were exercised
    # Books are empty at the end: nothing left behind in a ledger or a queue.
    for n in sim.nodes:
        assert len(n.ledger) == 0 and not n.queue and not n.running
        assert n.ledger.reserved == 0 and n.mig_here == 0


def test_same_seed_same_run_other_seed_other_run() -> None:
    def once(seed: int) -> tuple[float, int, int]:
        cfg = SimConfig(
            nodes=uniform_nodes(30, slots=2),
            placement=PowerOfD(2),
            origin=NODE,
            staleness=GossipAge(1.0, 0.05),
            net_delay=0.005,
            transfer=TransferConfig(round_interval=0.5, probe_timeout=0.05, task_cooldown=0.5),
            seed=seed,
        )
        r = simulate(cfg, _jobs(0.85 * 30, 800, seed=seed, service=BoundedPareto()))
        return r.mean, r.events, r.transfers

    assert once(5) == once(5)
    assert once(5) != once(6)


def test_fresh_information_orders_the_policies() -> None:
    """JSQ <= least-loaded-of-a-fresh-board < d=2 < random at a high load."""
    n, rho = 100, 0.9
    jobs = _jobs(rho * n, 4000, seed=7)
    means = {}
    for name, strat in (
        ("random", PowerOfD(1)),
        ("d2", PowerOfD(2)),
        ("ll", LeastLoaded()),
        ("jsq", Jsq()),
    ):
        cfg = SimConfig(nodes=uniform_nodes(n), placement=strat, seed=7, warmup=10.0)
        means[name] = simulate(cfg, jobs).mean
    assert means["jsq"] < means["d2"] < means["random"]
    assert means["ll"] < means["d2"]


def test_stale_board_makes_least_loaded_herd() -> None:
    n, rho = 80, 0.9
    jobs = _jobs(rho * n, 4000, seed=8)

    def mean(strat: object, period: float) -> float:
        cfg = SimConfig(
            nodes=uniform_nodes(n),
            placement=strat,  # type: ignore[arg-type]
            staleness=Board(period),
            origin=FRONTEND,
            seed=8,
            warmup=10.0,
        )
        return simulate(cfg, jobs).mean

    assert mean(LeastLoaded(), 5.0) > mean(PowerOfD(1), 5.0) > mean(PowerOfD(2), 5.0)


def test_probe_overhead_holds_the_cpu() -> None:
    sim = ClusterSim(SimConfig(nodes=uniform_nodes(1), probe_cpu=0.5), [Job(0.0, 1.0)])
    sim._charge(sim.nodes[0])  # a probe answered at t = 0 holds the CPU for 0.5
    r = sim.run()
    assert r.mean == pytest.approx(1.5)


def test_processor_sharing_two_tasks() -> None:
    """Two tasks of work 1 and 2 sharing one core: the first ends at 2, the second at 3."""
    cfg = SimConfig(nodes=uniform_nodes(1, slots=2))
    r = simulate(cfg, [Job(0.0, 1.0), Job(0.0, 2.0)])
    assert r.mean == pytest.approx(2.5)
    assert r.p99 == pytest.approx(3.0)


def test_reservations_wait_for_shares_and_are_counted() -> None:
    """Two 768-share reservations on one 1024-share node with two slots: while the
    first holds its shares the node is not eligible for the second (placement filter
    on the fresh view), so the origin backs off, retries, and it runs after the first."""
    cfg = SimConfig(nodes=uniform_nodes(1, slots=2))
    jobs = [Job(0.0, 1.0, reserve=768), Job(0.0, 1.0, reserve=768)]
    r = simulate(cfg, jobs)
    assert r.reserved_tasks == 2 and r.reserved_waited == 1 and r.placements >= 3
    assert r.p50 == pytest.approx(1.0)  # the first ran at once
    assert r.p99 >= 2.0  # the second started only once the first had finished


def test_queued_reservation_is_passed_over_until_shares_free() -> None:
    """Admitted while nothing runs, a reserved task still waits at start when another
    reservation started first; the ordinary task behind it runs meanwhile."""
    cfg = SimConfig(nodes=uniform_nodes(1, slots=3))
    sim = ClusterSim(cfg, [])
    node = sim.nodes[0]
    tasks = [
        SimTask(i, TaskSpec(id=f"t{i}", argv=(), reserve_shares=r), 0.0, 1.0)
        for i, r in enumerate((768, 768, 0))
    ]
    for t in tasks:
        sim.finished.append(0)
        sim._outstanding += 1
        node.ledger.add(t.spec)
        node.queue.append(t)
    sim._try_start(node)
    assert [t.spec.id for t in node.running] == ["t0", "t2"]
    assert sim.reserved_waited == 1
    r = sim.run()
    # t0 and t2 share the core (each at half speed) until 2; then t1 runs alone.
    assert r.completions == 3
    assert (r.p50, r.p99) == (pytest.approx(2.0), pytest.approx(3.0))


def test_no_eligible_node_backs_off_and_retries() -> None:
    """A reservation larger than any node fits nowhere: the engine keeps retrying with
    backoff (it never loses the task); the run stops at `until` with it unfinished."""
    cfg = SimConfig(nodes=uniform_nodes(3))
    sim = ClusterSim(cfg, [Job(0.0, 1.0, reserve=4096)])
    r = sim.run(until=30.0)
    assert r.completions == 0 and r.placements > 2
    with pytest.raises(SimError):
        ClusterSim(cfg, [Job(0.0, 1.0, reserve=4096)]).run(until=float("inf"))


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        SimConfig(nodes=())
    with pytest.raises(ValueError):
        SimConfig(nodes=uniform_nodes(1), origin="moon")
    with pytest.raises(ValueError):
        SimConfig(nodes=uniform_nodes(1), net_delay=-1.0)
    with pytest.raises(ValueError):
        ClusterSim(SimConfig(nodes=uniform_nodes(1), staleness=GossipAge(0.0)), [])


def test_quantile() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert quantile(xs, 0.99) == 99.0
    assert quantile(xs, 0.5) == 50.0
    assert quantile([], 0.5) != quantile([], 0.5)  # nan


def test_gossip_age_staleness_ages_reports() -> None:
    """With GossipAge(period, delay) the view's entries are at most period + delay old
    (plus the quantisation of phases)."""
    st = GossipAge(period=1.0, delay=0.2)
    cfg = SimConfig(nodes=uniform_nodes(40), staleness=st, seed=1)
    sim = ClusterSim(cfg, _jobs(30, 2000, seed=9))
    sim.run(until=20.0)
    ages = [sim.now - sim.view[k].received_at for k in sim.view]
    assert max(ages) <= st.period + st.delay + st.period / st.buckets + 1e-9
    assert attrs.evolve(st, delay=0.0).delay == 0.0


@pytest.mark.parametrize("origin", [FRONTEND, NODE])
def test_agent_random_rule_is_mm1_from_any_origin(origin: str) -> None:
    """The agent's `random` rule (PlaceRandom) draws a uniformly random eligible node,
    the origin included: M/M/1 queues wherever tasks arrive. PowerOfD(1) is uniform
    random only from a front end; from a node it takes the better of the origin and
    one random peer, which is far better than random."""
    n, rho = 80, 0.5

    def mean(strategy: PlaceRandom | PowerOfD) -> float:
        cfg = SimConfig(
            nodes=uniform_nodes(n, slots=1),
            placement=strategy,
            staleness=Fresh(),
            origin=origin,
            seed=2,
            warmup=20.0,
        )
        return simulate(cfg, _jobs(rho * n, 12_000)).mean

    assert mean(PlaceRandom()) == pytest.approx(1.0 / (1.0 - rho), rel=0.05)
    if origin == NODE:
        assert mean(PowerOfD(1)) < 0.7 / (1.0 - rho)


def test_start_gate_is_the_agents_a_drained_node_starts_nothing() -> None:
    """Queued tasks pass the agent's start gate (node.gate.can_start): on a node drained
    after they were admitted, nothing starts; undrained, they start."""
    sim = ClusterSim(SimConfig(nodes=uniform_nodes(1, slots=2)), [])
    node = sim.nodes[0]
    tasks = [SimTask(i, TaskSpec(id=f"t{i}", argv=(), reserve_shares=1), 0.0, 1.0) for i in (0, 1)]
    for t in tasks:
        sim.finished.append(0)
        sim._outstanding += 1
        node.ledger.add(t.spec)
        node.queue.append(t)
    node.ledger.set_shares(0)
    sim._try_start(node)
    assert not node.running and sim.reserved_waited == 2
    node.ledger.set_shares(1024)
    sim._try_start(node)
    assert [t.spec.id for t in node.running] == ["t0", "t1"]
    assert node.ledger.reserved == 2  # the gate took the shares


@pytest.mark.parametrize("rule", [decide.TWO_CHOICE, decide.RANDOM])
def test_decide_is_node_states_own_choice_and_admission(rule: str) -> None:
    """The function forms the simulator calls decide as a NodeState does: the same
    target for the same view and seed, and the same admission verdicts."""
    ledger = ShareLedger(1024)
    state = NodeState(
        "me",
        ledger=ledger,
        settings=Settings(placement_rule=rule, placement_d=2),
        rng=random.Random(7),
    )
    for i in range(40):
        r = LoadReport(f"p{i}", 1, weight_sum=float(i % 5), reserved_shares=(i % 3) * 400)
        state.view.put(r.node, PeerEntry(r, 0.0))
    ledger.add(TaskSpec(id="busy", argv=(), weight=3.0, reserve_shares=300))
    ledger.start("busy")  # 724 shares free: a reservation of 900 is refused here
    rng = random.Random(7)
    targets: set[str | None] = set()
    verdicts: set[str | None] = set()
    for k in range(200):
        spec = TaskSpec(id=f"t{k}", argv=(), reserve_shares=(k % 4) * 300)
        exclude = frozenset({f"p{k % 40}"})
        mine = state.choose(spec, 1.0, 1.0, exclude)
        local = state.local_report(1.0)
        theirs = decide.choose(rule, 2, spec, local, state.view, rng, 1.0, exclude)
        assert mine.target == theirs.target, k
        why = decide.admission_refusal(
            spec, ledger, state.flex, *state.usage(), gpus=state.gpus.summary()
        )
        assert state.admission_refusal(spec) == why
        targets.add(mine.target)
        verdicts.add(why)
    assert len(targets) > 5 and "me" in targets
    assert None in verdicts and len(verdicts) == 2


def test_late_binding_finishes_every_task_once_and_beats_two_choices() -> None:
    """Late binding (policy/latebind.py) in the engine: every task ends exactly once,
    nothing stays held or reserved, all of its paths run (pulled by a peer, started
    at home, released at the end of a hold), and on a heavy-tailed load it is faster
    than two choices on the same stale gossip."""
    from swarm.policy.latebind import LateConfig

    nodes = uniform_nodes(30, cores=1.0, slots=2)
    base = SimConfig(
        nodes=nodes,
        placement=PowerOfD(2),
        origin=NODE,
        staleness=GossipAge(1.0, 0.05),
        net_delay=0.005,
        seed=5,
        warmup=10.0,
    )
    jobs = list(poisson(0.9 * 30, BoundedPareto(1.1, 1000.0), random.Random(5), count=4000))
    two = simulate(base, jobs)
    sim = ClusterSim(attrs.evolve(base, late=LateConfig(d=4, sample=8, hold=1.0)), jobs)
    late = sim.run()
    assert late.arrivals == late.completions == len(jobs) and set(sim.finished) == {1}
    s = late.late_stats
    assert s.given > 0 and s.started_here > 0 and s.released > 0
    assert s.held == s.given + s.started_here + s.released
    assert late.messages == late.handoffs + late.refusals + s.reserves + s.cancels + 2 * s.pulls
    assert late.handoffs >= s.given
    for n in sim.nodes:
        assert n.lb is not None and n.lb.held == () and not n.held
        assert len(n.ledger) == 0 and not n.queue and not n.running
    assert late.mean < 0.85 * two.mean
