"""Late binding in the simulator: `policy.latebind.LateBinding` on every node, its
reservations, cancels, pulls and answers carried as delayed messages.

A task arriving at a node with room runs there; otherwise the node holds it (out of
its run queue, so it shares no core) and reserves d peers. The first node with room
(a reserved peer, or the home itself) gets it: a peer by a pull, its answer and a
handoff (three one-way delays), the home at once. A hold that runs out puts the task
in the home's run queue. The handoff re-checks with the agent's admission; a refusal
places the task again as usual.
"""

from __future__ import annotations

from typing import Any

from swarm.policy.latebind import (
    Action,
    Cancel,
    Give,
    LateBinding,
    Pull,
    Reserve,
    StartHere,
    has_room,
)
from swarm.policy.placement import Needs

from .books import CANCEL, LATEEXP, LATEGIVE, PULL, PULLREP, RESERVE, SimNode, SimTask
from .placesim import PlacementSim


class LateSim(PlacementSim):
    """Late binding (a part of `ClusterSim`)."""

    def _late_setup(self) -> None:
        late = self.cfg.late
        if late is None:
            return
        for n in self.nodes:
            n.lb = LateBinding(n.id, late)

    def _late_hold(self, task: SimTask) -> bool:
        home = task.origin
        if home is None or home.lb is None or task.retry is not None:
            return False
        local = home.report()
        now = self.now
        if has_room(local):
            self.placements += 1
            self._on_handoff(task, home)
            return True
        needs = task.needs
        if needs is None:
            needs = task.needs = Needs.of(task.spec)
        acts = home.lb.hold(now, task.spec.id, needs, local, self.view, self.rng)
        if not acts:
            return False
        self.placements += 1
        home.held[task.spec.id] = task
        late = self.cfg.late
        assert late is not None
        self._push(now + late.hold, LATEEXP, home)
        if late.stage > 0:
            self._push(now + late.stage, LATEEXP, home)
        self._late_do(home, acts)
        return True

    def _late_do(self, n: SimNode, acts: list[Action]) -> None:
        delay = self.cfg.net_delay
        now = self.now
        for a in acts:
            if isinstance(a, Reserve):
                self._push(now + delay, RESERVE, (n, a.task_id), self.by_id[a.peer])
            elif isinstance(a, Cancel):
                self._push(now + delay, CANCEL, (n, a.task_id), self.by_id[a.peer])
            elif isinstance(a, Pull):
                self._push(now + delay, PULL, (n, a.task_id), self.by_id[a.holder])
            elif isinstance(a, Give):
                self.handoffs += 1
                task = n.held.pop(a.task_id)
                self._push(now + delay, LATEGIVE, task, self.by_id[a.peer])
            else:
                assert isinstance(a, StartHere)
                self._on_handoff(n.held.pop(a.task_id), n)

    def _room(self, n: SimNode) -> None:
        lb = n.lb
        if lb is None:
            return
        local = n.report()
        acts = lb.room_here(self.now, local)
        if acts:
            self._late_do(n, acts)
            return
        p = lb.want_pull(self.now, local)
        if p is not None:
            self._late_do(n, [p])

    def _on_reserve(self, msg: tuple[SimNode, str], peer: SimNode) -> None:
        holder, task_id = msg
        assert peer.lb is not None
        peer.lb.on_reserve(self.now, holder.id, task_id)
        self._room(peer)

    def _on_cancel(self, msg: tuple[SimNode, str], peer: SimNode) -> None:
        holder, task_id = msg
        assert peer.lb is not None
        peer.lb.on_cancel(holder.id, task_id)

    def _on_pull(self, msg: tuple[SimNode, str], holder: SimNode) -> None:
        puller, task_id = msg
        assert holder.lb is not None
        acts = holder.lb.on_pull(self.now, puller.id, task_id)
        granted = any(isinstance(a, Give) for a in acts)
        # The answer leaves before the handoff, so it arrives first.
        self._push(self.now + self.cfg.net_delay, PULLREP, (holder, task_id, granted), puller)
        self._late_do(holder, acts)

    def _on_pullrep(self, msg: tuple[SimNode, str, bool], puller: SimNode) -> None:
        holder, task_id, granted = msg
        assert puller.lb is not None
        puller.lb.on_pull_answer(self.now, holder.id, task_id, granted)
        if not granted:
            self._room(puller)

    def _on_lategive(self, task: SimTask, peer: SimNode) -> None:
        assert peer.lb is not None
        self._on_handoff(task, peer)
        peer.lb.arrived(task.spec.id)
        self._room(peer)

    def _on_lateexp(self, n: SimNode, _: Any) -> None:
        assert n.lb is not None
        self._late_do(n, n.lb.expire(self.now))
