"""Where a new task goes: power of d choices over the stale view, with an explanation.

Why sampling: peers' load is gossip and has an age. Sending every task to the least
loaded node of a stale view makes all placers pick the same node until its next
report (herding, Mitzenmacher 2001). Sampling d peers uniformly and taking the better
one gives almost all the benefit of full information (max load log log n / log d
instead of log n / log log n) and degrades gracefully with staleness.

Flow at the origin: `place` -> send to `target` -> target runs `admit` on its fresh
state -> on refusal `PlacementRetry.on_refusal` says place again now (excluding the
refusers) or keep the task queued locally until `not_before` (exponential backoff).
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from swarm.model import (
    DEFAULT_PRIORITY,
    GpuDeviceFree,
    GpuRequest,
    LoadReport,
    NodeId,
    TaskId,
    TaskSpec,
)

from . import constraints as cons
from .datakeys import may_hold
from .gpu import fits_summary, largest_free_slice
from .load import UNIT, Capacity, FlexState, Usage, flex_refusal, free_shares, projected_load
from .load import report_load as _report_load
from .shares import ShareLedger
from .view import PeerInfo, Sample, Verdict, sample_peers

# ------------------------------------------------------------------- filtering


@attrs.frozen
class Needs:
    """The part of a task that decides where it may go (also carried in probes)."""

    weight: float = 1.0
    reserve_shares: int = 0
    is_global: bool = False
    cpu: float | None = None
    mem: int | None = None
    gpu: GpuRequest | None = None
    priority: int = DEFAULT_PRIORITY
    constraints: tuple[cons.Constraint, ...] = ()  # hard: a node must satisfy all
    prefer: tuple[cons.Constraint, ...] = ()  # soft: scored (PREFER_TASKS)
    data: tuple[str, ...] = ()  # data keys the task reads (delay scheduling)

    @classmethod
    def of(cls, spec: TaskSpec) -> Needs:
        return cls(
            weight=spec.weight,
            reserve_shares=spec.reserve_shares,
            is_global=spec.is_global,
            cpu=spec.cpu,
            mem=spec.mem,
            gpu=spec.gpu,
            priority=spec.priority,
            constraints=parsed(spec.constraints),
            prefer=parsed(spec.prefer),
            data=spec.data,
        )


@functools.lru_cache(maxsize=4096)
def parsed(texts: tuple[str, ...]) -> tuple[cons.Constraint, ...]:
    """Constraints parsed once per distinct text (the codec and the submit checks
    already refused any that does not parse; one that slipped through never matches)."""
    out = []
    for t in texts:
        try:
            out.append(cons.parse_constraint(t))
        except cons.ConstraintError:
            out.append(cons.Constraint("", "exists", (), t))  # no node has label ""
    return tuple(out)


@functools.lru_cache(maxsize=8192)
def label_map(labels: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """A report's labels as a mapping (reports are shared and immutable: cached)."""
    return dict(labels)


def holds_data(r: LoadReport, needs: Needs) -> bool:
    """Does the node (by its report's Bloom digest) hold every data key of the task?"""
    return all(may_hold(r.data, k) for k in needs.data)


def free_slot(r: LoadReport) -> bool:
    """Would a task start at once there (by its report), rather than queue?"""
    return r.running + r.queued < r.slots


def data_first(needs: Needs, waited: float, delay: float) -> bool:
    """Delay scheduling (Zaharia et al., EuroSys 2010): while a task that reads data
    has waited less than `delay` seconds, it may only go to a node holding its data."""
    return bool(needs.data) and waited < delay


def hold_for_data(needs: Needs, waited: float, delay: float, target: LoadReport | None) -> bool:
    """Should the home keep the task back rather than send it to `target` (the chosen
    node's report; None when no holder was eligible)? Yes while `data_first` holds and
    no holder with a free slot was found: a short wait for a local slot beats reading
    the data over the network, and after `delay` the task goes anywhere."""
    return data_first(needs, waited, delay) and (target is None or not free_slot(target))


