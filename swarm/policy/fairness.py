"""Fair share without a leader (pure): decayed usage, a mergeable usage map, DRF order.

Issue 20's maths, before any of it is wired into the node:

- **Decayed usage.** What a user (or group) has used, in resource-seconds per
  dimension, decays exponentially with a half-life (HTCondor's default is one day):
  yesterday's burst counts half as much as today's.
- **A usage map that merges.** Each node is the only writer of its own entry (its
  local usage per principal, with a version it increments); every node gossips the
  whole map and merges what it hears by keeping, per origin node, the entry with the
  higher version. That merge is commutative, associative and idempotent (a CRDT), so
  every node converges on the same cluster-wide usage whatever order gossip brings it
  in. Entries are bounded: an origin keeps its `max_principals` largest principals, the
  rest summed into one `OTHERS` entry.
- **Dominant Resource Fairness.** A principal's dominant share is its largest share of
  any resource the cluster has (slots, CPU, memory, GPU); DRF starts first the task
  whose principal has the smallest dominant share (divided by its weight), ties broken
  by arrival. Computed from stale gossip on purpose: every node orders its own queue
  (node/runqueue.order, classes first); `drf_schedule` is the central yardstick.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import attrs

Principal = str  # a user name, or "group:<name>"
OTHERS: Principal = "(others)"  # principals an origin's bounded entry does not name
DEFAULT_HALF_LIFE = 86_400.0  # seconds (HTCondor's PRIORITY_HALFLIFE default)


@attrs.frozen
class Resources:
    """An amount of each resource (or of resource-seconds, for usage)."""

    slots: float = 0.0
    cpu: float = 0.0  # cores
    mem: float = 0.0  # bytes
    gpu: float = 0.0  # GPU units (100 = one whole device)

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.slots + other.slots,
            self.cpu + other.cpu,
            self.mem + other.mem,
            self.gpu + other.gpu,
        )

    def scaled(self, k: float) -> Resources:
        return Resources(self.slots * k, self.cpu * k, self.mem * k, self.gpu * k)

    def as_tuple(self) -> tuple[float, float, float, float]:
        return (self.slots, self.cpu, self.mem, self.gpu)


NOTHING = Resources()


def decay_factor(dt: float, half_life: float) -> float:
    """How much of an amount is left after `dt` seconds (1.0 for dt <= 0)."""
    if half_life <= 0:
        raise ValueError("half_life must be > 0")
    return 1.0 if dt <= 0 else math.pow(0.5, dt / half_life)


@attrs.frozen
class Decayed:
    """Usage as of time `at` (resource-seconds), decaying from then on."""

    value: Resources = NOTHING
    at: float = 0.0

    def at_time(self, now: float, half_life: float) -> Resources:
        return self.value.scaled(decay_factor(now - self.at, half_life))

    def plus(self, amount: Resources, now: float, half_life: float) -> Decayed:
        """Add resource-seconds used up to `now` (older usage decays first)."""
        return Decayed(self.at_time(now, half_life) + amount, max(now, self.at))


def dominant_share(usage: Resources, capacity: Resources) -> float:
    """The largest fraction of any resource the cluster has (0 if it has none)."""
    shares = [u / c for u, c in zip(usage.as_tuple(), capacity.as_tuple(), strict=True) if c > 0]
    return max(shares, default=0.0)


# ------------------------------------------------------------------ the usage map


@attrs.frozen
class OriginUsage:
    """One node's own usage per principal, as of its `version`."""

    version: int
    usage: tuple[tuple[Principal, Decayed], ...]  # sorted by principal

    def as_dict(self) -> dict[Principal, Decayed]:
        return dict(self.usage)


@attrs.frozen
class UsageMap:
    """Every node's usage per principal; merge keeps each origin's newest entry."""

    origins: tuple[tuple[str, OriginUsage], ...] = ()  # sorted by origin

    def entry(self, origin: str) -> OriginUsage | None:
        return dict(self.origins).get(origin)

    def merge(self, other: UsageMap) -> UsageMap:
        mine = dict(self.origins)
        for origin, entry in other.origins:
            cur = mine.get(origin)
            if cur is None or _newer(entry, cur):
                mine[origin] = entry
        return UsageMap(tuple(sorted(mine.items())))

    def with_local(
        self,
        origin: str,
        usage: Mapping[Principal, Decayed],
        half_life: float,
        now: float,
        max_principals: int = 64,
    ) -> UsageMap:
        """This node's entry replaced by its current usage (a new version), bounded to
        its `max_principals - 1` largest principals (slot-seconds, then CPU-seconds)
        plus OTHERS, which holds the sum of the rest (nothing is dropped)."""
        cur = self.entry(origin)
        version = (cur.version + 1) if cur is not None else 1
        kept = _bounded(usage, half_life, now, max_principals)
        entry = OriginUsage(version, tuple(sorted(kept.items())))
        mine = dict(self.origins)
        mine[origin] = entry
        return UsageMap(tuple(sorted(mine.items())))

    def totals(self, now: float, half_life: float) -> dict[Principal, Resources]:
        """Cluster-wide decayed usage per principal, as of `now`."""
        out: dict[Principal, Resources] = {}
        for _, entry in self.origins:
            for principal, d in entry.usage:
                out[principal] = out.get(principal, NOTHING) + d.at_time(now, half_life)
        return out


