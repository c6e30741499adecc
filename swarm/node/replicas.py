"""Replicas of tasks (pure; issue 19): a task queued at its home is lost with the
home's disk unless another node keeps a copy. With `replicas = k` (default 2 on
clusters of 3 or more), a submission is acknowledged once k-1 other nodes, the first
of the task id's rendezvous order over live members (cluster/succession.py), have
journaled a copy of it (`replica:<id>`): its spec, its home, where it runs.

* **Home side.** The home remembers whom it gave copies (`repls:<id>`) and keeps them
  current from its own records, one message per change, retried each failover tick
  until acknowledged: the runner at the first tick after the task is committed
  elsewhere (or none, back at home; a task that ended before that tick skips it),
  `release` at once when it ended, with how (`Final`), then `repls:<id>` goes; the
  replica keeps that answer (for `swarm status` when the home is lost after the end)
  for FINISHED_COPY_KEEP, never adopting it. A replica
  gone for a grace is replaced (succession's `Rereplicate`): the new one gets the
  whole copy.
* **Replica side.** A copy is accepted from the task's home only (its spec names the
  sender its home), or from whoever took the home role over. When the home has been
  SWIM-dead for the grace and the runner too (or there is none, or the home ran it
  itself), the first live replica adopts the task (failover.py): it becomes its home
  and places it again. A copy whose task someone else took over, naming other
  replicas, is dropped.

What it costs and what it bounds: one round trip and one fsync at the replica per
submission before the answer; one message per placement that outlives a failover
tick (<= 1 s) and one per end, after the fact, batched per peer (runtime/
replicabatch.py). The runner is learnt up to a tick after the commit: a home that dies
in that window leaves a replica that may adopt a task its runner adopts too; the
larger claim wins and the other copy is stopped (at-least-once, recorded). A task that
ended just before its home died may be run again by its replica for the same reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from .. import codec
from .. import model as m
from ..cluster import handoff as h
from ..cluster.succession import Succession, claim_key, replica_of, replicas_wanted
from . import events as ev
from .records import TaskRecords
from .recovery import REPLICA, REPLICAS, STRAYS, Handoffs
from .replicamsg import (
    ASK,
    FINAL_STATES,
    HOLD,
    RELEASE,
    RUNNER,
    Final,
    Held,
    ReplicaMsg,
    Restored,
    replica_msg_from_wire,
    replica_msg_to_wire,
    restore_replicas,
)

__all__ = [
    "ASK",
    "FINAL_STATES",
    "HOLD",
    "RELEASE",
    "RUNNER",
    "Final",
    "Held",
    "ReplicaMsg",
    "Restored",
    "replica_msg_from_wire",
    "replica_msg_to_wire",
    "restore_replicas",
]

FINISHED_COPY_KEEP = 7 * 86400.0  # seconds a finished copy is kept (keep-finished's default)
ENDED_UNHELD_KEEP = 600.0  # seconds a release for a copy not held here refuses late copies
ENDED_UNHELD_MAX = 65536  # ... and how many such releases are remembered at most
COPIES_SWEEP_EVERY = 60  # failover ticks between looks at every task's copies


class Replicas:
    """The replica part of NodeState (state.py), which holds the fields below."""

    node: m.NodeId
    records: TaskRecords
    handoffs: Handoffs
    replicas_wanted: int | None  # the configured copies (None: by cluster size)
    mine: dict[m.TaskId, tuple[m.NodeId, ...]]  # our tasks -> the nodes holding copies
    sent: dict[tuple[m.TaskId, m.NodeId], tuple[str, m.NodeId | None]]  # acknowledged
    copies_owed: set[m.TaskId]  # tasks sent a message at the last tick, or chosen since
    copying: set[m.TaskId]  # submissions whose copies are being asked for (topup.py)
    topup_due: bool  # topup.py
    copies_ticks: int  # failover ticks so far (every COPIES_SWEEP_EVERY looks at all)
    # our tasks -> nodes asked for a copy that gave no answer, so may hold one (a lost
    # answer, not a lost request): each is sent the release once the task ended
    strays: dict[m.TaskId, frozenset[m.NodeId]]
    succession: Succession
    # releases with how the task ended, for tasks of which we held no copy (a stray's
    # release that overtook the copy itself): task -> when it ended (wall)
    ended_unheld: dict[m.TaskId, float]
    held: dict[m.TaskId, Held]  # copies of other homes' tasks
    doubted: set[m.TaskId]  # doubt.py: our tasks someone may have taken over
    adopted: dict[m.TaskId, tuple[m.NodeId, int]]  # failover.py: ours by a claim above 1
    counters: dict[str, int]

    if TYPE_CHECKING:  # copyasks.py

        def on_ask(
            self, sender: m.NodeId, msg: ReplicaMsg
        ) -> tuple[str | None, list[ev.Instruction]]: ...
        def ask_answered(self, msg: ReplicaMsg) -> list[ev.Instruction]: ...
        def copies_topup(self) -> list[ev.Instruction]: ...  # topup.py

    # ------------------------------------------------------------ home side

    def choose_replicas(
        self, task_id: m.TaskId, live: list[m.NodeId], extra: int = 2
    ) -> tuple[int, tuple[m.NodeId, ...]]:
        """How many copies to make (besides ours) and the candidates in order (the
        first `k`, then `extra` more to try if some do not answer)."""
        members = [n for n in live if n != self.node]
        # by the known cluster's size, a member down included (stop 53: by the live
        # members', a task submitted on three nodes while one was down got no copy at
        # the third), as many as are live to ask
        size = max(len(members) + 1, self.succession.known_size())
        k = min(replicas_wanted(size, self.replicas_wanted) - 1, len(members))
        return k, replica_of(task_id, self.node, members, k + extra) if k > 0 else ()

    def replicas_planned(self, task_id: m.TaskId, nodes: tuple[m.NodeId, ...]) -> ev.Put | None:
        """What to journal with a new task's own record (issue 23): the nodes about to
        be asked for copies (`repls:`), so that the answer need not wait for a second
        write once they hold them. Naming a node that then holds none is harmless: a
        home that restarts sends every replica it names the whole copy, since none is
        known to hold one (`sent` starts empty). Until `replicas_chosen`, the task's
        copies are being made (`copying`: topup.py leaves it alone)."""
        if not nodes:
            return None
        self.copying.add(task_id)
        return ev.Put(REPLICAS + task_id, list(nodes))

    def copies_given_up(self, task_id: m.TaskId) -> None:
        """A submission's record could not be written: its planned copies are not
        being made (`copying` forgets it; it is no task here)."""
        self.copying.discard(task_id)

    def replicas_chosen(
        self,
        task_id: m.TaskId,
        nodes: tuple[m.NodeId, ...],
        told: tuple[m.NodeId, ...] = (),
        planned: tuple[m.NodeId, ...] = (),
        unanswered: tuple[m.NodeId, ...] = (),
    ) -> list[ev.Instruction]:
        """These nodes journaled a copy of our task (the submission's answer waits for
        this write, unless `planned`, journaled with the task, named them already).
        `told`: the replicas their copy names; when a stand-in holds one in place of a
        node that did not answer, each is told the real ones at the next tick (chaos
        home-loss: a copy naming a replica that held none waited for it to adopt, and
        nobody adopted the task).

        `unanswered`: nodes asked that gave no answer. One whose answer was lost, not
        its request, holds a copy nobody keeps current (chaos shim: a stray copy still
        `queued` long after the task succeeded, answered by `swarm status` there when
        the home was slow, and one its holder would adopt, and run again, if the home
        were lost): each gets the task's release, with how it ended (`strays`)."""
        out: list[ev.Instruction] = []
        self.copying.discard(task_id)
        if len(nodes) < len(told or planned):
            self.topup_due = True  # accepted short: topup.py asks again at the next tick
        old = self.strays.get(task_id, frozenset())
        strays = (old | frozenset(unanswered)) - frozenset(nodes)
        if strays != old:
            out += self._set_strays(task_id, strays)
        if not nodes:
            # none answered: the planned entry names nodes without copies (harmless,
            # see replicas_planned); drop it, no need to wait for that
            return [*out, ev.Persist((ev.Delete(REPLICAS + task_id),))] if planned else out
        self.mine[task_id] = nodes
        self.copies_owed.add(task_id)
        same = set(told or nodes) == set(nodes)
        for n in nodes:
            self.sent[(task_id, n)] = (RUNNER, None) if same else ("stale", None)
        if set(planned) == set(nodes):
            return out
        return [*out, ev.Persist((ev.Put(REPLICAS + task_id, list(nodes)),), durable=True)]

    def stand_in_asked(self, task_id: m.TaskId, nodes: frozenset[m.NodeId]) -> list[ev.Instruction]:
        """Before a stand-in is asked for a copy (the first nodes asked did not all
        answer): it, and those that did not answer, are strays until `replicas_chosen`
        says otherwise, written durably first, so that a home killed while it waits for
        the answers still releases their copies once restarted (chaos late-binding: a
        home killed 6 s into a copy round left an unreleased copy at a stand-in; the
        first nodes asked are named by the task's own `repls:` entry already)."""
        old = self.strays.get(task_id, frozenset())
        if nodes <= old:
            return []
        return self._set_strays(task_id, old | nodes, durable=True)

    def _set_strays(
        self, task_id: m.TaskId, nodes: frozenset[m.NodeId], durable: bool = False
    ) -> list[ev.Instruction]:
        if nodes:
            self.strays[task_id] = nodes
            return [ev.Persist((ev.Put(STRAYS + task_id, sorted(nodes)),), durable=durable)]
        self.strays.pop(task_id, None)
        return [ev.Persist((ev.Delete(STRAYS + task_id),))]

    def hold_msg(self, spec: m.TaskSpec, replicas: tuple[m.NodeId, ...]) -> ReplicaMsg:
        return ReplicaMsg(
            HOLD, spec.id, self.node, None, replicas, spec, epoch=self._epoch(spec.id)
        )

    def _epoch(self, tid: m.TaskId) -> int:
        """Our claim on a task of ours: 1, or the epoch we adopted it at."""
        a = self.adopted.get(tid)
        return 1 if a is None else a[1]

    def _wanted_state(self, tid: m.TaskId) -> tuple[str, m.NodeId | None]:
        t = self.records.get_cached(tid)
        if t is None or t.state.terminal or t.spec.home != self.node:
            return (RELEASE, None)
        he = self.handoffs.home.entries.get(tid)
        if he is not None and he.phase is h.HomePhase.REMOTE and he.where != self.node:
            return (RUNNER, he.where)
        return (RUNNER, None)

    def copies_to_look_at(self, sweep: bool | None = None) -> set[m.TaskId]:
        """The tasks whose copies the next tick looks at: those that were sent a
        message not yet answered, or whose record changed since (the only input of
        what a copy is owed besides our own sends and answers: `_wanted_state` reads
        the record and the home's handoff entry, whose changes come with the
        record's), with strays; at the first tick and every COPIES_SWEEP_EVERY, all
        (a home with 10,000 tasks out spent ~15 ms a tick looking at each, stop 45)."""
        if sweep is None:
            sweep = self.copies_ticks % COPIES_SWEEP_EVERY == 0
        if sweep:
            return self.mine.keys() | self.strays.keys()
        touched = {t for t in self.records.touched if t in self.mine}
        return self.copies_owed | touched | self.strays.keys()

    def replica_updates(self) -> list[ev.Instruction]:
        """Messages owed to our tasks' replicas (retried each tick until answered);
        first, new replicas for our tasks short of copies once a member is back."""
        topped = self.copies_topup()
        look = self.copies_to_look_at()
        self.copies_ticks += 1
        self.records.touched.clear()
        out: list[ev.Instruction] = []
        owed: set[m.TaskId] = set()
        for tid in sorted(look):
            msgs = self.replica_update(tid)
            if msgs:
                owed.add(tid)
                out += msgs
        self.copies_owed = owed
        return topped + out

    def _stray_releases(self, tid: m.TaskId) -> list[ev.Instruction]:
        """Once the task ended (or is no longer ours), a release with how it ended to
        each node that may hold a stray copy of it: the copy becomes an answer for
        `swarm status`, never adopted; a node without one changes nothing."""
        nodes = self.strays.get(tid, frozenset()) - set(self.mine.get(tid, ()))
        nodes = frozenset(n for n in nodes if self.succession.is_alive(n))  # until back
        if not nodes or self._wanted_state(tid)[0] != RELEASE:
            return []
        t = self.records.get_cached(tid)
        final = Final.of(t) if t is not None and t.state.terminal else None
        msg = ReplicaMsg(RELEASE, tid, self.node, None, self.mine.get(tid, ()), final=final)
        return [ev.SendReplica(n, msg) for n in sorted(nodes)]

    def forget_strays(self, tid: m.TaskId, nodes: frozenset[m.NodeId]) -> list[ev.Instruction]:
        """Stop sending these nodes the release (they answered it, or are gone)."""
        return self._set_strays(tid, self.strays.get(tid, frozenset()) - nodes)

    def replica_update(self, tid: m.TaskId) -> list[ev.Instruction]:
        """The messages owed to one task's replicas (also sent at once when the task
        ends: a replica that has not heard of the end could run it again). None while
        this home is in doubt about the task (doubt.py; its end looks at it again):
        before stop 53 a home back after its grace sent its copies again at once, a
        node that had let the adopter's claim go (a restart forgets claims) kept the
        old home's, out of date, and the old home, told of the adoption, never
        released it."""
        if tid in self.doubted:
            return []
        out: list[ev.Instruction] = self._stray_releases(tid) if tid in self.strays else []
        nodes = self.mine.get(tid, ())
        if nodes:
            want = self._wanted_state(tid)
            t = self.records.get_cached(tid)
            for n in nodes:
                have = self.sent.get((tid, n))
                if have == want:
                    continue
                if have is None and want[0] != RELEASE and t is not None:
                    msg = self.hold_msg(t.spec, nodes)  # a new replica: the whole copy
                    msg = attrs.evolve(msg, runner=want[1])
                else:
                    final = (
                        Final.of(t)
                        if want[0] == RELEASE and t is not None and t.state.terminal
                        else None
                    )
                    msg = ReplicaMsg(
                        want[0], tid, self.node, want[1], nodes, final=final, epoch=self._epoch(tid)
                    )
                out.append(ev.SendReplica(n, msg))
        return out

    def replica_acked(self, dest: m.NodeId, msg: ReplicaMsg) -> list[ev.Instruction]:
        tid = msg.task_id
        if msg.kind == ASK:
            return self.ask_answered(msg)
        out: list[ev.Instruction] = []
        if msg.kind == RELEASE and dest in self.strays.get(tid, ()):
            out += self.forget_strays(tid, frozenset((dest,)))
        if tid not in self.mine or dest not in self.mine[tid]:
            return out
        self.sent[(tid, dest)] = (RELEASE if msg.kind == RELEASE else RUNNER, msg.runner)
        if all(self.sent.get((tid, n), ("",))[0] == RELEASE for n in self.mine[tid]):
            # every copy released: the entry's delete need not land soon (lost in a
            # crash, the restored entry releases them again, answered again; issue 23)
            return [*out, *self.forget_replicas(tid, lazy=True)]
        return out

    def forget_replicas(self, tid: m.TaskId, lazy: bool = False) -> list[ev.Instruction]:
        nodes = self.mine.pop(tid, ())
        for n in nodes:
            self.sent.pop((tid, n), None)
        return [ev.Persist((ev.Delete(REPLICAS + tid),), lazy=lazy)] if nodes else []

    def rereplicated(self, tid: m.TaskId, nodes: tuple[m.NodeId, ...]) -> list[ev.Instruction]:
        """Succession named new replicas for our task: the new ones get the copy. The
        ones replaced (gone for a grace) keep theirs: if they come back, they get the
        release once the task ended, as a stray copy does."""
        old = self.mine.get(tid, ())
        replaced = frozenset(n for n in old if n not in nodes)
        for n in replaced:
            self.sent.pop((tid, n), None)
        self.mine[tid] = nodes
        self.copies_owed.add(tid)
        out: list[ev.Instruction] = []
        if replaced:
            out += self._set_strays(tid, self.strays.get(tid, frozenset()) | replaced)
        return [*out, ev.Persist((ev.Put(REPLICAS + tid, list(nodes)),), durable=True)]

    # --------------------------------------------------------- replica side

    def on_replica(
        self, sender: m.NodeId, msg: ReplicaMsg
    ) -> tuple[str | None, list[ev.Instruction]]:
        """A home's message about its task: (why refused, or None; what to do)."""
        tid = msg.task_id
        if msg.kind == ASK:
            return self.on_ask(sender, msg)
        if msg.home != sender:
            return f"replica of {tid}: sent by {sender}, not by its home {msg.home}", []
        cur = self.held.get(tid)
        if msg.kind == HOLD:
            assert msg.spec is not None  # replica_msg_from_wire checks it
            if (cur is not None and cur.final is not None) or tid in self.ended_unheld:
                # it ended: a late copy of its start changes nothing (the home's request
                # that timed out, delivered after all, even after the release it sent
                # when the task ended over another connection)
                return None, []
            own = self.records.get_cached(tid)
            if own is not None and own.spec.home == self.node:
                if msg.epoch > self._epoch(tid):
                    # an adopter's copy reached its old home, back, before the notice
                    # that makes it let go: taken as none, it was answered as held and
                    # nobody held it (stop 53). Refused: sent again at the next tick
                    return f"{tid} is held here as its home (claim {self._epoch(tid)})", []
                # we are its home now (adopted it): a late copy of its old home's is none
                return None, []
            taken = self._taken_from(tid, sender, msg.epoch)
            if taken is not None:
                # an old home back from the dead sends its copies again (its restart
                # knows of none held): one over an adopter's copy, home and runner out
                # of date, was asked about at that old home, which had let the task go,
                # and dropped: the task was lost (stop 53, the copies walks with a
                # second loss). Its adopter's notice makes it let go.
                return f"{tid} was taken over by {taken[0]} (epoch {taken[1]})", []
            # (a task we run for its home is copied all the same: before stop 45 it was
            # not, when its handoff came first, and once it left here again, back to its
            # home, the home named as its copy a node that had none)
            self.held[tid] = Held(msg.spec, sender, msg.runner, msg.replicas, None, msg.epoch)
            self.counters["replicas_held"] = self.counters.get("replicas_held", 0) + 1
            return None, [self._persist_held(tid)]
        if cur is None and msg.kind == RELEASE and msg.final is not None:
            self.ended_unheld[tid] = msg.final.at
            if len(self.ended_unheld) > ENDED_UNHELD_MAX:
                del self.ended_unheld[next(iter(self.ended_unheld))]
            return None, []
        if cur is None or cur.home != sender:
            return None, []  # released already, or not this home's any more: nothing to do
        if msg.kind == RELEASE and msg.final is not None:
            # it ended: keep how, so that we still answer for it if its home is lost
            cur.final = msg.final
            return None, [self._persist_held(tid)]
        if msg.kind == RELEASE:
            return None, self.drop_held(tid)
        cur.runner = msg.runner
        cur.replicas = msg.replicas or cur.replicas
        cur.epoch = max(cur.epoch, msg.epoch)
        return None, [self._persist_held(tid)]

    def _taken_from(self, tid: m.TaskId, home: m.NodeId, epoch: int) -> tuple[m.NodeId, int] | None:
        """A larger claim than `home`'s `epoch` by another node, known here from the
        succession core or from the copy we hold (a restart reads the copy's claim
        back, not the core's)."""
        rec = self.succession.taken_from(tid, home, epoch)
        if rec is not None:
            return rec.home, rec.epoch
        c = self.held.get(tid)
        if c is None or c.home == home or c.epoch == 1 or c.final is not None:
            return None
        return (c.home, c.epoch) if claim_key(c.epoch, c.home) > claim_key(epoch, home) else None

    def drop_held(self, tid: m.TaskId) -> list[ev.Instruction]:
        if self.held.pop(tid, None) is None:
            return []
        return [ev.Persist((ev.Delete(REPLICA + tid),), durable=True)]

    def _persist_held(self, tid: m.TaskId) -> ev.Persist:
        c = self.held[tid]
        value = {
            "spec": codec.task_spec_to_wire(c.spec),
            "home": c.home,
            "runner": c.runner,
            "replicas": list(c.replicas),
            **({"final": c.final.to_wire()} if c.final is not None else {}),
            **({"epoch": c.epoch} if c.epoch > 1 else {}),
        }
        return ev.Persist((ev.Put(REPLICA + tid, value),), durable=True)

    def prune_finished_copies(self, wall: float) -> list[ev.Instruction]:
        """Finished copies older than FINISHED_COPY_KEEP go (as retention drops old
        records)."""
        old = [
            tid
            for tid, c in self.held.items()
            if c.final is not None and c.final.at < wall - FINISHED_COPY_KEEP
        ]
        for tid in [t for t, at in self.ended_unheld.items() if at < wall - ENDED_UNHELD_KEEP]:
            del self.ended_unheld[tid]
        out: list[ev.Instruction] = []
        for tid in old:
            out += self.drop_held(tid)
        return out
