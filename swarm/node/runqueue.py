"""The run queue's order and who yields to whom (pure; issue 20): priority classes
first, then fair share (DRF over decayed cluster-wide usage, from gossip), then
arrival; local preemption when a higher class cannot start; a group's elastic quota
as a local allowance.

Every node decides for its own queue from stale gossip, on purpose: there is no
scheduler to ask. What a node gossips for the others' decisions rides in its load
report (bounded): its weight per priority value (`bands`, so placement does not count
preemptible work against urgent work), its slots queued and running per group
(`groups`, the quota's demand) and its own decayed usage per principal (`usage`, one
origin's entry of policy/fairness's usage map: a newer report replaces an older one,
so the merge is the map's per-origin max).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from .. import limits as lim
from .. import model as m
from ..policy import fairness as fair
from ..policy import preemption as pre
from ..policy import quota as qu
from ..policy.sharing import Sharing
from ..policy.view import LoadView
from . import events as ev
from .records import TaskRecords
from .recovery import USAGE_KEY
from .sharefields import fit, top_bands

S = m.TaskState
ONE_SLOT = fair.Resources(slots=1.0)
RECLAIMED = -(10**9)  # the class preemption sees borrowed work at, for a reclaim
GPU_UNITS = 100.0  # one whole device, as policy/fairness counts GPUs


def user_principal(spec: m.TaskSpec) -> fair.Principal:
    return spec.user or (f"uid:{spec.uid}" if spec.uid is not None else "(unknown)")


def group_principal(group: str) -> fair.Principal:
    return "group:" + group


def demand(spec: m.TaskSpec) -> fair.Resources:
    """What one running task holds, as fair share counts it."""
    gpu = 0.0 if spec.gpu is None else float(spec.gpu.core)
    return fair.Resources(1.0, spec.cpu or 0.0, float(spec.mem or 0), gpu)


@attrs.frozen
class QueueView:
    """What `order` and `explain` read of the cluster: usage per principal and the
    cluster's capacity, as of `at` (wall)."""

    usage: Mapping[fair.Principal, fair.Resources]
    capacity: fair.Resources
    at: float


def capacity(reports: Iterable[m.LoadReport]) -> fair.Resources:
    total = fair.NOTHING
    for r in reports:
        total = total + fair.Resources(
            float(r.slots), r.cpus, float(r.mem_total), GPU_UNITS * len(r.gpus)
        )
    return total


def usage_totals(
    reports: Iterable[m.LoadReport], now: float, half_life: float
) -> dict[fair.Principal, fair.Resources]:
    """Cluster-wide decayed usage per principal as of `now`: each report is its node's
    entry of the usage map (policy/fairness.UsageMap, the CRDT: the newest version per
    origin wins, as the load view keeps it), dated by its version (wall ms), so an
    old report's usage has decayed by now."""
    entries = []
    for r in reports:
        at = r.version / 1000.0
        rows = tuple(sorted((p, fair.Decayed(fair.Resources(*v), at)) for p, *v in r.usage))
        entries.append((r.node, fair.OriginUsage(r.version, rows)))
    return fair.UsageMap(tuple(sorted(entries))).totals(now, half_life)


def order(
    specs: Iterable[m.TaskSpec], view: QueueView, weights: Mapping[str, float] | None = None
) -> list[m.TaskId]:
    """Queued tasks in start order: higher priority first; within a priority the user
    with the smallest weighted dominant share first; then arrival (the given order)."""
    w = weights or {}
    share: dict[tuple[fair.Principal, str], float] = {}
    keyed = []
    for i, spec in enumerate(specs):
        p = user_principal(spec)
        s = share.get((p, spec.group))
        if s is None:
            # a user's weight times their group's (a group's `weight` in the config)
            wt = w.get(p, 1.0) * (w.get(group_principal(spec.group), 1.0) if spec.group else 1.0)
            s = fair.dominant_share(view.usage.get(p, fair.NOTHING), view.capacity)
            s = share[(p, spec.group)] = s / max(wt, 1e-9)
        keyed.append((-spec.priority, s, i, spec.id))
    keyed.sort()
    return [k[3] for k in keyed]


