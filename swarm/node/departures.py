"""The source's side of migrations (pure): which running task to move and where
(policy.migration's cost rule and limits over a sample of peers), the decisions for
`swarm explain`, and the bookkeeping of one move's phases as it goes (moves.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from .. import model as m
from ..cluster import handoff as h
from ..cluster import migrate as mx
from ..policy import migration as pol
from ..policy.placement import parsed
from ..policy.view import PeerInfo, sample_peers
from . import events as ev
from .moves import (
    CANCEL_AT_NEXT_STEP,
    MM,
    MoveInstruction,
    MoveSettings,
    NoteDecision,
    Outgoing,
    Round,
    S,
    SendRecord,
    Start,
    StoreRecord,
)

if TYPE_CHECKING:
    from .moves import Arrival, Incoming

MIN_BW_SAMPLE = 256 << 10  # smaller transfers measure latency, not bandwidth


def explain_record(node: m.NodeId, d: pol.MigrationDecision) -> dict[str, Any]:
    """A migration decision as `swarm explain` shows it."""
    rec: dict[str, Any] = {
        "kind": "migration",
        "outcome": f"migration {d.code}: {d.reason}",
        "code": d.code,
        "from": node,
        "target": d.target,
        "gain": round(d.gain, 3),
        "cost": round(d.cost, 3),
        "margin": d.margin,
    }
    if d.figures is not None:
        rec["figures"] = {k: round(float(v), 4) for k, v in attrs.asdict(d.figures).items()}
    return rec


def candidates(
    view: Mapping[m.NodeId, PeerInfo], d: int, rng: Any, node: m.NodeId, now: float
) -> list[pol.Candidate]:
    """Targets to weigh: the same uniform sample of peers placement draws from (at
    least two), draining peers left out."""

    def verdict(peer: m.NodeId, entry: PeerInfo) -> str | None:
        r = entry.report
        return None if r.shares - r.reserved_shares > 0 else "draining"

    sample = sample_peers(view, max(2, d), rng, verdict, skip=node)
    return [
        pol.Candidate(n, view[n].report, max(0.0, now - view[n].received_at)) for n in sample.chosen
    ]


class Departures:
    """The source's half of Moves (movebook.py), which holds the fields below."""

    node: m.NodeId
    s: MoveSettings
    bandwidth: pol.BandwidthEstimator
    pauses: pol.DurationEstimator
    bucket: pol.TokenBucket
    outgoing: dict[m.TaskId, Outgoing]
    incoming: dict[m.TaskId, Incoming]
    arrivals: dict[m.TaskId, Arrival]
    started: dict[m.TaskId, float]
    last: dict[m.TaskId, tuple[str, str | None]]
    retained: dict[m.TaskId, tuple[str, float]]
    counters: Counter[str]

    if TYPE_CHECKING:  # provided by Moves

        def new_mid(self) -> str: ...
        def forget(self, tid: m.TaskId) -> list[MoveInstruction]: ...
        def record(
            self, spec: m.TaskSpec, mid: str, fields: dict[str, Any], wall: float
        ) -> StoreRecord | SendRecord: ...

    def eligible(self, t: m.Task | None, guest: h.GuestSide) -> bool:
        """Is this running task a candidate for a move from here?"""
        if t is None or t.state is not S.RUNNING or t.spec.is_global:
            return False
        if t.spec.migrate is MM.NEVER or t.id in self.outgoing:
            return False
        return t.spec.home in ("", self.node) or guest.may_run(t.id)

    def running_task(self, t: m.Task, now: float, wall: float, state_bytes: int) -> pol.RunningTask:
        """What the policy weighs of a running task (its state's size measured)."""
        mode = t.spec.migrate
        arr = self.arrivals.get(t.id)
        here = max(0.0, now - self.started.get(t.id, now))
        age = here if mode is MM.RESTART else here + (arr.age if arr else 0.0)
        last = None if arr is None else now - max(0.0, wall - arr.arrived_at)
        return pol.RunningTask(
            task_id=t.id,
            mode=mode,
            age=age,
            expected_runtime=t.spec.expected_runtime,
            state_bytes=state_bytes,
            pause=self.pauses.estimate(mode.value, self.s.default_pause),
            warmup=0.0,
            moves=arr.moves if arr else 0,
            last_move_at=last,
            home=t.spec.home or self.node,
            gpu=t.spec.gpu,
            constraints=parsed(t.spec.constraints),
        )

    def plan(
        self,
        running: list[tuple[m.Task, pol.RunningTask]],
        local: m.LoadReport,
        cands: list[pol.Candidate],
        suspects: frozenset[m.NodeId],
        now: float,
    ) -> Round:
        """One decision round (policy.migration's cost rule and limits): every
        decision counted and explained, the moves to start now booked as outgoing."""
        here = len(self.outgoing) + len(self.incoming)
        plan = pol.plan_migrations(
            [rt for _, rt in running],
            local,
            cands,
            now=now,
            bucket=self.bucket,
            config=self.s.policy,
            bandwidth=self.bandwidth,
            in_flight=pol.InFlight(
                here=here, cluster=here, by_node=Counter(o.target for o in self.outgoing.values())
            ),
            suspect=suspects,
        )
        self.bucket = plan.bucket
        by_id = {t.id: (t, rt) for t, rt in running}
        instrs: list[MoveInstruction] = []
        for d in plan.decisions:
            self.counters["decision:" + d.code] += 1
            instrs += self.note(d.task_id, d)
        starts = []
        for d in plan.start:
            t, rt = by_id[d.task_id]
            assert d.target is not None
            out = Outgoing(self.new_mid(), d.target, rt.mode, now)
            self.outgoing[t.id] = out
            starts.append(Start(t, rt, d, out))
        return Round(list(plan.decisions), instrs, starts)

    def note(self, tid: m.TaskId, d: pol.MigrationDecision) -> list[MoveInstruction]:
        """A decision for `swarm explain`, when it differs from the task's last one."""
        key = (d.code, d.target)
        if self.last.get(tid) == key:
            return []
        self.last[tid] = key
        out: list[MoveInstruction] = [NoteDecision(tid, explain_record(self.node, d))]
        if d.would_migrate:
            out.append(
                _log("info", "migration.decision", task=tid, code=d.code, to=d.target, why=d.reason)
            )
        return out

    # ------------------------------------------------------------- one move (source)

    def begin(self, s: Start, wall: float) -> tuple[dict[str, Any], list[MoveInstruction]]:
        """The move's record as it starts, and its log line."""
        out, rt, d = s.out, s.running, s.decision
        rec: dict[str, Any] = {
            "from": self.node,
            "to": out.target,
            "mode": out.mode.value,
            "reason": d.reason,
            "gain": round(d.gain, 3),
            "cost": round(d.cost, 3),
            "state_bytes": rt.state_bytes,
            "started_at": wall,
        }
        self.counters["started"] += 1
        log = _log(
            "info", "migration.start", task=s.task.id, to=out.target, mode=out.mode.value,
            mid=out.mid,
        )  # fmt: skip
        return rec, [log]

    def prepare_message(self, s: Start, local: m.LoadReport) -> mx.Prepare:
        bw = self.bandwidth.estimate(s.out.target, self.s.policy.default_bandwidth)
        return mx.Prepare(s.out.mid, s.task.spec, s.running, local, bw)

    def transferred(self, out: Outgoing, rec: dict[str, Any], nbytes: int, secs: float) -> None:
        """The target holds all of the state: the figures, and a bandwidth sample."""
        rec.update(bytes=nbytes, transfer_s=round(secs, 4))
        if secs > 0:
            rec["bytes_per_s"] = round(nbytes / secs, 1)
        if nbytes >= MIN_BW_SAMPLE:
            self.bandwidth = self.bandwidth.observe(out.target, nbytes, secs)
        self.counters["bytes_sent"] += nbytes

    def moved(
        self, tid: m.TaskId, out: Outgoing, rec: dict[str, Any], handover: float, now: float
    ) -> list[MoveInstruction]:
        """The home committed the task at the target: keep the state until it started."""
        rec["handover_s"] = round(handover, 4)
        self.pauses = self.pauses.observe(out.mode.value, handover)
        instrs = self.forget(tid)
        self.retained[tid] = (out.mid, now)
        return instrs

    def finish(
        self, s: Start, rec: dict[str, Any], outcome: str, detail: str, wall: float
    ) -> list[MoveInstruction]:
        """The move is over, whatever its outcome: its record goes to the task's home."""
        self.outgoing.pop(s.task.id, None)
        rec.update(outcome=outcome, detail=detail, ended_at=wall)
        self.counters["outcome:" + outcome] += 1
        level = "info" if outcome == "moved" else "warning"
        fields = {"task": s.task.id, "to": s.out.target, "detail": detail, "mid": s.out.mid}
        return [
            _log(level, "migration." + outcome, **fields),
            self.record(s.task.spec, s.out.mid, rec, wall),
        ]

    def cancel(self, tid: m.TaskId, cause: str, offering: bool) -> str:
        """How to cancel a task stopped for a migration: "next-step" (the source does
        it at its next step), "offer" (settled when the home's offer is decided),
        "now", or "nothing" (the move is past its last step; the home decides)."""
        out = self.outgoing.get(tid)
        if out is not None and out.step in CANCEL_AT_NEXT_STEP:
            out.cancel = cause
            return "next-step"
        if offering:
            return "offer"
        return "now" if out is None else "nothing"


def _log(level: str, event: str, **fields: Any) -> ev.Log:
    return ev.log(level, event, **fields)
