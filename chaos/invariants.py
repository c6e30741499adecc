"""The invariants a chaos run must keep, checked against the agents' own evidence.

Pure functions over decoded journals (chaos.journals), the agents' logs and CLI
answers; the only harness bookkeeping they take is which task ids were
*acknowledged* (a submit returned an id) and at which node. Each violation names its
invariant, so a failing run says what broke, not just that something did.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from swarm import model as m

from .journals import JournalData, SharesEvent, TransitionEvent

ACKED = "acked-task-terminal"
ONE_RESULT = "one-recorded-result"
EXECUTED = "result-backed-by-execution"
DRAIN = "no-start-while-drained"
RESERVE = "reservation-not-oversubscribed"
MEMBERSHIP = "membership-converged"
NO_CRASH = "no-crash-or-traceback"
INTEGRITY = "journal-integrity"

ENCRYPTED = "traffic-encrypted"  # checked only in scenarios that run with a cluster key

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


@attrs.frozen
class AckOutcome:
    violations: tuple[Violation, ...]
    states: Mapping[str, int]  # final state at the home -> count ("missing", "unfinished")
    lost: tuple[str, ...]  # acknowledged, never terminal or missing from the home's journal


# ------------------------------------------------------------------- results


def _terminal_events(j: JournalData, tid: str) -> list[TransitionEvent]:
    return [e for e in j.events_of(tid) if e.dst in TERMINAL]


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
    hist = sum(1 for h in t.history if h.dst.terminal)
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


def check_acked(acked: Iterable[Acked], journals: Mapping[str, JournalData]) -> AckOutcome:
    """Every acknowledged task reached a terminal state with exactly one recorded result:
    at its home for ordinary tasks, on every node for global tasks."""
    violations: list[Violation] = []
    states: Counter[str] = Counter()
    lost: list[str] = []
    for a in acked:
        homes = sorted(journals) if a.is_global else [a.home]
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
        final = bad[0] if bad else results.get(a.home, "missing")
        states[final] += 1
        if bad:
            lost.append(a.id)
    return AckOutcome(tuple(violations), dict(states), tuple(lost))


def check_executed(
    acked: Iterable[Acked], journals: Mapping[str, JournalData], marks: Mapping[str, Sequence[str]]
) -> list[Violation]:
    """A task recorded as succeeded ran at least once (its process left a mark)."""
    out = []
    for a in acked:
        if a.is_global:
            continue
        j = journals.get(a.home)
        t = None if j is None else j.tasks.get(a.id)
        if t is not None and t.state is m.TaskState.SUCCEEDED and not marks.get(a.id):
            out.append(Violation(EXECUTED, a.home, f"task {a.id} succeeded but never ran"))
    return out


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
            if spec is None or spec.is_global:
                continue
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
        runs = [r for r in runs_on(j) if (s := specs.get(r.task_id)) and not s.is_global]
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
