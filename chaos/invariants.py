"""The invariants a chaos run must keep, checked against the agents' own evidence.

Pure functions over decoded journals (chaos.journals), the agents' logs and CLI
answers; the only harness bookkeeping they take is which task ids were
*acknowledged* (a submit returned an id) and at which node. Each violation names its
invariant, so a failing run says what broke, not just that something did.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from swarm import model as m
from swarm.cluster.actor import bound_double_action as bound_double_action
from swarm.node.backups import won_by
from swarm.node.doubt import DOUBT_MIN
from swarm.policy.constraints import Constraint, ConstraintError, parse_constraints, unmet

from .journals import JournalData, ScaleEvent, SharesEvent, TransitionEvent

ACKED = "acked-task-terminal"
ONE_RESULT = "one-recorded-result"
EXECUTED = "result-backed-by-execution"
DRAIN = "no-start-while-drained"
RESERVE = "reservation-not-oversubscribed"
MEMBERSHIP = "membership-converged"
NO_CRASH = "no-crash-or-traceback"
INTEGRITY = "journal-integrity"

ENCRYPTED = "traffic-encrypted"  # checked only in scenarios that run with a cluster key

# checked only in the priority scenario (its tasks leave timed marks: chaos.workload)
ONE_AT_A_TIME = "one-execution-at-a-time"
RECORDED = "execution-recorded"
RERUN = "rerun-explained"
PREEMPT_RECORDED = "preemption-in-record"
PREEMPTED = "preemption-happened"
PRIORITY = (ONE_AT_A_TIME, RECORDED, RERUN, PREEMPT_RECORDED, PREEMPTED)

# checked only in scenarios whose nodes carry labels (and whose tasks constraints)
CONSTRAINT = "constraint-respected"

# checked only in scenarios whose agents carry an elastic pool (`elastic`, issue 25)
SCALE_DOUBLE = "scale-double-action"
SCALE_IDLE = "scale-in-victim-idle"
# issue 19: a task whose home was lost for good, held by a surviving node, is taken over
# by that node and ends there (one home role per task)
ADOPTED = "lost-home-task-adopted"
LOST_WITH_HOME = "lost-with-home"  # at its lost home, with no copy elsewhere (replica.short)
SCALE = (SCALE_DOUBLE, SCALE_IDLE)

# issue 19: no two processes of an --at-most-once task ever overlap (from the task's own
# timed marks, one every 0.2 s: an overlap shorter than that can go unseen); every
# scenario's workload has such tasks
AT_MOST_ONCE = "at-most-once-never-overlaps"
# every execution (a start mark) has its start in the journal of the node that ran it
# (checked in every scenario; a kill or loss of that node just after the start, or a
# full disk there, excuses a missing one)
UNRECORDED = "no-unrecorded-execution"
# a task whose cancel answered `cancelled` ends cancelled (the `cancel` workload kind)
CANCEL = "cancel-obeyed"
# restart scenarios (agents restarted with --keep-tasks always, no other fault): a task
# runs once; a running one keeps running across its agent's restart
RESTART_RERUN = "restart-nothing-rerun"
# stop 47 (node/doubt.py): a home killed for its grace or more and restarted places none
# of its tasks a peer may have adopted for DOUBT_MIN s at least: a task adopted from it
# never starts there in that window (scenarios whose faults are kills, restarts, losses)
OLD_HOME_WAITS = "old-home-waits-after-adoption"

# a task's second execution (start marks) shows in its record as a retry point (a run
# that ended without a result: re-queued, migrating, an agent's restart)
RETRY_RECORDED = "rerun-in-record"
# `swarm status ID` answers the same final state at every surviving node (a sample)
VISIBLE = "final-state-visible-everywhere"
# a copy of a task kept at another node (node/replicas.py) learns how the task ended,
# once it ended at its home: no copy stays `queued` for a finished task (chaos shim: a
# node whose answer to the copy was lost kept one nobody updated)
COPY_RELEASED = "copy-learns-the-end"
EVERY_RUN = (AT_MOST_ONCE, UNRECORDED, CANCEL, RETRY_RECORDED, VISIBLE, COPY_RELEASED)

# issue 22 (gangs), in the gang scenario, from the members' timed marks (a beat every
# 0.2 s): no stretch in which some members of one start of a strict gang run and others
# do not outlasts the protocol's bound (cluster/gang.py `Timers.partial_bound`, 27.15 s
# at the defaults) plus one second for the marks' spacing and the processes' own starts
GANG_PARTIAL = "no-partial-strict-gang-past-its-lease"
# a gang recorded as succeeded ran every member of one start to its end
GANG_WHOLE = "succeeded-gang-ran-whole"

# issue 23, in the arrays scenario: every element of an acknowledged array ends, once,
# at the array's home (one final record per index, none missing), and the array's own
# record ends once they all have, saying how they ended: succeeded only if each did,
# its counts adding up to its elements (stop 52)
ARRAY_WHOLE = "every-array-element-once"
# a task submitted --after its parents starts (its first RUNNING in any journal) only
# after each parent's record ended, and only if the condition held
DEP_ORDER = "no-child-before-its-parents"

# issue 24, in the late-binding scenario: a task its home held (late binding) runs on
# one node, once: never at its home and at a puller both, nor at two pullers; a re-run
# only after a kill or cut involving its nodes, as for any task
LATE_ONCE = "late-held-task-ran-once"
# issue 24, in the backups scenario: a backup copy is made only of an --idempotent
# task, at most one per task, and ends; a result its original took from a backup
# ("backup B finished first") is that backup's success
BACKUP_SOUND = "backup-only-idempotent-once-and-ended"
# stop 53: a submission is copied to another node while one of its peers is up, by the
# known cluster's size (3 nodes or more: two copies), not by the live members' (before,
# a task submitted while a node was down got no copy); checked where nodes go down only
# (kill, restart, lose), never cut off or frozen (an unreachable peer is up)
COPIED = "copy-while-a-peer-is-up"
COPY_MARGIN = 10.0  # seconds around a node's down span in which it is taken as down
# stop 55: a task answered with no copy (`replicas: 0`: every peer down, or none
# answering in time) whose home was then lost for good is excused as `lost-with-home`
# only if no peer was surely up beside its home, for TOPUP_STRETCH s, between the answer
# and the loss: by then the home's next failover tick had copied it (node/topup.py)
COPIED_LATE = "copied-once-a-peer-is-back"
TOPUP_STRETCH = 5.0  # seconds: a failover tick (1 s) and the copy's round trip, with room

ALL = (ACKED, ONE_RESULT, EXECUTED, DRAIN, RESERVE, MEMBERSHIP, NO_CRASH, INTEGRITY)

TERMINAL = frozenset(s.value for s in m.TERMINAL_STATES)


@attrs.frozen
class Violation:
    invariant: str
    node: str
    detail: str

    def __str__(self) -> str:
        where = f" [{self.node}]" if self.node else ""
        return f"{self.invariant}{where}: {self.detail}"


@attrs.frozen
class Acked:
    """A submission the agent acknowledged: the input of the checks."""

    id: str
    home: str
    is_global: bool = False
    constraints: tuple[str, ...] = ()  # as submitted
    at_most_once: bool = False  # `swarm submit --at-most-once`
    gang: int = 0  # `swarm submit --gang N`: its members' marks are under ID.RANK[.RUN]
    strict: bool = True  # a gang's mode
    array: str = ""  # `swarm submit --array`: its indices (canonical)
    after: tuple[str, ...] = ()  # `swarm submit --after`, resolved ids
    at: float = 0.0  # wall time of the answer
    copies: int | None = None  # the answer's `replicas` (None: not in the answer)


@attrs.frozen
class AckOutcome:
    violations: tuple[Violation, ...]
    states: Mapping[str, int]  # final state at the home -> count ("missing", "unfinished")
    lost: tuple[str, ...]  # acknowledged, never terminal or missing from the home's journal
    with_home: tuple[str, ...] = ()  # lost with their home, no copy anywhere (LOST_WITH_HOME)


# ------------------------------------------------------------------- results


def _terminal_events(j: JournalData, tid: str) -> list[TransitionEvent]:
    """The results journaled for `tid` (a note on a finished record, as its adoption by
    another home, goes from a final state to the same one: not a result)."""
    return [e for e in j.events_of(tid) if e.dst in TERMINAL and e.src != e.dst]


def _one_record(j: JournalData, tid: str, what: str) -> tuple[str, list[Violation]]:
    """Final state of `tid` in journal `j`, and violations of ONE_RESULT / ACKED."""
    t = j.tasks.get(tid)
    if t is None:
        return "missing", [Violation(ACKED, j.node, f"{what} {tid} is not in the journal")]
    out: list[Violation] = []
    if not t.state.terminal:
        out.append(
            Violation(ACKED, j.node, f"{what} {tid} never finished: {t.state.value} on {t.node}")
        )
        return "unfinished", out
    hist = sum(1 for h in t.history if h.dst.terminal and h.src is not h.dst)
    evs = _terminal_events(j, tid)
    if hist != 1 or len(evs) != 1:
        results = ", ".join(f"{e.dst} at {e.at:.3f} ({e.cause})" for e in evs)
        out.append(
            Violation(
                ONE_RESULT,
                j.node,
                f"{what} {tid}: {hist} results in its record, {len(evs)} journaled: {results}",
            )
        )
    return t.state.value, out


def adopters(journals: Mapping[str, JournalData], tid: str, home: str) -> list[str]:
    """The nodes that took the home role of `tid` over (their record names them home)."""
    return sorted(
        n
        for n, j in journals.items()
        if n != home and (t := j.tasks.get(tid)) is not None and t.spec.home == n
    )


def authority(a: Acked, journals: Mapping[str, JournalData]) -> str:
    """Where the task's record is: its adopter if one took it over, else its home."""
    taken = adopters(journals, a.id, a.home)
    return taken[0] if taken else a.home


