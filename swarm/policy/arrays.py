"""Task arrays (issue 23, pure): the `--array` grammar, lazy elements, `{index}`.

`swarm submit --array 0-9999%50 -- cmd` submits one array record; its elements are
created lazily by the home (Slurm's way: one record, not 10,000), each with
`SWARM_ARRAY_ID` / `SWARM_ARRAY_INDEX` and `{index}` replaced in its argv, and at most
`%K` of them running at once cluster-wide.

Grammar (as Slurm's `--array`): `ITEM[,ITEM...][%CAP]`, where an ITEM is `N`, `N-M`
or `N-M:STEP`; indices are integers 0..MAX_INDEX. Items may come in any order but
may not share an index. The number of elements is bounded (`max_elements`, option
`array-max`, default 1,000,000), so a typo cannot create a billion records' worth of
work. Every error is one line naming the field `array`.

An `ArraySpec` keeps the ranges, never the list of indices: `len`, `nth(k)` (the k-th
element in ascending order, for lazy creation), `in` and iteration are computed.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterator, Sequence

import attrs

MAX_INDEX = 2**31 - 1
MAX_ELEMENTS = 1_000_000  # the default of option `array-max`
MAX_TEXT = 4096
_ITEM = re.compile(r"^(\d{1,10})(?:-(\d{1,10})(?::(\d{1,10}))?)?$")
_INDEX = re.compile(r"\{\{index\}\}|\{index\}")


class ArrayError(ValueError):
    """A bad `--array`: the message names the field and what is wrong."""


@attrs.frozen
class Run:
    """start, start + step, ..., up to last (inclusive; last is on the step)."""

    start: int
    last: int
    step: int = 1

    def __len__(self) -> int:
        return (self.last - self.start) // self.step + 1

    def __contains__(self, i: object) -> bool:
        return (
            isinstance(i, int)
            and self.start <= i <= self.last
            and (i - self.start) % self.step == 0
        )

    def text(self) -> str:
        if self.start == self.last:
            return str(self.start)
        return f"{self.start}-{self.last}" + (f":{self.step}" if self.step != 1 else "")


@attrs.frozen
class ArraySpec:
    runs: tuple[Run, ...]  # ascending, disjoint
    cap: int = 0  # at most this many elements running at once (0: no cap)
    _ends: tuple[int, ...] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        ends, total = [], 0
        for r in self.runs:
            total += len(r)
            ends.append(total)
        object.__setattr__(self, "_ends", tuple(ends))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __iter__(self) -> Iterator[int]:
        for r in self.runs:
            yield from range(r.start, r.last + 1, r.step)

    def __contains__(self, i: object) -> bool:
        return any(i in r for r in self.runs)

    def nth(self, k: int) -> int:
        """The k-th index in ascending order (0-based): element k, created lazily."""
        if not 0 <= k < len(self):
            raise IndexError(f"array element {k} of {len(self)}")
        j = bisect.bisect_right(self._ends, k)
        before = self._ends[j - 1] if j else 0
        r = self.runs[j]
        return r.start + (k - before) * r.step

    def text(self) -> str:
        """The canonical form (what `swarm ps` and the journal show)."""
        body = ",".join(r.text() for r in self.runs)
        return body + (f"%{self.cap}" if self.cap else "")


def parse_array(text: str, max_elements: int = MAX_ELEMENTS) -> ArraySpec:
    """`0-9999%50`, `1,5,7-9`, `0-15:4` -> an ArraySpec, or ArrayError naming the field."""
    if not isinstance(text, str) or not text.strip():
        raise ArrayError("array: empty; give indices like 0-99, 1,5,7-9 or 0-999%50")
    if len(text) > MAX_TEXT:
        raise ArrayError(f"array: longer than {MAX_TEXT} characters")
    body, pct, cap_text = text.strip().partition("%")
    cap = 0
    if pct:
        if not cap_text.isdigit() or len(cap_text) > 10:
            raise ArrayError(f"array: the cap after % must be a whole number, got {cap_text!r:.40}")
        cap = int(cap_text)
        if cap < 1:
            raise ArrayError("array: the cap %0 would run nothing; give %1 or more (or no cap)")
    runs: list[Run] = []
    for item in body.split(","):
        runs.append(_run(item.strip()))
    runs.sort(key=lambda r: r.start)
    _disjoint(runs)
    total = sum(len(r) for r in runs)
    if total > max_elements:
        raise ArrayError(
            f"array: {total:,} elements, more than the most allowed "
            f"({max_elements:,}, option array-max)"
        )
    return ArraySpec(tuple(runs), cap)


def _run(item: str) -> Run:
    m = _ITEM.match(item)
    if not m:
        raise ArrayError(f"array: {item!r:.40} is not N, N-M or N-M:STEP (whole numbers from 0)")
    start = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else start
    step = int(m.group(3)) if m.group(3) is not None else 1
    if max(start, last) > MAX_INDEX:
        raise ArrayError(f"array: {item!r:.40} has an index above {MAX_INDEX}")
    if last < start:
        raise ArrayError(f"array: {item!r:.40} ends before it starts")
    if step < 1:
        raise ArrayError(f"array: {item!r:.40} has a step of 0")
    last = start + (last - start) // step * step
    return Run(start, last, step if last > start else 1)


def _disjoint(runs: Sequence[Run]) -> None:
    """Sorted runs do not overlap: elements then come in ascending order, run by run,
    which keeps `nth` a binary search. Ranges that only interleave (0-10:2,1-9:2) are
    refused too; write them as one range."""
    for a, b in itertools.pairwise(runs):
        if b.start <= a.last:
            shared = _first_shared(a, b)
            if shared is not None:
                raise ArrayError(
                    f"array: index {shared} is given twice ({a.text()} and {b.text()})"
                )
            raise ArrayError(
                f"array: {a.text()} and {b.text()} interleave; give ranges that do not overlap"
            )


def _first_shared(a: Run, b: Run) -> int | None:
    """The smallest index in both runs, or None (small steps: checked arithmetically)."""
    lo, hi = max(a.start, b.start), min(a.last, b.last)
    if lo > hi:
        return None
    # walk the run with the larger step inside [lo, hi]; at most max(step) checks
    big, small = (a, b) if a.step >= b.step else (b, a)
    first = big.start + -(-(lo - big.start) // big.step) * big.step
    for k, i in enumerate(range(first, hi + 1, big.step)):
        if i in small:
            return i
        if k > small.step:  # the residues repeat after small.step steps
            return None
    return None


def element_argv(argv: Sequence[str], index: int) -> tuple[str, ...]:
    """The element's argv: `{index}` becomes the index; `{{index}}` stays `{index}`.
    Nothing else is touched (an argv is data: no other expansion, no shell)."""

    def sub(m: re.Match[str]) -> str:
        return "{index}" if m.group(0) == "{{index}}" else str(index)

    return tuple(_INDEX.sub(sub, a) if "{" in a else a for a in argv)


def element_env(array_id: str, index: int) -> dict[str, str]:
    return {"SWARM_ARRAY_ID": array_id, "SWARM_ARRAY_INDEX": str(index)}
