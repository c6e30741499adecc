"""The run queue's side of the agent (issue 20): what the runner asks the node (its
start order, a preemption when every slot is taken) and what users ask of it
(`swarm share`, where a queued task stands, whether they may use a group or class).

Thin glue over `node/runqueue.py`, which decides; here are the clock, the host's
Unix groups (NSS) and the reply shapes.
"""

from __future__ import annotations

import grp
import os
import pwd
from typing import Any

from .. import model as m
from .. import request_checks, wire
from ..policy.sharing import Sharing
from .api import PeerCred
from .clock import Clock
from .driver import Driver
from .runner import LocalRunner


class QueueOps:
    def __init__(self, driver: Driver, runner: LocalRunner, clock: Clock) -> None:
        self.d = driver
        self.runner = runner
        self.clock = clock

    @property
    def sharing(self) -> Sharing:
        return self.d.state.sharing

    # -------------------------------------------------------- runner hooks

    def run_order(self) -> list[m.TaskId]:
        """The run queue in start order (priority, fair share, arrival)."""
        _, wall = self.d._time()
        return self.d.state.run_order(self.fair_view(wall))

    def fair_view(self, wall: float) -> Any:
        """Cluster-wide usage per principal and capacity, for the queue's order."""
        return self.d.state.fair_view(wall, self.d.state.local_report(wall))

    def on_full(self, tid: m.TaskId) -> None:
        """Every slot is taken and `tid` waits: preempt lower classes for it, maybe."""
        now, wall = self.d._time()
        self.d.run_inline(self.d.state.preempt_for(tid, now, wall))

    # -------------------------------------------------------- users' questions

    def submit_spec(
        self, f: wire.Fields, cred: PeerCred, user: str | None, node: m.NodeId
    ) -> tuple[m.TaskSpec, frozenset[str]]:
        """The submit request's spec, with the caller's default group (their primary
        Unix group) and the configured classes; and every Unix group of the caller."""
        primary, member_of = unix_groups(cred.uid, cred.gid, user, self.clock.now())
        spec = request_checks.submit_spec(
            f,
            uid=cred.uid,
            user=user,
            home=node,
            now=self.clock.wall(),
            classes=dict(self.sharing.classes),
            default_class=self.sharing.default_class,
            default_group=primary,
        )
        return spec, member_of

    def sharing_refusal(
        self, spec: m.TaskSpec, cred: PeerCred, member_of: frozenset[str]
    ) -> str | None:
        """Why this caller may not use the task's group or class (None: they may);
        `member_of`: the caller's Unix groups."""
        if spec.group:
            why = self.sharing.may_use_group(spec.user, cred.uid, spec.group, member_of)
            if why is not None:
                return why
        return self.sharing.may_use_priority(cred.uid, spec.group, spec.priority)

    def explain(self, tid: m.TaskId) -> list[dict[str, Any]]:
        """Where a queued task stands in this node's order, and why ([] if not queued)."""
        if tid not in self.runner.queue:
            return []
        now, wall = self.d._time()
        where = self.d.state.queue_explain(tid, self.fair_view(wall))
        if where is None:
            return []
        where["view_age"] = self.d.state.view_age(now)
        return [{"at": wall, "outcome": queue_line(where), "queue": where}]

    async def op_share(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        """`swarm share`: each principal's cluster-wide decayed usage, dominant share and
        rank (the order fair share starts their tasks in), as this node sees it, and
        how old that view may be. Usage totals are not secret among a fleet's users."""
        f.done()
        now, wall = self.d._time()
        state = self.d.state
        return {
            "principals": state.share_rows(self.fair_view(wall)),
            "view_age": state.view_age(now),
            "half_life": state.sharing.half_life,
            "nodes": len(state.view) + (0 if state.node in state.view else 1),
        }


def queue_line(q: dict[str, Any]) -> str:
    """Why a queued task waits here, in one line (node/runqueue.py's queue_explain)."""
    line = (
        f"queued here: position {q['position']} of {q['queued']}"
        f" ({q['ahead_higher_priority']} ahead of higher priority); priority {q['priority']},"
        f" {q['user']}'s dominant share {q['user_dominant_share']:.3g}"
        f" (usage gossiped up to {q['view_age']:.1f}s ago)"
    )
    if q.get("quota"):
        line += "; " + str(q["quota"])
    return line


_GROUPS: dict[int, tuple[float, str, frozenset[str]]] = {}


def unix_groups(uid: int, gid: int, user: str | None, now: float) -> tuple[str, frozenset[str]]:
    """The caller's primary group name (the default accounting group) and every group
    they belong to, cached for a minute (NSS lookups are slow; membership changes
    reach the agent within that minute)."""
    hit = _GROUPS.get(uid)
    if hit is not None and now - hit[0] < 60.0:
        return hit[1], hit[2]
    try:
        primary_gid = pwd.getpwuid(uid).pw_gid
    except KeyError:
        primary_gid = gid
    try:
        primary = grp.getgrgid(primary_gid).gr_name
    except KeyError:
        primary = ""
    names = {primary} if primary else set()
    if user:
        try:
            names |= {grp.getgrgid(g).gr_name for g in os.getgrouplist(user, primary_gid)}
        except (KeyError, OSError):
            pass
    if not m.valid_group_name(primary):
        primary = ""  # a name we would refuse as data: no default group
    if len(_GROUPS) > 4096:
        _GROUPS.clear()
    _GROUPS[uid] = (now, primary, frozenset(names))
    return primary, frozenset(names)
