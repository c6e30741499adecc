"""Speculative backups (issue 24): a second copy of a task that runs late, for tasks
that may run twice (`--idempotent`).

After LATE (Zaharia et al., OSDI 2008), Dolly (Ananthanarayanan et al., NSDI 2013) and
Dean & Barroso's hedged requests: a task that has run longer than a high quantile of
its class's runtimes (its array, or its argv's program) while the cluster has room
gets one backup on another node; the first copy to finish wins and the other is
killed. Backups are paid for from a budget: their task-seconds may not exceed
`budget` (5 %) of the task-seconds of the work done, so a cluster where everything
runs late (overload, not stragglers) stops backing up on its own.

Pure: the caller (simulator, agent) feeds runtimes as runs end, asks `due` which
running tasks should get a backup now, and reports what each backup cost.
"""

from __future__ import annotations

import math
import posixpath
from collections import deque
from collections.abc import Iterable

import attrs

from ..model import TaskSpec


@attrs.frozen
class HedgeConfig:
    quantile: float = 0.9  # a run past this quantile of its class's runtimes is late
    min_history: int = 20  # runtimes a class needs before its quantile is trusted
    history: int = 512  # runtimes kept per class (the newest)
    budget: float = 0.05  # backup task-seconds / task-seconds of finished work
    slack: float = 1.2  # late = past slack x the quantile (a margin over its noise)
    max_classes: int = 4096  # classes with a history (the oldest dropped past this)

    def __attrs_post_init__(self) -> None:
        if not 0.5 <= self.quantile < 1.0:
            raise ValueError("hedge: quantile must be in [0.5, 1)")
        if self.min_history < 1 or self.history < self.min_history:
            raise ValueError("hedge: need 1 <= min_history <= history")
        if not 0.0 <= self.budget <= 1.0 or self.slack < 1.0:
            raise ValueError("hedge: budget in [0, 1] and slack >= 1")
        if self.max_classes < 1:
            raise ValueError("hedge: max_classes >= 1")


def task_class(spec: TaskSpec) -> str:
    """The class whose runtimes say when `spec`'s run is late: its array's elements, or
    else its user's tasks of the same `--name`, or else of the same program (argv[0]).
    A backup keeps its original's class (its spec keeps the element and name)."""
    if spec.element is not None:
        what = "array " + spec.element.array
    elif spec.name:
        what = "name " + spec.name
    else:
        what = "program " + posixpath.basename(spec.argv[0])
    return f"{what} of uid {spec.uid}"


@attrs.frozen
class Running:
    """A running task as the hedger sees it."""

    task_id: str
    cls: str  # its class: tasks expected to take about as long as each other
    started_at: float
    idempotent: bool
    backed_up: bool = False  # it has (or had) a backup already


@attrs.frozen
class HedgeStats:
    backups: int = 0
    won: int = 0  # backups that finished first
    lost: int = 0  # backups killed because the original finished first
    backup_seconds: float = 0.0
    work_seconds: float = 0.0  # task-seconds of finished work (winners' runs)
    refused_budget: int = 0  # late tasks not backed up for want of budget
    refused_room: int = 0  # ... for want of a free slot elsewhere

    @property
    def extra(self) -> float:
        """Backup task-seconds as a fraction of the finished work's."""
        return self.backup_seconds / self.work_seconds if self.work_seconds else 0.0


class Hedger:
    """One home's backup decisions (no I/O, no randomness)."""

    def __init__(self, cfg: HedgeConfig | None = None) -> None:
        self.cfg = cfg or HedgeConfig()
        self.stats = HedgeStats()
        self._runtimes: dict[str, deque[float]] = {}
        self._cut: dict[str, float] = {}  # cached threshold per class
        self._pending: dict[str, float] = {}  # backups running: their charge up front

    def _count(self, **inc: float) -> None:
        s = self.stats
        self.stats = attrs.evolve(s, **{k: getattr(s, k) + v for k, v in inc.items()})

    def threshold(self, cls: str) -> float:
        """How long a run of `cls` may take before it counts as late (inf: too little
        history to say)."""
        cut = self._cut.get(cls)
        if cut is not None:
            return cut
        xs = self._runtimes.get(cls)
        if xs is None or len(xs) < self.cfg.min_history:
            cut = math.inf
        else:
            s = sorted(xs)
            i = min(len(s) - 1, max(0, math.ceil(self.cfg.quantile * len(s)) - 1))
            cut = s[i] * self.cfg.slack
        self._cut[cls] = cut
        return cut

    def finished(self, cls: str, runtime: float) -> None:
        """A run of `cls` ended normally (the winner, if it had a backup): its runtime
        joins the class's history and its task-seconds earn budget."""
        q = self._runtimes.get(cls)
        if q is None:
            while len(self._runtimes) >= self.cfg.max_classes:
                old = next(iter(self._runtimes))
                del self._runtimes[old]
                self._cut.pop(old, None)
            q = self._runtimes[cls] = deque(maxlen=self.cfg.history)
        q.append(max(0.0, runtime))
        self._cut.pop(cls, None)
        self._count(work_seconds=max(0.0, runtime))

    def backup_ended(self, task_id: str, seconds: float, won: bool) -> None:
        """A backup ended: it finished first (`won`) or was killed (the original
        finished first, or the task was cancelled). Its task-seconds are spent from the
        budget either way."""
        self._pending.pop(task_id, None)
        self._count(backup_seconds=max(0.0, seconds), won=int(won), lost=int(not won))

    def history(self, cls: str) -> int:
        """Runtimes of `cls` known (for explain)."""
        return len(self._runtimes.get(cls, ()))

    def budget_left(self) -> float:
        """Backup task-seconds the budget still allows, backups running counted at
        their charge."""
        s = self.stats
        return self.cfg.budget * s.work_seconds - s.backup_seconds - sum(self._pending.values())

    def due(self, now: float, running: Iterable[Running], room: int) -> list[str]:
        """Tasks to back up now, latest first (the most overdue relative to their
        class), at most `room` (free slots elsewhere) and only while the budget lasts:
        each backup is charged its class's threshold up front, so one round cannot
        overspend (the charge is released when the backup ends and its real cost is
        counted). Never a task that is not idempotent or already has a backup."""
        late: list[tuple[float, str, float]] = []
        for r in running:
            if not r.idempotent or r.backed_up:
                continue
            cut = self.threshold(r.cls)
            ran = now - r.started_at
            if ran > cut:
                late.append((ran / cut, r.task_id, cut))
        late.sort(key=lambda x: (-x[0], x[1]))
        out: list[str] = []
        left = self.budget_left()
        for _, tid, cut in late:
            if len(out) >= room:
                self._count(refused_room=1)
                continue
            if left < cut / self.cfg.slack:
                self._count(refused_budget=1)
                continue
            left -= cut / self.cfg.slack
            self._pending[tid] = cut / self.cfg.slack
            out.append(tid)
        self._count(backups=len(out))
        return out