@attrs.frozen
class Refusal:
    """Why a node cannot take a task. `code` groups reasons in summaries."""

    code: str  # constraint | drained | full | reservation | cpu | mem | gpu | stale | refused
    text: str


def refusal(r: LoadReport, needs: Needs) -> Refusal | None:
    """None when report `r` says the node can take `needs`, else why.

    Global tasks are eligible everywhere. Otherwise: not draining, some unreserved
    share left and the reservation fits it (never oversubscribe), and declared
    CPU / memory / GPU fit what the node reported. CPU and memory use the Flex rule at
    its most lenient (P = 1) on reported usage, so a node that would refuse even then
    is not asked.
    """
    if needs.is_global:
        return None
    if needs.constraints:
        why = cons.unmet(needs.constraints, label_map(r.labels))
        if why is not None:
            return Refusal("constraint", why)
    if r.shares <= 0:
        return Refusal("drained", "drained (shares 0)")
    free = free_shares(r)
    if free <= 0:
        return Refusal("full", f"no unreserved shares ({r.reserved_shares} of {r.shares} held)")
    if needs.reserve_shares > free:
        return Refusal("reservation", f"reservation of {needs.reserve_shares} shares > {free} free")
    if needs.cpu is not None and needs.cpu > 0 and r.cpus > 0:
        if needs.cpu > r.cpus:
            return Refusal("cpu", f"cpu request {needs.cpu:g} > {r.cpus:g} cores")
        idle = r.cpus * (1.0 - min(max(r.cpu_util, 0.0), 1.0))
        if needs.cpu > idle:
            return Refusal("cpu", f"cpu request {needs.cpu:g} > {idle:.2f} idle cores")
    if needs.mem is not None and needs.mem > 0 and r.mem_total > 0:
        if needs.mem > r.mem_total:
            return Refusal("mem", f"memory request {needs.mem} > total {r.mem_total} bytes")
        if needs.mem > r.mem_available:
            return Refusal("mem", f"memory request {needs.mem} > available {r.mem_available} bytes")
    if needs.gpu is not None and not fits_summary(needs.gpu, r.gpus):
        core, mem = largest_free_slice(r.gpus)
        return Refusal(
            "gpu",
            f"gpu request core {needs.gpu.core}% does not fit"
            f" (largest free slice {core}%, {mem} bytes)",
        )
    return None


PREFER_TASKS = 2.0
"""A node that misses all of a task's soft preferences scores as if it ran this many
more weight-1 tasks: a preferred node wins unless it is busier by about two tasks per
slot (shares are 1024 a slot)."""
DATA_TASKS = 0.5
"""What a node without a data task's data adds, once delay scheduling has given up
waiting for a holder (before, only holders are candidates): a holder wins ties and
near ties, but a free slot elsewhere beats a queue at a holder, as in Zaharia's
delay scheduling."""


def needs_projected(r: LoadReport, needs: Needs) -> float:
    """The node's load with the task, not counting work the task would preempt there
    (weight of lower priorities, from the report's bands): urgent work is not repelled
    by a node full of preemptible work. Missed soft preferences and missing data add
    up to PREFER_TASKS and DATA_TASKS tasks' worth."""
    extra = 0.0
    if needs.prefer:
        missed = len(needs.prefer) - cons.matched(needs.prefer, label_map(r.labels))
        extra += PREFER_TASKS * missed / len(needs.prefer)
    if needs.data and not holds_data(r, needs):
        extra += DATA_TASKS
    return (
        projected_load(
            r.weight_sum - preemptible_weight(r, needs.priority),
            r.shares,
            r.reserved_shares,
            needs.weight,
            needs.reserve_shares,
        )
        + extra * UNIT
    )


def preemptible_weight(r: LoadReport, priority: int) -> float:
    """Weight queued or running at `r`'s node at a priority below `priority`."""
    if not r.bands or r.bands[0][0] >= priority:
        return 0.0
    return sum(w for p, w in r.bands if p < priority)


