"""Copies made late (pure; stop 54): a home's own task accepted with fewer copies than
the known cluster calls for gets them once members are there to hold them.

A submission is copied to as many live members as the known cluster calls for
(replicas.py `choose_replicas`, by the succession view's known size). With every peer
down, or on a cluster of two (no copy wanted) that grows to three, it got fewer, none
at all, and none was added later: the task died with its home's disk, even after its
peers were back. An adoption already names more as members come back (succession's
`short` rule); a home's own task did not.

So when a member comes into this node's view alive (from dead, left or never heard
of: `member_changing`, copyasks.py; a restart hears every member anew), or a
submission was accepted with fewer copies than it asked for (its peers live but not
answering in time: `replicas_chosen`), the next
failover tick looks over this node's own plain active tasks and names replicas for
each one short of the count (`rereplicated`, as for an adopter's new replicas: the
`repls:` entry journaled durably, the whole copy sent at that tick, retried until
held). Not looked at: arrays, dependent tasks, gangs and global tasks (never copied:
they need their home), adoptions (succession's rule), tasks this home is in doubt
about (doubt.py: it may not be their authority now), and a submission whose own
copies are still being asked for (`copying`). A replica that is gone is
replaced by succession's `Rereplicate`, as before.

What it costs: one pass over the active tasks per member that comes back (a set
lookup each; the rendezvous hash only for a task short of copies), and one copy round
trip per task topped up, at that tick. Who can do what: nothing new. Copies go only to
members of this node's view, as a submission's do; a key holder that gossips a member
alive makes this home send it copies of tasks short of them, which it could ask for
(`ask`) or be sent at submission already.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import model as m
from ..cluster.succession import Succession
from . import events as ev
from .records import TaskRecords


def copied(spec: m.TaskSpec) -> bool:
    """Is a task of this kind copied at all? Only a plain one: runtime/localops.py
    journals the others at their home alone (they need it)."""
    return not (spec.is_global or spec.after or spec.array or spec.gang is not None)


class CopiesTopUp:
    """The top-up part of NodeState (state.py), which holds the fields below."""

    node: m.NodeId
    records: TaskRecords
    mine: dict[m.TaskId, tuple[m.NodeId, ...]]
    adopted: dict[m.TaskId, tuple[m.NodeId, int]]
    doubted: set[m.TaskId]
    copying: set[m.TaskId]  # replicas.py: a submission's own copies being made
    strays: dict[m.TaskId, frozenset[m.NodeId]]  # replicas.py
    succession: Succession
    topup_due: bool  # a member came into view alive since the last look (or a restart)

    if TYPE_CHECKING:  # provided by replicas.py

        def choose_replicas(
            self, task_id: m.TaskId, live: list[m.NodeId], extra: int = 2
        ) -> tuple[int, tuple[m.NodeId, ...]]: ...
        def rereplicated(
            self, tid: m.TaskId, nodes: tuple[m.NodeId, ...]
        ) -> list[ev.Instruction]: ...
        def _set_strays(
            self, task_id: m.TaskId, nodes: frozenset[m.NodeId], durable: bool = False
        ) -> list[ev.Instruction]: ...

    def copies_topup(self) -> list[ev.Instruction]:
        """New replicas for our own tasks short of copies, once a member is back."""
        if not self.topup_due:
            return []
        live = self.succession.alive()
        if not live:
            return []  # looked at once one is
        self.topup_due = False
        k, _ = self.choose_replicas("", live, 0)
        if k == 0:
            return []
        out: list[ev.Instruction] = []
        topped = 0
        mine, adopted, doubted, me = self.mine, self.adopted, self.doubted, self.node
        for tid, t in self.records.active.items():
            have = mine.get(tid, ())
            if len(have) >= k or t.spec.home != me or tid in adopted or tid in doubted:
                continue
            if tid in self.copying or not copied(t.spec):
                continue
            _, order = self.choose_replicas(tid, live, len(have))
            added = tuple(n for n in order if n not in have)[: k - len(have)]
            if added:
                topped += 1
                out += self.rereplicated(tid, (*have, *added))
                strays = self.strays.get(tid, frozenset())
                if strays & set(added):  # asked before, unanswered: a replica now
                    out += self._set_strays(tid, strays - set(added), durable=True)
        if topped:
            out.append(ev.log("info", "replica.topped_up", tasks=topped))
        return out
