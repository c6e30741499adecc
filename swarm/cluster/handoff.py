"""Task handoff between a task's home and the node that executes it (pure).

The node where a task was submitted is its *home*: it owns the task's record and is
the only party that decides where the task lives. Each placement of a task on a node
is an *epoch* chosen by the home (strictly increasing per task). The rules:

1. A node may run a task only while it holds a *committed* guest entry whose epoch
   the home has confirmed (a Commit, or a "yours" answer to a Query), or, for the
   home itself, while its record says the task is local.
2. The home journals a commit before it sends it; a guest journals a pending entry
   before it accepts an offer. Every message is idempotent by (task id, epoch) and
   retried until answered, so loss and duplication only delay things.
3. Anything uncertain is resolved by asking the home (Query): a pending offer whose
   commit never came, a move whose answer was lost, and every committed entry after
   a guest restarts (it does not run them before the home says "yours").
4. Moving a queued task between two executors (work transfer) goes through the home:
   the holder marks it MOVING (never runs it while moving) and asks the home, which
   offers it to the new node and, once committed there, revokes the old holder.
5. Reports (running, finished) carry the epoch; the home accepts only reports of the
   current epoch from the current holder, so the recorded result is exactly-once even
   when a falsely-dead node ran a task a second time (at-least-once execution).

Both sides are plain objects with a `tick(now)` for retries; they never do I/O.
Outputs are `Send` (a request for the adapter to deliver; its reply or failure is fed
back) and decisions for the agent (journal a commit, enqueue a task, drop it...).
Decisions in one output list must be applied, durably, before that list's sends.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from typing import Any

import attrs

from .. import codec, wire
from ..model import NodeId, TaskId, TaskSpec

RETRY_BASE = 0.5
RETRY_MAX = 10.0
OFFER_TRIES = 4
PENDING_QUERY_AFTER = 3.0  # a pending offer with no commit: ask the home


def _backoff(tries: int) -> float:
    return float(min(RETRY_MAX, RETRY_BASE * (2 ** max(0, tries - 1))))


# --------------------------------------------------------------------- messages


@attrs.frozen
class Offer:
    task_id: TaskId
    epoch: int
    spec: TaskSpec


@attrs.frozen
class Commit:
    task_id: TaskId
    epoch: int


@attrs.frozen
class Abort:
    task_id: TaskId
    epoch: int


@attrs.frozen
class Query:
    task_id: TaskId
    epoch: int
    seq: int = 0  # the asker's phase counter: answers to older questions are ignored
    moving: bool = False  # asked while a move request is outstanding


@attrs.frozen
class MoveRequest:
    task_id: TaskId
    epoch: int
    target: NodeId


@attrs.frozen
class Revoke:
    task_id: TaskId
    epoch: int  # drop anything of this epoch or older


@attrs.frozen
class Cancel:
    task_id: TaskId
    epoch: int


@attrs.frozen
class Report:
    task_id: TaskId
    epoch: int
    state: str  # running | succeeded | failed | cancelled | fenced (node/fencing.py)
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    at: float = 0.0
    started: float = 0.0  # a final report: when its run started (runner's clock; 0 unknown)

    @property
    def final(self) -> bool:
        return self.state != "running"


class Verdict(enum.Enum):
    YOURS = "yours"  # committed to you at this epoch: run it
    GONE = "gone"  # not yours (aborted, superseded, unknown): drop it
    WAIT = "wait"  # undecided (offer in flight): ask again later


@attrs.frozen
class Reply:
    """The one reply type: `ok` plus what the request asked for."""

    task_id: TaskId
    epoch: int
    ok: bool
    verdict: Verdict | None = None
    reason: str = ""
    # a "yes" to an Offer: the runner's wall clock in ms when it took the task, on the
    # clock its load reports' versions come from (policy/charges.py); 0: not given
    at: int = 0


Request = Offer | Commit | Abort | Query | MoveRequest | Revoke | Cancel | Report

_KINDS: dict[type[Any], str] = {
    Offer: "offer",
    Commit: "commit",
    Abort: "abort",
    Query: "query",
    MoveRequest: "move",
    Revoke: "revoke",
    Cancel: "cancel",
    Report: "report",
}


def request_to_wire(r: Request) -> dict[str, Any]:
    d: dict[str, Any] = {"kind": _KINDS[type(r)], "task_id": r.task_id, "epoch": r.epoch}
    if isinstance(r, Offer):
        d["spec"] = codec.task_spec_to_wire(r.spec)
    elif isinstance(r, MoveRequest):
        d["target"] = r.target
    elif isinstance(r, Query):
        d.update(seq=r.seq, moving=r.moving)
    elif isinstance(r, Report):
        d.update(state=r.state, exit_code=r.exit_code, signal=r.signal, reason=r.reason, at=r.at)
        if r.started:
            d["started"] = r.started
    return d


def request_from_wire(obj: Any) -> Request:
    f = wire.Fields(obj, "handoff request")
    kind = f.str("kind", required=True, max_len=16)
    tid = f.task_id("task_id", required=True)
    epoch = f.int("epoch", required=True, lo=0)
    r: Request
    if kind == "offer":
        r = Offer(
            tid, epoch, wire.decode_with(codec.task_spec_from_wire, f.map("spec", required=True))
        )
    elif kind == "commit":
        r = Commit(tid, epoch)
    elif kind == "abort":
        r = Abort(tid, epoch)
    elif kind == "query":
        r = Query(tid, epoch, f.int("seq", 0, lo=0), f.bool("moving", False))
    elif kind == "move":
        r = MoveRequest(tid, epoch, f.str("target", required=True, max_len=256))
    elif kind == "revoke":
        r = Revoke(tid, epoch)
    elif kind == "cancel":
        r = Cancel(tid, epoch)
    elif kind == "report":
        state = f.str("state", required=True, max_len=16)
        if state not in ("running", "succeeded", "failed", "cancelled", "fenced"):
            raise wire.SchemaError(f"handoff report: bad state {state!r}")
        r = Report(
            tid,
            epoch,
            state,
            exit_code=f.int("exit_code"),
            signal=f.int("signal"),
            reason=f.str("reason", "", max_len=65536),
            at=f.float("at", 0.0),
            started=f.float("started", 0.0),
        )
    else:
        raise wire.SchemaError(f"handoff request: unknown kind {kind!r}")
    f.done()
    return r


def reply_to_wire(r: Reply) -> dict[str, Any]:
    return {
        "task_id": r.task_id,
        "epoch": r.epoch,
        "ok": r.ok,
        "verdict": None if r.verdict is None else r.verdict.value,
        "reason": r.reason,
        **({"at": r.at} if r.at else {}),
    }


def reply_from_wire(obj: Any) -> Reply:
    f = wire.Fields(obj, "handoff reply")
    r = Reply(
        task_id=f.task_id("task_id", required=True),
        epoch=f.int("epoch", required=True, lo=0),
        ok=f.bool("ok", required=True),
        verdict=f.enum("verdict", Verdict),
        reason=f.str("reason", "", max_len=65536),
        at=f.int("at", 0, lo=0, hi=2**62),
    )
    f.done()
    return r


# ------------------------------------------------------------ outputs/decisions


@attrs.frozen
class Send:
    dest: NodeId
    request: Request


# Home-side decisions
@attrs.frozen
class Committed:
    """Journal: the task now lives at `node` (epoch). Then the Commit is sent."""

    task_id: TaskId
    node: NodeId
    epoch: int


@attrs.frozen
class OfferFailed:
    """The offer was refused or unanswered: the task is back in the home's hands."""

    task_id: TaskId
    node: NodeId
    reason: str
    refused: bool  # True: the target said no; False: it did not answer


