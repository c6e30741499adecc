"""`swarm scale status` for one pool on one node (pure; issue 25): what the controller
(node/scaling.py) holds, as JSON-able data. Kept apart so the controller module holds
only its rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from ..cluster.actor import SeatStep
from ..model import NodeId
from ..policy import autoscale as asc
from ..policy.scalepool import PoolSpec
from .scalemsgs import HookRun


class _Pending(Protocol):
    @property
    def action(self) -> str: ...
    @property
    def count(self) -> int: ...
    @property
    def nodes(self) -> tuple[NodeId, ...]: ...
    @property
    def attempt(self) -> int: ...
    @property
    def running(self) -> bool: ...
    @property
    def next_at(self) -> float: ...


class _Victim(Protocol):
    @property
    def since(self) -> float: ...
    @property
    def seen_drained(self) -> bool: ...
    @property
    def work(self) -> int: ...


class Controller(Protocol):
    """What the status reads of a pool's controller (node/scaling.py), read-only."""

    @property
    def spec(self) -> PoolSpec: ...
    @property
    def step(self) -> SeatStep | None: ...
    @property
    def decision(self) -> asc.ScaleDecision | None: ...
    @property
    def view(self) -> asc.PoolView | None: ...
    @property
    def view_at(self) -> float | None: ...
    @property
    def state(self) -> asc.ScaleState: ...
    @property
    def heard_at(self) -> tuple[int, int]: ...
    @property
    def removed(self) -> Mapping[NodeId, float]: ...
    @property
    def notes(self) -> Sequence[str]: ...
    @property
    def bad_announcements(self) -> int: ...
    @property
    def pending(self) -> _Pending | None: ...
    @property
    def victims(self) -> Mapping[NodeId, _Victim]: ...
    @property
    def history(self) -> Sequence[HookRun]: ...


def pool_status(ctl: Controller, booting: int, now: float) -> dict[str, Any]:
    st = ctl.step
    d = ctl.decision
    v = ctl.view
    p = ctl.pending
    latest = ctl.state.latest
    spec = ctl.spec
    return {
        "pool": spec.name,
        "selector": list(spec.selector_text),
        "min_nodes": spec.scale.min_nodes,
        "max_nodes": spec.scale.max_nodes,
        "max_step": spec.scale.max_step,
        "acting": bool(st and st.acting),
        "owner": st.owner if st else None,
        # the epoch of the seat's newest state: this node's claim, or the one it heard
        "epoch": st.epoch if st and st.epoch else ctl.heard_at[0],
        "seat": st.reason if st else "not started",
        "decision": None
        if d is None
        else {"action": d.action, "count": d.count, "desired": d.desired, "reason": d.reason},
        "view": None if v is None else attrs.asdict(v),
        # how long ago the view (and the decision on it) was taken: what a reader
        # polling the status needs to tell when the actor saw what it shows
        "view_ago": None if ctl.view_at is None else max(0.0, now - ctl.view_at),
        "last_action": None
        if latest is None
        else {"action": latest.action, "count": latest.count, "ago": max(0.0, now - latest.at)},
        "pending": None
        if p is None
        else {
            "action": p.action,
            "count": p.count,
            "nodes": list(p.nodes),
            "attempt": p.attempt,
            "running": p.running,
            "retry_in": None if p.running else max(0.0, p.next_at - now),
        },
        "draining": [
            {"node": n, "for": now - vi.since, "drained": vi.seen_drained, "tasks": vi.work}
            for n, vi in sorted(ctl.victims.items())
        ],
        "booting": booting,
        "removed": sorted(ctl.removed),
        "hooks": [
            {**attrs.asdict(h), "nodes": list(h.nodes), "ago": max(0.0, now - h.at)}
            for h in reversed(ctl.history)
        ],
        "notes": list(ctl.notes),
        "bad_announcements": ctl.bad_announcements,
    }