def _left_with_home(a: Acked, journals: Mapping[str, JournalData]) -> Violation | None:
    """A task of a home lost for good that nobody adopted: a violation if a surviving
    node held it (that node must take it over) or kept a copy of it (the home's
    `repls:` key); fine if it was at the home with no copy anywhere (accepted without
    one: no peer answered in time, or `replicas = 1`)."""
    j = journals.get(a.home)
    t = None if j is None else j.tasks.get(a.id)
    if t is None or t.state.terminal:
        return None
    held = t.node not in ("", a.home) and t.state in (m.TaskState.QUEUED, m.TaskState.RUNNING)
    if held and t.node in journals:
        detail = f"task {a.id}: its home {a.home} was lost while {t.node} held it " + (
            f"({t.state.value}), and {t.node} never took it over"
        )
        return Violation(ADOPTED, t.node, detail)
    if j is not None and a.id in j.replicated:
        detail = (
            f"task {a.id}: its home {a.home} was lost with it {t.state.value} there, "
            "and no node that kept a copy took it over"
        )
        return Violation(ADOPTED, a.home, detail)
    return None


def check_acked(
    acked: Iterable[Acked],
    journals: Mapping[str, JournalData],
    lost_nodes: frozenset[str] = frozenset(),
) -> AckOutcome:
    """Every acknowledged task reached a terminal state with exactly one recorded result:
    at its home (or the node that took its home role over) for ordinary tasks, on every
    surviving node for global tasks. A task of a home lost for good ends at the node
    that held it, or at the node that kept its copy; one still at that home with no
    copy anywhere is lost with it (`lost-with-home`), counted, not a violation."""
    violations: list[Violation] = []
    states: Counter[str] = Counter()
    lost: list[str] = []
    with_home: list[str] = []
    for a in acked:
        if not a.is_global:
            taken = adopters(journals, a.id, a.home)
            if len(taken) > 1:
                detail = f"task {a.id}: {len(taken)} nodes hold its home role: {taken}"
                violations.append(Violation(ONE_RESULT, taken[0], detail))
            if not taken and a.home in lost_nodes:
                j = journals.get(a.home)
                t = None if j is None else j.tasks.get(a.id)
                if t is not None and not t.state.terminal:
                    v = _left_with_home(a, journals)
                    if v is None:
                        states[LOST_WITH_HOME] += 1
                        with_home.append(a.id)
                        continue
                    violations.append(v)
        homes = (
            sorted(n for n in journals if n not in lost_nodes)
            if a.is_global
            else [authority(a, journals)]
        )
        what = "global task" if a.is_global else "task"
        results: dict[str, str] = {}
        for node in homes:
            j = journals.get(node)
            if j is None:
                violations.append(Violation(ACKED, node, f"{what} {a.id}: no journal of its home"))
                results[node] = "missing"
                continue
            results[node], vs = _one_record(j, a.id, what)
            violations.extend(vs)
        bad = [s for s in results.values() if s in ("missing", "unfinished")]
        final = bad[0] if bad else results.get(a.home if a.is_global else homes[0], "missing")
        states[final] += 1
        if bad:
            lost.append(a.id)
    return AckOutcome(tuple(violations), dict(states), tuple(lost), tuple(with_home))


def check_executed(
    acked: Iterable[Acked], journals: Mapping[str, JournalData], marks: Mapping[str, Sequence[str]]
) -> list[Violation]:
    """A task recorded as succeeded ran at least once (its process left a mark)."""
    out = []
    for a in acked:
        if a.is_global or a.gang or a.array:  # runs as its members / elements
            continue
        where = authority(a, journals)
        j = journals.get(where)
        t = None if j is None else j.tasks.get(a.id)
        if t is not None and t.state is m.TaskState.SUCCEEDED and not marks.get(a.id):
            bid = won_by(t)  # its result is its backup's (issue 24): the backup ran
            if bid is None or not marks.get(bid):
                out.append(Violation(EXECUTED, where, f"task {a.id} succeeded but never ran"))
    return out


def check_backups(
    journals: Mapping[str, JournalData],
) -> tuple[list[Violation], Counter[str]]:
    """Issue 24: BACKUP_SOUND over every home's journal, and what the backups did."""
    out: list[Violation] = []
    found: Counter[str] = Counter()
    for node, j in sorted(journals.items()):
        per_task: dict[str, list[m.Task]] = {}
        for t in j.tasks.values():
            if t.spec.backup_of and t.spec.home == node:
                per_task.setdefault(t.spec.backup_of, []).append(t)
        for oid, backups in sorted(per_task.items()):
            found["backups"] += len(backups)
            if len(backups) > 1:
                ids = ", ".join(b.id for b in backups)
                out.append(
                    Violation(BACKUP_SOUND, node, f"task {oid}: {len(backups)} backups: {ids}")
                )
            o = j.tasks.get(oid)
            if o is not None and not o.spec.idempotent:
                out.append(
                    Violation(
                        BACKUP_SOUND, node, f"task {oid} is not --idempotent but got a backup"
                    )
                )
            for b in backups:
                if not b.state.terminal:
                    what = f"backup {b.id} of {oid} never ended: {b.state.value} on {b.node}"
                    out.append(Violation(BACKUP_SOUND, node, what))
            if o is None or not o.state.terminal:
                continue
            bid = won_by(o)
            if bid is not None:
                winner = j.tasks.get(bid)
                if (
                    winner is None
                    or winner.state is not m.TaskState.SUCCEEDED
                    or winner.spec.backup_of != oid
                ):
                    what = (
                        f"task {oid} took its result from {bid}, not a backup of it that succeeded"
                    )
                    out.append(Violation(BACKUP_SOUND, node, what))
                else:
                    found["won"] += 1
            elif any(b.state is m.TaskState.SUCCEEDED for b in backups):
                found["both_finished"] += 1
            else:
                found["original_won"] += 1
    return out, found


def duplicate_executions(acked: Iterable[Acked], marks: Mapping[str, Sequence[str]]) -> int:
    """Executions beyond the first: per task (per node for global tasks)."""
    dups = 0
    for a in acked:
        lines = marks.get(a.id, ())
        if a.is_global:
            dups += sum(c - 1 for c in Counter(lines).values())
        else:
            dups += max(0, len(lines) - 1)
    return dups


def starts_by_task(journals: Mapping[str, JournalData]) -> Counter[str]:
    """Process starts per task, counted in the executors' own journals."""
    c: Counter[str] = Counter()
    for node, j in journals.items():
        for e in j.transitions:
            if e.node == node and e.dst == "running":
                c[e.task_id] += 1
    return c


# ------------------------------------------------------------------- shares


def specs_of(journals: Mapping[str, JournalData]) -> dict[str, m.TaskSpec]:
    out: dict[str, m.TaskSpec] = {}
    for j in journals.values():
        for tid, t in j.tasks.items():
            out.setdefault(tid, t.spec)
    return out


def shares_at(events: Sequence[SharesEvent], initial: int, t: float) -> int:
    """The node's shares at time t, from its journaled share changes."""
    value = events[0].old if events else initial
    for e in events:
        if e.at <= t:
            value = e.new
        else:
            break
    return value


@attrs.frozen
class Run:
    """A task running on a node, from its start to its next move (None: never ended)."""

    task_id: str
    start: float
    end: float | None
    seq: int