@attrs.frozen
class HolderLost:
    """The node holding the task died (membership says so): re-queue or mark lost."""

    task_id: TaskId
    node: NodeId
    fenced: bool = False  # not dead: its run was fenced (node/fencing.py)


@attrs.frozen
class Reported:
    """An accepted report of the current holder (journal it into the task record)."""

    task_id: TaskId
    node: NodeId
    report: Report


# Guest-side decisions
@attrs.frozen
class RunNow:
    """The task is committed here: put it in the local run queue."""

    task_id: TaskId


@attrs.frozen
class Drop:
    """Forget the task here; kill it first if it is running."""

    task_id: TaskId
    reason: str
    kill: bool = True


@attrs.frozen
class Kill:
    """Cancel requested by the home: terminate it (a final report follows)."""

    task_id: TaskId


@attrs.frozen
class MoveDone:
    """The home answered a move request (ok: it will offer the task to the target)."""

    task_id: TaskId
    ok: bool
    reason: str


Output = Send | Committed | OfferFailed | HolderLost | Reported | RunNow | Drop | Kill | MoveDone


# --------------------------------------------------------------------- home side


class HomePhase(enum.Enum):
    LOCAL = "local"  # the home holds it (queued or running here)
    OFFERING = "offering"  # an offer to `target` is in flight
    REMOTE = "remote"  # committed at `where`
    DONE = "done"  # final report accepted; only revokes may remain


