"""Elastic quotas without a leader (pure; issue 20).

A group's cluster-wide cap (`max`, in slots) is enforced approximately. The agent's
gate (node/runqueue.quota_refusal) counts what the group runs on every node (never
cut) and splits what is left of the cap by the queued demand each node gossips, in
whole slots (`whole_slots`, largest remainder, ties to the node named first): nodes
that see the same rows give out exactly the cap in all.

The overshoot comes from staleness only: a node decides on its own fresh counts and
the others' last reports, so starts that no report has shown yet are counted by
their own node alone. Within one gossip delay D each node can start at most what its
own view allows; the bound is the group's starts made cluster-wide in D that another
node's view has not seen (in the worst case, a node that has heard of no other
node's demand gives itself the whole cap). `swarm sim fairness` measures it against
D (docs/experiments.md, section 7). An optional `quota-floor` lets a node always
start that much for demand of its own (never starved by stale rows) at a bounded,
lasting cost of that floor per such node.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence


def whole_slots(cap: float, node: str, demand: Mapping[str, float]) -> int:
    """This node's whole slots of an integer cap split by `demand`, by the largest
    remainder (ties to the node named first): nodes that see the same demand give
    out exactly `floor(cap)` slots in all, and each node never more than its demand.
    A fractional split (0.7 slots on each of three nodes) would start nothing."""
    total_slots = int(cap + 1e-9)
    want = {n: max(d, 0.0) for n, d in demand.items() if d > 0}
    total = sum(want.values())
    if node not in want or total <= 0 or total_slots <= 0:
        return 0
    exact = {n: total_slots * d / total for n, d in want.items()}
    given = {n: min(int(x), int(want[n])) for n, x in exact.items()}
    left = total_slots - sum(given.values())
    order = sorted(want, key=lambda n: (-(exact[n] - int(exact[n])), n))
    while left > 0:
        moved = False
        for n in order:
            if left > 0 and given[n] < want[n]:
                given[n] += 1
                left -= 1
                moved = True
        if not moved:
            break
    return given[node]


def lagged_demand(history: Sequence[tuple[float, int]], now: float, lag: float, fresh: int) -> int:
    """This node's queued demand of a group as the others see it: the value it
    recorded `lag` seconds ago (about one gossip dissemination; 0 if none then), never
    more than now. Splitting the cap on the same rows as the others keeps two nodes
    from each taking the same free slot (`swarm sim fairness`: the peak overshoot at
    the default timers falls by about half); new demand waits `lag` to be counted."""
    if lag <= 0:
        return fresh
    seen = 0
    for at, q in history:
        if at > now - lag:
            break
        seen = q
    return min(seen, fresh)


def log_demand(log: deque[tuple[float, int]], now: float, queued: int, lag: float) -> None:
    """Record what a node's report says it has queued of a capped group (for
    `lagged_demand`): a change is appended; what is older than `lag` is dropped but
    for the last such entry (the one `lagged_demand` reads)."""
    if not log or log[-1][1] != queued:
        log.append((now, queued))
    while len(log) > 1 and log[1][0] <= now - lag:
        log.popleft()