def quota_refusal(
    sharing: Sharing,
    spec: m.TaskSpec,
    node: m.NodeId,
    groups_seen: Mapping[m.NodeId, tuple[tuple[str, int, int], ...]],
    running_here: int,
    queued_here: int,
) -> str | None:
    """Why a task of a capped group may not start here now (None: it may): its
    group's local allowance (the cap split by gossiped demand) is used up."""
    g = sharing.group(spec.group) if spec.group else None
    if g is None or g.quota_max is None:
        return None
    queued = {n: float(q) for n, rows in groups_seen.items() for gr, q, _ in rows if gr == g.name}
    running = sum(r for rows in groups_seen.values() for gr, _, r in rows if gr == g.name)
    queued[node] = float(queued_here)
    # what runs is never cut and counts first; what is left of the cap is split by
    # the queued demand each node gossips, in whole slots
    left = int(g.quota_max + 1e-9) - running - running_here
    give = qu.whole_slots(float(max(left, 0)), node, queued)
    if queued_here > 0 and running_here < sharing.quota_floor:
        give = max(give, 1)  # the configured floor: a start the others may not know of
    if give < 1:
        return (
            f"group {g.name} at its quota: {running_here + running} of {g.quota_max:g} slots"
            f" run ({running_here} here), as gossiped by {len(groups_seen) + 1} nodes"
        )
    return None


def time_share(used: fair.Resources, capacity: fair.Resources, half_life: float) -> float:
    """A dominant share of decayed usage (resource-seconds) as the fraction of the
    cluster held, time-weighted: divided by the decay's time constant."""
    return fair.dominant_share(used, capacity) / (half_life / math.log(2))