@attrs.define
class HomeEntry:
    task_id: TaskId
    spec: TaskSpec
    epoch: int = 0  # the current committed epoch
    next_epoch: int = 1  # epochs are never reused, even for failed offers
    where: NodeId = ""
    phase: HomePhase = HomePhase.LOCAL
    target: NodeId = ""  # offer in flight to
    offer_epoch: int = 0
    offer_from: NodeId = ""  # holder that asked for the move ("" = the home)
    tries: int = 0
    next_at: float = 0.0
    commit_unacked: bool = False
    cancel_unacked: bool = False
    revokes: dict[NodeId, int] = attrs.field(factory=dict)
    # the journaled fields as the journal last got them (node/recovery.py): a retry
    # changes only the timers above, and need not rewrite the entry
    journaled: tuple[Any, ...] | None = attrs.field(default=None, eq=False, repr=False)


class HomeSide:
    """Handoff state of the tasks whose home is this node."""

    def __init__(self, node: NodeId) -> None:
        self.node = node
        self.entries: dict[TaskId, HomeEntry] = {}
        # may an entry have something to resend? (over-approximate: set by every
        # change that gives one something to send, recomputed by each tick; the
        # node's retry timer reads it instead of scanning every entry)
        self.pending = False

    def _due(self, e: HomeEntry, at: float) -> None:
        e.next_at = at
        self.pending = True

    def _unpark(self, e: HomeEntry) -> None:
        """A parked entry (tick) has something to send again: at the next tick."""
        if e.next_at == math.inf:
            self._due(e, 0.0)

    def track(self, spec: TaskSpec) -> HomeEntry:
        e = self.entries.get(spec.id)
        if e is None:
            e = self.entries[spec.id] = HomeEntry(task_id=spec.id, spec=spec, where=self.node)
            self.pending = True  # next_at 0: the next tick looks at it (and parks it)
        return e

    def restore(self, entry: HomeEntry) -> None:
        self.entries[entry.task_id] = entry
        self.pending = True

    def settled(self, task_id: TaskId) -> bool:
        """Nothing left to do for this task's handoff: not offered or held elsewhere,
        no commit, cancel or revoke still waiting for an answer."""
        e = self.entries.get(task_id)
        return e is None or (
            e.phase in (HomePhase.LOCAL, HomePhase.DONE)
            and not e.revokes
            and not e.commit_unacked
            and not e.cancel_unacked
        )

    def forget(self, task_id: TaskId) -> bool:
        """Drop a settled entry (the task itself is being forgotten). True if dropped."""
        if task_id in self.entries and self.settled(task_id):
            del self.entries[task_id]
            return True
        return False

    def adopt(self, spec: TaskSpec, epoch: int, finished: bool) -> HomeEntry:
        """This node took over the home role of a task it holds (its home is gone for
        good, cluster/succession.py): it is ours now, held here at `epoch`, and no
        other node may hold it (the old home's offers are void by the adoption)."""
        e = self.entries[spec.id] = HomeEntry(
            task_id=spec.id,
            spec=spec,
            epoch=epoch,
            next_epoch=epoch + 1,
            where=self.node,
            phase=HomePhase.DONE if finished else HomePhase.LOCAL,
        )
        return e

    def yield_to(self, task_id: TaskId) -> HomeEntry | None:
        """Another node took the task over (an adoption notice with a larger claim):
        forget our entry; our record now points at the new home."""
        return self.entries.pop(task_id, None)

    def holder(self, task_id: TaskId) -> NodeId | None:
        e = self.entries.get(task_id)
        if e is None:
            return self.node
        return e.where

    # ----- placing

    def offer(self, spec: TaskSpec, target: NodeId, now: float) -> list[Output]:
        """Start offering a task the home holds locally (phase LOCAL) to `target`."""
        e = self.track(spec)
        if e.phase is not HomePhase.LOCAL:
            raise ValueError(f"task {spec.id}: cannot offer while {e.phase.value}")
        return self._start_offer(e, target, now, holder="")

    def _start_offer(
        self, e: HomeEntry, target: NodeId, now: float, holder: NodeId
    ) -> list[Output]:
        e.phase = HomePhase.OFFERING
        e.target = target
        e.offer_epoch = e.next_epoch
        e.next_epoch += 1
        e.offer_from = holder
        e.tries = 1
        self._due(e, now + _backoff(1))
        return [Send(target, Offer(e.task_id, e.offer_epoch, e.spec))]

    def on_offer_reply(self, req: Offer, reply: Reply | None, now: float) -> list[Output]:
        """Feed the reply to an Offer (None: no answer this time)."""
        e = self.entries.get(req.task_id)
        if e is None or e.phase is not HomePhase.OFFERING or e.offer_epoch != req.epoch:
            return []  # a late reply to an offer we already resolved
        if reply is None:
            if e.tries < OFFER_TRIES:
                return []  # tick() resends
            return self._offer_failed(e, "no answer from target", refused=False)
        if reply.ok:
            old_where, old_epoch = e.where, e.epoch
            e.phase = HomePhase.REMOTE
            e.where = e.target
            e.epoch = e.offer_epoch
            e.commit_unacked = True
            e.tries = 1
            self._due(e, now + _backoff(1))
            out: list[Output] = [Committed(e.task_id, e.where, e.epoch)]
            if old_where and old_where != self.node and old_where != e.where:
                e.revokes[old_where] = max(e.revokes.get(old_where, 0), old_epoch)
                out.append(Send(old_where, Revoke(e.task_id, old_epoch)))
            out.append(Send(e.where, Commit(e.task_id, e.epoch)))
            return out
        return self._offer_failed(e, reply.reason or "refused", refused=True)

    def _offer_failed(self, e: HomeEntry, reason: str, refused: bool) -> list[Output]:
        target = e.target
        out: list[Output] = [OfferFailed(e.task_id, target, reason, refused)]
        if not refused:
            out.append(Send(target, Abort(e.task_id, e.offer_epoch)))  # best effort
        e.target = ""
        e.offer_from = ""
        e.phase = HomePhase.REMOTE if e.where != self.node else HomePhase.LOCAL
        return out

    # ----- requests from other nodes

    def on_query(self, sender: NodeId, q: Query) -> tuple[Reply, list[Output]]:
        """Answer "is this task yours?". A holder that gives up on a move is re-committed
        at a fresh epoch (a fence), so its move request, if still in flight, is void."""
        e = self.entries.get(q.task_id)
        if e is None:
            return Reply(q.task_id, q.epoch, True, Verdict.GONE, "unknown task"), []
        if e.phase is HomePhase.OFFERING and (q.epoch == e.offer_epoch or sender == e.offer_from):
            return Reply(q.task_id, q.epoch, True, Verdict.WAIT, "offer in flight"), []
        if e.phase is HomePhase.REMOTE and e.where == sender and e.epoch >= q.epoch:
            # the current holder; an older epoch means it missed our fence: resync it
            # (only the first copy of a "moving" question fences, duplicates resync)
            if not q.moving or q.epoch < e.epoch:
                return Reply(q.task_id, e.epoch, True, Verdict.YOURS), []
            e.epoch = e.next_epoch
            e.next_epoch += 1
            return Reply(q.task_id, e.epoch, True, Verdict.YOURS, "move not carried out"), [
                Committed(e.task_id, sender, e.epoch)
            ]
        reason = f"not yours (epoch {e.epoch} at {e.where})"
        return Reply(q.task_id, q.epoch, True, Verdict.GONE, reason), []

    def on_move_request(
        self, sender: NodeId, m: MoveRequest, now: float
    ) -> tuple[Reply, list[Output]]:
        e = self.entries.get(m.task_id)
        if e is None or e.phase is not HomePhase.REMOTE or e.where != sender or e.epoch != m.epoch:
            return Reply(m.task_id, m.epoch, False, reason="not the current holder"), []
        if m.target == sender:
            return Reply(m.task_id, m.epoch, False, reason="target is the holder"), []
        if m.target == self.node:
            # coming home: no offer needed, the home commits to itself
            e.revokes[sender] = max(e.revokes.get(sender, 0), e.epoch)
            self._unpark(e)
            e.epoch = e.next_epoch
            e.next_epoch += 1
            e.where = self.node
            e.phase = HomePhase.LOCAL
            e.commit_unacked = False
            return Reply(m.task_id, m.epoch, True), [
                Committed(e.task_id, self.node, e.epoch),
                Send(sender, Revoke(e.task_id, m.epoch)),
            ]
        return Reply(m.task_id, m.epoch, True), self._start_offer(e, m.target, now, holder=sender)

    def on_report(self, sender: NodeId, r: Report) -> tuple[Reply, list[Output]]:
        e = self.entries.get(r.task_id)
        if e is None:
            return Reply(r.task_id, r.epoch, False, Verdict.GONE, "unknown task"), []
        current = (
            e.where == sender
            and e.epoch == r.epoch
            and e.phase in (HomePhase.REMOTE, HomePhase.DONE)
        )
        if e.where == sender and e.phase is HomePhase.REMOTE and r.epoch < e.epoch:
            # the holder missed a fence (its answer was lost or reordered): it is still
            # the holder, so accept and tell it the current epoch
            current = True
        if not current:
            if e.phase is HomePhase.OFFERING and e.offer_from == sender and e.epoch == r.epoch:
                current = True  # a move in flight: the holder still owns it
            else:
                e.revokes[sender] = max(e.revokes.get(sender, 0), r.epoch)
                self._unpark(e)
                return Reply(r.task_id, r.epoch, False, Verdict.GONE, "superseded"), []
        if e.phase is HomePhase.DONE:
            return Reply(r.task_id, e.epoch, True), []  # duplicate of the accepted final report
        e.commit_unacked = False  # the holder evidently got the commit
        if r.state == "fenced" and e.cancel_unacked:
            r = attrs.evolve(r, state="cancelled", reason="cancelled (its run was fenced)")
        if r.state == "fenced":
            # --at-most-once: its supervisor stopped it (the lease lapsed), so no copy
            # runs: the task is back here, at a new epoch, to be placed again
            if e.phase is not HomePhase.REMOTE:
                return Reply(r.task_id, e.epoch, True), []
            self._back_home(e, sender)
            return Reply(r.task_id, r.epoch, True), [HolderLost(r.task_id, sender, fenced=True)]
        if r.final:
            e.phase = HomePhase.DONE
            e.cancel_unacked = False
        return Reply(r.task_id, e.epoch, True), [Reported(r.task_id, sender, r)]

    # ----- membership and cancel

    def on_node_dead(self, node: NodeId, now: float) -> list[Output]:
        out: list[Output] = []
        for e in self.entries.values():
            if e.phase is HomePhase.REMOTE and e.where == node:
                self._back_home(e, node)
                out.append(HolderLost(e.task_id, node))
            elif e.phase is HomePhase.OFFERING and e.target == node:
                out += self._offer_failed(e, f"{node} died", refused=False)
            elif e.phase is HomePhase.OFFERING and e.where == node:
                # the holder that asked for a move died: the offer goes on, and if it
                # fails the task falls back to the home
                e.revokes[node] = max(e.revokes.get(node, 0), e.epoch)
                self._unpark(e)
                e.where = self.node
                e.epoch = e.next_epoch
                e.next_epoch += 1
                e.offer_from = ""
        return out

    def _back_home(self, e: HomeEntry, holder: NodeId) -> None:
        """The holder no longer runs the task (it died, or its run was fenced): the task
        is back here at a new epoch, and the holder's epoch is revoked."""
        e.revokes[holder] = max(e.revokes.get(holder, 0), e.epoch)
        self._unpark(e)
        e.where = self.node
        e.epoch = e.next_epoch
        e.next_epoch += 1
        e.phase = HomePhase.LOCAL
        e.commit_unacked = False
        e.cancel_unacked = False

    def cancel(self, task_id: TaskId, now: float) -> list[Output]:
        e = self.entries.get(task_id)
        if e is None or e.phase is not HomePhase.REMOTE:
            return []
        e.cancel_unacked = True
        e.tries = 1
        self._due(e, now + _backoff(1))
        return [Send(e.where, Cancel(task_id, e.epoch))]

    def on_reply(self, dest: NodeId, req: Request, reply: Reply | None, now: float) -> list[Output]:
        """Replies to Commit / Revoke / Cancel / Abort (Offer has its own)."""
        if isinstance(req, Offer):
            return self.on_offer_reply(req, reply, now)
        e = self.entries.get(req.task_id)
        if e is None or reply is None:
            return []
        if isinstance(req, Commit) and e.epoch == req.epoch and e.where == dest:
            e.commit_unacked = False
        elif isinstance(req, Revoke) and e.revokes.get(dest, -1) <= req.epoch:
            e.revokes.pop(dest, None)
        elif isinstance(req, Cancel) and e.epoch == req.epoch:
            e.cancel_unacked = False
        return []

    # ----- retries

    def tick(self, now: float) -> list[Output]:
        """Resend what is unanswered. An entry with nothing unanswered is parked at
        `next_at = inf` (a home holding an array's 10,000 elements ticks several times
        a second; issue 23): an offer, a commit and a cancel set next_at themselves,
        and a revoke added later un-parks the entry (`_unpark`)."""
        out: list[Output] = []
        pending = False
        inf = math.inf
        for e in self.entries.values():
            if e.next_at > now:
                pending = pending or e.next_at != inf
                continue
            due = False
            if e.phase is HomePhase.OFFERING:
                out.append(Send(e.target, Offer(e.task_id, e.offer_epoch, e.spec)))
                due = True
            if e.commit_unacked and e.phase is HomePhase.REMOTE:
                out.append(Send(e.where, Commit(e.task_id, e.epoch)))
                due = True
            if e.cancel_unacked and e.phase is HomePhase.REMOTE:
                out.append(Send(e.where, Cancel(e.task_id, e.epoch)))
                due = True
            for node, ep in e.revokes.items():
                out.append(Send(node, Revoke(e.task_id, ep)))
                due = True
            if due:
                e.tries += 1
                e.next_at = now + _backoff(e.tries)
                pending = True
            else:
                e.next_at = inf
        self.pending = pending
        return out

    def busy(self) -> Iterable[HomeEntry]:
        return (
            e
            for e in self.entries.values()
            if e.phase is HomePhase.OFFERING or e.commit_unacked or e.cancel_unacked or e.revokes
        )


