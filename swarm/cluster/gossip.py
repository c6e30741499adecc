"""Piggyback dissemination and the merge rules of membership and load state.

Two jobs, both pure:

* `BroadcastQueue`: memberlist's TransmitLimitedQueue. Messages waiting to be
  piggybacked, fewest transmissions first, each sent at most
  ``mult * ceil(log10(n + 1))`` times, and a newer message about the same subject
  replaces the queued one (invalidation). We add priority *tiers*: membership
  messages always go before application broadcasts, which go before load reports,
  and load may only use part of a packet; within membership, suspicions come last.
  So bandwidth stays bounded by packet size and send rate however many load reports
  are waiting; load simply gets staler as the cluster grows (knowingly stale).
* Merge rules: a member record is a point in a lattice ordered by
  (incarnation, precedence, address); merging is the join (max), hence commutative,
  associative and idempotent. Load reports merge by version. Push-pull softens a
  remote "dead" to "suspect" (as memberlist does) before the join, so a stale view
  cannot kill a live node outright: it has to go through suspicion and may refute.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Iterable, Mapping

import attrs

from swarm import model as m

# Priority tiers of the piggyback queue, highest first. Under saturation (heavy
# loss: suspicions and refutations everywhere) news that clears or settles a
# suspicion (alive/refutation, dead, left) goes before news that raises one.
MEMBER_TIER = 0  # alive (joins, refutations), dead, left
SUSPECT_TIER = 1  # suspicions and their confirmations
APP_TIER = 2
LOAD_TIER = 3
N_TIERS = 4

_PRECEDENCE: Mapping[m.MemberState, int] = {
    m.MemberState.ALIVE: 0,
    m.MemberState.SUSPECT: 1,
    m.MemberState.DEAD: 2,
    m.MemberState.LEFT: 3,
}
_ALIVE = m.MemberState.ALIVE
_SUSPECT = m.MemberState.SUSPECT
_DEAD = m.MemberState.DEAD


# ------------------------------------------------------------ memberlist's formulas


def retransmit_limit(mult: int, n: int) -> int:
    """How many times one node sends one broadcast (memberlist: mult * ceil(log10(n+1)))."""
    return mult * math.ceil(math.log10(max(1, n) + 1))


def push_pull_scale(interval: float, n: int, threshold: int = 32) -> float:
    """memberlist's pushPullScale: above 32 nodes the interval grows with log2(n)."""
    if n <= threshold:
        return interval
    multiplier = math.ceil(math.log2(n) - math.log2(threshold)) + 1
    return interval * multiplier


# ------------------------------------------------------------------ merge rules


def precedence(state: m.MemberState) -> int:
    return _PRECEDENCE[state]


def record_key(mb: m.Member) -> tuple[int, int, str, int]:
    """Total order of member records: the newer/stronger one is the larger.

    Incarnation first (only the node itself raises it, to refute); at equal
    incarnation left > dead > suspect > alive; the address breaks the remaining tie
    deterministically (two processes claiming one id at one incarnation).
    """
    s = mb.state
    # identity chain instead of a dict: Enum.__hash__ is slow and this is a hot path
    rank = 0 if s is _ALIVE else 1 if s is _SUSPECT else 2 if s is _DEAD else 3
    return (mb.incarnation, rank, mb.addr, mb.port)


def merge_member(current: m.Member | None, incoming: m.Member) -> m.Member:
    """Join of two records about the same node."""
    if current is None or record_key(incoming) > record_key(current):
        return incoming
    return current


def soften(mb: m.Member) -> m.Member:
    """How a push-pull record is read: a remote 'dead' only makes us suspect."""
    if mb.state is m.MemberState.DEAD:
        return attrs.evolve(mb, state=m.MemberState.SUSPECT)
    return mb


def merge_view(
    view: Mapping[m.NodeId, m.Member], records: Iterable[m.Member], *, push_pull: bool = False
) -> dict[m.NodeId, m.Member]:
    """The view after merging `records` (gossip, or a push-pull state if push_pull)."""
    out = dict(view)
    for rec in records:
        r = soften(rec) if push_pull else rec
        out[r.node] = merge_member(out.get(r.node), r)
    return out


def merge_load(current: m.LoadReport | None, incoming: m.LoadReport) -> m.LoadReport:
    """Newest version wins; equal versions keep the one we have (they are the same report)."""
    if current is None or incoming.version > current.version:
        return incoming
    return current


def merge_loads(
    store: Mapping[m.NodeId, m.LoadReport], reports: Iterable[m.LoadReport]
) -> dict[m.NodeId, m.LoadReport]:
    out = dict(store)
    for r in reports:
        out[r.node] = merge_load(out.get(r.node), r)
    return out


# -------------------------------------------------------------- broadcast queue


@attrs.define
class _Item:
    key: Hashable
    blob: bytes
    kind: str
    tier: int
    mult: int
    size: int  # bytes it takes in a packet: the blob and its msgpack bin header
    transmits: int = 0