# -------------------------------------------------------------------- explain


@attrs.frozen
class Candidate:
    """One node the placer looked at: its numbers, and why it was or was not chosen."""

    node: NodeId
    local: bool
    load: float  # load index now, from its report
    age: float  # seconds since the report was received (0 for the local node)
    score: float | None  # projected load with the task; None when not scored
    why_not: str = ""  # "" when scored; else the filter reason or "eligible, not sampled"

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "local": self.local,
            "load": _num(self.load),
            "age": round(self.age, 3),
            "score": None if self.score is None else _num(self.score),
            "why_not": self.why_not,
        }


def _num(x: float) -> float | str:
    return "inf" if math.isinf(x) else x


@attrs.frozen
class Placement:
    """The decision: a target (maybe the local node) or none, and the explanation."""

    task_id: TaskId
    target: NodeId | None
    local: bool  # the target is the local node
    # Candidate values, or raw (node, local, report, age, score, why_not) rows that
    # `candidates` turns into them on demand (only explain reads them)
    _candidates: tuple[Any, ...] = attrs.field(eq=False, repr=False)
    # the one-line summary, or a function that writes it: formatting every decision's
    # numbers costs more than deciding, and the simulator never reads them
    _summary: str | Callable[[], str] = attrs.field(eq=False, repr=False)
    examined: int  # peers examined (filtered or scored), local node excluded
    view_size: int
    scanned: bool  # True: every peer was examined; False: rejection sampling

    @property
    def ok(self) -> bool:
        return self.target is not None

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        return tuple(
            c
            if isinstance(c, Candidate)
            else Candidate(c[0], c[1], _report_load(c[2]), c[3], c[4], c[5])
            for c in self._candidates
        )

    @property
    def summary(self) -> str:
        s = self._summary
        return s if isinstance(s, str) else s()

    def explain(self) -> dict[str, Any]:
        """A JSON-ready record for `swarm explain` and logs."""
        return {
            "task": self.task_id,
            "target": self.target,
            "local": self.local,
            "summary": self.summary,
            "examined": self.examined,
            "view_size": self.view_size,
            "scanned": self.scanned,
            "candidates": [c.to_dict() for c in self.candidates],
        }


# ------------------------------------------------------------------ placement


@attrs.frozen
class Where:
    """What the task's home knows beyond the task itself, for soft placement: where its
    job already runs (spread, anti-affinity) and whether it may only go to nodes that
    hold its data for now (delay scheduling). Computed by node/placing.py."""

    spread_key: str = ""  # the label to spread the job over
    spread_to: frozenset[str] = frozenset()  # its values with the fewest of the job
    full: frozenset[NodeId] = frozenset()  # nodes holding the job's anti-affinity limit
    holders_only: bool = False  # only nodes whose digest holds the task's data
    # nodes where the task's other copy runs (an --idempotent task and its backup:
    # node/backups.py); they are in `exclude` too, this names why in the explain
    other_copy: frozenset[NodeId] = frozenset()

    def excluded(self, node: NodeId) -> str:
        """Why an excluded node was not a candidate."""
        return OTHER_COPY if node in self.other_copy else "refused earlier"

    def refusal(self, node: NodeId, r: LoadReport, needs: Needs) -> str | None:
        if node in self.full:
            return "anti-affinity: holds its limit of the job's tasks"
        if self.holders_only and not holds_data(r, needs):
            return "does not hold the task's data (delay scheduling)"
        return None

    def preferred(self, r: LoadReport) -> bool:
        """Is the node in the first round of a spread (a least-used value)?"""
        return not self.spread_key or label_map(r.labels).get(self.spread_key) in self.spread_to


NOWHERE = Where()
OTHER_COPY = "runs this task's other copy (a backup never runs beside it)"


