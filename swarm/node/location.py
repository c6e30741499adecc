"""Where a task lives: the node's reactions to the handoff protocol (pure).

The handoff sides (cluster/handoff.py) decide the protocol; this module decides what
each of their outcomes does to the node: records moved, the run queue, the ledger,
GPU slices, a placement started again or told the outcome of its offer. The rules
that used to be async code in the coordinator live here, e.g. "the holder died while
the task ran with --no-retry: LOST" and "an offer failed and no placement waits for
it: place the task again".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from .. import model as m
from ..cluster import handoff as h
from ..policy import shares as sh
from ..policy.charges import Charges
from . import events as ev
from .fencing import FENCED
from .records import TaskRecords
from .recovery import Handoffs

S = m.TaskState
_Answer = tuple[h.Reply, list[ev.Instruction]]  # a handoff request's reply, and what to do
FINAL_STATES = {"succeeded": S.SUCCEEDED, "failed": S.FAILED, "cancelled": S.CANCELLED}


class Location:
    """The handoff reactions of NodeState (state.py), which holds the fields below."""

    node: m.NodeId
    records: TaskRecords
    ledger: sh.ShareLedger
    handoffs: Handoffs
    pending_cancel: set[m.TaskId]
    awaiting_offer: set[m.TaskId]
    decided: list[tuple[m.TaskId, bool, str]]
    depth: int
    arrived: dict[m.TaskId, float]
    queued: Any
    running: Any
    counters: dict[str, int]
    charges: Charges
    version: int  # of the last load report this node made (loadstate.py)

    @property
    def home(self) -> h.HomeSide:
        return self.handoffs.home

    @property
    def guest(self) -> h.GuestSide:
        return self.handoffs.guest

    def _change(
        self,
        tid: m.TaskId,
        dst: m.TaskState,
        wall: float,
        cause: str,
        durable: bool = False,
        **kw: Any,
    ) -> tuple[m.Task, ev.Record]:
        new = self.records.apply(tid, dst, wall, cause, **kw)
        return new, ev.Record(new, durable=durable)

    def enqueue_local(self, task: m.Task, now: float, front: bool = False) -> list[ev.Instruction]:
        if task.id not in self.ledger:
            self.ledger.add(task.spec)
        self.arrived.setdefault(task.id, now)
        return [ev.Enqueue(task.id, front), ev.LoadChanged()]

    def _outcome(self, tid: m.TaskId, ok: bool, reason: str) -> ev.OfferOutcome:
        self.awaiting_offer.discard(tid)
        self.decided.append((tid, ok, reason))
        return ev.OfferOutcome(tid, ok, reason)

    if TYPE_CHECKING:  # provided by the other parts of NodeState

        def count_in_view(self, node: m.NodeId, spec: m.TaskSpec, now: float) -> None:
            raise NotImplementedError

        def release_gpu(self, tid: m.TaskId) -> list[ev.Instruction]:
            raise NotImplementedError

        def fence_ended(self, tid: m.TaskId) -> None:
            raise NotImplementedError

        def offer_decided(
            self, tid: m.TaskId, ok: bool, reason: str, now: float, wall: float
        ) -> list[ev.Instruction]:
            raise NotImplementedError

        def replica_update(self, tid: m.TaskId) -> list[ev.Instruction]:
            raise NotImplementedError

        def hedge_ran(self, t: m.Task, seconds: float) -> None: ...

        def back_home(self, t: m.Task, now: float, wall: float) -> list[ev.Instruction]: ...
        def move_refused(self, r: h.MoveRequest, now: float, wall: float) -> _Answer | None: ...

        def array_element_ended(
            self, task: m.Task, now: float, wall: float
        ) -> list[ev.Instruction]:
            raise NotImplementedError

    # ------------------------------------------------------------ handoff

    def apply(
        self,
        outs: tuple[h.Output, ...] | list[h.Output],
        task_ids: tuple[m.TaskId, ...] | list[m.TaskId],
        now: float,
        wall: float,
        lazy: bool = False,
    ) -> list[ev.Instruction]:
        """Handoff outputs: decisions first, then the journal writes of the handoff
        entries they touched (durable; `lazy`: may wait for the next commit, where
        nothing is sent), then the sends. Placements whose offer got decided go on
        after all of that (after the outermost apply)."""
        out: list[ev.Instruction] = []
        sends: list[h.Send] = []
        touched: set[m.TaskId] = set(task_ids)
        self.depth += 1
        try:
            for o in outs:
                if isinstance(o, h.Send):
                    sends.append(o)
                    touched.add(o.request.task_id)
                else:
                    touched.add(o.task_id)
                    out += self.decide(o, now, wall)
        finally:
            self.depth -= 1
        ops = self.handoffs.persist_ops(touched, wall)
        if ops:
            lazy = lazy and not sends
            out.append(ev.Persist(tuple(ops), durable=not lazy, lazy=lazy))
        out += [ev.SendHandoff(s) for s in sends]
        if self.depth == 0:
            while self.decided:
                tid, ok, reason = self.decided.pop(0)
                out += self.offer_decided(tid, ok, reason, now, wall)
        return out

    def decide(self, o: h.Output, now: float, wall: float) -> list[ev.Instruction]:
        if isinstance(o, h.Committed):
            return self.on_committed(o, now, wall)
        if isinstance(o, h.OfferFailed):
            return self.on_offer_failed(o, wall)
        if isinstance(o, h.HolderLost):
            return self.on_holder_lost(o, wall)
        if isinstance(o, h.Reported):
            return self.on_reported(o, now, wall)
        if isinstance(o, h.RunNow):
            return self.on_run_now(o.task_id, now, wall)
        if isinstance(o, h.Drop):
            return self.on_drop(o)
        if isinstance(o, h.Kill):
            return self.on_kill(o.task_id, now, wall)
        if isinstance(o, h.MoveDone):
            return [
                ev.log("info", "transfer.move_answer", task=o.task_id, ok=o.ok, reason=o.reason)
            ]
        return []

    def on_committed(self, o: h.Committed, now: float, wall: float) -> list[ev.Instruction]:
        t = self.records.active.get(o.task_id)
        if t is None:
            if o.task_id in self.pending_cancel and o.node != self.node:
                # its record ended while the offer was out (its backup won: backups.py)
                self.pending_cancel.discard(o.task_id)
                return self.apply(self.home.cancel(o.task_id, now), [o.task_id], now, wall)
            return []
        out: list[ev.Instruction] = []
        if o.node == self.node:  # the task came back home
            if t.state is S.QUEUED:
                t, r = self._change(t.id, S.TRANSFERRING, wall, "moving back home", node=t.node)
                out.append(r)
            t, r = self._change(t.id, S.QUEUED, wall, "back home", node=self.node)
            return [*out, r, *self.back_home(t, now, wall)]
        if t.state in (S.TRANSFERRING, S.MIGRATING):
            how = "migrated to" if t.state is S.MIGRATING else "handed off to"
            _, r = self._change(t.id, S.QUEUED, wall, f"{how} {o.node}", node=o.node)
            out.append(r)
            self.ledger.remove(t.id)
            out += self.release_gpu(t.id)
            out.append(ev.LoadChanged())
            self.arrived.pop(t.id, None)
            # its replicas learn the runner at the next failover tick (<= 1 s), not
            # now: a short task has ended by then, and its copies get the release
            # alone (one message of three saved per copy; issue 23)
            out.append(self._outcome(t.id, True, ""))
            if t.id in self.pending_cancel:
                self.pending_cancel.discard(t.id)
                out += self.apply(self.home.cancel(t.id, now), [t.id], now, wall)
        # else: a fence (same holder, new epoch); nothing changes in the record
        return out

    def on_offer_failed(self, o: h.OfferFailed, wall: float) -> list[ev.Instruction]:
        t = self.records.active.get(o.task_id)
        self.counters["offers_refused" if o.refused else "offers_failed"] += 1
        self.charges.drop(o.node, o.task_id)
        if t is None:
            self.pending_cancel.discard(o.task_id)
            return []
        out: list[ev.Instruction] = []
        e = self.home.entries.get(o.task_id)
        where = e.where if e is not None else self.node
        if t.state in (S.TRANSFERRING, S.MIGRATING):
            # a migrating task restarts where it was, from the checkpoint it kept there
            cause = f"offer to {o.node} failed: {o.reason}"
            out.append(self._change(t.id, S.QUEUED, wall, cause, node=where)[1])
        if where == self.node:
            if t.id in self.pending_cancel:
                self.pending_cancel.discard(t.id)
                out.append(self._change(t.id, S.CANCELLED, wall, "cancelled", durable=True)[1])
            elif t.id in self.ledger:  # it was in the local queue (a push): put it back
                out.append(ev.Requeue(t.id))
            elif t.id not in self.awaiting_offer:
                # No placement waits for this offer (it was resumed after a restart, or a
                # holder that asked for a move died): place the task again, or it would
                # sit queued at its home forever.
                out.append(ev.Place(t.id))
        out.append(self._outcome(t.id, False, o.reason))
        return out

    def on_holder_lost(self, o: h.HolderLost, wall: float) -> list[ev.Instruction]:
        t = self.records.active.get(o.task_id)
        if t is None:
            return []
        what = f"{o.node} fenced its run (its lease lapsed)" if o.fenced else f"{o.node} died"
        if o.fenced:
            self.fence_ended(t.id)  # no copy runs: it may be placed again at once
        if t.spec.no_retry and (t.state is S.RUNNING or o.fenced):  # a fenced run started
            self.counters["lost"] += 1
            cause = f"{what} while running it (--no-retry)"
            return [self._change(t.id, S.LOST, wall, cause, durable=True)[1]]
        out: list[ev.Instruction] = []
        requeued = f"{what}: re-queued"
        if t.state in (S.RUNNING, S.MIGRATING, S.TRANSFERRING):
            out.append(self._change(t.id, S.QUEUED, wall, requeued, node=self.node)[1])
        elif t.state is S.QUEUED:
            out.append(self._change(t.id, S.TRANSFERRING, wall, what, node=t.node)[1])
            out.append(self._change(t.id, S.QUEUED, wall, requeued, node=self.node)[1])
        self.counters["requeued_dead"] += 1
        out.append(ev.Place(t.id))
        return out

    def on_reported(self, o: h.Reported, now: float, wall: float) -> list[ev.Instruction]:
        t = self.records.active.get(o.task_id)
        if t is None:
            return []
        out: list[ev.Instruction] = []
        r = o.report
        if t.state in (S.QUEUED, S.TRANSFERRING) and (r.state == "running" or r.final):
            out.append(self._change(t.id, S.RUNNING, wall, f"started on {o.node}", node=o.node)[1])
        if not r.final:
            return out
        if r.state == "succeeded" and r.started:
            self.hedge_ran(t, r.at - r.started)  # the runner's clock: its run's length
        self.fence_ended(t.id)
        self.pending_cancel.discard(t.id)
        new, rec = self._change(
            t.id,
            FINAL_STATES[r.state],
            wall,
            r.reason or r.state,
            durable=True,
            node=o.node,
            exit_code=r.exit_code,
            signal=r.signal,
        )
        # its replicas let go at once: a home that died before telling them would leave
        # a replica that runs the finished task again; an array's element ended: the
        # array counts it now (its next element comes), not at its next look
        return [
            *out,
            rec,
            *self.replica_update(t.id),
            *self.array_element_ended(new, now, wall),
        ]

    def on_run_now(self, tid: m.TaskId, now: float, wall: float) -> list[ev.Instruction]:
        e = self.guest.entries.get(tid)
        if e is None:
            return []
        out: list[ev.Instruction] = []
        t = self.records.active.get(tid)
        if t is not None and t.state is S.MIGRATING:
            # the home did not carry out our move: run it here again, from its checkpoint
            t, r = self._change(tid, S.QUEUED, wall, "move not carried out: runs here again")
            out.append(r)
        if t is not None and t.state is S.RUNNING and tid in self.running:
            # re-attached after our restart (its supervisor kept it running): the home's
            # "yours" confirms it; it must not be queued to run again (chaos
            # agent-restart: each ran again once the first process ended)
            return out + self.apply(self.guest.started(tid, now), [tid], now, wall)
        if t is None or t.state is not S.QUEUED:
            t = m.new_task(e.spec, wall, self.node, cause=f"accepted from {e.home}")
            self.records.store(t)
            out.append(ev.Record(t))
        if tid not in self.queued and tid not in self.running:
            out += self.enqueue_local(t, now)
        return out

    def on_drop(self, o: h.Drop) -> list[ev.Instruction]:
        tid = o.task_id
        t = self.records.active.get(tid)
        if tid in self.running:
            return [ev.StopRun(tid, o.reason)] if o.kill else []
        out: list[ev.Instruction] = [ev.Dequeue(tid)]
        self.ledger.remove(tid)
        out += self.release_gpu(tid)
        self.arrived.pop(tid, None)
        if t is not None and t.spec.home != self.node:
            self.records.forget(tid)
            out.append(ev.Forget(tid))
        out.append(ev.MoveHook("left", tid))  # its state dir, if any, is not needed here now
        return out

    def on_kill(self, tid: m.TaskId, now: float, wall: float) -> list[ev.Instruction]:
        if tid in self.running:
            return [ev.StopRun(tid)]
        t = self.records.active.get(tid)
        if t is not None and t.state is S.MIGRATING:
            return [ev.StopMove(tid, "cancelled by home")]
        if t is None or t.state is not S.QUEUED:
            return []
        self.ledger.remove(tid)
        out: list[ev.Instruction] = [ev.Dequeue(tid)]
        out.append(self._change(tid, S.CANCELLED, wall, "cancelled by home", durable=True)[1])
        rep = h.Report(tid, 0, "cancelled", reason="cancelled", at=wall)
        return out + self.apply(self.guest.finished(rep, now), [tid], now, wall)

    def on_request(
        self, sender: m.NodeId, r: h.Request, now: float, wall: float, refusal: str | None = None
    ) -> tuple[h.Reply, list[ev.Instruction]]:
        """A peer's handoff request. `refusal`: why this node would not take an offered
        task (admission with fresh local usage, which the runtime measures)."""
        if isinstance(r, h.Offer):
            reply, entry = self.guest.on_offer(sender, r, now, refusal, own_end(self, r.task_id))
            if reply.ok:  # on our reports' clock: the first report after counts it
                reply = attrs.evolve(reply, at=max(int(wall * 1000), self.version))
            if entry is not None:
                if r.task_id not in self.ledger and entry.report is None:  # (not ended here)
                    self.ledger.add(r.spec)
                ops = self.handoffs.persist_ops([r.task_id], wall)  # journaled before "yes"
                return reply, [ev.Persist(tuple(ops), durable=True)] if ops else []
            if not reply.ok:
                return reply, [
                    ev.log(
                        "info", "handoff.refused", task=r.task_id, home=sender, reason=reply.reason
                    )
                ]
            return reply, []
        out: list[ev.Instruction] = []
        if isinstance(r, h.Commit):
            reply, outs = self.guest.on_commit(r, now)
        elif isinstance(r, h.Abort):
            reply, outs = self.guest.on_abort(r)
        elif isinstance(r, h.Revoke):
            reply, outs = self.guest.on_revoke(r)
        elif isinstance(r, h.Cancel):
            reply, outs = self.guest.on_cancel(r)
        elif isinstance(r, h.Query):
            reply, outs = self.home.on_query(sender, r)
        elif isinstance(r, h.MoveRequest):
            if (refused := self.move_refused(r, now, wall)) is not None:  # doubt.py
                return refused
            reply, outs = self.home.on_move_request(sender, r, now)
            t = self.records.active.get(r.task_id)
            if reply.ok and t is not None and t.state is S.QUEUED and r.target != self.node:
                cause = f"moving from {sender} to {r.target}"
                out.append(self._change(t.id, S.TRANSFERRING, wall, cause, node=sender)[1])
            elif reply.ok and t is not None and t.state is S.RUNNING:
                # a running task's holder stopped it to move it (checkpoint, restart, CRIU)
                cause = f"migrating from {sender} to {r.target}"
                out.append(self._change(t.id, S.MIGRATING, wall, cause, node=sender)[1])
        else:  # h.Report (request_from_wire returns only these types)
            reply, outs = self.home.on_report(sender, r)
        return reply, out + self.apply(outs, [r.task_id], now, wall)

    def on_reply(
        self, dest: m.NodeId, req: h.Request, reply: h.Reply | None, now: float, wall: float
    ) -> list[ev.Instruction]:
        """The answer to one of our handoff requests (None: none came)."""
        if isinstance(req, (h.Offer, h.Commit, h.Abort, h.Revoke, h.Cancel)):
            if isinstance(req, h.Offer) and reply is not None and reply.ok:
                self._taken(dest, req, reply, now)
            outs = self.home.on_reply(dest, req, reply, now)
            return self.apply(outs, [req.task_id], now, wall)
        outs = self.guest.on_reply(dest, req, reply, now)
        # the home took our report (at its epoch): what that changes here (the report
        # cleared; after a final one, the entry gone, tombstoned) need not land soon.
        # Lost in a crash, the restored entry sends its report again, answered again
        # (issue 23: where a queue drains, this was a commit per task at the runner)
        took = reply is not None and reply.ok and reply.epoch == req.epoch
        return self.apply(outs, [req.task_id], now, wall, lazy=isinstance(req, h.Report) and took)

    def _taken(self, dest: m.NodeId, req: h.Offer, reply: h.Reply, now: float) -> None:
        """`dest` took our offer (the answer to the offer in flight): it is counted in
        our view of `dest` until a report made after `reply.at` (policy/charges.py).
        A placement charged it when it offered; a push or a move is charged now."""
        e = self.home.entries.get(req.task_id)
        if e is None or e.phase is not h.HomePhase.OFFERING or e.offer_epoch != req.epoch:
            return  # a late answer to an offer already resolved
        self.count_in_view(dest, req.spec, now)
        self.charges.answered(dest, req.task_id, reply.at)

    def offer(
        self, tid: m.TaskId, target: m.NodeId, now: float, wall: float
    ) -> tuple[str | None, list[ev.Instruction]]:
        """Offer a task whose home is here (held here) to `target`: (why not, or None
        and what to do; the outcome comes back as an OfferOutcome instruction)."""
        t = self.records.active.get(tid)
        if t is None or t.state not in (S.QUEUED, S.MIGRATING) or t.node != self.node:
            return "not queued here", []
        e = self.home.entries.get(tid)
        if e is not None and e.phase is not h.HomePhase.LOCAL:
            return f"handoff busy ({e.phase.value})", []
        out: list[ev.Instruction] = []
        if t.state is S.QUEUED:  # a MIGRATING task stays so until committed or failed
            out.append(
                self._change(tid, S.TRANSFERRING, wall, f"offering to {target}", node=self.node)[1]
            )
        self.awaiting_offer.add(tid)
        return None, out + self.apply(self.home.offer(t.spec, target, now), [tid], now, wall)


def own_end(loc: Location, tid: m.TaskId) -> h.Report | None:
    """How this node's own run of another home's task ended, from its record (None: it
    did not run here, or has not ended, or was lost). A LOST run is no end: the task
    may run again."""
    t = loc.records.get_cached(tid)
    if t is None or t.node != loc.node or t.spec.home == loc.node or t.spec.is_global:
        return None
    if t.state not in (S.SUCCEEDED, S.FAILED, S.CANCELLED):
        return None
    return end_report(t, t.finished_at or 0.0)


def end_report(t: m.Task, at: float) -> h.Report:
    """A guest's final report of its run of `t`, as its record ended (a run its lease
    fenced reports `fenced`: no end, node/fencing.py)."""
    fenced = t.state is S.LOST and t.reason.startswith(FENCED)
    return h.Report(
        t.id,
        0,
        "fenced" if fenced else t.state.value,
        exit_code=t.exit_code,
        signal=t.signal,
        reason=t.reason,
        at=at,
        started=t.started_at or 0.0,
    )
