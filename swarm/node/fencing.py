"""`--at-most-once`: never two copies of a task running at once (issue 19).

Why: the home re-places a task whose runner it believes dead. A runner that was only
paused or cut off still runs it: two copies (the chaos suite saw 2.5% of tasks run
twice). For tasks submitted with `--at-most-once` the runner holds a lease from the
home, and the task's supervisor (runtime/swarm_shim.c), which goes on working while
the agent is paused, killed or cut off, kills the task when the lease lapses. The
home places the task again only once the lease it granted last has surely lapsed.

The lease, and why it is safe (Gray & Cheriton's leases, as Chubby's):
- The runner asks (`lease` request) for the task at the epoch it holds, and notes
  when it sent the question (`asked_at`, its own clock). The home grants only to the
  current holder of the current epoch (phase REMOTE) and notes when it granted
  (`granted`, its clock).
- A grant makes the runner's lease last until `asked_at + ttl` on the runner's
  clock. The question left before the grant was made, so that instant is before
  `granted + ttl` in real time, whatever the delays; with clock rates that differ
  by at most FENCE_DRIFT, the home waits `ttl * (1 + FENCE_DRIFT) + FENCE_MARGIN`
  after its last grant before it places the task again (`fence_hold`).
- A runner starts a task only with at least half a ttl left on its lease, writes
  the deadline into the supervisor's lease file before the start, and asks again
  every third of a ttl while it runs. A home restarted from its journal does not
  know its last grants: it holds every task it has placed for a full lease after
  its first tick.
- A run the supervisor fenced is reported as `fenced`: no copy runs, and the home
  places the task again at once (a new attempt), or marks a `--no-retry` task lost.
- Failover does not run an `--at-most-once` task anywhere else (failover.py): a
  home that is only cut off may place it again on its side. Such a task whose home
  is gone for good ends `lost` with that reason; resubmit it.

What it costs: one small request per running fenced task every ttl/3 (default every
~3.3 s), one round trip before each remote start, and work lost when a pause or a
partition outlasts the ttl (a false fence).

A task run by its home needs no lease: only its home could place it again.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs

from .. import model as m
from ..cluster import handoff as h
from . import events as ev

FENCE_TTL = 10.0  # seconds: the default lease (option `fence-ttl`)
FENCE_DRIFT = 0.01  # clock-rate difference allowed between two nodes (NTP keeps 500 ppm)
FENCE_MARGIN = 1.0  # seconds, on top: scheduling and the supervisor's 0.1 s poll
START_LEFT = 0.5  # a start needs this fraction of the ttl left on its lease
RENEW_AFTER = 1 / 3  # a running task's lease is renewed after this fraction of the ttl
ASK_AGAIN = 1.0  # seconds before a question without an answer is asked again
FENCED = "fenced"  # the runner's reason for a run its supervisor stopped starts so


def fenced(spec: m.TaskSpec) -> str:
    """The runner's reason for a run its supervisor fenced (it reports `fenced`)."""
    if spec.member is not None:  # a gang member (node/gangs.py)
        return f"{FENCED}: its gang's run lease from {spec.member.home} lapsed"
    return f"{FENCED}: its lease from {spec.home} lapsed (--at-most-once)"


@attrs.define
class RunnerLease:
    """The lease a runner holds for one task (at one epoch of one home)."""

    home: m.NodeId
    epoch: int
    until: float = -math.inf  # this node's clock: when the supervisor fences the task
    asked_at: float | None = None  # when the last question left (none again for ASK_AGAIN)