def place(
    spec: TaskSpec,
    local: LoadReport,
    view: Mapping[NodeId, PeerInfo],
    rng: random.Random,
    now: float,
    *,
    d: int = 2,
    exclude: frozenset[NodeId] | set[NodeId] = frozenset(),
    max_age: float | None = None,
    scan_below: int = 64,
    max_attempts: int | None = None,
    where: Where = NOWHERE,
) -> Placement:
    """Power-of-d placement of `spec`.

    Samples `d` eligible peers uniformly from `view` (the local node's entry in it, if
    any, is ignored), adds the local node (with its fresh `local` report) when it is
    eligible and not excluded, and picks the lowest projected load after adding the
    task; ties are broken with `rng`. Peers in `exclude` (they refused already) and
    reports older than `max_age` seconds are filtered. Views larger than `scan_below`
    are rejection-sampled with at most `max_attempts` draws (see view.sample_peers), so
    the cost is O(d), not O(n). Never returns the minimum over the whole view.

    Hard constraints and `where`'s rules filter like any refusal; when they leave fewer
    than `d` of a large view's draws, the sample widens to a scan of the view (Tarcil:
    sampling among few eligible nodes must look further). Soft preferences and data
    add `d` more draws among the nodes that satisfy them; a spread samples among its
    least-used values first and falls back to all eligible nodes.
    """
    needs = Needs.of(spec)
    me = local.node

    def verdict(node: NodeId, entry: PeerInfo) -> str | None:
        if node in exclude:
            return where.excluded(node)
        if max_age is not None:
            age = now - entry.received_at
            if age > max_age:
                return f"report too old (age {age:.1f} s > {max_age:g} s)"
        why = refusal(entry.report, needs) or where.refusal(node, entry.report, needs)
        return None if why is None else (why if isinstance(why, str) else why.text)

    def sample_with(accept: Verdict) -> Sample:
        smp = sample_peers(
            view, d, rng, accept, skip=me, scan_below=scan_below, max_attempts=max_attempts
        )
        if (
            len(smp.chosen) < d
            and not smp.scanned
            and (needs.constraints or needs.prefer or needs.data or where != NOWHERE)
        ):
            smp = sample_peers(view, d, rng, accept, skip=me, scan_below=len(view) + 1)
        return smp

    local_why: str | None
    if me in exclude:
        local_why = where.excluded(me)
    else:
        lr = refusal(local, needs)
        local_why = lr.text if lr is not None else where.refusal(me, local, needs)

    def spread_verdict(node: NodeId, entry: PeerInfo) -> str | None:
        return verdict(node, entry) or (
            None if where.preferred(entry.report) else f"spread: {where.spread_key} has more"
        )

    accept: Verdict = verdict
    if where.spread_key:
        first = sample_with(spread_verdict)
        local_first = local_why is None and where.preferred(local)
        if first.chosen or local_first:
            accept = spread_verdict  # the spread's first round holds for every draw
            if not local_first and local_why is None:
                local_why = f"spread: {where.spread_key} has more"
        else:  # no eligible node has a least-used value: any eligible node
            first = sample_with(verdict)
        sample = first
    else:
        sample = sample_with(verdict)
    if needs.prefer or (needs.data and not where.holders_only):  # else: all hold it
        extra = sample_with(
            lambda n, e: (
                accept(n, e) or (None if _satisfies_soft(e.report, needs) else "not preferred")
            )
        )
        sample = _union(sample, extra)

    candidates: list[tuple[NodeId, bool, LoadReport, float, float | None, str]] = []
    scored: list[tuple[float, NodeId]] = []

    local_score = None if local_why is not None else needs_projected(local, needs)
    candidates.append((me, True, local, 0.0, local_score, local_why or ""))
    if local_score is not None:
        scored.append((local_score, me))

    for node in sample.chosen:
        entry = view[node]
        score = needs_projected(entry.report, needs)
        candidates.append((node, False, entry.report, now - entry.received_at, score, ""))
        scored.append((score, node))
    for node, why in sample.rejected:
        entry = view[node]
        candidates.append((node, False, entry.report, now - entry.received_at, None, why))
    for node in sample.unchosen:
        entry = view[node]
        age = now - entry.received_at
        candidates.append((node, False, entry.report, age, None, "eligible, not sampled"))

    def result(target: NodeId | None, summary: str | Callable[[], str]) -> Placement:
        return Placement(
            task_id=spec.id,
            target=target,
            local=target == me,
            candidates=tuple(candidates),
            summary=summary,
            examined=sample.examined,
            view_size=len(view) - (1 if me in view else 0),
            scanned=sample.scanned,
        )

    if not scored:
        return result(None, _no_target_summary(spec, needs, local, local_why, view, sample))
    best = min(s for s, _ in scored)
    ties = [n for s, n in scored if s == best]
    target = ties[0] if len(ties) == 1 else rng.choice(ties)

    def summary() -> str:
        others = ", ".join(f"{n} {_fmt(s)}" for s, n in scored if n != target)
        text = f"chose {target}{' (local)' if target == me else ''}: projected load {_fmt(best)}"
        if others:
            text += f" vs {others}"
        if len(ties) > 1:
            text += f" (tie among {len(ties)}, broken at random)"
        return text

    return result(target, summary)