# -------------------------------------------------------------------- guest side


class GuestPhase(enum.Enum):
    PENDING = "pending"  # accepted an offer, waiting for the commit
    CONFIRM = "confirm"  # committed before a restart: ask the home before running
    READY = "ready"  # committed: queued or running here
    MOVING = "moving"  # asked the home to move it elsewhere; never run while moving
    FINISHED = "finished"  # final report not yet acknowledged by the home


@attrs.define
class GuestEntry:
    task_id: TaskId
    home: NodeId
    epoch: int
    spec: TaskSpec
    phase: GuestPhase = GuestPhase.PENDING
    since: float = 0.0
    next_at: float = 0.0
    tries: int = 0
    move_target: NodeId = ""
    report: Report | None = None  # the latest report not yet acknowledged
    running: bool = False
    seq: int = 0  # bumped on every phase change; stamps our queries

    def set_phase(self, phase: GuestPhase) -> None:
        self.phase = phase
        self.seq += 1


class GuestSide:
    """Handoff state of the tasks this node executes for other homes."""

    def __init__(self, node: NodeId) -> None:
        self.node = node
        self.entries: dict[TaskId, GuestEntry] = {}
        # highest epoch of each task we dropped: a late duplicate of an old offer or
        # commit must not bring it back (the agent persists these for a while)
        self.tombstones: dict[TaskId, int] = {}

    def _remove(self, task_id: TaskId) -> GuestEntry | None:
        e = self.entries.pop(task_id, None)
        if e is not None:
            self.tombstones[task_id] = max(self.tombstones.get(task_id, 0), e.epoch)
        return e

    def restore(self, entry: GuestEntry) -> None:
        """After a restart: committed work is confirmed with the home before it runs."""
        if entry.phase in (GuestPhase.READY, GuestPhase.PENDING):
            # a commit we see from now on may be older than our crash: ask instead
            entry.set_phase(GuestPhase.CONFIRM)
        entry.running = False
        entry.next_at = 0.0
        self.entries[entry.task_id] = entry

    def adopt(self, task_id: TaskId) -> GuestEntry | None:
        """We take over the home role of a task we hold for a home gone for good: the
        entry goes (tombstoned at its epoch, so a late offer or commit of the old
        home's cannot bring it back as a guest)."""
        return self._remove(task_id)

    def on_offer(
        self, sender: NodeId, o: Offer, now: float, refusal: str | None, ended: Report | None = None
    ) -> tuple[Reply, GuestEntry | None]:
        """Answer an offer. When accepting, the caller journals the returned entry first.
        `ended`: how this node's own run of the task ended, from its record, if it did
        (its entry may be gone: the old home took the end, then died)."""
        if self.tombstones.get(o.task_id, -1) >= o.epoch:
            return Reply(o.task_id, o.epoch, False, reason="stale offer (already dropped)"), None
        e = self.entries.get(o.task_id)
        if e is None and ended is not None and ended.final and ended.state != "fenced":
            # its run ended here and its old home took the end; an adopter that never
            # heard of it (its copy came late, stop 55: walk seed 81644) offers it again:
            # answered with that end, as below, not run a second time
            return self._taken_with_end(sender, o, ended, now)
        if e is not None:
            if e.epoch == o.epoch:
                return Reply(o.task_id, o.epoch, True), None  # duplicate offer
            if e.epoch > o.epoch:
                return Reply(o.task_id, o.epoch, False, reason="stale offer"), None
            if e.phase in (GuestPhase.READY, GuestPhase.FINISHED) and e.running:
                return Reply(
                    o.task_id, o.epoch, False, reason="an older copy is still running here"
                ), None
            end = e.report if e.phase is GuestPhase.FINISHED else None
            if end is not None and end.final and end.state != "fenced":
                # its run ended here, the end not yet taken (its home died; this is an
                # adopter's offer): taken, and answered with that end, not run again.
                # Before stop 54 the run was forgotten and the task ran a second time
                return self._taken_with_end(sender, o, end, now)
        if refusal is not None:
            return Reply(o.task_id, o.epoch, False, reason=refusal), None
        e = GuestEntry(
            task_id=o.task_id,
            home=sender,
            epoch=o.epoch,
            spec=o.spec,
            since=now,
            next_at=now + PENDING_QUERY_AFTER,
        )
        self.entries[o.task_id] = e
        return Reply(o.task_id, o.epoch, True), e

    def _taken_with_end(
        self, sender: NodeId, o: Offer, end: Report, now: float
    ) -> tuple[Reply, GuestEntry]:
        """Take an offer of a task whose run here ended: nothing runs, the end is the
        report sent on its commit (docs/handoff.md rule 8)."""
        e = GuestEntry(o.task_id, sender, o.epoch, o.spec, GuestPhase.FINISHED, now)
        e.next_at, e.tries = now + PENDING_QUERY_AFTER, 1  # sent on its commit
        e.report = attrs.evolve(end, epoch=o.epoch)
        self.entries[o.task_id] = e
        return Reply(o.task_id, o.epoch, True), e

    def on_commit(self, c: Commit, now: float) -> tuple[Reply, list[Output]]:
        e = self.entries.get(c.task_id)
        if e is None or e.epoch != c.epoch:
            return Reply(c.task_id, c.epoch, False, reason="no such pending offer"), []
        if e.phase is GuestPhase.PENDING:
            e.set_phase(GuestPhase.READY)
            return Reply(c.task_id, c.epoch, True), [RunNow(c.task_id)]
        if e.phase is GuestPhase.FINISHED and e.report is not None:
            return Reply(c.task_id, c.epoch, True), [Send(e.home, e.report)]  # (on_offer)
        return Reply(c.task_id, c.epoch, True), []  # CONFIRM waits for a query answer

    def on_abort(self, a: Abort) -> tuple[Reply, list[Output]]:
        e = self.entries.get(a.task_id)
        if e is not None and e.epoch == a.epoch and e.phase is GuestPhase.PENDING:
            self._remove(a.task_id)
            return Reply(a.task_id, a.epoch, True), [Drop(a.task_id, "offer aborted", kill=False)]
        return Reply(a.task_id, a.epoch, True), []

    def on_revoke(self, r: Revoke) -> tuple[Reply, list[Output]]:
        e = self.entries.get(r.task_id)
        if e is None or e.epoch > r.epoch:
            return Reply(r.task_id, r.epoch, True), []
        self._remove(r.task_id)
        return Reply(r.task_id, r.epoch, True), [Drop(r.task_id, "revoked by home", kill=e.running)]

    def on_cancel(self, c: Cancel) -> tuple[Reply, list[Output]]:
        e = self.entries.get(c.task_id)
        if e is None or e.epoch != c.epoch:
            return Reply(c.task_id, c.epoch, False, reason="not here"), []
        if e.phase is GuestPhase.FINISHED:
            return Reply(c.task_id, c.epoch, True), []
        return Reply(c.task_id, c.epoch, True), [Kill(c.task_id)]

    # ----- local events

    def may_run(self, task_id: TaskId) -> bool:
        e = self.entries.get(task_id)
        return e is not None and e.phase is GuestPhase.READY

    def started(self, task_id: TaskId, now: float) -> list[Output]:
        e = self.entries.get(task_id)
        if e is None:
            return []
        e.running = True
        e.report = Report(task_id, e.epoch, "running", at=now)
        e.tries = 1
        e.next_at = now + _backoff(1)
        return [Send(e.home, e.report)]

    def finished(self, report: Report, now: float) -> list[Output]:
        e = self.entries.get(report.task_id)
        if e is None:
            return []
        e.running = False
        e.set_phase(GuestPhase.FINISHED)
        e.report = attrs.evolve(report, epoch=e.epoch)
        e.tries = 1
        e.next_at = now + _backoff(1)
        return [Send(e.home, e.report)]

    def requeued(self, task_id: TaskId) -> None:
        """The local run was interrupted (agent shutdown): it will run again here."""
        e = self.entries.get(task_id)
        if e is not None:
            e.running = False

    def request_move(self, task_id: TaskId, target: NodeId, now: float) -> list[Output]:
        e = self.entries.get(task_id)
        if e is None or e.phase is not GuestPhase.READY or e.running:
            return []
        e.set_phase(GuestPhase.MOVING)
        e.move_target = target
        e.tries = 1
        e.next_at = now + PENDING_QUERY_AFTER
        return [Send(e.home, MoveRequest(task_id, e.epoch, target))]

    def on_reply(self, dest: NodeId, req: Request, reply: Reply | None, now: float) -> list[Output]:
        e = self.entries.get(req.task_id)
        if (
            e is not None
            and reply is not None
            and reply.ok
            and reply.epoch > e.epoch
            and req.epoch == e.epoch
            and (
                isinstance(req, Report)
                or (isinstance(req, Query) and reply.verdict is Verdict.YOURS)
            )
        ):
            # the home fenced us with a newer epoch (this answer may be to an older
            # question: adopt the epoch, but only the current question changes phase)
            e.epoch = reply.epoch
            req = attrs.evolve(req, epoch=e.epoch)
            if e.report is not None:
                e.report = attrs.evolve(e.report, epoch=e.epoch)
        if e is None or e.epoch != req.epoch:
            return []
        if isinstance(req, Report):
            if reply is None:
                return []
            if not reply.ok and reply.verdict is Verdict.GONE:
                self._remove(req.task_id)
                return [Drop(req.task_id, "home says superseded", kill=e.running)]
            if reply.ok and e.report == req:
                e.report = None
                if req.final:
                    self._remove(req.task_id)
                    return [Drop(req.task_id, "result delivered", kill=False)]
            return []
        if isinstance(req, Query):
            if reply is None or reply.verdict is None or req.seq != e.seq:
                return []  # no answer, or the answer to an older question
            if reply.verdict is Verdict.YOURS:
                if e.phase in (GuestPhase.PENDING, GuestPhase.CONFIRM):
                    e.set_phase(GuestPhase.READY)
                    return [RunNow(req.task_id)]
                if e.phase is GuestPhase.MOVING:
                    e.set_phase(GuestPhase.READY)  # the move did not happen
                    return [
                        MoveDone(req.task_id, False, "move not carried out"),
                        RunNow(req.task_id),
                    ]
                return []
            if reply.verdict is Verdict.GONE:
                self._remove(req.task_id)
                return [Drop(req.task_id, reply.reason or "home says gone", kill=e.running)]
            return []
        if isinstance(req, MoveRequest) and e.phase is GuestPhase.MOVING:
            if reply is None:
                return []  # tick() will query
            if reply.ok:
                return [MoveDone(req.task_id, True, "")]
            # a refusal may answer a duplicate of a request the home already carried
            # out: do not assume the task is still ours, ask
            e.set_phase(GuestPhase.CONFIRM)
            e.next_at = now
            return [MoveDone(req.task_id, False, reply.reason)]
        return []

    def tick(self, now: float) -> list[Output]:
        """Resend what is unanswered. An entry with nothing to send (ready, every
        report acknowledged) is parked at `next_at = inf`: a runner with thousands of
        queued guests ticks several times a second and they would all be looked at
        each time (issue 23). Whatever gives an entry something to send again (a
        report, a move, a confirm, a restore) sets its next_at."""
        out: list[Output] = []
        for e in self.entries.values():
            if e.next_at > now:
                continue
            if e.phase in (GuestPhase.PENDING, GuestPhase.CONFIRM, GuestPhase.MOVING):
                moving = e.phase is GuestPhase.MOVING
                out.append(Send(e.home, Query(e.task_id, e.epoch, e.seq, moving)))
            elif e.report is not None:
                out.append(Send(e.home, e.report))
            else:
                e.next_at = math.inf
                continue
            e.tries += 1
            e.next_at = now + _backoff(e.tries)
        return out


