"""Placing a task whose home is this node: two choices on the stale view, the re-check
here, offers to peers, and retries with back-off, as a state machine per task (pure).

A placement that must wait (a back-off, an offer's outcome) keeps a `Job`; the state
asks to be woken (`WakeAt`) and continues when the time comes, a peer's report or
join kicks it, or its offer is decided. The common case, this node chosen and its own
admission agreeing, is decided at once, with no job at all: the submit-to-start path
has no trip through a scheduler.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import attrs

from .. import model as m
from ..cluster import handoff as h
from ..policy import constraints as cons
from ..policy import gpu as gpupol
from ..policy import latebind as lb
from ..policy import placement as pl
from ..policy import shares as sh
from ..policy.view import LoadView
from . import decide
from . import events as ev
from .records import TaskRecords

S = m.TaskState
EXPLAIN_CACHE = 10_000  # tasks whose decisions stay in memory
RETRY = pl.RetryPolicy(base=0.5, max_backoff=10.0)
NO_CWD = "working directory "  # how a refusal for a missing cwd begins (runtime/cwdcheck.py)
DATA_RETRY = 0.25  # a task held for its data looks for a holder's free slot this often


@attrs.define
class Job:
    retry: pl.PlacementRetry = attrs.field(factory=pl.PlacementRetry)
    first: pl.Placement | None = None  # a decision taken moments ago, to carry out
    offered: pl.Placement | None = None  # the decision whose offer is out
    no_cwd: set[m.NodeId] = attrs.field(factory=set)  # refused: its cwd is not there


class Placing:
    """The placement side of NodeState (state.py), which holds the fields below."""

    node: m.NodeId
    records: TaskRecords
    ledger: sh.ShareLedger
    gpus: gpupol.GpuAllocator
    view: LoadView
    rng: random.Random
    d: int
    placement_rule: str
    breaks: frozenset[str]
    jobs: dict[m.TaskId, Job]
    explains: OrderedDict[m.TaskId, list[dict[str, Any]]]
    counters: dict[str, int]
    handoffs: Any
    report_max_age: float | None
    data_delay: float
    late: lb.LateBinding | None

    if TYPE_CHECKING:  # provided by the other parts of NodeState

        def state_held(self, t: m.Task) -> bool: ...

        def fence_hold(self, t: m.Task, now: float) -> float | None: ...

        def in_doubt_here(self, tid: m.TaskId, now: float) -> bool: ...

        def defer_in_doubt(self, tid: m.TaskId, wall: float) -> list[ev.Instruction]: ...

        def local_report(self, wall: float) -> m.LoadReport:
            raise NotImplementedError

        def backup_avoid(self, spec: m.TaskSpec) -> frozenset[m.NodeId]: ...

        def count_in_view(self, node: m.NodeId, spec: m.TaskSpec, now: float) -> None: ...

        def backup_watch(self, t: m.Task, now: float) -> list[ev.Instruction]: ...

        def admit_here(self, spec: m.TaskSpec) -> pl.Admission:
            raise NotImplementedError

        def enqueue_local(
            self, task: m.Task, now: float, front: bool = False
        ) -> list[ev.Instruction]:
            raise NotImplementedError

        def offer(
            self, tid: m.TaskId, target: m.NodeId, now: float, wall: float
        ) -> tuple[str | None, list[ev.Instruction]]:
            raise NotImplementedError

        def _change(
            self, tid: m.TaskId, dst: m.TaskState, wall: float, cause: str, durable: bool = False
        ) -> tuple[m.Task, ev.Record]:
            raise NotImplementedError

    # ------------------------------------------------------------ decisions

    def placeable(self, t: m.Task) -> bool:
        """Is a task ready to be placed by two choices (rather than kept here, or no
        longer ours to place)?"""
        return not (
            t.state is not S.QUEUED
            or t.node != self.node
            or t.id in self.ledger
            or self.gpus.get(t.id) is not None
            or self.state_held(t)
            or (t.spec.reserve_shares and "oversubscribe" in self.breaks)
        )

    def choose(
        self, spec: m.TaskSpec, now: float, wall: float, exclude: frozenset[m.NodeId] = frozenset()
    ) -> pl.Placement:
        local = self.local_report(wall)
        if spec.constraints and "ignore-constraints" in self.breaks:
            spec = attrs.evolve(spec, constraints=())  # TEST-ONLY: chaos self-test
        d = self.d
        where = self.where(spec, local, wall)
        if spec.idempotent:  # never where its other copy is (backups.py)
            avoid = self.backup_avoid(spec)
            if avoid:
                exclude = exclude | avoid
                where = attrs.evolve(where, other_copy=avoid)
            if spec.backup_of:  # a backup is worth something only where it starts now
                d = max(d, len(self.view))
        return decide.choose(
            self.placement_rule,
            d,
            spec,
            local,
            self.view,
            self.rng,
            now,
            exclude,
            max_age=self.report_max_age,
            where=where,
        )

    def where(self, spec: m.TaskSpec, local: m.LoadReport, wall: float) -> pl.Where:
        """What this home knows for `spec`'s soft placement: its job's tasks per node
        and per value of the spread label, and whether its data must be local for now."""
        if not spec.data and not (spec.job and (spec.spread or spec.anti_affinity)):
            return pl.NOWHERE  # the common case, on the submit-to-start path
        holders = pl.data_first(pl.Needs.of(spec), wall - spec.submitted_at, self.data_delay)
        if not spec.job or not (spec.spread or spec.anti_affinity):
            return pl.Where(holders_only=True) if holders else pl.NOWHERE
        per_node: dict[m.NodeId, int] = {}
        for t in self.records.active.values():
            if t.spec.job == spec.job and t.id != spec.id and t.spec.uid == spec.uid:
                job = self.jobs.get(t.id)  # an offer in flight counts where it goes
                n = job.offered.target if job and job.offered and job.offered.target else t.node
                per_node[n] = per_node.get(n, 0) + 1
        full = frozenset(
            n for n, c in per_node.items() if spec.anti_affinity and c >= spec.anti_affinity
        )
        spread_to: frozenset[str] = frozenset()
        if spec.spread:
            reports = {n: e.report for n, e in self.view.items()}
            reports[self.node] = local
            needs = pl.Needs.of(spec)
            value = {n: pl.label_map(r.labels).get(spec.spread) for n, r in reports.items()}
            per_value: dict[str, int] = {}
            for n, c in per_node.items():
                v = value.get(n)
                if v is not None:
                    per_value[v] = per_value.get(v, 0) + c

            def allowed(r: m.LoadReport) -> bool:
                why = pl.refusal(r, needs) if needs.constraints else None
                return why is None or why.code != "constraint"

            live = [v for n, v in value.items() if v is not None and allowed(reports[n])]
            spread_to = cons.spread_values(per_value, live)
        return pl.Where(
            spread_key=spec.spread, spread_to=spread_to, full=full, holders_only=holders
        )

    def explain(self, tid: m.TaskId, rec: dict[str, Any], wall: float) -> ev.Explain:
        """Keep a decision for `swarm explain`: in memory for recent tasks; the runtime
        also journals it (read back for older tasks and after a restart)."""
        rec = {"at": wall, **rec}
        lst = self.explains.get(tid)
        if lst is None:
            lst = self.explains[tid] = []
            while len(self.explains) > EXPLAIN_CACHE:
                self.explains.popitem(last=False)
        lst.append(rec)
        del lst[:-20]
        return ev.Explain(tid, rec)

    def _run_here(
        self, t: m.Task, p: pl.Placement, adm: pl.Admission, now: float, wall: float
    ) -> list[ev.Instruction]:
        rec = p.explain()
        rec["outcome"] = ("runs here: " if adm.ok else "refused here: ") + adm.reason
        out: list[ev.Instruction] = [self.explain(t.id, rec, wall)]
        if adm.ok:
            self.counters["placed_local"] += 1
            out += self.enqueue_local(t, now)
        return out

    def place(self, tid: m.TaskId, now: float, wall: float) -> list[ev.Instruction]:
        """Place a queued task whose home is here (a no-op while it is being placed)."""
        if tid in self.jobs:
            return []
        if self.in_doubt_here(tid, now):  # doubt.py: restarted after a long absence
            return self.defer_in_doubt(tid, wall)
        first: pl.Placement | None = None
        t = self.records.active.get(tid)
        watch = self.backup_watch(t, now) if t is not None and t.spec.idempotent else []
        if t is not None and self.placeable(t) and self.fence_hold(t, now) is None:
            held = self._late_hold(t, now, wall)
            if held:
                return watch + held
            first = self.choose(t.spec, now, wall)
            if first.target == self.node and not t.spec.data:
                adm = self.admit_here(t.spec)
                if adm.ok:
                    self.counters["placements"] += 1
                    return watch + self._run_here(t, first, adm, now, wall)
                first = None  # refused here: the job chooses again (and records a refusal)
                if adm.reason.startswith(NO_CWD):
                    self.jobs[tid] = Job(no_cwd={self.node})
        self.jobs.setdefault(tid, Job(first=first))
        later = self.step(tid, now, wall)
        return [*watch, ev.Later(tuple(later))] if later else watch

    def _late_hold(self, t: m.Task, now: float, wall: float) -> list[ev.Instruction]:
        """Late binding (policy/latebind.py): no room here now, so the task waits in
        this node's queue while the d least loaded of a sample of peers hold a
        reservation for it; the first of them with room pulls it (runtime/latebindio.py),
        or it starts here when a slot frees first. [] means: place it as usual (late
        binding off, room here, a task placed by its data, spread or GPU, or no peer)."""
        spec = t.spec
        if (
            self.late is None
            or spec.backup_of  # a backup goes where it starts now, or nowhere
            or spec.data
            or spec.gpu is not None
            or (spec.job and (spec.spread or spec.anti_affinity))
            or not self.admit_here(spec).ok
        ):
            return []
        local = self.local_report(wall)
        msgs = self.late.hold(now, t.id, pl.Needs.of(spec), local, self.view, self.rng)
        if not msgs:
            return []
        self.counters["placements"] += 1
        self.counters["late_held"] += 1
        peers = ", ".join(sorted(x.peer for x in msgs if isinstance(x, lb.Reserve)))
        rec = {
            "outcome": f"held here (late binding): no room now; reserved on {peers}:"
            " the first with room pulls it, or it starts here when a slot frees"
        }
        return [
            self.explain(t.id, rec, wall),
            *self.enqueue_local(t, now),
            ev.SendLate(tuple(msgs)),
        ]

    def step(self, tid: m.TaskId, now: float, wall: float) -> list[ev.Instruction]:
        """Carry a placement job on as far as it goes now."""
        out: list[ev.Instruction] = []
        while True:
            job = self.jobs.get(tid)
            if job is None or job.offered is not None:
                return out
            t = self.records.active.get(tid)
            if t is None or t.state is not S.QUEUED or t.node != self.node or tid in self.ledger:
                del self.jobs[tid]
                return out
            if t.spec.reserve_shares and "oversubscribe" in self.breaks:
                del self.jobs[tid]  # TEST-ONLY: chaos self-test (testbreak.py)
                return out + self.enqueue_local(t, now)
            kept = self._kept_here(t)
            if kept is not None:
                del self.jobs[tid]
                return [
                    *out,
                    self.explain(tid, {"outcome": kept}, wall),
                    *self.enqueue_local(t, now),
                ]
            hold = self.fence_hold(t, now)
            if hold is not None and job.retry.ready(now):
                lapse = "until the lease of its last run has surely lapsed (--at-most-once)"
                rec = {"outcome": f"waits {hold - now:.1f} s {lapse}"}
                out.append(self.explain(tid, rec, wall))
                job.retry = attrs.evolve(job.retry, not_before=hold)
            if not job.retry.ready(now):
                return [*out, ev.WakeAt(job.retry.not_before)]
            if job.first is not None:
                p, job.first = job.first, None
            else:
                # nodes that refused for its working directory stay excluded across
                # rounds, so the rest (even the least attractive) are asked in turn
                p = self.choose(t.spec, now, wall, job.retry.exclude | frozenset(job.no_cwd))
            self.counters["placements"] += 1
            wait = self._data_wait(t.spec, p, now, wall)
            if wait is not None:
                rec = p.explain()
                rec["outcome"] = wait[1]
                out.append(self.explain(tid, rec, wall))
                job.retry = attrs.evolve(job.retry, not_before=wait[0])
                continue
            if p.target is None and job.no_cwd and self._cwd_nowhere(tid, job, "", NO_CWD, wall):
                return out + self._fail_no_cwd(t, job, wall)
            if p.target is None:
                rec = p.explain()
                rec["outcome"] = "waiting: " + p.summary
                out.append(self.explain(tid, rec, wall))
                job.retry = job.retry.on_no_target(now, RETRY, self.rng)
                continue
            if p.target == self.node:
                adm = self.admit_here(t.spec)
                out += self._run_here(t, p, adm, now, wall)
                if adm.ok:
                    del self.jobs[tid]
                    return out
                job.retry = job.retry.on_refusal(self.node, now, RETRY, self.rng)
                if self._cwd_nowhere(tid, job, self.node, adm.reason, wall):
                    return out + self._fail_no_cwd(t, job, wall)
                continue
            why, instrs = self.offer(tid, p.target, now, wall)
            if why is None:
                job.offered = p
                # counted there until a report made after it took the task
                self.count_in_view(p.target, t.spec, now)
                return out + instrs
            rec = p.explain()
            rec["outcome"] = f"{p.target} refused: {why}"
            out.append(self.explain(tid, rec, wall))
            job.retry = job.retry.on_refusal(p.target, now, RETRY, self.rng)
            if self._cwd_nowhere(tid, job, p.target, why, wall):
                return out + self._fail_no_cwd(t, job, wall)

    def _data_wait(
        self, spec: m.TaskSpec, p: pl.Placement, now: float, wall: float
    ) -> tuple[float, str] | None:
        """Delay scheduling: (until when, why) the task waits for a node that holds its
        data and has a free slot; None when it goes on now."""
        needs = pl.Needs.of(spec)
        waited = wall - spec.submitted_at
        target = None
        if p.target == self.node:
            target = self.local_report(wall)
        elif p.target is not None and p.target in self.view:
            target = self.view[p.target].report
        if not pl.hold_for_data(needs, waited, self.data_delay, target):
            return None
        left = self.data_delay - waited
        why = (
            f"waiting for a slot on a node holding {', '.join(spec.data)}"
            f" ({waited:.1f} s of {self.data_delay:g} s; then any node)"
        )
        # at least 10 ms: a wake a hair before the deadline must not spin
        return now + min(DATA_RETRY, max(left, 0.01)), why

    def _kept_here(self, t: m.Task) -> str | None:
        """Why a task must run here rather than be placed (None: place it)."""
        if self.gpus.get(t.id) is not None:
            # it holds a GPU slice here from before a restart: run it here again
            return "runs here: holds its GPU slice"
        he = self.handoffs.home.entries.get(t.id)
        if (he is None or he.phase is h.HomePhase.LOCAL) and self.state_held(t):
            # its checkpoint is here (it ran here, or its move failed): placing it
            # elsewhere would restart it from scratch
            return "runs here: its checkpoint is here"
        return None

    def offer_decided(
        self, tid: m.TaskId, ok: bool, reason: str, now: float, wall: float
    ) -> list[ev.Instruction]:
        """The offer a placement job waited for is decided: record it and go on."""
        job = self.jobs.get(tid)
        if job is None or job.offered is None:
            return []
        p, job.offered = job.offered, None
        rec = p.explain()
        rec["outcome"] = f"handed to {p.target}" if ok else f"{p.target} refused: {reason}"
        out: list[ev.Instruction] = [self.explain(tid, rec, wall)]
        if ok:
            self.counters["placed_remote"] += 1
            # not the end: while the offer was out the holder may already have been
            # declared dead and the task re-queued here; the job's first check decides
            job.retry = pl.PlacementRetry()
        else:
            assert p.target is not None
            job.retry = job.retry.on_refusal(p.target, now, RETRY, self.rng)
            t = self.records.active.get(tid)
            if t is not None and self._cwd_nowhere(tid, job, p.target, reason, wall):
                return out + self._fail_no_cwd(t, job, wall)
        return out + self.step(tid, now, wall)

    def _cwd_nowhere(
        self, tid: m.TaskId, job: Job, node: m.NodeId, reason: str, wall: float
    ) -> bool:
        """Note a refusal for a missing working directory; True once every node that
        could take the task otherwise (its constraints hold there and it is not
        drained: this one and every peer in the view) has refused it for that."""
        if not reason.startswith(NO_CWD):
            return False
        if node:
            job.no_cwd.add(node)
        t = self.records.active.get(tid)
        if t is None:
            return False
        needs = pl.Needs.of(t.spec)

        def could(r: m.LoadReport) -> bool:
            why = pl.refusal(r, needs)
            return why is None or why.code not in ("constraint", "drained")

        reports = [e.report for n, e in self.view.items() if n != self.node]
        reports.append(self.local_report(wall))
        return all(r.node in job.no_cwd for r in reports if could(r))

    def _fail_no_cwd(self, t: m.Task, job: Job, wall: float) -> list[ev.Instruction]:
        del self.jobs[t.id]
        why = (
            f"working directory {t.spec.cwd} does not exist on any node"
            f" ({len(job.no_cwd)} checked; --cwd-any runs it in $HOME instead)"
        )
        _, rec = self._change(t.id, S.FAILED, wall, why, durable=True)
        return [self.explain(t.id, {"outcome": "failed: " + why}, wall), rec]

    def wake(self, now: float, wall: float) -> list[ev.Instruction]:
        """Time passed, or a peer's report or join came in: jobs go on where they can."""
        out: list[ev.Instruction] = []
        for tid in self.jobs_not_offered():
            out += self.step(tid, now, wall)
        return out

    def jobs_not_offered(self) -> list[m.TaskId]:
        """The jobs a wake or a report may carry on: not those whose offer is out (its
        answer moves them, and `step` returns at once for them). During a burst
        thousands of offers are out, and each wake stepped every one (issue 23)."""
        return [tid for tid, job in self.jobs.items() if job.offered is None]
