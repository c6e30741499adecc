"""Lifeguard: local health awareness and the dynamic suspicion timeout.

Lifeguard (Dadgar et al., 2018; HashiCorp memberlist) starts from the observation
that most false failure detections in SWIM come from the *detector* being slow
(CPU starved, GC pause, packet backlog), not from the target. So:

* `Awareness` (the Local Health Multiplier) rises when this node misses nacks or
  has to refute a suspicion about itself, and falls with every successful probe;
  probe interval and probe timeout are scaled by ``score + 1``, so a sick node
  probes less and waits longer before it accuses anyone.
* `Suspicion` starts long (``max = suspicion_max_timeout_mult * min``) and shrinks
  toward ``min`` as independent nodes confirm the suspicion, on a log scale:
  one lone (maybe sick) accuser needs the long timeout, a consensus acts fast.
"""

from __future__ import annotations

import math

import attrs

from swarm import model as m


def suspicion_timeout(suspicion_mult: int, n: int, probe_interval: float) -> float:
    """memberlist's minimum suspicion timeout: mult * max(1, log10(max(1, n))) * interval."""
    node_scale = max(1.0, math.log10(max(1.0, float(n))))
    return suspicion_mult * node_scale * probe_interval


def remaining_suspicion_time(
    confirmations: int, k: int, elapsed: float, min_timeout: float, max_timeout: float
) -> float:
    """memberlist's remainingSuspicionTime (may be negative: fire at once)."""
    if k < 1:
        return min_timeout - elapsed
    frac = math.log(confirmations + 1.0) / math.log(k + 1.0)
    raw = max_timeout - frac * (max_timeout - min_timeout)
    return max(min_timeout, raw) - elapsed


class Awareness:
    """Local Health Multiplier: a score in [0, max_multiplier - 1]."""

    def __init__(self, max_multiplier: int) -> None:
        self.max = max(1, max_multiplier)
        self.score = 0

    def apply(self, delta: int) -> None:
        self.score = min(self.max - 1, max(0, self.score + delta))

    def scale(self, timeout: float) -> float:
        return timeout * (self.score + 1)


@attrs.define
class Suspicion:
    """One suspicion timer: who confirmed it, and when it expires.

    `k` is how many independent confirmations (besides the first accuser) bring the
    timeout down to `min_timeout`; with k = 0 the timeout is simply `min_timeout`.
    """

    start: float
    k: int
    min_timeout: float
    max_timeout: float
    incarnation: int
    accusers: set[m.NodeId] = attrs.field(factory=set)
    confirmations: int = 0

    @classmethod
    def new(
        cls,
        *,
        accuser: m.NodeId,
        start: float,
        k: int,
        min_timeout: float,
        max_timeout: float,
        incarnation: int,
    ) -> Suspicion:
        s = cls(
            start=start,
            k=k,
            min_timeout=min_timeout,
            max_timeout=max_timeout if k >= 1 else min_timeout,
            incarnation=incarnation,
        )
        s.accusers.add(accuser)
        return s

    @property
    def deadline(self) -> float:
        return self.start + remaining_suspicion_time(
            self.confirmations, self.k, 0.0, self.min_timeout, self.max_timeout
        )

    def confirm(self, accuser: m.NodeId) -> bool:
        """Count an independent confirmation; True if it was new (then re-gossip it)."""
        if self.confirmations >= self.k or not accuser or accuser in self.accusers:
            return False
        self.accusers.add(accuser)
        self.confirmations += 1
        return True
