"""Nodes a pool's scale-out launched that have not joined yet (pure; issue 25).

They count as nodes of the pool (`PoolView.booting`) until they join or their boot
timeout passes, so that a boot longer than the out-cooldown does not launch nodes
twice for the same demand.
"""

from __future__ import annotations

import attrs

from ..model import NodeId
from .scalemsgs import HeardBoot


@attrs.define
class Launch:
    at: float  # when the scale-out began; once its hook succeeded, then
    count: int
    baseline: frozenset[NodeId]  # the pool's nodes when the scale-out began
    ahead: int = 0  # nodes of earlier launches still booting then (not in the baseline)
    # every node seen in the pool since, not in the baseline: one that joined and then
    # left (removed by a scale-in, dead) has booted; without this memory it counted as
    # booting again, and the actor that grew the pool shrank it below min-nodes
    # (found by tests/integration/test_elastic.py)
    joined: set[NodeId] = attrs.field(factory=set)


def not_joined(launches: list[Launch], pool: frozenset[NodeId]) -> int:
    """The nodes the newest launch still waits for: its own and those booting when
    it began, less the nodes that joined since. (Counting from the oldest launch's
    baseline instead undercounts once that launch times out: the nodes it brought
    then count as the newer launch's, found by tests/unit/test_scaling.py.)"""
    if not launches:
        return 0
    x = launches[-1]
    x.joined |= pool - x.baseline
    return max(0, x.ahead + x.count - len(x.joined))


def heard_launches(heard: HeardBoot, now: float, boot_timeout: float) -> list[Launch]:
    """The launches a new holder counts from what its predecessor said was booting."""
    if heard.count <= 0 or now - heard.at >= boot_timeout:
        return []
    baseline = heard.baseline if heard.baseline is not None else frozenset()
    return [Launch(heard.at, heard.count, baseline)]
