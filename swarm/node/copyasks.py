"""A copy's holder asks the task's home what became of it (pure; stop 46).

A home sends its copies' news (replicas.py) only to holders live in its view, and
gives up a stray copy's release once its holder has been gone STRAY_GIVE_UP
(forget_gone_strays). A node back after a longer absence (a night's maintenance, a long
partition) kept its copy of a task that ended meanwhile as it was, `queued`: `swarm
status` there answered from it, and had the home been lost later, that node could
have adopted the finished task and run it again.

So the holder asks. Each copy not known to have ended is asked about when its home
comes into this node's view as alive from dead, left or never heard of (a restart
hears every member anew, so every such copy is asked after one), and once an hour for
a copy held that long without news of its end, whatever way that news went astray.
The ask is a replica message of its own kind (`ask`), holder to home, in batches of
asks alone (an agent before this refuses the kind, and with it only the asks' batch),
sent at the next failover ticks until answered, ASK_TRIES times at most.

The home answers by its usual rules, nothing new: a node that is one of the task's
replicas, or a stray it still owes a release, is kept current already; any other is
taken as a stray of the task (journaled), sent the release once the task ended, with
how, or at once when the home no longer has it as its own (forgotten by retention, or
taken over): a copy released without an end is dropped.

Who can do what: only a key holder sends replica messages. By asking, one can make a
home send it, and only it, the release of a task of that home once the task ended,
with its end (state, exit code, a reason cut to 512 bytes): no more than a key
holder's peer RPCs already reach. An ask about a task whose home is not the node asked
is refused. A network attacker can do nothing (authenticated transport).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import model as m
from ..cluster.succession import GONE, Succession
from . import events as ev
from .replicas import ASK, Held, ReplicaMsg

STRAY_GIVE_UP = 3600.0  # seconds gone after which a stray copy's release is given up
ASK_TRIES = 3  # failover ticks an ask is sent at before it is given up (its home is old)
ASKS_PER_TICK = 2048  # asks sent at one tick at most
RECHECK_AFTER = 3600.0  # seconds a copy not known to have ended goes before it is asked
RECHECK_SWEEP = 600.0  # seconds between looks for such copies


class CopyAsks:
    """The asking part of NodeState (state.py), which holds the fields below."""

    node: m.NodeId
    held: dict[m.TaskId, Held]
    mine: dict[m.TaskId, tuple[m.NodeId, ...]]
    strays: dict[m.TaskId, frozenset[m.NodeId]]
    copies_owed: set[m.TaskId]
    succession: Succession
    counters: dict[str, int]
    # copies to ask their home about -> tries left; homes back since the last tick
    copies_to_ask: dict[m.TaskId, int]
    homes_back: set[m.NodeId]
    topup_due: bool  # topup.py
    # copies not known to have ended -> when a sweep first saw them, or last asked
    copies_seen_at: dict[m.TaskId, float]
    recheck_at: float  # the next sweep (our now)

    if TYPE_CHECKING:  # provided by replicas.py

        def _set_strays(
            self, task_id: m.TaskId, nodes: frozenset[m.NodeId], durable: bool = False
        ) -> list[ev.Instruction]: ...
        def forget_strays(
            self, tid: m.TaskId, nodes: frozenset[m.NodeId]
        ) -> list[ev.Instruction]: ...

    def forget_gone_strays(self, now: float) -> list[ev.Instruction]:
        """Nodes that may hold a stray copy (replicas.py `strays`) are sent its release
        only while they are live in this view, and given up once gone for
        STRAY_GIVE_UP: one back later asks when it sees us alive again. Called by
        failover.py's tick; a node the view never named is taken as gone there
        (`_unheard`), as for handoffs."""
        out: list[ev.Instruction] = []
        for tid, nodes in list(self.strays.items()):
            gone = frozenset(
                n for n in nodes if (self.succession.gone_for(n, now) or 0.0) >= STRAY_GIVE_UP
            )
            if gone:
                out += self.forget_strays(tid, gone)
        return out

    def member_changing(self, node: m.NodeId, state: m.MemberState) -> None:
        """Before the view takes `node`'s new state: alive after gone or unknown?"""
        if state is m.MemberState.ALIVE and node != self.node:
            prior = self.succession.member_state(node)
            if prior is None or prior in GONE:
                self.homes_back.add(node)
                self.topup_due = True  # topup.py: our tasks short of copies get them

    def copy_asks(self, now: float) -> list[ev.Instruction]:
        """The asks owed this tick, to homes live in this view."""
        if self.homes_back:
            back, self.homes_back = self.homes_back, set()
            for tid, copy in self.held.items():
                if copy.final is None and copy.home in back:
                    self.copies_to_ask[tid] = ASK_TRIES
        if now >= self.recheck_at:
            self._recheck(now)
        if not self.copies_to_ask:
            return []
        out: list[ev.Instruction] = []
        for tid in list(self.copies_to_ask):
            if len(out) >= ASKS_PER_TICK:
                break  # the rest at the next ticks (a restart with many copies)
            c = self.held.get(tid)
            left = self.copies_to_ask[tid]
            home = None if c is None else self.succession.member_state(c.home)
            # not held any more, ended, out of tries, or its home gone again (asked
            # anew when it comes back)
            if c is None or c.final is not None or left <= 0 or home is None or home in GONE:
                del self.copies_to_ask[tid]
                continue
            if home is not m.MemberState.ALIVE:
                continue  # suspect: asked once it is alive, its tries kept
            del self.copies_to_ask[tid]  # to the back: the others are asked next
            self.copies_to_ask[tid] = left - 1
            out.append(ev.SendReplica(c.home, ReplicaMsg(ASK, tid, c.home)))
        if out:  # `swarm info`: coordinator.copy_asks_sent (and the homes' copy_asks)
            self.counters["copy_asks_sent"] = self.counters.get("copy_asks_sent", 0) + len(out)
        return out

    def _recheck(self, now: float) -> None:
        """Copies not known to have ended, held for RECHECK_AFTER since a sweep first
        saw them (or since they were last asked), are asked about: whatever way a
        copy's news went astray (a release that overtook the copy itself, a stray its
        home gave up on while both stayed up), it is asked about within 80 minutes of
        being held, and learns the end when the task ends."""
        self.recheck_at = now + RECHECK_SWEEP
        seen = self.copies_seen_at
        for tid in [t for t in seen if t not in self.held]:
            del seen[tid]
        for tid, copy in self.held.items():
            if copy.final is not None:
                seen.pop(tid, None)
            elif now - seen.setdefault(tid, now) >= RECHECK_AFTER:
                seen[tid] = now
                self.copies_to_ask.setdefault(tid, ASK_TRIES)

    def ask_answered(self, msg: ReplicaMsg) -> list[ev.Instruction]:
        self.copies_to_ask.pop(msg.task_id, None)
        return []

    def on_ask(self, sender: m.NodeId, msg: ReplicaMsg) -> tuple[str | None, list[ev.Instruction]]:
        """Home side: a node that may hold a copy of our task asks what became of it."""
        tid = msg.task_id
        if msg.home != self.node:
            return f"ask about {tid}: its home is {msg.home}, not this node", []
        self.counters["copy_asks"] = self.counters.get("copy_asks", 0) + 1
        old = self.strays.get(tid, frozenset())
        if sender in self.mine.get(tid, ()) or sender in old:
            return None, []  # kept current already (its acknowledged news is durable)
        self.copies_owed.add(tid)  # the next tick looks at it
        # journaled (`strays:`): the release is owed across a restart too
        return None, self._set_strays(tid, old | {sender})