def runs_on(j: JournalData) -> list[Run]:
    """Start/stop of every local execution, from the executor's own journal."""
    by_task: dict[str, list[TransitionEvent]] = defaultdict(list)
    for e in sorted(j.transitions, key=lambda e: (e.at, e.seq)):
        by_task[e.task_id].append(e)
    runs: list[Run] = []
    for tid, evs in by_task.items():
        for i, e in enumerate(evs):
            if e.node != j.node or e.dst != "running" or e.src == "migrating":
                continue
            end = next((x.at for x in evs[i + 1 :] if x.src == "running"), None)
            runs.append(Run(tid, e.at, end, e.seq))
    runs.sort(key=lambda r: (r.start, r.seq))
    return runs


def check_drain(
    journals: Mapping[str, JournalData], specs: Mapping[str, m.TaskSpec], grace: float = 0.0
) -> list[Violation]:
    """No ordinary task started on a node while its journal says it was drained.

    `grace`: a start stamped up to this many seconds after the drain's journal time is
    not counted (the drain event is stamped before it takes effect); 0 by default.
    """
    out = []
    for node, j in journals.items():
        evs = sorted(j.shares, key=lambda e: (e.at, e.seq))
        if not evs:
            continue
        for r in runs_on(j):
            spec = specs.get(r.task_id)
            if spec is None or spec.is_global or spec.gang is not None or spec.array:
                continue  # a gang's or an array's own record runs no process
            last = None
            for e in evs:
                if e.at <= r.start:
                    last = e
            if last is not None and last.new == 0 and r.start - last.at > grace:
                out.append(
                    Violation(
                        DRAIN,
                        node,
                        f"task {r.task_id} started at {r.start:.3f}, "
                        f"{r.start - last.at:.3f}s after the node was drained",
                    )
                )
    return out


def check_reservations(
    journals: Mapping[str, JournalData],
    specs: Mapping[str, m.TaskSpec],
    initial_shares: Mapping[str, int],
) -> list[Violation]:
    """At every start of an ordinary task, the reservations of the tasks running on that
    node (this one included) fit the node's shares then; a task without a reservation
    needs some share unreserved. (Lowering shares later kills nothing, so only starts
    are judged.)"""
    out = []
    for node, j in journals.items():
        evs = sorted(j.shares, key=lambda e: (e.at, e.seq))
        initial = initial_shares.get(node, m.DEFAULT_SHARES)
        runs = [
            r
            for r in runs_on(j)
            if (s := specs.get(r.task_id)) and not s.is_global and s.gang is None and not s.array
        ]
        for r in runs:
            spec = specs[r.task_id]
            held = [
                o
                for o in runs
                if o is not r
                and (o.start, o.seq) < (r.start, r.seq)
                and (o.end is None or o.end > r.start)
            ]
            held_shares = sum(specs[o.task_id].reserve_shares for o in held)
            shares = shares_at(evs, initial, r.start)
            need = spec.reserve_shares
            if shares <= 0:
                continue  # a start on a drained node is the drain invariant's business
            if (need > 0 and held_shares + need > shares) or (need == 0 and held_shares >= shares):
                ids = ", ".join(f"{o.task_id}({specs[o.task_id].reserve_shares})" for o in held)
                out.append(
                    Violation(
                        RESERVE,
                        node,
                        f"task {r.task_id} reserving {need} started at {r.start:.3f} while "
                        f"{held_shares} of {shares} shares were held by {ids}",
                    )
                )
    return out


# ------------------------------------------------------------- membership


def check_membership(
    views: Mapping[str, Mapping[str, str]], live: Iterable[str], converged_in: float | None
) -> list[Violation]:
    """Every live agent's `swarm nodes` lists exactly the live agents as alive."""
    names = set(live)
    out = []
    if converged_in is None:
        out.append(Violation(MEMBERSHIP, "", "views did not agree within the bound after heal"))
    for node in sorted(names):
        view = views.get(node)
        if view is None:
            out.append(Violation(MEMBERSHIP, node, "did not answer `swarm nodes`"))
            continue
        alive = {k for k, v in view.items() if v == "alive"}
        if alive != names:
            missing = sorted(names - alive)
            extra = sorted(alive - names)
            out.append(
                Violation(
                    MEMBERSHIP,
                    node,
                    f"sees alive {sorted(alive)}: missing {missing}, extra {extra}",
                )
            )
    return out


# ------------------------------------------------------------- constraints


@attrs.frozen
class ConstraintOutcome:
    violations: tuple[Violation, ...]
    tasks: int  # tasks with constraints in some journal record
    starts: int  # their `-> running` events in the executors' own journals
    marks: int  # executions of those tasks judged from their marks


def check_constraints(
    journals: Mapping[str, JournalData],
    labels: Mapping[str, Mapping[str, str]],
    marks: Mapping[str, Sequence[str]],
    acked: Iterable[Acked] = (),
) -> ConstraintOutcome:
    """Every execution of a task ran on a node whose labels (`labels`: the ones the
    harness gave each node) satisfy the task's hard constraints, as its journal record
    states them. Executions are the `-> running` moves of every record's history and of
    every journal's transition events (the node each names), and the task's own marks
    (the node that ran its shell). The record must also carry the constraints the
    submission had (`acked`), so a build that drops them cannot pass by having none;
    and some constrained execution must have been judged, or the run proves nothing."""
    out: list[Violation] = []
    cons: dict[str, tuple[str, ...]] = {}
    for _, j in sorted(journals.items()):
        for tid, t in j.tasks.items():
            if t.spec.constraints:
                cons.setdefault(tid, t.spec.constraints)
    for a in acked:
        for node, j in sorted(journals.items()):
            rec = j.tasks.get(a.id)
            if rec is not None and tuple(rec.spec.constraints) != tuple(a.constraints):
                out.append(
                    Violation(
                        CONSTRAINT,
                        node,
                        f"task {a.id} was submitted with constraints {list(a.constraints)} "
                        f"but its record here has {list(rec.spec.constraints)}",
                    )
                )
        if a.constraints:
            cons.setdefault(a.id, a.constraints)
    # (task, node) -> where an execution there was seen
    seen: dict[tuple[str, str], list[str]] = defaultdict(list)
    starts = 0
    for node, j in sorted(journals.items()):
        for tid, t in j.tasks.items():
            if tid not in cons:
                continue
            for h in t.history:
                if h.dst is m.TaskState.RUNNING:
                    seen[(tid, h.node)].append(f"{node}'s record")
        for e in j.transitions:
            if e.dst == "running" and e.task_id in cons:
                if e.node == node:
                    starts += 1
                seen[(e.task_id, e.node)].append(f"{node}'s events")
    n_marks = 0
    for tid, nodes in marks.items():
        if tid not in cons:
            continue
        for where in nodes:
            n_marks += 1
            seen[(tid, where)].append("its marks")
    parsed: dict[str, tuple[Constraint, ...]] = {}
    for tid, texts in cons.items():
        try:
            parsed[tid] = parse_constraints(texts)
        except ConstraintError as e:
            out.append(Violation(CONSTRAINT, "", f"task {tid}: constraints {list(texts)}: {e}"))
    for (tid, where), sources in sorted(seen.items()):
        if tid not in parsed:
            continue
        have = labels.get(where)
        why = "a node the scenario does not know" if have is None else unmet(parsed[tid], have)
        if why is None:
            continue
        shown = ",".join(f"{k}={v}" for k, v in sorted((have or {}).items())) or "no labels"
        counts = ", ".join(f"{k} x{n}" if n > 1 else k for k, n in Counter(sources).items())
        out.append(
            Violation(
                CONSTRAINT,
                where,
                f"task {tid} {list(cons[tid])} ran on {where or '(no node)'} ({shown}): "
                f"{why}; seen in {counts}",
            )
        )
    if not seen:
        out.append(Violation(CONSTRAINT, "", "no execution of a task with constraints to judge"))
    return ConstraintOutcome(tuple(out), len(cons), starts, n_marks)


# ------------------------------------------------------------- preemption
#
# A preempted task's process is stopped and the task goes RUNNING -> QUEUED with the
# cause "preempted by <id> (...)" in the journal of the node that ran it (for a remote
# task that is the guest's copy of the record: the home's record shows the final
# outcome only). Its executions are read from its own marks (start, end or stop, wall
# time, node), so the checks judge what really ran against what the journals say.