def _newer(a: OriginUsage, b: OriginUsage) -> bool:
    """Is `a` the entry to keep over `b`? The higher version; on a tie (which a single
    writer never makes, but a restarted node without its journal might) the larger
    entry in a fixed total order, so that the merge stays commutative."""
    if a.version != b.version:
        return a.version > b.version
    return _order_key(a) > _order_key(b)


def _order_key(e: OriginUsage) -> tuple[object, ...]:
    return tuple((p, d.at, d.value.as_tuple()) for p, d in e.usage)


def bounded(
    usage: Mapping[Principal, Decayed], half_life: float, now: float, limit: int
) -> dict[Principal, Decayed]:
    """`usage` as of `now`, at most `limit` principals: the largest, plus OTHERS
    holding the sum of the rest (nothing is dropped)."""
    return _bounded(usage, half_life, now, limit)


def _bounded(
    usage: Mapping[Principal, Decayed], half_life: float, now: float, limit: int
) -> dict[Principal, Decayed]:
    if limit < 1:
        raise ValueError("max_principals must be >= 1")
    current = {p: Decayed(d.at_time(now, half_life), now) for p, d in usage.items()}
    if len(current) <= limit:
        return current
    ranked = sorted(current, key=lambda p: (-current[p].value.slots, -current[p].value.cpu, p))
    keep = {p: current[p] for p in ranked[: limit - 1] if p != OTHERS}
    rest = NOTHING
    for p in current:
        if p not in keep:
            rest = rest + current[p].value
    keep[OTHERS] = Decayed(rest, now)
    return keep


# -------------------------------------------------------------------- DRF order


@attrs.frozen
class Waiting:
    """A queued task as DRF orders it."""

    task_id: str
    principal: Principal
    arrival: int  # its position in arrival order (ties are broken by it)


def drf_schedule(
    waiting: Sequence[Waiting],
    demand: Mapping[str, Resources],
    usage: Mapping[Principal, Resources],
    capacity: Resources,
    free: Resources,
    weights: Mapping[Principal, float] | None = None,
) -> list[str]:
    """Which tasks start, in order, when `free` resources are shared by DRF: repeatedly
    the lowest weighted dominant share among principals with a task that fits (its
    demand, `demand[task_id]`, within what is left), its earliest such task."""
    w = weights or {}
    used = dict(usage)
    left = free
    queues: dict[Principal, list[Waiting]] = {}
    for t in sorted(waiting, key=lambda t: t.arrival):
        queues.setdefault(t.principal, []).append(t)
    started: list[str] = []
    while True:
        best: tuple[float, int, Principal, Waiting] | None = None
        for principal, q in queues.items():
            fit = next((t for t in q if _fits(demand.get(t.task_id, NOTHING), left)), None)
            if fit is None:
                continue
            share = dominant_share(used.get(principal, NOTHING), capacity)
            k = (share / max(w.get(principal, 1.0), 1e-9), fit.arrival, principal, fit)
            if best is None or k[:2] < best[:2]:
                best = k
        if best is None:
            return started
        _, _, principal, t = best
        need = demand.get(t.task_id, NOTHING)
        left = Resources(*(a - b for a, b in zip(left.as_tuple(), need.as_tuple(), strict=True)))
        used[principal] = used.get(principal, NOTHING) + need
        queues[principal].remove(t)
        started.append(t.task_id)


def _fits(need: Resources, left: Resources) -> bool:
    return all(n <= f + 1e-9 for n, f in zip(need.as_tuple(), left.as_tuple(), strict=True))


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one has everything."""
    xs = list(values)
    if not xs:
        return 1.0
    s = sum(xs)
    sq = sum(x * x for x in xs)
    return 1.0 if sq == 0 else (s * s) / (len(xs) * sq)
