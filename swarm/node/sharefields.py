"""What a node's load report says for fair share, preemption and quotas (pure; issue
20), kept within its part of a gossip datagram: its weight per priority value
(`bands`), its queued and running slots per group (`groups`) and its own decayed
usage per principal (`usage`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import limits as lim
from ..policy import fairness as fair


def top_bands(bands: Mapping[int, float]) -> tuple[tuple[int, float], ...]:
    """At most MAX_REPORT_BANDS priorities: the lowest ones are merged into the
    lowest band kept (they are the preemptible end: merged upward, never hidden)."""
    items = sorted(bands.items(), reverse=True)
    if len(items) > lim.MAX_REPORT_BANDS:
        keep = items[: lim.MAX_REPORT_BANDS - 1]
        rest = sum(w for _, w in items[lim.MAX_REPORT_BANDS - 1 :])
        keep.append((items[lim.MAX_REPORT_BANDS - 1][0], rest))
        items = keep
    return tuple(sorted(items))


def _size(row: tuple[Any, ...]) -> int:
    """About what a row costs in a datagram (msgpack: a string, small ints, floats)."""
    return 2 + sum(len(x) + 1 if isinstance(x, str) else 9 for x in row)


def fit(
    bands: tuple[tuple[int, float], ...],
    groups: list[tuple[str, int, int]],
    usage: list[tuple[Any, ...]],
) -> dict[str, Any]:
    """The three share fields within lim.REPORT_SHARE_BYTES: the least used principals
    are summed into OTHERS first, then the smallest groups are left out (their demand
    is then unseen by the others: a quota's floor bounds what that costs)."""
    total = sum(map(_size, bands)) + sum(map(_size, groups)) + sum(map(_size, usage))
    while total > lim.REPORT_SHARE_BYTES and len(usage) > 1:
        a = usage.pop()
        b = usage.pop()
        merged = (fair.OTHERS, *(x + y for x, y in zip(a[1:], b[1:], strict=True)))
        total += _size(merged) - _size(a) - _size(b)
        usage.append(merged)
    while total > lim.REPORT_SHARE_BYTES and groups:
        total -= _size(groups.pop())
    return {"bands": bands, "groups": tuple(groups), "usage": tuple(sorted(usage))}
