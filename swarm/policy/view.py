"""The stale peer load view the policies read, and O(1) uniform sampling over it.

The membership layer owns the view; policies only read it. Any
``Mapping[NodeId, PeerInfo]`` works, but sampling from a plain mapping must first copy
its keys (O(n)). ``LoadView`` keeps the keys in an array as well, so ``key_at(i)`` is
O(1) and the policies sample d peers in O(d) even at 10,000 nodes. Give the policies a
``LoadView`` (or anything with ``key_at`` and ``__len__``) wherever the view is large.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol

import attrs

from swarm.model import LoadReport, NodeId


class PeerInfo(Protocol):
    """What a policy needs from one view entry: the newest report and when it came."""

    @property
    def report(self) -> LoadReport: ...

    @property
    def received_at(self) -> float: ...


@attrs.frozen
class PeerEntry:
    """The plain implementation of PeerInfo (tests, the simulator)."""

    report: LoadReport
    received_at: float


class LoadView(Mapping[NodeId, PeerInfo]):
    """A mutable mapping with O(1) insert, delete and indexed key access.

    Deletion swaps the last key into the hole, so key order changes; sampling only needs
    every key to sit at exactly one index.
    """

    __slots__ = ("_entries", "_index", "_keys")

    def __init__(self, entries: Mapping[NodeId, PeerInfo] | None = None) -> None:
        self._entries: dict[NodeId, PeerInfo] = {}
        self._keys: list[NodeId] = []
        self._index: dict[NodeId, int] = {}
        if entries:
            for node, entry in entries.items():
                self.put(node, entry)

    def put(self, node: NodeId, entry: PeerInfo) -> None:
        if node not in self._entries:
            self._index[node] = len(self._keys)
            self._keys.append(node)
        self._entries[node] = entry

    def upsert(self, report: LoadReport, received_at: float) -> None:
        self.put(report.node, PeerEntry(report, received_at))

    def remove(self, node: NodeId) -> None:
        """Forget `node`; absent nodes are ignored (membership may say dead twice)."""
        if node not in self._entries:
            return
        del self._entries[node]
        i = self._index.pop(node)
        last = self._keys.pop()
        if last != node:
            self._keys[i] = last
            self._index[last] = i

    def key_at(self, i: int) -> NodeId:
        return self._keys[i]

    def __getitem__(self, node: NodeId) -> PeerInfo:
        return self._entries[node]

    def __contains__(self, node: object) -> bool:
        return node in self._entries

    def __iter__(self) -> Iterator[NodeId]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._entries)


def charged(entry: PeerInfo, weight: float) -> PeerEntry:
    """`entry` with one more task of `weight` queued there: what a home assumes of a peer
    it just offered a task to, until the peer's next report says what it really has.
    Without it a burst of placements (an array's elements) all read the same stale
    report and pile onto whichever peer looked least loaded when it was sent."""
    r = entry.report
    return PeerEntry(
        attrs.evolve(r, weight_sum=r.weight_sum + weight, queued=r.queued + 1),
        entry.received_at,
    )


def indexed_keys(view: Mapping[NodeId, PeerInfo]) -> Callable[[int], NodeId]:
    """An O(1) index -> key function for `view`: its own when it has one, else a copy."""
    key_at = getattr(view, "key_at", None)
    if callable(key_at):
        return key_at  # type: ignore[no-any-return]
    keys: Sequence[NodeId] = list(view)
    return keys.__getitem__


Verdict = Callable[[NodeId, PeerInfo], str | None]
"""Returns None when the peer is acceptable, or why it is not."""


@attrs.frozen
class Sample:
    """Result of sampling: accepted peers (in draw order) and the rejected ones seen."""

    chosen: tuple[NodeId, ...]
    rejected: tuple[tuple[NodeId, str], ...]
    # Eligible peers seen but not drawn (only filled by a full scan, for explain).
    unchosen: tuple[NodeId, ...]
    scanned: bool  # True: every peer was examined; False: rejection sampling
    examined: int  # how many distinct peers were examined


def sample_peers(
    view: Mapping[NodeId, PeerInfo],
    k: int,
    rng: random.Random,
    verdict: Verdict,
    *,
    skip: NodeId | None = None,
    scan_below: int = 64,
    max_attempts: int | None = None,
) -> Sample:
    """Draw up to `k` distinct peers uniformly among those `verdict` accepts.

    Views of at most `scan_below` entries are filtered completely and then sampled, so
    a rare eligible peer is always found. Larger views use rejection sampling: draw a
    random index, skip repeats, test it; stop after `max_attempts` draws (default
    8*k + 32). The accepted peers are a uniform sample of the eligible ones either way;
    with bounded draws the large-view path may return fewer than k when eligible peers
    are rare, which is the price of never scanning 10,000 entries per decision.
    `skip` (the local node) is never chosen and never counted.
    """
    n = len(view)
    if k <= 0 or n == 0:
        return Sample((), (), (), scanned=True, examined=0)
    if n <= scan_below:
        eligible: list[NodeId] = []
        rejected: list[tuple[NodeId, str]] = []
        for node, entry in view.items():
            if node == skip:
                continue
            why = verdict(node, entry)
            if why is None:
                eligible.append(node)
            else:
                rejected.append((node, why))
        if len(eligible) <= k:
            chosen = list(eligible)
            rng.shuffle(chosen)
        else:
            chosen = rng.sample(eligible, k)
        picked = set(chosen)
        unchosen = tuple(x for x in eligible if x not in picked)
        return Sample(
            tuple(chosen),
            tuple(rejected),
            unchosen,
            scanned=True,
            examined=len(eligible) + len(rejected),
        )

    key_at = indexed_keys(view)
    attempts = 8 * k + 32 if max_attempts is None else max_attempts
    seen: set[NodeId] = set()
    got: list[NodeId] = []
    rej: list[tuple[NodeId, str]] = []
    rand = rng.random  # int(random() * n): uniform for any view size, ~3x cheaper than randrange
    for _ in range(attempts):
        node = key_at(int(rand() * n))
        if node in seen or node == skip:
            continue
        seen.add(node)
        why = verdict(node, view[node])
        if why is None:
            got.append(node)
            if len(got) >= k:
                break
        else:
            rej.append((node, why))
    return Sample(tuple(got), tuple(rej), (), scanned=False, examined=len(seen))
