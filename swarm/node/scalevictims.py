"""Scale-in victims of one pool (pure; issue 25): the rules that decide when a drained
victim may be removed, is kept, or must be undrained. Functions over the controller
(node/scaling.py), kept apart so each module holds one set of rules.

A victim is ready for the scale-in hook once a report shows it drained and holding
nothing (running, queued, or unfinished tasks it is the home of), or once the drain
grace is over after a report showed the drain; a victim whose running + queued +
homed count rises after its drain showed received work and is kept (undrained); one
that never shows the drain within the grace is kept too (removing it could lose what
it runs); and victims are kept while removing them would leave fewer than min_nodes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

import attrs

from ..model import NodeId
from ..policy.scalepool import Member, PoolSpec
from .scalemsgs import Drain, Instruction


@attrs.define
class Victim:
    since: float  # when the drain was asked for (this node's clock): the grace counts
    work: int  # running + queued + homed at the last report that showed the drain
    seen_drained: bool = False  # a report has shown the node drained
    asked: float | None = None  # the latest (re-)request of the drain; None: `since`


def adopt_victims(
    victims: dict[NodeId, Victim],
    heard: set[NodeId],
    me: NodeId,
    spec: PoolSpec,
    notes: deque[str],
    now: float,
    out: list[Instruction],
) -> None:
    """A new holder takes over the victims its predecessor announced. If it is one of
    them, it undrains itself: the actor is never its own victim, so nobody else
    would undo that drain."""
    for n in heard - victims.keys():
        if n != me:
            victims[n] = Victim(since=now, work=0)
            continue
        why = "the new actor was being drained for scale-in: kept"
        notes.append(f"{n}: {why}")
        out.append(Drain(spec.name, n, False, why))


def check_victims(
    victims: dict[NodeId, Victim],
    spec: PoolSpec,
    notes: deque[str],
    in_hook: set[NodeId],
    now: float,
    pool: Mapping[NodeId, Member],
    out: list[Instruction],
) -> list[NodeId]:
    """Drop victims that left or were undrained, keep those that received work, and
    return those ready for the scale-in hook (`in_hook`: those in a hook already)."""
    ready: list[NodeId] = []
    for n, v in list(victims.items()):
        mb = pool.get(n)
        if mb is None:
            del victims[n]  # gone (removed, dead) or out of the pool
            notes.append(f"{n}: left the pool while draining")
            continue
        r = mb.report
        if r is None or n in in_hook:
            continue
        # the tasks it is the home of count: removing it would strand them
        work = r.running + r.queued + r.homing
        if r.draining:
            if v.seen_drained and work > v.work:
                del victims[n]
                why = f"received work while draining ({v.work} -> {work} tasks): kept"
                notes.append(f"{n}: {why}")
                out.append(Drain(spec.name, n, False, why))
                continue
            v.seen_drained = True
            v.work = work
        elif v.seen_drained:
            del victims[n]  # an operator undrained it: not ours to remove
            notes.append(f"{n}: undrained by someone else while draining: kept")
            continue
        if v.seen_drained and work == 0:
            ready.append(n)
        elif now - v.since >= spec.drain_grace:
            if not v.seen_drained:
                # it never showed the drain: removing it could lose what it runs
                del victims[n]
                why = f"drain not seen within the {spec.drain_grace:g} s grace: kept"
                notes.append(f"{n}: {why}")
                out.append(Drain(spec.name, n, False, why))
                continue
            notes.append(f"{n}: drain grace {spec.drain_grace:g} s over with {work} tasks left")
            ready.append(n)
        elif not v.seen_drained and now - (v.asked or v.since) >= spec.lease_ttl:
            # the drain request may have been lost (or the node restarted): ask again
            # (the grace still counts from the first request)
            v.asked = now
            out.append(Drain(spec.name, n, True, "drain not seen yet: asked again"))
    return ready


def keep_min(
    victims: dict[NodeId, Victim],
    spec: PoolSpec,
    notes: deque[str],
    in_hook: set[NodeId],
    hook_waits: bool,
    pool: int,
    ready: list[NodeId],
    out: list[Instruction],
) -> tuple[list[NodeId], bool]:
    """Keep victims (undrain them) while removing them all would leave fewer than
    min_nodes present: nodes that died after the drains began are not replaced by
    the victims' removal (the count held for the pool of then; found by
    tests/unit/test_scaling.py). Those with work are kept first, then idle ones; a
    scale-in hook waiting to retry (`hook_waits`, for the `in_hook` victims) is
    dropped when that is not enough. Returns the ready victims still to remove, and
    whether to drop that hook."""
    short = spec.scale.min_nodes - (pool - len(victims))
    if short <= 0:
        return ready, False
    keep = sorted(victims.keys() - in_hook - set(ready))
    keep += sorted(set(ready) - in_hook)
    drop = False
    if len(keep) < short and in_hook and hook_waits:
        drop = True
        keep += sorted(in_hook & victims.keys())
    for n in keep[:short]:
        del victims[n]
        why = f"the pool would fall below min_nodes {spec.scale.min_nodes}: kept"
        notes.append(f"{n}: {why}")
        out.append(Drain(spec.name, n, False, why))
    return [n for n in ready if n in victims], drop