PREEMPTED_BY = "preempted by "
# How long after a fault ends it may still explain a re-run or a second execution:
# detection, a back-off and the re-placement that follow a kill or a cut.
FAULT_SLACK = 15.0
# A start journaled this long before a kill -9 of its node may be lost with the
# journal's queue (docs/chaos.md, known limits).
UNJOURNALED_WINDOW = 5.0
# A kill or loss is recorded as it begins; a task's supervisor (which outlives its
# agent) may still start the process it was asked to start in the moment before the
# fault reaches it, after the agent is gone (home-loss, seed 1031: a start 0.1 s after
# `lose(n3)` began, never journaled by the dead agent)
KILL_LANDS = 2.0
# Faults that can stop a run or make a home give up on it: a kill (orphans killed at
# the restart, runs re-queued), a freeze or a cut (a home re-places what it cannot
# hear from), a transport restart (shutdown re-queues).
RERUN_FAULTS = frozenset({"kill", "pause", "isolate", "split", "one-way", "loss", "shim"})


@attrs.frozen
class Execution:
    """One process of a task, from its own marks: started at `start` on `node`, ended
    (or was stopped by SIGTERM: `stopped`) at `end`; `end` None: no end was written
    (SIGKILL: an orphan killed by its restarted agent)."""

    node: str
    attempt: int
    start: float
    end: float | None = None
    stopped: bool = False


@attrs.frozen
class Span:
    """One process of a task from its timed marks: its first and last (host clock)."""

    node: str
    pid: str
    first: float
    last: float


@attrs.frozen
class FaultWindow:
    """A fault as the checks see it: kind, the nodes it hit (every node for a split:
    both halves are cut off) and its wall-clock span (start to the end of the heal)."""

    kind: str
    nodes: frozenset[str]
    start: float
    end: float


@attrs.frozen
class LoggedPreemption:
    """A `task.preempted` line of an agent's log: that node decided to stop `task`."""

    node: str
    at: float
    task: str
    by: str


def _fault_explains(
    faults: Iterable[FaultWindow], nodes: Iterable[str], t0: float, t1: float
) -> FaultWindow | None:
    """A fault touching one of `nodes` active (or just healed) between t0 and t1."""
    names = set(nodes)
    for f in faults:
        if f.kind not in RERUN_FAULTS:
            continue
        if f.start <= t1 + 1.0 and f.end + FAULT_SLACK >= t0 and (f.nodes & names):
            return f
    return None


def _killed_after(faults: Iterable[FaultWindow], node: str, t: float, within: float) -> bool:
    """Was `node` killed (or lost) just after `t`, or its disk full at `t` (a journal
    write of a start then may never land)?"""
    return any(
        node in f.nodes
        and (
            (f.kind in ("kill", "lose") and t - KILL_LANDS <= f.start <= t + within)
            or (f.kind == "disk-full" and f.start - 1.0 <= t <= f.end + FAULT_SLACK)
        )
        for f in faults
    )


def preemptions(journals: Mapping[str, JournalData]) -> list[TransitionEvent]:
    """Every `running -> queued` transition caused by a preemption, in the journal of the
    node that ran the task (`e.node` is that node)."""
    return [
        e
        for node, j in journals.items()
        for e in j.transitions
        if e.cause.startswith(PREEMPTED_BY) and e.src == "running" and e.node == node
    ]


def _shown(e: Execution) -> str:
    end = "no end" if e.end is None else f"{'stopped' if e.stopped else 'ended'} {e.end:.3f}"
    return f"#{e.attempt} on {e.node} {e.start:.3f}-{end}"


def check_one_at_a_time(
    executions: Mapping[str, Sequence[Execution]],
    homes: Mapping[str, str],
    faults: Sequence[FaultWindow],
) -> list[Violation]:
    """No two executions of one task overlap in time (a preempted process is gone before
    its task runs again), unless a kill or a cut of a node involved (either executor, the
    home) explains the second: a killed agent's orphan runs on until its restart, and a
    home that cannot hear its guest places the task again."""
    out = []
    for tid, runs in executions.items():
        for i, a in enumerate(runs):
            for b in runs[i + 1 :]:
                if a.end is not None and b.start >= a.end:
                    continue
                if a.end is None and _fault_explains(faults, [a.node], a.start, b.start):
                    continue  # no end: SIGKILLed (an orphan) or still running at a kill
                involved = {a.node, b.node, homes.get(tid, "")}
                if _fault_explains(faults, involved, a.start, b.start):
                    continue
                out.append(
                    Violation(
                        ONE_AT_A_TIME,
                        b.node,
                        f"task {tid} ran twice at once: {_shown(a)} and {_shown(b)}, "
                        "no kill or cut explains it",
                    )
                )
    return out


def check_recorded(
    executions: Mapping[str, Sequence[Execution]],
    journals: Mapping[str, JournalData],
    faults: Sequence[FaultWindow],
    name: str = RECORDED,
) -> list[Violation]:
    """Every execution is accounted for by a `-> running` event in the journal of the
    node that ran it; only a start that its node's kill -9 followed within
    UNJOURNALED_WINDOW may be missing there (the write was queued)."""
    starts: Counter[tuple[str, str]] = Counter()
    for node, j in journals.items():
        for e in j.transitions:
            if e.node == node and e.dst == "running":
                starts[(e.task_id, node)] += 1
    out = []
    for tid, runs in executions.items():
        by_node: dict[str, list[Execution]] = defaultdict(list)
        for r in runs:
            by_node[r.node].append(r)
        for node, rs in by_node.items():
            missing = len(rs) - starts[(tid, node)]
            if missing <= 0:
                continue
            excused = sum(1 for r in rs if _killed_after(faults, node, r.start, UNJOURNALED_WINDOW))
            if missing > excused:
                shown = ", ".join(_shown(r) for r in rs)
                out.append(
                    Violation(
                        name,
                        node,
                        f"task {tid}: {len(rs)} executions there ({shown}) but "
                        f"{starts[(tid, node)]} starts in its journal, and no kill of the "
                        "node right after a start explains the difference",
                    )
                )
    return out


def check_reruns(
    executions: Mapping[str, Sequence[Execution]],
    journals: Mapping[str, JournalData],
    homes: Mapping[str, str],
    faults: Sequence[FaultWindow],
) -> tuple[list[Violation], Counter[str]]:
    """Every execution after a task's first is explained: a `preempted by` transition of
    that task in the journal of the node of the run before (at or after that run's start,
    each transition explaining one re-run), or a kill or cut involving either executor or
    the home between the two starts. Returns the violations and how many re-runs each
    explanation covered ("preempted", "fault")."""
    pre: dict[tuple[str, str], list[TransitionEvent]] = defaultdict(list)
    for e in preemptions(journals):
        pre[(e.task_id, e.node)].append(e)
    why: Counter[str] = Counter()
    out = []
    for tid, runs in executions.items():
        used: set[int] = set()
        for prev, nxt in itertools.pairwise(runs):
            ev = next(
                (
                    e
                    for e in sorted(pre[(tid, prev.node)], key=lambda e: e.at)
                    if e.seq not in used and prev.start - 1.0 <= e.at <= nxt.start + 1.0
                ),
                None,
            )
            if ev is not None:
                used.add(ev.seq)
                why["preempted"] += 1
                continue
            involved = {prev.node, nxt.node, homes.get(tid, "")}
            if _fault_explains(faults, involved, prev.start, nxt.start):
                why["fault"] += 1
                continue
            out.append(
                Violation(
                    RERUN,
                    nxt.node,
                    f"task {tid} ran again ({_shown(prev)}, then {_shown(nxt)}) with no "
                    f"'{PREEMPTED_BY}' transition in {prev.node}'s journal and no kill or cut "
                    "to explain it",
                )
            )
    return out, why


def check_preemptions_recorded(
    logged: Iterable[LoggedPreemption],
    journals: Mapping[str, JournalData],
    faults: Sequence[FaultWindow],
) -> list[Violation]:
    """A preemption an agent logged is in its own journal: the victim's next move off
    `running` there is `-> queued` with 'preempted by <the waiting task>'. Excused: the
    victim ended on its own first (it exited before the stop reached it), or the node
    was killed before the write landed."""
    out = []
    for p in logged:
        j = journals.get(p.node)
        if j is None:
            continue  # no journal at all is journal-integrity's business
        nxt = next(
            (
                e
                for e in sorted(j.events_of(p.task), key=lambda e: (e.at, e.seq))
                if e.src == "running" and e.at >= p.at - 0.5
            ),
            None,
        )
        if nxt is None:
            if _killed_after(faults, p.node, p.at, UNJOURNALED_WINDOW):
                continue
            out.append(
                Violation(
                    PREEMPT_RECORDED,
                    p.node,
                    f"task {p.task} preempted by {p.by} at {p.at:.3f} (log) but its record "
                    "there never left running",
                )
            )
            continue
        if nxt.cause.startswith(f"{PREEMPTED_BY}{p.by}") and nxt.dst == "queued":
            continue
        if nxt.dst in TERMINAL and nxt.cause == "exited 0":
            continue  # it finished before the stop reached it
        if nxt.cause.startswith("agent restarted") and _killed_after(
            faults, p.node, p.at, UNJOURNALED_WINDOW
        ):
            continue
        out.append(
            Violation(
                PREEMPT_RECORDED,
                p.node,
                f"task {p.task} preempted by {p.by} at {p.at:.3f} (log) but its record there "
                f"says {nxt.src} -> {nxt.dst} ({nxt.cause})",
            )
        )
    return out


