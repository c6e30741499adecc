"""What a home has handed to each peer that the peer's reports may not show yet (pure).

A burst of placements (an array's elements) reads load reports a few hundred ms old,
so each offer is charged to its target's view entry (`view.charged`) until the peer
says what it really holds. Until issue 23's second round the *next* report wiped every
charge; but a report that left the peer before it took the latest offers shows none
of them, so those tasks vanished from the home's view and the next placements piled
onto that peer: the home took only 0.84-0.90 of its share of a 10,000-element array
and the smaller peers 1.06-1.13 of theirs (docs/benchmarks.md).

Now a peer stamps its "yes" to an offer with its own wall clock in ms (`Reply.at`),
the clock its reports' versions are made from (`LoadReport.version` is that clock in
ms when the report was made, or one more than the last). A report whose version is
past the stamp was made after the peer took the task, so it counts it: that charge
goes. A report made before keeps it. Both numbers come from the peer's clock, so the
home's clock and any skew between them do not matter. A charge not yet answered stays
(the task is on its way); one whose offer failed goes at once; a peer that answers
without a stamp (`at` 0) is treated as before, its next report wipes the charge.
`MAX_AGE` bounds what a lost answer or a peer's odd clock could leave standing.
"""

from __future__ import annotations

import attrs

from ..model import LoadReport, NodeId, TaskId

MAX_AGE = 10.0  # seconds (the home's clock) a charge lives at most
UNANSWERED = 0  # stamp of an offer not answered yet
UNSTAMPED = -1  # answered by a peer that gives no stamp: the next report wipes it


@attrs.define
class Charge:
    weight: float
    made: float  # the home's monotonic clock when it was charged
    stamp: int = UNANSWERED  # the peer's wall clock (ms) when it took the task


def counts(c: Charge, report: LoadReport) -> bool:
    """Does `report` still lack the charged task (so the charge stays on top of it)?"""
    if c.stamp == UNANSWERED:
        return True
    if c.stamp == UNSTAMPED:
        return False
    return report.version <= c.stamp


def with_charges(report: LoadReport, charges: list[Charge]) -> LoadReport:
    """`report` with each charge counted as one more queued task of its weight."""
    if not charges:
        return report
    return attrs.evolve(
        report,
        weight_sum=report.weight_sum + sum(c.weight for c in charges),
        queued=report.queued + len(charges),
    )


class Charges:
    """Per peer, the tasks this home offered it that its newest report may lack."""

    def __init__(self) -> None:
        self.by_node: dict[NodeId, dict[TaskId, Charge]] = {}

    def add(self, node: NodeId, tid: TaskId, weight: float, now: float) -> bool:
        """Charge `tid` to `node`; False if it already was (charged once, not twice)."""
        per = self.by_node.setdefault(node, {})
        if tid in per:
            return False
        per[tid] = Charge(weight, now)
        return True

    def answered(self, node: NodeId, tid: TaskId, stamp: int) -> None:
        """The peer took `tid` at `stamp` (its wall clock, ms; 0: it gave none)."""
        c = self.by_node.get(node, {}).get(tid)
        if c is not None:
            c.stamp = stamp if stamp > 0 else UNSTAMPED

    def drop(self, node: NodeId, tid: TaskId) -> None:
        """The offer failed: the peer never took it."""
        per = self.by_node.get(node)
        if per is not None:
            per.pop(tid, None)

    def forget(self, node: NodeId) -> None:
        self.by_node.pop(node, None)

    def on_report(self, report: LoadReport, now: float) -> LoadReport:
        """A new report from a peer: the charges it already counts (or that are too old)
        go; what is returned is the report with the rest added, for the view."""
        per = self.by_node.get(report.node)
        if not per:
            return report
        kept = {tid: c for tid, c in per.items() if now - c.made <= MAX_AGE and counts(c, report)}
        if kept:
            self.by_node[report.node] = kept
        else:
            del self.by_node[report.node]
        return with_charges(report, list(kept.values()))

    def pending(self, node: NodeId) -> int:
        return len(self.by_node.get(node, {}))