class RunQueue:
    """The run-queue side of NodeState (state.py), which holds the fields below."""

    node: m.NodeId
    records: TaskRecords
    view: LoadView
    queued: Any
    running: Collection[m.TaskId]
    slots: int
    sharing: Sharing
    used: dict[fair.Principal, fair.Decayed]  # this node's own usage
    used_at: float  # wall time usage was last accrued
    preempted_at: deque[float]  # wall times of this node's recent preemptions
    preempting: dict[m.TaskId, m.TaskId]  # victims being stopped -> the task they yield to
    quota_epoch: int  # bumped when what the quota gate reads changes
    demand_log: dict[str, deque[tuple[float, int]]]  # capped group -> (wall, queued here)
    quota_memo: dict[str, tuple[int, str]]  # group -> (epoch, its refusal then)
    share_cache: tuple[float, dict[str, Any]] | None
    counters: dict[str, int]

    if TYPE_CHECKING:  # provided by Placing

        def explain(self, tid: m.TaskId, rec: dict[str, Any], wall: float) -> ev.Explain:
            raise NotImplementedError

    # ------------------------------------------------------------- usage

    def accrue(self, wall: float) -> None:
        """Add what the running tasks used since the last call (resource-seconds). A
        task that started since then counts from its start (`started_at`), so a start
        needs no call of its own; an end does (the task leaves `running`)."""
        since = self.used_at
        self.used_at = wall
        if not since or wall <= since:
            return
        # summed per principal first, then one decay-and-add each: this runs at every
        # end and for every load report, over every running task (issue 23)
        sums: dict[fair.Principal, list[float]] = {}
        for tid in self.running:
            t = self.records.active.get(tid)
            if t is None:
                continue
            dt = wall - max(since, t.started_at or since)
            if dt <= 0:
                continue
            d = demand(t.spec)
            row = (d.slots * dt, d.cpu * dt, d.mem * dt, d.gpu * dt)
            for p in self._principals(t.spec):
                acc = sums.get(p)
                if acc is None:
                    sums[p] = list(row)
                else:
                    for i, x in enumerate(row):
                        acc[i] += x
        hl = self.sharing.half_life
        for p, acc in sums.items():
            amount = fair.Resources(*acc)
            self.used[p] = self.used.get(p, fair.Decayed()).plus(amount, wall, hl)

    @staticmethod
    def _principals(spec: m.TaskSpec) -> tuple[fair.Principal, ...]:
        u = user_principal(spec)
        return (u, group_principal(spec.group)) if spec.group else (u,)

    def share_fields(self, wall: float) -> dict[str, Any]:
        """The load report's bands, groups and usage (each bounded)."""
        self.accrue(wall)
        bands: dict[int, float] = {}
        groups: dict[str, list[int]] = {}
        active = self.records.active
        for held, running in ((self.queued, 0), (self.running, 1)):  # queued, then running
            for tid in held:
                t = active.get(tid)
                if t is None:
                    continue
                spec = t.spec
                bands[spec.priority] = bands.get(spec.priority, 0.0) + spec.weight
                if spec.group:
                    groups.setdefault(spec.group, [0, 0])[running] += 1
        self._log_demand(wall, groups)
        kept = fair.bounded(self.used, self.sharing.half_life, wall, lim.MAX_REPORT_PRINCIPALS)
        usage = [
            (p, *(round(x) for x in d.value.as_tuple()))
            for p, d in sorted(kept.items(), key=lambda kv: -kv[1].value.slots)
            if any(d.value.as_tuple())
        ]
        rows = sorted(groups.items(), key=lambda x: (-sum(x[1]), x[0]))
        group_rows = [(name, q, r) for name, (q, r) in rows[: lim.MAX_REPORT_GROUPS]]
        return fit(top_bands(bands), group_rows, usage)

    def usage_record(self, wall: float) -> ev.Persist:
        """This node's usage, to journal (a restart keeps what its users used)."""
        self.accrue(wall)
        kept = fair.bounded(self.used, self.sharing.half_life, wall, 256)
        rows = [[p, wall, *d.value.as_tuple()] for p, d in sorted(kept.items())]
        return ev.Persist((ev.Put(USAGE_KEY, rows),))

    def restore_usage(self, value: Any) -> None:
        """From the journal at start: [[principal, at, slots, cpu, mem, gpu], ...]."""
        for row in value:
            p, at, *v = row
            if isinstance(p, str) and len(v) == 4:
                self.used[p] = fair.Decayed(fair.Resources(*map(float, v)), float(at))

    def _log_demand(self, wall: float, groups: Mapping[str, list[int]]) -> None:
        """Remember what this node's report says it has queued of each capped group."""
        for g in self.sharing.groups:
            if g.quota_max is not None:
                log = self.demand_log.setdefault(g.name, deque())
                qu.log_demand(log, wall, groups.get(g.name, [0, 0])[0], self.sharing.quota_lag)

    def _held(self) -> Iterable[tuple[m.TaskId, bool]]:
        for tid in self.queued:
            yield tid, False
        for tid in self.running:
            yield tid, True

    def fair_view(self, wall: float, local: m.LoadReport) -> QueueView:
        reports = [e.report for n, e in self.view.items() if n != self.node] + [local]
        totals = usage_totals(reports, wall, self.sharing.half_life)
        return QueueView(totals, capacity(reports), wall)

    # ------------------------------------------------------------- order

    def run_order(self, qv: QueueView) -> list[m.TaskId]:
        """This node's queue in start order (tasks no longer queued here dropped)."""
        specs = []
        for tid in self.queued:
            t = self.records.active.get(tid)
            if t is not None:
                specs.append(t.spec)
        return order(specs, qv, self.sharing.weights())

    def quota_refusal(self, spec: m.TaskSpec, wall: float | None = None) -> str | None:
        """Why a capped group's task may not start here now. A refusal is remembered
        until something it read changes (a peer's report, a start or an end here,
        `quota_epoch`): a dispatch pass over a long queue of one capped group then
        costs one look, not one per task (each look reads every node's row)."""
        if not spec.group:
            return None
        g = self.sharing.group(spec.group)
        if g is None or g.quota_max is None:
            return None
        memo = self.quota_memo.get(spec.group)
        if memo is not None and memo[0] == self.quota_epoch:
            return memo[1]
        why = self._quota_refusal(spec, wall)
        if why is not None:
            self.quota_memo[spec.group] = (self.quota_epoch, why)
        return why

    def _quota_refusal(self, spec: m.TaskSpec, wall: float | None = None) -> str | None:
        seen = {n: e.report.groups for n, e in self.view.items() if n != self.node}
        run = que = 0
        counted = False
        for tid, running in self._held():
            t = self.records.active.get(tid)
            if t is not None and t.spec.group == spec.group:
                counted = counted or tid == spec.id
                if running:
                    run += 1
                else:
                    que += 1
        if not counted:
            que += 1  # the runner took it off the queue to ask: it is still demand here
        if wall is not None:
            log = self.demand_log.get(spec.group, ())
            que = qu.lagged_demand(log, wall, self.sharing.quota_lag, que)
        return quota_refusal(self.sharing, spec, self.node, seen, run, que)

    # ------------------------------------------------------------- preemption

    def preempt_for(self, waiting: m.TaskId, now: float, wall: float) -> list[ev.Instruction]:
        """A queued task cannot start for want of a slot: stop lower-class work for it
        (the receiver decides; victims: lowest class, least work lost, newest), within
        the minimum gap and the rate limit. [] when nothing is to be stopped."""
        sp = self.sharing
        t = self.records.active.get(waiting)
        if not sp.preempt or t is None or t.state is not S.QUEUED:
            return []
        while self.preempted_at and wall - self.preempted_at[0] > 60.0:
            self.preempted_at.popleft()
        if len(self.preempted_at) >= sp.preempt_per_minute:
            return []
        if waiting in self.preempting.values():
            return []  # its victims are being stopped already
        reclaim = self._reclaimable(t.spec)
        cands = []
        for tid in self.running:
            r = self.records.active.get(tid)
            if r is None or r.state is not S.RUNNING or tid in self.preempting:
                continue
            if r.spec.member is not None:  # a gang member: never stopped alone
                continue
            started = r.started_at if r.started_at is not None else wall
            # work a group borrowed above its min yields to a group below its min,
            # whatever its class (Koordinator's reclaim); else the class decides
            prio = RECLAIMED if r.spec.group in reclaim else r.spec.priority
            # never eligible (choose_victims' rule), so never built: a full node of
            # the waiter's peers is the common case, asked at every arrival (issue 23)
            if prio + sp.preempt_min_gap > t.spec.priority:
                continue
            cands.append(pre.Running(tid, prio, started, wall - started, ONE_SLOT))
        if not cands:
            return []
        # a victim still stopping holds its slot (it was freed for another waiter)
        free = fair.Resources(slots=float(max(self.slots - len(self.running), 0)))
        victims = pre.choose_victims(cands, ONE_SLOT, free, t.spec.priority, sp.preempt_min_gap)
        if not victims:
            return []
        out: list[ev.Instruction] = []
        for v in victims:
            vt = self.records.active.get(v)
            assert vt is not None
            if vt.spec.group in reclaim:
                cause = (
                    f"preempted by {waiting} (group {t.spec.group} reclaims its quota-min"
                    f" from group {vt.spec.group}, above its own)"
                )
            else:
                cause = (
                    f"preempted by {waiting} (priority {sp.name_of(t.spec.priority)}"
                    f" > {sp.name_of(vt.spec.priority)})"
                )
            self.preempting[v] = waiting
            self.preempted_at.append(wall)
            self.counters["preempted"] += 1
            out += [
                ev.Preempt(v, cause, vt.spec.migrate is m.MigrateMode.CHECKPOINT),
                self.explain(v, {"outcome": "preempted", "summary": cause, "by": waiting}, wall),
                ev.log("info", "task.preempted", task=v, by=waiting),
            ]
        return out

    def group_running(self) -> dict[str, int]:
        """Slots each group runs cluster-wide: gossiped, this node's own fresh."""
        out: dict[str, int] = {}
        for n, e in self.view.items():
            if n != self.node:
                for g, _, r in e.report.groups:
                    out[g] = out.get(g, 0) + r
        for tid in self.running:
            t = self.records.active.get(tid)
            if t is not None and t.spec.group:
                out[t.spec.group] = out.get(t.spec.group, 0) + 1
        return out

    def _reclaimable(self, spec: m.TaskSpec) -> frozenset[str]:
        """The groups whose running work `spec` may preempt to reach its group's
        quota-min: those running above their own min (none if its group is at its min)."""
        g = self.sharing.group(spec.group) if spec.group else None
        if g is None or g.quota_min <= 0:
            return frozenset()
        running = self.group_running()
        if running.get(g.name, 0) >= g.quota_min:
            return frozenset()

        def quota_min(name: str) -> float:
            other = self.sharing.group(name)
            return other.quota_min if other is not None else 0.0  # no table: min 0

        return frozenset(n for n, r in running.items() if n != g.name and r > quota_min(n))

    def capped_changed(self, spec: m.TaskSpec) -> None:
        """A task of a capped group started or ended here: the next report says so at
        once (its share fields are otherwise cached for a quarter second)."""
        g = self.sharing.group(spec.group) if spec.group else None
        if g is not None and g.quota_max is not None:
            self.share_cache = None

    def preempt_ended(self, tid: m.TaskId) -> None:
        self.preempting.pop(tid, None)

    def share_rows(self, qv: QueueView) -> list[dict[str, Any]]:
        """Each principal's usage and weighted dominant share, lowest share first (the
        order in which fair share favours them; groups ranked among groups)."""
        weights = self.sharing.weights()
        rows: list[dict[str, Any]] = []
        for p, used in qv.usage.items():
            share = time_share(used, qv.capacity, self.sharing.half_life)
            rows.append(
                {
                    "principal": p,
                    "kind": "group" if p.startswith("group:") else "user",
                    "slot_seconds": round(used.slots, 1),
                    "cpu_seconds": round(used.cpu, 1),
                    "gpu_seconds": round(used.gpu, 1),
                    "dominant_share": share,
                    "weight": weights.get(p, 1.0),
                }
            )
        rows.sort(key=lambda r: (r["kind"], r["dominant_share"] / r["weight"], r["principal"]))
        rank = {"user": 0, "group": 0}
        for r in rows:
            kind = str(r["kind"])
            rank[kind] += 1
            r["rank"] = rank[kind]
        return rows

    def view_age(self, now: float) -> float:
        """The oldest peer report behind the usage view (seconds; 0 with no peers)."""
        ages = [now - e.received_at for n, e in self.view.items() if n != self.node]
        return max(ages, default=0.0)

    def queue_explain(self, tid: m.TaskId, qv: QueueView) -> dict[str, Any] | None:
        """Where a queued task stands here: its place in the order, its class, its
        user's dominant share and how old the usage behind it may be."""
        t = self.records.active.get(tid)
        if t is None or t.state is not S.QUEUED:
            return None
        ordered = self.run_order(qv)
        if tid not in ordered:
            return None
        p = user_principal(t.spec)
        ahead = ordered.index(tid)
        higher = 0
        for o in ordered[:ahead]:
            x = self.records.active.get(o)
            if x is not None and x.spec.priority > t.spec.priority:
                higher += 1
        return {
            "position": ahead + 1,
            "queued": len(ordered),
            "ahead_higher_priority": higher,
            "priority": self.sharing.name_of(t.spec.priority),
            "group": t.spec.group,
            "user": p,
            "user_dominant_share": time_share(
                qv.usage.get(p, fair.NOTHING), qv.capacity, self.sharing.half_life
            ),
            "quota": self.quota_refusal(t.spec, qv.at),
        }