def check_preemption_happened(journals: Mapping[str, JournalData]) -> list[Violation]:
    """The scenario proves nothing unless some task was really preempted."""
    if preemptions(journals):
        return []
    return [Violation(PREEMPTED, "", "no 'preempted by' transition in any journal")]


def logged_preemptions(node: str, text: str) -> list[LoggedPreemption]:
    """The `task.preempted` lines of one agent's log."""
    out = []
    for line in text.splitlines():
        if "task.preempted" not in line:
            continue
        kv = logfmt(line)
        if kv.get("event") != "task.preempted":
            continue
        try:
            out.append(LoggedPreemption(node, float(kv["ts"]), kv["task"], kv.get("by", "")))
        except (KeyError, ValueError):
            continue
    return out


# ---------------------------------------------------------------- elastic
#
# The elastic scenario's agents carry one `[scale.NAME]` pool whose hooks only record
# their calls (chaos.elastic: wall time, action, nodes, actor, epoch, attempt). A
# scale-in's actor journals a `scale` event naming its victims when it decides and
# drains them, and runs the scale-in hook once their reports show no work (or after
# the drain grace); it journals another (`scale-in hook done`) when the hook succeeds.
# During a partition each side elects its own actor: `bound_double_action(max_step,
# partitions)` is the stated cost.

HOOK_DONE = "scale-in hook done"  # the reason of the `scale` event after a hook's success
CUT_KINDS = frozenset({"split", "isolate"})  # faults that add a side to the cluster
HANDED_OFF = "handed off to"  # a task whose home moved: no longer the victim's business
DECISION_SLACK = 0.5  # s: a decision journaled this much after the hook still names it


@attrs.frozen
class HookCall:
    """One call of a pool's hook, as the recorder wrote it (its own wall time)."""

    at: float
    action: str  # "out" | "in"
    nodes: tuple[str, ...]  # SWARM_SCALE_NODES: the victims of a scale-in
    actor: str
    epoch: int
    attempt: int = 0
    count: int = 0
    pool: str = ""


@attrs.frozen
class Removal:
    """A node a scale-in hook call named, timed by the action that chose it: its
    actor's journaled decision (`decided_by` names that journal), or the hook's own
    time when no journal shows one."""

    node: str
    at: float
    hook_at: float
    actor: str  # who ran the hook
    epoch: int
    decided_by: str = ""


def scale_decisions(journals: Mapping[str, JournalData]) -> list[ScaleEvent]:
    """Every scale-in decision (victims chosen, drains begun) in every journal."""
    return sorted(
        (
            e
            for j in journals.values()
            for e in j.scale
            if e.action == "in" and e.reason != HOOK_DONE and e.nodes
        ),
        key=lambda e: (e.at, e.node, e.seq),
    )


def removals(calls: Iterable[HookCall], journals: Mapping[str, JournalData]) -> list[Removal]:
    """The nodes the scale-in hook calls named, each at its action's time. A retry
    (same actor, epoch and nodes as an earlier call) is the same action: counted once."""
    decisions = scale_decisions(journals)
    seen: set[tuple[str, int, tuple[str, ...]]] = set()
    out: list[Removal] = []
    for c in sorted(calls, key=lambda c: c.at):
        if c.action != "in":
            continue
        key = (c.actor, c.epoch, c.nodes)
        if key in seen:
            continue
        seen.add(key)
        for n in c.nodes:
            dec = None
            for e in decisions:
                if e.at > c.at + DECISION_SLACK:
                    break
                if n in e.nodes:
                    dec = e  # the latest that named it before the hook
            out.append(
                Removal(
                    n,
                    c.at if dec is None else dec.at,
                    c.at,
                    c.actor,
                    c.epoch,
                    "" if dec is None else dec.node,
                )
            )
    return sorted(out, key=lambda r: (r.at, r.node))


def partitions_in_force(cuts: Iterable[FaultWindow], t0: float, t1: float, slack: float) -> int:
    """Sides the cluster may have had between t0 and t1: one, plus one per cut (split,
    isolate) active then, or healed less than `slack` seconds before t0 (until every
    view has the other side back, each side's actor still acts alone)."""
    return 1 + sum(1 for w in cuts if w.kind in CUT_KINDS and w.start < t1 and w.end + slack >= t0)


@attrs.frozen
class DoubleOutcome:
    violations: tuple[Violation, ...]
    removals: tuple[Removal, ...]
    # partitions in force -> the most nodes removed within one in-cooldown window
    peak: Mapping[int, int]
    doubles: int  # windows with more than max_step nodes removed (allowed only while split)
    repeated: tuple[str, ...] = ()  # nodes named by more than one scale-in action


def check_double_action(
    calls: Iterable[HookCall],
    journals: Mapping[str, JournalData],
    cuts: Sequence[FaultWindow],
    *,
    in_cooldown: float,
    max_step: int,
    slack: float,
    tolerance: float = 0.5,
) -> DoubleOutcome:
    """In any in-cooldown window, the nodes named by scale-in hook calls (each at the
    time of the action that chose it) are at most `bound_double_action(max_step,
    partitions in force)`: `max_step` in a connected cluster, twice that while split
    in two. Windows start at each removal and last `in_cooldown - tolerance` (one
    actor's two actions are a cooldown apart on its monotonic clock; the journal
    stamps them with the wall clock). A node named again by a later action counts
    once (the bound is on nodes changed; the repeats are returned). A run whose
    hooks never removed a node proves nothing, and says so."""
    rs = removals(calls, journals)
    out: list[Violation] = []
    if not rs:
        out.append(Violation(SCALE_DOUBLE, "", "no scale-in hook ran: nothing to judge"))
    peak: dict[int, int] = {}
    doubles = 0
    reported: list[frozenset[str]] = []
    for r in rs:
        end = r.at + in_cooldown - tolerance
        inside = [x for x in rs if r.at <= x.at < end]
        nodes = frozenset(x.node for x in inside)
        sides = partitions_in_force(cuts, r.at, r.at + in_cooldown, slack)
        bound = bound_double_action(max_step, sides)
        peak[sides] = max(peak.get(sides, 0), len(nodes))
        if len(nodes) > max_step:
            doubles += 1
        if len(nodes) <= bound or any(nodes <= s for s in reported):
            continue
        reported.append(nodes)
        shown = ", ".join(
            f"{x.node} (chosen at {x.at:.3f}"
            + (f" by {x.decided_by}" if x.decided_by else ", no decision journaled")
            + f", hook by {x.actor} e{x.epoch} at {x.hook_at:.3f})"
            for x in inside
        )
        out.append(
            Violation(
                SCALE_DOUBLE,
                r.decided_by or r.actor,
                f"{len(nodes)} nodes removed within {in_cooldown:g} s from {r.at:.3f} "
                f"with {sides} side(s) in force: bound {bound} (max_step {max_step} x "
                f"{sides}): {shown}",
            )
        )
    named = Counter(x.node for x in rs)
    repeated = tuple(sorted(n for n, k in named.items() if k > 1))
    return DoubleOutcome(tuple(out), tuple(rs), peak, doubles, repeated)


@attrs.frozen
class IdleOutcome:
    violations: tuple[Violation, ...]
    judged: int  # removals whose victim's journal was read at its hook's time
    after_grace: int  # removals whose hook ran after the drain grace (work allowed)
    homed_elsewhere: int  # unfinished tasks homed at a victim, running elsewhere then


def _state_at(evs: Sequence[TransitionEvent], t: float) -> TransitionEvent | None:
    last = None
    for e in evs:
        if e.at <= t:
            last = e
    return last


