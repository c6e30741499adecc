"""The node's periodic work on one deadline (pure): handoff retries, load sampling and
reports, transfer rounds, migration rounds, global-task syncs, placement back-offs.

Each mechanism has its next due time here; a `Wake` stimulus at `now` runs what is due
and ends with one `WakeAt` for the earliest next deadline, so the runtime keeps a
single deadline loop instead of one sleeping loop per mechanism.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import model as m
from ..policy import shares as sh
from ..policy.charges import Charges
from ..policy.sharing import Sharing
from ..policy.view import LoadView
from . import events as ev

HANDOFF_BUSY = 0.2  # retries are due only while something is in flight:
HANDOFF_IDLE = 1.0  # idle nodes wake rarely
GLOBALS_SOME = 10.0  # the timer that catches joins of the view (gossip kicks sooner)
GLOBALS_NONE = 30.0
USAGE_EVERY = 60.0  # seconds between journal writes of this node's fair-share usage


class Timers:
    """The timers of NodeState (state.py), which holds the fields below."""

    due: dict[str, float]
    report_interval: float
    transfer_interval: float | None
    migration_period: float | None
    globals: sh.GlobalTasks
    view: LoadView
    charges: Charges
    jobs: dict[m.TaskId, Any]
    sharing: Sharing
    quota_epoch: int
    quota_memo: dict[str, tuple[int, str]]
    gang_coords: dict[m.TaskId, Any]
    hedger: Any  # backups.py (None: off)

    if TYPE_CHECKING:  # provided by the other parts of NodeState

        def tick(self, now: float, wall: float) -> list[ev.Instruction]: ...
        def handoff_busy(self) -> bool: ...
        def step(self, tid: m.TaskId, now: float, wall: float) -> list[ev.Instruction]: ...
        def jobs_not_offered(self) -> list[m.TaskId]: ...
        def usage_record(self, wall: float) -> ev.Persist: ...
        def gang_tick(self, now: float, wall: float) -> list[ev.Instruction]: ...
        def array_tick(self, now: float, wall: float) -> list[ev.Instruction]: ...
        def array_fill(self, now: float, wall: float) -> list[ev.Instruction]: ...
        def deps_tick(self, now: float, wall: float) -> list[ev.Instruction]: ...
        def backup_tick(self, now: float, wall: float) -> list[ev.Instruction]: ...
        def gang_view_changed(self, now: float, wall: float) -> list[ev.Instruction]: ...

    def start_timers(self, now: float) -> list[ev.Instruction]:
        """When the runtime starts: a report at once, the rest after their period."""
        self.due = {
            "report": now,
            "handoff": now + (HANDOFF_BUSY if self.handoff_busy() else HANDOFF_IDLE),
            "globals": now + (GLOBALS_SOME if self.globals.members else GLOBALS_NONE),
            "usage": now + USAGE_EVERY,
        }
        if self.transfer_interval is not None:
            self.due["transfer"] = now + self.transfer_interval
        if self.migration_period is not None:
            self.due["migration"] = now + self.migration_period
        if self.hedger is not None:  # the open backup races found again after a restart
            self.due["backups"] = now
        return [ev.WakeAt(min(self.due.values()))]

    def wake_all(self, now: float, wall: float) -> list[ev.Instruction]:
        """Run what is due at `now`; end with the next deadline."""
        out: list[ev.Instruction] = []
        due = self.due
        if due and now >= due["handoff"]:
            out += self.tick(now, wall)
            due["handoff"] = now + (HANDOFF_BUSY if self.handoff_busy() else HANDOFF_IDLE)
        if due and now >= due["report"]:
            out.append(ev.Sample())
            due["report"] = now + self.report_interval
            if self.quota_memo:  # a refusal may lapse with time alone (quota-lag)
                self.quota_memo.clear()
                out.append(ev.KickRunner())
        if "usage" in due and now >= due["usage"]:
            out.append(self.usage_record(wall))
            due["usage"] = now + USAGE_EVERY
        if "transfer" in due and now >= due["transfer"] and self.transfer_interval is not None:
            out.append(ev.TransferRound())
            due["transfer"] = now + self.transfer_interval
        if "migration" in due and now >= due["migration"] and self.migration_period is not None:
            out.append(ev.MigrationRound())
            due["migration"] = now + self.migration_period
        if due and now >= due["globals"]:
            out.append(ev.SyncGlobals())
            due["globals"] = now + (GLOBALS_SOME if self.globals.members else GLOBALS_NONE)
        if "gangs" in due and now >= due["gangs"]:
            out += self.gang_tick(now, wall)
        if "arrays" in due and now >= due["arrays"]:
            out += self.array_tick(now, wall)
        if "array_fill" in due and now >= due["array_fill"]:
            out += self.array_fill(now, wall)
        if "deps" in due and now >= due["deps"]:
            out += self.deps_tick(now, wall)
        if "backups" in due and now >= due["backups"]:
            out += self.backup_tick(now, wall)
        for tid in self.jobs_not_offered():
            out += self.step(tid, now, wall)
        if due:
            out.append(ev.WakeAt(min(due.values())))
        return out

    def on_peer_report(
        self, report: m.LoadReport, at: float, now: float, wall: float
    ) -> list[ev.Instruction]:
        """A peer's load report came by gossip: the view takes it; a peer that
        undrained lets held global tasks start now (not at the timer: commit 2abae3e);
        placements waiting on a back-off look again."""
        prev = self.view.get(report.node)
        self.view.upsert(self.charges.on_report(report, now), at)
        out: list[ev.Instruction] = []
        if report.shares > 0 and prev is not None and prev.report.shares <= 0:
            out.append(ev.SyncGlobals())
        if prev is None or report.groups != prev.report.groups:
            self.quota_epoch += 1  # what the quota gate read has changed
            if any(
                g.quota_max is not None and _rows(report, g.name) != _rows(prev, g.name)
                for g in self.sharing.groups
            ):
                out.append(ev.KickRunner())  # a capped group's share may have freed up
        for tid in self.jobs_not_offered():
            out += self.step(tid, now, wall)
        if self.gang_coords:
            out += self.gang_view_changed(now, wall)
        return out

    def shares_changed(self) -> list[ev.Instruction]:
        """This node's shares changed (drain, undrain, `swarm shares`): publish, and let
        global tasks that a cluster without shares held back start now."""
        return [ev.PublishLoad(), ev.SyncGlobals()]


def _rows(r: m.LoadReport | Any, group: str) -> tuple[tuple[str, int, int], ...]:
    """A report's rows for one group (`r` a LoadReport or a view entry, or None)."""
    if r is None:
        return ()
    report = r if isinstance(r, m.LoadReport) else r.report
    return tuple(x for x in report.groups if x[0] == group)
