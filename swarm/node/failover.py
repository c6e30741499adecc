"""Home failover (pure): the node that holds a task whose home is gone for good takes
the home role over; a home that comes back learns of it and lets go (issue 19).

The rules are cluster/succession.py's (who adopts, when, with what epoch, what a
notice means); this part of NodeState feeds it this node's membership view and the
tasks that could change hands here, and carries its decisions out on the records and
the handoff sides:

* **Adopt** (we hold the task for a home SWIM-dead for `home_grace`): the guest entry
  goes (tombstoned), the record names this node its home (with a history line), a
  home entry holds it here at the handoff epoch it had, and `adopt:<id>` keeps the
  claim's epoch across restarts; all journaled before any notice leaves. A queued
  task (also one that waited for its home's confirmation after our restart) runs here;
  a running one finishes here and its result is final here; a finished one whose
  result the dead home never acknowledged is final as it is. `status`, `logs`,
  `cancel` and `explain` are answered here from then on, at every node (a node
  without the record asks every member, and this one answers).
* **Notices** go to every member, batched per member, and again to each member that
  comes back (alive after dead in our view): the old home, restarted with its disk,
  learns that way. A notice that does not arrive is owed again.
* **Yield** (a notice with a larger claim for a task whose home role we hold, or one
  we run): the home entry and our copy of the record go (the task's record is at the
  new home); a copy we still run is stopped (a second run, recorded at the node that
  made it). So a home that comes back never places or runs the task again.
* **Counter** (a claim naming no runner but its claimant, a copy holder's, over a
  task that ended here, its end not yet taken): we claim above it rather than yield,
  so the end stays (`_counter`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from .. import model as m
from ..cluster import handoff as h
from ..cluster.succession import Adopt, Notice, NoticeAction, Record, Rereplicate, Succession
from ..policy import shares as sh
from . import events as ev
from .records import TaskRecords
from .recovery import ADOPT, HOME, REPLICA, Handoffs
from .replicas import Held

# what the succession core is to hold for a task: home, epoch, runner, replicas
_Want = tuple[m.NodeId, int, m.NodeId | None, tuple[m.NodeId, ...]]

S = m.TaskState
NOTICES_PER_MESSAGE = 256
# A member our records name that our view never heard of, this long after we first saw
# a peer: gone long ago (push-pull carries dead members only for a short while, so a
# node that restarts later never hears of one; it would wait on it for ever)
UNHEARD_AFTER = 10.0


class Failover:
    """The failover part of NodeState (state.py), which holds the fields below."""

    node: m.NodeId
    records: TaskRecords
    handoffs: Handoffs
    ledger: sh.ShareLedger
    queued: Any
    running: Any
    arrived: dict[m.TaskId, float]
    succession: Succession
    adopted: dict[m.TaskId, tuple[m.NodeId, int]]  # task -> (old home, claim epoch)
    mine: dict[m.TaskId, tuple[m.NodeId, ...]]  # replicas.py: our tasks' replicas
    held: dict[m.TaskId, Held]  # replicas.py: copies of other homes' tasks
    strays: dict[m.TaskId, frozenset[m.NodeId]]  # replicas.py: nodes that may hold one
    heard: set[m.NodeId]  # members this node's view has named, in any state
    peer_since: float | None  # when the view first named another member alive
    counters: dict[str, int]
    prune_at: float  # replicas.py: the next look for finished copies to drop

    if TYPE_CHECKING:  # provided by the other parts of NodeState

        def enqueue_local(
            self, task: m.Task, now: float, front: bool = False
        ) -> list[ev.Instruction]: ...
        def release_gpu(self, tid: m.TaskId) -> list[ev.Instruction]: ...
        def on_node_dead(self, node: m.NodeId, now: float, wall: float) -> list[ev.Instruction]: ...
        def replica_updates(self) -> list[ev.Instruction]: ...
        def rereplicated(
            self, tid: m.TaskId, nodes: tuple[m.NodeId, ...]
        ) -> list[ev.Instruction]: ...
        def forget_replicas(self, tid: m.TaskId, lazy: bool = False) -> list[ev.Instruction]: ...
        def forget_gone_strays(self, now: float) -> list[ev.Instruction]: ...
        def drop_held(self, tid: m.TaskId) -> list[ev.Instruction]: ...
        def prune_finished_copies(self, wall: float) -> list[ev.Instruction]: ...
        def member_changing(self, node: m.NodeId, state: m.MemberState) -> None: ...
        def copy_asks(self, now: float) -> list[ev.Instruction]: ...
        def doubt_tick(self, now: float, wall: float) -> list[ev.Instruction]: ...
        def explain(self, tid: m.TaskId, rec: dict[str, Any], wall: float) -> ev.Explain: ...

    # ------------------------------------------------------------- inputs

    def members_seen(self, states: tuple[tuple[m.NodeId, m.MemberState], ...], now: float) -> None:
        """Member states in this node's view (changes, or a whole snapshot: a member
        first heard of as dead, after a restart, comes with no event)."""
        for node, state in states:
            self.member_changing(node, state)  # copyasks.py: a home back?
            self.succession.on_member(node, state, now)
            self.heard.add(node)
            if node != self.node and state is m.MemberState.ALIVE and self.peer_since is None:
                self.peer_since = now

    def failover_tick(self, now: float, wall: float) -> list[ev.Instruction]:
        """Adopt what is due, then send the notices owed, batched per member."""
        out = self._unheard(now, wall)
        self._sync_succession()
        owed: dict[m.NodeId, list[Notice]] = {}
        for d in self.succession.step(now):
            if isinstance(d, Adopt):
                out += self._adopt(d, now, wall)
            elif isinstance(d, Rereplicate):  # only ever for a task whose home we are
                out += self.rereplicated(d.task_id, d.replicas)
            elif isinstance(d, Notice):
                owed.setdefault(d.to, []).append(d)
        out += self.forget_gone_strays(now)  # copyasks.py
        out += self.replica_updates()
        out += self.copy_asks(now)
        out += self.doubt_tick(now, wall)  # doubt.py
        if now >= self.prune_at:
            self.prune_at = now + 60.0
            out += self.prune_finished_copies(wall)
        for dest, notices in sorted(owed.items()):
            for i in range(0, len(notices), NOTICES_PER_MESSAGE):
                out.append(ev.SendNotices(dest, tuple(notices[i : i + NOTICES_PER_MESSAGE])))
        return out

    def notices_undelivered(self, notices: tuple[Notice, ...]) -> None:
        for n in notices:
            self.succession.retell(n.task_id, n.to)

    def on_notices(
        self, sender: m.NodeId, notices: tuple[Notice, ...], now: float, wall: float
    ) -> tuple[list[Notice], list[ev.Instruction]]:
        """A peer's notices: the counter-notices to answer with (ours is the larger
        claim) and what to do."""
        self._sync_succession(only={n.task_id for n in notices})
        answers: list[Notice] = []
        out: list[ev.Instruction] = []
        for n in notices:
            old = self.succession.record(n.task_id)
            action = self.succession.on_notice(n)
            if action is NoticeAction.STALE:
                mine = self.succession.notice_for(n.task_id, sender)
                if mine is not None:
                    answers.append(mine)
            elif action in (NoticeAction.DROP, NoticeAction.FORWARD):
                d = self._counter(n, old)
                if d is None:
                    out += self._yield(n, wall)
                else:  # we claim above it: our adoption's lost tie, or as its runner
                    ours = d.from_home == self.node
                    out += self._reclaim(d) if ours else self._adopt(d, now, wall)
                    answers += filter(None, [self.succession.notice_for(n.task_id, sender)])
            copy = self.held.get(n.task_id)
            rec = self.succession.record(n.task_id)
            if copy is not None and rec is not None and rec.home != copy.home:
                # someone took the task over: its new replicas get its copy from it
                out += self.drop_held(n.task_id)
        return answers, out

    # ----------------------------------------------------------- helpers

    def _unheard(self, now: float, wall: float) -> list[ev.Instruction]:
        """Members our handoff entries name that our view has never heard of, once we
        have been among peers UNHEARD_AFTER: taken as gone (left) from now on, so a
        home entry held there is re-queued here and a guest task of such a home is
        adopted after the grace, as for a death we saw."""
        if self.peer_since is None or now - self.peer_since < UNHEARD_AFTER:
            return []
        hs = self.handoffs
        named = {ge.home for ge in hs.guest.entries.values()}
        named |= {c.home for c in self.held.values()}
        named |= {n for nodes in self.strays.values() for n in nodes}  # owed a release
        out_there = (h.HomePhase.REMOTE, h.HomePhase.OFFERING)
        named.update(
            n
            for he in hs.home.entries.values()
            if he.phase in out_there
            for n in (he.where, he.target)
        )
        out: list[ev.Instruction] = []
        for node in sorted(named - self.heard - {self.node, ""}):
            self.heard.add(node)
            self.succession.on_member(node, m.MemberState.LEFT, now)
            out.append(ev.log("warning", "failover.unheard", peer=node))
            out += self.on_node_dead(node, now, wall)
        return out

    def _sync_succession(self, only: Iterable[m.TaskId] | None = None) -> None:
        """Hold in the succession core a record of every task that could change hands
        here: those we hold for other homes, those of ours held elsewhere, those we
        adopted; release the others. `only`: just these tasks (a notices message
        names a few of them; syncing all cost ~10 ms a message at 10,000 tasks)."""
        if only is not None:
            have = self.succession.records()
            for tid in only:
                self._sync_one(tid, self._wanted(tid), have.get(tid))
            return
        want = self._wants_all()
        succ = self.succession
        have = succ.records()
        me, guests = self.node, self.handoffs.guest.entries
        for tid, w in want.items():  # _sync_one, inlined: once a second over thousands
            rec = have.get(tid)
            if (
                rec is None
                or rec.home != w[0]
                or rec.epoch != w[1]
                or rec.runner != w[2]
                or rec.replicas != w[3]
            ):
                own = w[0] == me or tid in guests
                succ.hold(tid, *w, _version(rec, w) if own else 0)
        for tid in have.keys() - want.keys():
            succ.release(tid)
        active = self.records.active
        for tid in self.adopted:  # one that ended keeps its record (for the notices)
            if tid not in active:
                succ.ended(tid)  # and needs no new replicas

    def _wants_all(self) -> dict[m.TaskId, _Want]:
        """`_wanted` of every task that has one, by passes over each collection."""
        me = self.node
        want: dict[m.TaskId, _Want] = {}
        for tid, c in self.held.items():
            if c.final is None:  # a finished copy is an answer, never adopted
                want[tid] = (c.home, c.epoch, c.runner, c.replicas)
        epoch_of, held = self.succession.epoch_of, self.held
        for tid, ge in self.handoffs.guest.entries.items():
            e = max(epoch_of(tid, ge.home), ge.epoch >> 32)
            copy = held.get(tid)
            if copy is not None and copy.home == ge.home and copy.epoch > e:
                e = copy.epoch  # (_guest_epoch, inlined)
            want[tid] = (ge.home, e, me, ())
        for tid, copies in self.mine.items():  # ours, with copies elsewhere
            if tid not in self.adopted:
                want[tid] = (me, 1, None, copies)
        # _home_want, inlined (a call per entry cost 1-3 ms a tick at 10,000, stop 47);
        # test_copies_stateful checks after every step that the two agree
        adopted, mine, done = self.adopted, self.mine, h.HomePhase.DONE
        for tid, he in self.handoffs.home.entries.items():
            if tid in adopted:
                at = he.where if he.where not in ("", me) else me
                want[tid] = (me, adopted[tid][1], at, mine.get(tid, ()))
            elif he.phase is not done:
                copies = mine.get(tid, ())
                if copies or he.where not in ("", me):
                    want[tid] = (me, 1, he.where if he.where not in ("", me) else None, copies)
        return want

    def _wanted(self, tid: m.TaskId) -> _Want | None:
        """What `_sync_succession` wants held for one task (the same precedence as its
        passes over all: copy, guest entry, our copies, our home entry)."""
        me = self.node
        w: _Want | None = None
        c = self.held.get(tid)
        if c is not None and c.final is None:
            w = (c.home, c.epoch, c.runner, c.replicas)
        ge = self.handoffs.guest.entries.get(tid)
        if ge is not None:
            w = (ge.home, self._guest_epoch(tid, ge), me, ())
        copies = self.mine.get(tid)
        if copies is not None and tid not in self.adopted:
            w = (me, 1, None, copies)
        he = self.handoffs.home.entries.get(tid)
        if he is not None:
            w = self._home_want(tid, he) or w
        return w

    def _guest_epoch(self, tid: m.TaskId, ge: h.GuestEntry) -> int:
        """The claim a task we run for its home is held at: the succession core or our
        copy of it may know it (stop 53: held at 1 after a restart, an old home's
        stale copy was taken over an adopter's); an adopter's handoff epochs carry it
        (claim << 32, `_claim`): stop 54, a runner restarted after its adopter died
        adopted at the adopter's own claim, and lost the tie to it."""
        home = ge.home
        e = max(self.succession.epoch_of(tid, home), ge.epoch >> 32)
        c = self.held.get(tid)
        return c.epoch if c is not None and c.home == home and c.epoch > e else e

    def _home_want(self, tid: m.TaskId, he: h.HomeEntry) -> _Want | None:
        me = self.node
        copies = self.mine.get(tid, ())
        if tid in self.adopted:
            at = he.where if he.where not in ("", me) else me
            return (me, self.adopted[tid][1], at, copies)
        if he.phase is not h.HomePhase.DONE and (copies or he.where not in ("", me)):
            return (me, 1, he.where if he.where not in ("", me) else None, copies)
        return None

    def _sync_one(self, tid: m.TaskId, w: _Want | None, rec: Record | None) -> None:
        if w is None:
            if rec is not None:
                self.succession.release(tid)
            return
        home, epoch, runner, copies = w
        if (
            rec is None
            or rec.home != home
            or rec.epoch != epoch
            or rec.runner != runner
            or rec.replicas != copies
        ):
            own = home == self.node or tid in self.handoffs.guest.entries
            self.succession.hold(tid, home, epoch, runner, copies, _version(rec, w) if own else 0)

    def _counter(self, n: Notice, old: Record | None) -> Adopt | None:
        """A claim naming no runner but its claimant, over a task that ended here (its
        end not yet taken): claimed above (succession.py `counter`). A run still going
        here yields, as before (one of two runs stops)."""
        tid = n.task_id
        t = self.records.get_cached(tid)
        if old is None or t is None or not t.state.terminal:
            return None
        ours = old.home == self.node
        if tid not in (self.adopted if ours else self.handoffs.guest.entries):
            return None
        return self.succession.counter(tid, old, n)

    def _reclaim(self, d: Adopt) -> list[ev.Instruction]:
        """Our adoption, claimed again above the tie it lost (`_counter`)."""
        tid, frm = d.task_id, self.adopted[d.task_id][0]
        self.adopted[tid] = (frm, d.epoch)
        log = ev.log("warning", "failover.claimed_again", task=tid, epoch=d.epoch)
        return [ev.Persist((ev.Put(ADOPT + tid, [frm, d.epoch]),), durable=True), log]

    def _adopt(self, d: Adopt, now: float, wall: float) -> list[ev.Instruction]:
        tid = d.task_id
        ge = self.handoffs.guest.adopt(tid)
        if ge is None:
            return self._adopt_copy(d, now, wall)
        spec = attrs.evolve(ge.spec, home=self.node)
        cause = f"adopted from {d.from_home}: {d.reason}"
        t = self.records.get_cached(tid)
        if t is None:  # only offered here (no commit came): it is queued here now
            t = m.new_task(spec, wall, self.node, cause=cause)
        else:
            note = m.Transition(wall, t.state, t.state, cause, self.node)
            t = attrs.evolve(t, spec=spec, history=(*t.history, note))
        out: list[ev.Instruction] = []
        if t.state is S.MIGRATING and tid not in self.running:
            # its move waited on the dead home: it runs here again, from its checkpoint
            t = m.transition(t, S.QUEUED, wall, "move not carried out: runs here again")
        if t.spec.at_most_once and t.state is S.QUEUED:
            t = m.transition(t, S.LOST, wall, not_run_again(d.from_home))
            if tid in self.ledger:
                self.ledger.remove(tid)
            out += [ev.Dequeue(tid), ev.LoadChanged()]
        copy = self.held.pop(tid, None)  # a copy we kept as well: not needed now
        # handoff epochs above any the old home used, carrying the claim (_guest_epoch)
        handoff_epoch = max(ge.epoch, d.epoch << 32)
        out += self._claim(d, t, handoff_epoch, wall, drop_copy=copy is not None)
        if d.replicas and not t.state.terminal:
            # copies at the nodes the claim names (the known cluster's count: a runner's
            # record names none, its old home's replicas unknown here), so that the task
            # outlives this node too (replica_update sends each the whole copy); none
            # live: named as members come back (succession's `short`)
            out += self.rereplicated(tid, d.replicas)
        if t.state is S.QUEUED and tid not in self.queued and tid not in self.running:
            out += self.enqueue_local(t, now)
        out.append(ev.KickRunner())  # a queued copy waiting for its home may start now
        return out

    def _adopt_copy(self, d: Adopt, now: float, wall: float) -> list[ev.Instruction]:
        """A replica takes its copy's task over: queued here as its home, placed again.
        Handoff epochs start above any its old home could have used (claim << 32)."""
        tid = d.task_id
        copy = self.held.pop(tid, None)
        if copy is None:  # nothing held here after all (cannot happen: synced first)
            return []
        spec = attrs.evolve(copy.spec, home=self.node)
        cause = f"adopted from {d.from_home}: {d.reason}"
        ran = self.records.get_cached(tid)
        if ran is not None and ran.state.terminal:
            # we ran it, and its home took our report of the end, then died before its
            # copies heard of it: adopted as ended, never run again (stop 52: the
            # copies test with lost homes coming back ran such a task twice)
            note = m.Transition(wall, ran.state, ran.state, cause, self.node)
            t = attrs.evolve(ran, spec=attrs.evolve(ran.spec, home=self.node))
            t = attrs.evolve(t, history=(*t.history, note))
            return self._claim(d, t, d.epoch << 32, wall, drop_copy=True)
        t = m.new_task(spec, wall, self.node, cause=cause)
        if spec.at_most_once:
            t = m.transition(t, S.LOST, wall, not_run_again(d.from_home))
            return self._claim(d, t, d.epoch << 32, wall, drop_copy=True)
        out = self._claim(d, t, d.epoch << 32, wall, drop_copy=True)
        if d.replicas:
            out += self.rereplicated(tid, d.replicas)
        return [*out, ev.Place(tid)]

    def _claim(
        self, d: Adopt, t: m.Task, handoff_epoch: int, wall: float, drop_copy: bool
    ) -> list[ev.Instruction]:
        """Both adoptions' bookkeeping: the record (its home now this node), a home
        entry at `handoff_epoch`, the claim (`adopt:<id>`), journaled in that order
        before anything leaves; a log line and a `swarm explain` entry."""
        tid = t.id
        self.records.store(t)
        self.handoffs.home.adopt(t.spec, handoff_epoch, finished=t.state.terminal)
        self.adopted[tid] = (d.from_home, d.epoch)
        self.counters["adopted"] = self.counters.get("adopted", 0) + 1
        ops = [*self.handoffs.persist_ops([tid], wall), ev.Put(ADOPT + tid, [d.from_home, d.epoch])]
        if drop_copy:
            ops.append(ev.Delete(REPLICA + tid))
        role = "runner" if d.as_runner else "replica"
        why = {"outcome": f"adopted as its {role}, claim epoch {d.epoch}: {d.reason}"}
        return [
            ev.Record(t, durable=True),
            ev.Persist(tuple(ops), durable=True),
            ev.log("warning", "failover.adopted", task=tid, home=d.from_home, epoch=d.epoch),
            self.explain(tid, why, wall),
        ]

    def _yield(self, n: Notice, wall: float) -> list[ev.Instruction]:
        """`n.home` holds the task's home role by a larger claim than ours. Our record's
        change (forgotten, or re-homed) is journaled before our keys' deletes, in their
        durable write: a crash between them left, before stop 52, a record of ours with
        no home entry, which the restart took for an interrupted offer and ran again
        (the copies stateful test)."""
        tid = n.task_id
        self.handoffs.home.yield_to(tid)
        self.handoffs.guest.adopt(tid)  # a copy we held for the old home: gone too
        self.adopted.pop(tid, None)
        replicas = self.forget_replicas(tid)
        self.counters["yielded"] = self.counters.get("yielded", 0) + 1
        ops = self.handoffs.persist_ops([tid], wall)
        ops += [ev.Delete(HOME + tid), ev.Delete(ADOPT + tid)]
        record: list[ev.Instruction] = []
        after: list[ev.Instruction] = []
        why = f"{n.home} holds it now (adoption, epoch {n.epoch})"
        if tid in self.running:
            # a copy runs here too: stop it; our record of that run stays, as a copy
            # that points at the new home (no report goes anywhere: no entry is left)
            t = self.records.get_cached(tid)
            if t is not None:
                t = attrs.evolve(t, spec=attrs.evolve(t.spec, home=n.home))
                self.records.store(t)
                record.append(ev.Record(t))
            after.append(ev.StopRun(tid, why))
        else:
            if tid in self.queued:
                after.append(ev.Dequeue(tid))
            self.ledger.remove(tid)
            after += self.release_gpu(tid)
            self.arrived.pop(tid, None)
            if self.records.get_cached(tid) is not None:
                self.records.forget(tid)
                record.append(ev.Forget(tid))
        log = ev.log("warning", "failover.yielded", task=tid, to=n.home, epoch=n.epoch)
        return [*record, ev.Persist(tuple(ops), durable=True), *replicas, log, *after]


def _version(rec: Record | None, w: _Want) -> int:
    """The version to hold a record we know first-hand at (our own task's; one we
    run): the held one's, for the same claim. Before stop 53 it was 0, older than a
    re-replicated record's (version 1 and up), so `hold` refused it: the home's record
    kept the runner it had when it named new replicas, and the runner's named none,
    so its runner did not adopt the task once the home was lost. A copy's news is
    second-hand: held at 0, a notice's newer record wins over it."""
    return rec.version if rec is not None and rec.home == w[0] and rec.epoch == w[1] else 0


def not_run_again(home: m.NodeId) -> str:
    """Why an adopted `--at-most-once` task that is not running here ends lost: its
    home may only be cut off, and may place it again on its side (fencing.py)."""
    return (
        f"not run again: its home {home} is gone, and may only be cut off with a copy"
        " running on its side (--at-most-once; resubmit it)"
    )


def restore_adopted(kv: dict[str, Any]) -> dict[m.TaskId, tuple[m.NodeId, int]]:
    """The adoptions journaled here (`adopt:<id>` -> [old home, epoch])."""
    out: dict[m.TaskId, tuple[m.NodeId, int]] = {}
    for key, value in kv.items():
        if key.startswith(ADOPT):
            try:
                out[key[len(ADOPT) :]] = (str(value[0]), int(value[1]))
            except (TypeError, ValueError, IndexError):
                continue
    return out
