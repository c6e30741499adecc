"""Balls into bins through swarm's placement: m unit tasks thrown one at a time.

Each ball is placed by the agent's two-choice rule (`node.decide.choose`, i.e.
`policy.placement.place`) from a submitter that runs nothing (its drained local
report is never a candidate), so exactly d bins are sampled and the least loaded of
them takes the ball; d = 1 is uniform random. The view is fresh
(updated after every ball), as in the classical analysis: with m = n the maximum load
is about ln n / ln ln n for d = 1 and ln ln n / ln d + O(1) for d >= 2 (Azar, Broder,
Karlin, Upfal 1994; Mitzenmacher 2001).
"""

from __future__ import annotations

import math
import random

import attrs

from swarm.model import LoadReport, TaskSpec
from swarm.node.decide import TWO_CHOICE, choose
from swarm.policy.view import LoadView, PeerEntry

_FRONT = LoadReport("frontend", 1, shares=0)


@attrs.frozen
class BallsResult:
    n: int
    m: int
    d: int
    max_load: int
    histogram: tuple[int, ...]  # bins holding 0, 1, 2, ... balls


def throw(n: int, m: int, d: int, rng: random.Random) -> BallsResult:
    """Throw m balls into n bins with `place(d=d)`; returns the maximum load."""
    if n < 1 or m < 0 or d < 1:
        raise ValueError("need n >= 1, m >= 0, d >= 1")
    ids = [f"b{i:06d}" for i in range(n)]
    counts = dict.fromkeys(ids, 0)
    versions = dict.fromkeys(ids, 1)
    view = LoadView()
    for nid in ids:
        view.put(nid, PeerEntry(LoadReport(nid, 1), 0.0))
    spec = TaskSpec(id="ball", argv=())
    for _ in range(m):
        target = choose(TWO_CHOICE, d, spec, _FRONT, view, rng, 0.0).target
        assert target is not None  # no filters apply: every bin is eligible
        k = counts[target] + 1
        counts[target] = k
        v = versions[target] + 1
        versions[target] = v
        view.put(target, PeerEntry(LoadReport(target, v, weight_sum=float(k)), 0.0))
    top = max(counts.values()) if counts else 0
    hist = [0] * (top + 1)
    for c in counts.values():
        hist[c] += 1
    return BallsResult(n, m, d, top, tuple(hist))


def theory_random(n: int) -> float:
    """ln n / ln ln n: the leading term of the maximum load for d = 1, m = n."""
    return math.log(n) / math.log(math.log(n))


def theory_d(n: int, d: int) -> float:
    """ln ln n / ln d: the leading term of the maximum load for d >= 2, m = n."""
    return math.log(math.log(n)) / math.log(d)
