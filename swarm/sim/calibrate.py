"""How old is gossiped load? Measured on the real membership core over `gossipnet`.

The cluster experiments use an age model of gossip (`engine.GossipAge`) because
running the SWIM core for every one of 10,000 nodes and a million tasks is far too
slow. This module measures what that model stands for: `n` real `Membership` cores
(swarm/cluster/membership.py) on the simulated network, each publishing its load
every `report_interval` seconds with `set_local_load` (as the agent's coordinator
does), and observers reading `load_view()`. The age of a peer's entry is the time
since that report was made; its distribution gives the model's parameters (period =
report interval, delay = the dissemination time on top of it).
"""

from __future__ import annotations

import math
import random

import attrs

from swarm import model as m
from swarm.cluster.membership import MembershipConfig

from .engine import quantile
from .gossipnet import GossipNet


@attrs.frozen
class AgeStats:
    nodes: int
    report_interval: float
    gossip_interval: float
    samples: int
    coverage: float  # fraction of (observer, peer) pairs with any report at all
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @property
    def dissemination(self) -> float:
        """Mean age beyond what the report interval alone explains (interval / 2)."""
        return self.mean - self.report_interval / 2


def measure_load_age(
    nodes: int = 100,
    *,
    seed: int = 1,
    report_interval: float = 1.0,
    duration: float = 30.0,
    warmup: float = 10.0,
    observers: int = 10,
    config: MembershipConfig | None = None,
) -> AgeStats:
    """Run `nodes` membership cores for `duration` simulated seconds; every second
    after `warmup`, `observers` random nodes read their load view."""
    cfg = config if config is not None else MembershipConfig.lan()
    net = GossipNet(seed=seed, config=cfg)
    members = net.bootstrap(nodes)
    rng = random.Random(seed * 3 + 1)
    made: dict[tuple[m.NodeId, int], float] = {}
    version: dict[m.NodeId, int] = {nd.id: 0 for nd in members}

    def publish(node_id: m.NodeId) -> None:
        v = version[node_id] + 1
        version[node_id] = v
        made[(node_id, v)] = net.now
        net.node(node_id).membership.set_local_load(m.LoadReport(node_id, v), net.now)
        net.at(net.now + report_interval, lambda: publish(node_id))

    for nd in members:
        net.at(rng.random() * report_interval, lambda nid=nd.id: publish(nid))  # type: ignore[misc]

    ages: list[float] = []
    pairs = seen = 0

    def sample() -> None:
        nonlocal pairs, seen
        now = net.now
        for nd in rng.sample(members, min(observers, len(members))):
            view = nd.membership.load_view()
            for other in members:
                if other.id == nd.id:
                    continue
                pairs += 1
                entry = view.get(other.id)
                if entry is None:
                    continue
                seen += 1
                created = made.get((other.id, entry.report.version))
                if created is not None:
                    ages.append(now - created)

    t = warmup
    while t < duration:
        net.at(t, sample)
        t += 1.0
    net.run_until(duration)
    ages.sort()
    return AgeStats(
        nodes=nodes,
        report_interval=report_interval,
        gossip_interval=cfg.gossip_interval,
        samples=len(ages),
        coverage=seen / pairs if pairs else math.nan,
        mean=sum(ages) / len(ages) if ages else math.nan,
        p50=quantile(ages, 0.5),
        p90=quantile(ages, 0.9),
        p99=quantile(ages, 0.99),
        max=ages[-1] if ages else math.nan,
    )