def check_victims_idle(
    rs: Iterable[Removal], journals: Mapping[str, JournalData], *, drain_grace: float
) -> IdleOutcome:
    """When a scale-in hook ran, no victim it named was running or holding work: in the
    victim's own journal no execution there had started and not yet ended (from its
    `transition` events), and no task's latest move put it in the victim's queue. A
    hook that ran `drain_grace` or more after the decision may remove a busy node (the
    design's limit): counted, not a violation. Tasks homed at the victim that ran
    elsewhere then were moved, not lost: counted for the notes."""
    out: list[Violation] = []
    judged = after = elsewhere = 0
    done: set[tuple[str, float]] = set()
    for r in rs:
        if (r.node, r.hook_at) in done:
            continue
        done.add((r.node, r.hook_at))
        j = journals.get(r.node)
        if j is None:
            out.append(Violation(SCALE_IDLE, r.node, "a scale-in victim with no journal"))
            continue
        judged += 1
        t = r.hook_at
        busy = [x for x in runs_on(j) if x.start < t and (x.end is None or x.end > t)]
        by_task: dict[str, list[TransitionEvent]] = defaultdict(list)
        for e in sorted(j.transitions, key=lambda e: (e.at, e.seq)):
            by_task[e.task_id].append(e)
        queued = []
        for tid, evs in by_task.items():
            last = _state_at(evs, t)
            if last is None or last.dst in TERMINAL:
                continue
            if last.node == r.node:
                if last.dst != "running":  # a run is judged above, from its start and end
                    queued.append(f"{tid} ({last.dst})")
            elif not last.cause.startswith(HANDED_OFF):
                elsewhere += 1
        if not busy and not queued:
            continue
        if t - r.at >= drain_grace:
            after += 1
            continue
        what = []
        if busy:
            what.append(
                "running "
                + ", ".join(
                    f"{x.task_id} (since {x.start:.3f}, "
                    + ("never ended" if x.end is None else f"until {x.end:.3f}")
                    + ")"
                    for x in busy
                )
            )
        if queued:
            what.append("holding " + ", ".join(sorted(queued)))
        out.append(
            Violation(
                SCALE_IDLE,
                r.node,
                f"scale-in hook by {r.actor} (epoch {r.epoch}) ran at {t:.3f}, "
                f"{t - r.at:.1f}s after the decision (grace {drain_grace:g} s), while the "
                f"victim was {'; '.join(what)}",
            )
        )
    return IdleOutcome(tuple(out), judged, after, elsewhere)


# ------------------------------------------------------------------- logs


_LEVEL_ERROR = re.compile(r"(?:^|\s)level=error(?:\s|$)")
_EVENT = re.compile(r"(?:^|\s)event=(\S+)")


def check_log(node: str, text: str, allowed_errors: Iterable[str] = ()) -> list[Violation]:
    """No traceback, no folded stack, no error event other than the allowed ones."""
    allowed = set(allowed_errors)
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("# chaos:"):
            continue
        if "Traceback (most recent call last)" in line or " stack=" in line:
            out.append(Violation(NO_CRASH, node, f"log line {n}: {line[:300]}"))
            continue
        if _LEVEL_ERROR.search(line):
            ev = _EVENT.search(line)
            name = ev.group(1) if ev else "?"
            if name not in allowed:
                out.append(Violation(NO_CRASH, node, f"log line {n}: {line[:300]}"))
    return out


def check_encrypted(
    node: str, log_text: str, transport: Mapping[str, Any] | None
) -> list[Violation]:
    """With a shared cluster key: the agent never ran unencrypted, and no frame of a
    member failed to authenticate (`dropped_decrypt`) or came in the other mode
    (`dropped_mode`: plaintext into a keyed agent). Faults may drop, delay, duplicate
    or reorder (replays and stale frames are dropped and counted), never corrupt."""
    out = []
    if "agent.insecure" in log_text:
        out.append(Violation(ENCRYPTED, node, "the agent ran with --insecure"))
    if transport is None:
        out.append(Violation(ENCRYPTED, node, "no transport counters (agent unreachable)"))
        return out
    for key in ("dropped_decrypt", "dropped_mode"):
        n = int(transport.get(key, 0) or 0)
        if n:
            out.append(Violation(ENCRYPTED, node, f"{key} = {n} within a keyed cluster"))
    return out


def check_exits(node: str, exits: Iterable[tuple[float, int, bool]]) -> list[Violation]:
    """The agent process ended only when the harness ended it."""
    out = []
    for at, code, expected in exits:
        if expected:
            continue
        if code == 0:
            how = "stopped cleanly: a SIGTERM/SIGINT that the harness did not send"
        elif code < 0:
            how = f"killed by signal {-code}, not by the harness"
        else:
            how = f"exited by itself with code {code}"
        out.append(Violation(NO_CRASH, node, f"agent {how} (noticed at {at:.3f})"))
    return out


def check_integrity(journals: Mapping[str, JournalData]) -> list[Violation]:
    out = []
    for node, j in journals.items():
        if j.integrity != "ok":
            out.append(Violation(INTEGRITY, node, f"integrity_check: {j.integrity}"))
        if j.bad_records:
            out.append(Violation(INTEGRITY, node, f"{j.bad_records} rows did not decode"))
    return out


# ------------------------------------------------------------------ logfmt


def logfmt(line: str) -> dict[str, str]:
    """Parse one logfmt line (quoted values with backslash escapes)."""
    out: dict[str, str] = {}
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i] == " ":
            i += 1
        k0 = i
        while i < n and line[i] not in "= ":
            i += 1
        key = line[k0:i]
        if i >= n or line[i] != "=":
            if key:
                out[key] = ""
            continue
        i += 1
        if i < n and line[i] == '"':
            i += 1
            buf = []
            while i < n and line[i] != '"':
                if line[i] == "\\" and i + 1 < n:
                    i += 1
                    buf.append({"n": "\n"}.get(line[i], line[i]))
                else:
                    buf.append(line[i])
                i += 1
            i += 1
            out[key] = "".join(buf)
        else:
            v0 = i
            while i < n and line[i] != " ":
                i += 1
            out[key] = line[v0:i]
    return out


def check_at_most_once(
    acked: Iterable[Acked], spans: Mapping[str, Sequence[Span]]
) -> tuple[list[Violation], int, int]:
    """No two processes of an --at-most-once task overlap: each one's first mark comes
    after the previous one's last. Returns the violations, the processes seen and how
    many tasks ran more than once (one after the other: a fence, then a new attempt)."""
    out: list[Violation] = []
    procs = again = 0
    for a in acked:
        if not a.at_most_once:
            continue
        runs = sorted(spans.get(a.id, ()), key=lambda s: s.first)
        procs += len(runs)
        again += len(runs) > 1
        for prev, nxt in itertools.pairwise(runs):
            if nxt.first <= prev.last:
                detail = (
                    f"--at-most-once task {a.id} ran twice at once: on {prev.node} (pid "
                    f"{prev.pid}) {prev.first:.3f}-{prev.last:.3f} and on {nxt.node} (pid "
                    f"{nxt.pid}) from {nxt.first:.3f}"
                )
                out.append(Violation(AT_MOST_ONCE, nxt.node, detail))
    return out, procs, again


def check_cancelled(
    cancels: Mapping[str, str], acked: Iterable[Acked], journals: Mapping[str, JournalData]
) -> list[Violation]:
    """A task whose cancel answered `cancelled` ends cancelled where its record is."""
    out = []
    for a in acked:
        if cancels.get(a.id) != "cancelled":
            continue
        where = authority(a, journals)
        j = journals.get(where)
        t = None if j is None else j.tasks.get(a.id)
        if t is not None and t.state is not m.TaskState.CANCELLED:
            detail = f"task {a.id}: its cancel answered cancelled, its record ends {t.state.value}"
            out.append(Violation(CANCEL, where, detail))
    return out


def check_no_rerun(
    acked: Iterable[Acked], executions: Mapping[str, Sequence[Execution]]
) -> list[Violation]:
    """Restart scenarios: every task ran at most once (its agents were restarted, never
    killed: a running task is re-attached, a finished one is not run again)."""
    out = []
    for a in acked:
        runs = executions.get(a.id, ())
        if not a.is_global and len(runs) > 1:
            shown = ", ".join(_shown(r) for r in runs)
            out.append(
                Violation(
                    RESTART_RERUN, runs[1].node, f"task {a.id} ran {len(runs)} times: {shown}"
                )
            )
    return out