class Fencing:
    """The lease rules of NodeState (state.py), runner side and home side."""

    node: m.NodeId
    fence_ttl: float
    fence_leases: dict[m.TaskId, RunnerLease]
    fence_granted: dict[m.TaskId, float]
    fence_since: float | None
    running: Any
    queued: Any
    records: Any
    counters: dict[str, int]

    if TYPE_CHECKING:  # provided by the other parts of NodeState

        @property
        def home(self) -> h.HomeSide: ...
        @property
        def guest(self) -> h.GuestSide: ...

    # ------------------------------------------------------------ runner side

    def fenced_here(self, spec: m.TaskSpec) -> bool:
        """Does running `spec` here need a lease? (A task run by its home: no.)"""
        return spec.at_most_once and spec.home != self.node and not spec.is_global

    def fence_gate(self, task: m.Task, now: float) -> tuple[str | None, list[ev.Instruction]]:
        """The start gate's part: (why it must wait, the question to send)."""
        if not self.fenced_here(task.spec):
            return None, []
        e = self.guest.entries.get(task.id)
        if e is None or not self.guest.may_run(task.id):
            return "handoff not settled", []  # no lease before the home's commit
        fl = self.fence_leases.get(task.id)
        if fl is None or (fl.home, fl.epoch) != (e.home, e.epoch):
            fl = self.fence_leases[task.id] = RunnerLease(e.home, e.epoch)
        if fl.until - now >= START_LEFT * self.fence_ttl:
            return None, []
        return f"waiting for its lease from {e.home} (--at-most-once)", self._ask(task.id, fl, now)

    def fence_deadline(self, tid: m.TaskId) -> float | None:
        """The lease deadline (this node's clock) a start writes for its supervisor."""
        fl = self.fence_leases.get(tid)
        return None if fl is None else fl.until

    def _ask(self, tid: m.TaskId, fl: RunnerLease, now: float) -> list[ev.Instruction]:
        if fl.asked_at is not None and now - fl.asked_at < ASK_AGAIN:
            return []
        fl.asked_at = now
        self.counters["leases_asked"] = self.counters.get("leases_asked", 0) + 1
        return [ev.AskLease(fl.home, tid, fl.epoch, now)]

    def on_lease_answer(
        self, tid: m.TaskId, epoch: int, asked_at: float, granted: bool, why: str, now: float
    ) -> list[ev.Instruction]:
        """The home's answer to the question sent at `asked_at` (False with `why`: it
        did not grant, or did not answer). A refusal changes nothing here: the run,
        if any, is fenced when the lease it has lapses."""
        fl = self.fence_leases.get(tid)
        if fl is None or fl.epoch != epoch:
            return []
        if not granted:
            return [ev.log("info", "fence.not_granted", task=tid, home=fl.home, why=why)]
        until = asked_at + self.fence_ttl
        if until <= fl.until:
            return []
        fl.until = until
        if tid in self.running:
            return [ev.RenewLease(tid, until)]
        return [ev.KickRunner()]  # a start waits for it

    def fence_tick(self, now: float) -> list[ev.Instruction]:
        """Renew the leases of the fenced tasks running here; forget the others."""
        if self.fence_since is None:
            self.fence_since = now
        out: list[ev.Instruction] = []
        for tid in self.running:
            # re-attached after a restart: its lease is in its supervisor's file
            # only; renewing it at once keeps it running
            t = self.records.active.get(tid)
            if tid not in self.fence_leases and t is not None and self.fenced_here(t.spec):
                e = self.guest.entries.get(tid)
                if e is not None:
                    self.fence_leases[tid] = RunnerLease(e.home, e.epoch)
        for tid, fl in list(self.fence_leases.items()):
            if tid in self.running:
                if now >= fl.until - (1 - RENEW_AFTER) * self.fence_ttl:
                    out += self._ask(tid, fl, now)
            elif tid not in self.guest.entries:
                del self.fence_leases[tid]
            elif tid in self.queued and fl.until - now < START_LEFT * self.fence_ttl:
                out += self._ask(tid, fl, now)  # a start waits for it: the last went unanswered
        return out

    # -------------------------------------------------------------- home side

    def on_lease_request(
        self, sender: m.NodeId, tid: m.TaskId, epoch: int, now: float
    ) -> tuple[bool, str]:
        """Grant `sender` a lease for `tid` at `epoch`? Only to its current holder."""
        e = self.home.entries.get(tid)
        if e is None:
            return False, "no such task here"
        if e.phase is not h.HomePhase.REMOTE or e.where != sender or e.epoch != epoch:
            self.counters["leases_refused"] = self.counters.get("leases_refused", 0) + 1
            return False, f"not yours: epoch {e.epoch} at {e.where or '?'} ({e.phase.value})"
        self.counters["leases_granted"] = self.counters.get("leases_granted", 0) + 1
        self.fence_granted[tid] = now
        return True, ""

    def fence_hold(self, t: m.Task, now: float) -> float | None:
        """Until when a fenced task may not be placed again (None: it may now): a
        lease its last holder may still hold must have lapsed first."""
        if not t.spec.at_most_once:
            return None
        granted = self.fence_granted.get(t.id)
        if granted is None:
            # restarted: our last grants are unknown, so every lease we might have
            # given counts as given at our first tick
            if self.fence_since is None or not self._placed_out(t.id):
                return None
            granted = self.fence_since
        until = granted + self.fence_ttl * (1 + FENCE_DRIFT) + FENCE_MARGIN
        if now >= until:
            self.fence_granted.pop(t.id, None)
            return None
        return until

    def _placed_out(self, tid: m.TaskId) -> bool:
        """Has this task been placed on another node at some epoch (a lease was
        possible)? Its entry's epoch counts placements; 0 is never placed."""
        e = self.home.entries.get(tid)
        return e is not None and e.epoch > 0

    def fence_ended(self, tid: m.TaskId) -> None:
        """No copy of `tid` runs anywhere (reported ended or fenced)."""
        self.fence_granted.pop(tid, None)
