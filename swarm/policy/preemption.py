"""Which running tasks a node stops to start a higher-priority one (pure; issue 20).

The receiver decides, never a remote node (as Nomad's preemption does). Victims are
only tasks at least `min_gap` classes below the waiting one; among them the lowest
class goes first, then the least work lost (time since its last checkpoint, or since
it started), then the most recently started. The set is minimal: victims whose
resources turn out not to be needed (the greedy walk took a small one before a large
one that alone suffices) are given back, from the least preferred end.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .fairness import NOTHING, Resources


@attrs.frozen
class Running:
    task_id: str
    priority: int
    started_at: float
    work_lost: float  # seconds of work a stop would lose
    holds: Resources  # what it frees when stopped


def _covers(free: Resources, need: Resources) -> bool:
    return all(f + 1e-9 >= n for f, n in zip(free.as_tuple(), need.as_tuple(), strict=True))


def preference(r: Running) -> tuple[int, float, float]:
    """The order victims are taken in: lowest class, least work lost, newest start."""
    return (r.priority, r.work_lost, -r.started_at)


def choose_victims(
    running: Sequence[Running],
    need: Resources,
    free: Resources,
    priority: int,
    min_gap: int = 1,
) -> list[str] | None:
    """The tasks to stop so that `need` fits next to `free`, or None if stopping every
    eligible task would not be enough (then nothing is stopped). [] if it fits now."""
    if min_gap < 1:
        raise ValueError("min_gap must be >= 1 (a task never preempts its own class)")
    if _covers(free, need):
        return []
    eligible = sorted((r for r in running if r.priority + min_gap <= priority), key=preference)
    chosen: list[Running] = []
    have = free
    for r in eligible:
        chosen.append(r)
        have = have + r.holds
        if _covers(have, need):
            break
    else:
        return None
    # minimal: drop any victim the others can do without, least preferred first
    for r in sorted(chosen, key=preference, reverse=True):
        rest = [c for c in chosen if c is not r]
        total = free
        for c in rest:
            total = total + c.holds
        if _covers(total, need):
            chosen = rest
    return [r.task_id for r in sorted(chosen, key=preference)]


def freed(running: Sequence[Running], victims: Sequence[str]) -> Resources:
    out = NOTHING
    ids = set(victims)
    for r in running:
        if r.task_id in ids:
            out = out + r.holds
    return out