def check_old_home_waits(
    executions: Mapping[str, Sequence[Execution]],
    journals: Mapping[str, JournalData],
    faults: Iterable[FaultWindow],
    grace: float,
) -> list[Violation]:
    """A task adopted from its home X (an `adopted from X` move in the adopter's
    journal) does not start at X within DOUBT_MIN s of X's restart after a kill that
    kept it down for the grace or more, when the adoption came before that window's
    end (node/doubt.py: X is in doubt about it then, whatever the notices), unless X
    let it go and then took it from the adopter to run as its guest (`accepted from`
    in X's journal). A start later is at-least-once by design (no notice came)."""
    downs: dict[str, list[tuple[float, float]]] = {}
    for f in faults:
        if f.kind == "kill" and f.end - f.start >= grace:
            for n in f.nodes:
                downs.setdefault(n, []).append((f.start, f.end))
    out = []
    for adopter, j in sorted(journals.items()):
        for e in j.transitions:
            if not e.cause.startswith("adopted from "):
                continue
            old = e.cause[len("adopted from ") :].split(":", 1)[0]
            for start, back in downs.get(old, ()):
                if not start <= e.at <= back + DOUBT_MIN:
                    continue
                at_old = journals[old].events_of(e.task_id) if old in journals else []
                for r in executions.get(e.task_id, ()):
                    guest = any(  # it let go, and the adopter handed it back to run there
                        x.cause.startswith("accepted from ") and back <= x.at <= r.start
                        for x in at_old
                    )
                    if r.node == old and back <= r.start < back + DOUBT_MIN and not guest:
                        detail = (
                            f"task {e.task_id} started at {old} {r.start - back:.1f}s after its"
                            f" restart (down {back - start:.1f}s), adopted by {adopter}"
                        )
                        out.append(Violation(OLD_HOME_WAITS, old, detail))
    return out


_RUNS = frozenset({"running", "migrating"})
_BACK = frozenset({"queued", "migrating", "transferring"})


def retry_point(e: TransitionEvent) -> bool:
    """A place in a journal where a run may have happened without its result: a run
    that went back (re-queued, migrating, preempted, stopped by its agent), a re-queue
    after its holder died (whose run the home may never have heard of), an adoption."""
    return (
        (e.src in _RUNS and e.dst in _BACK)
        or (e.dst == "queued" and "re-queued" in e.cause)
        or e.cause.startswith("adopted from")
    )


def check_reruns_recorded(
    acked: Iterable[Acked],
    executions: Mapping[str, Sequence[Execution]],
    journals: Mapping[str, JournalData],
) -> list[Violation]:
    """A task that ran k times (its start marks) has at least k - 1 retry points in
    the journals' history of it (the home's, an adopter's, and the runners': a
    preemption is in the runner's journal only, whose record of the task a later
    handoff to the same node replaces, while its events stay)."""
    out = []
    for a in acked:
        runs = executions.get(a.id, ())
        if a.is_global or len(runs) < 2:
            continue
        points = sum(1 for j in journals.values() for e in j.events_of(a.id) if retry_point(e))
        if len(runs) - 1 > points:
            shown = ", ".join(_shown(r) for r in runs)
            detail = (
                f"task {a.id} ran {len(runs)} times ({shown}); its record shows {points} retries"
            )
            out.append(Violation(RETRY_RECORDED, runs[-1].node, detail))
    return out


def check_copies_released(
    journals: Mapping[str, JournalData],
    skip_nodes: Iterable[str] = (),
    ended_before: float = math.inf,
) -> list[Violation]:
    """Every copy a node keeps of another home's task carries how it ended, once the
    home's own record ended (before `ended_before`, wall time: a release is sent at the
    next tick). Copies held by, or naming as home, a node in `skip_nodes` (lost for
    good, or whose journal writes failed) are not judged."""
    skip = set(skip_nodes)
    out = []
    for node, j in sorted(journals.items()):
        if node in skip:
            continue
        for tid, home in sorted(j.open_copies.items()):
            hj = journals.get(home)
            t = hj.tasks.get(tid) if hj is not None and home not in skip else None
            if t is None or t.spec.home != home or t.state.value not in TERMINAL:
                continue
            if (t.finished_at or 0.0) >= ended_before:
                continue
            detail = (
                f"copy of {tid} (home {home}) has no word of its end: {t.state.value} at "
                f"its home since {t.finished_at:.1f}"
            )
            out.append(Violation(COPY_RELEASED, node, detail))
    return out


def check_visible(
    answers: Mapping[str, Mapping[str, str]], lost_with_home: Iterable[str] = ()
) -> list[Violation]:
    """Task id -> node -> the state its `swarm status` answered: one final state
    everywhere (but for a task lost with its home, which no survivor knows)."""
    out = []
    skip = set(lost_with_home)
    for tid, by_node in answers.items():
        if tid in skip:
            continue
        states = set(by_node.values())
        if len(states) != 1 or not states <= TERMINAL:
            shown = ", ".join(f"{n} {s}" for n, s in sorted(by_node.items()))
            out.append(Violation(VISIBLE, "", f"task {tid}: status answers {shown}"))
    return out


def gang_starts(gang: str, spans: Mapping[str, Sequence[Span]]) -> dict[str, dict[int, Span]]:
    """One gang's members from their marks: start (the member ids' RUN part, "1" for
    the first) -> rank -> the member's process span (its first beat to its last)."""
    out: dict[str, dict[int, Span]] = {}
    base, _, owner = gang.partition("~")
    for tid, runs in spans.items():
        rest, _, owner2 = tid.partition("~")
        if (owner2 != owner) or not rest.startswith(base + ".") or not runs:
            continue
        parts = rest[len(base) + 1 :].split(".")
        if not 1 <= len(parts) <= 2 or not all(p.isdigit() for p in parts):
            continue
        start = parts[1] if len(parts) == 2 else "1"
        first = min(r.first for r in runs)
        last = max(r.last for r in runs)
        out.setdefault(start, {})[int(parts[0])] = Span(runs[0].node, runs[0].pid, first, last)
    return out


def longest_partial(members: Mapping[int, Span], size: int) -> tuple[float, float]:
    """The longest stretch in which some but not all `size` members ran: (seconds,
    from when). A member with no marks never ran: the others' whole run is partial."""
    edges = sorted(
        [(s.first, 1) for s in members.values()] + [(s.last, -1) for s in members.values()]
    )
    best, since, at, running = 0.0, None, 0.0, 0
    for t, d in edges:
        running += d
        partial = 0 < running < size
        if partial and since is None:
            since = t
        elif not partial and since is not None:
            if t - since > best:
                best, at = t - since, since
            since = None
    return best, at


def check_gangs(
    acked: Iterable[Acked],
    spans: Mapping[str, Sequence[Span]],
    journals: Mapping[str, JournalData],
    bound: float,
) -> tuple[list[Violation], dict[str, Any]]:
    """Issue 22's checks (GANG_PARTIAL, GANG_WHOLE); also figures for the notes."""
    out: list[Violation] = []
    figs: dict[str, Any] = {
        "gangs": 0, "starts": 0, "members": 0, "worst_partial_s": 0.0, "spread_s": 0.0
    }  # fmt: skip
    states: Counter[str] = Counter()
    for a in acked:
        if not a.gang:
            continue
        figs["gangs"] += 1
        starts = gang_starts(a.id, spans)
        for run, members in starts.items():
            figs["starts"] += 1
            figs["members"] += len(members)
            firsts = [s.first for s in members.values()]
            figs["spread_s"] = max(figs["spread_s"], max(firsts) - min(firsts))
            if not a.strict:
                continue
            worst, since = longest_partial(members, a.gang)
            figs["worst_partial_s"] = max(figs["worst_partial_s"], worst)
            if worst > bound + 1.0:
                node = next(iter(members.values())).node
                out.append(
                    Violation(
                        GANG_PARTIAL,
                        node,
                        f"gang {a.id} start {run}: {len(members)} of {a.gang} members "
                        f"ran partly for {worst:.1f} s from {since:.3f} (bound {bound:.2f} s)",
                    )
                )
        where = authority(a, journals)
        j = journals.get(where)
        t = None if j is None else j.tasks.get(a.id)
        states[t.state.value if t is not None else "missing"] += 1
        whole = any(len(ms) == a.gang for ms in starts.values())
        if t is not None and t.state is m.TaskState.SUCCEEDED and a.strict and not whole:
            detail = f"gang {a.id} succeeded, no start ran all members"
            out.append(Violation(GANG_WHOLE, where, detail))
    figs["states"] = dict(states)
    return out, figs


def _element_id(array: str, index: int) -> str:
    base, sep, owner = array.partition("~")
    return f"{base}_{index}{sep}{owner}"


