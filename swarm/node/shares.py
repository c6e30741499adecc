"""Changes of this node's shares (`swarm shares`, `drain`, `undrain`), pure.

Rules: a cut (a drain) takes effect at once, before it is journaled, so no task starts
while the write is in flight; a raise takes effect once its write is on disk; the
shares an undrain gives back are the ones the last drain took away (journaled with
it). Each change has a sequence number, and a change's landing never overrides a
later change's: whatever order the writes complete in, the ledger ends at the last
change asked for, which is also the journal's last (commit 423d5ed: a slow drain's
write landing after the undrain left the node drained in memory, undrained on disk).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .. import model as m
from ..policy import shares as sh
from . import events as ev

SHARES_KEY = "shares"
UNDRAIN_KEY = "undrain_shares"
FALLBACK_SHARES = 1024  # an undrain's value when nothing better is known


class ShareRequestError(ValueError):
    """A request that asks for two things at once."""


@attrs.frozen
class ShareChange:
    seq: int
    old: int
    new: int
    drain: bool
    ops: tuple[ev.Put, ...]  # to journal durably, then `landed(seq)`
    undrain_before: int  # what an undrain gave back before this change


class ShareChanges:
    def __init__(self, ledger: sh.ShareLedger, default_shares: int) -> None:
        self.ledger = ledger
        self.default_shares = default_shares  # the configured shares: an undrain's default
        self.undrain_to = 0  # shares to restore on undrain (0: the default)
        self.decided = 0  # sequence of changes asked for
        self.applied = 0  # the latest change whose value the ledger holds
        self.pending: dict[int, ShareChange] = {}

    def restore(self, kv: Mapping[str, Any]) -> None:
        """At start-up, from the journal: the shares (a drain survives a restart) and
        the shares an undrain gives back."""
        shares = kv.get(SHARES_KEY)
        if isinstance(shares, int) and shares >= 0:
            self.ledger.set_shares(shares)
        undrain = kv.get(UNDRAIN_KEY)
        if isinstance(undrain, int) and undrain > 0:
            self.undrain_to = undrain

    def decide(self, value: int | None, drain: bool, undrain: bool) -> ShareChange | None:
        """A change asked for (None: nothing to change). A cut applies now."""
        if drain and (undrain or value is not None):
            raise ShareRequestError("shares: drain takes no other field")
        old = self.ledger.shares
        ops: list[ev.Put] = []
        if drain:
            value = 0
            if old > 0:
                ops.append(ev.Put(UNDRAIN_KEY, old))
        elif undrain and value is None:
            saved = self.undrain_to if self.undrain_to else self.default_shares
            value = saved if saved > 0 else FALLBACK_SHARES
        if value is None:
            return None
        self.decided += 1
        change = ShareChange(
            self.decided, old, value, drain, (ev.Put(SHARES_KEY, value), *ops), self.undrain_to
        )
        self.pending[change.seq] = change
        if drain and old > 0:
            self.undrain_to = old  # an undrain asked for next gives these back
        if value < old:
            self._apply(change.seq, value)
        return change

    def landed(self, seq: int) -> list[ev.Instruction]:
        """The change's write is on disk: it takes effect, unless a later one has."""
        change = self.pending.pop(seq)
        self._apply(seq, change.new)
        draining = change.new == 0
        return [
            ev.log("info", "agent.shares", old=change.old, new=change.new, draining=draining),
            ev.PublishLoad(),
            ev.SyncGlobals(),
            ev.KickRunner(),
        ]

    def failed(self, seq: int) -> None:
        """The change's write failed: it never happened (a cut is taken back, unless a
        later change has set the shares since)."""
        change = self.pending.pop(seq)
        if change.drain and seq == self.decided:
            self.undrain_to = change.undrain_before
        if self.applied == seq:
            self.ledger.set_shares(change.old)
            self.applied = max([0, *(s for s in self.pending if s < seq)])

    def _apply(self, seq: int, value: int) -> None:
        if seq >= self.applied:
            self.ledger.set_shares(value)
            self.applied = seq

    def answer(self) -> dict[str, m.NodeId | int | bool]:
        return {"shares": self.ledger.shares, "draining": self.ledger.draining}
