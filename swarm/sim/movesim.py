"""Moving tasks between simulated nodes: adaptive transfer of queued tasks and
migration of running ones, both decided by swarm's policy code.

Transfer: `policy.transfer.TransferPolicy` runs on every node every tick, with its
probes, replies, pushes and steals carried as delayed messages; a moved task is
admitted by the taker with the agent's admission (`node.decide.admission_refusal`),
or the handoff aborts and it stays with the giver. Migration: each node plans with
`policy.migration.plan_migrations`; the target re-checks as the agent's migrator
does (admission, then `recheck_at_target`), and the task resumes there after its
downtime with the work it had left (checkpoint mode).
"""

from __future__ import annotations

from typing import Any

from swarm.model import MigrateMode
from swarm.node.decide import admission_refusal
from swarm.policy import migration as mig
from swarm.policy.placement import Needs
from swarm.policy.transfer import (
    ProbeFor,
    ProbeReply,
    ProbeRequest,
    PushTask,
    QueuedTask,
    StealFrom,
)
from swarm.policy.view import sample_peers

from .books import (
    MIGARRIVE,
    MIGTICK,
    MOVE,
    PROBE,
    REPLY,
    STEAL,
    STEP,
    Books,
    SimNode,
    SimTask,
    any_peer,
)
from .simconfig import MigrationSpec


class TransferSim(Books):
    """Adaptive transfer of queued tasks (a part of `ClusterSim`)."""

    def _qts(self, n: SimNode) -> list[QueuedTask]:
        out = []
        for t in n.queue:
            q = t.qt
            if q is None:
                needs = t.needs
                if needs is None:
                    needs = t.needs = Needs.of(t.spec)
                q = t.qt = QueuedTask(t.spec.id, needs, t.arrival, t.arrived_at)
            out.append(q)
        return out

    def _on_step(self, n: SimNode, tick: float) -> None:
        tp = n.tp
        assert tp is not None
        now = self.now
        if not self._jobs_left and self._queued == 0:
            # Drain: no arrivals are left and nothing is queued anywhere, so there is
            # nothing to move; only long running tasks remain. Skipping the rounds
            # keeps a heavy-tailed drain from costing more than the run itself.
            self._push(now + tick, STEP, n, tick)
            return
        acts = tp.step(now, n.report(), self._qts(n), self.view, self.rng)
        for a in acts:
            self._act(n, a)
        self._push(now + tick, STEP, n, tick)

    def _charge(self, n: SimNode) -> None:
        """Protocol overhead: the node's CPU runs a probe for `probe_cpu` first."""
        cost = self.cfg.probe_cpu
        if cost <= 0:
            return
        self._advance(n)
        n.hold_until = (self.now if self.now >= n.hold_until else n.hold_until) + cost
        if n.running:
            self._reschedule(n)

    def _act(self, n: SimNode, a: ProbeFor | PushTask | StealFrom) -> None:
        delay = self.cfg.net_delay
        now = self.now
        if isinstance(a, ProbeFor):
            self._charge(n)
            self._push(now + delay, PROBE, (n, a.request), self.by_id[a.peer])
        elif isinstance(a, PushTask):
            task = self._find_queued(n, a.task_id)
            if task is None:
                return  # it started meanwhile: nothing to move
            self._unqueue(n, task)
            self._push(now + delay + self.cfg.transfer_cost, MOVE, task, (n, self.by_id[a.peer]))
        else:
            self._push(now + delay, STEAL, (n, a.request), self.by_id[a.peer])

    @staticmethod
    def _find_queued(n: SimNode, task_id: str) -> SimTask | None:
        for t in n.queue:
            if t.spec.id == task_id:
                return t
        return None

    def _on_probe(self, msg: tuple[SimNode, ProbeRequest], peer: SimNode) -> None:
        src, req = msg
        tp = peer.tp
        assert tp is not None
        self._charge(peer)
        reply = tp.on_probe(self.now, req, peer.report(), self._qts(peer))
        self._push(self.now + self.cfg.net_delay, REPLY, src, reply)

    def _on_reply(self, src: SimNode, reply: ProbeReply) -> None:
        tp = src.tp
        assert tp is not None
        for a in tp.on_probe_reply(self.now, reply, src.report(), self._qts(src)):
            self._act(src, a)

    def _on_steal(self, msg: tuple[SimNode, ProbeRequest], peer: SimNode) -> None:
        thief, req = msg
        tp = peer.tp
        assert tp is not None
        self._charge(peer)
        tid = tp.on_steal(self.now, req, peer.report(), self._qts(peer))
        if tid is None:
            return
        task = self._find_queued(peer, tid)
        if task is None:
            return
        self._unqueue(peer, task)
        self._push(
            self.now + self.cfg.net_delay + self.cfg.transfer_cost, MOVE, task, (peer, thief)
        )

    def _on_move(self, task: SimTask, ends: tuple[SimNode, SimNode]) -> None:
        giver, taker = ends
        if admission_refusal(task.spec, taker.ledger) is None:
            self.transfers += 1
            self._enqueue(taker, task)
        else:  # the handoff aborts: the task stays with the giver
            self.refusals += 1
            self._enqueue(giver, task)