def check_arrays(
    acked: Iterable[Acked], journals: Mapping[str, JournalData]
) -> tuple[list[Violation], dict[str, int]]:
    """ARRAY_WHOLE: each acknowledged array's elements, at its home's journal."""
    from swarm.policy.arrays import parse_array

    out: list[Violation] = []
    figs = {"arrays": 0, "elements": 0, "ended": 0}
    for a in acked:
        if not a.array:
            continue
        figs["arrays"] += 1
        where = authority(a, journals)
        j = journals.get(where)
        rec = None if j is None else j.tasks.get(a.id)
        if j is None or rec is None:
            continue  # the home's journal is missing: acked-task-terminal says so
        ended_states: list[m.TaskState] = []
        for index in parse_array(a.array):
            figs["elements"] += 1
            e = j.tasks.get(_element_id(a.id, index))
            if e is not None and e.state.terminal:
                ended_states.append(e.state)
            if e is None:
                if rec.state.terminal and rec.state is not m.TaskState.CANCELLED:
                    detail = f"array {a.id} ended {rec.state.value} without element {index}"
                    out.append(Violation(ARRAY_WHOLE, where, detail))
                continue
            if e.state.terminal:
                figs["ended"] += 1
            elif rec.state.terminal:
                detail = f"array {a.id} ended while element {index} is {e.state.value}"
                out.append(Violation(ARRAY_WHOLE, where, detail))
        n = len(parse_array(a.array))
        if rec.state in (m.TaskState.SUCCEEDED, m.TaskState.FAILED) and len(ended_states) == n:
            # its record says how its elements ended, each counted once (stop 52: a
            # restart lost an element's end from the counts, and the array could say
            # succeeded with a failed element)
            ok = all(x is m.TaskState.SUCCEEDED for x in ended_states)
            counted = sum(int(w) for w in rec.reason.replace(",", " ").split() if w.isdigit())
            if (rec.state is m.TaskState.SUCCEEDED) != ok or counted != n:
                got = dict(Counter(x.value for x in ended_states))
                detail = f"array {a.id} ended {rec.state.value} ({rec.reason}); its elements {got}"
                out.append(Violation(ARRAY_WHOLE, where, detail))
        finals = [
            e
            for e in j.transitions
            if e.task_id.startswith(a.id.partition("~")[0] + "_") and e.dst in TERMINAL
        ]
        per = Counter(e.task_id for e in finals)
        for tid, n in per.items():
            if n > 1:
                out.append(Violation(ARRAY_WHOLE, where, f"element {tid} ended {n} times"))
    return out, figs


def check_dependencies(
    acked: Iterable[Acked], journals: Mapping[str, JournalData]
) -> tuple[list[Violation], dict[str, int]]:
    """DEP_ORDER: a child's first start comes after every parent's end, and only when
    the condition held (ok: the parent succeeded; notok: it did not)."""
    from swarm.policy.depends import Cond, parse_after

    out: list[Violation] = []
    figs = {"children": 0, "started": 0, "never": 0}
    ended: dict[str, tuple[float, str]] = {}
    started: dict[str, float] = {}
    for j in journals.values():
        for e in j.transitions:
            if e.dst in TERMINAL:
                prev = ended.get(e.task_id)
                ended[e.task_id] = (e.at, e.dst) if prev is None else min(prev, (e.at, e.dst))
            if e.dst == "running" and e.node == j.node:
                started[e.task_id] = min(started.get(e.task_id, e.at), e.at)
    for a in acked:
        if not a.after:
            continue
        figs["children"] += 1
        first = started.get(a.id)
        if first is None:
            figs["never"] += 1
            continue
        figs["started"] += 1
        for clause in parse_after(a.after):
            for p in clause.parents:
                end = ended.get(p.task_id)
                if end is None or end[0] > first:
                    when = "never ended" if end is None else f"ended at {end[0]:.3f}"
                    detail = f"{a.id} started at {first:.3f}; its parent {p.task_id} {when}"
                    out.append(Violation(DEP_ORDER, a.home, detail))
                elif clause.cond is Cond.OK and end[1] != "succeeded":
                    detail = f"{a.id} ran --after ok:{p.task_id}, which ended {end[1]}"
                    out.append(Violation(DEP_ORDER, a.home, detail))
                elif clause.cond is Cond.NOTOK and end[1] == "succeeded":
                    detail = f"{a.id} ran --after notok:{p.task_id}, which succeeded"
                    out.append(Violation(DEP_ORDER, a.home, detail))
    return out, figs


def check_late_binding(
    executions: Mapping[str, Sequence[Execution]],
    journals: Mapping[str, JournalData],
    homes: Mapping[str, str],
    faults: Sequence[FaultWindow],
) -> tuple[list[Violation], dict[str, int]]:
    """Issue 24: every task a home held for late binding (its journaled decision says
    so) ran once, or again only where a kill or cut explains it. Figures: held, ran at
    the home, pulled by a peer, re-runs explained, never ran (cancelled or lost)."""
    held = {t for j in journals.values() for t in j.late_held}
    runs = {t: executions[t] for t in held if t in executions}
    out, why = check_reruns(runs, journals, homes, faults)
    out = [Violation(LATE_ONCE, v.node, v.detail) for v in out]
    at_home = sum(1 for t, rs in runs.items() if rs and rs[0].node == homes.get(t))
    figures = {
        "held": len(held),
        "at_home": at_home,
        "pulled": len(runs) - at_home,
        "reruns_explained": sum(why.values()),
        "never_ran": len(held) - len(runs),
    }
    return out, figures


def _up_stretches(
    start: float, end: float, downs: Iterable[FaultWindow], nodes: frozenset[str]
) -> list[tuple[float, float]]:
    """The parts of [start, end] in which none of `nodes` was within COPY_MARGIN of one
    of its down spans (`downs`: kills, restarts, losses)."""
    cuts = sorted((w.start - COPY_MARGIN, w.end + COPY_MARGIN) for w in downs if w.nodes & nodes)
    out, at = [], start
    for a, b in cuts:
        if a > at:
            out.append((at, min(a, end)))
        at = max(at, b)
        if at >= end:
            break
    if at < end:
        out.append((at, end))
    return [(a, b) for a, b in out if b > a]


def check_copied_late(
    acked: Iterable[Acked],
    with_home: Iterable[str],
    windows: Iterable[FaultWindow],
    nodes: Sequence[str],
) -> tuple[list[Violation], int]:
    """A task lost with its home lost for good (`lost-with-home`: at that home, no copy
    anywhere) that was answered with no copy is a violation if one of the home's peers
    was surely up, with the home, for TOPUP_STRETCH s between the answer and the loss:
    the home's top-up (node/topup.py) copies such a task at its next failover tick.
    Clusters of 3 or more, as `check_copies`; answers without the field (arrays,
    gangs, --after: never copied) are not judged. Returns the violations and how many
    lost tasks were judged."""
    downs = [w for w in windows if w.kind in ("kill", "restart", "lose")]
    losses = {n: w.start for w in downs if w.kind == "lose" for n in w.nodes}
    lost = set(with_home)
    out: list[Violation] = []
    judged = 0
    if len(nodes) < 3:
        return out, judged
    for a in acked:
        if a.id not in lost or a.copies != 0 or a.home not in losses:
            continue
        judged += 1
        loss = losses[a.home]
        for peer in nodes:
            if peer == a.home:
                continue
            both = frozenset({a.home, peer})
            up = [s for s in _up_stretches(a.at, loss, downs, both) if s[1] - s[0] >= TOPUP_STRETCH]
            if up:
                detail = (
                    f"task {a.id}: answered with no copy at {a.home}, lost with it at "
                    f"{loss:.1f}, though {peer} was up beside it from {up[0][0]:.1f} to "
                    f"{up[0][1]:.1f}: never copied there"
                )
                out.append(Violation(COPIED_LATE, a.home, detail))
                break
    return out, judged


def check_copies(
    acked: Iterable[Acked], windows: Iterable[FaultWindow], nodes: Sequence[str]
) -> tuple[list[Violation], dict[str, int]]:
    """Each answered submission that says how many copies were made at other nodes
    (`replicas`) has one when one of its home's peers was up at the time: no kill,
    restart or loss covered it within COPY_MARGIN (SWIM's detection, a restarted
    agent's rejoin). Clusters of 3 or more (a copy besides the home's record wanted);
    not judged where no peer was surely up."""
    downs = [w for w in windows if w.kind in ("kill", "restart", "lose")]
    out: list[Violation] = []
    f = {"answers": 0, "checked": 0, "copied": 0}
    if len(nodes) < 3:
        return out, f
    for a in acked:
        if a.copies is None:
            continue
        f["answers"] += 1
        down = {
            n
            for w in downs
            if w.start - COPY_MARGIN <= a.at <= w.end + COPY_MARGIN
            for n in w.nodes
        }
        if not [n for n in nodes if n != a.home and n not in down]:
            continue
        f["checked"] += 1
        if a.copies >= 1:
            f["copied"] += 1
            continue
        detail = (
            f"task {a.id}: answered with no copy elsewhere at {a.home} while "
            f"{', '.join(n for n in nodes if n != a.home and n not in down)} was up "
            f"(down then: {', '.join(sorted(down)) or 'none'})"
        )
        out.append(Violation(COPIED, a.home, detail))
    return out, f
