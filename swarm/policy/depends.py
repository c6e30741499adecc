"""Dependencies between tasks (issue 23, pure): `--after ok:ID[,ID...]`, `any:ID`,
`notok:ID` (Slurm's afterok / afterany / afternotok), and whether they hold.

A parent is a task id, an array's id (the whole array: every element), or one
element `ID[INDEX]`. The home holds a dependent task until `judge` says READY; when a
parent has ended so that the condition can never hold, `judge` says NEVER with the
reason, and the child fails with it. Several `--after` clauses must all hold.

`judge` reads each parent's final state through the caller (`final_of`), which
answers None while the parent has not ended. Nothing here looks anything up, so the
same rules serve the agent, the tests and the simulator.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import attrs

from ..model import valid_task_id

MAX_PARENTS = 1024  # per submission, over all clauses
SUCCEEDED = "succeeded"
FINAL = frozenset({"succeeded", "failed", "cancelled", "lost"})
_PARENT = re.compile(r"^(?P<id>[^\[\]]+)(?:\[(?P<index>\d{1,10})\])?$")


class DependencyError(ValueError):
    """A bad `--after`: the message names the field and what is wrong."""


class Cond(enum.Enum):
    OK = "ok"  # every parent succeeded
    ANY = "any"  # every parent ended, however
    NOTOK = "notok"  # every parent ended other than succeeded


@attrs.frozen
class Parent:
    task_id: str
    index: int | None = None  # an array element; None: the task, or the whole array

    def text(self) -> str:
        return self.task_id if self.index is None else f"{self.task_id}[{self.index}]"


@attrs.frozen
class After:
    cond: Cond
    parents: tuple[Parent, ...]

    def text(self) -> str:
        return f"{self.cond.value}:" + ",".join(p.text() for p in self.parents)


class Verdict(enum.Enum):
    WAIT = "wait"
    READY = "ready"
    NEVER = "never"


def parse_after(clauses: Sequence[str]) -> tuple[After, ...]:
    """Each `--after` value (`ok:ID[,ID...]`, `any:...`, `notok:...`) -> After."""
    out: list[After] = []
    total = 0
    for text in clauses:
        if not isinstance(text, str) or ":" not in text:
            raise DependencyError(
                f"after: {text!r:.60} is not COND:ID[,ID...] with COND ok, any or notok"
            )
        cond_text, _, ids = text.partition(":")
        try:
            cond = Cond(cond_text.strip().lower())
        except ValueError:
            raise DependencyError(
                f"after: unknown condition {cond_text!r:.20}; use ok, any or notok"
            ) from None
        parents = tuple(_parent(x.strip()) for x in ids.split(","))
        total += len(parents)
        if total > MAX_PARENTS:
            raise DependencyError(f"after: more than {MAX_PARENTS} parents")
        if len(set(parents)) != len(parents):
            raise DependencyError(f"after: {text!r:.60} names a parent twice")
        out.append(After(cond, parents))
    return tuple(out)


def _parent(text: str) -> Parent:
    m = _PARENT.match(text)
    if not m or not valid_task_id(m.group("id")):
        raise DependencyError(f"after: {text!r:.60} is not a task id, an array id or ID[INDEX]")
    index = m.group("index")
    return Parent(m.group("id"), int(index) if index is not None else None)


def parents_of(after: Iterable[After]) -> list[Parent]:
    return [p for a in after for p in a.parents]


def check_not_self(after: Iterable[After], task_id: str) -> None:
    """A task that waits for itself waits for ever (the one cycle a new submission can
    make: its parents must already exist)."""
    for p in parents_of(after):
        if p.task_id == task_id:
            raise DependencyError(f"after: {task_id} cannot wait for itself")


def judge(after: Sequence[After], final_of: Callable[[Parent], str | None]) -> tuple[Verdict, str]:
    """READY when every clause holds; NEVER (with the reason) as soon as one can no
    longer hold; WAIT otherwise, naming a parent still running."""
    waiting = ""
    for clause in after:
        for p in clause.parents:
            state = final_of(p)
            if state is None:
                waiting = waiting or f"waiting for {p.text()} ({clause.cond.value})"
                continue
            if state not in FINAL:
                raise ValueError(f"final_of({p.text()}) answered {state!r}, not a final state")
            if clause.cond is Cond.OK and state != SUCCEEDED:
                return (
                    Verdict.NEVER,
                    f"{p.text()} ended {state}; --after ok:{p.text()} needs it to succeed",
                )
            if clause.cond is Cond.NOTOK and state == SUCCEEDED:
                return (
                    Verdict.NEVER,
                    f"{p.text()} succeeded; --after notok:{p.text()} needs it to fail",
                )
    if waiting:
        return Verdict.WAIT, waiting
    return Verdict.READY, "every --after condition holds"


def array_final(states: Iterable[str | None]) -> str | None:
    """A whole array as one parent: ended when every element has; `succeeded` when all
    succeeded, else the first other final state in the order failed, lost, cancelled
    (so that ok / notok read an array as Slurm reads a job array)."""
    seen = set()
    for s in states:
        if s is None:
            return None
        seen.add(s)
    for s in ("failed", "lost", "cancelled"):
        if s in seen:
            return s
    return SUCCEEDED


def find_cycle(edges: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle in child -> parents edges (task ids), as a list that starts and ends at
    the same id, or None. Iterative (no recursion limit on long chains)."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour: dict[str, int] = {}
    for root in edges:
        if colour.get(root, WHITE) != WHITE:
            continue
        stack: list[tuple[str, Iterator[str]]] = [(root, iter(edges.get(root, ())))]
        path = [root]
        colour[root] = GREY
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = BLACK
                stack.pop()
                path.pop()
                continue
            c = colour.get(nxt, WHITE)
            if c == GREY:
                return [*path[path.index(nxt) :], nxt]
            if c == WHITE:
                colour[nxt] = GREY
                stack.append((nxt, iter(edges.get(nxt, ()))))
                path.append(nxt)
    return None