class MigrationSim(Books):
    """Migration of running tasks (a part of `ClusterSim`)."""

    def _on_migtick(self, n: SimNode, _: Any) -> None:
        ms = self.cfg.migration
        assert ms is not None and n.bucket is not None
        now = self.now
        self._push(now + ms.interval, MIGTICK, n)
        if not n.running:
            return
        cfg = ms.config
        local = n.report()
        # Exact shortcut: gain = remaining * (slowdown here - slowdown there) and the
        # target's slowdown is >= 1, so nothing can be worth moving from a node whose
        # own slowdown (computed by the policy's function) is 1.
        if cfg.slowdown(local, 0) <= 1.0:
            return
        tasks = [
            mig.RunningTask(
                t.spec.id,
                MigrateMode.CHECKPOINT,
                age=now - t.first_start,
                state_bytes=ms.state_bytes,
                pause=ms.pause,
                warmup=ms.warmup,
                moves=t.moves,
                last_move_at=t.last_move,
            )
            for t in n.running
        ]
        view = self.view
        sample = sample_peers(view, 2, self.rng, any_peer, skip=n.id)
        cands = []
        by_node = {}
        for p in sample.chosen:
            e = view[p]
            cands.append(mig.Candidate(p, e.report, now - e.received_at))
            by_node[p] = self.by_id[p].mig_here
        plan = mig.plan_migrations(
            tasks,
            local,
            cands,
            now=now,
            bucket=n.bucket,
            config=cfg,
            in_flight=mig.InFlight(here=n.mig_here, cluster=self._mig_cluster, by_node=by_node),
        )
        n.bucket = plan.bucket
        by_id = {rt.task_id: rt for rt in tasks}
        for dec in plan.start:
            if dec.target is not None:
                self._migrate(n, by_id[dec.task_id], self.by_id[dec.target], ms)

    def _migrate(self, src: SimNode, rt: mig.RunningTask, dst: SimNode, ms: MigrationSpec) -> None:
        """The target re-checks on its fresh state, as the agent's migrator does:
        admission (shares) then `recheck_at_target` (still worth it, in-flight limit).
        A refusal leaves the task running where it is."""
        task_id = rt.task_id
        task = next((t for t in src.running if t.spec.id == task_id), None)
        if task is None:
            return
        cfg = ms.config
        refused = admission_refusal(task.spec, dst.ledger) is not None or (
            mig.recheck_at_target(
                rt,
                src.report(),
                dst.report(),
                config=cfg,
                bandwidth=cfg.default_bandwidth,
                incoming=dst.mig_here,
            )
            is not None
        )
        if refused:
            self.refusals += 1
            return
        self._advance(src)
        task.work_left = max(0.0, task.finish_vt - src.vt)
        src.running.remove(task)
        self._acc(src)
        src.ledger.remove(task_id)
        if self._levels:
            k = len(src.ledger)
            self._level(src, k + 1, k)
        self._touch(src)
        self._try_start(src, changed=True)
        self._acc(dst)
        dst.ledger.add(task.spec)  # held for it while it is in flight
        if self._levels:
            k = len(dst.ledger)
            self._level(dst, k - 1, k)
        self._touch(dst)
        task.node = dst
        task.moves += 1
        src.mig_here += 1
        dst.mig_here += 1
        self._mig_cluster += 1
        self.migrations += 1
        self._push(self.now + ms.downtime, MIGARRIVE, task, src)

    def _on_migarrive(self, task: SimTask, src: SimNode) -> None:
        dst = task.node
        assert dst is not None
        src.mig_here -= 1
        dst.mig_here -= 1
        self._mig_cluster -= 1
        task.last_move = self.now
        self._enqueue(dst, task, front=True, in_ledger=True)