# ------------------------------------------------------------------ persistence


def home_entry_to_wire(e: HomeEntry) -> dict[str, Any]:
    return {
        "spec": codec.task_spec_to_wire(e.spec),
        "epoch": e.epoch,
        "next_epoch": e.next_epoch,
        "where": e.where,
        "phase": e.phase.value,
        "target": e.target,
        "offer_epoch": e.offer_epoch,
        "offer_from": e.offer_from,
        "commit_unacked": e.commit_unacked,
        "cancel_unacked": e.cancel_unacked,
        "revokes": dict(e.revokes),
    }


def home_entry_from_wire(obj: Any) -> HomeEntry:
    f = wire.Fields(obj, "home entry")
    spec = wire.decode_with(codec.task_spec_from_wire, f.map("spec", required=True))
    revokes = f.map("revokes")
    e = HomeEntry(
        task_id=spec.id,
        spec=spec,
        epoch=f.int("epoch", 0, lo=0),
        next_epoch=f.int("next_epoch", 1, lo=0),
        where=f.str("where", ""),
        phase=f.enum("phase", HomePhase, HomePhase.LOCAL),
        target=f.str("target", ""),
        offer_epoch=f.int("offer_epoch", 0, lo=0),
        offer_from=f.str("offer_from", ""),
        commit_unacked=f.bool("commit_unacked", False),
        cancel_unacked=f.bool("cancel_unacked", False),
        revokes={str(k): int(v) for k, v in revokes.items()},
    )
    f.done()
    return e


def guest_entry_to_wire(e: GuestEntry) -> dict[str, Any]:
    return {
        "spec": codec.task_spec_to_wire(e.spec),
        "home": e.home,
        "epoch": e.epoch,
        "phase": e.phase.value,
        "since": e.since,
        "move_target": e.move_target,
        "report": None if e.report is None else request_to_wire(e.report),
    }


def guest_entry_from_wire(obj: Any) -> GuestEntry:
    f = wire.Fields(obj, "guest entry")
    spec = wire.decode_with(codec.task_spec_from_wire, f.map("spec", required=True))
    rep = f.nested("report", request_from_wire)
    e = GuestEntry(
        task_id=spec.id,
        home=f.str("home", required=True),
        epoch=f.int("epoch", required=True, lo=0),
        spec=spec,
        phase=f.enum("phase", GuestPhase, GuestPhase.PENDING),
        since=f.float("since", 0.0),
        move_target=f.str("move_target", ""),
        report=rep if isinstance(rep, Report) else None,
    )
    f.done()
    return e
