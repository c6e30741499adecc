"""Elastic quotas without a leader (pure; issue 20, not wired yet).

A group's cluster-wide cap (`max`) is enforced approximately: each node may start the
group's work up to its *local allowance*, the cap split in proportion to the group's
demand as gossiped by each node (distributed rate limiting's split), plus what the
group already runs here, so a node never has to stop work to honour a new split. A
node whose demand the others have not heard of yet still gets `floor` (a small share
of the cap), so new demand is never starved by stale gossip; the price is a bounded
overshoot: at most `floor` per node whose demand is not yet in the others' views.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs


@attrs.frozen
class Allowance:
    allowed: float  # how much of the group's work may run here in all
    share: float  # this node's fraction of the cap


def local_allowance(
    cap: float,
    node: str,
    demand: Mapping[str, float],
    running_here: float,
    floor: float = 0.0,
) -> Allowance:
    """This node's allowance for one group: `cap` split by `demand` (queued + running
    per node, from gossip; this node's own figure fresh), never below what already
    runs here nor below `floor` when this node has demand."""
    if cap < 0 or floor < 0 or running_here < 0:
        raise ValueError("cap, floor and running_here must be >= 0")
    mine = max(demand.get(node, 0.0), 0.0)
    total = sum(max(d, 0.0) for d in demand.values())
    share = mine / total if total > 0 else 0.0
    allowed = cap * share
    if mine > 0:
        allowed = max(allowed, min(floor, cap))
    return Allowance(max(allowed, running_here), share)


def overshoot_bound(cap: float, floor: float, unseen_nodes: int) -> float:
    """The most the group can run above `cap` cluster-wide while `unseen_nodes` nodes'
    demand has not reached the others (each may start up to `floor` on its own)."""
    return min(floor, cap) * max(unseen_nodes, 0)