# One message picked for a packet: (key, kind, blob). A plain tuple: this is the
# hottest path of the simulator.
Taken = tuple[Hashable, str, bytes]


def packed_size(blob: bytes) -> int:
    """Bytes a blob takes inside a packet's message array (see messages.blob_overhead)."""
    n = len(blob)
    return n + (2 if n < 256 else 3 if n < 65536 else 5)


class BroadcastQueue:
    """Transmit-limited, invalidating, tiered piggyback queue.

    Per tier, items sit in buckets by transmit count; a take scans the tiers in
    order, each from its lowest bucket, newest item first, and packs what fits.
    Invalidation is by key: enqueueing a key that is queued replaces that item
    (and resets its count), e.g. ("m", node) for membership news about one node.
    """

    def __init__(self) -> None:
        self._items: dict[Hashable, _Item] = {}
        self._buckets: list[dict[int, dict[Hashable, _Item]]] = [{} for _ in range(N_TIERS)]
        self._tier_count = [0] * N_TIERS

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def tier_len(self, tier: int) -> int:
        return self._tier_count[tier]

    def transmits(self, key: Hashable) -> int | None:
        it = self._items.get(key)
        return None if it is None else it.transmits

    def enqueue(self, key: Hashable, blob: bytes, *, kind: str, tier: int, mult: int) -> None:
        self.remove(key)
        it = _Item(key=key, blob=blob, kind=kind, tier=tier, mult=mult, size=packed_size(blob))
        self._items[key] = it
        self._buckets[tier].setdefault(0, {})[key] = it
        self._tier_count[tier] += 1

    def only_tier(self, tier: int) -> bool:
        """True if everything queued is in `tier` (e.g. nothing but load reports)."""
        return bool(self._items) and self._tier_count[tier] == len(self._items)

    def prune(self, tier: int, max_items: int) -> int:
        """Drop the most-transmitted (then oldest) items of a tier beyond max_items
        (memberlist's Prune). Returns how many were dropped."""
        buckets = self._buckets[tier]
        excess = self._tier_count[tier] - max_items
        dropped = 0
        for t in sorted(buckets, reverse=True):
            if dropped >= excess:
                break
            keys = list(itertools.islice(buckets[t], excess - dropped))
            for key in keys:
                self.remove(key)
            dropped += len(keys)
        return dropped

    def remove(self, key: Hashable) -> None:
        it = self._items.pop(key, None)
        if it is not None:
            self._unbucket(it)
            self._tier_count[it.tier] -= 1

    def _unbucket(self, it: _Item) -> None:
        b = self._buckets[it.tier][it.transmits]
        del b[it.key]
        if not b:
            del self._buckets[it.tier][it.transmits]

    def take(
        self,
        budget: int,
        n_nodes: int,
        *,
        tier_caps: Mapping[int, int] | None = None,
        max_scan: int = 512,
    ) -> list[Taken]:
        """Pick messages whose packed size (packed_size) fits in `budget` bytes.

        Every picked message counts one transmission; it leaves the queue at its
        retransmit limit, computed with today's cluster size as memberlist does.
        `tier_caps` bounds the bytes a tier may use in this take. Scanning stops
        after `max_scan` items so a huge queue cannot make one take expensive.
        """
        picked: list[_Item] = []
        remaining = budget
        scanned = 0
        for tier, buckets in enumerate(self._buckets):
            if not buckets:
                continue
            cap = remaining
            if tier_caps is not None:
                c = tier_caps.get(tier)
                if c is not None and c < cap:
                    cap = c
            misses = 0  # consecutive items that did not fit: the tier is as full as it gets
            stop = False
            for t in sorted(buckets) if len(buckets) > 1 else buckets:
                for it in reversed(buckets[t].values()):
                    scanned += 1
                    size = it.size
                    if size <= cap:
                        picked.append(it)
                        cap -= size
                        remaining -= size
                        misses = 0
                    else:
                        misses += 1
                    if cap < 8 or misses >= 8 or scanned >= max_scan:
                        stop = True
                        break
                if stop:
                    break
            if remaining < 8 or scanned >= max_scan:
                break
        if not picked:
            return []
        out = [(it.key, it.kind, it.blob) for it in picked]
        limits: dict[int, int] = {}
        items = self._items
        all_buckets = self._buckets
        # Re-bucket oldest first so that the next take still sees the newest first.
        for it in reversed(picked):
            tb = all_buckets[it.tier]
            b = tb[it.transmits]
            del b[it.key]
            if not b:
                del tb[it.transmits]
            it.transmits += 1
            limit = limits.get(it.mult)
            if limit is None:
                limit = limits[it.mult] = retransmit_limit(it.mult, n_nodes)
            if it.transmits >= limit:
                del items[it.key]
                self._tier_count[it.tier] -= 1
            else:
                nb = tb.get(it.transmits)
                if nb is None:
                    nb = tb[it.transmits] = {}
                nb[it.key] = it
        return out
