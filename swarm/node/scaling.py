"""The autoscaler of one pool on one node (pure; issue 25).

Every agent runs one `PoolController` per `[scale.POOL]` table. Each tick it steps the
pool's actor seat (`cluster/actor.py`: rendezvous owner + gossiped lease); only the
seat's holder decides (`policy/autoscale.py`) and acts. Acting means instructions for
the runtime (`runtime/autoscaler.py`), which carries them out and feeds results back:

- `RunHook`: run the pool's scale-out or scale-in command (one at a time per pool;
  a failed attempt is retried after `hook-backoff`, doubled each time, up to
  `hook-retries` times, then the action is given up and forgotten by the policy);
- `Drain`: drain (or undrain) a node, through a peer request to it;
- `Journal`: the action, durably, so a restarted agent keeps its cooldowns;
- `Announce`: the seat's lease with the last action and the nodes being drained, on
  gossip, so that every node's cooldowns count from the same action and a holder that
  takes over finishes the drains its predecessor began.

Scale-in is safe by construction: the victims are the nodes whose removal loses least
(`choose_victims`: fewest running task-seconds, never a node running a task that
cannot migrate for longer than the drain grace, never the acting node itself); they
are drained first (transfer and migration move their queued and movable work away),
and the hook that removes them runs only once their reports show no work, or after
`drain-grace`. A victim that receives work meanwhile (its running + queued count
rises after its drain showed in its report) is undrained and kept.

A controller never compares another node's clock with its own: gossiped times travel
as ages ("ago").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from .. import wire
from ..cluster.actor import MAX_EPOCH, ActorSeat, Lease, SeatStep
from ..model import NodeId
from ..policy import autoscale as asc
from ..policy.scalepool import Member, PoolSpec, in_pool, node_work, pool_view
from .scalemsgs import (
    MAX_BASELINE,
    MAX_VICTIMS,
    Announce,
    Drain,
    HookRun,
    Instruction,
    Journal,
    RunHook,
    acted_from,
    acted_wire,
    booting_from,
    booting_wire,
    journal_value,
    nodes_from,
)

HISTORY = 8  # hook runs kept for `swarm scale status`


# ---------------------------------------------------------------------- state


@attrs.define
class Victim:
    since: float  # when the drain was asked for (this node's clock)
    work: int  # running + queued at the last report that showed the drain
    seen_drained: bool = False  # a report has shown the node drained


@attrs.define
class Launch:
    at: float  # when the scale-out began; once its hook succeeded, then
    count: int
    baseline: frozenset[NodeId]  # the pool's nodes when the scale-out began
    ahead: int = 0  # nodes of earlier launches still booting then (not in the baseline)
    # every node seen in the pool since, not in the baseline: one that joined and then
    # left (removed by a scale-in, dead) has booted; without this memory it counted as
    # booting again, and the actor that grew the pool shrank it below min-nodes
    # (found by tests/integration/test_elastic.py)
    joined: set[NodeId] = attrs.field(factory=set)


@attrs.define
class HeardBoot:
    """The nodes the holder announced as booting, for a node that takes over from it."""

    count: int
    at: float  # the newest of their launches (this node's clock)
    baseline: frozenset[NodeId] | None = None  # the pool at the next tick after hearing it


@attrs.define
class Pending:
    action: Literal["out", "in"]
    count: int
    nodes: tuple[NodeId, ...]
    desired: int
    epoch: int
    attempt: int = 0
    next_at: float = 0.0
    running: bool = False
    launch: Launch | None = None  # a scale-out's nodes, booting from its first attempt


class PoolController:
    """One pool's autoscaler on one node. `tick` a few times per lease ttl."""

    def __init__(self, me: NodeId, spec: PoolSpec) -> None:
        self.me = me
        self.spec = spec
        ttl = spec.lease_ttl
        self.seat = ActorSeat(me, spec.key, ttl, grace=ttl)
        self.state = asc.ScaleState()
        self.step: SeatStep | None = None
        self.decision: asc.ScaleDecision | None = None
        self.view: asc.PoolView | None = None
        self.launches: list[Launch] = []
        self.victims: dict[NodeId, Victim] = {}
        self.removed: dict[NodeId, float] = {}  # removed by a hook that succeeded, at
        self.pending: Pending | None = None
        self.heard_victims: set[NodeId] = set()
        self.heard_booting: HeardBoot | None = None
        self.pool_nodes: frozenset[NodeId] = frozenset()  # the pool at the last acting tick
        self.heard_epoch = 0
        self.adopted_epoch = 0
        self.history: deque[HookRun] = deque(maxlen=HISTORY)
        self.notes: deque[str] = deque(maxlen=HISTORY)  # drains undone, victims dropped
        self.bad_announcements = 0

    # ------------------------------------------------------------ from others

    def on_announce(self, payload: Any, now: float) -> bool:
        """A peer's announcement (gossip or push-pull); False if dropped as malformed."""
        try:
            f = wire.Fields(payload, "scale announcement")
            lease = Lease.from_wire(f.map("lease", required=True))
            last = f.nested("last", lambda o: acted_from(o, now))
            victims = nodes_from(f.list("victims"), "scale announcement victims")
            booting = f.nested("booting", lambda o: booting_from(o, now))
            f.done()
        except wire.WireError:
            self.bad_announcements += 1
            return False
        if lease.key != self.spec.key or lease.holder == self.me:
            if lease.holder == self.me:
                self.seat.on_lease(lease, now)  # our previous life's epoch
            return True
        self.seat.on_lease(lease, now)
        if last is not None:
            self.state = self.state.learn(last)
        if lease.epoch >= self.heard_epoch:
            self.heard_epoch = lease.epoch
            self.heard_victims = set(victims)
            self.heard_booting = HeardBoot(*(booting or (0, now, None)))
        return True

    def restore(self, record: Any, now: float, wall: float) -> None:
        """The pool's journaled record, at start-up: the last action (its cooldowns
        still hold after a restart), the nodes it was draining and those booting."""
        try:
            f = wire.Fields(record, "scale record")
            last = f.nested("last", lambda o: o)
            victims = nodes_from(f.list("victims"), "scale record victims")
            epoch = f.int("epoch", 0, lo=0, hi=MAX_EPOCH)
            booting = f.nested("booting", lambda o: booting_from(o, now, wall))
            f.done()
            if last is not None:
                g = wire.Fields(last, "scale record last")
                action = g.str("a", required=True, max_len=3)
                count = g.int("c", required=True, lo=0, hi=1 << 20)
                at_wall = g.float("wall", required=True, lo=0.0, hi=1e12)
                g.done()
                if action in ("out", "in"):
                    ago = max(0.0, wall - at_wall)
                    self.state = self.state.learn(asc.Acted(action, count, now - ago))  # type: ignore[arg-type]
        except wire.WireError:
            self.bad_announcements += 1
            return
        self.seat.max_epoch = max(self.seat.max_epoch, epoch)
        self.heard_victims |= set(victims)
        if booting is not None and self.heard_booting is None:
            self.heard_booting = HeardBoot(*booting)

    # ----------------------------------------------------------------- a tick

    def tick(
        self, now: float, members: Sequence[Member], live: Iterable[NodeId]
    ) -> list[Instruction]:
        """Step the seat; if this node holds it, check drains, retry, or decide."""
        live_set = frozenset(live)
        out: list[Instruction] = []
        hb = self.heard_booting
        if hb is not None and hb.baseline is None:
            hb.baseline = frozenset(
                mb.node for mb in members if mb.node in live_set and in_pool(self.spec, mb)
            )
        step = self.seat.step(live_set, now)
        self.step = step
        if step.announce is not None:
            out.append(Announce(self.spec.key, self._payload(step.announce, now)))
        if not step.acting:
            return out
        said = len(out)
        self._act(now, members, live_set, step, out)
        if len(out) > said:
            self._announce_now(now, out)
        return out

    def _act(
        self,
        now: float,
        members: Sequence[Member],
        live_set: frozenset[NodeId],
        step: SeatStep,
        out: list[Instruction],
    ) -> None:
        if self.adopted_epoch != step.epoch:
            # a new tenure: finish the drains the previous holder (or a previous life) began
            self.adopted_epoch = step.epoch
            for n in self.heard_victims - self.victims.keys() - self.removed.keys():
                if n != self.me:
                    self.victims[n] = Victim(since=now, work=0)
                else:
                    # the previous holder drained this node to remove it; the actor is
                    # never removed (never its own victim), so it would stay drained
                    # with nobody to undo it
                    why = "the new actor was being drained for scale-in: kept"
                    self.notes.append(f"{n}: {why}")
                    out.append(Drain(self.spec.name, n, False, why))
            self.heard_victims = set()
            hb = self.heard_booting
            if hb is not None:
                # and count the nodes it launched that have not joined yet: without
                # them this node would launch them again once the cooldown is over,
                # past max_nodes (found by tests/unit/test_scaling.py)
                self.heard_booting = None
                fresh = hb.count > 0 and now - hb.at < self.spec.boot_timeout
                baseline = hb.baseline if hb.baseline is not None else frozenset()
                self.launches = [Launch(hb.at, hb.count, baseline)] if fresh else []
        if self.pending is not None and self.pending.running:
            return  # one hook at a time
        pool = [
            mb
            for mb in members
            if mb.node in live_set and mb.node not in self.removed and in_pool(self.spec, mb)
        ]
        self.pool_nodes = frozenset(mb.node for mb in pool)
        self._forget_removed(now, live_set)
        ready = self._check_victims(now, {mb.node: mb for mb in pool}, out)
        ready = self._keep_min(len(pool), ready, out)
        p = self.pending
        if p is not None:
            if now >= p.next_at:
                out.append(self._run(p, now))
            return
        if ready:
            self.pending = Pending(
                "in", len(ready), tuple(sorted(ready)), len(pool) - len(ready), step.epoch
            )
            out.append(self._run(self.pending, now))
            return
        view = pool_view(
            self.spec, pool, draining=self.victims.keys(), booting=self._booting(now, pool)
        )
        self.view = view
        self.state, dec = asc.decide(self.state, view, self.spec.scale, now, epoch=step.epoch)
        self.decision = dec
        if dec.action == "out":
            launch = Launch(now, dec.count, frozenset(mb.node for mb in pool), view.booting)
            self.launches.append(launch)
            self.pending = Pending("out", dec.count, (), dec.desired, step.epoch, launch=launch)
            out.append(self._run(self.pending, now))
            out.append(self._journal(now, "out", dec.count, (), dec.reason))
        elif dec.action == "in":
            self._start_drains(now, pool, dec, out)

    def _start_drains(
        self, now: float, pool: Sequence[Member], dec: asc.ScaleDecision, out: list[Instruction]
    ) -> None:
        work = [
            node_work(mb.report, mb.age)
            for mb in pool
            if mb.report is not None
            and mb.node != self.me
            and mb.node not in self.victims
            and not mb.report.draining
        ]
        # the caller's clamp: never below min_nodes. decide's count already is, but it
        # counts booting nodes, which may never come: the floor here is the nodes present
        # (found by tests/unit/test_scaling.py; _keep_min holds it when nodes die)
        room = max(0, len(pool) - len(self.victims) - self.spec.scale.min_nodes)
        chosen = asc.choose_victims(work, min(dec.count, room), long_task=self.spec.drain_grace)
        if not chosen:
            self.state = self.state.failed(now)
            why = (
                f"{len(pool) - len(self.victims)} nodes present, min_nodes"
                f" {self.spec.scale.min_nodes} (booting nodes must join first)"
                if room == 0
                else "the acting node, pinned or busy nodes are never chosen"
            )
            self.decision = attrs.evolve(
                dec,
                action="none",
                count=0,
                reason=f"{dec.reason}; no node can be removed now ({why})",
            )
            return
        if len(chosen) < dec.count:
            self.state = attrs.evolve(self.state, last=asc.Acted("in", len(chosen), now))
        by_node = {mb.node: mb for mb in pool}
        for n in chosen:
            r = by_node[n].report
            assert r is not None
            self.victims[n] = Victim(since=now, work=r.running + r.queued)
            out.append(Drain(self.spec.name, n, True, f"scale-in of pool {self.spec.name}"))
        out.append(self._journal(now, "in", len(chosen), tuple(chosen), dec.reason))

    def _check_victims(
        self, now: float, pool: Mapping[NodeId, Member], out: list[Instruction]
    ) -> list[NodeId]:
        """Drop victims that left or were undrained, keep those that received work, and
        return those ready for the scale-in hook."""
        ready: list[NodeId] = []
        in_hook = set(self.pending.nodes) if self.pending is not None else set()
        for n, v in list(self.victims.items()):
            mb = pool.get(n)
            if mb is None:
                del self.victims[n]  # gone (removed, dead) or out of the pool
                self.notes.append(f"{n}: left the pool while draining")
                continue
            r = mb.report
            if r is None or n in in_hook:
                continue
            work = r.running + r.queued
            if r.draining:
                if v.seen_drained and work > v.work:
                    del self.victims[n]
                    why = f"received work while draining ({v.work} -> {work} tasks): kept"
                    self.notes.append(f"{n}: {why}")
                    out.append(Drain(self.spec.name, n, False, why))
                    continue
                v.seen_drained = True
                v.work = work
            elif v.seen_drained:
                del self.victims[n]  # an operator undrained it: not ours to remove
                self.notes.append(f"{n}: undrained by someone else while draining: kept")
                continue
            if v.seen_drained and work == 0:
                ready.append(n)
            elif now - v.since >= self.spec.drain_grace:
                self.notes.append(
                    f"{n}: drain grace {self.spec.drain_grace:g} s over with {work} tasks left"
                )
                ready.append(n)
            elif not v.seen_drained and now - v.since >= self.spec.lease_ttl:
                # the drain request may have been lost (or the node restarted): ask again
                v.since = now
                out.append(Drain(self.spec.name, n, True, "drain not seen yet: asked again"))
        return ready

    def _keep_min(self, pool: int, ready: list[NodeId], out: list[Instruction]) -> list[NodeId]:
        """Keep victims (undrain them) while removing them all would leave fewer than
        min_nodes present: nodes that died after the drains began are not replaced by
        the victims' removal (the count held for the pool of then; found by
        tests/unit/test_scaling.py). Those with work are kept first, then idle ones; a
        scale-in hook waiting to retry is dropped when that is not enough. Returns the
        ready victims still to remove."""
        short = self.spec.scale.min_nodes - (pool - len(self.victims))
        if short <= 0:
            return ready
        p = self.pending
        in_hook = set(p.nodes) if p is not None and p.action == "in" else set()
        keep = sorted(self.victims.keys() - in_hook - set(ready))
        keep += sorted(set(ready) - in_hook)
        if len(keep) < short and p is not None and p.action == "in" and not p.running:
            self.pending = None
            keep += sorted(in_hook & self.victims.keys())
        for n in keep[:short]:
            del self.victims[n]
            why = f"the pool would fall below min_nodes {self.spec.scale.min_nodes}: kept"
            self.notes.append(f"{n}: {why}")
            out.append(Drain(self.spec.name, n, False, why))
        return [n for n in ready if n in self.victims]

    def _forget_removed(self, now: float, live: frozenset[NodeId]) -> None:
        for n, at in list(self.removed.items()):
            if n not in live or now - at > self.spec.boot_timeout:
                del self.removed[n]

    def _booting(self, now: float, pool: Sequence[Member]) -> int:
        self.launches = [x for x in self.launches if now - x.at < self.spec.boot_timeout]
        return self._not_joined(frozenset(mb.node for mb in pool))

    def _not_joined(self, pool: frozenset[NodeId]) -> int:
        """The nodes the newest launch still waits for: its own and those booting when
        it began, less the nodes that joined since. (Counting from the oldest launch's
        baseline instead undercounts once that launch times out: the nodes it brought
        then count as the newer launch's, found by tests/unit/test_scaling.py.)"""
        if not self.launches:
            return 0
        x = self.launches[-1]
        x.joined |= pool - x.baseline
        return max(0, x.ahead + x.count - len(x.joined))

    # ------------------------------------------------------------------ hooks

    def _env(self, p: Pending) -> dict[str, str]:
        return {
            "SWARM_SCALE_POOL": self.spec.name,
            "SWARM_SCALE_ACTION": p.action,
            "SWARM_SCALE_COUNT": str(p.count),
            "SWARM_SCALE_NODES": " ".join(p.nodes),
            "SWARM_SCALE_DESIRED": str(p.desired),
            "SWARM_SCALE_EPOCH": str(p.epoch),
            "SWARM_SCALE_ACTOR": self.me,
            "SWARM_SCALE_ATTEMPT": str(p.attempt),
        }

    def _run(self, p: Pending, now: float) -> RunHook:
        p.running = True
        cmd = self.spec.out_command if p.action == "out" else self.spec.in_command
        return RunHook(
            self.spec.name, p.action, cmd, self._env(p), self.spec.hook_timeout, p.attempt
        )

    def hook_done(
        self,
        now: float,
        *,
        ok: bool,
        rc: int | None = None,
        error: str = "",
        output: str = "",
        duration: float = 0.0,
    ) -> list[Instruction]:
        """The running hook's attempt ended: done, retry later, or give up."""
        p = self.pending
        if p is None or not p.running:
            return []
        p.running = False
        self.history.append(
            HookRun(p.action, p.count, p.nodes, p.attempt, ok, rc, error, output, now, duration)
        )
        out: list[Instruction] = []
        if ok:
            self.pending = None
            if p.launch is not None:
                # its nodes boot from now: a slow hook (or its retries) must not use up
                # the boot timeout, or they would be launched again as they join (found
                # by tests/unit/test_scaling.py)
                p.launch.at = now
            if p.action == "in":
                for n in p.nodes:
                    self.victims.pop(n, None)
                    self.removed[n] = now
                out.append(self._journal(now, "in", p.count, p.nodes, "scale-in hook done"))
                self._announce_now(now, out)
            return out
        if p.attempt < self.spec.hook_retries:
            p.attempt += 1
            p.next_at = now + self.spec.retry_delay(p.attempt)
            return out
        # given up: the policy forgets the action (its cooldown does not hold the next)
        self.pending = None
        self.state = self.state.failed(now)
        if p.action == "out":
            self.launches = [x for x in self.launches if x is not p.launch]
        else:
            for n in p.nodes:
                self.victims.pop(n, None)
                why = f"scale-in hook failed {p.attempt + 1} times: kept"
                self.notes.append(f"{n}: {why}")
                out.append(Drain(self.spec.name, n, False, why))
        out.append(self._journal(now, None, 0, (), f"{p.action} hook given up: {error}"))
        self._announce_now(now, out)
        return out

    # ----------------------------------------------------------- what we say

    def _payload(self, lease: Lease, now: float) -> dict[str, Any]:
        return {
            "lease": lease.to_wire(),
            "last": acted_wire(self.state.latest, now),
            "victims": sorted(self.victims)[:MAX_VICTIMS],
            "booting": self._booting_wire(now),
        }

    def _booting_wire(self, now: float) -> dict[str, Any] | None:
        newest = max((x.at for x in self.launches), default=None)
        return booting_wire(self._not_joined(self.pool_nodes), newest, now)

    def _announce_now(self, now: float, out: list[Instruction]) -> None:
        """An action changed what the lease carries (the last action, the victims): say
        it now, not at the next renewal a third of a ttl later, or a holder that dies
        meanwhile leaves its drains to nobody and its cooldown unknown (found by
        tests/unit/test_scaling.py). Only while the claim is current on this node's
        clock (an extra announcement renews nothing here: the seat's timing is its own)."""
        claim = self.seat.claim
        if claim is None or now - self.seat.announced_at >= self.seat.ttl:
            return
        out[:] = [i for i in out if not isinstance(i, Announce)]
        out.append(Announce(self.spec.key, self._payload(claim, now)))

    def announcement(self, now: float) -> dict[str, Any] | None:
        """What this node carries in push-pull for the pool: its claim while it holds
        one (so a node that joins hears the current epoch)."""
        if self.seat.claim is None:
            return None
        return self._payload(self.seat.claim, now)

    def _journal(
        self,
        now: float,
        action: Literal["out", "in"] | None,
        count: int,
        nodes: tuple[NodeId, ...],
        reason: str,
    ) -> Journal:
        latest = self.state.latest
        # the nodes booting: a restarted actor counts them (found by
        # tests/unit/test_scaling.py), from the pool they were counted against
        booting = self._booting_wire(now)
        if booting is not None:
            booting["base"] = sorted(self.pool_nodes)[:MAX_BASELINE]
        return Journal(
            key=self.spec.key,
            value={
                "last": None
                if latest is None
                else {"a": latest.action, "c": latest.count, "ago": max(0.0, now - latest.at)},
                "victims": sorted(self.victims)[:MAX_VICTIMS],
                "epoch": self.step.epoch if self.step is not None else 0,
                "booting": booting,
            },
            note={
                "pool": self.spec.name,
                "action": action,
                "count": count,
                "nodes": list(nodes),
                "epoch": self.step.epoch if self.step is not None else 0,
                "reason": reason,
            },
        )

    def status(self, now: float) -> dict[str, Any]:
        """This pool as this node sees it, for `swarm scale status` (JSON-able)."""
        st = self.step
        d = self.decision
        v = self.view
        p = self.pending
        latest = self.state.latest
        return {
            "pool": self.spec.name,
            "selector": list(self.spec.selector_text),
            "min_nodes": self.spec.scale.min_nodes,
            "max_nodes": self.spec.scale.max_nodes,
            "max_step": self.spec.scale.max_step,
            "acting": bool(st and st.acting),
            "owner": st.owner if st else None,
            "epoch": st.epoch if st else 0,
            "seat": st.reason if st else "not started",
            "decision": None
            if d is None
            else {"action": d.action, "count": d.count, "desired": d.desired, "reason": d.reason},
            "view": None if v is None else attrs.asdict(v),
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
                {"node": n, "for": now - v_.since, "drained": v_.seen_drained, "tasks": v_.work}
                for n, v_ in sorted(self.victims.items())
            ],
            "booting": self._not_joined(self.pool_nodes),
            "hooks": [
                {**attrs.asdict(h), "nodes": list(h.nodes), "ago": max(0.0, now - h.at)}
                for h in reversed(self.history)
            ],
            "notes": list(self.notes),
            "bad_announcements": self.bad_announcements,
        }


__all__ = [
    "Announce",
    "Drain",
    "HookRun",
    "Instruction",
    "Journal",
    "PoolController",
    "RunHook",
    "journal_value",
]
