"""Placing a task in the simulator: the agent's placement rule, the target's
admission, and retries with back-off.

The decision is the agent's: `node.decide.choose` with the node's rule (two choices
with d peers, or the `random` baseline) from the origin's fresh report over the shared
stale view; the target re-checks with `node.decide.admission_refusal` on its fresh
books; a refusal or no eligible node goes through `policy.placement.PlacementRetry`,
as `node.placing.Placing.step` does: place again at once without the refusers, or
back off once `RetryPolicy.max_tries` refusals pile up. The back-off timings are the
run's own (`SimConfig.retry`, in units of the mean service time, like every other
timer of the simulator) rather than the agent's seconds (`node.placing.RETRY`).

The placement guards of `Placing.placeable` hold by construction here: a task being
placed is queued, in no ledger, holds no GPU slice and no checkpoint.

Modelled here, not agent code: the two reference baselines, least-loaded of the
(stale) view and the omniscient join-shortest-queue. They are yardsticks that swarm
must never use, so the agent has no code for them.
"""

from __future__ import annotations

import math
from typing import Any

from swarm.model import NodeId
from swarm.node.decide import RANDOM, TWO_CHOICE, admission_refusal, choose
from swarm.policy.load import load_index, report_load
from swarm.policy.placement import Needs, PlacementRetry, refusal

from .books import FRONT_REPORT, HANDOFF, REFUSED, RETRY, Books, SimNode, SimTask
from .simconfig import LeastLoaded, PlaceRandom, PowerOfD, SimConfig, SimError


class PlacementSim(Books):
    """Placement, admission at the target and retries (a part of `ClusterSim`)."""

    def __init__(self, cfg: SimConfig) -> None:
        super().__init__(cfg)
        strat = cfg.placement
        # The agent's rule and d (Settings.placement_rule / placement_d), or None for
        # the simulator's own baselines.
        self._rule: str | None = None
        self._d = 2
        if isinstance(strat, PowerOfD):
            self._rule, self._d = TWO_CHOICE, strat.d
        elif isinstance(strat, PlaceRandom):
            self._rule = RANDOM

    def _place(self, task: SimTask) -> None:
        if self._late_hold(task):
            return
        now = self.now
        self.placements += 1
        origin = task.origin
        exclude = task.retry.exclude if task.retry is not None else frozenset()
        target: SimNode | None
        rule = self._rule
        if rule is not None:
            local = origin.report() if origin is not None else FRONT_REPORT
            p = choose(
                rule,
                self._d,
                task.spec,
                local,
                self.view,
                self.rng,
                now,
                exclude,
                scan_below=self.cfg.scan_below,
            )
            target = None if p.target is None else self.by_id[p.target]
        elif isinstance(self.cfg.placement, LeastLoaded):
            target = self._least_loaded(task, exclude)
        else:
            target = self._jsq(task, exclude)
        if target is None:
            retry = task.retry or PlacementRetry()
            if retry.rounds >= self.cfg.max_rounds:
                raise SimError(
                    f"task {task.spec.id} found no eligible node in {retry.rounds} rounds"
                )
            task.retry = retry.on_no_target(now, self.cfg.retry, self.rng)
            self._waited(task)
            self._push(task.retry.not_before, RETRY, task)
            return
        if target is not origin:
            self.handoffs += 1
        if target is origin or self.cfg.net_delay <= 0:
            self._on_handoff(task, target)
        else:
            self._push(now + self.cfg.net_delay, HANDOFF, task, target)

    def _least_loaded(self, task: SimTask, exclude: frozenset[NodeId]) -> SimNode | None:
        """Yardstick (no agent code): the least loaded eligible node of the stale view."""
        needs = task.needs or Needs.of(task.spec)
        task.needs = needs
        best = math.inf
        ties: list[NodeId] = []
        view = self.view
        for nid in view:
            if nid in exclude:
                continue
            r = view[nid].report
            if refusal(r, needs) is not None:
                continue
            x = report_load(r)
            if x < best:
                best = x
                ties = [nid]
            elif x == best:
                ties.append(nid)
        if not ties:
            return None
        return self.by_id[ties[0] if len(ties) == 1 else self.rng.choice(ties)]

    def _jsq(self, task: SimTask, exclude: frozenset[NodeId]) -> SimNode | None:
        """Yardstick (no agent code): join the node whose books are the lightest now,
        among those whose ledger would take the task (omniscient)."""
        best = math.inf
        ties: list[SimNode] = []
        spec = task.spec
        for n in self.nodes:
            led = n.ledger
            if n.id in exclude or led.refuse_new(spec) is not None:
                continue
            x = load_index(led.weight_sum, led.shares, led.reserved)
            if x < best:
                best = x
                ties = [n]
            elif x == best:
                ties.append(n)
        if not ties:
            return None
        return ties[0] if len(ties) == 1 else self.rng.choice(ties)

    def _on_handoff(self, task: SimTask, target: SimNode) -> None:
        """The placed task reaches its target, which re-checks on fresh state."""
        if admission_refusal(task.spec, target.ledger) is None:
            task.retry = None
            self._placing -= 1
            self._enqueue(target, task)
            return
        self.refusals += 1
        self._waited(task)
        delay = self.cfg.net_delay if target is not task.origin else 0.0
        if delay > 0:
            self._push(self.now + delay, REFUSED, task, target)
        else:
            self._on_refused(task, target)

    def _on_refused(self, task: SimTask, target: SimNode) -> None:
        retry = task.retry or PlacementRetry()
        task.retry = retry.on_refusal(target.id, self.now, self.cfg.retry, self.rng)
        if task.retry.ready(self.now):
            self._place(task)
        else:
            self._push(task.retry.not_before, RETRY, task)

    def _on_retry(self, task: SimTask, _: Any) -> None:
        self._place(task)