def _satisfies_soft(r: LoadReport, needs: Needs) -> bool:
    labels = label_map(r.labels)
    return all(p.unmet(labels) is None for p in needs.prefer) and holds_data(r, needs)


def _union(a: Sample, b: Sample) -> Sample:
    """Both samples' draws, each node once (a node chosen in either is chosen)."""
    chosen = tuple(dict.fromkeys((*a.chosen, *b.chosen)))
    picked = set(chosen)
    rejected = tuple(
        (n, w) for n, w in dict(reversed((*a.rejected, *b.rejected))).items() if n not in picked
    )
    unchosen = tuple(n for n in dict.fromkeys((*a.unchosen, *b.unchosen)) if n not in picked)
    return Sample(
        chosen,
        rejected,
        unchosen,
        scanned=a.scanned and b.scanned,
        examined=len(picked) + len(rejected) + len(unchosen),
    )


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.6g}"


def _no_target_summary(
    spec: TaskSpec,
    needs: Needs,
    local: LoadReport,
    local_why: str | None,
    view: Mapping[NodeId, PeerInfo],
    sample: Sample,
) -> str:
    """'no eligible node' plus the reasons, grouped, with the closest misses named."""
    seen: list[tuple[NodeId, LoadReport, str]] = [(local.node, local, local_why or "")]
    seen += [(n, view[n].report, why) for n, why in sample.rejected]
    parts: list[str] = []
    reserving = needs.reserve_shares > 0
    if reserving:
        fit = [(free_shares(r), n) for n, r, _ in seen if r.shares > 0]
        if fit:
            free, node = max(fit)
            parts.append(
                f"reservation of {needs.reserve_shares} shares fits nowhere:"
                f" largest free is {max(free, 0)} on {node}"
            )
    if needs.mem:
        mems = [(r.mem_available, n) for n, r, _ in seen if r.mem_total > 0]
        if mems:
            avail, node = max(mems)
            parts.append(f"memory {needs.mem} fits nowhere: most available is {avail} on {node}")
    counts: dict[str, list[NodeId]] = {}
    for n, _, why in seen:
        key = why.split(" (")[0] if why else "?"
        if reserving and key.startswith("reservation"):
            continue
        counts.setdefault(key, []).append(n)
    for key, nodes in sorted(counts.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        names = ", ".join(nodes[:3]) + (", ..." if len(nodes) > 3 else "")
        parts.append(f"{len(nodes)} {key} ({names})")
    how = (
        f"all {len(view)} peers examined"
        if sample.scanned
        else f"{sample.examined} of {len(view)} peers sampled"
    )
    return f"no eligible node for {spec.id} ({how}): " + "; ".join(parts)


# ------------------------------------------------------------------ admission


@attrs.frozen
class Admission:
    ok: bool
    reason: str


def admit(
    spec: TaskSpec,
    local_state: ShareLedger,
    flex: FlexState,
    usage: Usage,
    capacity: Capacity,
    *,
    gpus: Sequence[GpuDeviceFree] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Admission:
    """The target's re-check on fresh state before it accepts a placed or pushed task.

    Idempotent: a task already in the ledger is accepted again (handoffs retry).
    Global tasks are always accepted. Otherwise the share rules (drain, reservation
    fits unconsumed shares), the GPU summary when `gpus` is given, and Flex
    ``P * usage + request <= capacity`` for CPU and memory. Hard constraints are
    tested on the node's own `labels` (fresh: the placer read gossiped ones).
    """
    if spec.id in local_state:
        return Admission(True, "already here")
    if spec.is_global:
        return Admission(True, "global task")
    if spec.constraints and labels is not None:
        unmet = cons.unmet(parsed(spec.constraints), labels)
        if unmet is not None:
            return Admission(False, unmet)
    why = local_state.refuse_new(spec)
    if why is not None:
        return Admission(False, why)
    if spec.gpu is not None and gpus is not None and not fits_summary(spec.gpu, gpus):
        core, mem = largest_free_slice(gpus)
        return Admission(
            False,
            f"gpu request core {spec.gpu.core}% does not fit"
            f" (largest free slice {core}%, {mem} bytes)",
        )
    # Flex guards only what the task declares: a node busy with undeclared work (a
    # CPU-bound batch node at 100%) keeps taking undeclared tasks, whose effect is
    # governed by weights and shares instead. Capacity 0 = "not checked".
    declared = Capacity(cpu=capacity.cpu if spec.cpu else 0.0, mem=capacity.mem if spec.mem else 0)
    flex_why = flex_refusal(flex.p, usage, declared, spec.cpu or 0.0, spec.mem or 0)
    if flex_why is not None:
        return Admission(False, flex_why)
    return Admission(True, f"admitted (P={flex.p:.2f})")


# ---------------------------------------------------------------------- retry


@attrs.frozen
class RetryPolicy:
    """Bounded retries at the origin, then exponential backoff with jitter."""

    max_tries: int = 3  # refusals per round before backing off
    base: float = 1.0  # seconds, first backoff
    factor: float = 2.0
    max_backoff: float = 60.0
    jitter: float = 0.2  # +- this fraction, drawn from the injected rng

    def backoff(self, rounds: int, rng: random.Random) -> float:
        raw = min(self.max_backoff, self.base * self.factor ** min(rounds, 64))
        return raw * (1.0 + self.jitter * (2.0 * rng.random() - 1.0))


@attrs.frozen
class PlacementRetry:
    """Origin-side state of one task being placed. Immutable; each event returns a new one.

    `exclude` goes into the next `place` call. When `ready(now)` is False, the task
    stays queued locally (it may start here meanwhile) until `not_before`.
    """

    refused: frozenset[NodeId] = frozenset()
    tries: int = 0
    rounds: int = 0  # rounds that ended in a backoff
    not_before: float = 0.0

    @property
    def exclude(self) -> frozenset[NodeId]:
        return self.refused

    def ready(self, now: float) -> bool:
        return now >= self.not_before

    def on_refusal(
        self, node: NodeId, now: float, policy: RetryPolicy, rng: random.Random
    ) -> PlacementRetry:
        """`node` refused (or did not answer): place again now without it, or back off
        once `max_tries` refusals have piled up in this round."""
        tries = self.tries + 1
        if tries >= policy.max_tries:
            return self.on_no_target(now, policy, rng)
        return attrs.evolve(self, refused=self.refused | {node}, tries=tries, not_before=now)

    def on_no_target(self, now: float, policy: RetryPolicy, rng: random.Random) -> PlacementRetry:
        """No eligible node (or too many refusals): keep it local, try again later with a
        clean slate (refusers may have capacity by then)."""
        return PlacementRetry(
            refused=frozenset(),
            tries=0,
            rounds=self.rounds + 1,
            not_before=now + policy.backoff(self.rounds, rng),
        )
